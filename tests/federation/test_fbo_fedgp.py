r"""FBO-FedGP on the federation protocol: privacy, determinism, options, baselines."""

from __future__ import annotations

import math
import statistics
import time
import warnings

import numpy as np
import pytest
import torch

from botorch_fed.federation import (
    BOSettings,
    FBOFedGPConfig,
    FederationSetup,
    Message,
    build_federation,
    run_federated,
)
from botorch_fed.models import OUTCOME_MOMENTS_LENGTH, SparseSummary


@pytest.fixture(autouse=True)
def _quiet_single_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield
    torch.set_num_threads(n)


def _setup(**kwargs) -> FederationSetup:
    base = dict(problem="branin", dim=2, num_clients=3, seed=0, crypto_seed=0)
    base.update(kwargs)
    return FederationSetup(**base)


def _config(**kwargs) -> FBOFedGPConfig:
    base = dict(num_init=4, num_rounds=3, support_size=6, raw_samples=16, maxiter=20)
    base.update(kwargs)
    return FBOFedGPConfig(**base)


def _float_rows(values: np.ndarray) -> set[bytes]:
    r"""float64 byte patterns of the values, except "round" ones (0, 0.5, ... : Sobol
    points and integer counts produce them everywhere, they identify nothing)."""
    v = np.asarray(values, dtype=np.float64).ravel()
    v = v[np.round(v * 1024) / 1024 != v]
    return {np.float64(x).tobytes() for x in v}


@pytest.mark.parametrize("aggregator", ["plaintext", "masking", "ckks"])
def test_server_never_receives_raw_data_or_plaintext_summaries(aggregator):
    received: list[tuple[int, Message, np.ndarray | None]] = []
    server, clients, _ = build_federation(
        "fbo-fedgp",
        _setup(aggregator=aggregator),
        _config(),
        on_receive=lambda cid, reply: received.append(
            (cid, reply, None if clients[cid]._pending is None else clients[cid]._pending.copy())
        ),
    )
    server.run()
    assert any(r.type == "secagg" for _, r, _ in received)
    for cid, reply, pending in received:
        client = clients[cid]
        raw = _float_rows(client.X.numpy()) | _float_rows(client.Y.numpy())
        for key, value in reply.payload.items():
            if isinstance(value, np.ndarray):
                # no raw input coordinate or output value appears in any array
                assert not (_float_rows(value) & raw), (cid, reply.type, key)
            if isinstance(value, bytes) and len(value) >= 8:
                blob = value
                for v in raw:
                    assert v not in blob, (cid, reply.type, key)
                if aggregator != "plaintext" and pending is not None:
                    # the vector this client contributed is nowhere in its message
                    for v in _float_rows(pending[pending != 0][:50]):
                        assert v not in blob, (cid, reply.type, key)


def test_plaintext_and_ckks_make_identical_decisions():
    runs = {}
    for aggregator in ("plaintext", "ckks"):
        server, clients, _ = build_federation(
            "fbo-fedgp", _setup(aggregator=aggregator), _config(num_rounds=4)
        )
        torch.manual_seed(0)
        server.run()
        runs[aggregator] = clients
    for cid in runs["plaintext"]:
        a, b = runs["plaintext"][cid], runs["ckks"][cid]
        assert [h["step"] for h in a.history] == [h["step"] for h in b.history]
        torch.testing.assert_close(a.X, b.X, atol=1e-6, rtol=0)
    steps = {h["step"] for c in runs["ckks"].values() for h in c.history}
    assert "global" in steps  # p_1 = 0: round 1 is global for everybody


def test_global_clients_hold_the_true_global_summary():
    server, clients, _ = build_federation(
        "fbo-fedgp", _setup(aggregator="masking", num_clients=4), _config(num_rounds=1)
    )
    server.run()
    # after the round-1 global step every client holds the sum of the summaries it
    # and the others computed before evaluating their new point
    c0 = clients[0]
    m = len(c0.support)
    total = SparseSummary.from_numpy(c0.last_sum, m)
    assert int(total.num_data.item()) == 4 * 4  # 4 clients x 4 initial points
    for c in clients.values():
        np.testing.assert_allclose(c.last_sum, c0.last_sum, rtol=0, atol=0)


