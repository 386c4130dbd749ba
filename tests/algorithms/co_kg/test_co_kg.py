r"""Co-KG on the federation protocol: the four algorithms end to end, what the server
receives (and what it can reconstruct from it), checkpoints, settings, the secure-mean
path, and the knowledge-gradient baselines ("data sharing" = central q-KG, "no
collaboration" = local KG)."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest
import torch
from botorch.exceptions.errors import UnsupportedError
from botorch.models import SingleTaskGP
from scipy.optimize import minimize

from botorch_fed.acquisition.step_acquisition import (
    knowledge_gradient,
    make_step_acquisition,
    maximize_step_acquisition,
    ranked_step_candidates,
)
from botorch_fed.algorithms import build_federation, get_algorithm, run_federated
from botorch_fed.algorithms.co_kg import (
    BarycenterQKGSettings,
    CoEISettings,
    CoESSettings,
    CoKGClient,
    CoKGSettings,
)
from botorch_fed.inducing import grid_support
from botorch_fed.models.rbf_prior import original_hyperparameters, shared_kernel
from botorch_fed.problems.objectives import CallableObjective
from botorch_fed.protocol import BOSettings, FederationSetup, ProtocolViolation
from botorch_fed.protocol.checkpoint import load_checkpoint
from botorch_fed.protocol.messages import Message
from tests.helpers.bundles import parts, reply_parts_of
from tests.helpers.federation_runs import Killed, comparable, kill_after
from tests.helpers.tolerances import assert_within, gp_posterior_error_factors
from tests.helpers.toy_models import kernel_rounding

pytestmark = pytest.mark.usefixtures("quiet_single_thread")

ALGORITHMS = ("co-kg", "co-ei", "co-es", "barycenter-qkg")
SMALL = dict(
    num_init=3,
    num_rounds=2,
    points_per_dim=6,
    num_restarts=2,
    raw_samples=16,
    maxiter=10,
    local_refit_every=2,
)


def _settings(algorithm: str, **kwargs):
    cls = get_algorithm(algorithm).settings_class
    extra = {}
    names = {f.name for f in dataclasses.fields(cls)}
    if "num_fantasies" in names:
        extra["num_fantasies"] = 4
    if "num_mv_samples" in names:
        extra["num_mv_samples"] = 4
    if "beta0" in names:
        extra.update(beta0=0.5)  # local terms on from round 1
    return cls(**{**SMALL, **extra, **kwargs})


def _setup(**kwargs) -> FederationSetup:
    base = dict(problem="cokg-f1", num_clients=3, seed=0, crypto_seed=0)
    base.update(kwargs)
    return FederationSetup(**base)


def _float_patterns(value) -> set[bytes]:
    arr = np.asarray(value)
    if arr.dtype.kind not in "fiu":
        return set()
    return {np.float64(v).tobytes() for v in arr.astype(np.float64).reshape(-1)}


def _identifying(v: float) -> bool:
    return round(v * 1024) / 1024 != v  # grid-like values (0, 0.5, 1) identify nothing


def _leaks(values: torch.Tensor, replies: list) -> list:
    r"""Replies (client, type, key) that contain one of ``values`` (exactly, as float64
    numbers or 8 raw bytes of a byte blob)."""
    patterns = {np.float64(v).tobytes() for v in values.reshape(-1).tolist() if _identifying(v)}
    found = []
    for cid, type_, key, value in replies:
        if isinstance(value, bytes):
            hit = any(p in value for p in patterns)
        else:
            hit = bool(patterns & _float_patterns(value))
        if hit:
            found.append((cid, type_, key))
    return found


def _instrumented(algorithm: str, setup: FederationSetup, settings):
    replies: list = []

    def on_receive(cid, reply):  # a bundle's replies part by part
        for part in reply_parts_of(reply):
            for key, value in part.payload.items():
                replies.append((cid, part.type, key, value))

    server, clients, objectives = build_federation(
        algorithm, setup, settings, on_receive=on_receive
    )
    sent: list = []  # what the server sent (evaluate messages)
    original = server.transport.send

    def send(messages):
        for cid, m in messages.items():
            sent.extend((cid, part.type, dict(part.payload)) for part in parts(m))
        return original(messages)

    server.transport.send = send
    server.run()
    return server, clients, objectives, replies, sent


# --- the four algorithms end to end ---------------------------------------------------


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_runs_end_to_end_and_sends_only_posteriors(algorithm):
    setup = _setup()
    settings = _settings(algorithm)
    server, clients, objectives, replies, sent = _instrumented(algorithm, setup, settings)
    support = grid_support(2, 6)
    assert torch.equal(server.support, support)  # the paper's grid kind, 6 x 6
    for cid, client in clients.items():
        assert [h["step"] for h in client.history] == ["init"] * 3 + ["collaborative"] * 2
        # every agent evaluated exactly the point the server assigned it in each round
        assigned = [p["x"] for c, t, p in sent if c == cid and t == "evaluate"]
        assert len(assigned) == 2
        torch.testing.assert_close(client.X[3:], torch.tensor(np.stack(assigned)))
        # the server never received a raw input or outcome: only posterior summaries
        assert _leaks(client.X, replies) == []
        assert _leaks(client.Y, replies) == []
        assert _leaks(-client.Y, replies) == []
    kinds = {(t, k) for _, t, k, _ in replies if not k.startswith("time:")}
    shared = {"num_data", "covariance", "lengthscale", "outputscale", "noise", "mean_constant"}
    assert {k for t, k in kinds if t == "posterior"} == shared | {
        "mean",
        "best_index",
        "best_value",
    }
    assert {t for t, _ in kinds} <= {"posterior", "optimum"}
    # x^: the best local optimum after the last round, a support point in the domain
    rec = server.recommendation
    assert rec["round"] == settings.num_rounds and rec["client"] in clients
    objective = objectives[0]
    assert any(torch.equal(torch.tensor(rec["x_unit"], dtype=torch.double), s) for s in support)
    x = torch.tensor([rec["x_unit"]], dtype=torch.double)
    torch.testing.assert_close(torch.tensor([rec["x"]], dtype=torch.double), objective.to_domain(x))
    best_means = []
    for client in clients.values():
        # the final answer refits the hyperparameters on all of the agent's data
        from botorch_fed.models import exact_gp_state, fit_exact_gp

        final = fit_exact_gp(
            client.X,
            client.Y,
            seed=client.seed,
            warm_start=exact_gp_state(client.local_model()),
            maxiter=client.settings.fit_maxiter,
        )
        with torch.no_grad():
            best_means.append(final.posterior(support).mean.max().item())
    assert rec["predicted_value"] == pytest.approx(-max(best_means), rel=1e-12)  # minimised
    # the barycenter covariance warm-starts the next round and is in the checkpoint state
    cov = server.barycenter_covariance
    assert cov.shape == (36, 36) and torch.equal(cov, server.last_central.barycenter_covariance)
    assert torch.equal(server.state_dict()["barycenter_covariance"], cov)


def test_sobol_support_for_d_above_2_and_kmeans_support():
    from botorch_fed.inducing import sobol_support

    # "auto" in 3-D: support_size scrambled Sobol points seeded by the run's seed
    setup = FederationSetup(problem="hartmann", dim=3, num_clients=2, seed=4)
    server, clients, _ = build_federation(
        "barycenter-qkg", setup, _settings("barycenter-qkg", support_size=20, num_rounds=1)
    )
    server.run()
    assert torch.equal(server.support, sobol_support(3, 20, seed=4))
    assert all(torch.equal(c.support, server.support) for c in clients.values())
    # k-means: from the agents' centres (clusters of >= 2 points: never a raw input),
    # re-selected every round, which drops the barycenter warm start
    settings = _settings("co-kg", support="kmeans", support_size=6, centers_per_client=3,
                         support_every=1, num_rounds=2)  # fmt: skip
    server, clients, _, replies, _ = _instrumented("co-kg", _setup(), settings)
    assert 1 <= len(server.support) <= 6
    assert server.barycenter_covariance.shape == (len(server.support),) * 2
    for client in clients.values():
        assert torch.equal(client.support, server.support)
        assert torch.cdist(server.support, client.X).min() > 0
        assert _leaks(client.X, replies) == []
    assert {t for _, t, k, _ in replies if k == "centers"} == {"centers"}


# --- what the server learns ------------------------------------------------------------


def _reconstruct(payload: dict, support: torch.Tensor, n: int):
    r"""An agent's inputs and outcomes from its posterior reply alone: ``K_SS - C`` is
    ``K_SX A^-1 K_XS``, whose range holds exactly the kernel sections ``k(S, x_i)`` at
    the agent's inputs; then ``mu - m = K_SX A^-1 (y - m)`` gives ``y``."""
    tensor = {k: torch.as_tensor(np.asarray(v)) for k, v in payload.items()}
    kernel = shared_kernel(tensor["lengthscale"], tensor["outputscale"])
    with torch.no_grad():
        D = kernel(support).to_dense() - tensor["covariance"]
    _, V = torch.linalg.eigh(D)
    P = V[:, -n:]

    def residual(x):
        x = torch.as_tensor(x, dtype=torch.float64).reshape(-1, support.shape[-1])
        with torch.no_grad():
            v = kernel(support, x).to_dense()
        return (v - P @ (P.T @ v)).norm(dim=0) / v.norm(dim=0)

    axis = torch.linspace(0, 1, 101, dtype=torch.float64)
    candidates = torch.cartesian_prod(axis, axis)
    found: list[torch.Tensor] = []
    for i in residual(candidates).argsort().tolist():
        if any((candidates[i] - f).norm() < 0.1 for f in found):
            continue
        res = minimize(
            lambda z: float(residual(z)),
            candidates[i].numpy(),
            method="Nelder-Mead",
            options={"xatol": 1e-10, "fatol": 1e-15, "maxiter": 4000},
        )
        x = torch.as_tensor(np.clip(res.x, 0, 1))
        if not any((x - f).norm() < 0.05 for f in found):
            found.append(x)
        if len(found) == n:
            break
    X = torch.stack(found)
    with torch.no_grad():
        K_SX = kernel(support, X).to_dense()
        A = kernel(X).to_dense() + tensor["noise"] * torch.eye(n, dtype=torch.float64)
    m = tensor["mean_constant"]
    alpha = torch.linalg.lstsq(K_SX, (tensor["mean"] - m).unsqueeze(-1)).solution
    return X, (m + A @ alpha).squeeze(-1)


