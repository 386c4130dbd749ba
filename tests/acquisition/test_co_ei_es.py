r"""Tests for :class:`botorch_fed.acquisition.qCoExpectedImprovement` and
:class:`botorch_fed.acquisition.qCoMaxValueEntropy`.

With ``beta = 0`` each equals BoTorch's class on the central model (Co-ES: the sum of
GIBBON's greedy increments); ``beta > 0`` adds ``beta`` times BoTorch's class on each
local model at its agent's point. Independent checks: analytic EI and the log
determinant of the noisy correlation matrix from a dense posterior.
"""

from __future__ import annotations

import math

import pytest
import torch
from botorch.acquisition import (
    LogExpectedImprovement,
    qLogExpectedImprovement,
    qLowerBoundMaxValueEntropy,
    qMaxValueEntropy,
)
from botorch.exceptions.errors import BotorchTensorDimensionError, UnsupportedError
from botorch.models.deterministic import GenericDeterministicModel
from botorch.sampling import SobolQMCNormalSampler
from torch import Tensor

from botorch_fed.acquisition import (
    default_best_f,
    optimize_co_acquisition,
    qCoExpectedImprovement,
    qCoMaxValueEntropy,
)
from botorch_fed.acquisition._rng import isolated_seed
from tests.helpers.cokg_toys import (
    CONSTANT,
    LENGTHSCALE,
    OUTPUTSCALE,
    ToyGP,
    barycenter_models,
    cond_factor,
    grid,
    rbf,
    toy,
)
from tests.helpers.tolerances import (
    assert_close,
    gp_posterior_error_factors,
    reordering_factor,
)
from tests.helpers.toy_models import kernel_rounding

DTYPES = [torch.float64, torch.float32]


@pytest.fixture(scope="module")
def gps() -> dict[str, ToyGP]:
    return {
        "central": toy(10, 10),
        "local0": toy(11, 5),
        "local1": toy(12, 6),
        "local2": toy(13, 4),
    }


def models(gps: dict[str, ToyGP], dtype: torch.dtype, N: int = 3):
    return gps["central"].model(dtype), [gps[f"local{n}"].model(dtype) for n in range(N)]


def batches(b: int, N: int, seed: int, dtype: torch.dtype) -> Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.rand(b, N, 2, generator=g, dtype=torch.float64).to(dtype)


def mean_error_factor(gp: ToyGP, P: Tensor) -> float:
    r"""The largest first-order rounding factor of ``gp``'s posterior mean at the points
    ``P`` (:func:`~tests.helpers.tolerances.gp_posterior_error_factors`): ``eps`` times it
    bounds the error of any backward-stable evaluation (GPyTorch's or the dense one)."""
    X, y, P = gp.X.double(), gp.Y.double()[:, 0], P.double()
    K = rbf(X, X) + gp.noise * torch.eye(len(X), dtype=torch.float64)
    kappa = kernel_rounding(torch.cat([X, P]), LENGTHSCALE)
    k_ss = torch.full((len(P),), OUTPUTSCALE, dtype=torch.float64)
    f_mean, _ = gp_posterior_error_factors(
        K, rbf(P, X), k_ss, y - CONSTANT, kappa, r_mag=y.abs() + CONSTANT
    )
    return float(f_mean.max())


def hand_log_ei(gp: ToyGP, x: Tensor, best_f: float) -> Tensor:
    r"""``log E[max(f(x) - best_f, 0)]`` from the dense posterior (``x``: ``b x d``)."""
    mean, cov = gp.posterior(x.double())
    sigma = cov.diagonal().clamp_min(0).sqrt()
    z = (mean - best_f) / sigma
    normal = torch.distributions.Normal(0.0, 1.0)
    return (sigma * (z * normal.cdf(z) + normal.log_prob(z).exp())).log()


