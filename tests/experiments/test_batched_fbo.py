r"""FBO-FedGP's default on the batched grid: the batched PIC models, summaries and fit
Jacobians against each member's own (FederatedPICGP, PITCFitClient), and the batched
rounds against the protocol runner's."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from botorch.models.transforms.outcome import Standardize

from botorch_fed.algorithms import get_algorithm, run_federated
from botorch_fed.algorithms.fbo_fedgp import FBOFedGPSettings
from botorch_fed.algorithms.fbo_fedgp.settings import global_modules
from botorch_fed.experiments import run_grid
from botorch_fed.experiments.batched_fbo import FBOGrid
from botorch_fed.experiments.batched_pic import (
    BatchedPICGP,
    batched_summaries,
    batched_summary_and_jacobian,
)
from botorch_fed.models import (
    FederatedPICGP,
    FederatedPITCGP,
    PITCFitClient,
    PITCHyperparameters,
    SparseSummary,
    compute_local_summary,
)
from botorch_fed.problems.heterogeneity import initial_design
from botorch_fed.protocol import FederationSetup
from botorch_fed.protocol.runner import build_context

EPS64 = torch.finfo(torch.float64).eps


def _members(sizes=(4, 5), M=2, n=6, d=3, seed=0):
    r"""Replications of ``M`` members each, replication ``r`` on a support of ``sizes[r]``
    points and its own hyperparameters: ``(X, Y, supports, thetas)`` per member."""
    g = torch.Generator().manual_seed(seed)
    rng = np.random.default_rng(seed)
    R = len(sizes)
    X = torch.rand(R * M, n, d, generator=g, dtype=torch.float64)
    Y = torch.randn(R * M, n, 1, generator=g, dtype=torch.float64)
    supports, thetas = [], []
    for m in sizes:
        hyper = PITCHyperparameters(*global_modules(d))
        theta = hyper.get_theta()
        theta[:d] += 0.4 * rng.standard_normal(d)  # lengthscales (raw); noise stays positive
        theta[d] = 0.02 + 0.05 * rng.random()
        theta[d + 1] = rng.standard_normal()
        S = torch.rand(m, d, generator=g, dtype=torch.float64)
        supports += [S] * M
        thetas += [theta] * M
    return X, Y, supports, thetas


def _tol(S, theta, n: int, dtype=torch.float64) -> float:
    r"""What two float64 computations of one PIC quantity (or its ``dtype`` cast) may
    differ by, relative to its largest entry: a few ulps per row of the ``m + n`` points
    the solves touch, times the condition number of the support's kernel matrix."""
    K = _own_modules(theta, S.shape[-1])[0](S).to_dense().detach()
    kappa = float(torch.linalg.cond(K))
    return 8.0 * (len(S) + n) * kappa * torch.finfo(dtype).eps


def _close(actual, expected, tol: float) -> None:
    if isinstance(actual, torch.Tensor):
        actual, expected = actual.detach().double().numpy(), expected.detach().double().numpy()
    actual, expected = np.asarray(actual), np.asarray(expected)
    scale = max(1.0, float(np.abs(expected).max()))
    assert float(np.abs(actual - expected).max()) <= tol * scale


def _own_modules(theta, d):
    modules = global_modules(d)
    PITCHyperparameters(*modules).set_theta(theta)
    return modules


def _standardize(mean, std):
    tf = Standardize(m=1).double()
    tf.train(True)
    tf(torch.tensor([[mean - std], [mean + std]], dtype=torch.float64))  # trains to (mean, std')
    tf.means.fill_(mean)
    tf.stdvs.fill_(std)
    tf._stdvs_sq.fill_(std**2)
    return tf.eval()