def test_the_server_reconstructs_an_agents_warm_up_data_from_its_posterior():
    # the slides: "discretization prevents reverse-engineering of raw data points". It
    # does not: 4 warm-up points and a coarser 6 x 6 grid, and the first posterior the
    # agent sends gives them back (inputs and outcomes)
    setup = _setup(num_clients=2)
    settings = _settings("barycenter-qkg", num_init=4, num_rounds=1)
    server, clients, _, replies, _ = _instrumented("barycenter-qkg", setup, settings)
    client = clients[0]
    payload = {k: v for c, t, k, v in replies if c == 0 and t == "posterior"}
    X_hat, Y_hat = _reconstruct(payload, server.support, int(payload["num_data"]))
    X, Y = client.X[:4], client.Y[:4].squeeze(-1)  # what it held when it sent that
    order = [int((X - x).norm(dim=-1).argmin()) for x in X_hat]
    assert sorted(order) == [0, 1, 2, 3]
    # the grid spacing is 0.2; the data come back to float64 rounding (~1e-14 measured;
    # asserted with room for the Nelder-Mead stopping rule, xatol 1e-10)
    torch.testing.assert_close(X_hat, X[order], rtol=0, atol=1e-6)
    torch.testing.assert_close(Y_hat, Y[order], rtol=1e-6, atol=1e-6)


