r"""The Bures-Wasserstein barycenter of Gaussian distributions (Co-KG's central model).

For Gaussians ``N(m_i, C_i)`` with weights ``w_i`` (``w_i >= 0``, ``sum w_i = 1``) the
2-Wasserstein barycenter is Gaussian ``N(m, S)`` with ``m = sum_i w_i m_i`` and ``S`` the
unique positive definite solution of the characterising equation (Agueh and Carlier,
2011)

    ``S = sum_i w_i (S^1/2 C_i S^1/2)^1/2``.

Iterating that equation as a map is not guaranteed to converge (it is what the Co-KG
slides write down, and what POT's ``bures_barycenter_fixpoint`` iterates, from a
starting point scaled by ``1/N``). :func:`bures_wasserstein_barycenter` iterates the map
of Alvarez-Esteban, del Barrio, Cuesta-Albertos and Matran (2016), which converges to
the barycenter from any positive definite start:

    ``S <- S^-1/2 (sum_i w_i (S^1/2 C_i S^1/2)^1/2)^2 S^-1/2``,

so a previous round's barycenter can warm-start the next. Matrix square roots come
from symmetric eigendecompositions, in float64, batched over leading dimensions.

References:

.. [Alvarez-Esteban2016] P. C. Alvarez-Esteban, E. del Barrio, J. A. Cuesta-Albertos,
   C. Matran. A fixed-point approach to barycenters in Wasserstein space. Journal of
   Mathematical Analysis and Applications 441(2), 2016.
.. [Co-KG] Collaborative Bayesian optimisation via Wasserstein barycenters (paper 001
   in ``shared/papers``).
"""

from __future__ import annotations

import warnings

import torch
from botorch.exceptions.warnings import OptimizationWarning
from torch import Tensor


def _sym_sqrt_pair(A: Tensor) -> tuple[Tensor, Tensor]:
    r"""``(A^1/2, A^-1/2)`` of symmetric positive definite ``... x s x s`` matrices from
    one eigendecomposition (a singular matrix raises)."""
    evals, evecs = torch.linalg.eigh(A)
    if (evals <= 0).any():
        raise ValueError("The barycenter iterate became singular.")
    root = (evecs * evals.sqrt().unsqueeze(-2)) @ evecs.transpose(-1, -2)
    inv_root = (evecs * evals.rsqrt().unsqueeze(-2)) @ evecs.transpose(-1, -2)
    return root, inv_root


def _sym_sqrt(A: Tensor, inverse: bool = False) -> Tensor:
    r"""``A^1/2`` (or ``A^-1/2``) of symmetric PSD ``... x s x s`` matrices (eigenvalues
    clipped at 0; the inverse of a singular matrix raises)."""
    evals, evecs = torch.linalg.eigh(A)
    evals = evals.clamp_min(0.0)
    if inverse:
        if (evals <= 0).any():
            raise ValueError("The barycenter iterate became singular.")
        evals = evals.rsqrt()
    else:
        evals = evals.sqrt()
    return (evecs * evals.unsqueeze(-2)) @ evecs.transpose(-1, -2)


def _check_inputs(means: Tensor, covariances: Tensor, weights: Tensor | None):
    if not isinstance(means, Tensor) or not isinstance(covariances, Tensor):
        raise ValueError("`means` and `covariances` must be tensors.")
    if means.ndim < 2:
        raise ValueError(f"`means` must have shape batch_shape x N x s, got {tuple(means.shape)}.")
    *batch, N, s = means.shape
    if covariances.shape != (*batch, N, s, s):
        raise ValueError(
            f"`covariances` must have shape {(*batch, N, s, s)} to match `means` of shape "
            f"{tuple(means.shape)} (N = {N} distributions on s = {s} points), got "
            f"{tuple(covariances.shape)}."
        )
    if N < 1 or s < 1:
        raise ValueError(f"Need at least one distribution on one point, got N={N}, s={s}.")
    if not (torch.isfinite(means).all() and torch.isfinite(covariances).all()):
        raise ValueError("`means` and `covariances` must be finite.")
    C = covariances.detach().to(torch.float64)
    scale = C.diagonal(dim1=-2, dim2=-1).abs().amax(-1).clamp_min(1e-300)
    asym = (C - C.transpose(-1, -2)).abs().amax((-2, -1))
    tol = 1e3 * torch.finfo(covariances.dtype).eps
    if (asym > tol * scale).any():
        raise ValueError("`covariances` must be symmetric.")
    C = 0.5 * (C + C.transpose(-1, -2))
    # C + tol * scale * I is positive definite iff C's eigenvalues exceed -tol * scale
    # (a Cholesky costs a tenth of an eigendecomposition)
    eye = torch.eye(C.shape[-1], dtype=C.dtype, device=C.device)
    shifted = C + (tol * scale)[..., None, None] * eye
    if (torch.linalg.cholesky_ex(shifted).info != 0).any():
        raise ValueError("`covariances` must be positive semi-definite.")
    if weights is None:
        w = torch.full((N,), 1.0 / N, dtype=torch.float64, device=means.device)
    else:
        given = torch.as_tensor(weights)
        w = given.to(dtype=torch.float64, device=means.device)
        if w.shape != (N,):
            raise ValueError(f"`weights` must have shape ({N},), got {tuple(w.shape)}.")
        if not torch.isfinite(w).all() or (w < 0).any():
            raise ValueError(f"`weights` must be finite and non-negative, got {w.tolist()}.")
        eps = torch.finfo(given.dtype).eps if given.is_floating_point() else 0.0
        if abs(float(w.sum()) - 1.0) > 4 * N * eps:  # the rounding of N weights
            raise ValueError(f"`weights` must sum to one, got {float(w.sum())!r}.")
        w = w / w.sum()
    return C, w


