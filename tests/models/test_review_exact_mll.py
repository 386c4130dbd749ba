r"""Review of 979e08b: exact_mll_closure against BoTorch's own loss closure, and the
``_structure`` / ``_structure_key`` change in ``botorch_fed.models.pitc``.

The first six tests demonstrated defects of 979e08b (strict xfails then, fixed since: an
MLL subclass, an added loss term registered by the first forward, a batched mean module,
eval mode, a batched fit given a closure, stored structure keys); the others check cases
the closure got right (BoTorch's loss and gradients, from the dense path where it should
take it, from BoTorch's closure where it should fall back).
"""

from __future__ import annotations

import hashlib
import math
import warnings

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
from botorch_fed.models.pitc import _SCALARS, _structure, _structure_key, _summary_modules
from tests.models.test_exact_mll import _CountGpytorch


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def _data(dtype=torch.float64, n=20, d=3, device="cpu"):
    g = torch.Generator().manual_seed(0)
    X = torch.rand(n, d, generator=g, dtype=torch.float64)
    Y = torch.sin(6 * X).sum(-1, keepdim=True) + 0.1 * torch.randn(
        n, 1, generator=g, dtype=torch.float64
    )
    return X.to(dtype=dtype, device=device), Y.to(dtype=dtype, device=device)


def _params(mll):
    return {n: p for n, p in get_parameters_and_bounds(mll)[0].items() if p.requires_grad}


def _both(mll, train=True, **kwargs):
    r"""(value, grads) of exact_mll_closure and of BoTorch's closure, in that order."""
    if train:
        mll.train()
    fast = exact_mll_closure(mll)
    reference = get_loss_closure_with_grads(mll, parameters=_params(mll))
    assert list(fast.parameters) == list(reference.parameters)
    v1, g1 = fast(**kwargs)
    v1, g1 = v1.detach().clone(), [None if g is None else g.clone() for g in g1]
    v2, g2 = reference(**kwargs)
    return (v1, g1), (v2.detach().clone(), [None if g is None else g.clone() for g in g2])


def _assert_close(a, b, dtype=torch.float64):
    (v1, g1), (v2, g2) = a, b
    tol = {torch.float32: 2e-4, torch.float64: 1e-10}[dtype]
    torch.testing.assert_close(v1, v2, rtol=tol, atol=tol, equal_nan=True)
    assert len(g1) == len(g2)
    for x, y in zip(g1, g2, strict=True):
        assert (x is None) == (y is None)
        if x is not None:
            scale = max(1.0, y.abs().max().item()) if torch.isfinite(y).all() else 1.0
            torch.testing.assert_close(x, y, rtol=tol, atol=tol * scale, equal_nan=True)


# ---------------------------------------------------------------------------------
# Defects
# ---------------------------------------------------------------------------------


class _PenalisedMLL(ExactMarginalLogLikelihood):
    r"""An ExactMarginalLogLikelihood subclass with a different objective."""

    def forward(self, function_dist, target, *params, **kwargs):
        return super().forward(function_dist, target, *params, **kwargs) - 10.0


def test_mll_subclass_is_honoured():
    X, Y = _data()
    model = SingleTaskGP(X, Y)
    fast, reference = _both(_PenalisedMLL(model.likelihood, model))
    _assert_close(fast, reference)


def test_added_loss_term_registered_in_forward_is_included_on_first_call():
    X, Y = _data()
    likelihood = GaussianLikelihood()
    kernel = InducingPointKernel(
        ScaleKernel(RBFKernel()), inducing_points=X[:5].clone(), likelihood=likelihood
    )
    model = SingleTaskGP(X, Y, likelihood=likelihood, covar_module=kernel)
    assert not list(model.added_loss_terms())  # registered by the first forward only
    fast, reference = _both(ExactMarginalLogLikelihood(model.likelihood, model))
    _assert_close(fast, reference)