def test_an_agents_summary_is_its_gp_posterior_in_original_units():
    # dense linear algebra from the agent's own data and its original-unit
    # hyperparameters reproduces what it sends (so the hyperparameters are right)
    setup = _setup(num_clients=1)
    objective = setup.make_objectives()[0]
    client = CoKGClient(0, objective, _settings("co-kg"), seed=5)
    client.handle(Message("init"))
    client.handle(Message("support", {"support": grid_support(2, 6).numpy()}))
    summary = client.posterior_summary()
    S, X, Y = client.support, client.X, client.Y.squeeze(-1)
    k = shared_kernel(summary["lengthscale"], summary["outputscale"])
    with torch.no_grad():
        K_SX, K_SS = k(S, X).to_dense(), k(S).to_dense()
        A = k(X).to_dense() + summary["noise"] * torch.eye(len(X), dtype=torch.double)
    m = summary["mean_constant"]
    mean = m + K_SX @ torch.linalg.solve(A, Y - m)
    cov = K_SS - K_SX @ torch.linalg.solve(A, K_SX.T)
    # Two float64 computations of one posterior (the agent's on standardised outcomes,
    # scaled back; this one in original units), each within eps f of the exact one:
    # gp_posterior_error_factors, kappa of the kernel entries (+4: the hyperparameters'
    # rescaling), residuals formed from |Y| + |m| (+ the standardisation's shift); the
    # covariance entrywise, its per-point factors maximised over the support; plus the
    # roundings of the unit changes (m = shift + s m_std, C = s^2 C_std, symmetrised).
    model = client.local_model()
    shift = model.outcome_transform.means.reshape(())
    eps, n = torch.finfo(torch.double).eps, len(X)
    kappa = kernel_rounding(torch.cat([X, S]) / summary["lengthscale"], 1.0) + 4
    f_mean, _ = gp_posterior_error_factors(
        A, K_SX, K_SS.diagonal(), Y - m, kappa, r_mag=Y.abs() + m.abs() + shift.abs()
    )
    W = torch.linalg.solve(A, K_SX.T).norm(dim=0).max()  # largest |w| = |A^-1 k(X, s)|
    f_cov = (kappa + 4) * K_SS.abs().max() + (n + 2 * kappa) * K_SX.norm(dim=-1).max() * W
    f_cov = f_cov + (n + kappa) * torch.linalg.matrix_norm(A, ord=2) * W**2
    mean_bound = 2 * eps * (f_mean + 2 * (shift.abs() + (mean - shift).abs()))
    assert_within(summary["mean"], mean, mean_bound)
    assert_within(summary["covariance"], cov, 2 * eps * f_cov)
    # the hyperparameters are the model's, rescaled by the outcome transform
    std = model.outcome_transform.stdvs.reshape(())
    hyper = original_hyperparameters(model)
    torch.testing.assert_close(hyper["outputscale"], std**2)
    torch.testing.assert_close(hyper["noise"], model.likelihood.noise.reshape(()) * std**2)


