r"""The barycenter GP of Co-KG kept in whitened form: its cached prior parts.

:class:`~botorch_fed.models.barycenter_gp.BarycenterGP` predicts ``mean(X) = mu_0 +
k_XS K_SS^-1 (m_c - mu_0)`` and ``cov(X, X') = k(X, X') - k_XS K_SS^-1 (K_SS - K_c)
K_SS^-1 k_SX'`` from the barycenter ``N(m_c, K_c)`` on the support ``S`` (``s`` points).
:class:`WhitenedBarycenter`, its base class, keeps the parts of that GP.

Numerics: with ``L L' = K_SS + jitter I`` the model keeps ``a = K_SS^-1 (m_c - mu_0)``
and the whitened information ``L^-1 (K_SS - K_c) L^-T = Q diag(lam) Q'``, truncated to
the eigenvalues above ``rank_tol`` times the largest magnitude, as ``G = L^-T Q``: a
test point then costs one ``s``-vector of kernel values and an ``s x r`` product, not a
solve with ``K_SS``. The barycenter is not "prior minus low rank": on a 30x30 grid with
4 agents and 40 observations ``r`` was 392 of 900 (measured), so ``r`` saves a factor of
about 2, not ``s / n``. The jitter bounds the absolute error on the support by about
``2 jitter`` times the outputscale (3e-8 measured; a relative error of a few percent in
the variance at a data point observed with noise 1e-6). The cache depends on the
kernel's hyperparameters and on this model's buffers and is rebuilt whenever they change
(values -- also through ``.data`` --, a replaced module or a setting such as ``nu``).
Like gpytorch's test caches it is detached: gradients reach the kernel's
hyperparameters only under ``gpytorch.settings.detach_test_caches(False)``.

References:

.. [Co-KG] Collaborative Bayesian optimisation via Wasserstein barycenters (paper 001
   in ``shared/papers``), Proposition 1 and Algorithm 1.
"""

from __future__ import annotations

from typing import Any

import torch
from botorch.models.model import Model
from gpytorch import settings as gpytorch_settings
from gpytorch.kernels import Kernel
from linear_operator.utils.cholesky import psd_safe_cholesky
from torch import Tensor

from botorch_fed.models.module_state import _settings, _state_tensors, _summary_modules


def _quadratic(F1: Tensor, F2: Tensor, lam: Tensor) -> Tensor:
    r"""``F1 diag(lam) F2'`` (``lam`` a vector) or ``F1 lam F2'`` (a matrix)."""
    if lam.ndim == 1:
        return (F1 * lam) @ F2.transpose(-1, -2)
    return F1 @ lam @ F2.transpose(-1, -2)