@pytest.mark.parametrize(
    "options",
    [
        {"acquisition": "ei"},
        {"acquisition": "ts", "ts_candidates": 64},
        {"mixing": "expected"},
        {"support": "random", "support_every": 2, "support_growth": 2},
        {"global_batch": "independent", "schedule": 1.0},
        {"hyperparameters": "federated", "federated_maxiter": 3},
    ],
    ids=lambda o: "-".join(f"{k}={v}" for k, v in o.items()),
)
def test_options_run_end_to_end(options):
    aggregator = "ckks" if options.get("hyperparameters") == "federated" else "plaintext"
    result = run_federated("fbo-fedgp", _setup(aggregator=aggregator), _config(**options))
    assert len(result.best_per_round) == 4  # initial design + 3 rounds
    assert np.all(np.diff(result.best_per_round) <= 0)
    assert result.steps["init"] == 12
    assert sum(result.steps.values()) == 12 + 3 * 3
    assert np.isfinite(result.best_value)


@pytest.mark.parametrize("acquisition", ["ucb", "ei"])
def test_distinct_global_batch_avoids_duplicate_points(acquisition):
    # round 1 is global for every client (p_1 = 0); EI's incumbent must come from the
    # shared model, else the clients rank different acquisitions and may collide
    server, clients, _ = build_federation(
        "fbo-fedgp",
        _setup(num_clients=4),
        _config(num_rounds=1, global_batch="distinct", acquisition=acquisition),
    )
    server.run()
    X = torch.stack([c.X[-1] for c in clients.values()])
    assert all(c.history[-1]["step"] == "global" for c in clients.values())
    distinct = torch.cdist(X, X)
    assert (distinct + torch.eye(4) > 1e-4).all()  # 4 different round-1 points


def test_run_restores_the_callers_global_rng():
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    run_federated("random", _setup(seed=5), BOSettings(num_init=2, num_rounds=1))
    torch.testing.assert_close(torch.rand(3), expected)


def test_server_timers_do_not_count_client_work_twice():
    # a client's k-means takes >= 0.2 s (timed by the client as "support"); the server's
    # own "support" entry is the merge of the centres only, not the clients' time again
    server, clients, _ = build_federation("fbo-fedgp", _setup(), _config(num_rounds=1))
    slow = clients[0].on_centers

    def slow_centers(payload):
        with clients[0].timed("support"):
            time.sleep(0.2)
        return slow(payload)

    clients[0].on_centers = slow_centers
    server.run()
    support = server.ledger.stage_totals_by_party()["support"]
    assert support["0"] >= 0.2
    assert support["server"] < 0.1
    assert server.ledger.stage_totals()["support"] == pytest.approx(sum(support.values()))


def test_non_finite_secure_sum_vector_names_the_client_and_request():
    from botorch_fed.secure import InputError

    server, clients, _ = build_federation("fbo-fedgp", _setup(), _config(num_rounds=1))
    server.broadcast("init")
    clients[1].vector_moments = lambda: np.full(OUTCOME_MOMENTS_LENGTH, np.nan)
    with pytest.raises(InputError, match=r"Client 1: its 'moments' vector"):
        server.standardize_outcomes()


@pytest.mark.parametrize("algorithm", ["local", "central", "fts", "random"])
def test_baselines_run(algorithm):
    settings = BOSettings(num_init=4, num_rounds=2, raw_samples=16, maxiter=20, ts_candidates=64)
    result = run_federated(algorithm, _setup(), settings)
    assert len(result.best_per_round) == 3
    assert sum(result.steps.values()) == 3 * (4 + 2)
    assert result.ledger["messages"] > 0


