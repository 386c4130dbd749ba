r"""Marginal predictors and the cached-factor UCB / log-EI (issue 13's speed pass).

Checked against an independent dense computation (the exact GP written out), against
BoTorch's own classes on the same model (values and gradients), and for staleness:
every change of the model after the predictor was built must reach the next value.
"""

from __future__ import annotations

import pytest
import torch
from botorch import settings as botorch_settings
from botorch.acquisition import LogExpectedImprovement, UpperConfidenceBound
from botorch.acquisition.objective import ScalarizedPosteriorTransform
from botorch.models import ModelListGP, SingleTaskGP
from botorch.models.transforms import Normalize, Standardize
from botorch.optim import optimize_acqf
from gpytorch import settings as gpytorch_settings

from botorch_fed.acquisition import CachedLogExpectedImprovement, CachedUpperConfidenceBound
from botorch_fed.models import (
    ExactGPMarginals,
    FederatedPICGP,
    FederatedPITCGP,
    FederatedPITCMarginals,
    marginal_predictor,
)
from tests.helpers.tolerances import assert_close, assert_within
from tests.helpers.toy_models import (
    dense_gp_posterior,
    make_kernel,
    make_likelihood,
    make_pitc,
    make_stgp,
    toy_data,
    ucb_error_bound,
)

DTYPES = [torch.float32, torch.float64]
D = 3
BETA = 2.25  # exact in float32, the dtype BoTorch keeps beta in


