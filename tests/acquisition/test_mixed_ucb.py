r"""MixedLocalGlobalUCB against BoTorch's UCB and hand-computed mean + sqrt(beta) sigma."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch
from botorch.acquisition import AcquisitionFunction, UpperConfidenceBound
from botorch.exceptions.errors import UnsupportedError
from botorch.exceptions.warnings import InputDataWarning
from botorch.models import SingleTaskGP
from botorch.models.model import ModelList
from botorch.optim import optimize_acqf
from scipy.stats import binomtest

from botorch_fed.acquisition import MixedLocalGlobalUCB, MixingSchedule, model_input_dim
from tests.helpers.tolerances import assert_close, assert_within, eps
from tests.helpers.toy_models import (
    dense_gp_posterior,
    make_pitc,
    make_stgp,
    pitc_ucb_error_bound,
    toy_data,
    ucb_error_bound,
)

DTYPES = [torch.float32, torch.float64]
D = 2
# ``p a + (1 - p) b`` evaluated from the same ``a`` and ``b``: two products and a sum,
# each rounded once.
COMBINATION_FACTOR = 4


@pytest.fixture(autouse=True)
def _quiet_float32():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", InputDataWarning)
        yield


def _models(dtype, global_kind="stgp"):
    r"""A local GP on 6 points and a global model (exact GP on 14, or dPITC)."""
    X1, Y1 = toy_data(0, 6, D, dtype)
    X2, Y2 = toy_data(1, 8, D, dtype)
    local = make_stgp(X1, Y1)
    if global_kind == "stgp":
        glob = make_stgp(torch.cat([X1, X2]), torch.cat([Y1, Y2]), lengthscale=0.4)
    else:
        support = toy_data(2, 5, D, dtype)[0]
        glob = make_pitc([(X1, Y1), (X2, Y2)], support)
    return local, glob, (X1, Y1), (torch.cat([X1, X2]), torch.cat([Y1, Y2]))


def _X(dtype, shape=(7,), seed=5):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(*shape, 1, D, generator=g, dtype=torch.float64).to(dtype)


def _by_hand(mean, var, beta, maximize):
    sigma = var.clamp_min(1e-12).sqrt()
    return (mean if maximize else -mean) + math.sqrt(beta) * sigma


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("maximize", [True, False])
@pytest.mark.parametrize("global_kind", ["stgp", "pitc"])
def test_expected_mode_matches_ucb_and_closed_form(dtype, maximize, global_kind):
    local, glob, (X1, Y1), (Xg, Yg) = _models(dtype, global_kind)
    beta, p = 1.7, 0.3
    acqf = MixedLocalGlobalUCB(
        local, glob, beta=beta, p_local=p, mode="expected", maximize=maximize
    )
    assert isinstance(acqf, AcquisitionFunction) and acqf.uses_local is None
    assert isinstance(acqf.model, ModelList) and acqf.weights == (p, 1 - p)
    X = _X(dtype, (3, 4))
    # BoTorch's UCB would keep a float ``beta`` in torch's default dtype (float32:
    # 1.7 rounded); MixedLocalGlobalUCB keeps it in float64. Same beta, same computation.
    beta_t = torch.tensor(beta, dtype=torch.float64)
    with torch.no_grad():
        value = acqf(X)
        ucb_l = UpperConfidenceBound(local, beta=beta_t, maximize=maximize)(X)
        ucb_g = UpperConfidenceBound(glob, beta=beta_t, maximize=maximize)(X)
        post_g = glob.posterior(X)
    assert value.shape == (3, 4) and value.dtype == dtype
    # the same posterior calls in the same shapes: only the weighted sum is rounded
    assert_close(value, p * ucb_l + (1 - p) * ucb_g, dtype=dtype, factor=COMBINATION_FACTOR)
    # closed form: local from a dense exact GP, global from its posterior moments
    Xf = X.reshape(-1, D)
    mean_l, cov_l = dense_gp_posterior(X1, Y1, Xf)
    by_hand_l = _by_hand(mean_l, cov_l.diagonal(), beta, maximize).reshape(3, 4)
    # first-order rounding bounds of the float32/float64 posteriors (toy_models)
    bound_l = ucb_error_bound(X1, Y1, Xf, beta, dtype).reshape(3, 4)
    if global_kind == "stgp":
        mean_g, cov_g = dense_gp_posterior(Xg, Yg, Xf, lengthscale=0.4)
        by_hand_g = _by_hand(mean_g, cov_g.diagonal(), beta, maximize).reshape(3, 4)
        bound_g = ucb_error_bound(Xg, Yg, Xf, beta, dtype, lengthscale=0.4).reshape(3, 4)
    else:
        mean_g = post_g.mean.squeeze(-1).squeeze(-1).to(torch.float64)
        var_g = post_g.variance.squeeze(-1).squeeze(-1).to(torch.float64)
        by_hand_g = _by_hand(mean_g, var_g, beta, maximize)
        # the model's own moments: only ``mean + sqrt(beta) sqrt(var)`` is rounded
        bound_g = COMBINATION_FACTOR * torch.finfo(dtype).eps * by_hand_g.abs()
    expected = p * by_hand_l + (1 - p) * by_hand_g
    combination = COMBINATION_FACTOR * torch.finfo(dtype).eps * expected.abs()
    assert_within(value, expected, p * bound_l + (1 - p) * bound_g + combination)


@pytest.mark.parametrize("dtype", DTYPES)
def test_unbatched_input_and_tensor_beta(dtype):
    local, glob, *_ = _models(dtype)
    X = _X(dtype, (5,))
    acqf = MixedLocalGlobalUCB(local, glob, beta=torch.tensor(0.5), p_local=0.6, mode="expected")
    with torch.no_grad():
        # ``1 x d`` gets a t-batch of one, as in BoTorch
        assert acqf(X[0]).shape == UpperConfidenceBound(local, 0.5)(X[0]).shape == (1,)
        ref = 0.6 * UpperConfidenceBound(local, 0.5)(X) + 0.4 * UpperConfidenceBound(glob, 0.5)(X)
        # same posterior calls, same shapes: only the weighted sum is rounded
        assert_close(acqf(X), ref, dtype=dtype, factor=COMBINATION_FACTOR)
    assert acqf.beta.item() == 0.5


@pytest.mark.parametrize("dtype", DTYPES)
def test_sample_mode_is_one_of_them_with_the_right_frequency(dtype):
    local, glob, *_ = _models(dtype, "pitc")
    X = _X(dtype)
    with torch.no_grad():
        ucb_l = UpperConfidenceBound(local, beta=2.0)(X)
        ucb_g = UpperConfidenceBound(glob, beta=2.0)(X)
    p, n = 0.3, 500
    draws = []
    for seed in range(n):
        acqf = MixedLocalGlobalUCB(local, glob, beta=2.0, p_local=p, mode="sample", seed=seed)
        # Alg. 2 lines 14-15: r ~ U(0, 1) from the seed; local iff r < p
        r = torch.rand(1, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
        assert acqf.uses_local == bool(r < p)
        draws.append(acqf.uses_local)
        if seed < 6:
            with torch.no_grad():
                value = acqf(X)
            assert torch.equal(value, ucb_l if acqf.uses_local else ucb_g)
            assert acqf.weights == ((1.0, 0.0) if acqf.uses_local else (0.0, 1.0))
    assert 0 < sum(draws) < n
    assert binomtest(sum(draws), n, p).pvalue > 1e-3


def test_sample_mode_seeding():
    local, glob, *_ = _models(torch.float64)
    make = lambda seed: MixedLocalGlobalUCB(  # noqa: E731
        local, glob, beta=1.0, p_local=0.5, seed=seed
    )
    assert make(1).mode == "sample"
    assert [make(s).uses_local for s in range(20)] == [make(s).uses_local for s in range(20)]
    state = torch.random.get_rng_state()
    g1, g2 = torch.Generator().manual_seed(9), torch.Generator().manual_seed(9)
    assert [make(g1).uses_local for _ in range(20)] == [make(g2).uses_local for _ in range(20)]
    n1, n2 = np.random.default_rng(9), np.random.default_rng(9)
    assert [make(n1).uses_local for _ in range(20)] == [make(n2).uses_local for _ in range(20)]
    make(None)
    assert torch.equal(torch.random.get_rng_state(), state)


@pytest.mark.parametrize("mode", ["expected", "sample"])
def test_p_one_is_local_p_zero_is_global(mode):
    local, glob, *_ = _models(torch.float64, "pitc")
    X = _X(torch.float64)
    with torch.no_grad():
        ucb_l = UpperConfidenceBound(local, beta=2.0)(X)
        ucb_g = UpperConfidenceBound(glob, beta=2.0)(X)
        for seed in range(10):
            one = MixedLocalGlobalUCB(local, glob, 2.0, p_local=1.0, mode=mode, seed=seed)
            zero = MixedLocalGlobalUCB(local, glob, 2.0, p_local=0.0, mode=mode, seed=seed)
            assert torch.equal(one(X), ucb_l) and torch.equal(zero(X), ucb_g)
            if mode == "sample":
                assert one.uses_local is True and zero.uses_local is False


def test_schedule_gives_p():
    local, glob, *_ = _models(torch.float64)
    schedule = MixingSchedule(c=[0.5, 0.75])
    acqf = MixedLocalGlobalUCB(local, glob, 2.0, schedule=schedule, t=7, client=1, mode="expected")
    assert acqf.p_local == pytest.approx(1 - 7**-0.75)
    # the power family's first round is global
    for seed in range(10):
        first = MixedLocalGlobalUCB(local, glob, 2.0, schedule=schedule, t=1, client=0, seed=seed)
        assert first.uses_local is False
    with pytest.raises(ValueError, match="`client`"):
        MixedLocalGlobalUCB(local, glob, 2.0, schedule=schedule, t=3)
    with pytest.raises(ValueError, match="`t`"):
        MixedLocalGlobalUCB(local, glob, 2.0, schedule=schedule, t=0, client=0)


def _grid(n=40):
    u = torch.linspace(0, 1, n, dtype=torch.float64)
    return torch.cartesian_prod(u, u).unsqueeze(-2)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("global_kind", ["stgp", "pitc"])
@pytest.mark.parametrize("mode", ["expected", "sample"])
@pytest.mark.filterwarnings("ignore:Optimization failed:RuntimeWarning")
def test_optimize_acqf(dtype, global_kind, mode):
    X1, Y1 = toy_data(0, 6, D, dtype)
    local = make_stgp(X1, Y1, standardize=True)  # BoTorch's default outcome transform
    _, glob, *_ = _models(dtype, global_kind)
    acqf = MixedLocalGlobalUCB(local, glob, beta=2.0, p_local=0.5, mode=mode, seed=4)
    bounds = torch.tensor([[0.0, 0.0], [1.0, 1.0]], dtype=dtype)
    x, value = optimize_acqf(acqf, bounds, q=1, num_restarts=4, raw_samples=64, options={"seed": 0})
    assert x.shape == (1, D) and x.dtype == dtype
    assert ((x >= bounds[0]) & (x <= bounds[1])).all()
    with torch.no_grad():
        # ``value`` came from optimize_acqf's batch of restarts, this from a batch of one:
        # both are within the rounding bound of the exact value at ``x``
        if global_kind == "stgp":
            Xg, Yg = _models(dtype, global_kind)[3]
            bound_g = ucb_error_bound(Xg, Yg, x, 2.0, dtype, lengthscale=0.4)
        else:
            clients = [toy_data(0, 6, D, dtype), toy_data(1, 8, D, dtype)]
            bound_g = pitc_ucb_error_bound(clients, toy_data(2, 5, D, dtype)[0], x, 2.0, dtype)
        bound_l = ucb_error_bound(X1, Y1, x, 2.0, dtype, standardize=True)
        w_l, w_g = acqf.weights
        bound = 2 * (w_l * bound_l + w_g * bound_g)
        assert_within(acqf(x.unsqueeze(0)), value.reshape(1), bound + 4 * eps(dtype) * value.abs())
        grid_max = acqf(_grid().to(dtype)).max()
    assert value >= grid_max - 1e-3 * (1 + grid_max.abs())


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("global_kind", ["stgp", "pitc"])
def test_gradients_finite(dtype, global_kind):
    local, glob, *_ = _models(dtype, global_kind)
    acqf = MixedLocalGlobalUCB(local, glob, beta=2.0, p_local=0.4, mode="expected")
    X = _X(dtype, (6,)).requires_grad_(True)
    acqf(X).sum().backward()
    assert X.grad is not None and torch.isfinite(X.grad).all() and X.grad.abs().sum() > 0


def test_bad_inputs():
    local, glob, *_ = _models(torch.float64)
    ok = dict(beta=2.0, p_local=0.5)
    for beta in (-0.1, math.nan, math.inf, torch.tensor([1.0, -1.0]), "2", True):
        with pytest.raises(ValueError, match="`beta`"):
            MixedLocalGlobalUCB(local, glob, beta=beta, p_local=0.5)
    for p in (-0.01, 1.01, math.nan, True, "0.5"):
        with pytest.raises(ValueError, match="`p_local`"):
            MixedLocalGlobalUCB(local, glob, beta=2.0, p_local=p)
    with pytest.raises(ValueError, match="`mode`"):
        MixedLocalGlobalUCB(local, glob, mode="mean", **ok)
    with pytest.raises(ValueError, match="exactly one"):
        MixedLocalGlobalUCB(local, glob, beta=2.0)
    with pytest.raises(ValueError, match="exactly one"):
        MixedLocalGlobalUCB(local, glob, beta=2.0, p_local=0.5, schedule=MixingSchedule(), t=2)
    with pytest.raises(ValueError, match="`t`"):
        MixedLocalGlobalUCB(local, glob, beta=2.0, schedule=MixingSchedule())
    with pytest.raises(ValueError, match="only used with `schedule`"):
        MixedLocalGlobalUCB(local, glob, t=3, **ok)
    with pytest.raises(TypeError, match="`schedule`"):
        MixedLocalGlobalUCB(local, glob, beta=2.0, schedule=0.5, t=2)
    with pytest.raises(TypeError, match="`local_model`"):
        MixedLocalGlobalUCB("gp", glob, **ok)
    with pytest.raises(TypeError, match="`global_model`"):
        MixedLocalGlobalUCB(local, None, **ok)
    X, Y = toy_data(3, 5, D, torch.float64)
    two_outputs = SingleTaskGP(X, torch.cat([Y, -Y], dim=-1))
    with pytest.raises(ValueError, match="`local_model`"):
        MixedLocalGlobalUCB(two_outputs, glob, **ok)
    with pytest.raises(ValueError, match="`global_model`"):
        MixedLocalGlobalUCB(local, two_outputs, **ok)
    X3, Y3 = toy_data(3, 5, 3, torch.float64)
    with pytest.raises(ValueError, match="input dimension"):
        MixedLocalGlobalUCB(local, make_stgp(X3, Y3), **ok)
    with pytest.raises(ValueError, match="`seed`"):
        MixedLocalGlobalUCB(local, glob, seed=-3, **ok)
    acqf = MixedLocalGlobalUCB(local, glob, mode="expected", **ok)
    with pytest.raises(UnsupportedError, match="X_pending"):
        acqf.set_X_pending(torch.rand(2, D, dtype=torch.float64))
    with pytest.raises(AssertionError):  # q = 2, as BoTorch's analytic UCB
        acqf(torch.rand(3, 2, D, dtype=torch.float64))


def test_model_input_dim():
    local, glob, *_ = _models(torch.float64, "pitc")
    assert model_input_dim(local) == D and model_input_dim(glob) == D
    assert model_input_dim(ModelList(local)) is None
