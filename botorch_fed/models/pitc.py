r"""The federated PITC sparse GP (dPITC) as a BoTorch model.

The server (or any client) holding the *sum* of the clients' whitened summaries
(:class:`~botorch_fed.models.sparse_summary.SparseSummary`) predicts with eq. 9-10 of
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

Numerics: all linear algebra runs in float64 whatever the dtype of the inputs; a
float32 model takes and returns float32 tensors. With an ill-conditioned support
(``cond(K_SS) ~ 1e9`` is common at long lengthscales) float32 cannot factorise
``K_SS`` without a jitter large enough to change the Nystrom term, which is where a
float32 dPITC would lose most of its accuracy.

References:

.. [FBO-FedGP] Secure federated Bayesian optimisation with distributed sparse GPs,
   Sec. 2 and App. A (paper 000 in ``shared/papers``).
.. [Quinonero2005] J. Quinonero-Candela and C. E. Rasmussen. A unifying view of
   sparse approximate Gaussian process regression. JMLR 2005.
"""

from __future__ import annotations

from collections.abc import Sequence
from copy import deepcopy
from typing import Any

import torch
from botorch.acquisition.objective import PosteriorTransform
from botorch.exceptions.errors import (
    BotorchTensorDimensionError,
    InputDataError,
    UnsupportedError,
)
from botorch.models.model import FantasizeMixin
from botorch.models.transforms.input import InputTransform
from botorch.models.transforms.outcome import OutcomeTransform
from botorch.posteriors.gpytorch import GPyTorchPosterior
from botorch.posteriors.posterior import Posterior
from gpytorch.distributions import MultivariateNormal
from gpytorch.kernels import Kernel
from gpytorch.likelihoods import GaussianLikelihood, Likelihood
from gpytorch.means import Mean
from gpytorch.mlls import MarginalLogLikelihood
from gpytorch.models import GP
from linear_operator.operators import DenseLinearOperator
from torch import Tensor

from botorch_fed.models.float64 import evaluate64, noise64, prior_variance64
from botorch_fed.models.local_summary import (
    UnsupportedLikelihoodError,
    compute_local_summary,
    local_summary,
)
from botorch_fed.models.pitc_inputs import (
    _check_client_data,
    _check_output_indices,
    _check_summary,
    _learns,
    _noise_diagonal,
    _untrained,
    check_outcome_transform,
    transform_outcomes,
)
from botorch_fed.models.pitc_snapshot import PITCSnapshot
from botorch_fed.models.sparse_summary import SparseSummary, summary_factor
from botorch_fed.models.support_set import (
    check_input_transform,
    support_factor,
    validate_support,
)