def test_ledger_records_stages_and_bytes():
    result = run_federated("fbo-fedgp", _setup(aggregator="masking"), _config(num_rounds=2))
    ledger = result.ledger
    for stage in ("secure_aggregation", "summary", "acquisition", "evaluation", "global_model"):
        assert ledger["stage_s"].get(stage, 0) > 0, stage
    assert set(ledger["bytes_per_client"]) == {"0", "1", "2"}
    assert ledger["total_bytes_up"] > 0 and ledger["total_bytes_down"] > 0
    assert [r["round"] for r in ledger["rounds"]] == [0, 1, 2]
    assert result.regret_per_round[-1] == pytest.approx(result.best_value - 0.397887, abs=1e-5)


def test_bad_setups_raise_clear_errors():
    with pytest.raises(ValueError, match="at least 3 clients"):
        run_federated("fbo-fedgp", _setup(num_clients=2, aggregator="ckks"), _config())
    with pytest.raises(ValueError, match="aggregator"):
        run_federated("fbo-fedgp", _setup(aggregator="rot13"), _config())
    with pytest.raises(ValueError, match="Unknown algorithm"):
        run_federated("gradient-descent", _setup(), _config())
    with pytest.raises(ValueError, match="`c`"):
        _config(schedule=1.5).validate()
    with pytest.raises(ValueError, match="support_size"):
        _config(support_size=0).validate()
    with pytest.raises(ValueError, match="acquisition"):
        _config(acquisition="pi").validate()
    with pytest.raises(ValueError, match="dim"):
        run_federated("random", _setup(dim=3), BOSettings(num_rounds=1))
    with pytest.raises(ValueError, match="shift"):
        run_federated("random", _setup(shift=1.5), BOSettings(num_rounds=1))
    with pytest.raises(ValueError, match="`seed` must be a non-negative integer"):
        run_federated("random", _setup(seed=-1), BOSettings(num_rounds=1))
    with pytest.raises(ValueError, match="`num_init`=1 is below `min_cluster_size`=2"):
        _config(num_init=1).validate()
    _config(num_init=1, support="random").validate()  # no clustering: fine


def test_huge_objective_values_survive_the_secure_sums():
    # CEC-2005 F6 (shifted Rosenbrock) reaches ~1e10 per point: sum y^2 exceeds 2^64;
    # the clients' exact integer moments still sum exactly.
    server, clients, _ = build_federation(
        "fbo-fedgp", _setup(problem="cec2005-f6", aggregator="ckks"), _config(num_rounds=1)
    )
    server.run()
    # round 1 is global for everybody: the moments cover the initial designs
    Y = torch.cat([c.Y[:4] for c in clients.values()])
    assert float(Y.pow(2).sum()) > 2.0**64  # the moments really are that large
    c0 = clients[0]
    assert c0.standardize is not None
    y = Y.reshape(-1).tolist()
    assert c0.standardize.means.item() == statistics.mean(y)
    assert c0.standardize.stdvs.item() == pytest.approx(statistics.stdev(y), rel=2**-52)


@pytest.mark.parametrize("aggregator", ["plaintext", "masking", "ckks"])
def test_outcome_standardisation_is_exact_through_the_secure_sum(aggregator):
    # Large offsets with small spreads cancel in float moments (old: std 1 instead of
    # 1e-3 here) and |y| ~ 1e12 exceeded the old moments' range: the clients' exact
    # integer moments give the pooled data's mean and std to the last bit.
    server, clients, _ = build_federation(
        "fbo-fedgp", _setup(aggregator=aggregator), _config(num_rounds=1)
    )
    g = torch.Generator().manual_seed(0)
    for offset, spread in ((1e5, 1e-3), (-1e12, 1.0)):
        for c, n in zip(clients.values(), (4, 1, 6), strict=True):
            c.Y = offset + spread * torch.randn(n, 1, generator=g, dtype=torch.float64)
        server.standardize_outcomes()
        y = torch.cat([c.Y for c in clients.values()]).reshape(-1).tolist()
        mean, std = statistics.mean(y), statistics.stdev(y)
        for c in clients.values():
            assert c.standardize.means.item() == mean
            assert abs(c.standardize.stdvs.item() - std) <= math.ulp(std)