def _X_test(dtype: torch.dtype, n: int = 6, requires_grad: bool = False) -> torch.Tensor:
    X = torch.rand(n, 1, D, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    return X.to(dtype).requires_grad_(requires_grad)


def _value_and_grad(acqf, X: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    X = X.detach().clone().requires_grad_(True)
    value = acqf(X)
    (grad,) = torch.autograd.grad(value.sum(), X)
    return value.detach(), grad


def _pitc_models(dtype: torch.dtype, standardize: bool = False) -> dict:
    clients = [toy_data(seed, 12, D, dtype) for seed in range(3)]
    support = toy_data(9, 8, D, dtype)[0]
    with torch.no_grad():
        if standardize:  # raw outcomes, the transform trained on them
            clients = [(X, 3 * Y + 1) for X, Y in clients]
            pitc = FederatedPITCGP.from_client_data(
                clients, support, make_kernel(D, dtype), make_likelihood(dtype),
                outcome_transform=Standardize(m=1),
            )  # fmt: skip
            X_own, Y_own = clients[0]
            pic = FederatedPICGP.from_pitc(pitc, X_own, pitc.outcome_transform(Y_own)[0])
        else:
            pitc = make_pitc(clients, support)
            pic = FederatedPICGP.from_pitc(pitc, *clients[0])
    return {"pitc": pitc, "pic": pic}


# --- against an independent computation -------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
def test_exact_gp_marginals_match_the_dense_posterior(dtype):
    X, Y = toy_data(0, 15, D, dtype)
    model = make_stgp(X, Y)
    X_test = _X_test(dtype)
    predictor = marginal_predictor(model)
    assert isinstance(predictor, ExactGPMarginals)
    with torch.no_grad():
        mean, variance = predictor(X_test)
    assert mean.shape == variance.shape == (6, 1) and mean.dtype == dtype
    ref_mean, ref_cov = dense_gp_posterior(X, Y, X_test.squeeze(-2))
    # the UCB's first-order rounding bound of the posterior in ``dtype`` (toy_models)
    bound = ucb_error_bound(X, Y, X_test.squeeze(-2), BETA, dtype)
    assert_within(mean.squeeze(-1), ref_mean, bound)
    ucb = mean.squeeze(-1) + BETA**0.5 * variance.squeeze(-1).sqrt()
    assert_within(ucb, ref_mean + BETA**0.5 * ref_cov.diagonal().sqrt(), bound)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("transforms", ["none", "standardize", "normalize+standardize"])
def test_exact_gp_cached_acquisitions_equal_botorchs(dtype, transforms):
    X, Y = toy_data(1, 20, D, dtype)
    kwargs = {"outcome_transform": None}
    if "standardize" in transforms:
        kwargs["outcome_transform"] = Standardize(m=1)
    if "normalize" in transforms:
        kwargs["input_transform"] = Normalize(d=D)
    model = SingleTaskGP(X, 3 * Y + 1, **kwargs).eval()
    X_test = _X_test(dtype)
    for cached, plain, kw in [
        # beta = 2.1 is not a float32 number: BoTorch moves it to X's dtype first
        (CachedUpperConfidenceBound, UpperConfidenceBound, {"beta": 2.1}),
        (CachedLogExpectedImprovement, LogExpectedImprovement, {"best_f": 3 * Y.max() + 1}),
    ]:
        for maximize in (True, False):
            a = cached(model, maximize=maximize, **kw)
            b = plain(model, maximize=maximize, **kw)
            va, ga = _value_and_grad(a, X_test)
            vb, gb = _value_and_grad(b, X_test)
            assert isinstance(a._predictor, ExactGPMarginals)  # the cached path ran
            # the same quantities formed in a different order: rounding of the
            # posterior, amplified by its condition number (~1e3 here)
            assert_close(va, vb, dtype=dtype, factor=1e3)
            assert_close(ga, gb, dtype=dtype, factor=1e4, scale=gb.abs().max().clamp_min(1))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", ["pitc", "pic"])
def test_federated_marginals_equal_the_posterior(dtype, kind):
    model = _pitc_models(dtype, standardize=True)[kind]
    assert isinstance(model.outcome_transform, Standardize)
    X_test = _X_test(dtype)
    predictor = marginal_predictor(model)
    assert isinstance(predictor, FederatedPITCMarginals)
    with torch.no_grad():
        mean, variance = predictor(X_test)
        posterior = model.posterior(X_test)
    assert mean.dtype == variance.dtype == dtype
    # the model's own formulas on the same factors; the diagonal path forms the
    # variance as k(x, x) - |W|^2 + |C|^2 instead of the q x q matrix products
    assert_close(mean, posterior.mean.squeeze(-1), dtype=dtype, factor=10)
    assert_close(variance, posterior.variance.squeeze(-1), dtype=dtype, factor=1e3)
    a, b = CachedUpperConfidenceBound(model, beta=BETA), UpperConfidenceBound(model, beta=BETA)
    va, ga = _value_and_grad(a, X_test)
    vb, gb = _value_and_grad(b, X_test)
    assert isinstance(a._predictor, FederatedPITCMarginals)
    assert_close(va, vb, dtype=dtype, factor=1e3)
    assert_close(ga, gb, dtype=dtype, factor=1e4, scale=gb.abs().max().clamp_min(1))


def test_optimize_acqf_finds_the_same_point():
    X, Y = toy_data(3, 25, D, torch.float64)
    model = make_stgp(X, Y, standardize=True)
    bounds = torch.stack([torch.zeros(D), torch.ones(D)]).double()
    found = []
    for cls in (CachedUpperConfidenceBound, UpperConfidenceBound):
        torch.manual_seed(0)
        x, _ = optimize_acqf(cls(model, beta=BETA), bounds, q=1, num_restarts=4, raw_samples=64)
        found.append(x)
    assert_close(found[0], found[1], dtype=torch.float64, factor=1e6)


# --- staleness: every change of the model reaches the next value ------------------------
def _changes():
    def lengthscale(model):
        model.covar_module.base_kernel.lengthscale = 0.5

    def in_place(model):
        with torch.no_grad():
            model.likelihood.noise_covar.raw_noise.add_(1.0)

    def train_data(model):
        X, Y = toy_data(7, 9, D, torch.float64)
        model.set_train_data(X, Y.squeeze(-1), strict=False)

    def load(model):
        other = make_stgp(*toy_data(0, 15, D, torch.float64), lengthscale=0.2)
        model.load_state_dict(other.state_dict())

    def mean(model):
        with torch.no_grad():
            model.mean_module.constant.fill_(-2.0)

    return {"lengthscale": lengthscale, "in_place": in_place, "train_data": train_data,
            "load_state_dict": load, "mean": mean}  # fmt: skip


@pytest.mark.parametrize("change", list(_changes()))
def test_a_changed_exact_gp_rebuilds_the_predictor(change):
    X, Y = toy_data(0, 15, D, torch.float64)
    model = make_stgp(X, Y)
    cached = CachedUpperConfidenceBound(model, beta=BETA)
    X_test = _X_test(torch.float64)
    with torch.no_grad():
        before = cached(X_test)
        _changes()[change](model)
        after = cached(X_test)
        model.train()  # gpytorch's own prediction caches are cleared in train mode
        model.eval()
        fresh = UpperConfidenceBound(model, beta=BETA)(X_test)
    assert (after - before).abs().max() > 1e-3  # the change matters
    assert_close(after, fresh, dtype=torch.float64, factor=1e3)


@pytest.mark.parametrize("kind", ["pitc", "pic"])
def test_a_changed_federated_model_is_refused_or_rebuilt(kind):
    model = _pitc_models(torch.float64)[kind]
    cached = CachedUpperConfidenceBound(model, beta=BETA)
    X_test = _X_test(torch.float64)
    with torch.no_grad():
        cached(X_test)
        model.covar_module.base_kernel.lengthscale = 0.5  # the summary is now stale
    # as model.posterior does: the predictor is rebuilt and its check refuses
    with pytest.raises(Exception, match="hyperparameters"), torch.no_grad():
        cached(X_test)
    with pytest.raises(Exception, match="hyperparameters"), torch.no_grad():
        model.posterior(X_test)


# --- where the cached path does not apply ------------------------------------------------
def test_fallbacks_take_botorchs_path():
    X, Y = toy_data(0, 15, D, torch.float64)
    model = make_stgp(X, Y)
    X_test = _X_test(torch.float64)
    # unsupported models and settings: no predictor
    assert marginal_predictor(ModelListGP(model)) is None
    noisy = SingleTaskGP(X, Y, train_Yvar=torch.full_like(Y, 1e-3))
    assert marginal_predictor(noisy) is None  # a fixed-noise likelihood
    with botorch_settings.propagate_grads(True):
        assert marginal_predictor(model) is None
    with gpytorch_settings.detach_test_caches(False):
        assert marginal_predictor(model) is None
    # a posterior transform: BoTorch's path, the same values
    transform = ScalarizedPosteriorTransform(weights=torch.tensor([-2.0], dtype=torch.float64))
    a = CachedUpperConfidenceBound(model, beta=BETA, posterior_transform=transform)
    b = UpperConfidenceBound(model, beta=BETA, posterior_transform=transform)
    with torch.no_grad():
        assert torch.equal(a(X_test), b(X_test))
    assert a._predictor is None
    # inputs of another dtype than the model's go to BoTorch's path (which first moves
    # the model to them), as q > 1 inputs would
    c = CachedUpperConfidenceBound(model, beta=BETA)
    with torch.no_grad():
        c(X_test)
    assert c._predictor.accepts(X_test)
    assert not c._predictor.accepts(X_test.float())
    assert not c._predictor.accepts(X_test.expand(-1, 2, -1))


def test_a_federated_kernel_setting_change_reaches_the_acquisition():
    # a setting that is no tensor (Matern nu) after the predictor was built: refused
    # as model.posterior refuses it, not answered from the old factors
    from gpytorch.kernels import MaternKernel, ScaleKernel

    clients = [toy_data(seed, 12, D, torch.float64) for seed in range(3)]
    support = toy_data(9, 8, D, torch.float64)[0]
    kernel = ScaleKernel(MaternKernel(nu=2.5, ard_num_dims=D)).double()
    with torch.no_grad():
        model = FederatedPITCGP.from_client_data(
            clients, support, kernel, make_likelihood(torch.float64)
        )
        cached = CachedUpperConfidenceBound(model, beta=BETA)
        cached(_X_test(torch.float64))
        kernel.base_kernel.nu = 0.5
        with pytest.raises(Exception, match="structure"):
            cached(_X_test(torch.float64))