def test_original_hyperparameters_refuses_other_kernels():
    from gpytorch.kernels import MaternKernel

    X = torch.rand(5, 2, dtype=torch.double)
    model = SingleTaskGP(X, X.sum(-1, keepdim=True), covar_module=MaternKernel())
    with pytest.raises(UnsupportedError, match="RBF"):
        original_hyperparameters(model)


# --- agents refuse what the protocol does not allow -------------------------------------


def _agent(**kwargs) -> CoKGClient:
    objective = _setup(num_clients=1).make_objectives()[0]
    client = CoKGClient(0, objective, _settings("co-kg", **kwargs), seed=1, support_seed=0)
    client.handle(Message("init"))
    return client


def test_an_agent_refuses_a_support_other_than_the_public_one():
    client = _agent()
    grid = grid_support(2, 6)
    # a finer cluster around the agent's own data is not the settings' grid
    with pytest.raises(ProtocolViolation, match="differs from the grid support"):
        client.handle(Message("support", {"support": (grid * 0.1 + client.X[0] * 0.9).numpy()}))
    with pytest.raises(ProtocolViolation, match="finite points"):
        client.handle(Message("support", {"support": np.full((4, 2), 2.0)}))
    client.handle(Message("support", {"support": grid.numpy()}))
    assert torch.equal(client.support, grid)


def test_an_agent_evaluates_one_point_per_posterior_it_sent():
    client = _agent()
    client.handle(Message("support", {"support": grid_support(2, 6).numpy()}))
    with pytest.raises(ProtocolViolation, match="last posterior was for round None"):
        client.handle(Message("evaluate", {"x": np.full(2, 0.3), "t": 1}))
    client.handle(Message("posterior", {"t": 1}))
    with pytest.raises(ProtocolViolation, match=r"finite values in \[0, 1\]"):
        client.handle(Message("evaluate", {"x": np.full(2, 1.5), "t": 1}))
    with pytest.raises(ProtocolViolation, match="round 2"):
        client.handle(Message("evaluate", {"x": np.full(2, 0.3), "t": 2}))
    client.handle(Message("evaluate", {"x": np.full(2, 0.3), "t": 1}))
    assert len(client.X) == 4
    with pytest.raises(ProtocolViolation, match="round None"):  # not twice
        client.handle(Message("evaluate", {"x": np.full(2, 0.4), "t": 1}))


# --- settings -----------------------------------------------------------------------------


@pytest.mark.parametrize("cls", [CoKGSettings, CoEISettings, CoESSettings, BarycenterQKGSettings])
def test_defaults_validate(cls):
    cls().validate()


