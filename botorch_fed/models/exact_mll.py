r"""A leaner forward-backward closure for fitting a ``SingleTaskGP``'s exact marginal
log-likelihood.

BoTorch's ``fit_gpytorch_mll`` evaluates ``-mll(model(*train_inputs), train_targets)``
at every L-BFGS-B step: for the small GPs of a BO client (tens of points) most of that
time goes to gpytorch's ``ExactGP.__call__``, ``MultivariateNormal`` and linear-operator
bookkeeping and their autograd graph, not to the ``n x n`` algebra.
:func:`exact_mll_closure` computes the same objective from the model's modules with
one dense Cholesky factorisation, as gpytorch does for ``n <= max_cholesky_size``:

``loss = -(log N(y; m(X), K_XX + sigma_n^2 I) + sum of the model's log priors) / n``

with ``X`` the transformed training inputs (as ``SingleTaskGP.forward`` in training
mode) and ``y`` the (outcome-transformed) training targets -- gpytorch's
``ExactMarginalLogLikelihood`` term for term, to rounding. Every call first checks that
the model and gpytorch's settings are still in the covered class and otherwise, and
whenever ``K_XX + sigma_n^2 I`` is not positive definite in the model's dtype (where
gpytorch adds jitter), evaluates BoTorch's own loss closure instead, so the closure
never computes anything else than BoTorch's.

Covered: ``ExactMarginalLogLikelihood`` (the class itself) of a ``SingleTaskGP`` (the
class itself) in training mode with a ``GaussianLikelihood`` and ``HomoskedasticNoise``,
one output, no batch shape in the data or the modules, no added loss terms (also none
registered by the modules' forward), gpytorch's ``observation_nan_policy`` ``"ignore"``
and ``n <= max_cholesky_size``.
"""

from __future__ import annotations

import math

import torch
from botorch.models import SingleTaskGP
from botorch.optim.closures import ForwardBackwardClosure, get_loss_closure
from botorch.optim.utils import get_parameters_and_bounds
from gpytorch import settings as gpytorch_settings
from gpytorch.likelihoods import GaussianLikelihood
from gpytorch.likelihoods.noise_models import HomoskedasticNoise
from gpytorch.mlls import ExactMarginalLogLikelihood
from torch import Tensor

__all__ = ["exact_mll_closure"]


def _covered(mll: ExactMarginalLogLikelihood) -> bool:
    r"""Whether :func:`_dense_loss` computes ``mll``'s loss now (see the module
    docstring)."""
    model = mll.model
    likelihood = mll.likelihood
    if type(mll) is not ExactMarginalLogLikelihood:  # a subclass may compute otherwise
        return False
    if type(model) is not SingleTaskGP or likelihood is not model.likelihood:
        return False
    if not model.training:  # fit_gpytorch_mll trains; eval-mode calls differ
        return False
    if type(likelihood) is not GaussianLikelihood:
        return False
    if type(likelihood.noise_covar) is not HomoskedasticNoise:
        return False
    if model.num_outputs != 1 or len(model._input_batch_shape) != 0:
        return False
    if len(model.train_inputs) != 1 or model.train_targets.dim() != 1:
        return False
    if likelihood.noise_covar.noise.numel() != 1:
        return False
    # gpytorch's GP.added_loss_terms: gpytorch is untyped, so mypy resolves it through
    # nn.Module.__getattr__ (Tensor | Module)
    if any(True for _ in model.added_loss_terms()):  # type: ignore[operator]
        return False
    if gpytorch_settings.observation_nan_policy.value() != "ignore":
        return False
    return model.train_targets.shape[-1] <= gpytorch_settings.max_cholesky_size.value()


def _dense_loss(mll: ExactMarginalLogLikelihood) -> Tensor | None:
    r"""``-mll / n`` from one dense Cholesky factorisation, or ``None`` where
    ``K_XX + sigma_n^2 I`` is not positive definite (gpytorch would add jitter), a module
    is batched, or the modules' forward registered an added loss term."""
    model = mll.model
    X = model.transform_inputs(model.train_inputs[0])  # as SingleTaskGP.forward in training
    y = model.train_targets
    n = y.shape[-1]
    with gpytorch_settings.lazily_evaluate_kernels(False):
        K = model.covar_module(X).to_dense()
    mean = model.mean_module(X)
    if K.shape != (n, n) or mean.shape != (n,):  # batched modules
        return None
    if any(True for _ in model.added_loss_terms()):  # registered by a forward (inducing points)
        return None
    noise = model.likelihood.noise_covar.noise.reshape(())
    L, info = torch.linalg.cholesky_ex(K + noise * torch.eye(n, dtype=K.dtype, device=K.device))
    if info.item() != 0:
        return None
    residual = (y - mean).unsqueeze(-1)
    white = torch.linalg.solve_triangular(L, residual, upper=False)
    # gpytorch's MultivariateNormal.log_prob: -(inv_quad + logdet + n log 2 pi) / 2
    log_prob = -0.5 * (
        white.square().sum() + 2.0 * L.diagonal().log().sum() + n * math.log(2 * math.pi)
    )
    # ExactMarginalLogLikelihood._add_other_terms: the model's priors
    for _, module, prior, closure, _ in model.named_priors():
        log_prob = log_prob + prior.log_prob(closure(module)).reshape(-1).sum()
    return -log_prob / n


def exact_mll_closure(mll: ExactMarginalLogLikelihood) -> ForwardBackwardClosure:
    r"""A forward-backward closure of ``mll``'s loss for ``fit_gpytorch_mll(mll,
    closure=...)``.

    Returns the same loss and gradients as BoTorch's ``get_loss_closure_with_grads``
    (to rounding): from one dense Cholesky factorisation where the model is covered
    (see the module docstring), from BoTorch's closure otherwise; the check runs at
    every call.

    Args:
        mll: An ``ExactMarginalLogLikelihood`` (its model in training mode, as
            ``fit_gpytorch_mll`` puts it).

    Returns:
        A ``ForwardBackwardClosure`` over ``mll``'s parameters that require gradients,
        in the order ``fit_gpytorch_mll_scipy`` uses. (Given a closure,
        ``fit_gpytorch_mll_scipy`` fits a batched multi-output model jointly rather than
        output by output: :func:`~botorch_fed.models.fit_exact_gp` passes one only for
        ``n x d`` single-output data.)
    """
    if not isinstance(mll, ExactMarginalLogLikelihood):
        raise TypeError(f"`mll` must be an ExactMarginalLogLikelihood, got {type(mll).__name__}.")
    fallback = get_loss_closure(mll)

    def forward(**kwargs) -> Tensor:
        if not kwargs and _covered(mll):
            loss = _dense_loss(mll)
            if loss is not None:
                return loss
        return fallback(**kwargs)

    # fit_gpytorch_mll_scipy's own parameter dict (the gradients are matched by order)
    parameters = {n: p for n, p in get_parameters_and_bounds(mll)[0].items() if p.requires_grad}
    return ForwardBackwardClosure(forward=forward, parameters=parameters)
