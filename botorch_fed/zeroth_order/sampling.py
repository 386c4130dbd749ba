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

import math

import numpy as np
import torch
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
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


# a random 32-/64-bit word -> the float 1 + w, w = mantissa bits * 2^-p uniform on [0, 1):
# the mantissa bits kept (_MANTISSA), sign and exponent set to those of +1.0 (_ONE)
_MANTISSA = {torch.float32: (1 << 23) - 1, torch.float64: (1 << 52) - 1}
_ONE = {torch.float32: 0x3F800000, torch.float64: 0x3FF0000000000000}
_HALF_ULP = {torch.float32: 2.0**-24, torch.float64: 2.0**-53}
_WORDS = {torch.float32: torch.int32, torch.float64: torch.int64}
# below this many coordinates torch.rand is cheaper (setting up the cipher costs ~20 us)
WORDS_MIN_NUMEL = 1 << 15
# the keystream is made by encrypting this many zero bytes at a time (fits a core's L2)
_ZEROS = memoryview(bytes(1 << 18))


def _random_words(n: int, generator: torch.Generator | None, dtype: torch.dtype) -> Tensor:
    r"""``n`` uniformly random 32-bit (float32) or 64-bit (float64) words on the CPU.

    The words are the keystream of AES-128 in counter mode (``cryptography``, i.e.
    OpenSSL with the processor's AES instructions: about twice the throughput of NumPy's
    fastest bit generator, SFC64, and four to six times that of torch's CPU Mersenne
    Twister, which is the cost of a large batch), written straight into one buffer and
    read as little-endian words (the same words on every host). The 128-bit key is
    four 32-bit draws of ``generator`` (torch's default CPU generator when None), fresh
    for every call, so the counter starts at 0: the words are reproducible from the
    generator's state (and so are not secret) and advance it (k calls repeat a key with
    probability below k^2 / 2^129). AES-CTR is a strong pseudo-random generator (the
    core of NIST SP 800-90A's CTR_DRBG); far below its 2^64-block distinguishing bound.
    """
    key = torch.randint(0, 1 << 32, (4,), generator=generator, dtype=torch.int64, device="cpu")
    nbytes = n * torch.finfo(dtype).bits // 8
    # cryptography asks for block size - 1 bytes of room after each chunk it encrypts
    raw = np.empty(nbytes + 16, dtype=np.uint8)
    # numpy declares ndarray.__buffer__ for Python >= 3.12 only
    out = memoryview(raw)  # type: ignore[arg-type]
    stream = Cipher(algorithms.AES(key.numpy().astype("<u4").tobytes()), modes.CTR(bytes(16)))
    encryptor = stream.encryptor()
    for start in range(0, nbytes, len(_ZEROS)):
        size = min(len(_ZEROS), nbytes - start)
        encryptor.update_into(_ZEROS[:size], out[start : start + size + 15])
    little = raw[:nbytes].view("<i4" if dtype == torch.float32 else "<i8")
    return torch.from_numpy(little.astype(little.dtype.newbyteorder("="), copy=False))


def _laplace_and_norm(
    shape: tuple[int, ...],
    generator: torch.Generator | None,
    draw: torch.device,
    dtype: torch.dtype,
    out: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    r"""A standard Laplace vector per row, up to a positive factor, and its l1 norm,
    drawn on ``draw``; the direction ``lap / norm`` is uniform on the l1 unit sphere.

    Each coordinate is ``s * e`` with an independent uniform sign ``s`` and magnitude
    ``e = -log(u)``, ``u`` uniform on ``(0, 1]`` (so ``e`` is Exp(1), finite). On the
    CPU in float32/float64, from ``WORDS_MIN_NUMEL`` coordinates on, both come from one
    random word per coordinate: the sign is the word's top bit; ``w``, its ``p`` = 23/52
    low bits over ``2^p``, is moved to the middle of its bin, ``u = w + 2^-(p+1)``
    (exact, in ``(0, 1)``: ``e`` is never 0); and the magnitudes are ``e / ln 2 =
    -log2(u)`` (the common factor cancels in the direction). Otherwise both come from
    one ``torch.rand`` uniform ``v`` (sign ``v < 1/2``, ``u = 1 - (2v mod 1)``; a zero
    magnitude is clamped to the smallest normal number of the dtype). The norm is never 0.

    Args:
        out: Optional contiguous CPU ``shape`` buffer of ``dtype`` to use as the spare
            buffer (the random-word path only; ignored otherwise).

    Returns:
        ``shape`` (scaled) Laplace vectors, their ``shape[:-1] x 1`` l1 norms, and a spare
        ``shape`` buffer of the same dtype that the caller may overwrite (``out`` where it
        was used; fewer fresh allocations: the cost of a large batch on the CPU is mostly
        memory traffic and page faults).
    """
    numel = math.prod(shape)
    if draw.type == "cpu" and dtype in _WORDS and numel >= WORDS_MIN_NUMEL:
        words = _random_words(numel, generator, dtype).view(shape)
        mag = torch.bitwise_and(
            words, _MANTISSA[dtype], out=None if out is None else out.view(words.dtype)
        )
        mag = mag.bitwise_or_(_ONE[dtype]).view(dtype)
        # (1 + w) - (1 - 2^-(p+1)) = w + 2^-(p+1) exactly (the constant and the result
        # are representable): u on the midpoints of w's bins, in (0, 1)
        mag.sub_(1 - _HALF_ULP[dtype])
        # log2 u = -e / ln 2 < 0: NumPy's vectorised log2 (SVML where the processor has
        # AVX-512) takes a third of torch's log1p; the factor 1 / ln 2 cancels in z
        as_array = mag.numpy()
        np.log2(as_array, out=as_array)
        total = mag.sum(dim=-1, keepdim=True).neg_()
        # copysign reads only the sign bit of the word (whatever float its bits make)
        lap = torch.copysign(mag, words.view(dtype), out=words.view(dtype))
        return lap, total, mag if out is None else out  # mag is a view of all of out
    u = torch.rand(shape, generator=generator, device=draw, dtype=dtype)
    mag = torch.mul(u, 2).frac_().neg_().log1p_().neg_().clamp_min_(torch.finfo(dtype).tiny)
    total = mag.sum(dim=-1, keepdim=True)
    return mag.copysign_(u.sub_(0.5)), total, u  # u = 1/2 gives +0.0: a positive sign


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
    representation used in Sec. 4). The Laplace magnitudes are ``-log(u)`` for ``u``
    uniform in ``(0, 1]`` (finite), with independent uniform signs; both come from one
    random word per coordinate (see ``_laplace_and_norm``). A zero
    magnitude is clamped to the smallest normal number of the dtype, so the l1 norm is
    never 0, no coordinate is ``+-0`` and the result is never NaN. A seeded draw is
    reproducible on one machine; across processors its signs agree exactly and its
    values to a few ulp (NumPy's ``log2`` takes SVML on AVX-512, libm elsewhere).

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
    lap, total, _ = _laplace_and_norm(shape, generator, draw, dtype)
    return lap.div_(total).to(out)


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