def bures_wasserstein_barycenter(
    means: Tensor,
    covariances: Tensor,
    weights: Tensor | None = None,
    init: Tensor | None = None,
    max_iter: int = 500,
    tol: float = 1e-10,
    rank_tol: float | None = None,
) -> tuple[Tensor, Tensor]:
    r"""The 2-Wasserstein barycenter of Gaussian distributions.

    Computed in float64 by the fixed-point map of Alvarez-Esteban et al. (2016) (see
    the module docstring), without gradients: inputs that require grad are detached
    (the barycenter is a summary of the agents' posteriors, not a function to
    differentiate through).

    Args:
        means: ``batch_shape x N x s`` means of the ``N`` distributions (e.g. agents'
            posterior means on ``s`` support points).
        covariances: ``batch_shape x N x s x s`` covariances (symmetric PSD; at least
            one positive definite, else the barycenter may be singular).
        weights: ``N`` non-negative weights summing to one (``None``: uniform).
        init: ``batch_shape x s x s`` positive definite starting point (e.g. the
            previous round's barycenter; ``None``: the weighted mean of the
            covariances). With ``rank_tol`` positive semi-definite suffices; if it is
            singular on the covariances' range the weighted mean is used instead.
        max_iter: Maximum number of iterations.
        tol: Stop when an update changes the iterate by less than ``tol`` relative
            to its Frobenius norm.
        rank_tol: If given, iterate on the numerical range of the covariances: the
            eigenvectors of their weighted mean with eigenvalues above ``rank_tol``
            times the largest. Every input covariance ``C_i <= (sum_j w_j C_j) / w_i``
            lives in that range up to ``rank_tol / w_i`` times the largest eigenvalue,
            and so does the barycenter, so the result differs from the full iteration
            by that much at most; the iteration then needs no inverse of the
            numerically singular matrices that posterior covariances on a fine grid
            are. Off that range the result is the covariances' weighted mean (below
            the cut-off). ``None``: the full matrices, which must then be positive
            definite.
            ``init`` is projected onto the same range.

    Returns:
        ``(mean, covariance)``: ``batch_shape x s`` and ``batch_shape x s x s``, in the
        inputs' dtype and device.

    Raises:
        ValueError: Shapes that do not match (a batch of distributions is
            ``batch_shape x N x s``, never misread as one set), non-finite,
            asymmetric or indefinite covariances, weights of the wrong length, negative
            or not summing to one, a bad ``init``, ``max_iter`` or ``tol``.

    Warns:
        OptimizationWarning: The iteration did not reach ``tol`` within ``max_iter``.
    """
    C, w = _check_inputs(means, covariances, weights)
    if rank_tol is not None and not (
        isinstance(rank_tol, int | float) and not isinstance(rank_tol, bool) and 0 <= rank_tol < 1
    ):
        raise ValueError(f"`rank_tol` must be None or a number in [0, 1), got {rank_tol!r}.")
    if isinstance(max_iter, bool) or not isinstance(max_iter, int) or max_iter < 1:
        raise ValueError(f"`max_iter` must be a positive integer, got {max_iter!r}.")
    if not (isinstance(tol, int | float) and tol > 0):
        raise ValueError(f"`tol` must be a positive number, got {tol!r}.")
    mean = (w.unsqueeze(-1) * means.detach().to(torch.float64)).sum(-2)
    if init is None:
        S = (w[:, None, None] * C).sum(-3)
    else:
        if not isinstance(init, Tensor) or init.shape != C.shape[:-3] + C.shape[-2:]:
            raise ValueError(
                f"`init` must be a tensor of shape {tuple(C.shape[:-3] + C.shape[-2:])}, got "
                f"{tuple(init.shape) if isinstance(init, Tensor) else type(init).__name__}."
            )
        S = init.detach().to(torch.float64)
        S = 0.5 * (S + S.transpose(-1, -2))
        if not torch.isfinite(S).all():
            raise ValueError("`init` must be finite.")
        lowest = torch.linalg.eigvalsh(S)[..., 0]
        if rank_tol is None and (lowest <= 0).any():
            raise ValueError("`init` must be symmetric positive definite.")
        scale = S.diagonal(dim1=-2, dim2=-1).amax(-1).clamp_min(1e-300)
        if (lowest < -1e3 * torch.finfo(torch.float64).eps * scale).any():
            raise ValueError("`init` must be symmetric positive semi-definite.")
    if C.shape[-3] == 1:  # one distribution is its own barycenter
        return mean.to(means), C.squeeze(-3).to(covariances)
    if rank_tol is not None:
        S = _on_numerical_range(C, w, S, float(rank_tol), max_iter, tol)
        return mean.to(means), S.to(covariances)
    S = _iterate(C, w, S, max_iter, tol)
    return mean.to(means), S.to(covariances)


