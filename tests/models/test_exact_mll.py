r"""exact_mll_closure against BoTorch's own loss closure (gpytorch's
ExactMarginalLogLikelihood): the same loss and gradients, from the dense path where it
covers the model, the MLL and the settings, from BoTorch's closure where it does not; and
fit_exact_gp, which uses it.
"""

from __future__ import annotations

import math
import warnings

import botorch.fit
import botorch.optim.fit as botorch_optim_fit
import pytest
import torch
from botorch.fit import fit_gpytorch_mll
from botorch.models import SingleTaskGP
from botorch.models.transforms.input import InputPerturbation, Normalize, Warp
from botorch.optim.closures import get_loss_closure_with_grads
from botorch.optim.utils import get_parameters_and_bounds, sample_all_priors
from gpytorch import settings as gpytorch_settings
from gpytorch.kernels import InducingPointKernel, MaternKernel, RBFKernel, ScaleKernel
from gpytorch.likelihoods import GaussianLikelihood
from gpytorch.means import ConstantMean
from gpytorch.mlls import ExactMarginalLogLikelihood
from gpytorch.priors import GammaPrior, LogNormalPrior

from botorch_fed.models import fit_exact_gp
from botorch_fed.models.exact_mll import exact_mll_closure
from tests.helpers.tolerances import assert_within, eps, reordering_factor

DTYPES = [torch.float32, torch.float64]


