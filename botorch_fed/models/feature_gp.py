r"""The feature-space GP surrogate of LDP-ATA-GP-UCB and MoMA-GP-UCB ([LDP-BO]).

Given a finite feature map ``phi`` (a :class:`~botorch_fed.models.nystrom.NystromEmbedding`),
an estimate ``theta`` (``m``) and the Gram matrix of the plays' features
``Phi' Phi`` (``m x m``), [LDP-BO] Alg. 1 lines 12-13 and Alg. 3 lines 13-14 use

    ``mu~(x) = phi(x)' theta``,
    ``k~(x, x') = k(x, x') - phi(x)' phi(x') + lam phi(x)' V^{-1} phi(x')``,
    ``V = Phi' Phi + lam I``,

whose diagonal is the ``sigma~^2`` of the algorithms. With ``theta = V^{-1} Phi' y`` (the
ridge estimate, :meth:`FeatureSpaceGP.ridge`) and a dictionary spanning the training
inputs, these are exactly the GP posterior mean and covariance of eqs. (2)-(3) with
noise variance ``lam``: ``k(x, x') - phi(x)' phi(x')`` is the part of the kernel the
features miss (zero on the span of the dictionary), and ``lam phi' V^{-1} phi'`` is the
posterior covariance of the Bayesian linear model ``f = phi' w``, ``w ~ N(0, I)``,
``y = Phi w + N(0, lam)``. The robust estimates (truncated, median of means;
:mod:`botorch_fed.models.robust_estimators`) change ``theta`` only.

:class:`FeatureSpaceGP` is that surrogate as a BoTorch ``Model``: ``posterior`` returns
the full ``q x q`` covariance (so analytic and MC acquisition functions and
``optimize_acqf`` work, differentiably in ``X``), and :meth:`FeatureSpaceGP.mean_and_variance`
the diagonal only, for scanning a finite domain every round.

Numerics: all maths in float64; ``V`` is factorised once (Cholesky) in the constructor.
``k(x, x) - |phi(x)|^2`` cancels on the span of the dictionary, so a variance carries an
absolute rounding error of order ``eps_64 (m^{1/2} / rtol^{1/2} + cond(V))`` times the
kernel scale (see :mod:`~botorch_fed.models.nystrom`); negative variances of that size
are clamped to 0, and anything below ``-1e-8 k(x, x)`` raises ``RuntimeError`` (a bug,
not rounding).

References:

.. [LDP-BO] X. Zhou, J. Tan. Local differential privacy for Bayesian optimization
   (paper 002 in ``shared/papers``), Alg. 1 (lines 12-13), Alg. 3 (lines 13-14),
   eqs. (2)-(3).
"""

from __future__ import annotations

from typing import Any

import torch
from botorch.acquisition.objective import PosteriorTransform
from botorch.exceptions.errors import UnsupportedError
from botorch.models.model import Model
from botorch.posteriors.gpytorch import GPyTorchPosterior
from botorch.posteriors.posterior import Posterior
from gpytorch.distributions import MultivariateNormal
from linear_operator.operators import DenseLinearOperator
from torch import Tensor

from botorch_fed.models.nystrom import NystromEmbedding
from botorch_fed.models.robust_estimators import _check_lam, ridge_estimate

__all__ = ["FeatureSpaceGP"]

#: Variances below ``-NEGATIVE_VARIANCE_RTOL * k(x, x)`` are not rounding: raise.
NEGATIVE_VARIANCE_RTOL = 1e-8


def _shape(value: object) -> object:
    return tuple(value.shape) if isinstance(value, Tensor) else type(value).__name__


