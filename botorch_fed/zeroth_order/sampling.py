r"""Random directions for two-point zeroth-order gradient estimators [FedZero]_.

- :func:`sample_l1_sphere`: uniform on the l1 unit sphere ``dB_1^d``, as a standard
  Laplace vector divided by its l1 norm ([FedZero]_, Definition 6.1 and Sec. 4; the
  coordinates ``|z_j|`` are then jointly Dirichlet(1, ..., 1), so ``|z_1| ~ Beta(1, d-1)``).
- :func:`sample_l2_sphere`: uniform on the l2 unit sphere, a Gaussian vector divided by
  its l2 norm.
- :func:`l1_sign`: the sign with ``sign(0) = +1`` used by the l1 estimator (Alg. 1).

All samplers draw from a seeded ``torch.Generator`` when one is given, on the
generator's device, and move the draw to ``device`` afterwards.
"""

from __future__ import annotations

import torch
from torch import Tensor


def _check_shape(batch_shape: tuple, d: object) -> tuple[int, ...]:
    if isinstance(d, bool) or not isinstance(d, int) or d < 1:
        raise ValueError(f"`d` must be an integer >= 1, got {d!r}.")
    for b in batch_shape:
        if isinstance(b, bool) or not isinstance(b, int) or b < 0:
            raise ValueError(
                f"`batch_shape` must be non-negative integers, got {tuple(batch_shape)!r}."
            )
    return tuple(batch_shape) + (d,)


def _resolve(
    generator: torch.Generator | None,
    device: torch.device | str | None,
    dtype: torch.dtype | None,
) -> tuple[torch.device, torch.device, torch.dtype]:
    r"""(draw device, output device, dtype)."""
    dtype = torch.get_default_dtype() if dtype is None else dtype
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ValueError(f"`dtype` must be a floating point torch.dtype, got {dtype!r}.")
    out = torch.device("cpu") if device is None else torch.device(device)
    if generator is not None and not isinstance(generator, torch.Generator):
        raise ValueError(f"`generator` must be a torch.Generator or None, got {generator!r}.")
    draw = out if generator is None else torch.device(generator.device)
    return draw, out, dtype


def sample_l1_sphere(
    *batch_shape: int,
    d: int,
    generator: torch.Generator | None = None,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
) -> Tensor:
    r"""Draw points uniformly on the l1 unit sphere ``{z : ||z||_1 = 1}``.

    A standard Laplace vector ``x`` (i.i.d. coordinates with density ``exp(-|x|)/2``)
    divided by its l1 norm is uniform on ``dB_1^d`` ([FedZero]_, Definition 6.1 and the
    representation used in Sec. 4). The Laplace magnitudes are ``-log(1 - w)`` for
    ``w`` uniform in ``[0, 1)`` (finite: ``1 - w > 0``), with independent uniform signs;
    both come from one uniform ``u`` per coordinate (sign: ``u < 1/2``; ``w = 2u mod 1``,
    which keeps one bit less resolution than ``u``).
    A zero magnitude (``u = 0``) is clamped to the smallest normal number of the dtype,
    so the l1 norm is never 0 and the result never NaN.

    Args:
        *batch_shape: Leading batch dimensions (non-negative integers).
        d: The dimension (``>= 1``).
        generator: Optional seeded generator; the draw happens on its device.
        device: Device of the result (default CPU, like torch factories).
        dtype: Floating dtype of the result (default ``torch.get_default_dtype()``).

    Returns:
        ``*batch_shape x d`` points with ``||z||_1 = 1`` (to rounding).
    """
    shape = _check_shape(batch_shape, d)
    draw, out, dtype = _resolve(generator, device, dtype)
    # one uniform per coordinate: its half (u < 1/2) is the sign, 2u mod 1 (uniform on
    # [0, 1), independent of the half) the magnitude -log(1 - w) (a throughput choice:
    # the random-number generator is the cost of a large batch)
    u = torch.rand(shape, generator=generator, device=draw, dtype=dtype)
    mag = torch.mul(u, 2).frac_().neg_().log1p_().neg_().clamp_min_(torch.finfo(dtype).tiny)
    total = mag.sum(dim=-1, keepdim=True)
    z = mag.copysign_(u.sub_(0.5)).div_(total)  # u = 1/2 gives +0.0: a positive sign
    return z.to(out)


def sample_l2_sphere(
    *batch_shape: int,
    d: int,
    generator: torch.Generator | None = None,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
) -> Tensor:
    r"""Draw points uniformly on the l2 unit sphere ``{z : ||z||_2 = 1}``.

    A standard Gaussian vector divided by its l2 norm; a (probability-zero) all-zero
    draw is replaced by the first basis vector, so the result is never NaN.

    Args:
        *batch_shape: Leading batch dimensions (non-negative integers).
        d: The dimension (``>= 1``).
        generator: Optional seeded generator; the draw happens on its device.
        device: Device of the result (default CPU).
        dtype: Floating dtype of the result (default ``torch.get_default_dtype()``).

    Returns:
        ``*batch_shape x d`` points with ``||z||_2 = 1`` (to rounding).
    """
    shape = _check_shape(batch_shape, d)
    draw, out, dtype = _resolve(generator, device, dtype)
    g = torch.randn(shape, generator=generator, device=draw, dtype=dtype)
    norm = torch.linalg.vector_norm(g, dim=-1, keepdim=True)
    e1 = torch.zeros(d, device=draw, dtype=dtype)
    e1[0] = 1.0
    z = torch.where(norm > 0, g / norm.clamp_min(torch.finfo(dtype).tiny), e1)
    return z.to(out)


def l1_sign(z: Tensor) -> Tensor:
    r"""Elementwise sign with the convention ``sign(0) = +1`` ([FedZero]_, Alg. 1).

    Args:
        z: Any real tensor.

    Returns:
        ``+1`` where ``z >= 0`` (``-0.0`` included), ``-1`` elsewhere; same shape, dtype
        and device as ``z``.
    """
    if not isinstance(z, Tensor):
        raise ValueError(f"`z` must be a torch.Tensor, got {type(z).__name__}.")
    if torch.isnan(z).any():
        raise ValueError(f"`z` (shape {tuple(z.shape)}) contains NaN; its sign is undefined.")
    one = torch.ones((), dtype=z.dtype, device=z.device)
    return torch.where(z >= 0, one, -one)