@pytest.mark.parametrize(
    "cls, name, value",
    [
        (CoKGSettings, "num_init", 0),
        (CoKGSettings, "num_rounds", 1.5),
        (CoKGSettings, "points_per_dim", 0),
        (CoKGSettings, "support_size", 5000),
        (CoKGSettings, "support_size", True),
        (CoKGSettings, "centers_per_client", 0),
        (CoKGSettings, "support_every", -1),
        (CoKGSettings, "support", "hexagonal"),
        (CoKGSettings, "weights", "votes"),
        (CoKGSettings, "num_restarts", 0),
        (CoKGSettings, "raw_samples", None),
        (CoKGSettings, "maxiter", 0),
        (CoKGSettings, "fit_maxiter", 0),
        (CoKGSettings, "local_refit_every", 0),
        (CoKGSettings, "num_fantasies", 0),
        (CoKGSettings, "discrete", "yes"),
        (CoKGSettings, "beta_schedule", "cosine"),
        (CoKGSettings, "beta0", -1.0),
        (CoKGSettings, "beta0", math.inf),
        (CoKGSettings, "beta_rate", -0.1),
        (CoKGSettings, "beta_power", math.nan),
        (CoEISettings, "beta0", "1"),
        (CoESSettings, "num_mv_samples", 0),
        (BarycenterQKGSettings, "mean_aggregation", "homomorphic"),
        (BarycenterQKGSettings, "num_fantasies", -3),
    ],
)
def test_bad_settings_name_the_field(cls, name, value):
    with pytest.raises(ValueError, match=f"`{name}`"):
        cls(**{name: value}).validate()


def test_bad_setting_combinations():
    with pytest.raises(ValueError, match="`num_init`=1: a k-means support"):
        CoKGSettings(support="kmeans", num_init=1).validate()
    with pytest.raises(ValueError, match="`beta_power`"):  # beta_t overflows in the run
        CoKGSettings(beta_schedule="power", beta0=1.0, beta_power=400.0).validate()
    # a 10^6-point grid in 6-D
    with pytest.raises(ValueError, match="`points_per_dim`=10 in `dim`=6"):
        run_federated(
            "co-kg",
            FederationSetup(problem="hartmann", dim=6, num_clients=2),
            CoKGSettings(support="grid"),
        )
    # the server needs the barycenter mean: CKKS keeps sums on the agents; plaintext
    # hands every input to the server: the secure mean runs on masking only
    for aggregator in ("ckks", "plaintext"):
        with pytest.raises(ValueError, match=f"`aggregator`='{aggregator}'"):
            run_federated(
                "barycenter-qkg",
                _setup(aggregator=aggregator),
                _settings("barycenter-qkg", mean_aggregation="secure"),
            )
    # the secure mean is uniform over the whole federation, on a public support
    with pytest.raises(ValueError, match="`weights`='data' with `mean_aggregation`='secure'"):
        BarycenterQKGSettings(mean_aggregation="secure", weights="data").validate()
    with pytest.raises(ValueError, match="`support`='kmeans' with `mean_aggregation`='secure'"):
        BarycenterQKGSettings(mean_aggregation="secure", support="kmeans").validate()
    # the local terms need the agents' own means: only barycenter-qkg (beta = 0) hides them
    for algorithm in ("co-kg", "co-ei", "co-es"):
        names = {f.name for f in dataclasses.fields(get_algorithm(algorithm).settings_class)}
        assert "mean_aggregation" not in names
        assert get_algorithm(algorithm).secure_aggregation is False
    assert get_algorithm("barycenter-qkg").secure_aggregation is True


def test_cli_runs_co_kg(tmp_path, capsys):
    from botorch_fed.cli import main

    out = tmp_path / "r.json"
    args = ["run", "co-kg", "--problem", "cokg-f1", "--clients", "3", "--rounds", "2",
            "--seed", "0", "--init", "3", "--points-per-dim", "6", "--num-fantasies", "4",
            "--raw-samples", "16", "--maxiter", "10", "--beta-schedule", "power",
            "--beta0", "0.1", "--beta-power", "1.0", "--out", str(out)]  # fmt: skip
    assert main(args) == 0, capsys.readouterr()
    data = json.loads(out.read_text())
    assert data["algorithm"] == "co-kg" and data["steps"] == {"init": 9, "collaborative": 6}
    assert data["config"]["settings"]["beta_schedule"] == "power"
    assert data["config"]["settings"]["points_per_dim"] == 6
    assert len(data["best_per_round"]) == 3
    # x^ reaches the result file (with its noise-free value) and the printed table
    rec = data["recommendation"]
    assert rec["round"] == 2 and len(rec["x"]) == 2 and rec["client"] in (0, 1, 2)
    from botorch_fed.test_functions import CoKGSinCosBowl

    true = CoKGSinCosBowl().evaluate_true(torch.tensor([rec["x"]], dtype=torch.double))
    assert rec["value"] == pytest.approx(float(true), rel=1e-12)
    printed = capsys.readouterr().out
    assert "recommended point (x^)" in printed and "x^: simple regret" in printed
    # co-kg has no secure-mean option: the command line refuses it
    assert main(["run", "co-kg", "--problem", "cokg-f1", "--mean-aggregation", "secure"]) == 2
    assert "--mean-aggregation" in capsys.readouterr().err


