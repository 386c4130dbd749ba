r"""The federated PITC sparse GP (dPITC) as a BoTorch model.

The server (or any client) holding the *sum* of the clients' whitened summaries
(:class:`~botorch_fed.models.pitc_summary.SparseSummary`) predicts with eq. 9-10 of
[FBO-FedGP] (App. A). With ``L = chol(K_SS)``, ``B = I + sum_i A~_i`` and
``b~ = sum_i b~_i`` (so ``Sigma = K_SS + sum_i A_i = L B L'``):

    W    = L^-1 K_SU
    mean = mu_U + W' B^-1 b~
    cov  = K_UU - W'W + W' B^-1 W

which is the PITC predictive distribution with one independent block per client,
and the exact GP posterior when the support contains every training input.

Conditioning on new observations adds them as one more block (a rank-``n'`` update
of ``A`` and an update of ``b``), so ``fantasize`` and one-shot
``qKnowledgeGradient`` work; the update depends on the fantasy ``Y`` only through
``b~``, so the ``num_fantasies`` fantasy models share one Cholesky factor of ``B``.

References:

.. [FBO-FedGP] Secure federated Bayesian optimisation with distributed sparse GPs,
   Sec. 2 and App. A (paper 000 in ``shared/papers``).
.. [Quinonero2005] J. Quinonero-Candela and C. E. Rasmussen. A unifying view of
   sparse approximate Gaussian process regression. JMLR 2005.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from botorch.acquisition.objective import PosteriorTransform
from botorch.exceptions.errors import BotorchTensorDimensionError, InputDataError
from botorch.exceptions.warnings import InputDataWarning
from botorch.models.model import FantasizeMixin, Model
from botorch.models.transforms.outcome import OutcomeTransform
from botorch.posteriors.gpytorch import GPyTorchPosterior
from botorch.posteriors.posterior import Posterior
from gpytorch.distributions import MultivariateNormal
from gpytorch.kernels import Kernel
from gpytorch.likelihoods import GaussianLikelihood, Likelihood
from gpytorch.means import Mean, ZeroMean
from gpytorch.models import GP
from linear_operator.operators import DenseLinearOperator
from torch import Tensor

from botorch_fed.models.pitc_summary import (
    SparseSummary,
    UnsupportedLikelihoodError,
    compute_local_summary,
    support_cholesky,
    validate_support,
)

_SUMMARY_FIELDS = ("b", "A", "quad", "logdet", "num_data")


def sum_arrays(arrays: Sequence[np.ndarray]) -> np.ndarray:
    r"""Plaintext aggregation: the elementwise sum of the clients' float64 arrays.

    This is the default ``aggregate`` callable; secure backends
    (``botorch_fed.secure``) provide drop-in replacements with the same signature.

    Args:
        arrays: One array per client, all of the same shape.

    Returns:
        Their float64 sum.
    """
    if len(arrays) == 0:
        raise ValueError("`arrays` is empty: no client contributed to the aggregate.")
    return np.sum(np.stack([np.asarray(a, dtype=np.float64) for a in arrays]), axis=0)


class FederatedPITCGP(Model, FantasizeMixin, GP):
    r"""Distributed PITC sparse GP built from aggregated client summaries.

    The model never sees a data point: it is fully determined by the support set,
    the shared hyperparameter modules and the summed whitened summary. It is a
    snapshot for the hyperparameters the summary was computed with; after changing
    hyperparameters, recompute the summaries and build a new model.

    Example:
        >>> summaries = [
        ...     compute_local_summary(X_i, Y_i, S, covar_module, likelihood)
        ...     for X_i, Y_i in client_data  # each on its own client
        ... ]
        >>> model = FederatedPITCGP(S, SparseSummary.sum(summaries), covar_module,
        ...                         likelihood)
        >>> UCB = UpperConfidenceBound(model, beta=2.0)
    """

    num_outputs = 1

    def __init__(
        self,
        support: Tensor,
        summary: SparseSummary,
        covar_module: Kernel,
        likelihood: Likelihood,
        mean_module: Mean | None = None,
        outcome_transform: OutcomeTransform | None = None,
        jitter: float | None = None,
    ) -> None:
        r"""
        Args:
            support: ``m x d`` shared support set ``S``.
            summary: The sum over clients of their whitened summaries on ``S`` (any
                batch shape; the model's batch shape is the summary's).
            covar_module: The shared kernel the summaries were computed with.
            likelihood: The shared ``GaussianLikelihood``.
            mean_module: The shared prior mean; ``None`` is a zero mean.
            outcome_transform: A *trained* outcome transform (e.g. ``Standardize``
                with federated moments, see :func:`standardize_from_moments`) that
                the clients applied to their outcomes; posteriors are untransformed.
            jitter: Relative jitter of ``K_SS`` (must match the clients').
        """
        super().__init__()
        validate_support(support)
        if not isinstance(summary, SparseSummary):
            raise TypeError(f"`summary` must be a SparseSummary, got {type(summary).__name__}.")
        if summary.num_support != support.shape[0]:
            raise BotorchTensorDimensionError(
                f"`summary` lives on {summary.num_support} support points but `support` "
                f"has {support.shape[0]}."
            )
        if not isinstance(likelihood, GaussianLikelihood):
            raise UnsupportedLikelihoodError(likelihood)
        for name in _SUMMARY_FIELDS:
            value = getattr(summary, name)
            if value.dtype != support.dtype:
                raise InputDataError(
                    f"`summary.{name}` has dtype {value.dtype} but `support` has {support.dtype}."
                )
            if not torch.isfinite(value).all():
                raise InputDataError(f"`summary.{name}` contains NaN or infinite values.")
        if support.dtype != torch.float64:
            warnings.warn(
                f"FederatedPITCGP got {support.dtype} inputs; float64 is strongly "
                "recommended for GP computations.",
                InputDataWarning,
                stacklevel=2,
            )
        self.covar_module = covar_module
        self.likelihood = likelihood
        self.mean_module = ZeroMean() if mean_module is None else mean_module
        if outcome_transform is not None:
            self.outcome_transform = outcome_transform
        self._jitter = jitter
        self.register_buffer("support", support)
        for name in _SUMMARY_FIELDS:
            self.register_buffer(f"summary_{name}", getattr(summary, name))
        # Caches: everything that does not depend on the test inputs. They keep an
        # autograd graph only when the summary has one (fantasy models, so that
        # gradients flow to the fantasy inputs); otherwise repeated backward passes
        # through posteriors would hit a freed graph.
        needs_grad = any(getattr(summary, n).requires_grad for n in _SUMMARY_FIELDS)
        with torch.set_grad_enabled(needs_grad):
            self._set_caches()
        self.to(support)
        self.eval()

    def _set_caches(self) -> None:
        L = support_cholesky(self.support, self.covar_module, self._jitter)
        A = self.summary_A
        eye = torch.eye(A.shape[-1], dtype=A.dtype, device=A.device)
        L_B, info = torch.linalg.cholesky_ex(eye + A)
        if (info != 0).any():
            raise InputDataError(
                "I + summary.A is not positive definite: the summary is not a sum of "
                "valid client summaries (corrupted or wrongly aggregated)."
            )
        v = torch.linalg.solve_triangular(L_B, self.summary_b.unsqueeze(-1), upper=False).squeeze(
            -1
        )
        self.register_buffer("_L_S", L, persistent=False)
        self.register_buffer("_L_B", L_B, persistent=False)
        self.register_buffer("_v", v, persistent=False)

    @property
    def summary(self) -> SparseSummary:
        r"""The aggregated whitened summary the model was built from."""
        return SparseSummary(*(getattr(self, f"summary_{n}") for n in _SUMMARY_FIELDS))

    @property
    def batch_shape(self) -> torch.Size:
        r"""The model batch shape (that of the summary)."""
        return self.summary.batch_shape

    @classmethod
    def from_client_data(
        cls,
        client_data: Sequence[tuple[Tensor, Tensor]],
        support: Tensor,
        covar_module: Kernel,
        likelihood: Likelihood,
        mean_module: Mean | None = None,
        outcome_transform: OutcomeTransform | None = None,
        aggregate: Callable[[Sequence[np.ndarray]], np.ndarray] | None = None,
        jitter: float | None = None,
    ) -> FederatedPITCGP:
        r"""Simulate the federation in one process: summarise, aggregate, build.

        Each client's summary is packed into a float64 vector (as it would be sent),
        the vectors are combined by ``aggregate`` (e.g. a secure backend), and the
        model is built from the unpacked sum.

        Args:
            client_data: One ``(train_X, train_Y)`` pair per client (``n_i x d``,
                ``n_i x 1``), in the *transformed* outcome space if an
                ``outcome_transform`` is given.
            support: ``m x d`` shared support set.
            covar_module: The shared kernel.
            likelihood: The shared ``GaussianLikelihood``.
            mean_module: The shared prior mean (``None``: zero).
            outcome_transform: Trained outcome transform, see ``__init__``.
            aggregate: ``list of arrays -> their sum``; default plaintext sum.
            jitter: Relative jitter of ``K_SS``.

        Returns:
            The federated model.
        """
        if len(client_data) == 0:
            raise ValueError("`client_data` is empty: a federation needs clients.")
        aggregate = sum_arrays if aggregate is None else aggregate
        with torch.no_grad():
            L = support_cholesky(support, covar_module, jitter)
            packed = [
                compute_local_summary(
                    X, Y, support, covar_module, likelihood, mean_module, support_chol=L
                ).to_numpy()
                for X, Y in client_data
            ]
        total = SparseSummary.from_numpy(
            aggregate(packed), support.shape[0], dtype=support.dtype, device=support.device
        )
        return cls(support, total, covar_module, likelihood, mean_module, outcome_transform, jitter)

    def _predict(self, X: Tensor) -> tuple[Tensor, Tensor]:
        r"""Latent posterior mean (``batch x q``) and covariance (``batch x q x q``)."""
        S = self.support.expand(*X.shape[:-2], *self.support.shape)
        K_SU = self.covar_module(S, X).to_dense()
        K_UU = self.covar_module(X).to_dense()
        W = torch.linalg.solve_triangular(self._L_S, K_SU, upper=False)
        C = torch.linalg.solve_triangular(self._L_B, W, upper=False)
        mean = self.mean_module(X) + (C * self._v.unsqueeze(-1)).sum(dim=-2)
        cov = K_UU - W.mT @ W + C.mT @ C
        return mean, 0.5 * (cov + cov.mT)

    def posterior(
        self,
        X: Tensor,
        output_indices: list[int] | None = None,
        observation_noise: bool | Tensor = False,
        posterior_transform: PosteriorTransform | None = None,
        **kwargs: Any,
    ) -> Posterior:
        r"""The dPITC predictive distribution (eq. 9-10 of [FBO-FedGP]).

        Args:
            X: ``batch_shape x q x d`` test inputs (``batch_shape`` broadcasts with
                the model's batch shape).
            output_indices: Must be ``None`` or ``[0]`` (single output).
            observation_noise: If True, add the likelihood's noise; if a tensor of
                shape ``batch_shape x q x 1`` (outcome-transformed space), add it.
            posterior_transform: An optional posterior transform.

        Returns:
            A ``GPyTorchPosterior`` with the full ``q x q`` covariance (or the
            transformed posterior).
        """
        self.eval()
        if output_indices is not None and list(output_indices) != [0]:
            raise ValueError(
                f"`output_indices`={output_indices}: FederatedPITCGP has one output (0)."
            )
        if X.ndim < 2 or X.shape[-1] != self.support.shape[-1]:
            raise BotorchTensorDimensionError(
                f"`X` must be `batch_shape x q x d` with d={self.support.shape[-1]}, got "
                f"shape {tuple(X.shape)}."
            )
        if not torch.isfinite(X).all():
            raise InputDataError("`X` contains NaN or infinite values.")
        mean, cov = self._predict(X)
        if observation_noise is True:
            cov = cov + torch.diag_embed(self.likelihood.noise * torch.ones_like(mean))
        elif isinstance(observation_noise, Tensor):
            if observation_noise.shape[-1] != 1:
                raise BotorchTensorDimensionError(
                    "`observation_noise` must be `batch_shape x q x 1`, got shape "
                    f"{tuple(observation_noise.shape)}."
                )
            cov = cov + torch.diag_embed(observation_noise.squeeze(-1) * torch.ones_like(mean))
        elif observation_noise is not False:
            raise ValueError(
                f"`observation_noise` must be a bool or a Tensor, got {observation_noise!r}."
            )
        # A lazy covariance, as ExactGP returns: no eager Cholesky of a q x q matrix that
        # may be singular (e.g. repeated test points); samplers add jitter when needed.
        batch_shape = torch.broadcast_shapes(mean.shape[:-1], cov.shape[:-2])
        mean = mean.expand(*batch_shape, mean.shape[-1])
        cov = cov.expand(*batch_shape, *cov.shape[-2:])  # fantasies share a covariance
        mvn = MultivariateNormal(mean, DenseLinearOperator(cov))
        posterior = GPyTorchPosterior(distribution=mvn)
        if hasattr(self, "outcome_transform"):
            posterior = self.outcome_transform.untransform_posterior(posterior, X=X)
        if posterior_transform is not None:
            return posterior_transform(posterior=posterior, X=X)
        return posterior

    def condition_on_observations(
        self, X: Tensor, Y: Tensor, noise: Tensor | None = None, **kwargs: Any
    ) -> FederatedPITCGP:
        r"""Add ``(X, Y)`` as one more PITC block (a rank update of the summary).

        Args:
            X: ``batch_shape x n' x d`` new inputs.
            Y: ``batch_shape' x n' x 1`` new outcomes (original outcome space);
                ``batch_shape'`` broadcasts with ``batch_shape``, e.g.
                ``num_fantasies x batch_shape`` when fantasizing.
            noise: Optional ``batch_shape x n' x 1`` observation noise variances
                (outcome-transformed space); default: the likelihood's noise.

        Returns:
            A new ``FederatedPITCGP`` (sharing this model's modules) with batch shape
            ``broadcast(model batch, batch_shape')``; differentiable in ``X``, ``Y``.
        """
        self.eval()
        if hasattr(self, "outcome_transform"):
            Y, _ = self.outcome_transform(Y, X=X)
        block = compute_local_summary(
            X,
            Y,
            self.support,
            self.covar_module,
            self.likelihood,
            self.mean_module,
            train_Yvar=noise,
            support_chol=self._L_S,
        )
        return self.__class__(
            support=self.support,
            summary=self.summary + block,
            covar_module=self.covar_module,
            likelihood=self.likelihood,
            mean_module=self.mean_module,
            outcome_transform=getattr(self, "outcome_transform", None),
            jitter=self._jitter,
        )
