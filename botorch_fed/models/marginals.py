r"""Posterior marginals at single points from factors computed once per model state.

BoTorch's analytic acquisitions (UCB, log-EI) ask ``model.posterior(X)`` at every
evaluation of a multi-start optimisation: for a small GP most of that time is spent
building linear operators, posterior objects and their autograd graph around a few
small matrix products. A :class:`MarginalPredictor` computes the same mean and
variance of ``q = 1`` inputs from the model's factors directly:

- :class:`ExactGPMarginals` for BoTorch's ``SingleTaskGP`` (a ``GaussianLikelihood``,
  one output, no batch, no or a ``Standardize`` outcome transform, any input
  transform): ``mu(x) = m(x) + k_xX alpha``, ``sigma^2(x) = k(x, x) - |L^-1 k_Xx|^2``
  with ``L = chol(K_XX + sigma_n^2 I)`` and ``alpha = L^-T L^-1 (y - m(X))``, as
  gpytorch's exact prediction strategy;
- :class:`FederatedPITCMarginals` for :class:`~botorch_fed.models.FederatedPITCGP`
  and :class:`~botorch_fed.models.FederatedPICGP`: the models' own formulas
  (``_predict_from``) on their cached factors.

Both return what ``model.posterior(X)`` gives, ``posterior.mean`` and
``posterior.variance`` (the outcome transform, then gpytorch's ``min_variance``
clamp), to rounding. A predictor is a snapshot of the model's state: it records a
fingerprint of every tensor it was computed from (identity, storage, version, dtype,
device), copies of their values (gpytorch's setters write through ``.data``, which no
fingerprint sees; off the CPU comparing them synchronises with the device) and the
modules' structure (settings that are not tensors, e.g. a Matern kernel's
``nu``);
:meth:`MarginalPredictor.is_current` compares them with the model's now, and callers
rebuild the predictor when the model changed (see
:class:`~botorch_fed.acquisition.CachedUpperConfidenceBound`).

:func:`marginal_predictor` returns ``None`` for models and settings it does not cover
(another model type, a subclass, which may predict otherwise, or another likelihood;
an outcome transform other than ``Standardize``; ``propagate_grads`` or
``detach_test_caches(False)``, which need gradients to the model's state, or
gpytorch's ``prior_mode``, ``skip_posterior_variances`` and ``fast_pred_var``; a
train covariance that a plain Cholesky factorisation refuses, where gpytorch would
add jitter): callers then use ``model.posterior``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any

import torch
from botorch import settings as botorch_settings
from botorch.models import SingleTaskGP
from botorch.models.model import Model
from botorch.models.transforms.outcome import Standardize
from gpytorch import settings as gpytorch_settings
from gpytorch.likelihoods import GaussianLikelihood
from torch import Tensor

from botorch_fed.models.module_state import _fingerprint, _structure, _summary_modules
from botorch_fed.models.pic import FederatedPICGP
from botorch_fed.models.pitc import FederatedPITCGP

__all__ = [
    "ExactGPMarginals",
    "FederatedPITCMarginals",
    "MarginalPredictor",
    "marginal_predictor",
]


def _min_variance(dtype: torch.dtype) -> float:
    return gpytorch_settings.min_variance.value(dtype)


def _standardize(model: Model) -> Standardize | None:
    r"""The model's ``Standardize`` transform, ``None`` without one; raises
    ``TypeError`` for any other outcome transform (not covered)."""
    transform = getattr(model, "outcome_transform", None)
    if transform is None:
        return None
    if type(transform) is not Standardize or transform._outputs is not None:
        raise TypeError(type(transform).__name__)
    if not transform._is_trained or transform.means.shape[-1] != 1:
        raise TypeError("untrained or multi-output Standardize")
    return transform


def _settings_need_posterior() -> bool:
    r"""Whether a setting changes what ``model.posterior`` computes: gradients to the
    model's state (BoTorch's ``propagate_grads``, gpytorch's
    ``detach_test_caches(False)``), or gpytorch's ``prior_mode``,
    ``skip_posterior_variances`` and ``fast_pred_var`` (LOVE)."""
    return (
        botorch_settings.propagate_grads.on()
        or gpytorch_settings.detach_test_caches.off()
        or gpytorch_settings.prior_mode.on()
        or gpytorch_settings.skip_posterior_variances.on()
        or gpytorch_settings.fast_pred_var.on()
    )


class MarginalPredictor(ABC):
    r"""Posterior mean and variance of ``q = 1`` inputs of one model state.

    Subclasses set ``model``, ``dtype`` and ``device`` and implement
    :meth:`_state` and :meth:`_latent`.
    """

    model: Model
    dtype: torch.dtype
    device: torch.device

    def __init__(self, transform: Standardize | None) -> None:
        self._transform = transform
        self._fingerprint, tensors = self._state()
        # holding the tensors keeps their ids and storage from being reused; their values
        # are compared too (writes through ``.data``, as gpytorch's setters make, bypass
        # the version counter; off the CPU the comparison synchronises with the device)
        self._tensors = tensors
        self._values = [t.detach().clone() for t in tensors]

    @abstractmethod
    def _state(self) -> tuple[tuple, list[Tensor]]:
        r"""The fingerprint of the model's state now, and the tensors it covers."""

    @abstractmethod
    def _latent(self, X: Tensor) -> tuple[Tensor, Tensor]:
        r"""Latent mean and variance (``batch``) at ``batch x 1 x d`` inputs."""

    def is_current(self) -> bool:
        r"""Whether the model is in the state this predictor was computed from (no
        tensor of it replaced, moved, converted or modified in place since)."""
        fingerprint, tensors = self._state()
        if fingerprint != self._fingerprint:
            return False
        return all(torch.equal(t, v) for t, v in zip(tensors, self._values, strict=True))

    def accepts(self, X: Tensor) -> bool:
        r"""Whether ``X`` has this predictor's dtype and device (``model.posterior``
        of BoTorch's acquisitions first moves the model to ``X``) and ``q = 1``."""
        return X.dtype == self.dtype and X.device == self.device and X.shape[-2] == 1

    def __call__(self, X: Tensor) -> tuple[Tensor, Tensor]:
        r"""``posterior.mean`` and ``posterior.variance`` of ``model.posterior(X)``.

        Args:
            X: ``batch_shape x 1 x d`` inputs (see :meth:`accepts`).

        Returns:
            Mean and variance, each ``batch_shape x 1``, in the outcome space.
        """
        mean, variance = (t.to(X.dtype) for t in self._latent(X))  # as the posterior's
        if self._transform is not None:  # as Standardize.untransform_posterior
            offset, scale = (b.squeeze(-1) for b in (self._transform.means, self._transform.stdvs))
            mean, variance = offset + scale * mean, scale * variance * scale
        # gpytorch's clamp of the (untransformed) posterior's variance
        variance = variance.clamp_min(_min_variance(variance.dtype))
        return mean.unsqueeze(-1), variance.unsqueeze(-1)


