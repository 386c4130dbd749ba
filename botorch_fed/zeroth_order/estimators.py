r"""Two-point zeroth-order gradient estimators [FedZero]_.

With ``z`` uniform on a unit sphere and ``h > 0``, one estimate per row of ``x``::

    l1 (Alg. 1):  g = d / (2h) * (f(x + h z) - f(x - h z)) * sign(z),   z ~ U(dB_1^d)
    l2:           g = d / (2h) * (f(x + h z) - f(x - h z)) * z,         z ~ U(dB_2^d)

Both are unbiased for the gradient of the smoothed function ``f_h(x) = E f(x + h U)``
with ``U`` uniform in the unit ball of the same norm ([FedZero]_, Sec. 3: ``E[g | x] =
grad f_h(x)``, Lemma 14.1 / Akhavan et al. 2022, Lemma 1); for linear ``f`` this is the
gradient itself.

``f`` is evaluated exactly once per side on the whole ``... x d`` tensor of perturbed
points, so a worker batch (``m x d``) or a batch of runs (``R x m x d``) is one call.
On the CPU the l1 estimator writes those points into a buffer that each thread keeps
between calls (up to ``SCRATCH_MAX_BYTES``; :func:`release_scratch` frees it): a fresh
buffer of this size costs as much to fault in as the estimate itself. ``f`` may keep
its inputs or return views of them: a buffer that anything still refers to when ``f``
returns is left to it and never written again.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from botorch_fed.zeroth_order import sampling
from botorch_fed.zeroth_order.sampling import _WORDS, _laplace_and_norm, _resolve, sample_l2_sphere


def check_points(x: Any, name: str = "x") -> Tensor:
    r"""Validate a floating, finite ``... x d`` tensor with ``d >= 1``."""
    if not isinstance(x, Tensor):
        raise ValueError(f"`{name}` must be a torch.Tensor, got {type(x).__name__}.")
    if not x.is_floating_point():
        raise ValueError(f"`{name}` must be a floating point tensor, got dtype {x.dtype}.")
    if x.dim() < 1 or x.shape[-1] < 1:
        raise ValueError(f"`{name}` must be ``... x d`` with d >= 1, got shape {tuple(x.shape)}.")
    # a finite sum means every entry is finite (NaN and inf propagate); only a sum that
    # overflowed needs the elementwise check. A broadcast dimension (stride 0, e.g. every
    # worker at one x_t) repeats its first entry: checking that entry is enough
    stored = x[tuple(slice(0, 1) if st == 0 else slice(None) for st in x.stride())]
    if not bool(torch.isfinite(stored.sum())) and not bool(torch.isfinite(stored).all()):
        raise ValueError(f"`{name}` (shape {tuple(x.shape)}) must be finite.")
    return x


def check_positive(value: Any, name: str, batch: torch.Size, like: Tensor) -> Tensor:
    r"""A positive finite float or tensor broadcastable to ``batch``, as a tensor on
    ``like``'s device and dtype (shape unchanged)."""
    if isinstance(value, bool):
        raise ValueError(f"`{name}` must be a positive number or tensor, got {value!r}.")
    try:
        t = torch.as_tensor(value, dtype=like.dtype, device=like.device)
    except (TypeError, ValueError, RuntimeError) as e:
        raise ValueError(f"`{name}` must be a positive number or tensor, got {value!r}.") from e
    if isinstance(value, Tensor) and value.is_complex():
        raise ValueError(f"`{name}` must be real, got dtype {value.dtype}.")
    try:
        ok = torch.broadcast_shapes(t.shape, batch) == batch
    except RuntimeError:
        ok = False
    if not ok:
        raise ValueError(
            f"`{name}` of shape {tuple(t.shape)} must broadcast to the batch shape {tuple(batch)}."
        )
    if not (torch.isfinite(t).all() and (t > 0).all()):
        bad = t[~(torch.isfinite(t) & (t > 0))].flatten()[0].item()
        raise ValueError(
            f"`{name}` must be positive and finite, got {bad!r} (shape {tuple(t.shape)})."
        )
    return t


def _evaluate(f: Callable, xs: Tensor, context: Any, batch: torch.Size, side: str) -> Tensor:
    y = f(xs) if context is None else f(xs, context)
    if not isinstance(y, Tensor):
        try:
            y = torch.as_tensor(y, dtype=xs.dtype, device=xs.device)
        except (TypeError, ValueError, RuntimeError) as e:
            raise ValueError(
                f"`f` must return a tensor of shape {tuple(batch)}, got {type(y).__name__}."
            ) from e
    if y.shape == batch + (1,):
        y = y.squeeze(-1)
    if y.shape != batch:
        raise ValueError(
            f"`f` must return one value per row: expected shape {tuple(batch)} (or "
            f"{tuple(batch) + (1,)}) for points of shape {tuple(xs.shape)}, got "
            f"{tuple(y.shape)} (at x {side} h z)."
        )
    y = y.to(device=xs.device, dtype=xs.dtype)
    if not torch.isfinite(y).all():
        raise ValueError(
            f"`f` returned non-finite values at x {side} h z (shape {tuple(y.shape)}): "
            f"{int((~torch.isfinite(y)).sum())} of {y.numel()} entries."
        )
    return y