class FederatedPITCGP(PITCSnapshot, FantasizeMixin, GP):
    r"""Distributed PITC sparse GP built from the sum of the client summaries.

    The model never sees a data point: it is fully determined by the support set,
    the shared hyperparameter modules and the summed whitened summary. It is a
    snapshot for the state the summary was computed with, which it records (buffers
    ``summary_hyperparameters``, ``summary_structure``, ``summary_jitter``): if the
    modules change afterwards -- a value (``fit_federated_pitc`` on the same modules,
    ``load_state_dict`` of the modules alone, an optimiser step, a gpytorch setter), a
    module replaced or a setting such as a Matern kernel's ``nu`` -- the next
    ``posterior`` raises :class:`HyperparametersChangedError` instead of mixing them
    with an old summary. Give it a summary computed at the new values with
    :meth:`update_summary` (``PITCMarginalLogLikelihood`` does so after
    ``fit_gpytorch_mll``). ``load_state_dict`` from another ``FederatedPITCGP`` loads
    its summary and that record together and predicts as that model. ``.to()``,
    ``.float()`` and ``.double()`` move the summary and the support but keep their
    dtype.

    What a PITC model learns from new observations: they enter only through the
    support set -- an observation updates the posterior through its projection
    ``K_Sx``, so a point far from every support point (in lengthscales) barely moves
    the posterior anywhere, even at the point itself. Conditioning and fantasies
    (``fantasize``, ``qKnowledgeGradient``, ``qNegIntegratedPosteriorVariance``,
    pending points) inherit this: they value a candidate by how much it teaches the
    model *on the support*. Grow the support (or re-select it near the data, as
    FBO-FedGP does every few rounds) when the search moves away from it.

    Checks that read tensor values (non-finite test inputs, changed hyperparameter
    values) run on every call when the model lives on the CPU, where they cost no
    synchronisation. On an accelerator ``posterior`` performs no host
    synchronisation: hyperparameters are re-checked whenever a module tensor was
    replaced or modified in place (optimiser steps, ``copy_``, ``load_state_dict``,
    ``.to``), but a write through ``.data`` (what gpytorch's property setters such as
    ``kernel.lengthscale = ...`` do) is not seen there; call :meth:`check_hyperparameters`
    after such a write.

    Gradients: caches are detached, as gpytorch's ``detach_test_caches`` does, so
    gradients with respect to test inputs can be taken any number of times. Under
    ``botorch.settings.propagate_grads(True)`` (which ``qKnowledgeGradient`` sets)
    the posterior is recomputed from the summary on every call and gradients flow to
    the data a model was conditioned on (fantasy inputs).

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
    _num_outputs = 1

    def __init__(
        self,
        support: Tensor,
        summary: SparseSummary,
        covar_module: Kernel,
        likelihood: Likelihood,
        mean_module: Mean | None = None,
        outcome_transform: OutcomeTransform | None = None,
        input_transform: InputTransform | None = None,
        jitter: float | None = None,
    ) -> None:
        r"""
        Args:
            support: ``m x d`` shared support set ``S`` (original input space).
            summary: The sum over clients of their whitened summaries on ``S`` (any
                batch shape; the model's batch shape is the summary's), computed with
                the current values of the modules below.
            covar_module: The shared kernel the summaries were computed with.
            likelihood: The shared ``GaussianLikelihood``.
            mean_module: The shared prior mean; ``None`` is a zero mean.
            outcome_transform: A *trained*, single-output outcome transform that the
                clients applied to their outcomes (e.g. ``Standardize`` built from
                federated moments, see :func:`standardize_from_moments`); posteriors
                are untransformed.
            input_transform: The input transform every party applied (to the support
                and to its data), with fixed coefficients, e.g.
                ``Normalize(d, bounds=bounds)``. Applied to test inputs as
                ``SingleTaskGP`` does.
            jitter: Relative jitter of ``K_SS`` (must match the clients').
        """
        super().__init__()
        validate_support(support)
        if not isinstance(summary, SparseSummary):
            raise TypeError(f"`summary` must be a SparseSummary, got {type(summary).__name__}.")
        _check_summary(summary, support.shape[0])
        if not isinstance(likelihood, GaussianLikelihood):
            raise UnsupportedLikelihoodError(likelihood)
        check_outcome_transform(outcome_transform)
        check_input_transform(input_transform)
        if jitter is not None and not float(jitter) >= 0:
            raise ValueError(f"`jitter` must be non-negative, got {jitter}.")
        self._setup(
            support,
            summary,
            covar_module,
            likelihood,
            mean_module,
            outcome_transform,
            input_transform,
            jitter,
        )
        self.to(device=support.device)
        self.eval()
        summary_factor(self.summary)  # I + A must be positive definite: fail here, not later

    # --- construction from data in one process ------------------------------------
    @classmethod
    def from_client_data(
        cls,
        client_data: Sequence[tuple[Tensor, Tensor]],
        support: Tensor,
        covar_module: Kernel,
        likelihood: Likelihood,
        mean_module: Mean | None = None,
        outcome_transform: OutcomeTransform | None = None,
        input_transform: InputTransform | None = None,
        jitter: float | None = None,
    ) -> FederatedPITCGP:
        r"""Build the model from all clients' data in one process: summarise, sum, build.

        Outcomes and inputs are given in their original spaces, as to
        ``SingleTaskGP``. An untrained outcome transform (e.g. ``Standardize(m=1)``)
        is trained on the pooled outcomes, and a learnable input transform (e.g.
        ``Normalize(d)``) learns its coefficients from the pooled inputs (a copy, with
        learning then switched off), exactly as ``SingleTaskGP`` would on the pooled
        data; in a real federation nobody holds the pooled data -- use
        :func:`standardize_from_moments` and transforms with fixed coefficients.

        Args:
            client_data: One ``(train_X, train_Y)`` pair per client (``n_i x d``,
                ``n_i x 1``), untransformed.
            support: ``m x d`` shared support set.
            covar_module: The shared kernel.
            likelihood: The shared ``GaussianLikelihood``.
            mean_module: The shared prior mean (``None``: zero).
            outcome_transform: Outcome transform (trained or not, see above).
            input_transform: Input transform (fixed or learnable, see above).
            jitter: Relative jitter of ``K_SS``.

        Returns:
            The federated model.
        """
        client_data = _check_client_data(client_data)
        validate_support(support)
        if input_transform is not None and _learns(input_transform):
            # learn (a copy of) the transform on the pooled inputs, then freeze it
            input_transform = deepcopy(input_transform)
            input_transform.train()
            input_transform(torch.cat([X for X, _ in client_data], dim=-2).to(torch.float64))
            for module in input_transform.modules():
                if getattr(module, "learn_coefficients", False):
                    # torch types Module.__setattr__'s value as Tensor | Module only
                    module.learn_coefficients = False  # type: ignore[assignment]
            input_transform.eval()
        if outcome_transform is not None:
            if _untrained(outcome_transform):
                outcome_transform.train()
                outcome_transform(torch.cat([Y for _, Y in client_data], dim=-2))
            outcome_transform.eval()
        check_outcome_transform(outcome_transform)
        check_input_transform(input_transform)
        with torch.no_grad():
            _, L = support_factor(support, covar_module, jitter, input_transform)
            summaries = []
            for i, (X, Y) in enumerate(transform_outcomes(client_data, outcome_transform)):
                try:
                    summary = compute_local_summary(
                        X,
                        Y,
                        support,
                        covar_module,
                        likelihood,
                        mean_module,
                        support_chol=L,
                        input_transform=input_transform,
                    )
                except (InputDataError, BotorchTensorDimensionError, UnsupportedError) as e:
                    raise type(e)(f"client_data[{i}]: {e}") from e
                summaries.append(summary)
        return cls(
            support,
            SparseSummary.sum(summaries),
            covar_module,
            likelihood,
            mean_module,
            outcome_transform,
            input_transform,
            jitter,
        )

    # --- prediction ---------------------------------------------------------------
    def _check_X(self, X: Tensor, d: int, name: str = "X") -> None:
        if not isinstance(X, Tensor):
            raise TypeError(f"`{name}` must be a Tensor, got {type(X).__name__}.")
        if X.ndim < 2 or X.shape[-1] != d:
            raise BotorchTensorDimensionError(
                f"`{name}` must be `batch_shape x q x d` with d={d}, got shape {tuple(X.shape)}."
            )
        if not X.is_floating_point():
            raise InputDataError(f"`{name}` must be floating point, got {X.dtype}.")
        try:
            torch.broadcast_shapes(X.shape[:-2], self.batch_shape)
        except RuntimeError as e:
            raise BotorchTensorDimensionError(
                f"The batch shape {tuple(X.shape[:-2])} of `{name}` does not broadcast "
                f"with the model's batch shape {tuple(self.batch_shape)}."
            ) from e
        if X.device.type == "cpu" and not torch.isfinite(X).all():
            raise InputDataError(f"`{name}` contains NaN or infinite values.")

    def _factors(self) -> tuple[Tensor, ...]:
        r"""The factors of :meth:`_predict_from`, checked against the modules' state:
        ``(S, L_S, L_B, v)`` (see :meth:`_support_factor`, :meth:`_summary_factor`)."""
        return (*self._support_factor(), *self._summary_factor())

    def _predict(self, X: Tensor) -> tuple[Tensor, Tensor]:
        r"""Latent float64 mean (``batch x q``) and covariance (``batch x q x q``) at
        transformed inputs ``X``."""
        return self._predict_from(self._factors(), X)

    def _predict_from(
        self, factors: tuple[Tensor, ...], X: Tensor, diag: bool = False
    ) -> tuple[Tensor, Tensor]:
        r""":meth:`_predict` from given :meth:`_factors` (no state check); with
        ``diag``, the variances (``batch x q``) instead of the covariance."""
        S, L_S, L_B, v = factors
        X64 = X.to(torch.float64)
        K_SU = evaluate64(self.covar_module, S.expand(*X64.shape[:-2], *S.shape), X64)
        W = torch.linalg.solve_triangular(L_S, K_SU, upper=False)
        C = torch.linalg.solve_triangular(L_B, W, upper=False)
        mean = evaluate64(self.mean_module, X64) + (C * v.unsqueeze(-1)).sum(dim=-2)
        if diag:
            prior = prior_variance64(self.covar_module, X64)
            return mean, prior - W.pow(2).sum(dim=-2) + C.pow(2).sum(dim=-2)
        cov = evaluate64(self.covar_module, X64, X64) - W.mT @ W + C.mT @ C
        return mean, 0.5 * (cov + cov.mT)

    @staticmethod
    def _mvn(mean: Tensor, cov: Tensor, dtype: torch.dtype) -> MultivariateNormal:
        batch_shape = torch.broadcast_shapes(mean.shape[:-1], cov.shape[:-2])
        mean = mean.expand(*batch_shape, mean.shape[-1]).to(dtype)
        cov = cov.expand(*batch_shape, *cov.shape[-2:]).to(dtype)  # fantasies share one
        # A lazy covariance, as ExactGP returns: no eager Cholesky of a q x q matrix
        # that may be singular (repeated test points); samplers add jitter when needed.
        return MultivariateNormal(mean, DenseLinearOperator(cov))

    def forward(self, X: Tensor) -> MultivariateNormal:
        r"""The latent posterior at inputs in the model's (transformed) input space.

        As for BoTorch's exact GPs in eval mode, ``model(X)`` takes ``X`` already
        input-transformed and returns the latent distribution in the
        outcome-transformed space (no noise, no untransform); GIBBON
        (``qLowerBoundMaxValueEntropy``) uses it for ``q > 1``.

        Args:
            X: ``batch_shape x q x d`` transformed inputs.

        Returns:
            A ``MultivariateNormal`` with a full ``q x q`` covariance.
        """
        S, _ = self._support_factor()
        self._check_X(X, S.shape[-1])
        mean, cov = self._predict(X)
        return self._mvn(mean, cov, X.dtype)

    # Model.posterior's signature, which BoTorch's FantasizeMixin.posterior (``X, *args``)
    # does not admit: every BoTorch GP that fantasizes overrides both alike
    def posterior(  # type: ignore[override]
        self,
        X: Tensor,
        output_indices: list[int] | None = None,
        observation_noise: bool | Tensor = False,
        posterior_transform: PosteriorTransform | None = None,
    ) -> Posterior:
        r"""The dPITC predictive distribution (eq. 9-10 of [FBO-FedGP]).

        Args:
            X: ``batch_shape x q x d`` test inputs in the original input space
                (``batch_shape`` broadcasts with the model's batch shape).
            output_indices: ``None`` or ``[0]`` (single output).
            observation_noise: If True, add the likelihood's noise; if a tensor
                (outcome-transformed space), add it: a 0-dim tensor, or one of shape
                ``batch_shape x q x 1`` (broadcastable).
            posterior_transform: An optional posterior transform.

        Returns:
            A ``GPyTorchPosterior`` with the full ``q x q`` covariance, in the dtype of
            ``X`` (or the transformed posterior).
        """
        self.eval()
        _check_output_indices(output_indices)
        self._check_X(X, self.support.shape[-1])
        # transformed in float64 (BoTorch's transforms cast their buffers to X's dtype)
        mean, cov = self._predict(self.transform_inputs(X.to(torch.float64)))
        if observation_noise is True:
            noise = noise64(self.likelihood)
            cov = cov + torch.diag_embed(noise * torch.ones_like(mean))
        elif isinstance(observation_noise, Tensor):
            cov = cov + torch.diag_embed(_noise_diagonal(observation_noise, mean))
        elif observation_noise is not False:
            raise ValueError(
                f"`observation_noise` must be a bool or a Tensor, got {observation_noise!r}."
            )
        posterior: Posterior = GPyTorchPosterior(distribution=self._mvn(mean, cov, X.dtype))
        if hasattr(self, "outcome_transform"):
            posterior = self.outcome_transform.untransform_posterior(posterior, X=X)
        if posterior_transform is not None:
            return posterior_transform(posterior=posterior, X=X)
        return posterior

    def subset_output(self, idcs: list[int]) -> FederatedPITCGP:
        r"""The model itself for ``idcs == [0]`` (its only output).

        Args:
            idcs: The output indices.

        Returns:
            ``self``.
        """
        _check_output_indices(idcs)
        return self

    # no ``**kwargs``, unlike Model's signature: an unknown keyword raises, not ignored
    def condition_on_observations(  # type: ignore[override]
        self, X: Tensor, Y: Tensor, noise: Tensor | None = None
    ) -> FederatedPITCGP:
        r"""Add ``(X, Y)`` as one more PITC block (a rank update of the summary).

        Args:
            X: ``batch_shape x n' x d`` new inputs (original input space).
            Y: ``batch_shape' x n' x 1`` new outcomes (original outcome space);
                ``batch_shape'`` broadcasts with ``batch_shape``, e.g.
                ``num_fantasies x batch_shape`` when fantasizing.
            noise: Optional ``batch_shape x n' x 1`` observation noise variances
                (outcome-transformed space); default: the likelihood's noise.

        Returns:
            A new ``FederatedPITCGP`` (sharing this model's modules and support
            factorisation) with batch shape ``broadcast(model batch, batch_shape')``;
            differentiable in ``X``, ``Y`` under ``propagate_grads``.
        """
        self.eval()
        self._check_X(X, self.support.shape[-1])
        self._check_observations(X, Y, noise)
        S, L_S = self._support_factor()
        X64 = X.to(torch.float64)
        if hasattr(self, "outcome_transform"):
            Y, _ = self.outcome_transform(Y.to(torch.float64), X=X64)
        if X.shape[-2] == 0:  # BoTorch's fantasize with no points: the same model
            batch = torch.broadcast_shapes(self.batch_shape, X.shape[:-2], Y.shape[:-2])
            m = S.shape[0]
            zeros = [
                torch.zeros(*batch, *tail, dtype=torch.float64, device=S.device)
                for tail in ((m,), (m, m), (), (), ())
            ]
            return self._derived(self.summary + SparseSummary(*zeros))
        block = local_summary(
            self.transform_inputs(X64),
            Y,
            S,
            L_S,
            self.covar_module,
            self.likelihood,
            self.mean_module,
            train_Yvar=noise,
        )
        return self._derived(self.summary + block)

    def _check_observations(self, X: Tensor, Y: Tensor, noise: Tensor | None) -> None:
        n = X.shape[-2]
        if not isinstance(Y, Tensor) or Y.ndim < 2 or Y.shape[-2] != n:
            shape = tuple(Y.shape) if isinstance(Y, Tensor) else type(Y).__name__
            raise BotorchTensorDimensionError(
                f"`Y` must be `batch_shape x n x 1` with n={n} as `X`, got {shape}."
            )
        if Y.shape[-1] != 1:
            raise UnsupportedError(
                f"`Y` has {Y.shape[-1]} outputs: FederatedPITCGP models a single output."
            )
        tensors = {"Y": Y}
        if noise is not None:
            if not isinstance(noise, Tensor):
                raise TypeError(f"`noise` must be a Tensor or None, got {type(noise).__name__}.")
            if noise.ndim < 2 or noise.shape[-1] != 1 or noise.shape[-2] not in (n, 1):
                raise BotorchTensorDimensionError(
                    f"`noise` must be `batch_shape x n x 1` with n={n}, got shape "
                    f"{tuple(noise.shape)}."
                )
            tensors["noise"] = noise
        for name, t in tensors.items():
            try:
                torch.broadcast_shapes(t.shape[:-2], X.shape[:-2], self.batch_shape)
            except RuntimeError as e:
                raise BotorchTensorDimensionError(
                    f"The batch shape {tuple(t.shape[:-2])} of `{name}` does not broadcast "
                    f"with those of `X` {tuple(X.shape[:-2])} and of the model "
                    f"{tuple(self.batch_shape)}."
                ) from e
            if self._reads_are_free() and not torch.isfinite(t).all():
                raise InputDataError(f"`{name}` contains NaN or infinite values.")
        if noise is not None and self._reads_are_free() and (noise <= 0).any():
            raise InputDataError("`noise` (observation noise variances) must be positive.")

    def _derived(self, summary: SparseSummary) -> FederatedPITCGP:
        r"""A model with the same modules, support and snapshot, and a new summary
        (no re-validation, the support factorisation is shared)."""
        new = object.__new__(type(self))
        super(FederatedPITCGP, new).__init__()
        # copies: a later in-place change of this model's state (load_state_dict) must
        # not move the derived model's record of what its summary was computed with
        new._setup(
            self.support.clone(),
            summary,
            self.covar_module,
            self.likelihood,
            self.mean_module,
            getattr(self, "outcome_transform", None),
            getattr(self, "input_transform", None),
            self.summary_jitter.clone(),
            snapshot=self.summary_hyperparameters.clone(),
            structure=self.summary_structure.clone(),
        )
        new.train(self.training)
        if "support" in self._cache:
            new._ensure_current()
            new._cache["support"] = self._cache["support"]
        return new

    # --- fitting --------------------------------------------------------------------
    def custom_fit(self, mll: MarginalLogLikelihood, **kwargs: Any) -> MarginalLogLikelihood:
        r"""What ``botorch.fit.fit_gpytorch_mll`` calls for this model.

        The model holds no training data, so it is fitted through a
        :class:`~botorch_fed.models.pitc_mll.PITCMarginalLogLikelihood`, which holds
        the clients' data in one process (simulations, tests, tutorials) and optimises
        the same objective as
        :func:`~botorch_fed.protocol.federated_fit.fit_federated_pitc`, which a
        federation uses.

        Args:
            mll: A ``PITCMarginalLogLikelihood`` of this model.
            **kwargs: Passed to BoTorch's generic fitting routine.

        Returns:
            The fitted ``mll`` (its model then holds a summary at the fitted values).
        """
        from botorch.fit import _fit_fallback

        from botorch_fed.models.pitc_mll import PITCMarginalLogLikelihood

        if not isinstance(mll, PITCMarginalLogLikelihood):
            raise UnsupportedError(
                f"fit_gpytorch_mll got a {type(mll).__name__} for a FederatedPITCGP, which "
                "holds no training data. With all clients' data in one process fit "
                "PITCMarginalLogLikelihood(model.likelihood, model, client_data); in a "
                "federation use botorch_fed.protocol.federated_fit.fit_federated_pitc and "
                "rebuild the model from fresh summaries."
            )
        if mll.model is not self:
            raise ValueError("`mll.model` is not this model.")
        return _fit_fallback(mll, **kwargs)