# ----------------------------------------------------------------------------------
# Co-EI
# ----------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("N", [1, 3])
def test_co_ei_beta_zero_is_qlogei(gps, dtype: torch.dtype, N: int) -> None:
    central, locals_ = models(gps, dtype, N)
    acqf = qCoExpectedImprovement(central, locals_, beta=0.0, best_f=0.9, seed=4)
    # a float64 incumbent (BoTorch stores a Python float in the default dtype, float32)
    ref = qLogExpectedImprovement(
        central,
        best_f=torch.tensor(0.9, dtype=torch.float64),
        sampler=SobolQMCNormalSampler(torch.Size([512]), seed=4),
    )
    X = batches(5, N, 0, dtype)
    value = acqf(X)
    assert value.shape == (5,) and value.dtype == dtype
    assert torch.equal(value, ref(X))
    assert len(acqf.local_acqfs) == 0  # beta = 0: the local models are not evaluated


@pytest.mark.parametrize("dtype", DTYPES)
def test_co_ei_adds_the_local_log_ei_terms(gps, dtype: torch.dtype) -> None:
    central, locals_ = models(gps, dtype)
    N, beta = 3, 0.8
    local_best = [0.5, 0.7, 0.6]
    acqf = qCoExpectedImprovement(
        central, locals_, beta=beta, best_f=1.0, local_best_f=local_best, seed=2
    )
    X = batches(6, N, 1, dtype)
    central_term = qLogExpectedImprovement(
        central,
        best_f=torch.tensor(1.0, dtype=torch.float64),
        sampler=SobolQMCNormalSampler(torch.Size([512]), seed=2),
    )(X)
    local_terms = torch.stack(
        [
            LogExpectedImprovement(
                locals_[n], best_f=torch.tensor(local_best[n], dtype=torch.float64)
            )(X[..., n : n + 1, :])
            for n in range(N)
        ]
    )
    # the same N + 1 terms (the same calls) summed in another order: each side errs by at
    # most (N + 1) eps / 2 times the sum of their magnitudes (log-EIs of both signs)
    expected = central_term + beta * local_terms.sum(0)
    magnitude = (central_term.abs() + beta * local_terms.abs().sum(0)).max().item()
    assert_close(acqf(X), expected, dtype=dtype, factor=reordering_factor(N + 1), scale=magnitude)
    # the local terms themselves: analytic EI from the dense posterior (independent)
    if dtype == torch.float64:
        for n in range(N):
            hand = hand_log_ei(gps[f"local{n}"], X[:, n], local_best[n])
            # the posterior's rounding, amplified by 1 / EI in the log (EI >= e^-6 here)
            assert hand.min() > -6
            factor = cond_factor(gps[f"local{n}"], 1) * math.exp(6)
            assert_close(local_terms[n], hand, dtype=dtype, factor=factor, msg=f"agent {n}")


def test_co_ei_default_incumbents(gps) -> None:
    central, locals_ = models(gps, torch.float64, 2)
    support = grid(9)
    acqf = qCoExpectedImprovement(central, locals_, beta=1.0, seed=0, support=support)

    # the maximum of each posterior mean over the support, from the dense posterior: each
    # side's means err by at most eps f_mean, and a maximum moves no more than its
    # arguments (scale 1: f_mean is absolute)
    def check(best_f: Tensor, name: str, P: Tensor) -> None:
        expected = gps[name].posterior(P)[0].max()
        factor = 2 * mean_error_factor(gps[name], P)
        assert_close(best_f, expected, dtype=torch.float64, factor=factor, scale=1.0, msg=name)

    check(acqf.central_acqf.best_f, "central", support)
    for n in range(2):
        check(acqf.local_acqfs[n].best_f, f"local{n}", support)
    # no support: over the training inputs
    no_support = qCoExpectedImprovement(central, locals_, beta=1.0, seed=0)
    check(no_support.central_acqf.best_f, "central", gps["central"].X)
    assert not torch.equal(no_support.central_acqf.best_f, acqf.central_acqf.best_f)
    # a model's own `support` attribute (a BarycenterGP's) is used when present
    central.support = support
    try:
        assert torch.equal(default_best_f(central), acqf.central_acqf.best_f)
    finally:
        del central.support