class ExactGPMarginals(MarginalPredictor):
    r"""Marginals of a ``SingleTaskGP`` in eval mode (see the module docstring).

    Args:
        model: A ``SingleTaskGP`` with a ``GaussianLikelihood``, one output and no
            batch shape, and no or a trained ``Standardize`` outcome transform.

    Raises:
        TypeError: For models outside that class.
        torch.linalg.LinAlgError: If ``K_XX + sigma_n^2 I`` is not positive definite
            in the model's dtype (gpytorch would add jitter).
    """

    model: SingleTaskGP

    def __init__(self, model: SingleTaskGP) -> None:
        if type(model) is not SingleTaskGP or type(model.likelihood) is not GaussianLikelihood:
            raise TypeError("a SingleTaskGP (not a subclass) with a GaussianLikelihood")
        if model.num_outputs != 1 or len(model._input_batch_shape) != 0:
            raise TypeError("one output and no batch shape")
        transform = _standardize(model)
        model.eval()  # train inputs transformed, as model.posterior does
        self.model = model
        X = model.train_inputs[0]
        self.dtype, self.device = X.dtype, X.device
        with torch.no_grad(), gpytorch_settings.lazily_evaluate_kernels(False):
            K = model.covar_module(X).to_dense()
            noise = model.likelihood.noise.reshape(-1)
            L = torch.linalg.cholesky(K + torch.diag_embed(noise.expand(K.shape[-1])))
            residual = (model.train_targets - model.mean_module(X)).unsqueeze(-1)
            self._alpha = torch.cholesky_solve(residual, L).squeeze(-1)
        self._train_X, self._L = X, L
        super().__init__(transform)

    def _state(self) -> tuple[tuple, list[Tensor]]:
        model = self.model
        tensors = [*model.parameters(), *model.buffers(), *model.train_inputs]
        tensors.append(model.train_targets)
        # settings that are not tensors (a Matern kernel's nu, a transform's flags)
        structure = _structure(_summary_modules([("model", model)]))
        return (model.training, structure, _fingerprint(tensors)), tensors

    def _latent(self, X: Tensor) -> tuple[Tensor, Tensor]:
        model = self.model
        Xt = model.transform_inputs(X)
        with gpytorch_settings.lazily_evaluate_kernels(False):
            k = model.covar_module(Xt, self._train_X.expand(*Xt.shape[:-2], -1, -1))
            k = k.to_dense()  # batch x 1 x n
            prior = model.covar_module(Xt, diag=True).to_dense()  # batch x 1
            mean = model.mean_module(Xt) + k @ self._alpha  # batch x 1
        W = torch.linalg.solve_triangular(self._L, k.mT, upper=False)  # batch x n x 1
        return mean.squeeze(-1), (prior - W.pow(2).sum(dim=-2)).squeeze(-1)


