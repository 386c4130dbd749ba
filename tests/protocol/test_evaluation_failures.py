r"""Failed evaluations of the user's black box, for every registered algorithm.

The objective raises on one part of the domain and returns NaN or inf on others. A
run records every failure (client, round, step, point in the user's domain, error)
and carries on; a failed point never enters the client's data nor any reply the
server receives; ``evaluation_errors="raise"`` stops the run naming client, round and
point; a client whose whole initial design failed still takes part; a
``KeyboardInterrupt`` from the black box stops the run.

The reply check has teeth where replies carry raw inputs -- central BO uploads its
data, and FBO-FedGP with ``min_cluster_size=1`` and ``k = num_init`` sends its initial
points as k-means centres -- which a positive control confirms: the successful
initial points *are* found there, so a failed point added to the data would be too.
Local BO, random search and FTS send no inputs at all; for them the check of the
clients' data carries the claim.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from botorch_fed.algorithms import FBOFedGPSettings, build_federation, run_federated
from botorch_fed.problems.objectives import (
    CallableObjective,
    EvaluationError,
    ObjectiveContractError,
)
from botorch_fed.protocol import BOClient, BOSettings, FederationSetup
from botorch_fed.protocol.bo_client import MIN_DISTANCE, Init
from tests.helpers.federation_runs import ALGORITHMS, IDS

pytestmark = pytest.mark.usefixtures("quiet_single_thread")

BOUNDS = [[-2.0, 0.0], [3.0, 5.0]]
LOWER, UPPER = torch.tensor(BOUNDS, dtype=torch.float64)
NUM_CLIENTS = 3
NUM_INIT = 3
NUM_ROUNDS = 3
# seed 3: the initial designs hit all three failure kinds, every client keeps >= 1 point
SEED = 3

STEPS = {
    "fbo-fedgp": {"init", "local", "global"},
    "local": {"init", "local"},
    "central": {"init", "central"},
    "fts": {"init", "local", "federated"},
    "random": {"init", "random"},
}
# replies that carry raw inputs (see the module docstring)
SENDS_INPUTS = {"fbo-fedgp", "central"}


class FlakyBlackBox:
    r"""A simulator that crashes for ``z0 < -1``, returns NaN for ``z0 > 2`` and inf for
    ``z1 > 4.5``; elsewhere a loss with its minimum 0 at ``(0.5, 2)``. Logs every call
    (into a log shared by the clients, in call order)."""

    def __init__(self, client: int, log: list):
        self.client = client
        self.log = log

    def __call__(self, Z):
        assert Z.shape == (1, 2) and Z.dtype == torch.float64
        z0, z1 = Z[0].tolist()
        entry = {"client": self.client, "x": Z[0].tolist()}
        self.log.append(entry)
        if z0 < -1.0:
            entry["kind"] = "raise"
            raise RuntimeError(f"solver diverged at z0={z0}")
        if z0 > 2.0:
            entry["kind"] = "nan"
            return torch.tensor([float("nan")])
        if z1 > 4.5:
            entry["kind"] = "inf"
            return [float("inf")]
        entry["kind"] = "ok"
        return (Z[:, 0] - 0.5) ** 2 + (Z[:, 1] - 2.0) ** 2


def _settings(algorithm: str, **kwargs):
    base = dict(
        num_init=NUM_INIT,
        num_rounds=NUM_ROUNDS,
        raw_samples=16,
        num_restarts=2,
        maxiter=20,
        ts_candidates=64,
    )
    base.update(kwargs)
    if algorithm == "fbo-fedgp":
        # k = num_init, singleton clusters and exact centres (the default noises them):
        # the centres are the raw initial points (the positive control of the reply check)
        base = dict(
            support_size=4,
            min_cluster_size=1,
            centers_per_client=NUM_INIT,
            support="clustered",
            center_noise=0.0,
            **base,
        )
        return FBOFedGPSettings(**base)
    return BOSettings(**base)


def _setup(objectives, aggregator="plaintext", **kwargs) -> FederationSetup:
    return FederationSetup(
        objectives=objectives, seed=SEED, aggregator=aggregator, crypto_seed=0, **kwargs
    )


def _float_patterns(value) -> set[bytes]:
    r"""float64 byte patterns of every number in a reply value (arrays and scalars)."""
    if isinstance(value, np.ndarray) and value.dtype.kind in "fiu":
        return {np.float64(v).tobytes() for v in value.ravel().tolist()}
    if isinstance(value, float | np.floating):
        return {np.float64(value).tobytes()}
    return set()


def _identifying(v: float) -> bool:
    r"""Whether a coordinate identifies a point: "round" values (0, 1, 0.5, ...: clamped
    candidates, counts and limbs produce them everywhere) identify nothing."""
    return round(v * 1024) / 1024 != v


def _leaked(points: torch.Tensor, replies: list) -> list[tuple]:
    r"""``(point index, client, reply type, key)`` for every identifying coordinate of
    ``points`` found in a reply: as a number of an array or a scalar, or as 8 raw bytes
    of a byte blob (ciphertexts, masked or plaintext secure-sum vectors)."""
    found = []
    for j, row in enumerate(points.tolist()):
        patterns = {np.float64(v).tobytes() for v in row if _identifying(v)}
        for cid, type_, key, value in replies:
            if isinstance(value, bytes):
                hit = any(p in value for p in patterns)
            else:
                hit = bool(patterns & _float_patterns(value))
            if hit:
                found.append((j, cid, type_, key))
    return found


def _instrumented_run(algorithm, aggregator, **setup_kwargs):
    log: list[dict] = []
    objectives = [CallableObjective(FlakyBlackBox(i, log), BOUNDS) for i in range(NUM_CLIENTS)]
    setup = _setup(objectives, aggregator, **setup_kwargs)
    replies: list[tuple] = []

    def on_receive(cid, reply):
        for key, value in reply.payload.items():
            replies.append((cid, reply.type, key, value))

    server, clients, _ = build_federation(
        algorithm, setup, _settings(algorithm), on_receive=on_receive
    )
    server.run()
    return log, clients, replies


def _rows_in(points: torch.Tensor, X: torch.Tensor) -> bool:
    return any(bool((X == p).all(-1).any()) for p in points)


@pytest.mark.parametrize("algorithm, aggregator", ALGORITHMS, ids=IDS)
def test_failures_are_recorded_and_never_sent(algorithm, aggregator):
    log, clients, replies = _instrumented_run(algorithm, aggregator)
    kinds = [e["kind"] for e in log]
    init_kinds = kinds[: NUM_CLIENTS * NUM_INIT]
    assert {"raise", "nan", "inf"} <= set(init_kinds)  # the scenario is as intended
    assert len(log) == NUM_CLIENTS * (NUM_INIT + NUM_ROUNDS)  # nobody stopped
    checked = 0
    for cid, client in clients.items():
        calls = [e for e in log if e["client"] == cid]
        failed = [e for e in calls if e["kind"] != "ok"]
        # the client's record of failures is exactly the failed calls, in the user's domain
        assert [f["x"] for f in client.failures] == [e["x"] for e in failed]
        for f, e in zip(client.failures, failed, strict=True):
            if e["kind"] == "raise":
                assert f["error"] == f"RuntimeError: solver diverged at z0={e['x'][0]}"
            else:
                assert f["error"] == f"non-finite value {'nan' if e['kind'] == 'nan' else 'inf'}"
            assert f["value"] is None and f["step"] in STEPS[algorithm]
            assert (f["round"] == 0) == (f["step"] == "init")
            assert 0 <= f["round"] <= NUM_ROUNDS
        # the successful calls are the client's data, in order; no failed point is in it
        ok = [e["x"] for e in calls if e["kind"] == "ok"]
        assert len(client.X) == len(client.Y) == len(ok)
        torch.testing.assert_close(
            LOWER + client.X * (UPPER - LOWER),
            torch.tensor(ok, dtype=torch.float64).reshape(-1, 2),
            rtol=1e-15,
            atol=1e-15,
        )
        assert torch.isfinite(client.Y).all()
        assert len(client.failed_X) == len(failed)
        if failed:
            torch.testing.assert_close(
                LOWER + client.failed_X * (UPPER - LOWER),
                torch.tensor([e["x"] for e in failed], dtype=torch.float64),
                rtol=1e-15,
                atol=1e-15,
            )
            assert not _rows_in(client.failed_X, client.X)
            # ... and no reply the server received contains a failed point's coordinates
            assert _leaked(client.failed_X, replies) == []
            checked += sum(_identifying(v) for v in client.failed_X.flatten().tolist())
        if algorithm in SENDS_INPUTS:
            # positive control: the successful initial points are found in the replies
            initial = client.X[: sum(e["kind"] == "ok" for e in calls[:NUM_INIT])]
            assert len(initial) >= 1
            assert {j for j, *_ in _leaked(initial, replies)} == set(range(len(initial)))
    assert checked >= 8  # failed coordinates were searched for (not all of them round)


@pytest.mark.parametrize("algorithm, aggregator", ALGORITHMS, ids=IDS)
def test_results_list_the_failures(algorithm, aggregator):
    log: list[dict] = []
    objectives = [CallableObjective(FlakyBlackBox(i, log), BOUNDS) for i in range(NUM_CLIENTS)]
    result = run_federated(algorithm, _setup(objectives, aggregator), _settings(algorithm))
    failed = [e for e in log if e["kind"] != "ok"]
    assert len(result.failures) == len(failed) > 0
    # grouped by client, in each client's order
    expected = sorted(failed, key=lambda e: e["client"])
    assert [(f["client"], f["x"]) for f in result.failures] == [
        (e["client"], e["x"]) for e in expected
    ]
    for f in result.failures:
        assert {"client", "round", "step", "x", "error"} <= set(f)
        assert f["step"] in STEPS[algorithm] and isinstance(f["error"], str) and f["error"]
    # the best is among the successful points, in the user's convention (a loss: min)
    ok = {tuple(e["x"]) for e in log if e["kind"] == "ok"}
    assert tuple(result.best_point) in ok
    assert tuple(result.best_point) not in {tuple(e["x"]) for e in failed}
    z = torch.tensor([result.best_point])
    assert result.best_value == pytest.approx(((z[0, 0] - 0.5) ** 2 + (z[0, 1] - 2) ** 2).item())
    assert all(v is not None for v in result.best_per_round)
    # every evaluation counts as a step, failed or not
    assert sum(result.steps.values()) == len(log)
    back = json.loads(json.dumps(result.to_dict(), allow_nan=False))
    assert back["failures"] == result.failures


@pytest.mark.parametrize("algorithm, aggregator", ALGORITHMS, ids=IDS)
def test_raise_mode_names_client_round_and_point(algorithm, aggregator):
    log: list[dict] = []
    objectives = [CallableObjective(FlakyBlackBox(i, log), BOUNDS) for i in range(NUM_CLIENTS)]
    setup = _setup(objectives, aggregator, evaluation_errors="raise")
    with pytest.raises(EvaluationError) as info:
        run_federated(algorithm, setup, _settings(algorithm))
    # the run stopped at the first failed call (an initial point here)
    first = log[-1]
    assert first["kind"] != "ok" and all(e["kind"] == "ok" for e in log[:-1])
    message = str(info.value)
    assert f"Client {first['client']}, round 0" in message
    assert str(first["x"]) in message
    assert "FlakyBlackBox" in message  # the objective's name
    if first["kind"] == "raise":
        assert isinstance(info.value.__cause__, RuntimeError)
        assert "solver diverged" in message
    else:
        assert "non-finite" in message


def test_raise_mode_after_the_initial_design_names_the_round():
    calls = {"n": 0}

    def fails_on_the_fifth_call(Z):
        calls["n"] += 1
        if calls["n"] == 5:
            return float("nan")
        return float(Z.sum())

    objective = CallableObjective(fails_on_the_fifth_call, BOUNDS, name="bench")
    setup = FederationSetup(objectives=[objective], seed=0, evaluation_errors="raise")
    with pytest.raises(EvaluationError, match=r"Client 0, round 2: evaluating 'bench' at \["):
        run_federated("random", setup, _settings("random"))


def _fails_first(n: int, log: list | None = None):
    calls = {"n": 0}

    def fn(Z):
        calls["n"] += 1
        if log is not None:
            log.append(Z[0].tolist())
        if calls["n"] <= n:
            raise OSError("licence server unreachable")
        return (Z[:, 0] - 0.5) ** 2 + (Z[:, 1] - 2.0) ** 2

    return fn


def _cases():
    return [pytest.param(a, g, id=i) for (a, g), i in zip(ALGORITHMS, IDS, strict=True)]


@pytest.mark.parametrize("algorithm, aggregator", _cases())
def test_a_client_without_data_still_takes_part(algorithm, aggregator):
    log: list = []
    objectives = [CallableObjective(_fails_first(NUM_INIT, log), BOUNDS)] + [
        CallableObjective(_fails_first(0), BOUNDS) for _ in range(NUM_CLIENTS - 1)
    ]
    setup = _setup(objectives, aggregator)
    server, clients, _ = build_federation(algorithm, setup, _settings(algorithm, num_rounds=2))
    server.run()
    client = clients[0]
    assert [(f["round"], f["step"]) for f in client.failures] == [(0, "init")] * NUM_INIT
    assert all(f["error"] == "OSError: licence server unreachable" for f in client.failures)
    # it evaluated one point in each round, and holds data now
    assert len(log) == NUM_INIT + 2
    assert [h["round"] for h in client.history[NUM_INIT:]] == [1, 2]
    assert len(client.X) == 2
    # its first point after the failures is not one of the failed ones
    assert not _rows_in(client.failed_X, client.X)


def test_fbo_fedgp_defaults_survive_one_failed_initial_point_per_client():
    # default min_cluster_size=2: a client left with one initial point
    objectives = [CallableObjective(_fails_first(1), BOUNDS) for _ in range(NUM_CLIENTS)]
    settings = FBOFedGPSettings(
        num_init=2, num_rounds=1, support_size=4, raw_samples=16, num_restarts=2, maxiter=20
    )
    result = run_federated("fbo-fedgp", _setup(objectives), settings)
    assert len(result.failures) == NUM_CLIENTS


@pytest.mark.parametrize("algorithm, aggregator", _cases())
def test_a_run_where_every_evaluation_fails_finishes(algorithm, aggregator):
    # RunResult documents best_value None "if every evaluation failed"
    objectives = [CallableObjective(_fails_first(10**9), BOUNDS) for _ in range(NUM_CLIENTS)]
    settings = _settings(algorithm, num_rounds=2)
    result = run_federated(algorithm, _setup(objectives, aggregator), settings)
    assert result.best_value is None and result.best_point is None
    assert result.best_per_round == [None] * 3
    assert result.best_per_client == dict.fromkeys(range(NUM_CLIENTS))
    assert len(result.failures) == NUM_CLIENTS * (NUM_INIT + 2)
    json.dumps(result.to_dict(), allow_nan=False)


@pytest.mark.parametrize("algorithm, aggregator", ALGORITHMS, ids=IDS)
@pytest.mark.parametrize("errors", ["record", "raise"])
def test_keyboard_interrupt_stops_the_run(algorithm, aggregator, errors):
    calls = {"n": 0}

    def interrupted(Z):
        calls["n"] += 1
        if calls["n"] == 2:
            raise KeyboardInterrupt
        return float(Z.sum())

    objectives = [CallableObjective(interrupted, BOUNDS)] * NUM_CLIENTS
    setup = _setup(objectives, aggregator, evaluation_errors=errors)
    with pytest.raises(KeyboardInterrupt):
        run_federated(algorithm, setup, _settings(algorithm))
    assert calls["n"] == 2


@pytest.mark.parametrize("algorithm, aggregator", ALGORITHMS, ids=IDS)
def test_a_broken_callable_is_not_a_failed_evaluation(algorithm, aggregator):
    # a wrong shape is a bug in the callable: it stops the run even in "record" mode
    objectives = [CallableObjective(lambda Z: [1.0, 2.0], BOUNDS, name="two-values")]
    setup = _setup(objectives * NUM_CLIENTS, aggregator)
    with pytest.raises(ObjectiveContractError, match="two-values"):
        run_federated(algorithm, setup, _settings(algorithm))


def test_clients_do_not_propose_a_failed_point_again():
    # the score rises towards the upper corner, where the black box crashes: the local
    # GP (which never learns of the crash) keeps pointing there
    def crashes_in_the_corner(Z):
        if (Z[:, 0] > 2.5).all() and (Z[:, 1] > 4.5).all():
            raise RuntimeError("out of memory")
        return -(Z[:, 0] + Z[:, 1])

    objective = CallableObjective(crashes_in_the_corner, BOUNDS)
    client = BOClient(0, objective, _settings("local", num_init=5), seed=0)
    client.on_init(Init())
    assert client.failures == []
    corner = torch.ones(1, 2, dtype=torch.float64)
    assert client.evaluate(corner, 1, "local") is False
    assert torch.equal(client.failed_X, corner)
    # without the guard, the next local step would evaluate the corner (or next to it) again
    state = client.private_rng.get_state()
    coins = client.rng.get_state()
    original = client.avoid_failures
    client.avoid_failures = lambda x: x
    try:
        raw = client.propose_local(2)
    finally:
        client.avoid_failures = original
    assert torch.cdist(raw, corner).min() < MIN_DISTANCE
    # with it, the client draws a uniform point from its private generator instead,
    # leaving the publicly seeded one (its visible coins) untouched
    client.private_rng.set_state(state)
    g = torch.Generator().set_state(state)
    expected = torch.rand(1, 2, generator=g, dtype=torch.float64)
    while torch.cdist(expected, corner).min() < MIN_DISTANCE:  # a draw next to it: redrawn
        expected = torch.rand(1, 2, generator=g, dtype=torch.float64)
    x = client.propose_local(2)
    assert torch.equal(x, expected)
    assert torch.equal(client.rng.get_state(), coins)
    # points away from every failure pass unchanged
    far = torch.tensor([[0.2, 0.3]], dtype=torch.float64)
    assert torch.equal(client.avoid_failures(far), far)
    near = corner - MIN_DISTANCE / 4
    assert not torch.equal(client.avoid_failures(near), near)


@pytest.mark.parametrize(
    "algorithm, aggregator",
    [p for p in _cases() if p.values[0] != "random"],
)
def test_no_client_evaluates_next_to_its_own_failed_point_again(algorithm, aggregator):
    def crashes_in_the_corner(Z):
        if (Z[:, 0] > 2.0).all() and (Z[:, 1] > 4.0).all():
            raise RuntimeError("out of memory")
        return -(Z[:, 0] + Z[:, 1])  # best towards the crashing corner

    objectives = [CallableObjective(crashes_in_the_corner, BOUNDS) for _ in range(NUM_CLIENTS)]
    settings = _settings(algorithm, num_init=4, num_rounds=4)
    server, clients, _ = build_federation(
        algorithm, FederationSetup(objectives=objectives, seed=0, crypto_seed=0), settings
    )
    server.run()
    assert sum(len(c.failures) for c in clients.values()) >= NUM_CLIENTS  # they got there
    for client in clients.values():
        U = (torch.tensor([h["x"] for h in client.history]) - LOWER) / (UPPER - LOWER)
        failed = [i for i, h in enumerate(client.history) if h.get("failed")]
        for k, h in enumerate(client.history):
            earlier = [i for i in failed if i < k]
            if earlier:
                distance = torch.cdist(U[k : k + 1], U[earlier]).min().item()
                assert distance >= MIN_DISTANCE, (client.client_id, h["round"], h["step"])


def test_client_arguments_are_checked():
    objective = CallableObjective(lambda Z: Z.sum(-1), BOUNDS)
    with pytest.raises(ValueError, match="`evaluation_errors`"):
        BOClient(0, objective, _settings("local"), seed=0, evaluation_errors="ignore")
    with pytest.raises(ValueError, match="`objective`.*CallableObjective"):
        BOClient(0, lambda Z: Z.sum(-1), _settings("local"), seed=0)


def test_fts_federated_steps_avoid_failed_points():
    def crashes_in_the_corner(Z):
        if (Z[:, 0] > 2.0).all() and (Z[:, 1] > 4.0).all():
            raise RuntimeError("out of memory")
        return -(Z[:, 0] + Z[:, 1])

    objectives = [CallableObjective(crashes_in_the_corner, BOUNDS) for _ in range(4)]
    settings = _settings("fts", num_init=4, num_rounds=3)
    server, clients, _ = build_federation(
        "fts", FederationSetup(objectives=objectives, seed=0), settings
    )
    server.run()
    for client in clients.values():
        U = (torch.tensor([h["x"] for h in client.history]) - LOWER) / (UPPER - LOWER)
        failed = [i for i, h in enumerate(client.history) if h.get("failed")]
        for k, h in enumerate(client.history):
            earlier = [i for i in failed if i < k]
            if earlier:
                distance = torch.cdist(U[k : k + 1], U[earlier]).min().item()
                assert distance >= MIN_DISTANCE, (client.client_id, h["round"], h["step"])