def test_batched_summaries_and_jacobians_are_each_members_own():
    X, Y, supports, thetas = _members()
    d = X.shape[-1]
    packed = batched_summaries(X, Y, supports, thetas)
    with_jacobian = batched_summary_and_jacobian(X, Y, supports, thetas)
    for b in range(len(supports)):
        modules = _own_modules(thetas[b], d)
        own = compute_local_summary(X[b], Y[b], supports[b], *modules).to_numpy()
        tol = _tol(supports[b], thetas[b], X.shape[-2])
        _close(packed[b], own, tol)
        fit = PITCFitClient(X[b], Y[b], supports[b], *global_modules(d))
        own_packed, own_jacobian = fit.summary_and_jacobian(thetas[b])
        L = len(own_packed)
        assert with_jacobian[b].shape == (L + own_jacobian.size,)
        _close(with_jacobian[b][:L], own_packed, tol)
        jac = with_jacobian[b][L:].reshape(L, -1)
        _close(jac, own_jacobian, 10 * tol)  # a derivative: one more solve
        assert np.abs(jac).max() > 0  # the hyperparameters move the summary


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_batched_pic_model_is_each_clients_federated_pic_model(dtype):
    X, Y, supports, thetas = _members(sizes=(4, 5, 4))
    B, d = X.shape[0], X.shape[-1]
    own_sums = batched_summaries(X, Y, supports, thetas)
    totals = [own_sums[b - b % 2] + own_sums[b - b % 2 + 1] for b in range(B)]  # M = 2
    summaries = [SparseSummary.from_numpy(t, len(S)) for t, S in zip(totals, supports, strict=True)]
    means = torch.linspace(-1.0, 2.0, B, dtype=torch.float64)
    stdvs = torch.linspace(0.5, 3.0, B, dtype=torch.float64)
    model = BatchedPICGP(supports, summaries, thetas, X, Y, means, stdvs)
    assert model.batch_shape == torch.Size([B])
    g = torch.Generator().manual_seed(5)
    X_test = torch.rand(4, B, 3, d, generator=g, dtype=torch.float64).to(dtype)
    post = model.posterior(X_test)
    assert post.mean.dtype == dtype and post.mean.shape == (4, B, 3, 1)
    for b in range(B):
        tf = _standardize(float(means[b]), float(stdvs[b]))
        modules = _own_modules(thetas[b], d)
        pitc = FederatedPITCGP(supports[b], summaries[b], *modules, outcome_transform=tf)
        own = FederatedPICGP.from_pitc(pitc, X[b], Y[b]).posterior(X_test[:, b])
        # both compute in float64 and return ``dtype``; the outcomes' scale multiplies
        tol = _tol(supports[b], thetas[b], X.shape[-2], dtype) * float(stdvs[b]) ** 2
        # the reference untransforms in its float64 buffers' dtype
        own_mean, own_cov = own.mean.to(dtype), own.distribution.covariance_matrix.to(dtype)
        _close(post.mean[:, b], own_mean, tol)
        _close(post.distribution.covariance_matrix[:, b], own_cov, tol)


def test_the_batched_pic_model_refuses_what_it_does_not_hold():
    X, Y, supports, thetas = _members()
    B = X.shape[0]
    sums = [SparseSummary.from_numpy(v, len(S)) for v, S in
            zip(batched_summaries(X, Y, supports, thetas), supports, strict=True)]  # fmt: skip
    ones = torch.ones(B, dtype=torch.float64)
    with pytest.raises(ValueError, match="`thetas` holds 3 members"):
        BatchedPICGP(supports, sums, thetas[:3], X, Y, ones, ones)
    with pytest.raises(ValueError, match="`stdvs` must be positive"):
        BatchedPICGP(supports, sums, thetas, X, Y, ones, -ones)
    with pytest.raises(ValueError, match="`means` has shape"):
        BatchedPICGP(supports, sums, thetas, X, Y, ones[:1], ones)
    model = BatchedPICGP(supports, sums, thetas, X, Y, ones, ones)
    with pytest.raises(ValueError, match=r"`X` must be `\.\.\. x 4 x q x d`"):
        model.posterior(torch.rand(3, 1, X.shape[-1], dtype=torch.float64))
    with pytest.raises(NotImplementedError, match="observation noise"):
        model.posterior(torch.rand(B, 1, X.shape[-1], dtype=torch.float64), observation_noise=True)


SETTINGS = FBOFedGPSettings(num_init=5, num_rounds=3, num_restarts=2, raw_samples=16,
                            support_size=6, support_every=2, hyper_every=2)  # fmt: skip


def _setup(seed):
    return FederationSetup(problem="hartmann", dim=3, num_clients=3, seed=seed,
                           aggregator="plaintext", threads=1)  # fmt: skip


def _step_grid(fbo, ctx, rounds, device="cpu"):
    r"""Run ``fbo`` (one replication) from the initial designs: each round's points and
    the hyperparameters after it."""
    d = ctx.dim
    X = torch.stack([initial_design(fbo.cfg.num_init, d, s, r) for s, r in
                     zip(ctx.client_seeds, ctx.init_regions, strict=True)])  # fmt: skip
    Y = torch.stack([-o.evaluate(x)[0].reshape(-1, 1) for o, x in
                     zip(ctx.objectives, X, strict=True)])  # fmt: skip  # hartmann: minimised
    fbo.select_support(0, X)
    points, thetas = [], []
    for t in range(1, rounds + 1):
        x = fbo.step(t, X, Y)
        points.append(x)
        thetas.append(fbo.thetas[0].copy())
        y = torch.stack([-o.evaluate(xi.unsqueeze(0))[0].reshape(1, 1) for o, xi in
                         zip(ctx.objectives, x, strict=True)])  # fmt: skip
        X, Y = torch.cat([X, x.unsqueeze(1)], 1), torch.cat([Y, y], 1)
    return points, thetas