# --- checkpoints and the secure mean ------------------------------------------------------


@pytest.mark.parametrize(
    "algorithm, extra",
    [
        ("co-kg", dict(weights="precision", discrete=True)),
        ("barycenter-qkg", dict(mean_aggregation="secure")),  # uniform: the only secure weights
    ],
)
def test_resume_is_bit_for_bit(tmp_path, algorithm, extra):
    setup = lambda: _setup(aggregator="masking")  # noqa: E731
    settings = lambda: _settings(algorithm, num_rounds=2, **extra)  # noqa: E731
    full = run_federated(algorithm, setup(), settings())
    with pytest.raises(Killed):
        run_federated(algorithm, setup(), settings(), checkpoint=tmp_path, on_round=kill_after(1))
    manifest, states = load_checkpoint(tmp_path)
    assert states["server"]["state"]["barycenter_covariance"].shape == (36, 36)
    resumed = run_federated(algorithm, setup(), settings(), resume=tmp_path)
    assert comparable(resumed) == comparable(full)


def test_secure_mean_equals_the_clear_mean_to_the_backends_precision():
    results = {}
    for how in ("clear", "secure"):
        settings = _settings("barycenter-qkg", num_rounds=1, mean_aggregation=how)
        server, clients, _, replies, sent = _instrumented(
            "barycenter-qkg", _setup(aggregator="masking"), settings
        )
        results[how] = (server, replies, sent, clients)
    clear, secure = results["clear"][0].last_central, results["secure"][0].last_central
    # the agents' round-1 means (the clear run sent them; the same agents and data)
    means = [torch.as_tensor(np.asarray(v)) for _, t, k, v in results["clear"][1] if k == "mean"]
    # both paths round the products w_n mu_n (u |w_n mu_n| each); masking then rounds
    # them to the fixed-point grid 2^-40 (2^-41 each), sums exactly and converts to
    # float64 (u |sum|), the clear path adds them in float64 (gamma_2 sum_n |w_n mu_n|):
    # within 3 2^-41 + 2.5 eps sum_n |w_n mu_n| of each other
    magnitude = sum(w * m.abs() for w, m in zip(clear.weights.tolist(), means, strict=True))
    bound = 3 * 2.0**-41 + 2.5 * torch.finfo(torch.double).eps * magnitude
    difference = (secure.barycenter_mean - clear.barycenter_mean).abs()
    assert difference.max() > 0  # not the clear path in disguise
    assert (difference <= bound).all()  # and as close as promised
    torch.testing.assert_close(secure.barycenter_covariance, clear.barycenter_covariance)
    # the same points are assigned (the acquisition sees means equal to ~1e-12)
    points = {
        h: np.stack([p["x"] for _, t, p in results[h][2] if t == "evaluate"]) for h in results
    }
    np.testing.assert_allclose(points["secure"], points["clear"], rtol=0, atol=1e-6)
    # hidden: no posterior reply carries a mean, and of an agent's mean (the ones the
    # clear run sent: the same agents, the same data in round 1) only its maximum, the
    # local optimum of Alg. 1's output, reaches the server
    replies = results["secure"][1]
    assert "mean" not in {k for _, t, k, _ in replies if t == "posterior"}
    assert len(means) == 3
    for m in means:
        assert {key for *_, key in _leaks(m, replies)} == {"best_value"}
        rest = m[torch.arange(len(m)) != m.argmax()]
        assert _leaks(rest, replies) == []
    # positive control: the clear run's replies do contain them
    assert all(_leaks(torch.as_tensor(m), results["clear"][1]) for m in means)
    # ... but the sum alone does not hide the outcomes: with the inputs (the covariances
    # give them away, see the reconstruction test) and the hyperparameters every agent
    # sends, sum_n w_n mu_n is linear in all agents' outcomes -- 36 equations for 9
    # unknowns here (support larger than the federation's data): solve for them
    server, clients = results["secure"][0], results["secure"][3]
    sent = {c: {} for c in clients}  # what each agent sent in clear
    for cid, type_, key, value in replies:
        if type_ == "posterior":
            sent[cid][key] = torch.as_tensor(np.asarray(value))
    S, w = server.support, server.last_central.weights
    blocks, offset = [], server.last_central.barycenter_mean.clone()
    for n, cid in enumerate(sorted(clients)):
        h, X = sent[cid], clients[cid].X[:3]  # the inputs it held in round 1
        kernel = shared_kernel(h["lengthscale"], h["outputscale"])
        with torch.no_grad():
            A = kernel(X).to_dense() + h["noise"] * torch.eye(3, dtype=torch.double)
            B = w[n] * torch.linalg.solve(A, kernel(S, X).to_dense().T).T  # s x 3
        blocks.append(B)
        offset -= w[n] * h["mean_constant"] - B @ (
            h["mean_constant"] * torch.ones(3, dtype=torch.double)
        )
    y = torch.linalg.lstsq(torch.cat(blocks, dim=-1), offset.unsqueeze(-1)).solution.squeeze(-1)
    truth = torch.cat([clients[c].Y[:3].squeeze(-1) for c in sorted(clients)])
    torch.testing.assert_close(y, truth, rtol=1e-3, atol=1e-3)


