r"""Tolerances derived from the dtype and the computation, not from one machine's output.

MKL picks SSE4.2, AVX2 or AVX-512 kernels by CPU (``MKL_ENABLE_INSTRUCTIONS``
reproduces each) and the thread count changes blocking: float32 results differ in the
last bits between them. A comparison therefore allows ``factor * eps(dtype)`` relative
to the *scale* of the quantity (norm-wise), where ``factor`` is the conditioning
factor of the computation under test -- an estimate of how much rounding errors of
size ``eps`` can be amplified (e.g. ``cond(K)`` times a modest polynomial in the
sizes), written next to each use.

Elementwise relative tolerances are the wrong tool for quantities that pass near zero
through cancellation (an entry of ``A = K' Lambda^-1 K`` that is ~0 has no relative
accuracy at all); compare against the magnitude of the whole quantity instead.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


def eps(dtype: torch.dtype) -> float:
    r"""Machine epsilon of a floating point ``dtype``."""
    return torch.finfo(dtype).eps


def tol(dtype: torch.dtype, factor: float) -> float:
    r"""``factor * eps(dtype)``: the relative tolerance of a computation whose rounding
    errors are amplified by at most ``factor``."""
    if not factor >= 1:
        raise ValueError(f"`factor` must be >= 1, got {factor}.")
    return factor * eps(dtype)


def reordering_factor(n: int, cond: float | Tensor = 1.0) -> float:
    r"""The factor of a comparison of one quantity computed twice by the same formula
    with its sums in different orders: batched or not, stacked or separate, on another
    thread count or through another MKL kernel (AVX-512, AVX2, SSE4.2 and MKL's
    conditional-reproducibility branches block and vectorise GEMM, Cholesky and TRSM
    differently, so the two sides differ in the last bits on one CPU and not another).

    Each side carries a forward error of at most about ``n * eps * cond * scale``: a
    length-``n`` sum errs by ``gamma_n ~ n eps`` of the sum of magnitudes (Higham,
    *Accuracy and Stability of Numerical Algorithms*, Thm. 3.5), and a solve with a
    matrix of condition number ``cond`` amplifies backward errors of that size by
    ``cond`` (Thm. 7.2, 10.4). The two sides differ by at most twice that: the factor is
    ``2 * n * cond``.

    Args:
        n: The longest reduction in the computation (a matrix size, a sum's length).
        cond: The condition number of the system solved (``1`` for sums and products).
    """
    cond = float(cond)
    if not (n >= 1 and cond >= 1):
        raise ValueError(f"need n >= 1 and cond >= 1, got n={n!r}, cond={cond!r}.")
    return 2.0 * n * cond


def assert_close(
    actual: Tensor,
    expected: Tensor,
    *,
    dtype: torch.dtype,
    factor: float,
    scale: float | Tensor | None = None,
    msg: str = "",
) -> None:
    r"""Norm-wise comparison: ``max|actual - expected| <= factor * eps(dtype) * scale``.

    Args:
        actual: The computed tensor (any dtype; compared in float64).
        expected: The reference (e.g. a float64 dense computation), same shape.
        dtype: The dtype whose rounding the tolerance accounts for (the dtype of the
            computation under test, not of the reference).
        factor: The conditioning factor of the computation (>= 1).
        scale: The magnitude errors are relative to; default ``max(max|expected|, 1)``.
            Pass the scale of the inputs when the result is formed by cancellation.
        msg: Context for the failure message.
    """
    a = actual.detach().to(torch.float64)
    e = expected.detach().to(torch.float64)
    if a.shape != e.shape:
        raise AssertionError(f"{msg} shapes differ: {tuple(a.shape)} vs {tuple(e.shape)}")
    if scale is None:
        scale = max(e.abs().max().item() if e.numel() else 0.0, 1.0)
    scale = float(scale)
    err = (a - e).abs().max().item() if a.numel() else 0.0
    bound = tol(dtype, factor) * scale
    if not err <= bound:  # also fails on NaN
        raise AssertionError(
            f"{msg} max abs error {err:.3e} exceeds {factor:g} * eps({dtype}) * scale "
            f"{scale:.3e} = {bound:.3e} (error / (eps * scale) = {err / (eps(dtype) * scale):.3g})"
        )


def assert_within(
    actual: Tensor, expected: Tensor, bound: float | Tensor, *, msg: str = ""
) -> None:
    r"""Elementwise comparison: ``|actual - expected| <= bound`` (``bound`` broadcasts).

    For tolerances that differ from entry to entry, e.g. a posterior standard deviation
    whose rounding error is amplified by ``1 / sigma`` where ``sigma`` is small.

    Args:
        actual: The computed tensor (compared in float64).
        expected: The reference, same shape.
        bound: The absolute error allowed at each entry (>= 0).
        msg: Context for the failure message.
    """
    a = actual.detach().to(torch.float64)
    e = expected.detach().to(torch.float64)
    if a.shape != e.shape:
        raise AssertionError(f"{msg} shapes differ: {tuple(a.shape)} vs {tuple(e.shape)}")
    b = torch.as_tensor(bound, dtype=torch.float64).expand_as(e)
    if (b < 0).any() or not torch.isfinite(b).all():
        raise ValueError(f"`bound` must be finite and >= 0, got min {b.min().item():.3e}.")
    err = (a - e).abs()
    bad = ~(err <= b)  # also catches NaN
    if bad.any():
        ratio = torch.where(b > 0, err / b, torch.full_like(err, math.inf))
        i = int(torch.nan_to_num(ratio, nan=math.inf).flatten().argmax())
        raise AssertionError(
            f"{msg} {int(bad.sum())} of {err.numel()} entries exceed their bound; worst: "
            f"error {err.flatten()[i].item():.3e} vs bound {b.flatten()[i].item():.3e} "
            f"(actual {a.flatten()[i].item():.8g}, expected {e.flatten()[i].item():.8g})"
        )


def sqrt_error(value: Tensor, err: Tensor | float) -> Tensor:
    r"""Bound on ``|sqrt(a) - sqrt(value)|`` for any ``a >= 0`` with ``|a - value| <= err``.

    ``sqrt(a) - sqrt(b) = (a - b) / (sqrt(a) + sqrt(b))``, so the error is at most
    ``err / sqrt(value)``, and never more than ``sqrt(err)``: a variance's rounding
    error is amplified by ``1 / (2 sigma)`` in ``sigma`` (the bound keeps a factor 2 of
    slack).

    Args:
        value: The exact (reference) value, ``>= 0``.
        err: The bound on the error of the value.

    Returns:
        The bound on the error of the square root, shaped like ``value``.
    """
    err = torch.as_tensor(err, dtype=value.dtype).expand_as(value)
    by_ratio = err / value.clamp_min(torch.finfo(value.dtype).tiny).sqrt()
    return torch.minimum(by_ratio, err.sqrt())


def gp_posterior_error_factors(
    K: Tensor, K_s: Tensor, k_ss: Tensor, r: Tensor, kappa: float, r_mag: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    r"""First-order rounding-error factors of a GP posterior mean and variance.

    For ``m = k_s' K^-1 r`` and ``v = k_ss - k_s' K^-1 k_s`` computed through a Cholesky
    factorisation of ``K`` in a precision with unit roundoff ``eps``, first-order
    perturbation theory (Higham, *Accuracy and Stability of Numerical Algorithms*,
    Thm. 10.4: the computed solve is exact for ``K + dK`` with
    ``|dK| <= gamma_{n+1} |L||L'|``) gives, with the kriging weights ``w = K^-1 k_s``
    and ``alpha = K^-1 r``::

        |dm| <= eps * ((n + kappa) |k_s| |alpha| + (n + kappa) |K| |w| |alpha| + |w| |r_mag| + |m|)
        |dv| <= eps * (kappa k_ss + (n + 2 kappa) |k_s| |w| + (n + kappa) |K| |w|^2 + k_ss)

    (2-norms), where ``kappa * eps`` is the relative error of each kernel entry as
    formed (squared distances, lengthscale, exp), ``n * eps`` that of a length-``n``
    dot product and of the factorisation, and the last terms are the final roundings.
    These use the conditioning of the *outputs* (``|w|``, ``|alpha|``) rather than
    ``cond(K)``, which is far more pessimistic for posterior moments.

    Args:
        K: ``n x n`` training covariance (noise included), float64.
        K_s: ``q x n`` test-train covariance.
        k_ss: ``q`` prior variances at the test points.
        r: ``n`` residuals ``y - mu``.
        kappa: Relative rounding of each kernel entry, in units of ``eps``.
        r_mag: ``n`` magnitudes the residuals were formed from (default ``|r|``; pass
            ``|y| + |mu|`` when ``y - mu`` cancels).

    Returns:
        ``(f_mean, f_var)``: ``q``-dim factors; ``eps(dtype) * f`` bounds the errors.
    """
    n = K.shape[-1]
    w = torch.linalg.solve(K, K_s.mT)  # n x q
    alpha = torch.linalg.solve(K, r.unsqueeze(-1)).squeeze(-1)
    norm_K = torch.linalg.matrix_norm(K, ord=2)
    wn, ksn, an = w.norm(dim=0), K_s.norm(dim=-1), alpha.norm()
    r_mag = r.abs() if r_mag is None else r_mag
    mean = K_s @ alpha
    f_mean = (n + kappa) * ksn * an + (n + kappa) * norm_K * wn * an + wn * r_mag.norm()
    f_mean = f_mean + mean.abs()
    f_var = kappa * k_ss + (n + 2 * kappa) * ksn * wn + (n + kappa) * norm_K * wn**2 + k_ss
    return f_mean, f_var


def gp_form_error_bounds(A, E_A, K_s, E_s, K_ss, E_ss, r, e_r):
    r"""First-order bounds on the rounding error of a GP-form posterior evaluated in
    float64: ``m = K_s A^-1 r`` (``q``) and ``C = K_ss - K_s A^-1 K_s'`` (``q x q``).

    The entries of ``A``, ``K_s``, ``K_ss``, ``r`` carry absolute errors ``E_A``,
    ``E_s``, ``E_ss``, ``e_r`` (as formed); the solve is exact for ``A + dA`` with
    ``|dA| <= n eps |A|`` and the length-``n`` dot products round by ``n eps`` of their
    terms (Higham, Thm. 10.4, 3.5). With ``alpha = A^-1 r`` and ``w = A^-1 K_s'``, to
    first order (2-norms, ``|E_A| <= ||E_A||_F``)::

        |dm_i|  <= |E_s,i| |alpha| + |w_i| (|e_r| + |E_A| |alpha|)
                   + n eps (|k_s,i| |alpha| + |A| |w_i| |alpha|) + eps |m_i|
        |dC_ij| <= E_ss,ij + |E_s,i| |w_j| + |w_i| |E_s,j| + |E_A| |w_i| |w_j|
                   + n eps (|k_s,i| |w_j| + |A| |w_i| |w_j|) + eps |C_ij|
    """
    e = eps(torch.float64)
    n = A.shape[-1]
    alpha = torch.linalg.solve(A, r)
    w = torch.linalg.solve(A, K_s.mT)  # n x q
    norm_A, norm_EA = torch.linalg.matrix_norm(A, ord=2), torch.linalg.matrix_norm(E_A)
    an, wn = alpha.norm(), w.norm(dim=0)
    ksn, esn = K_s.norm(dim=-1), E_s.norm(dim=-1)
    bound_mean = (
        esn * an
        + wn * (e_r.norm() + norm_EA * an)
        + n * e * (ksn * an + norm_A * wn * an)
        + e * (K_s @ alpha).abs()
    )
    ww = wn[:, None] * wn[None, :]
    bound_cov = (
        E_ss
        + esn[:, None] * wn[None, :]
        + wn[:, None] * esn[None, :]
        + norm_EA * ww
        + n * e * (ksn[:, None] * wn[None, :] + norm_A * ww)
        + e * (K_ss - K_s @ w).abs()
    )
    return bound_mean, bound_cov