class WhitenedBarycenter(Model):
    r"""Base class of :class:`~botorch_fed.models.barycenter_gp.BarycenterGP`: the
    cached parts ``(a, G, lam)`` of the barycenter GP and its mean, covariance and
    features at inputs before any conditioning (see the module docstring).
    """

    # buffers (registered in ``BarycenterGP.__init__``)
    support: Tensor
    barycenter_mean: Tensor
    barycenter_covariance: Tensor
    weights: Tensor
    means: Tensor
    covariances: Tensor
    mean_constant: Tensor
    # attributes (set in ``BarycenterGP.__init__``)
    covar_module: Kernel
    _jitter: float
    _rank_tol: float
    _cache: dict[str, Any]

    def _fingerprint(self) -> tuple:
        r"""What the prediction cache depends on: the kernel's structure (module types,
        settings such as ``nu``) and parameter/buffer values, and this model's buffers.
        Compared on every prediction (a tuple comparison, no hashing)."""
        modules = _summary_modules([("covar_module", self.covar_module)])
        structure = tuple(
            (path, type(m), _settings(m)) if m is not None else (path, None) for path, m in modules
        )
        values = tuple(tuple(t.detach().reshape(-1).tolist()) for t in _state_tensors(modules))
        own = (self.support, self.barycenter_mean, self.barycenter_covariance, self.mean_constant)
        return (
            structure,
            values,
            tuple((t.data_ptr(), t._version) for t in own),
            # a write through ``.data`` does not bump ``_version``: cheap checksums
            tuple(float(t.detach().sum()) for t in own),
            self._jitter,
            self._rank_tol,
        )

    def _prior_parts(self) -> tuple[Tensor, Tensor, Tensor]:
        r"""``(a, G, lam)``: ``mean(X) = mu_0 + k_XS a``, ``cov = k_XX - (k_XS G) lam (G' k_SX)``
        (``lam`` a vector of eigenvalues, or a full matrix on the differentiable path).

        Cached and detached, as gpytorch's ``detach_test_caches`` (the default): rebuilt
        when the kernel's hyperparameters or the model's buffers changed. With
        ``gpytorch.settings.detach_test_caches(False)`` and grad mode on, computed live
        without truncation so that gradients reach the kernel's hyperparameters."""
        if gpytorch_settings.detach_test_caches.off() and torch.is_grad_enabled():
            return self._compute_parts(truncate=False)
        key = self._fingerprint()
        if self._cache.get("key") != key:
            with torch.no_grad():
                parts = self._compute_parts(truncate=True)
            self._cache = {"key": key, "parts": parts}
        return self._cache["parts"]

    def _compute_parts(self, truncate: bool) -> tuple[Tensor, Tensor, Tensor]:
        S = self.support
        K = self._kernel(S).to(torch.float64)
        K = 0.5 * (K + K.transpose(-1, -2))
        scale = K.diagonal().abs().max().detach().clamp_min(1e-300)
        eye = torch.eye(K.shape[-1], dtype=K.dtype, device=K.device)
        L = psd_safe_cholesky(K + self._jitter * scale * eye)
        centred = (self.barycenter_mean - self.mean_constant).to(torch.float64).unsqueeze(-1)
        a = torch.cholesky_solve(centred, L).squeeze(-1)
        D = K - self.barycenter_covariance.to(torch.float64)
        half = torch.linalg.solve_triangular(L, D, upper=False)
        M = torch.linalg.solve_triangular(L, half.transpose(-1, -2), upper=False)
        M = 0.5 * (M + M.transpose(-1, -2))
        if not truncate:  # G = L^-T, lam = M: exact and differentiable (no eigh)
            return a, torch.linalg.solve_triangular(L.transpose(-1, -2), eye, upper=True), M
        lam, Q = torch.linalg.eigh(M)
        keep = lam.abs() > self._rank_tol * lam.abs().max().clamp_min(1e-300)
        G = torch.linalg.solve_triangular(L.transpose(-1, -2), Q[:, keep], upper=True)
        return a, G, lam[keep]

    def _kernel(self, X1: Tensor, X2: Tensor | None = None) -> Tensor:
        r"""Dense kernel matrix (evaluated eagerly: no lazy-tensor overhead per call)."""
        with gpytorch_settings.lazily_evaluate_kernels(False):
            out = self.covar_module(X1) if X2 is None else self.covar_module(X1, X2)
        return out.to_dense() if not isinstance(out, Tensor) else out

    def _support_features(self, X: Tensor, parts: tuple) -> tuple[Tensor, Tensor]:
        r"""``(mu_0 + k_XS a, k_XS G)`` at ``... x n x d`` inputs: ``... x n``, ``... x n x r``."""
        a, G, _ = parts
        S = self.support
        KXS = self._kernel(X, S.expand(*X.shape[:-2], *S.shape))
        return self.mean_constant + KXS @ a, KXS @ G

    def _base(self, X: Tensor, parts: tuple) -> tuple[Tensor, Tensor, Tensor]:
        r"""Mean ``... x n``, covariance ``... x n x n`` and features ``... x n x r`` of the
        barycenter GP before any conditioning."""
        mean, F = self._support_features(X, parts)
        return mean, self._kernel(X) - _quadratic(F, F, parts[2]), F
