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