def test_co_ei_bad_inputs(gps) -> None:
    central, locals_ = models(gps, torch.float64, 2)
    with pytest.raises(ValueError, match="empty"):
        qCoExpectedImprovement(central, [], best_f=0.0)
    with pytest.raises(ValueError, match=r"local_models\[0\]"):
        qCoExpectedImprovement(central, [object()], best_f=0.0)
    with pytest.raises(ValueError, match="beta"):
        qCoExpectedImprovement(central, locals_, beta=-1.0, best_f=0.0)
    for bad in (float("nan"), torch.ones(2), "0.5", True):
        with pytest.raises(ValueError, match="best_f"):
            qCoExpectedImprovement(central, locals_, best_f=bad)
    for bad in ([0.1], torch.ones(2, 1), 0.3, [0.1, float("inf")]):
        with pytest.raises(ValueError, match="local_best_f"):
            qCoExpectedImprovement(central, locals_, beta=1.0, best_f=0.0, local_best_f=bad)
    with pytest.raises(BotorchTensorDimensionError, match="support"):
        qCoExpectedImprovement(central, locals_, support=torch.rand(4, 3, dtype=torch.float64))
    with pytest.raises(ValueError, match="sampler"):
        qCoExpectedImprovement(central, locals_, best_f=0.0, sampler="sobol")
    deterministic = GenericDeterministicModel(lambda X: X.sum(-1, keepdim=True))
    with pytest.raises(ValueError, match="Cannot default the incumbent"):
        qCoExpectedImprovement(deterministic, [deterministic])
    acqf = qCoExpectedImprovement(central, locals_, best_f=0.0, seed=0)
    with pytest.raises(BotorchTensorDimensionError, match="batch_shape x 2 x d"):
        acqf(torch.rand(4, 3, 2, dtype=torch.float64))
    with pytest.raises(BotorchTensorDimensionError, match="d=3"):
        acqf(torch.rand(4, 2, 3, dtype=torch.float64))
    with pytest.raises(UnsupportedError, match="X_pending"):
        acqf.set_X_pending(torch.rand(1, 2, dtype=torch.float64))


# ----------------------------------------------------------------------------------
# Co-ES
# ----------------------------------------------------------------------------------


def hand_half_log_det_corr(gp: ToyGP, X: Tensor) -> Tensor:
    r"""``1/2 log det R`` of the noisy observations at ``X`` (``q x d``), dense."""
    return 0.5 * torch.logdet(noisy_correlation(gp, X))


def noisy_correlation(gp: ToyGP, X: Tensor) -> Tensor:
    r"""The correlation matrix ``R`` of the noisy observations at ``X`` (``q x d``)."""
    _, cov = gp.posterior(X.double())
    cov = cov + gp.noise * torch.eye(len(X), dtype=torch.float64)
    std = cov.diagonal().sqrt()
    return cov / std.outer(std)


def gibbon_factor(gp: ToyGP, X: Tensor, max_values: Tensor) -> float:
    r"""Rounding factor of the batch GIBBON value of ``gp`` at the ``N x d`` batch ``X``
    computed two ways (other batch shapes, joint or pending conditioning, dense).

    The posterior moments at ``X`` of two evaluations differ by at most
    ``reordering_factor(n + N, cond(K))`` eps relative to their scale. They enter ``N``
    quality terms ``-1/2 log(1 - rho^2 g(gamma))`` (``rho^2 = v / (v + noise)``, ``g`` in
    ``(0, 1)`` with slope below 1, ``gamma = (m* - m) / sigma``), whose argument is at
    least ``noise / (v + noise)`` and moves by the moments' error times
    ``1 + (|m| + |m*|) / sigma``, and ``N - 1`` repulsion terms ``1/2 log det R``, which
    amplify the relative errors of ``R``'s entries by at most ``cond(R)``: ``2 N`` logs,
    each amplifying by at most the largest of these.
    """
    N = len(X)
    mean, cov = gp.posterior(X.double())
    var = cov.diagonal().clamp_min(torch.finfo(torch.float64).tiny)
    quality = (var + gp.noise) / gp.noise * (1 + (mean.abs() + max_values.abs().max()) / var.sqrt())
    amplification = max(float(quality.max()), float(torch.linalg.cond(noisy_correlation(gp, X))))
    Xd = gp.X.double()
    K = rbf(Xd, Xd) + gp.noise * torch.eye(len(Xd), dtype=torch.float64)
    return reordering_factor(len(Xd) + N, torch.linalg.cond(K)) * 2 * N * amplification


