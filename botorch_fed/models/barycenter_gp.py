r"""The central model of Co-KG: a GP whose values on a support are a Wasserstein barycenter.

Each of ``N`` agents sends its GP posterior on a shared finite support ``S`` (``s``
points): a mean ``m_n`` and a latent covariance ``C_n``. The central model of [Co-KG]
(slides 12-13) is their 2-Wasserstein barycenter ``f_S ~ N(m_c, K_c)`` with
``m_c = sum_n w_n m_n`` and ``K_c`` the Bures-Wasserstein barycenter of the ``C_n``
(:func:`~botorch_fed.models.barycenter.bures_wasserstein_barycenter`).

:class:`BarycenterGP` makes that a BoTorch ``Model`` on the whole domain: off the
support, ``f`` is predicted by Gaussian conditioning on the support values under the
shared prior (a constant mean ``mu_0`` and the kernel ``k``),

    ``f(X) | f_S ~ N(mu_0 + k_XS K_SS^-1 (f_S - mu_0), k_XX - k_XS K_SS^-1 k_SX)``,

and integrating ``f_S`` out gives the GP with

    ``mean(X) = mu_0 + k_XS K_SS^-1 (m_c - mu_0)``,
    ``cov(X, X') = k(X, X') - k_XS K_SS^-1 (K_SS - K_c) K_SS^-1 k_SX'``,

which equals ``N(m_c, K_c)`` on the support and is continuous in ``X``. With ``N = 1``
it is one agent's discretised posterior (what a server knows of a local model). New
observations (``condition_on_observations``, ``fantasize``) condition this GP exactly,
so BoTorch's knowledge gradient and its fantasy-based acquisitions work on it.

The cached parts the model predicts from (and their numerics) are those of its base
class, :class:`~botorch_fed.models.whitened_barycenter.WhitenedBarycenter`. The model
stays float64 under ``.to(dtype)`` and never casts the kernel it was given (BoTorch's
acquisition functions call ``.to(X)``); predictions come back in ``X``'s dtype.

References:

.. [Co-KG] Collaborative Bayesian optimisation via Wasserstein barycenters (paper 001
   in ``shared/papers``), Proposition 1 and Algorithm 1.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
from botorch.acquisition.objective import PosteriorTransform
from botorch.exceptions.errors import (
    BotorchTensorDimensionError,
    InputDataError,
    UnsupportedError,
)
from botorch.exceptions.warnings import InputDataWarning
from botorch.models.model import FantasizeMixin, Model
from botorch.posteriors.gpytorch import GPyTorchPosterior
from botorch.posteriors.posterior import Posterior
from gpytorch import settings as gpytorch_settings
from gpytorch.distributions import MultivariateNormal
from gpytorch.kernels import Kernel
from gpytorch.likelihoods import FixedNoiseGaussianLikelihood
from linear_operator.operators import DenseLinearOperator
from linear_operator.utils.cholesky import psd_safe_cholesky
from torch import Tensor

from botorch_fed.models.barycenter import bures_wasserstein_barycenter
from botorch_fed.models.pitc_inputs import _noise_diagonal
from botorch_fed.models.whitened_barycenter import WhitenedBarycenter, _quadratic


def _positive_scalar(value: Any, name: str) -> Tensor:
    t = torch.as_tensor(value, dtype=torch.float64).detach()
    if t.numel() != 1 or not torch.isfinite(t).all() or float(t) <= 0:
        raise ValueError(f"`{name}` must be one positive finite number, got {value!r}.")
    return t.reshape(())


class BarycenterGP(WhitenedBarycenter, FantasizeMixin):
    r"""The Wasserstein barycenter of agents' GP posteriors on a support, as a BoTorch GP.

    See the module docstring for the model. ``posterior`` returns the full ``q x q``
    covariance in the dtype of ``X`` (computed in float64); ``observation_noise=True``
    adds ``noise``; ``condition_on_observations`` / ``fantasize`` return a model with
    batch shape ``num_fantasies x batch`` conditioned exactly on the new points, so
    ``qKnowledgeGradient`` and ``optimize_acqf`` work. Values are in the agents' outcome
    units; there are no input or outcome transforms (the support is in the model's
    input space).

    Example:
        >>> model = BarycenterGP(S, means, covariances, covar_module, noise=1e-3)
        >>> model.posterior(S.unsqueeze(0)).mean  # the barycenter mean on the support
    """

    _num_outputs = 1

    def __init__(
        self,
        support: Tensor,
        means: Tensor,
        covariances: Tensor,
        covar_module: Kernel,
        weights: Tensor | None = None,
        noise: float | Tensor = 1e-4,
        mean_constant: float | Tensor = 0.0,
        barycenter_init: Tensor | None = None,
        jitter: float = 1e-8,
        rank_tol: float = 1e-6,
        max_iter: int = 500,
        tol: float = 1e-7,
    ) -> None:
        r"""
        Args:
            support: ``s x d`` support points (the model's input space).
            means: ``N x s`` agents' posterior means on the support.
            covariances: ``N x s x s`` agents' latent posterior covariances on the
                support (symmetric PSD, no observation noise).
            covar_module: The shared prior kernel (used off the support only). The
                model holds it, not a copy: if its hyperparameters change, predictions
                follow.
            weights: ``N`` non-negative weights summing to one (``None``: uniform;
                see :func:`agent_weights`).
            noise: Observation noise variance of new observations
                (``observation_noise=True``, ``fantasize``).
            mean_constant: The prior mean used off the support.
            barycenter_init: ``s x s`` warm start of the barycenter iteration (the
                previous round's ``barycenter_covariance``).
            jitter: Added to ``K_SS``'s diagonal, relative to its largest entry.
            rank_tol: Relative eigenvalue cut-off of the barycenter's numerical range
                and of the whitened information (see the module docstring).
            max_iter: Maximum barycenter iterations.
            tol: Relative convergence tolerance of the barycenter iteration. Posterior
                covariances on a grid are ill conditioned (up to ``1 / rank_tol`` on
                their range), which puts the iteration's rounding floor near ``1e-9``:
                a smaller ``tol`` runs into ``max_iter``.
        """
        super().__init__()
        if not isinstance(support, Tensor) or support.ndim != 2 or support.shape[0] < 1:
            shape = tuple(support.shape) if isinstance(support, Tensor) else type(support).__name__
            raise BotorchTensorDimensionError(f"`support` must be an `s x d` tensor, got {shape}.")
        if not support.is_floating_point() or not torch.isfinite(support).all():
            raise InputDataError("`support` must be a finite floating-point tensor.")
        if not isinstance(means, Tensor) or means.ndim != 2:
            raise BotorchTensorDimensionError(
                "`means` must be an `N x s` tensor (one row per agent), got "
                f"{tuple(means.shape) if isinstance(means, Tensor) else type(means).__name__}."
            )
        s = support.shape[0]
        if means.shape[0] == 0:
            raise ValueError("`means` holds no agents (N = 0): a barycenter needs at least one.")
        if means.shape[-1] != s:
            raise BotorchTensorDimensionError(
                f"`means` lives on {means.shape[-1]} points but `support` has {s}: the agents "
                "must send their posteriors on the shared support."
            )
        if not isinstance(covar_module, Kernel):
            raise TypeError(
                f"`covar_module` must be a gpytorch Kernel, got {type(covar_module).__name__}."
            )
        if not (isinstance(jitter, int | float) and not isinstance(jitter, bool) and jitter > 0):
            raise ValueError(f"`jitter` must be a positive number, got {jitter!r}.")
        if not (isinstance(rank_tol, int | float) and 0 <= rank_tol < 1):
            raise ValueError(f"`rank_tol` must be a number in [0, 1), got {rank_tol!r}.")
        mean_c, cov_c = bures_wasserstein_barycenter(
            means.detach().to(torch.float64),
            covariances.detach().to(torch.float64),
            weights=weights,
            init=barycenter_init,
            max_iter=max_iter,
            tol=tol,
            rank_tol=float(rank_tol),
        )  # validates shapes, PSD covariances, weights
        N = means.shape[0]
        if weights is None:
            w = torch.full((N,), 1.0 / N, dtype=torch.float64)
        else:
            w = torch.as_tensor(weights).detach().to(torch.float64)
            w = w / w.sum()
        with torch.no_grad(), gpytorch_settings.lazily_evaluate_kernels(False):
            prior_var = covar_module(support.to(torch.float64), diag=True).detach()
        largest = float(covariances.detach().diagonal(dim1=-2, dim2=-1).max())
        if largest > 10 * float(prior_var.max()):
            warnings.warn(
                f"The agents' posterior variances (up to {largest:.3g}) exceed the prior "
                f"variance of `covar_module` (up to {float(prior_var.max()):.3g}) tenfold: "
                "are the kernel and the posteriors in the same outcome units (e.g. a kernel "
                "of a standardised model with posteriors in original units)? Off the support "
                "the model conditions under this kernel.",
                InputDataWarning,
                stacklevel=2,
            )
        constant = torch.as_tensor(mean_constant, dtype=torch.float64).detach()
        if constant.numel() != 1 or not torch.isfinite(constant).all():
            raise ValueError(f"`mean_constant` must be one finite number, got {mean_constant!r}.")
        device = support.device
        self.register_buffer("support", support.detach().to(torch.float64).clone())
        self.register_buffer("barycenter_mean", mean_c.to(device))
        self.register_buffer("barycenter_covariance", cov_c.to(device))
        self.register_buffer("weights", w.to(device))
        self.register_buffer("means", means.detach().to(device, torch.float64).clone())
        self.register_buffer("covariances", covariances.detach().to(device, torch.float64).clone())
        self.register_buffer("mean_constant", constant.reshape(()).to(device))
        self.covar_module = covar_module
        self.likelihood = FixedNoiseGaussianLikelihood(
            noise=_positive_scalar(noise, "noise").reshape(1).to(device)
        )
        self._jitter = float(jitter)
        self._rank_tol = float(rank_tol)
        self._observations: tuple[Tensor, Tensor, Tensor] | None = None
        self._cache: dict[str, Any] = {}

    # --- state ------------------------------------------------------------------------
    @property
    def num_outputs(self) -> int:
        r"""One output."""
        return self._num_outputs

    @property
    def noise(self) -> Tensor:
        r"""The observation noise variance (0-dim float64)."""
        return self.likelihood.noise.detach().reshape(-1)[0].to(torch.float64)

    @property
    def num_agents(self) -> int:
        r"""``N``, the number of posteriors in the barycenter."""
        return int(self.weights.shape[0])

    @property
    def batch_shape(self) -> torch.Size:
        r"""``torch.Size([])``, or the batch shape of the observations conditioned on."""
        if self._observations is None:
            return torch.Size([])
        return self._observations[1].shape[:-1]  # the outcomes carry the full batch

    def agent_models(self) -> list[BarycenterGP]:
        r"""The agents' own discretised posteriors as ``N`` one-agent models (with this
        model's support, kernel, noise and prior mean; not conditioned on anything this
        model was conditioned on). Co-KG's local models.

        Returns:
            ``N`` ``BarycenterGP`` with ``num_agents == 1``.
        """
        if self._observations is not None:
            raise UnsupportedError("`agent_models` of a conditioned BarycenterGP is undefined.")
        return [
            BarycenterGP(
                self.support,
                self.means[n : n + 1],
                self.covariances[n : n + 1],
                self.covar_module,
                noise=self.noise,
                mean_constant=self.mean_constant,
                jitter=self._jitter,
                rank_tol=self._rank_tol,
            )
            for n in range(self.num_agents)
        ]

    # --- prediction -------------------------------------------------------------------
    def _check_X(self, X: Tensor, name: str = "X") -> None:
        d = self.support.shape[-1]
        if not isinstance(X, Tensor) or X.ndim < 2 or X.shape[-1] != d:
            shape = tuple(X.shape) if isinstance(X, Tensor) else type(X).__name__
            raise BotorchTensorDimensionError(
                f"`{name}` must be `batch_shape x q x d` with d={d}, got {shape}."
            )
        if X.device.type == "cpu" and not torch.isfinite(X).all():
            raise InputDataError(f"`{name}` contains NaN or infinite values.")

    def _predict(self, X: Tensor) -> tuple[Tensor, Tensor]:
        r"""Latent mean ``batch x q`` and covariance ``batch x q x q`` at float64 ``X``.

        Conditioned models keep the observed inputs at their own batch shape (fantasies
        share them), so the ``s``-sized products run once per input batch, not once per
        fantasy."""
        parts = self._prior_parts()
        mean_x, cov_xx, Fx = self._base(X, parts)
        if self._observations is None:
            return mean_x, cov_xx
        Xo, Yo, noise = self._observations
        mean_o, cov_oo, Fo = self._base(Xo, parts)
        batch = torch.broadcast_shapes(X.shape[:-2], Xo.shape[:-2])
        Kxo = self._kernel(X.expand(*batch, *X.shape[-2:]), Xo.expand(*batch, *Xo.shape[-2:]))
        cov_xo = Kxo - _quadratic(Fx, Fo, parts[2])
        L = psd_safe_cholesky(cov_oo + torch.diag_embed(noise))
        A = torch.linalg.solve_triangular(L, cov_xo.transpose(-1, -2), upper=False)
        r = torch.linalg.solve_triangular(L, (Yo - mean_o).unsqueeze(-1), upper=False)
        mean = mean_x + (A.transpose(-1, -2) @ r).squeeze(-1)
        cov = cov_xx - A.transpose(-1, -2) @ A
        return mean, cov

    def support_mean_and_cross_covariance(self, support: Tensor, X: Tensor) -> Any:
        r"""The latent mean on ``support`` and the covariances between ``X`` and it,
        without the ``s x s`` block of a joint posterior (the discrete mode of
        :class:`~botorch_fed.acquisition.qCoKnowledgeGradient` uses it).

        Args:
            support: ``s x d`` points.
            X: ``B x q x d`` points.

        Returns:
            ``(mean, cross)``: ``s`` and ``B x q x s`` (dtype of ``X``), or
            ``NotImplemented`` for a conditioned model (the caller then uses joint
            posteriors).
        """
        if self._observations is not None:
            return NotImplemented
        self._check_X(support, "support")
        self._check_X(X)
        parts = self._prior_parts()
        S = support.to(torch.float64)
        X64 = X.to(torch.float64)
        mean_S, F_S = self._support_features(S, parts)
        _, F_X = self._support_features(X64, parts)
        K = self._kernel(X64, S.expand(*X64.shape[:-2], *S.shape))
        cross = K - _quadratic(F_X, F_S, parts[2])
        return mean_S.to(X.dtype), cross.to(X.dtype)

    def forward(self, X: Tensor) -> MultivariateNormal:
        r"""The latent distribution at ``batch_shape x q x d`` inputs (as ``model(X)`` of
        BoTorch's GPs in eval mode; GIBBON uses it for ``q > 1``).

        Returns:
            A ``MultivariateNormal`` with a full ``q x q`` covariance.
        """
        self._check_X(X)
        mean, cov = self._predict(X.to(torch.float64))
        return MultivariateNormal(mean.to(X.dtype), DenseLinearOperator(cov.to(X.dtype)))

    # Model.posterior's signature, which BoTorch's FantasizeMixin.posterior (``X, *args``)
    # does not admit: every BoTorch GP that fantasizes overrides both alike
    def posterior(  # type: ignore[override]
        self,
        X: Tensor,
        output_indices: list[int] | None = None,
        observation_noise: bool | Tensor = False,
        posterior_transform: PosteriorTransform | None = None,
        **kwargs: Any,
    ) -> Posterior:
        r"""The barycenter GP's predictive distribution.

        Args:
            X: ``batch_shape x q x d`` test inputs (``batch_shape`` broadcasts with
                the model's batch shape).
            output_indices: ``None`` or ``[0]`` (one output).
            observation_noise: If True, add ``noise``; if a tensor, add it (0-dim or
                broadcastable to ``batch_shape x q x 1``).
            posterior_transform: An optional posterior transform.

        Returns:
            A ``GPyTorchPosterior`` with the full ``q x q`` covariance, in the dtype of
            ``X`` (or the transformed posterior).
        """
        if output_indices is not None and list(output_indices) != [0]:
            raise UnsupportedError(
                f"`output_indices`={list(output_indices)}: BarycenterGP has one output (0)."
            )
        self._check_X(X)
        mean, cov = self._predict(X.to(torch.float64))
        if observation_noise is True:
            cov = cov + torch.diag_embed(self.noise.to(cov.device) * torch.ones_like(mean))
        elif isinstance(observation_noise, Tensor):
            cov = cov + torch.diag_embed(_noise_diagonal(observation_noise, mean))
        elif observation_noise is not False:
            raise ValueError(
                f"`observation_noise` must be a bool or a Tensor, got {observation_noise!r}."
            )
        batch = torch.broadcast_shapes(mean.shape[:-1], cov.shape[:-2])
        mvn = MultivariateNormal(
            mean.expand(*batch, mean.shape[-1]).to(X.dtype),
            DenseLinearOperator(cov.expand(*batch, *cov.shape[-2:]).to(X.dtype)),
        )
        posterior = GPyTorchPosterior(distribution=mvn)
        if posterior_transform is not None:
            return posterior_transform(posterior)
        return posterior

    def subset_output(self, idcs: list[int]) -> BarycenterGP:
        r"""The model itself for ``idcs == [0]`` (its only output)."""
        if list(idcs) != [0]:
            raise UnsupportedError(f"`idcs`={list(idcs)}: BarycenterGP has one output (0).")
        return self

    # --- conditioning -----------------------------------------------------------------
    def condition_on_observations(
        self, X: Tensor, Y: Tensor, noise: Tensor | None = None, **kwargs: Any
    ) -> BarycenterGP:
        r"""Condition on new observations ``Y = f(X) + noise`` (exact GP conditioning).

        Args:
            X: ``batch_shape x n' x d`` new inputs.
            Y: ``batch_shape' x n' x 1`` new outcomes; ``batch_shape'`` broadcasts with
                ``batch_shape`` and the model's (``num_fantasies x batch_shape`` when
                fantasizing).
            noise: Optional ``batch_shape x n' x 1`` noise variances (default: the
                model's ``noise``).

        Returns:
            A new ``BarycenterGP`` sharing this model's support, barycenter and kernel,
            with batch shape ``broadcast(model batch, batch_shape')``; differentiable in
            ``X`` and ``Y``.
        """
        self._check_X(X)
        n = X.shape[-2]
        if not isinstance(Y, Tensor) or Y.ndim < 2 or Y.shape[-2] != n:
            shape = tuple(Y.shape) if isinstance(Y, Tensor) else type(Y).__name__
            raise BotorchTensorDimensionError(
                f"`Y` must be `batch_shape x n x 1` with n={n} as `X`, got {shape}."
            )
        if Y.shape[-1] != 1:
            raise UnsupportedError(f"`Y` has {Y.shape[-1]} outputs: BarycenterGP has one.")
        if Y.device.type == "cpu" and not torch.isfinite(Y).all():
            raise InputDataError("`Y` contains NaN or infinite values.")
        Y64 = Y.to(torch.float64).squeeze(-1)
        if noise is None:
            nz = self.noise.to(Y64.device).expand(n)
        else:
            if not isinstance(noise, Tensor) or noise.ndim < 2 or noise.shape[-1] != 1:
                raise BotorchTensorDimensionError(
                    f"`noise` must be `batch_shape x n x 1`, got "
                    f"{tuple(noise.shape) if isinstance(noise, Tensor) else type(noise).__name__}."
                )
            nz = noise.to(torch.float64).squeeze(-1)
            if nz.device.type == "cpu" and (not torch.isfinite(nz).all() or (nz <= 0).any()):
                raise InputDataError("`noise` (observation noise variances) must be positive.")
        X64 = X.to(torch.float64)
        try:
            batch = torch.broadcast_shapes(X64.shape[:-2], Y64.shape[:-1], nz.shape[:-1])
            if self._observations is not None:
                batch = torch.broadcast_shapes(batch, self._observations[1].shape[:-1])
        except RuntimeError as e:
            raise BotorchTensorDimensionError(
                f"The batch shapes of `X` {tuple(X.shape[:-2])}, `Y` {tuple(Y.shape[:-2])} and "
                f"the model {tuple(self.batch_shape)} do not broadcast."
            ) from e
        # inputs and noise keep their own batch shapes (fantasies share them); the
        # outcomes carry the model's batch shape
        Y64 = Y64.expand(*batch, n)
        if self._observations is not None:
            Xo, Yo, No = self._observations
            x_batch = torch.broadcast_shapes(Xo.shape[:-2], X64.shape[:-2])
            n_batch = torch.broadcast_shapes(No.shape[:-1], nz.shape[:-1])
            X64 = torch.cat(
                [Xo.expand(*x_batch, *Xo.shape[-2:]), X64.expand(*x_batch, *X64.shape[-2:])], -2
            )
            Y64 = torch.cat([Yo.expand(*batch, Yo.shape[-1]), Y64], dim=-1)
            nz = torch.cat([No.expand(*n_batch, No.shape[-1]), nz.expand(*n_batch, n)], -1)
        new = object.__new__(type(self))
        Model.__init__(new)
        for name in (
            "support",
            "barycenter_mean",
            "barycenter_covariance",
            "weights",
            "means",
            "covariances",
        ):
            new.register_buffer(name, getattr(self, name))
        new.register_buffer("mean_constant", self.mean_constant)
        new.covar_module = self.covar_module
        new.likelihood = self.likelihood
        new._jitter = self._jitter
        new._rank_tol = self._rank_tol
        new._observations = (X64, Y64, nz)
        new._cache = self._cache  # same support, barycenter and kernel: same parts
        new.train(self.training)
        return new

    def _apply(self, fn, recurse: bool = True) -> BarycenterGP:
        r"""``.to``, ``.float()``, ``.double()``, ... (which BoTorch's acquisition functions
        call with their inputs' dtype): the model's tensors follow the device but stay
        float64, and the shared kernel is not touched (it is the caller's module; move
        it yourself)."""
        kernel = self._modules.pop("covar_module", None)
        likelihood = self._modules.pop("likelihood", None)
        kept = {n: t for n, t in self._buffers.items() if t is not None}
        try:
            super()._apply(fn, recurse)
        finally:
            if kernel is not None:
                self._modules["covar_module"] = kernel
            if likelihood is not None:
                self._modules["likelihood"] = likelihood
        if kept:
            first = next(iter(kept.values()))
            device = fn(torch.zeros((), dtype=torch.float64, device=first.device)).device
            for n, t in kept.items():
                self._buffers[n] = t.to(device=device)
            if likelihood is not None:
                likelihood.to(device=device)  # its noise stays float64
            observations = getattr(self, "_observations", None)
            if observations is not None:
                self._observations = tuple(t.to(device=device) for t in observations)
        # no cache reset: BoTorch's acquisitions call .to(X) on every evaluation, and the
        # cache's fingerprint (the buffers' storage) already changes when a buffer moves
        return self

    # BoTorch transforms stored training inputs on eval(); this model has none.
    def _set_transformed_inputs(self) -> None:
        return None

    def _revert_to_original_inputs(self) -> None:
        return None


__all__ = ["BarycenterGP"]