def _on_numerical_range(
    C: Tensor, w: Tensor, S: Tensor, rank_tol: float, max_iter: int, tol: float
) -> Tensor:
    r"""The barycenter iterated on the numerical range of ``sum_i w_i C_i`` (one batch
    element at a time: ranks differ between them)."""
    batch = C.shape[:-3]
    s = C.shape[-1]
    Cf = C.reshape(-1, *C.shape[-3:])
    Sf = S.reshape(-1, s, s)
    out = torch.empty_like(Sf)
    for b in range(Cf.shape[0]):
        evals, evecs = torch.linalg.eigh((w[:, None, None] * Cf[b]).sum(-3))
        keep = evals > rank_tol * evals[-1].clamp_min(0.0)
        if not keep.any():
            out[b] = 0.0  # all covariances are zero: so is their barycenter
            continue
        P = evecs[:, keep]  # s x r
        Cr = P.transpose(-1, -2) @ Cf[b] @ P
        Sr = P.transpose(-1, -2) @ Sf[b] @ P
        Sr = 0.5 * (Sr + Sr.transpose(-1, -2))
        r_evals = torch.linalg.eigvalsh(Sr)
        if r_evals[0] <= 1e3 * torch.finfo(Sr.dtype).eps * r_evals[-1]:
            # a warm start that is numerically singular on this range (the range grew):
            # start from the weighted mean instead (same fixed point, more iterations)
            Sr = (w[:, None, None] * Cr).sum(-3)
        Sr = _iterate(Cr, w, Sr, max_iter, tol)
        # off the range every covariance is below the cut-off: keep their mean there
        rest = evecs[:, ~keep]
        full = P @ Sr @ P.transpose(-1, -2)
        full = full + (rest * evals[~keep].clamp_min(0.0)) @ rest.transpose(-1, -2)
        out[b] = 0.5 * (full + full.transpose(-1, -2))
    return out.reshape(*batch, s, s)


def _iterate(C: Tensor, w: Tensor, S: Tensor, max_iter: int, tol: float) -> Tensor:
    r"""The fixed-point map of Alvarez-Esteban et al. from ``S`` until ``tol``."""
    change = float("inf")
    for _ in range(max_iter):
        root, inv_root = _sym_sqrt_pair(S)
        inner = _sym_sqrt(root.unsqueeze(-3) @ C @ root.unsqueeze(-3))  # ... x N x s x s
        T = (w[:, None, None] * inner).sum(-3)
        new = inv_root @ T @ T @ inv_root
        new = 0.5 * (new + new.transpose(-1, -2))
        change = float(
            (
                torch.linalg.matrix_norm(new - S) / torch.linalg.matrix_norm(S).clamp_min(1e-300)
            ).max()
        )
        S = new
        if change <= tol:
            break
    else:
        warnings.warn(
            f"The barycenter iteration stopped after max_iter={max_iter} iterations with a "
            f"relative change of {change:.3g} > tol={tol:g}.",
            OptimizationWarning,
            stacklevel=3,
        )
    return S