def test_batched_mean_module_falls_back_or_matches():
    X, Y = _data()
    model = SingleTaskGP(X, Y, mean_module=ConstantMean(batch_shape=torch.Size([2])))
    with torch.no_grad():
        model.mean_module.constant.copy_(torch.tensor([0.3, -0.4], dtype=torch.float64))
    fast, reference = _both(ExactMarginalLogLikelihood(model.likelihood, model))
    _assert_close(fast, reference)


def test_eval_mode_is_not_covered():
    X, Y = _data()
    model = SingleTaskGP(X, Y)
    mll = ExactMarginalLogLikelihood(model.likelihood, model).eval()
    fast, reference = _both(mll, train=False)
    _assert_close(fast, reference)


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


def _old_structure_key(modules) -> int:
    r"""``_structure_key`` as it was before 979e08b (settings as a list, parts as a
    list), i.e. the value stored in the persistent ``summary_structure`` buffer of
    FederatedPITCGP state dicts saved before the commit."""
    parts = []
    for path, module in modules:
        if module is None:
            parts.append((path, None))
            continue
        settings = sorted(
            (k, v if not isinstance(v, tuple) else tuple(v))
            for k, v in vars(module).items()
            if k != "training"
            and (
                isinstance(v, _SCALARS)
                or (isinstance(v, tuple) and all(isinstance(e, _SCALARS) for e in v))
            )
        )
        parts.append((path, type(module).__module__, type(module).__qualname__, settings))
    digest = hashlib.sha256(repr(parts).encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True) >> 1


def test_structure_key_values_are_stable_across_the_commit():
    kernel = ScaleKernel(MaternKernel(nu=2.5, ard_num_dims=2))
    modules = _summary_modules([("covar_module", kernel), ("likelihood", GaussianLikelihood())])
    assert _structure_key(modules) == _old_structure_key(modules)


# ---------------------------------------------------------------------------------
# Checks that pass (cases the closure gets right)
# ---------------------------------------------------------------------------------


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


@pytest.mark.parametrize("case", range(7))
def test_covered_models_match_botorch(case, monkeypatch):
    name, model = list(_covered_models())[case]
    mll = ExactMarginalLogLikelihood(model.likelihood, model)
    counter = _CountGpytorch(monkeypatch)
    fast, reference = _both(mll)
    assert counter.calls == 1, name  # the dense path took the fast loss
    _assert_close(fast, reference)


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
        fast, reference = _both(mll)
    assert counter.calls == 1
    _assert_close(fast, reference)


def test_nan_target_under_ignore_policy_is_nan_in_both():
    X, Y = _data()
    model = SingleTaskGP(X, Y)
    targets = model.train_targets.clone()
    targets[3] = float("nan")
    model.set_train_data(targets=targets, strict=False)
    fast, reference = _both(ExactMarginalLogLikelihood(model.likelihood, model))
    assert math.isnan(fast[0].item()) and math.isnan(reference[0].item())


def test_closure_kwargs_fall_back(monkeypatch):
    X, Y = _data()
    model = SingleTaskGP(X, Y)
    mll = ExactMarginalLogLikelihood(model.likelihood, model)
    counter = _CountGpytorch(monkeypatch)
    fast, reference = _both(mll, unused=None)  # BoTorch passes closure_kwargs through
    assert counter.calls == 2
    _assert_close(fast, reference)


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
    _assert_close((v1, g1), (v2.detach(), list(g2)))


def test_structure_compares_nan_settings_by_identity():
    r"""``_structure`` compares with ``==``: a NaN setting read twice is the same object,
    so an unchanged module is not reported as changed."""
    kernel = MaternKernel(nu=2.5)
    kernel.some_setting = float("nan")
    modules = _summary_modules([("k", kernel)])
    before = _structure(modules)
    assert _structure(modules) == before
    kernel.nu = 1.5
    assert _structure(modules) != before


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
    fast, reference = _both(mll)
    assert counter.calls == 1
    assert fast[0].device.type == "cuda" and fast[0].dtype == dtype
    _assert_close(fast, reference, dtype)
