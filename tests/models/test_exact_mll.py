r"""exact_mll_closure against BoTorch's own loss closure (gpytorch's ExactMarginalLogLikelihood)."""

from __future__ import annotations

import warnings

import botorch.fit
import pytest
import torch
from botorch.models import SingleTaskGP
from botorch.models.transforms.input import Normalize
from botorch.optim.closures import get_loss_closure_with_grads
from botorch.optim.utils import get_parameters_and_bounds
from gpytorch import settings as gpytorch_settings
from gpytorch.kernels import MaternKernel, ScaleKernel
from gpytorch.likelihoods import GaussianLikelihood
from gpytorch.mlls import ExactMarginalLogLikelihood
from gpytorch.priors import GammaPrior

from botorch_fed.models import fit_exact_gp
from botorch_fed.models.exact_mll import exact_mll_closure

DTYPES = [torch.float32, torch.float64]


def _data(dtype, n=20, d=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    X = torch.rand(n, d, generator=g, dtype=torch.float64)
    Y = torch.sin(6 * X).sum(-1, keepdim=True) + 0.1 * torch.randn(
        n, 1, generator=g, dtype=torch.float64
    )
    return X.to(dtype), Y.to(dtype)


def _models(dtype):
    X, Y = _data(dtype)
    d = X.shape[-1]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield "default", SingleTaskGP(X, Y)
        yield "normalize", SingleTaskGP(4 * X - 1, Y, input_transform=Normalize(d=d))
        yield (
            "matern-scale",
            SingleTaskGP(
                X,
                Y,
                covar_module=ScaleKernel(
                    MaternKernel(nu=1.5, ard_num_dims=d, lengthscale_prior=GammaPrior(3.0, 6.0)),
                    outputscale_prior=GammaPrior(2.0, 0.15),
                ),
            ),
        )
        yield (
            "no-priors",
            SingleTaskGP(X, Y, likelihood=GaussianLikelihood(), outcome_transform=None),
        )


def _set_values(model, dtype):
    r"""Hyperparameters away from their initial values (a well-conditioned K)."""
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "raw_noise" in name:
                model.likelihood.noise = torch.tensor(0.05, dtype=dtype)
            elif "raw_lengthscale" in name:
                p.copy_(0.3 + 0.5 * torch.rand(p.shape, generator=g, dtype=torch.float64))
            else:
                p.copy_(0.2 * torch.rand(p.shape, generator=g, dtype=torch.float64))


def _both(mll):
    r"""(value, grads) of exact_mll_closure and of BoTorch's closure on ``mll``."""
    mll.train()
    fast = exact_mll_closure(mll)
    parameters = {n: p for n, p in get_parameters_and_bounds(mll)[0].items() if p.requires_grad}
    reference = get_loss_closure_with_grads(mll, parameters=parameters)
    assert list(fast.parameters) == list(parameters)
    v1, g1 = fast()
    v1, g1 = v1.detach().clone(), [g.clone() for g in g1]
    v2, g2 = reference()
    return (v1, g1), (v2.detach(), list(g2))


class _CountGpytorch:
    r"""Counts gpytorch ExactMarginalLogLikelihood.forward calls (BoTorch's path)."""

    def __init__(self, monkeypatch):
        self.calls = 0
        original = ExactMarginalLogLikelihood.forward

        def forward(mll, *args, **kwargs):
            self.calls += 1
            return original(mll, *args, **kwargs)

        monkeypatch.setattr(ExactMarginalLogLikelihood, "forward", forward)


def _assert_close(a, b, dtype):
    (v1, g1), (v2, g2) = a, b
    # rounding of an n = 20 Cholesky and its adjoint, relative to the terms' size
    rtol = {torch.float32: 2e-4, torch.float64: 1e-10}[dtype]
    torch.testing.assert_close(v1, v2, rtol=rtol, atol=rtol)
    assert len(g1) == len(g2)
    for a_, b_ in zip(g1, g2, strict=True):
        scale = max(1.0, b_.abs().max().item())
        torch.testing.assert_close(a_, b_, rtol=rtol, atol=rtol * scale)


@pytest.mark.parametrize("dtype", DTYPES)
def test_same_loss_and_gradients_as_botorch(dtype, monkeypatch):
    for name, model in _models(dtype):
        _set_values(model, dtype)
        mll = ExactMarginalLogLikelihood(model.likelihood, model)
        counter = _CountGpytorch(monkeypatch)
        fast, reference = _both(mll)
        assert counter.calls == 1, name  # the reference only: the fast path took the loss
        _assert_close(fast, reference, dtype)
        assert torch.isfinite(fast[0])


@pytest.mark.parametrize("dtype", DTYPES)
def test_fallbacks_compute_botorchs_loss(dtype, monkeypatch):
    X, Y = _data(dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fixed = SingleTaskGP(X, Y, train_Yvar=torch.full_like(Y, 0.01))  # fixed noise

        class Sub(SingleTaskGP):
            pass

        sub = Sub(X, Y)
    cases = [("fixed noise", fixed, None), ("subclass", sub, None)]
    base = SingleTaskGP(X, Y)
    cases.append(("nan policy mask", base, gpytorch_settings.observation_nan_policy("mask")))
    cases.append(("above max_cholesky_size", base, gpytorch_settings.max_cholesky_size(5)))
    for name, model, setting in cases:
        mll = ExactMarginalLogLikelihood(model.likelihood, model)
        counter = _CountGpytorch(monkeypatch)
        if setting is None:
            fast, reference = _both(mll)
        else:
            with setting:
                fast, reference = _both(mll)
        assert counter.calls == 2, name  # both losses from gpytorch
        _assert_close(fast, reference, dtype)


def test_not_positive_definite_falls_back_to_gpytorchs_jitter(monkeypatch):
    X, Y = _data(torch.float64, n=12)
    X = torch.cat([X, X])  # every point twice
    Y = torch.cat([Y, Y])
    model = SingleTaskGP(X, Y, likelihood=GaussianLikelihood())
    model.likelihood.noise_covar.raw_noise_constraint.lower_bound.fill_(0.0)
    with torch.no_grad():
        model.likelihood.noise_covar.raw_noise.fill_(-1e3)  # noise ~ 0: K is singular
        model.covar_module.raw_lengthscale.fill_(5.0)
    mll = ExactMarginalLogLikelihood(model.likelihood, model)
    counter = _CountGpytorch(monkeypatch)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # gpytorch's jitter warning
        fast, reference = _both(mll)
    assert counter.calls == 2  # the dense Cholesky failed: gpytorch's (jittered) loss
    _assert_close(fast, reference, torch.float64)


def test_closure_follows_the_modules(monkeypatch):
    r"""Nothing is cached: a later change of a hyperparameter changes the loss as
    BoTorch's does."""
    X, Y = _data(torch.float64)
    model = SingleTaskGP(X, Y)
    mll = ExactMarginalLogLikelihood(model.likelihood, model).train()
    fast = exact_mll_closure(mll)
    before = fast()[0].item()
    with torch.no_grad():
        model.covar_module.raw_lengthscale.mul_(3.0)
    after = fast()[0].item()
    assert after != before
    parameters = {n: p for n, p in get_parameters_and_bounds(mll)[0].items() if p.requires_grad}
    expected = get_loss_closure_with_grads(mll, parameters=parameters)()[0].item()
    assert after == pytest.approx(expected, rel=1e-10)


@pytest.mark.parametrize("dtype", DTYPES)
def test_fit_exact_gp_matches_botorchs_fit(dtype, monkeypatch):
    r"""fit_exact_gp (the fast closure) reaches the hyperparameters and MLL of BoTorch's
    own fit from the same start."""
    X, Y = _data(dtype, n=30)
    fitted = fit_exact_gp(X, Y, seed=0, maxiter=200)
    monkeypatch.setattr(
        "botorch_fed.models.exact_gp.fit_gpytorch_mll",
        _drop_closure(botorch.fit.fit_gpytorch_mll),
    )
    reference = fit_exact_gp(X, Y, seed=0, maxiter=200)
    values = []
    for model in (fitted, reference):
        mll = ExactMarginalLogLikelihood(model.likelihood, model).train()
        with torch.no_grad():
            values.append(mll(model(*model.train_inputs), model.train_targets).item())
        model.eval()
    tol = {torch.float32: 1e-3, torch.float64: 1e-6}[dtype]
    assert values[0] == pytest.approx(values[1], abs=tol)
    torch.testing.assert_close(
        fitted.covar_module.lengthscale, reference.covar_module.lengthscale, rtol=1e-2, atol=1e-3
    )


def test_fit_exact_gp_takes_the_dense_path(monkeypatch):
    r"""fit_exact_gp really passes the closure: no loss of its fit comes from gpytorch."""
    X, Y = _data(torch.float64, n=15)
    counter = _CountGpytorch(monkeypatch)
    fit_exact_gp(X, Y, seed=0, maxiter=20)
    assert counter.calls == 0


def _drop_closure(fit):
    def without_closure(mll, **kwargs):
        kwargs.pop("closure", None)
        return fit(mll, **kwargs)

    return without_closure


def test_bad_input():
    X, Y = _data(torch.float64)
    model = SingleTaskGP(X, Y)
    with pytest.raises(TypeError, match="`mll` must be an ExactMarginalLogLikelihood"):
        exact_mll_closure(model)
