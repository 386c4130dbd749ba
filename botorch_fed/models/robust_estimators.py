r"""Least-squares estimates in a finite feature space, plain and heavy-tail robust ([LDP-BO]).

With features ``Phi`` (``n x m``, one row ``phi(x_tau)'`` per play), rewards ``y`` and a
regulariser ``lam > 0``, ``V = Phi' Phi + lam I``:

- :func:`ridge_estimate`: ``theta = V^{-1} Phi' y`` (kernel ridge regression in feature
  space; the GP posterior mean's weights).
- :func:`ata_estimate`: the feature-adaptive truncation (TOFU) of LDP-ATA-GP-UCB,
  [LDP-BO] Alg. 1 lines 8-11: with the rows ``u_i'`` of ``U = V^{-1/2} Phi'``
  (``m x n``), ``r_i = sum_tau u_{i,tau} y_tau 1{|u_{i,tau} y_tau| <= b_tau}`` and
  ``theta = V^{-1/2} r``. Without truncation (``b = inf``) it is the ridge estimate.
- :func:`median_of_means_estimate`: the median-of-means selection of MoMA-GP-UCB,
  [LDP-BO] Alg. 3 lines 10-12: ``k`` ridge estimates, one per column of the ``n x k``
  reward table, and the one whose median ``V``-distance to the others is smallest.

All maths in float64 (inputs of any floating dtype are converted); results are float64
on the inputs' device. ``V`` has all eigenvalues ``>= lam``, so the solves are as well
conditioned as ``cond(V) <= 1 + ||Phi||_2^2 / lam``.

References:

.. [LDP-BO] X. Zhou, J. Tan. Local differential privacy for Bayesian optimization
   (paper 002 in ``shared/papers``), Alg. 1 (lines 8-11) and Alg. 3 (lines 10-12);
   after Shao et al.'s TOFU and MENU for heavy-tailed linear bandits (its ref. [22]).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = ["ata_estimate", "median_of_means_estimate", "ridge_estimate"]


def _shape(value: object) -> object:
    return tuple(value.shape) if isinstance(value, Tensor) else type(value).__name__


def _check_lam(lam: float) -> float:
    r"""``lam`` must be one positive finite number; returned as a float."""
    if isinstance(lam, Tensor):
        if lam.numel() != 1:
            raise ValueError(f"`lam` must be one number, got a tensor of shape {tuple(lam.shape)}.")
        lam = lam.item()
    if isinstance(lam, bool) or not isinstance(lam, int | float):
        raise ValueError(f"`lam` must be a positive finite number, got {lam!r}.")
    if not (math.isfinite(lam) and lam > 0):
        raise ValueError(f"`lam` must be a positive finite number, got {lam!r}.")
    return float(lam)


def _as_float64(value: Tensor, name: str, ndim: int | None = None, min_ndim: int = 1) -> Tensor:
    r"""Check a finite floating tensor (exact ``ndim`` or at least ``min_ndim`` dims)."""
    if not isinstance(value, Tensor):
        raise ValueError(f"`{name}` must be a Tensor, got {type(value).__name__}.")
    if (ndim is not None and value.ndim != ndim) or value.ndim < min_ndim:
        want = f"{ndim}" if ndim is not None else f">= {min_ndim}"
        raise ValueError(f"`{name}` must have {want} dimensions, got shape {tuple(value.shape)}.")
    if not value.is_floating_point():
        raise ValueError(f"`{name}` must be floating point, got dtype {value.dtype}.")
    out = value.detach().to(torch.float64)
    if out.numel() and not bool(torch.isfinite(out).all()):
        bad = (~torch.isfinite(out)).nonzero()[0].tolist()
        raise ValueError(
            f"`{name}` must be finite, got {out[tuple(bad)].item()} at index {tuple(bad)}."
        )
    return out


def _gram(Phi: Tensor, lam: float) -> Tensor:
    r"""``V = Phi' Phi + lam I`` (``... x m x m``)."""
    m = Phi.shape[-1]
    V = Phi.mT @ Phi
    V = 0.5 * (V + V.mT)
    return V + lam * torch.eye(m, dtype=Phi.dtype, device=Phi.device)


def _inverse_sqrt(V: Tensor) -> Tensor:
    r"""The symmetric ``V^{-1/2}`` of a symmetric positive definite ``V`` (``eigh``)."""
    s, Q = torch.linalg.eigh(V)
    return (Q * s.rsqrt().unsqueeze(-2)) @ Q.mT


def ridge_estimate(Phi: Tensor, y: Tensor, lam: float) -> Tensor:
    r"""``theta = (Phi' Phi + lam I)^{-1} Phi' y`` (Cholesky solve, float64).

    Args:
        Phi: ``batch x n x m`` features (``n``, ``m`` may be 0).
        y: ``batch x n`` rewards (batch shapes broadcast).
        lam: The regulariser ``lambda > 0``.

    Returns:
        ``batch x m`` float64 estimate.
    """
    Phi64 = _as_float64(Phi, "Phi", min_ndim=2)
    y64 = _as_float64(y, "y", min_ndim=1)
    lam = _check_lam(lam)
    n = Phi64.shape[-2]
    if y64.shape[-1] != n:
        raise ValueError(
            f"`y` must have one entry per row of `Phi` (n={n}), got shape {tuple(y64.shape)} "
            f"for `Phi` of shape {tuple(Phi64.shape)}."
        )
    try:
        batch = torch.broadcast_shapes(Phi64.shape[:-2], y64.shape[:-1])
    except RuntimeError as e:
        raise ValueError(
            f"The batch shapes of `Phi` {tuple(Phi64.shape)} and `y` {tuple(y64.shape)} do not "
            "broadcast."
        ) from e
    Phi64 = Phi64.expand(*batch, *Phi64.shape[-2:])
    y64 = y64.expand(*batch, n)
    L = torch.linalg.cholesky(_gram(Phi64, lam))
    rhs = Phi64.mT @ y64.unsqueeze(-1)
    return torch.cholesky_solve(rhs, L).squeeze(-1)