# --- failed evaluations -------------------------------------------------------------------


def _fails_first(n: int):
    calls = {"n": 0}

    def fn(Z):
        calls["n"] += 1
        if calls["n"] <= n:
            raise OSError("licence server unreachable")
        return (Z[:, 0] - 0.2) ** 2 + (Z[:, 1] + 0.3) ** 2

    return fn


BOUNDS = [[-1.0, -1.0], [1.0, 1.0]]


def test_an_agent_without_data_counts_with_the_prior():
    objectives = [CallableObjective(_fails_first(3), BOUNDS)] + [
        CallableObjective(_fails_first(0), BOUNDS) for _ in range(2)
    ]
    setup = FederationSetup(objectives=objectives, seed=0, crypto_seed=0)
    result = run_federated("co-kg", setup, _settings("co-kg", num_rounds=1))
    assert [(f["round"], f["step"]) for f in result.failures] == [(0, "init")] * 3
    assert result.steps == {"init": 9, "collaborative": 3}
    assert result.best_per_client[0] is not None  # it took part and holds data now


def test_a_run_where_every_evaluation_fails_finishes():
    objectives = [CallableObjective(_fails_first(10**9), BOUNDS) for _ in range(3)]
    setup = FederationSetup(objectives=objectives, seed=0, crypto_seed=0)
    server, clients, _ = build_federation("co-kg", setup, _settings("co-kg"))
    server.run()
    assert server.recommendation is None
    assert all(len(c.failures) == 5 for c in clients.values())


# --- the knowledge-gradient baselines ------------------------------------------------------


@pytest.mark.parametrize("algorithm, step", [("local", "local"), ("central", "central")])
def test_kg_baselines_run(algorithm, step):
    settings = BOSettings(
        num_init=3, num_rounds=1, acquisition="kg", num_fantasies=4, raw_samples=16, maxiter=10
    )
    server, clients, _ = build_federation(algorithm, _setup(num_clients=2), settings)
    server.run()
    for client in clients.values():
        assert [h["step"] for h in client.history] == ["init"] * 3 + [step]
    if algorithm == "central":  # one jointly optimised q-KG batch: distinct points
        assert (clients[0].X[3] - clients[1].X[3]).norm() > 1e-3


def _model(dtype=torch.double):
    g = torch.Generator().manual_seed(0)
    X = torch.rand(8, 2, generator=g, dtype=dtype)
    Y = torch.sin(6 * X).sum(-1, keepdim=True)
    return SingleTaskGP(X, Y).eval()