def _data(dtype=torch.float64, n=20, d=3, seed=0, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    X = torch.rand(n, d, generator=g, dtype=torch.float64)
    Y = torch.sin(6 * X).sum(-1, keepdim=True) + 0.1 * torch.randn(
        n, 1, generator=g, dtype=torch.float64
    )
    return X.to(dtype=dtype, device=device), Y.to(dtype=dtype, device=device)


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


def _loss_bounds(mll, dtype):
    r"""Bounds on ``|fast - reference|`` of the loss and of each gradient.

    Both closures evaluate ``-(log N(y; mu, K) + log priors + added terms) / n`` and
    its gradient from a Cholesky factorisation of ``K`` (noise included; gpytorch's or
    one dense one), summing in other orders: each side errs by ``n eps cond(K)`` relative
    to the magnitude of the terms the result is formed from by cancellation,
    ``(|r' K^-1 r| + |log det K| + n log 2 pi) / 2n + (|log priors| + |added|) / n`` for
    the loss and the same with each term's gradient for a gradient (by autograd, term
    by term): ``reordering_factor(n, cond(K))`` (both sides).
    """
    model = mll.model
    params = _params(mll)
    with torch.enable_grad():
        mll.train()
        dist = mll.likelihood(model(*model.train_inputs))
        K, r = dist.covariance_matrix, model.train_targets - dist.mean
        n = K.shape[-1]
        alpha = torch.cholesky_solve(r.unsqueeze(-1), torch.linalg.cholesky(K)).squeeze(-1)
        parts = [(r * alpha).sum(-1).abs().sum(), torch.logdet(K).abs().sum()]
        for _, module, prior, closure, _ in mll.named_priors():
            parts.append(2 * prior.log_prob(closure(module)).abs().sum())
        parts += [2 * term.loss().abs().sum() for term in mll.added_loss_terms()]
        loss_scale = float((sum(parts) + n * math.log(2 * math.pi)) / (2 * n))
        grad_scales = [torch.zeros_like(p) for p in params.values()]
        for part in parts:
            if not part.requires_grad:
                continue
            grads = torch.autograd.grad(
                part, list(params.values()), retain_graph=True, allow_unused=True
            )
            for acc, g in zip(grad_scales, grads, strict=True):
                if g is not None:
                    acc += g.detach().abs().nan_to_num() / (2 * n)
    f = reordering_factor(n, float(torch.linalg.cond(K.detach().double()).max()))
    e = eps(dtype)
    return f * e * loss_scale, [f * e * g.double() for g in grad_scales]


def _assert_close(a, b, dtype, mll):
    (v1, g1), (v2, g2) = a, b
    loss_bound, grad_bounds = _loss_bounds(mll, dtype)
    assert_within(v1, v2, loss_bound, msg="loss")
    assert len(g1) == len(g2) == len(grad_bounds)
    for a_, b_, bound in zip(g1, g2, grad_bounds, strict=True):
        assert_within(a_, b_, bound, msg="gradient")


@pytest.mark.parametrize("dtype", DTYPES)
def test_same_loss_and_gradients_as_botorch(dtype, monkeypatch):
    for name, model in _models(dtype):
        _set_values(model, dtype)
        mll = ExactMarginalLogLikelihood(model.likelihood, model)
        counter = _CountGpytorch(monkeypatch)
        fast, reference = _both(mll)
        assert counter.calls == 1, name  # the reference only: the fast path took the loss
        _assert_close(fast, reference, dtype, mll)
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
        _assert_close(fast, reference, dtype, mll)


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
    # both values are BoTorch's closure on the same model: the same computation (K is
    # singular, cond(K) bounds nothing here)
    (v1, g1), (v2, g2) = fast, reference
    assert torch.equal(v1, v2) and all(torch.equal(x, y) for x, y in zip(g1, g2, strict=True))


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
    assert abs(after - expected) <= _loss_bounds(mll, torch.float64)[0]  # as _assert_close


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


# --- what BoTorch's closure sees: MLL subclasses, added loss terms, batched means, eval
# mode, and fit_exact_gp of a batched model --------------------------------------------


@pytest.fixture
def _warnings_ignored():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def _params(mll):
    return {n: p for n, p in get_parameters_and_bounds(mll)[0].items() if p.requires_grad}


def _both_closures(mll, train=True, **kwargs):
    r"""(value, grads) of exact_mll_closure and of BoTorch's closure, in that order, as
    ``_both`` but also for an MLL left in its mode (``train=False``), closure keyword
    arguments, and parameters without a gradient (``None``)."""
    if train:
        mll.train()
    fast = exact_mll_closure(mll)
    reference = get_loss_closure_with_grads(mll, parameters=_params(mll))
    assert list(fast.parameters) == list(reference.parameters)
    v1, g1 = fast(**kwargs)
    v1, g1 = v1.detach().clone(), [None if g is None else g.clone() for g in g1]
    v2, g2 = reference(**kwargs)
    return (v1, g1), (v2.detach().clone(), [None if g is None else g.clone() for g in g2])


def _assert_close_allowing_nan(a, b, mll, dtype=torch.float64):
    r"""As ``_assert_close``, with ``None`` gradients allowed (and equal)."""
    (v1, g1), (v2, g2) = a, b
    loss_bound, grad_bounds = _loss_bounds(mll, dtype)
    assert_within(v1, v2, loss_bound, msg="loss")
    assert len(g1) == len(g2) == len(grad_bounds)
    for x, y, bound in zip(g1, g2, grad_bounds, strict=True):
        assert (x is None) == (y is None)
        if x is not None:
            assert_within(x, y, bound, msg="gradient")


class _PenalisedMLL(ExactMarginalLogLikelihood):
    r"""An ExactMarginalLogLikelihood subclass with a different objective."""

    def forward(self, function_dist, target, *params, **kwargs):
        return super().forward(function_dist, target, *params, **kwargs) - 10.0


@pytest.mark.usefixtures("_warnings_ignored")
def test_mll_subclass_is_honoured():
    X, Y = _data()
    model = SingleTaskGP(X, Y)
    mll = _PenalisedMLL(model.likelihood, model)
    fast, reference = _both_closures(mll)
    _assert_close_allowing_nan(fast, reference, mll)


@pytest.mark.usefixtures("_warnings_ignored")
def test_added_loss_term_registered_in_forward_is_included_on_first_call():
    X, Y = _data()
    likelihood = GaussianLikelihood()
    kernel = InducingPointKernel(
        ScaleKernel(RBFKernel()), inducing_points=X[:5].clone(), likelihood=likelihood
    )
    model = SingleTaskGP(X, Y, likelihood=likelihood, covar_module=kernel)
    assert not list(model.added_loss_terms())  # registered by the first forward only
    mll = ExactMarginalLogLikelihood(model.likelihood, model)
    fast, reference = _both_closures(mll)
    _assert_close_allowing_nan(fast, reference, mll)


@pytest.mark.usefixtures("_warnings_ignored")
def test_batched_mean_module_falls_back_or_matches():
    X, Y = _data()
    model = SingleTaskGP(X, Y, mean_module=ConstantMean(batch_shape=torch.Size([2])))
    with torch.no_grad():
        model.mean_module.constant.copy_(torch.tensor([0.3, -0.4], dtype=torch.float64))
    mll = ExactMarginalLogLikelihood(model.likelihood, model)
    fast, reference = _both_closures(mll)
    _assert_close_allowing_nan(fast, reference, mll)


@pytest.mark.usefixtures("_warnings_ignored")
def test_eval_mode_matches_botorch():
    X, Y = _data()
    model = SingleTaskGP(X, Y)
    mll = ExactMarginalLogLikelihood(model.likelihood, model).eval()
    fast, reference = _both_closures(mll, train=False)
    _assert_close_allowing_nan(fast, reference, mll)


@pytest.mark.usefixtures("_warnings_ignored")
def test_fit_exact_gp_batched_single_output_fits_like_botorch(monkeypatch):
    X, Y = _data(n=12)
    Xb, Yb = torch.stack([X, 0.5 * X + 0.1]), torch.stack([Y, -Y])
    calls = []
    independent = botorch_optim_fit._fit_gpytorch_mll_scipy_independent

    def spy(*args, **kwargs):
        calls.append("independent")
        return independent(*args, **kwargs)

    monkeypatch.setattr(botorch_optim_fit, "_fit_gpytorch_mll_scipy_independent", spy)
    reference = SingleTaskGP(Xb, Yb)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        fit_gpytorch_mll(
            ExactMarginalLogLikelihood(reference.likelihood, reference),
            optimizer_kwargs={"options": {"maxiter": 5}},
        )
    assert calls == ["independent"]  # BoTorch's own fit of this model
    fit_exact_gp(Xb, Yb, seed=0, maxiter=5)
    assert calls == ["independent", "independent"]


# --- covered models, settings and data: BoTorch's loss and gradients from the dense path,
# BoTorch's closure where it falls back ---------------------------------------------------


def _covered_models():
    X, Y = _data()
    perturbation = 0.01 * torch.randn(
        4, 3, generator=torch.Generator().manual_seed(3), dtype=torch.float64
    )
    warp = Warp(
        d=3,
        indices=[0, 2],
        concentration1_prior=LogNormalPrior(0.0, 0.75),
        concentration0_prior=LogNormalPrior(0.0, 0.75),
    )
    with torch.no_grad():
        warp.concentration0.copy_(torch.tensor([0.5, 2.0], dtype=torch.float64))
    shared = GammaPrior(2.0, 1.0)
    yield "warp with priors (learned input transform)", SingleTaskGP(X, Y, input_transform=warp)
    yield (
        "Normalize(learn_bounds=True)",
        SingleTaskGP(3 * X + 1, Y, input_transform=Normalize(d=3, learn_bounds=True)),
    )
    yield (
        "active_dims, additive, ScaleKernel, prior",
        SingleTaskGP(
            X,
            Y,
            covar_module=ScaleKernel(
                RBFKernel(active_dims=[0, 2], ard_num_dims=2, lengthscale_prior=GammaPrior(3, 6))
            )
            + RBFKernel(active_dims=[1]),
        ),
    )
    yield (
        "InputPerturbation (not applied in training)",
        SingleTaskGP(X, Y, input_transform=InputPerturbation(perturbation_set=perturbation)),
    )
    yield (
        "one prior object on two hyperparameters",
        SingleTaskGP(
            X,
            Y,
            covar_module=ScaleKernel(
                MaternKernel(ard_num_dims=3, lengthscale_prior=shared), outputscale_prior=shared
            ),
        ),
    )
    yield "n = 1", SingleTaskGP(X[:1], Y[:1], outcome_transform=None)
    frozen = SingleTaskGP(X, Y)
    frozen.covar_module.raw_lengthscale.requires_grad_(False)
    yield "a frozen hyperparameter", frozen


@pytest.mark.usefixtures("_warnings_ignored")
@pytest.mark.parametrize("case", range(7))
def test_covered_models_match_botorch(case, monkeypatch):
    name, model = list(_covered_models())[case]
    mll = ExactMarginalLogLikelihood(model.likelihood, model)
    counter = _CountGpytorch(monkeypatch)
    fast, reference = _both_closures(mll)
    assert counter.calls == 1, name  # the dense path took the fast loss
    _assert_close_allowing_nan(fast, reference, mll)


@pytest.mark.usefixtures("_warnings_ignored")
@pytest.mark.parametrize(
    "setting",
    [
        lambda: gpytorch_settings.fast_computations(log_prob=True),
        lambda: gpytorch_settings.cholesky_jitter(1e-2),
        lambda: gpytorch_settings.debug(False),
        lambda: gpytorch_settings.trace_mode(True),
    ],
    ids=["fast_log_prob", "cholesky_jitter", "debug_off", "trace_mode"],
)
def test_settings_that_do_not_change_the_loss(setting, monkeypatch):
    X, Y = _data()
    model = SingleTaskGP(X, Y)
    mll = ExactMarginalLogLikelihood(model.likelihood, model)
    counter = _CountGpytorch(monkeypatch)
    with setting():
        fast, reference = _both_closures(mll)
    assert counter.calls == 1
    _assert_close_allowing_nan(fast, reference, mll)


@pytest.mark.usefixtures("_warnings_ignored")
def test_nan_target_under_ignore_policy_is_nan_in_both():
    X, Y = _data()
    model = SingleTaskGP(X, Y)
    targets = model.train_targets.clone()
    targets[3] = float("nan")
    model.set_train_data(targets=targets, strict=False)
    fast, reference = _both_closures(ExactMarginalLogLikelihood(model.likelihood, model))
    assert math.isnan(fast[0].item()) and math.isnan(reference[0].item())


@pytest.mark.usefixtures("_warnings_ignored")
def test_closure_kwargs_fall_back(monkeypatch):
    X, Y = _data()
    model = SingleTaskGP(X, Y)
    mll = ExactMarginalLogLikelihood(model.likelihood, model)
    counter = _CountGpytorch(monkeypatch)
    fast, reference = _both_closures(mll, unused=None)  # BoTorch passes closure_kwargs through
    assert counter.calls == 2
    _assert_close_allowing_nan(fast, reference, mll)


@pytest.mark.usefixtures("_warnings_ignored")
def test_after_sample_all_priors_matches_botorch(monkeypatch):
    r"""_fit_fallback's retries resample the hyperparameters in place: nothing cached."""
    X, Y = _data()
    model = SingleTaskGP(
        X,
        Y,
        covar_module=ScaleKernel(
            MaternKernel(ard_num_dims=3, lengthscale_prior=GammaPrior(3.0, 6.0)),
            outputscale_prior=GammaPrior(2.0, 0.15),
        ),
    )
    mll = ExactMarginalLogLikelihood(model.likelihood, model).train()
    fast = exact_mll_closure(mll)
    fast()
    with torch.random.fork_rng():
        torch.manual_seed(5)
        sample_all_priors(model)
    counter = _CountGpytorch(monkeypatch)
    v1, g1 = fast()
    v1, g1 = v1.detach().clone(), [g.clone() for g in g1]
    v2, g2 = get_loss_closure_with_grads(mll, parameters=_params(mll))()
    assert counter.calls == 1
    _assert_close_allowing_nan((v1, g1), (v2.detach(), list(g2)), mll)


@pytest.mark.usefixtures("_warnings_ignored")
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_cuda_matches_botorch(dtype, monkeypatch):
    X, Y = _data(dtype=dtype, device="cuda")
    model = SingleTaskGP(
        X,
        Y,
        covar_module=ScaleKernel(MaternKernel(ard_num_dims=3)),
        input_transform=Normalize(d=3),
    )
    mll = ExactMarginalLogLikelihood(model.likelihood, model)
    counter = _CountGpytorch(monkeypatch)
    fast, reference = _both_closures(mll)
    assert counter.calls == 1
    assert fast[0].device.type == "cuda" and fast[0].dtype == dtype
    _assert_close_allowing_nan(fast, reference, mll, dtype)