def ata_estimate(Phi: Tensor, y: Tensor, lam: float, thresholds: Tensor) -> tuple[Tensor, int]:
    r"""The feature-adaptively truncated estimate of LDP-ATA-GP-UCB ([LDP-BO] Alg. 1 l. 8-11).

    ``V = Phi' Phi + lam I``, ``U = V^{-1/2} Phi'`` (``m x n``; ``V^{-1/2}`` the symmetric
    inverse square root from ``eigh``), ``r_i = sum_tau u_{i,tau} y_tau
    1{|u_{i,tau} y_tau| <= b_tau}`` and ``theta = V^{-1/2} r``. A term exactly at its
    threshold is kept. With all thresholds infinite, ``theta`` is the ridge estimate.

    Args:
        Phi: ``n x m`` features (one row per play).
        y: ``n`` rewards.
        lam: The regulariser ``lambda > 0``.
        thresholds: ``n`` truncation points ``b_tau >= 0`` (``inf`` allowed: no
            truncation; NaN is not).

    Returns:
        ``(theta, truncated)``: the ``m`` float64 estimate and the number of terms
        ``(i, tau)`` (of ``m n``) set to zero.
    """
    Phi64 = _as_float64(Phi, "Phi", ndim=2)
    y64 = _as_float64(y, "y", ndim=1)
    lam = _check_lam(lam)
    n, m = Phi64.shape
    if y64.shape[0] != n:
        raise ValueError(
            f"`y` must have one entry per row of `Phi` (n={n}), got shape {tuple(y64.shape)}."
        )
    if not isinstance(thresholds, Tensor) or thresholds.ndim != 1 or thresholds.shape[0] != n:
        raise ValueError(
            f"`thresholds` must be a 1-d tensor with one entry per row of `Phi` (n={n}), got "
            f"shape {_shape(thresholds)}."
        )
    if not thresholds.is_floating_point():
        raise ValueError(f"`thresholds` must be floating point, got dtype {thresholds.dtype}.")
    b = thresholds.detach().to(device=Phi64.device, dtype=torch.float64)
    if bool(torch.isnan(b).any()) or bool((b < 0).any()):
        i = int((torch.isnan(b) | (b < 0)).nonzero()[0])
        raise ValueError(
            f"`thresholds` must be >= 0 (inf allowed), got {b[i].item()} at index {i}."
        )
    R = _inverse_sqrt(_gram(Phi64, lam))  # m x m
    terms = (R @ Phi64.mT) * y64  # m x n: u_{i,tau} y_tau
    kept = terms.abs() <= b
    r = torch.where(kept, terms, torch.zeros_like(terms)).sum(-1)
    return R @ r, int((~kept).sum())


def median_of_means_estimate(Phi: Tensor, Y: Tensor, lam: float) -> tuple[Tensor, int]:
    r"""The median-of-means estimate of MoMA-GP-UCB ([LDP-BO] Alg. 3 lines 10-12).

    ``theta_j = V^{-1} Phi' Y[:, j]`` for each of the ``k`` columns (one solve for all),
    ``r_j = median_{s != j} ||theta_j - theta_s||_V`` and ``k* = argmin_j r_j``. The
    median of the ``k - 1`` distances is ``torch.median``'s: the *lower* median when
    ``k - 1`` is even (the sorted distances' element at 0-based index ``(k - 2) // 2``;
    no averaging); ties in ``r`` go to the first ``j``. With
    ``L L' = V``, ``||theta_j - theta_s||_V = |z_j - z_s|`` for ``z_j = L^{-1} Phi' Y[:, j]``,
    computed without the ``|a|^2 + |b|^2 - 2 a'b`` cancellation.

    Args:
        Phi: ``n x m`` features, one row per epoch (the epoch's point).
        Y: ``n x k`` rewards: column ``j`` holds the ``j``-th play of every epoch
            (``k >= 1``).
        lam: The regulariser ``lambda > 0``.

    Returns:
        ``(theta, k_star)``: the ``m`` float64 estimate ``theta_{k*}`` and ``k*``
        (0-based). ``k = 1`` gives ``(theta_0, 0)``; ``k = 2`` gives ``(theta_0, 0)``
        too (both distances are equal).
    """
    Phi64 = _as_float64(Phi, "Phi", ndim=2)
    Y64 = _as_float64(Y, "Y", ndim=2)
    lam = _check_lam(lam)
    n, m = Phi64.shape
    if Y64.shape[0] != n:
        raise ValueError(
            f"`Y` must have one row per row of `Phi` (n={n}), got shape {tuple(Y64.shape)}."
        )
    k = Y64.shape[1]
    if k < 1:
        raise ValueError(
            f"`Y` must have k >= 1 columns (plays per epoch), got shape {tuple(Y64.shape)}."
        )
    L = torch.linalg.cholesky(_gram(Phi64, lam))
    Z = torch.linalg.solve_triangular(L, Phi64.mT @ Y64, upper=False)  # m x k
    Theta = torch.linalg.solve_triangular(L.mT, Z, upper=True)  # m x k
    if k == 1:
        return Theta[:, 0], 0
    dist = torch.cdist(Z.mT, Z.mT, compute_mode="donot_use_mm_for_euclid_dist")  # k x k
    off = ~torch.eye(k, dtype=torch.bool, device=dist.device)
    r = dist[off].reshape(k, k - 1).median(dim=-1).values
    k_star = int(torch.argmin(r))
    return Theta[:, k_star], k_star