def _addcmul(x: Tensor, lap: Tensor, step: Tensor, value: int, out: Tensor | None) -> Tensor:
    r"""``x + value * lap * step``, into ``out`` where one is given and no derivative is
    being taken (``out=`` has none: an ``x`` or ``h`` that requires grad, or forward-mode
    AD, takes the out-of-place op, which raises any genuine error again)."""
    if out is not None:
        with contextlib.suppress(RuntimeError):
            return torch.addcmul(x, lap, step, value=value, out=out)
    return torch.addcmul(x, lap, step, value=value)


# Scratch memory for the points f is evaluated at, kept per thread between calls. Memory
# that the allocator has returned to the kernel is faulted in again page by page when it
# is reused: 1.5-4 ms per 4 MB on our 2-core VM, as much as a whole estimate at
# m = d = 1000, and glibc trims its heap whenever the free memory at its top exceeds
# twice the largest recent allocation, which three freed buffers per call did. Only
# buffers up to SCRATCH_MAX_BYTES are kept (one per thread); f gets the buffer only
# while nothing else holds it (``_holders``).
SCRATCH_MAX_BYTES = 32 << 20
_scratch = threading.local()


def release_scratch() -> None:
    r"""Free the calling thread's kept scratch buffer (up to ``SCRATCH_MAX_BYTES``), e.g.
    in a long-lived worker thread that is done with large estimates; the next l1
    estimate on this thread allocates a new one."""
    _scratch.buffer = None


def _plain(x: Tensor) -> bool:
    r"""Whether ``x`` is a plain tensor and no torch function or dispatch mode is active:
    a subclass or a mode can keep any op's output (the buffer included) before the
    references are counted, so none of them ever gets a reused buffer."""
    try:
        modes = torch._C._len_torch_function_stack() + torch._C._len_torch_dispatch_stack()
    except AttributeError:
        return False
    return type(x) is Tensor and modes == 0


def _take_scratch(shape: torch.Size, x: Tensor) -> Tensor | None:
    r"""This thread's kept buffer for ``shape`` points of ``x``'s dtype, or a new one;
    None where the random-word sampler does not run (off the CPU, other dtypes, small
    batches), the buffer would be larger than ``SCRATCH_MAX_BYTES``, or ``x`` is not
    plain (``_plain``)."""
    numel = shape.numel()
    if (
        x.device.type != "cpu"
        or x.dtype not in _WORDS
        or numel < sampling.WORDS_MIN_NUMEL
        or numel * x.element_size() > SCRATCH_MAX_BYTES
        or not _plain(x)
    ):
        return None
    buffer = getattr(_scratch, "buffer", None)
    _scratch.buffer = None  # this call holds it until it gives it back
    if buffer is None or buffer.shape != shape or buffer.dtype != x.dtype:
        buffer = torch.empty(shape, dtype=x.dtype)
    return buffer


def _holders(t: Tensor) -> tuple | None:
    r"""Everything that counts the references to ``t`` and its memory, and where that
    memory is: Python references to the tensor and to its storage object, weak
    references to either, C++ references to the tensor (autograd, DLPack) and to the
    storage (views, NumPy arrays), shared memory, and the data pointers, shape and
    strides (``set_`` or ``resize_`` swap the memory). None off the CPU (``f`` may still
    be reading the buffer on another stream when it returns), where this torch does not
    expose the counts, or where ``t`` is not plain (``_plain``): the buffer is then never
    reused."""
    if t.device.type != "cpu" or not _plain(t):
        return None
    try:
        storage = t.untyped_storage()
        return (
            sys.getrefcount(t),
            weakref.getweakrefcount(t),
            t._use_count(),  # type: ignore[attr-defined]  # private, not in torch's stubs
            torch._C._storage_Use_Count(storage._cdata),
            sys.getrefcount(storage),
            weakref.getweakrefcount(storage),
            t.is_shared(),
            t.data_ptr(),
            storage.data_ptr(),
            storage.nbytes(),
            t.shape,
            t.stride(),
        )
    except (AttributeError, RuntimeError, TypeError):
        return None