class FederatedPITCMarginals(MarginalPredictor):
    r"""Marginals of a :class:`~botorch_fed.models.FederatedPITCGP` (or its PIC
    subclass) from its checked, cached factors.

    Args:
        model: The model, with no or a trained ``Standardize`` outcome transform.

    Raises:
        TypeError: For an outcome transform other than ``Standardize``.
        HyperparametersChangedError: If the modules are not in the summary's state.
    """

    model: FederatedPITCGP

    def __init__(self, model: FederatedPITCGP) -> None:
        transform = _standardize(model)
        model.eval()
        self.model = model
        self._factors = model._factors()  # checks the modules against the summary
        self.dtype, self.device = model.support.dtype, model.support.device
        super().__init__(transform)

    def _state(self) -> tuple[tuple, list[Tensor]]:
        return self.model.state_fingerprint()

    def _latent(self, X: Tensor) -> tuple[Tensor, Tensor]:
        model = self.model
        X64 = model.transform_inputs(X.to(torch.float64))
        mean, variance = model._predict_from(self._factors, X64, diag=True)
        return mean.squeeze(-1), variance.squeeze(-1)


# each builder takes a model of its class
_PREDICTORS: tuple[tuple[type, Callable[[Any], MarginalPredictor]], ...] = (
    (FederatedPITCGP, FederatedPITCMarginals),
    (FederatedPICGP, FederatedPITCMarginals),
    (SingleTaskGP, ExactGPMarginals),
)


def marginal_predictor(model: Model) -> MarginalPredictor | None:
    r"""A :class:`MarginalPredictor` of ``model`` in its current state, or ``None``
    where none applies (see the module docstring; use ``model.posterior`` then).

    Args:
        model: A BoTorch model.

    Returns:
        The predictor or ``None``.
    """
    if _settings_need_posterior():
        return None
    for cls, build in _PREDICTORS:
        if type(model) is cls:  # a subclass may predict otherwise
            try:
                return build(model)
            except (TypeError, torch.linalg.LinAlgError):
                return None
    return None