@pytest.mark.parametrize("dtype", DTYPES)
def test_co_es_one_agent_beta_zero_is_gibbon(gps, dtype: torch.dtype) -> None:
    central, locals_ = models(gps, dtype, 1)
    cands = grid(8, dtype)
    acqf = qCoMaxValueEntropy(central, locals_, beta=0.0, candidate_set=cands, seed=6)
    with isolated_seed(6):
        ref = qLowerBoundMaxValueEntropy(central, candidate_set=cands, num_mv_samples=10)
    assert torch.equal(acqf.central_acqf.posterior_max_values, ref.posterior_max_values)
    X = batches(7, 1, 2, dtype)
    assert torch.equal(acqf(X), ref(X))
    assert len(acqf.local_acqfs) == 0


@pytest.mark.parametrize("N", [2, 3])
def test_co_es_batch_is_the_sum_of_greedy_gibbon_increments(gps, N: int) -> None:
    r"""BoTorch scores a batch greedily (``X_pending``): the joint value used here is
    the sum of those increments in agent order; and its repulsion term is the dense
    ``1/2 log det R``."""
    central, locals_ = models(gps, torch.float64, N)
    cands = grid(8)
    acqf = qCoMaxValueEntropy(central, locals_, beta=0.0, candidate_set=cands, seed=3)
    X = batches(4, N, 5, torch.float64)
    value = acqf(X)
    with isolated_seed(3):
        gibbon = qLowerBoundMaxValueEntropy(central, candidate_set=cands, num_mv_samples=10)
    max_values = gibbon.posterior_max_values.clone()
    for j in range(len(X)):
        greedy = torch.zeros((), dtype=torch.float64)
        for n in range(N):
            gibbon.set_X_pending(X[j, :n] if n else None)
            assert torch.equal(gibbon.posterior_max_values, max_values)  # not redrawn
            greedy = greedy + gibbon(X[j, n : n + 1]).squeeze()
        factor = gibbon_factor(gps["central"], X[j], max_values)
        assert_close(value[j], greedy, dtype=torch.float64, factor=factor, msg=f"batch {j}")
        gibbon.set_X_pending(None)
        quality = gibbon(X[j].unsqueeze(-2)).sum()
        repulsion = hand_half_log_det_corr(gps["central"], X[j])
        assert repulsion < -1e-3  # the test sees a missing repulsion term
        assert_close(value[j], quality + repulsion, dtype=torch.float64, factor=factor)


@pytest.mark.parametrize("dtype", DTYPES)
def test_co_es_adds_the_local_mes_terms(gps, dtype: torch.dtype) -> None:
    central, locals_ = models(gps, dtype, 2)
    cands = grid(6, dtype)
    beta, seed = 0.5, 9
    acqf = qCoMaxValueEntropy(
        central, locals_, beta=beta, candidate_set=cands, num_mv_samples=5, seed=seed
    )
    X = batches(5, 2, 3, dtype)
    central_only = qCoMaxValueEntropy(
        central, locals_, beta=0.0, candidate_set=cands, num_mv_samples=5, seed=seed
    )
    local_terms = []
    for n in range(2):
        with isolated_seed(seed + 1 + n):
            mes = qMaxValueEntropy(locals_[n], candidate_set=cands, num_mv_samples=5)
        local_terms.append(mes(X[..., n : n + 1, :]))
    local_terms = torch.stack(local_terms)
    assert local_terms.sum(0).abs().max() > 0.05  # a dropped local term would show
    central_term = central_only(X)
    expected = central_term + beta * local_terms.sum(0)
    # the same 3 terms (the same calls, the same draws) summed in another order: each
    # side errs by at most 3 eps / 2 times the sum of their magnitudes
    magnitude = (central_term.abs() + beta * local_terms.abs().sum(0)).max().item()
    assert_close(acqf(X), expected, dtype=dtype, factor=reordering_factor(3), scale=magnitude)


def test_co_es_seeded_and_rng_untouched(gps) -> None:
    central, locals_ = models(gps, torch.float64, 2)
    cands = grid(6)
    state = torch.get_rng_state()
    a = qCoMaxValueEntropy(central, locals_, beta=1.0, candidate_set=cands, seed=1)
    b = qCoMaxValueEntropy(central, locals_, beta=1.0, candidate_set=cands, seed=1)
    assert torch.equal(torch.get_rng_state(), state)
    c = qCoMaxValueEntropy(central, locals_, beta=1.0, candidate_set=cands, seed=2)
    X = batches(3, 2, 0, torch.float64)
    assert torch.equal(a(X), b(X))
    assert not torch.equal(a(X), c(X))