@pytest.mark.parametrize(
    "changes",
    [
        {},  # clustered noisy support re-selected in round 3, refits in rounds 1 and 3
        {"support": "random"},
        {"support_every": 1, "support_growth": 2, "center_noise": 0.0, "hyper_every": 1},
    ],
)
def test_the_batched_rounds_take_the_protocol_runners_decisions(changes):
    r"""R = 1: every client's point of every round is the protocol client's (plaintext
    sums), through support re-selections and refits. (The models agree to float64
    rounding; a refit's trust region can amplify such differences where its inner
    L-BFGS-B stops abnormally, which these seeds avoid; the regret distributions are
    compared in benchmarks/batched_grid_equivalence.py.)"""
    settings = dataclasses.replace(SETTINGS, **changes)
    setup = _setup(4)
    protocol = run_federated("fbo-fedgp", setup, settings)
    ctx = build_context(get_algorithm("fbo-fedgp"), setup, settings, "seed")
    fbo = FBOGrid([ctx], settings, torch.device("cpu"))
    points, _ = _step_grid(fbo, ctx, settings.num_rounds)
    for t, x in enumerate(points, start=1):
        assert not torch.allclose(x[0], x[1])  # the clients searched models of their own
        for i in range(len(x)):
            (own,) = [e["x"] for e in protocol.evaluations if e["client"] == i and e["round"] == t]
            torch.testing.assert_close(x[i], torch.as_tensor(own, dtype=torch.float64),
                                       rtol=0, atol=1e-6)  # fmt: skip
    assert fbo._hyper_round == settings.num_rounds  # the last round refitted


def test_an_fbo_grid_scores_as_the_protocol_and_its_replications_are_independent():
    r"""Scores agree to the points' agreement: the models agree to float64 rounding
    (a replication's batch rounds a little differently with other grid-mates), and
    L-BFGS-B stops a few ulps of the model apart, at points ~1e-9 apart."""
    grid = run_grid("fbo-fedgp", _setup(2), SETTINGS, seeds=[2, 9])
    alone = run_grid("fbo-fedgp", _setup(9), SETTINGS, seeds=[9])[0]
    assert grid[1].best_per_round == pytest.approx(alone.best_per_round, rel=1e-6)
    assert grid[1].best_per_client == pytest.approx(alone.best_per_client, rel=1e-6)
    protocol = run_federated("fbo-fedgp", _setup(2), SETTINGS)
    assert grid[0].best_per_round == pytest.approx(protocol.best_per_round, rel=1e-6)
    assert grid[0].best_per_client == pytest.approx(protocol.best_per_client, rel=1e-6)
    assert grid[0].best_per_round[-1] < grid[0].best_per_round[0]  # the rounds mattered


@pytest.mark.parametrize(
    "settings, match",
    [
        (FBOFedGPSettings(preset="paper"), "`settings.mixing`='sample'"),
        (FBOFedGPSettings(hyperparameters="average"), "`settings.hyperparameters`='average'"),
        (FBOFedGPSettings(global_model="pitc"), "`settings.global_model`='pitc'"),
        (FBOFedGPSettings(mixing="expected"), "`settings.mixing`='expected'"),
        (FBOFedGPSettings(acquisition="ei"), "maximises UCB"),
    ],
)
def test_an_fbo_grid_refuses_settings_other_than_the_defaults_choices(settings, match):
    settings = dataclasses.replace(settings, num_init=4, num_rounds=1)
    with pytest.raises(ValueError, match=match):
        run_grid("fbo-fedgp", _setup(0), settings, seeds=1)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_an_fbo_grid_on_cuda_takes_the_cpus_decisions():
    ctx = build_context(get_algorithm("fbo-fedgp"), _setup(4), SETTINGS, "seed")
    runs = {}
    for device in ("cpu", "cuda"):
        fbo = FBOGrid([ctx], SETTINGS, torch.device(device))
        runs[device] = _step_grid(fbo, ctx, 2)
    for x_cpu, x_gpu in zip(runs["cpu"][0], runs["cuda"][0], strict=True):
        torch.testing.assert_close(x_gpu, x_cpu, rtol=0, atol=1e-6)
    np.testing.assert_allclose(runs["cuda"][1][0], runs["cpu"][1][0], rtol=1e-8)  # round 1's fit


def test_an_fbo_grid_needs_reproducible_private_generators():
    ctx = build_context(get_algorithm("fbo-fedgp"), _setup(0), SETTINGS)  # "os"
    with pytest.raises(ValueError, match="private_randomness='seed' or a crypto seed"):
        FBOGrid([ctx], SETTINGS, torch.device("cpu"))
    seeded = dataclasses.replace(_setup(0), crypto_seed=5)
    ctx = build_context(get_algorithm("fbo-fedgp"), seeded, SETTINGS)
    FBOGrid([ctx], SETTINGS, torch.device("cpu"))  # a crypto seed is reproducible too