class FeatureSpaceGP(Model):
    r"""The surrogate ``GP(phi' theta, k - phi' phi + lam phi' V^{-1} phi)`` of [LDP-BO].

    See the module docstring. The model is immutable: ``theta`` and ``gram`` are cloned
    (float64) and ``V = gram + lam I`` is factorised once; the public ``theta``,
    ``gram`` and ``lam`` return copies. It has one output and no batch shape, no
    input or outcome transforms, and its tensors live on the embedding's device
    (``.to()`` leaves them alone: BoTorch's acquisition functions call it with their
    inputs' dtype, and the model computes in float64 whatever it is given). Predictions
    come back in the dtype of ``X``.

    Example:
        >>> emb = NystromEmbedding(kernel, X_train)
        >>> model = FeatureSpaceGP.ridge(emb, X_train, y_train, lam=1.0)
        >>> mean, var = model.mean_and_variance(X_grid)  # n, n (float64)
    """

    _num_outputs = 1

    def __init__(self, embedding: NystromEmbedding, theta: Tensor, gram: Tensor, lam: float):
        r"""
        Args:
            embedding: The feature map ``phi`` (``m`` features).
            theta: ``m`` estimate (``phi' theta`` is the mean).
            gram: ``m x m`` Gram matrix ``Phi' Phi`` of the plays' features (symmetric
                PSD; symmetrised here).
            lam: The regulariser / surrogate noise variance ``lambda > 0``.
        """
        super().__init__()
        if not isinstance(embedding, NystromEmbedding):
            raise ValueError(
                f"`embedding` must be a NystromEmbedding, got {type(embedding).__name__}."
            )
        m = embedding.dim
        if not isinstance(theta, Tensor) or theta.ndim != 1 or theta.shape[0] != m:
            raise ValueError(
                f"`theta` must be a 1-d tensor of the embedding's dimension m={m}, got "
                f"shape {_shape(theta)}."
            )
        if not isinstance(gram, Tensor) or gram.shape != (m, m):
            raise ValueError(f"`gram` must be `m x m` with m={m}, got shape {_shape(gram)}.")
        if not (theta.is_floating_point() and gram.is_floating_point()):
            raise ValueError(
                f"`theta` and `gram` must be floating point, got {theta.dtype}, {gram.dtype}."
            )
        lam = _check_lam(lam)
        device = embedding.dictionary.device
        theta64 = theta.detach().to(device=device, dtype=torch.float64).clone()
        gram64 = gram.detach().to(device=device, dtype=torch.float64).clone()
        if not bool(torch.isfinite(theta64).all()):
            raise ValueError("`theta` contains NaN or infinite values.")
        if not bool(torch.isfinite(gram64).all()):
            raise ValueError("`gram` contains NaN or infinite values.")
        scale = float(gram64.abs().max()) if m else 0.0
        asym = float((gram64 - gram64.mT).abs().max()) if m else 0.0
        if asym > 1e-8 * max(scale, lam):
            raise ValueError(
                f"`gram` must be symmetric: max |gram - gram'| = {asym:.3g} (scale {scale:.3g})."
            )
        gram64 = 0.5 * (gram64 + gram64.mT)
        V = gram64 + lam * torch.eye(m, dtype=torch.float64, device=device)
        L, info = torch.linalg.cholesky_ex(V)
        if m and int(info) != 0:
            raise ValueError(
                f"`gram` + lam I is not positive definite (lam={lam}): `gram` must be PSD "
                f"(min eigenvalue {float(torch.linalg.eigvalsh(gram64)[0]):.3g})."
            )
        self._embedding = embedding
        self._theta = theta64
        self._gram = gram64
        self._lam = lam
        self._chol = L

    def state_dict(self, *args, **kwargs):
        r"""Not supported: the model is immutable and holds no parameters; rebuild it from
        its embedding, ``theta``, ``gram`` and ``lam`` (an empty ``state_dict`` would load
        silently into another model and change nothing)."""
        raise UnsupportedError(
            "FeatureSpaceGP has no state_dict: rebuild it with FeatureSpaceGP(embedding, "
            "theta, gram, lam) (or FeatureSpaceGP.ridge) from the data it came from."
        )

    def load_state_dict(self, *args, **kwargs):
        r"""Not supported (see :meth:`state_dict`)."""
        raise UnsupportedError(
            "FeatureSpaceGP cannot load a state: build a new one from its embedding, theta, "
            "gram and lam."
        )

    # --- construction -----------------------------------------------------------------
    @classmethod
    def ridge(cls, embedding: NystromEmbedding, X: Tensor, y: Tensor, lam: float) -> FeatureSpaceGP:
        r"""The non-robust (kernel ridge) surrogate: ``theta = V^{-1} Phi' y``.

        Args:
            embedding: The feature map.
            X: ``n x d`` plays (``n`` may be 0).
            y: ``n`` rewards (``n x 1`` accepted).
            lam: The regulariser ``lambda > 0``.

        Returns:
            The model with ``gram = Phi' Phi``, ``Phi = embedding(X)``.
        """
        if not isinstance(X, Tensor) or X.ndim != 2:
            raise ValueError(f"`X` must be an `n x d` tensor, got shape {_shape(X)}.")
        Phi = embedding(X.detach())
        if isinstance(y, Tensor) and y.ndim == 2 and y.shape[-1] == 1:
            y = y.squeeze(-1)
        theta = ridge_estimate(Phi, y, lam)
        return cls(embedding, theta, Phi.mT @ Phi, lam)

    # --- state ------------------------------------------------------------------------
    @property
    def embedding(self) -> NystromEmbedding:
        r"""The feature map."""
        return self._embedding

    @property
    def theta(self) -> Tensor:
        r"""``m`` float64 estimate (a copy)."""
        return self._theta.clone()

    @property
    def gram(self) -> Tensor:
        r"""``m x m`` float64 Gram matrix ``Phi' Phi`` (a copy)."""
        return self._gram.clone()

    @property
    def lam(self) -> float:
        r"""The regulariser ``lambda``."""
        return self._lam

    @property
    def num_outputs(self) -> int:
        r"""One output."""
        return self._num_outputs

    @property
    def batch_shape(self) -> torch.Size:
        r"""``torch.Size([])``."""
        return torch.Size([])

    def _apply(self, fn, recurse: bool = True) -> FeatureSpaceGP:
        r"""``.to()`` / ``.float()`` / ``.double()``: a no-op (the model holds no module
        tensors; it computes in float64 on the embedding's device and returns the
        dtype of its inputs)."""
        return self

    # --- prediction -------------------------------------------------------------------
    def _features(self, X: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        r"""``(phi, A, mean)`` at ``batch x n x d`` inputs: ``phi`` ``batch x n x m``,
        ``A = L^{-1} phi'`` ``batch x m x n``, ``mean`` ``batch x n`` (float64)."""
        phi = self._embedding(X)
        mean = phi @ self._theta
        if phi.shape[-1] == 0:
            return phi, phi.mT, mean
        L = self._chol.expand(*phi.shape[:-2], *self._chol.shape)
        A = torch.linalg.solve_triangular(L, phi.mT, upper=False)
        return phi, A, mean

    def _check_variance(self, var: Tensor, prior: Tensor) -> Tensor:
        r"""Clamp round-off negatives to 0; raise on real ones."""
        with torch.no_grad():
            worst = var + NEGATIVE_VARIANCE_RTOL * prior.abs()
            if var.numel() and bool((worst < 0).any()):
                i = int(worst.flatten().argmin())
                raise RuntimeError(
                    f"FeatureSpaceGP: negative variance {float(var.flatten()[i]):.3g} at prior "
                    f"variance {float(prior.flatten()[i]):.3g}, beyond round-off (relative "
                    f"{NEGATIVE_VARIANCE_RTOL:g}): the embedding, `theta`/`gram` or `lam` are "
                    "inconsistent."
                )
        return var.clamp_min(0.0)

    def mean_and_variance(self, X: Tensor) -> tuple[Tensor, Tensor]:
        r"""``mu~(x)`` and ``sigma~^2(x)`` at each row (diagonal only: no ``n x n`` matrix).

        Args:
            X: ``n x d`` inputs.

        Returns:
            ``(mean, variance)``, each ``n`` float64; variances ``>= 0``.
        """
        if not isinstance(X, Tensor) or X.ndim != 2:
            raise ValueError(f"`X` must be an `n x d` tensor, got shape {_shape(X)}.")
        phi, A, mean = self._features(X)
        prior = self._embedding.kernel_diag(X)
        var = prior - phi.square().sum(-1) + self._lam * A.square().sum(-2)
        return mean, self._check_variance(var, prior)

    def _predict(self, X: Tensor) -> tuple[Tensor, Tensor]:
        r"""Mean ``batch x q`` and covariance ``batch x q x q`` (float64)."""
        phi, A, mean = self._features(X)
        K = self._embedding.kernel_matrix(X)
        cov = K - phi @ phi.mT + self._lam * (A.mT @ A)
        cov = 0.5 * (cov + cov.mT)
        diag = cov.diagonal(dim1=-2, dim2=-1)
        lifted = self._check_variance(diag, K.diagonal(dim1=-2, dim2=-1))
        cov = cov + torch.diag_embed(lifted - diag)
        return mean, cov

    def posterior(
        self,
        X: Tensor,
        output_indices: list[int] | None = None,
        observation_noise: bool | Tensor = False,
        posterior_transform: PosteriorTransform | None = None,
        **kwargs: Any,
    ) -> Posterior:
        r"""The surrogate's predictive distribution.

        Args:
            X: ``batch x q x d`` inputs.
            output_indices: ``None`` or ``[0]`` (one output).
            observation_noise: If True, add ``lam`` (the surrogate's Gaussian likelihood
                ``N(0, lam)``) to the diagonal. Tensors are not supported.
            posterior_transform: An optional posterior transform.

        Returns:
            A ``GPyTorchPosterior`` with the full ``q x q`` covariance in the dtype of
            ``X`` (mean ``batch x q x 1``), or the transformed posterior.
        """
        if output_indices is not None and list(output_indices) != [0]:
            raise UnsupportedError(
                f"`output_indices`={list(output_indices)}: FeatureSpaceGP has one output (0)."
            )
        if isinstance(observation_noise, Tensor):
            raise UnsupportedError(
                "FeatureSpaceGP does not support a Tensor `observation_noise` (its noise is "
                "`lam`); pass True or False."
            )
        if not isinstance(observation_noise, bool):
            raise ValueError(f"`observation_noise` must be a bool, got {observation_noise!r}.")
        if not isinstance(X, Tensor) or X.ndim < 2:
            raise ValueError(f"`X` must be a `batch x q x d` tensor, got shape {_shape(X)}.")
        mean, cov = self._predict(X)
        if observation_noise:
            cov = cov + self._lam * torch.eye(cov.shape[-1], dtype=cov.dtype, device=cov.device)
        mvn = MultivariateNormal(mean.to(X.dtype), DenseLinearOperator(cov.to(X.dtype)))
        posterior = GPyTorchPosterior(distribution=mvn)
        if posterior_transform is not None:
            return posterior_transform(posterior)
        return posterior

    def subset_output(self, idcs: list[int]) -> FeatureSpaceGP:
        r"""The model itself for ``idcs == [0]`` (its only output)."""
        if list(idcs) != [0]:
            raise UnsupportedError(f"`idcs`={list(idcs)}: FeatureSpaceGP has one output (0).")
        return self

    def __repr__(self) -> str:
        return f"FeatureSpaceGP(m={self._embedding.dim}, lam={self._lam:g})"