def test_co_es_bad_inputs(gps) -> None:
    central, locals_ = models(gps, torch.float64, 2)
    cands = grid(4)
    with pytest.raises(ValueError, match="candidate_set"):
        qCoMaxValueEntropy(central, locals_)
    with pytest.raises(BotorchTensorDimensionError, match="candidate_set"):
        qCoMaxValueEntropy(central, locals_, candidate_set=torch.rand(5, 3, dtype=torch.float64))
    with pytest.raises(BotorchTensorDimensionError, match="candidate_set"):
        qCoMaxValueEntropy(central, locals_, candidate_set=torch.rand(5, dtype=torch.float64))
    for bad in (0, True, 2.0):
        with pytest.raises(ValueError, match="num_mv_samples"):
            qCoMaxValueEntropy(central, locals_, candidate_set=cands, num_mv_samples=bad)
    with pytest.raises(ValueError, match="empty"):
        qCoMaxValueEntropy(central, (), candidate_set=cands)
    with pytest.raises(BotorchTensorDimensionError, match="different input dimensions"):
        qCoMaxValueEntropy(central, [toy(1, 3, d=3).model()], candidate_set=cands)
    with pytest.raises(ValueError, match="beta"):
        qCoMaxValueEntropy(central, locals_, beta=float("nan"), candidate_set=cands)
    acqf = qCoMaxValueEntropy(central, locals_, candidate_set=cands, seed=0)
    with pytest.raises(BotorchTensorDimensionError, match="batch_shape x 2 x d"):
        acqf(torch.rand(4, 1, 2, dtype=torch.float64))
    with pytest.raises(UnsupportedError, match="X_pending"):
        acqf.set_X_pending(torch.rand(1, 2, dtype=torch.float64))


# ----------------------------------------------------------------------------------
# The server's search
# ----------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["ei", "es"])
def test_optimize_co_ei_es(gps, kind: str) -> None:
    central, locals_ = models(gps, torch.float64, 3)
    if kind == "ei":
        acqf = qCoExpectedImprovement(central, locals_, beta=0.5, seed=0, support=grid(6))
    else:
        acqf = qCoMaxValueEntropy(central, locals_, beta=0.5, candidate_set=grid(6), seed=0)
    bounds = torch.tensor([[0.0, 0.1], [0.8, 1.0]], dtype=torch.float64)
    run = lambda: optimize_co_acquisition(  # noqa: E731
        acqf, bounds, num_restarts=2, raw_samples=16, seed=5, options={"maxiter": 15}
    )
    x = run()
    assert x.shape == (3, 2)
    assert ((x >= bounds[0]) & (x <= bounds[1])).all()
    assert torch.pdist(x).min() > 1e-3
    assert torch.equal(run(), x)
    # better than random batches (the search did its job)
    rand = bounds[0] + batches(16, 3, 7, torch.float64) * (bounds[1] - bounds[0])
    assert acqf(x.unsqueeze(0)).item() >= acqf(rand).max().item()


def test_co_ei_es_on_barycenter_gps() -> None:
    r"""On BarycenterGPs (2 agents, 6 x 6 grid): beta = 0 is BoTorch's class on the
    central model; the default incumbents come from the models' support."""
    central, locals_, support = barycenter_models(2)
    X = batches(3, 2, 8, torch.float64)
    ei = qCoExpectedImprovement(central, locals_, beta=0.0, seed=1)
    best = central.posterior(support).mean.max()
    assert torch.equal(ei.central_acqf.best_f, best)
    ref = qLogExpectedImprovement(
        central, best_f=best, sampler=SobolQMCNormalSampler(torch.Size([512]), seed=1)
    )
    assert torch.equal(ei(X), ref(X))
    es = qCoMaxValueEntropy(central, locals_, beta=0.5, candidate_set=support, seed=2)
    with isolated_seed(2):
        gibbon = qLowerBoundMaxValueEntropy(central, candidate_set=support)
    value = es(X)
    assert torch.isfinite(value).all()
    assert torch.equal(es.central_acqf(X[:, :1]), gibbon(X[:, :1]))
