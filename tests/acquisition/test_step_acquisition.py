r"""make_step_acquisition / thompson_sample_candidate / propose_step_candidate."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from botorch.acquisition import LogExpectedImprovement, UpperConfidenceBound
from botorch.acquisition.thompson_sampling import PathwiseThompsonSampling
from botorch.exceptions.errors import BotorchTensorDimensionError, UnsupportedError
from botorch.exceptions.warnings import InputDataWarning
from botorch.optim import optimize_acqf
from botorch.utils.sampling import draw_sobol_samples
from linear_operator.utils.warnings import NumericalWarning
from scipy.stats import binomtest, kstest
from torch.quasirandom import SobolEngine

from botorch_fed.acquisition import (
    STEP_KINDS,
    CachedLogExpectedImprovement,
    CachedUpperConfidenceBound,
    make_step_acquisition,
    maximize_step_acquisition,
    pathwise_thompson_sampling,
    propose_step_candidate,
    ranked_step_candidates,
    supports_pathwise_sampling,
    thompson_sample_candidate,
)
from tests.helpers.tolerances import (
    assert_close,
    assert_within,
    eps,
    gp_posterior_error_factors,
    reordering_factor,
    sqrt_error,
)
from tests.helpers.toy_models import (
    CONSTANT,
    NOISE,
    OUTPUTSCALE,
    dense_gp_posterior,
    kernel_rounding,
    make_pitc,
    make_stgp,
    normal_cdf,
    rbf,
    toy_data,
    ucb_error_bound,
)

DTYPES = [torch.float32, torch.float64]
D = 2


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", InputDataWarning)
        warnings.simplefilter("ignore", NumericalWarning)  # float32 Cholesky jitter
        warnings.filterwarnings("ignore", "Optimization failed", RuntimeWarning)
        yield


def _stgp(dtype, lengthscale=0.3, standardize=False):
    X, Y = toy_data(0, 8, D, dtype)
    return make_stgp(X, Y, lengthscale=lengthscale, standardize=standardize), X, Y


def _pitc(dtype):
    X1, Y1 = toy_data(0, 6, D, dtype)
    X2, Y2 = toy_data(1, 6, D, dtype)
    return make_pitc([(X1, Y1), (X2, Y2)], toy_data(2, 5, D, dtype)[0])


def _bounds(dtype):
    return torch.tensor([[-0.5, 0.2], [1.0, 0.9]], dtype=dtype)


def _inside(x, bounds):
    return bool(((x >= bounds[0]) & (x <= bounds[1])).all())


def _log_ei_error_bound(X, Y, X_test, best_f, maximize, dtype, lengthscale=0.3):
    r"""Rounding-error bound of ``log EI`` of :func:`make_stgp`'s model (no outcome
    transform) computed in ``dtype``, at each of the ``n*`` test points.

    The posterior mean and sigma err by ``eps f_mean`` and ``sqrt_error(v, eps f_var)``
    (:func:`~tests.helpers.tolerances.gp_posterior_error_factors`, as ``ucb_error_bound``);
    ``log EI = log sigma + log h(u)``, ``u = +-(m - best_f) / sigma``,
    ``h = phi(u) + u Phi(u)``, moves by ``(Phi(u) dm + phi(u) dsigma) / (sigma h(u))``; its
    own evaluation rounds ``h`` by a few ``eps`` relative to ``phi + |u| Phi`` (cancellation
    for ``u < 0``) and adds ``log sigma``: ``4 eps ((phi + |u| Phi) / h + |log sigma|)``.
    """
    X, Y, X_test = (t.detach().to(torch.float64) for t in (X, Y, X_test))
    y = Y.squeeze(-1)
    K = rbf(X, X, lengthscale) + NOISE * torch.eye(len(X), dtype=torch.float64)
    K_s = rbf(X_test, X, lengthscale)
    k_ss = torch.full((len(X_test),), OUTPUTSCALE, dtype=torch.float64)
    kappa = kernel_rounding(torch.cat([X, X_test]), lengthscale)
    f_mean, f_var = gp_posterior_error_factors(
        K, K_s, k_ss, y - CONSTANT, kappa, r_mag=y.abs() + CONSTANT
    )
    mean, cov = dense_gp_posterior(X, Y, X_test, lengthscale)
    var = cov.diagonal().clamp_min(0)
    sigma = var.sqrt()
    e = eps(dtype)
    d_mean, d_sigma = e * f_mean, sqrt_error(var, e * f_var) + e * sigma
    u = (mean - float(best_f)) / sigma
    u = u if maximize else -u
    normal = torch.distributions.Normal(torch.tensor(0.0, dtype=torch.float64), 1.0)
    Phi, phi = normal.cdf(u), normal.log_prob(u).exp()
    h = phi + u * Phi
    moments = (Phi * d_mean + phi * d_sigma) / (sigma * h)
    return moments + 4 * e * ((phi + u.abs() * Phi) / h + sigma.log().abs())


def test_supports_pathwise_sampling():
    assert supports_pathwise_sampling(_stgp(torch.float64)[0])
    assert not supports_pathwise_sampling(_pitc(torch.float64))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("maximize", [True, False])
def test_ucb_and_ei_are_botorch_classes(dtype, maximize):
    model, X, Y = _stgp(dtype)
    X_test = torch.rand(5, 1, D, generator=torch.Generator().manual_seed(1), dtype=dtype)
    ucb = make_step_acquisition("ucb", model, beta=2.25, maximize=maximize)
    assert type(ucb) is CachedUpperConfidenceBound and ucb.maximize is maximize
    assert isinstance(ucb, UpperConfidenceBound)
    mean, cov = dense_gp_posterior(X, Y, X_test.squeeze(-2))
    sign = 1.0 if maximize else -1.0
    by_hand = sign * mean + 1.5 * cov.diagonal().sqrt()
    # first-order rounding bound of the posterior in ``dtype`` (toy_models); beta = 2.25
    # is exact in float32, the dtype BoTorch's UCB keeps it in
    bound = ucb_error_bound(X, Y, X_test.squeeze(-2), 2.25, dtype)
    with torch.no_grad():
        assert_within(ucb(X_test), by_hand, bound)
    best_f = Y.max() if maximize else Y.min()
    ei = make_step_acquisition("ei", model, best_f=best_f, maximize=maximize)
    assert type(ei) is CachedLogExpectedImprovement and isinstance(ei, LogExpectedImprovement)
    assert ei._predictor is None  # built at the first evaluation
    ref = LogExpectedImprovement(model, best_f=best_f, maximize=maximize)
    with torch.no_grad():
        # BoTorch's class with the same arguments, its moments by model.posterior: both
        # within the first-order rounding bound of the exact log EI
        bound = _log_ei_error_bound(X, Y, X_test.squeeze(-2), best_f, maximize, dtype)
        assert_within(ei(X_test), ref(X_test), 2 * bound)
    assert ei._predictor is not None  # the cached path was taken


@pytest.mark.parametrize("dtype", DTYPES)
def test_pathwise_ts_seeded(dtype):
    model, *_ = _stgp(dtype)
    X_test = torch.rand(9, 1, D, generator=torch.Generator().manual_seed(1), dtype=dtype)
    state = torch.random.get_rng_state()
    a = make_step_acquisition("ts", model, seed=7)
    b = make_step_acquisition("ts", model, seed=7)
    c = make_step_acquisition("ts", model, seed=8)
    mn = make_step_acquisition("ts", model, seed=7, maximize=False)
    assert torch.equal(torch.random.get_rng_state(), state)
    assert isinstance(a, PathwiseThompsonSampling)
    with torch.no_grad():
        va = a(X_test)
        assert va.shape == (9,) and torch.isfinite(va).all()
        assert torch.equal(va, b(X_test))
        assert not torch.allclose(va, c(X_test))
        assert torch.equal(mn(X_test), -va)  # same path, negated (exact)
        # one path: deterministic across calls (it can be optimised)
        assert torch.equal(va, a(X_test))


def test_factory_errors():
    model, *_ = _stgp(torch.float64)
    with pytest.raises(ValueError, match="`kind`"):
        make_step_acquisition("pi", model)
    with pytest.raises(ValueError, match="`beta`"):
        make_step_acquisition("ucb", model)
    with pytest.raises(ValueError, match="`beta`"):
        make_step_acquisition("ucb", model, beta=-1.0)
    with pytest.raises(ValueError, match="`best_f`"):
        make_step_acquisition("ei", model)
    with pytest.raises(ValueError, match="`best_f`"):
        make_step_acquisition("ei", model, best_f=math.nan)
    with pytest.raises(TypeError, match="`model`"):
        make_step_acquisition("ucb", "gp", beta=1.0)
    with pytest.raises(UnsupportedError, match="thompson_sample_candidate"):
        make_step_acquisition("ts", _pitc(torch.float64), seed=0)
    bounds = _bounds(torch.float64)
    with pytest.raises(BotorchTensorDimensionError, match="`bounds`"):
        thompson_sample_candidate(model, bounds[0], seed=0)
    with pytest.raises(ValueError, match="`bounds`"):
        thompson_sample_candidate(model, bounds.flip(0), seed=0)
    with pytest.raises(ValueError, match="`num_candidates`"):
        thompson_sample_candidate(model, bounds, num_candidates=0, seed=0)
    with pytest.raises(BotorchTensorDimensionError, match="`X_candidates`"):
        thompson_sample_candidate(model, bounds, X_candidates=torch.rand(4, 3), seed=0)
    with pytest.raises(ValueError, match="`seed`"):
        thompson_sample_candidate(model, bounds, seed=-1)
    with pytest.raises(ValueError, match="`kind`"):
        propose_step_candidate("random", model, bounds)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("which", ["stgp", "pitc"])
def test_thompson_sample_candidate(dtype, which):
    model = _stgp(dtype)[0] if which == "stgp" else _pitc(dtype)
    bounds = _bounds(dtype)
    N, seed = 128, 31
    state = torch.random.get_rng_state()
    x, X_cand, f = thompson_sample_candidate(model, bounds, N, seed=seed, return_sample=True)
    assert torch.equal(torch.random.get_rng_state(), state)
    assert x.shape == (1, D) and x.dtype == dtype and _inside(x, bounds)
    assert X_cand.shape == (N, D) and f.shape == (N,)
    # the candidate set: scrambled Sobol points from the seed, scaled to the box
    unit = SobolEngine(D, scramble=True, seed=seed).draw(N, dtype=dtype)
    # ``lower + (upper - lower) u``: a difference, a product and a sum, each rounded once
    # (however the library associates them), relative to the bounds' magnitude
    expected = bounds[0] + (bounds[1] - bounds[0]) * unit
    assert_close(X_cand, expected, dtype=dtype, factor=3, scale=bounds.abs().max())
    # the candidate is the argmax (argmin) of the sampled path on that set
    assert torch.equal(x[0], X_cand[f.argmax()])
    x_min = thompson_sample_candidate(model, bounds, N, seed=seed, maximize=False)
    assert torch.equal(x_min[0], X_cand[f.argmin()])
    # seeded
    assert torch.equal(x, thompson_sample_candidate(model, bounds, N, seed=seed))
    g1, g2 = torch.Generator().manual_seed(4), torch.Generator().manual_seed(4)
    assert torch.equal(
        thompson_sample_candidate(model, bounds, N, seed=g1),
        thompson_sample_candidate(model, bounds, N, seed=g2),
    )
    others = {
        tuple(thompson_sample_candidate(model, bounds, N, seed=s)[0].tolist()) for s in range(6)
    }
    assert len(others) > 1


def test_thompson_sample_is_a_posterior_sample():
    r"""Whitened samples ``L^-1 (f - mu)`` (dense exact GP) are standard normal."""
    model, X, Y = _stgp(torch.float64, lengthscale=0.15)
    bounds = _bounds(torch.float64)
    N, zs = 10, []
    for seed in range(60):
        _, X_cand, f = thompson_sample_candidate(model, bounds, N, seed=seed, return_sample=True)
        mean, cov = dense_gp_posterior(X, Y, X_cand, lengthscale=0.15)
        L = torch.linalg.cholesky(cov)
        zs.append(torch.linalg.solve_triangular(L, (f - mean).unsqueeze(-1), upper=False))
    z = torch.cat(zs).flatten()
    assert kstest(z.numpy(), "norm").pvalue > 1e-3
    assert abs(float(z.mean())) < 4 / math.sqrt(len(z))
    assert abs(float(z.var()) - 1.0) < 0.2


@pytest.mark.parametrize("dtype", DTYPES)
def test_thompson_two_points_frequency(dtype):
    r"""P(pick x_0) = Phi((m_0 - m_1) / sqrt(v_0 + v_1 - 2 c_01)) from a dense GP."""
    model, X, Y = _stgp(dtype)
    X_cand = torch.tensor([[0.35, 0.5], [0.6, 0.45]], dtype=dtype)
    mean, cov = dense_gp_posterior(X, Y, X_cand)
    s = float(cov[0, 0] + cov[1, 1] - 2 * cov[0, 1])
    p0 = normal_cdf(float(mean[0] - mean[1]) / math.sqrt(s))
    assert 0.1 < p0 < 0.9  # an informative test point pair
    n = 300
    picks = [
        thompson_sample_candidate(model, _bounds(dtype), X_candidates=X_cand, seed=seed)
        for seed in range(n)
    ]
    k = sum(bool(torch.equal(x[0], X_cand[0])) for x in picks)
    assert binomtest(k, n, p0).pvalue > 1e-3


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("which", ["stgp", "pitc"])
def test_propose_step_candidate(dtype, which):
    model = _stgp(dtype, standardize=True)[0] if which == "stgp" else _pitc(dtype)
    bounds = _bounds(dtype)
    kw = dict(beta=2.0, best_f=0.5, num_restarts=2, raw_samples=32, num_candidates=64)
    state = torch.random.get_rng_state()
    for kind in STEP_KINDS:
        x = propose_step_candidate(kind, model, bounds, seed=3, **kw)
        assert x.shape == (1, D) and x.dtype == dtype and _inside(x, bounds)
        assert torch.equal(x, propose_step_candidate(kind, model, bounds, seed=3, **kw))
    assert torch.equal(torch.random.get_rng_state(), state)
    # UCB: the proposal is at least as good as the best point of a grid
    ucb = UpperConfidenceBound(model, beta=2.0)
    x = propose_step_candidate("ucb", model, bounds, seed=3, **kw)
    u = torch.linspace(0, 1, 30, dtype=dtype)
    grid = bounds[0] + (bounds[1] - bounds[0]) * torch.cartesian_prod(u, u)
    with torch.no_grad():
        best, grid_max = ucb(x.unsqueeze(0)), ucb(grid.unsqueeze(-2)).max()
    assert best >= grid_max - 1e-3 * (1 + grid_max.abs())
    # discrete TS route for models without pathwise sampling
    if which == "pitc":
        x_ts = propose_step_candidate("ts", model, bounds, seed=3, **kw)
        assert torch.equal(x_ts, thompson_sample_candidate(model, bounds, 64, seed=3))


def _botorch_search(acqf, bounds, seed, num_restarts, raw_samples, maxiter, **kwargs):
    r"""optimize_acqf under the documented seeds (``s + 2``), written out."""
    with torch.random.fork_rng():
        torch.manual_seed(seed + 2)
        return optimize_acqf(
            acqf,
            bounds=bounds,
            q=kwargs.pop("q", 1),
            num_restarts=num_restarts,
            raw_samples=raw_samples,
            options={"seed": seed + 2, "maxiter": maxiter},
            **kwargs,
        )


@pytest.mark.parametrize("dtype", DTYPES)
def test_maximize_step_acquisition_is_the_seeded_optimize_acqf(dtype):
    model, X_train, Y_train = _stgp(dtype, standardize=True)
    bounds = _bounds(dtype)
    acqf = make_step_acquisition("ucb", model, beta=2.0)
    state = torch.random.get_rng_state()
    x = maximize_step_acquisition(acqf, bounds, seed=11, num_restarts=3, raw_samples=32, maxiter=15)
    assert torch.equal(torch.random.get_rng_state(), state)
    ref, _ = _botorch_search(acqf, bounds, 11, 3, 32, 15)
    assert x.shape == (1, D) and x.dtype == dtype and torch.equal(x, ref)
    # the search starts from its best raw sample and only climbs from there
    X_raw = draw_sobol_samples(bounds, n=32, q=1, seed=13)
    with torch.no_grad():
        raw_values = acqf(X_raw)
        best_raw = raw_values.max()
        # the search compares values from batches of 32 and of 3 restarts, this one is a
        # batch of one: each evaluation is within the UCB's rounding bound of the exact
        # value, so two at the same point differ by at most twice it (at x and the start)
        x_start = X_raw[raw_values.argmax()]
        bound = 2 * sum(
            ucb_error_bound(X_train, Y_train, pt, 2.0, dtype, standardize=True).item()
            for pt in (x, x_start)
        )
        assert acqf(x.unsqueeze(0)) >= best_raw - bound
    # propose_step_candidate is make_step_acquisition + this search, one seed
    kw = dict(num_restarts=3, raw_samples=32, maxiter=15)
    for kind in STEP_KINDS:
        a = make_step_acquisition(kind, model, beta=2.0, best_f=0.3, seed=11)
        assert torch.equal(
            propose_step_candidate(kind, model, bounds, beta=2.0, best_f=0.3, seed=11, **kw),
            maximize_step_acquisition(a, bounds, seed=11, **kw),
        )
    with pytest.raises(ValueError, match="`maxiter`"):
        maximize_step_acquisition(acqf, bounds, seed=0, maxiter=0)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("min_distance", [0.0, 0.15])
def test_ranked_step_candidates(dtype, min_distance):
    model, *_ = _stgp(dtype, lengthscale=0.15, standardize=True)
    bounds = _bounds(dtype)
    acqf = make_step_acquisition("ucb", model, beta=4.0)
    R, N, seed = 6, 24, 5
    state = torch.random.get_rng_state()
    ranked = ranked_step_candidates(
        acqf,
        bounds,
        seed=seed,
        num_restarts=R,
        raw_samples=N,
        maxiter=15,
        min_distance=min_distance,
    )
    assert torch.equal(torch.random.get_rng_state(), state)
    assert ranked.dtype == dtype and ranked.shape[-1] == D and 1 <= len(ranked) <= R + N
    # the first point is the search's candidate
    best = maximize_step_acquisition(
        acqf, bounds, seed=seed, num_restarts=R, raw_samples=N, maxiter=15
    )
    assert torch.equal(ranked[0], best[0])
    # the pool, computed independently: every restart's optimum, then the raw samples
    X_opt, v_opt = _botorch_search(acqf, bounds, seed, R, N, 15, return_best_only=False)
    X_raw = draw_sobol_samples(bounds, n=N, q=1, seed=seed + 2)
    with torch.no_grad():
        v_raw = acqf(X_raw)
    groups = [(X_opt.reshape(-1, D), v_opt.reshape(-1)), (X_raw.reshape(-1, D), v_raw)]
    pool = torch.cat([g[0] for g in groups])
    group_of = [0] * R + [1] * N
    values = torch.cat([g[1] for g in groups])
    # each ranked point is a pool point; optimised ones come first, each group by value
    idx = [int(((pool - x).abs().sum(-1) == 0).nonzero()[0]) for x in ranked]
    assert [group_of[i] for i in idx] == sorted(group_of[i] for i in idx)
    for g in (0, 1):
        v = values[[i for i in idx if group_of[i] == g]]
        assert (v[:-1] >= v[1:]).all()
    # ranked points are more than min_distance apart ...
    dist = torch.cdist(ranked.double(), ranked.double()) + 10 * torch.eye(len(ranked))
    assert (dist > min_distance).all()
    # ... and every pool point left out is within min_distance of a better-ranked one
    for i in set(range(R + N)) - set(idx):
        later_or_equal = [
            x
            for x, j in zip(ranked, idx, strict=True)
            if group_of[j] < group_of[i] or (group_of[j] == group_of[i] and values[j] >= values[i])
        ]
        assert later_or_equal
        assert ((torch.stack(later_or_equal) - pool[i]).norm(dim=-1) <= min_distance).any()
    if min_distance == 0.0:  # nothing is dropped but exact duplicates
        assert len(ranked) == len(torch.unique(pool, dim=0))
    else:
        assert len(ranked) < R + N  # the threshold did merge points here
    with pytest.raises(ValueError, match="`min_distance`"):
        ranked_step_candidates(acqf, bounds, seed=0, min_distance=-1.0)


@pytest.mark.parametrize("dtype", DTYPES)
def test_pathwise_thompson_sampling_batch(dtype):
    model, *_ = _stgp(dtype)
    X = torch.rand(5, 3, D, generator=torch.Generator().manual_seed(2), dtype=dtype)
    state = torch.random.get_rng_state()
    ts = pathwise_thompson_sampling(model, seed=9, batch_size=3)
    again = pathwise_thompson_sampling(model, seed=9, batch_size=3)
    # (drawn outside no_grad: a draw under no_grad can differ in the last bits)
    one = pathwise_thompson_sampling(model, seed=9)
    one_ref = make_step_acquisition("ts", model, seed=9)
    assert torch.equal(torch.random.get_rng_state(), state)
    assert isinstance(ts, PathwiseThompsonSampling) and ts.batch_size == 3

    def path_values(Z):  # n x d -> n x 3: every path at every point
        return ts.samples(Z[:, None, None, :].expand(-1, 3, 1, -1)).reshape(len(Z), 3)

    # a Matheron path is a bias plus two linear paths (BoTorch's MatheronPath): the prior's
    # random features and the update's kernel evaluations at the training points
    linear_paths = list(ts.samples._path.paths.values())

    def term_magnitudes(Z):  # n x d -> n x 3: the sum of |feature * weight| of each path
        feats = [p.feature_map(Z) for p in linear_paths]
        feats = [f.to_dense() if hasattr(f, "to_dense") else f for f in feats]
        total = sum(f.abs() @ p.weight.abs().mT for f, p in zip(feats, linear_paths, strict=True))
        return total + linear_paths[0].bias_module.constant.abs()

    with torch.no_grad():
        # path j is evaluated at point j of each q-batch, and the q values are summed
        by_path = sum(path_values(X[:, j])[:, j] for j in range(3))
        # the same sums of feature products in another batching: n = 1024 random features
        # + 8 training points + 3 paths, relative to the sum of the terms' magnitudes
        # (they cancel: ~100 here for values ~5); the features' own arguments are
        # d = 2-term products, rounded alike up to far less than that
        n = sum(p.weight.shape[-1] for p in linear_paths) + 3
        magnitude = sum(term_magnitudes(X[:, j])[:, j] for j in range(3)).max()
        assert_close(ts(X), by_path, dtype=dtype, factor=reordering_factor(n), scale=magnitude)
        # the paths are different draws; the same seed draws the same paths
        at_x0 = path_values(X[:, 0])
        assert not torch.allclose(at_x0[:, 0], at_x0[:, 1])
        assert torch.equal(ts(X), again(X))
    # q = 1: make_step_acquisition's Thompson path
    with torch.no_grad():
        assert torch.equal(one(X[:, :1]), one_ref(X[:, :1]))
    with pytest.raises(UnsupportedError, match="thompson_sample_candidate"):
        pathwise_thompson_sampling(_pitc(dtype), seed=0)
    with pytest.raises(ValueError, match="`batch_size`"):
        pathwise_thompson_sampling(model, seed=0, batch_size=0)