def test_knowledge_gradient_is_seeded_and_leaves_the_global_rng_alone():
    model = _model()
    X = torch.rand(5, 1 + 8, 2, generator=torch.Generator().manual_seed(1), dtype=torch.double)
    state = torch.random.get_rng_state()
    a = knowledge_gradient(model, num_fantasies=8, seed=3)
    b = make_step_acquisition("kg", model, num_fantasies=8, seed=3)
    assert torch.equal(torch.random.get_rng_state(), state)
    with torch.no_grad():
        assert torch.equal(a(X), b(X))
        other = knowledge_gradient(model, num_fantasies=8, seed=4)(X)
        assert not torch.equal(a(X), other)
        # minimisation: the knowledge gradient of -f
        neg = knowledge_gradient(model, num_fantasies=8, seed=3, maximize=False)(X)
    assert a.num_fantasies == 8 and neg.shape == (5,)
    with pytest.raises(ValueError, match="`num_fantasies`"):
        knowledge_gradient(model, num_fantasies=0)
    with pytest.raises(UnsupportedError, match="posterior_transform"):
        from botorch.acquisition.objective import ScalarizedPosteriorTransform

        tf = ScalarizedPosteriorTransform(torch.ones(1, dtype=torch.double))
        knowledge_gradient(model, maximize=False, posterior_transform=tf)


def test_knowledge_gradient_of_minus_f_is_the_knowledge_gradient_of_the_negated_model():
    from botorch.acquisition.knowledge_gradient import qKnowledgeGradient
    from botorch.sampling.normal import SobolQMCNormalSampler

    X0 = torch.rand(8, 2, generator=torch.Generator().manual_seed(0), dtype=torch.double)
    Y0 = torch.sin(6 * X0).sum(-1, keepdim=True)
    up = SingleTaskGP(X0, Y0).eval()
    down = SingleTaskGP(X0, -Y0).eval()  # the GP of -f (same initial hyperparameters)
    P = torch.rand(5, 2, generator=torch.Generator().manual_seed(1), dtype=torch.double)
    with torch.no_grad():
        torch.testing.assert_close(down.posterior(P).mean, -up.posterior(P).mean)
    X = torch.rand(4, 1 + 6, 2, generator=torch.Generator().manual_seed(2), dtype=torch.double)
    acqf = knowledge_gradient(up, num_fantasies=6, seed=0, maximize=False)
    sampler = SobolQMCNormalSampler(torch.Size([6]), seed=0)
    reference = qKnowledgeGradient(down, num_fantasies=None, sampler=sampler)
    with torch.no_grad():
        a = acqf(X)
        reference(X)  # draws its base samples; the fantasies of -f use the negated ones
        reference.sampler.base_samples = -acqf.sampler.base_samples
        b = reference(X)
    torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9)
    assert not torch.allclose(a, knowledge_gradient(up, num_fantasies=6, seed=0)(X).detach())


def test_one_shot_acquisitions_in_the_step_searches():
    model = _model()
    bounds = torch.tensor([[0.0, 0.0], [1.0, 1.0]], dtype=torch.double)
    acqf = knowledge_gradient(model, num_fantasies=4, seed=0)
    with pytest.raises(UnsupportedError, match="sequential"):
        maximize_step_acquisition(acqf, bounds, seed=0, q=2, sequential=True)
    kw = dict(seed=0, num_restarts=3, raw_samples=16, maxiter=10)
    best = maximize_step_acquisition(acqf, bounds, **kw)
    ranked = ranked_step_candidates(acqf, bounds, min_distance=0.05, **kw)
    assert best.shape == (1, 2) and ranked.shape[-1] == 2 and len(ranked) > 3
    torch.testing.assert_close(ranked[0], best[0])  # the same seeded search, best first
    assert ((ranked >= 0) & (ranked <= 1)).all()


def test_settings_that_would_silently_be_another_algorithm_are_flagged():
    from botorch_fed.algorithms import CoKGSettings

    for schedule in ("constant", "power"):
        with pytest.warns(UserWarning, match="barycenter-qKG"):
            CoKGSettings(beta_schedule=schedule, beta0=0.0).validate()
    with pytest.raises(ValueError, match=">= 2"):
        CoKGSettings(points_per_dim=1).validate()


def test_the_server_takes_its_acquisition_from_the_settings_class():
    from botorch_fed.algorithms.co_kg.server import CoKGServer
    from botorch_fed.algorithms.co_kg.settings import CollaborativeSettings

    with pytest.raises(TypeError, match="settings of a Co-KG algorithm, got CollaborativeSettings"):
        CoKGServer(None, CollaborativeSettings(num_init=2, num_rounds=1), 2, seed=0)