def _two_point(
    f: Callable,
    x: Tensor,
    h: float | Tensor,
    generator: torch.Generator | None,
    context: Any,
    return_values: bool,
    norm: str,
) -> Tensor | tuple[Tensor, Tensor, Tensor, Tensor]:
    if not callable(f):
        raise ValueError(f"`f` must be callable, got {type(f).__name__}.")
    x = check_points(x)
    batch, d = x.shape[:-1], x.shape[-1]
    h_t = check_positive(h, "h", batch, x)
    if isinstance(context, Tensor) and context.shape[: len(batch)] != batch:
        raise ValueError(
            f"`context` must hold one context per row: leading shape {tuple(batch)}, got "
            f"{tuple(context.shape)}."
        )
    spare = scratch = None
    if norm == "l1":
        # the Laplace vector ``lap`` and its norm, never z = lap / norm itself (one pass less)
        draw, _, _ = _resolve(generator, x.device, x.dtype)
        if draw.type == "cpu":
            scratch = _take_scratch(batch + (d,), x)
        lap, total, spare = _laplace_and_norm(batch + (d,), generator, draw, x.dtype, scratch)
        if lap.device != x.device:
            lap, total, spare = lap.to(x.device), total.to(x.device), None
        step = (h_t.unsqueeze(-1) / total).expand(*batch, 1)
    else:
        lap = sample_l2_sphere(*batch, d=d, generator=generator, device=x.device, dtype=x.dtype)
        step = h_t.unsqueeze(-1).expand(*batch, 1)
    # x +- h z, one fused pass each, x + h z into the sampler's spare buffer. f never gets
    # a tensor that is written afterwards while anything else holds it: x - h z goes into
    # the same buffer only when f left nothing behind that refers to it (``_holders``
    # counts the same before and after the call), and the scratch buffer is kept for the
    # next call on the same condition
    points = _addcmul(x, lap, step, 1, spare)
    held = _holders(points) if points is spare else None
    y_plus = _evaluate(f, points, context, batch, "+")
    reuse = held is not None and _holders(points) == held
    points = _addcmul(x, lap, step, -1, spare if reuse else None)
    held = _holders(points) if points is scratch else None
    y_minus = _evaluate(f, points, context, batch, "-")
    if held is not None and _holders(points) == held:
        _scratch.buffer = points
    del points
    scale = (d / (2.0 * h_t)) * (y_plus - y_minus)
    z = lap / total if (return_values and norm == "l1") else lap
    if norm == "l1":  # scale * sign(z), sign(0) = +1: the sampler never returns +-0
        g = lap.sign_().mul_(scale.unsqueeze(-1))
    else:
        g = scale.unsqueeze(-1) * lap
    if return_values:
        return g, z, y_plus, y_minus
    return g


def l1_gradient(
    f: Callable,
    x: Tensor,
    h: float | Tensor,
    generator: torch.Generator | None = None,
    context: Any = None,
    return_values: bool = False,
) -> Tensor | tuple[Tensor, Tensor, Tensor, Tensor]:
    r"""The l1-sphere two-point gradient estimator of [FedZero]_ (Alg. 1).

    ``g = d / (2h) * (f(x + h z) - f(x - h z)) * sign(z)`` with ``z`` uniform on the l1
    unit sphere and ``sign(0) = +1``; ``E[g | x] = grad f_h(x)`` with ``f_h(x) =
    E f(x + h U)``, ``U`` uniform in the l1 unit ball (Sec. 3).

    Args:
        f: Called exactly once per side, ``f(x + h z)`` and ``f(x - h z)`` (or
            ``f(., context)`` when ``context`` is not None) on ``... x d`` points;
            returns ``...`` (or ``... x 1``) finite values.
        x: ``... x d`` points, one independent estimate per row.
        h: Perturbation radius ``> 0``: a float or a tensor broadcastable to ``...``
            (e.g. ``R x 1`` for per-run radii over ``R x m`` rows).
        generator: Optional seeded generator for the directions.
        context: Passed unchanged as the second argument of ``f`` on both sides (e.g.
            a worker's sampled data index, one per row: a tensor must have leading
            shape ``...``).
        return_values: Also return the directions and the two evaluations.

    Returns:
        ``g`` (``... x d``), or ``(g, z, y_plus, y_minus)`` with ``z`` ``... x d`` and
        the values ``...`` when ``return_values``.
    """
    return _two_point(f, x, h, generator, context, return_values, "l1")


def l2_gradient(
    f: Callable,
    x: Tensor,
    h: float | Tensor,
    generator: torch.Generator | None = None,
    context: Any = None,
    return_values: bool = False,
) -> Tensor | tuple[Tensor, Tensor, Tensor, Tensor]:
    r"""The l2-sphere two-point gradient estimator (the baseline of [FedZero]_).

    ``g = d / (2h) * (f(x + h z) - f(x - h z)) * z`` with ``z`` uniform on the l2 unit
    sphere; ``E[g | x] = grad f_h(x)`` with ``U`` uniform in the l2 unit ball.
    Arguments and returns as in :func:`l1_gradient`.
    """
    return _two_point(f, x, h, generator, context, return_values, "l2")


ESTIMATORS: dict[str, Callable] = {"l1": l1_gradient, "l2": l2_gradient}


def get_estimator(estimator: str | Callable) -> Callable:
    r"""Look up an estimator by name (``"l1"``, ``"l2"``) or pass a callable through."""
    if callable(estimator):
        return estimator
    if isinstance(estimator, str) and estimator in ESTIMATORS:
        return ESTIMATORS[estimator]
    raise ValueError(
        f"`estimator` must be one of {sorted(ESTIMATORS)} or a callable, got {estimator!r}."
    )
