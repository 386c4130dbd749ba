r"""Convex compact constraint sets ``Theta`` with exact batched Euclidean projections.

FedZero's update is ``x_{t+1} = Proj_Theta(x_t - eta g_t)`` ([FedZero]_, Alg. 1), and
its rate ``D L sqrt(d / (n m))`` (Cor. 3.2) involves the diameter ``D`` of ``Theta``
(Assumption 2.3). Each set here offers

- ``project(x)``: the exact Euclidean projection of every row of ``... x d`` points;
- ``contains(x, atol)``: per-row membership (``...`` booleans);
- ``diameter``: ``D`` (exact);
- ``shrink(h)``: the points whose perturbations ``x +- h z`` with ``z`` on the l1 unit
  sphere stay in the set (so that a worker only queries feasible points);
- ``describe()``: a JSON-friendly dictionary.

Parameters may carry leading batch dimensions (one set per run, e.g. ``R x d`` bounds
with ``R x d`` points); they are moved to the points' device and dtype when used.

The l1-ball and simplex projections are the sort-based algorithm of Duchi, Shalev-Shwartz,
Singer and Chandra (ICML 2008), see also Condat (Math. Program. 2016), vectorised over
the batch: ``O(d log d)`` per row, no Python loops.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from typing import Any

import torch
from torch import Tensor


def _as_param(value: Any, name: str) -> Tensor:
    if isinstance(value, bool):
        raise ValueError(f"`{name}` must be a real number or tensor, got {value!r}.")
    try:
        t = torch.as_tensor(value)
    except (TypeError, ValueError, RuntimeError) as e:
        raise ValueError(f"`{name}` must be a real number or tensor, got {value!r}.") from e
    if t.is_complex() or t.dtype == torch.bool:
        raise ValueError(f"`{name}` must be real, got dtype {t.dtype}.")
    if not t.is_floating_point():
        t = t.to(torch.float64)  # exact for Python floats; cast to the points' dtype on use
    elif not isinstance(value, Tensor):
        t = torch.as_tensor(value, dtype=torch.float64)
    if not torch.isfinite(t).all():
        raise ValueError(f"`{name}` (shape {tuple(t.shape)}) must be finite, got {t.tolist()!r}.")
    return t


def _positive(value: Any, name: str) -> Tensor:
    t = _as_param(value, name)
    if not (t > 0).all():
        raise ValueError(f"`{name}` must be > 0, got {t.tolist()!r}.")
    return t


def _points(x: Any, dim: int | None = None) -> Tensor:
    if not isinstance(x, Tensor) or not x.is_floating_point():
        raise ValueError(f"`x` must be a floating point tensor, got {type(x).__name__}.")
    if x.dim() < 1:
        raise ValueError(f"`x` must be ``... x d``, got shape {tuple(x.shape)}.")
    if dim is not None and x.shape[-1] != dim:
        raise ValueError(f"`x` must have last dimension d = {dim}, got shape {tuple(x.shape)}.")
    return x


def _default_atol(x: Tensor, scale: Tensor | float) -> Tensor:
    r"""``8 d eps(dtype) * (1 + scale)``: the rounding of a length-``d`` sum."""
    eps = torch.finfo(x.dtype).eps
    return 8 * x.shape[-1] * eps * (1 + torch.as_tensor(scale, dtype=x.dtype, device=x.device))


def _shrink_amount(h: Any) -> Tensor:
    return _positive(h, "h")


class ConvexSet(ABC):
    r"""Base class of the constraint sets (Assumption 2.3 of [FedZero]_)."""

    @abstractmethod
    def project(self, x: Tensor) -> Tensor:
        r"""The Euclidean projection of ``x`` (``... x d``) onto the set."""

    @abstractmethod
    def contains(self, x: Tensor, atol: float | Tensor | None = None) -> Tensor:
        r"""Whether each row of ``x`` lies in the set (up to ``atol``)."""

    @property
    @abstractmethod
    def diameter(self) -> float:
        r"""``D``: the largest distance between two points of the set."""

    @property
    def dim(self) -> int | None:
        return None

    @abstractmethod
    def shrink(self, h: float | Tensor) -> ConvexSet:
        r"""The points whose l1-sphere perturbations of radius ``h`` stay in the set."""

    @abstractmethod
    def describe(self) -> dict:
        r"""A JSON-friendly description."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.describe()})"


class Box(ConvexSet):
    r"""The box ``{x : lower <= x <= upper}`` (elementwise).

    Args:
        lower: ``... x d`` (or ``d``) lower bounds.
        upper: ``... x d`` upper bounds, broadcastable with ``lower``, ``lower < upper``.
    """

    def __init__(self, lower: Any, upper: Any) -> None:
        lo, up = _as_param(lower, "lower"), _as_param(upper, "upper")
        if lo.dim() < 1 and up.dim() < 1:
            raise ValueError(
                f"`lower`/`upper` need a last dimension d, got shapes {tuple(lo.shape)} and "
                f"{tuple(up.shape)}."
            )
        try:
            shape = torch.broadcast_shapes(lo.shape, up.shape)
        except RuntimeError as e:
            raise ValueError(
                f"`lower` {tuple(lo.shape)} and `upper` {tuple(up.shape)} must broadcast."
            ) from e
        dtype = torch.promote_types(lo.dtype, up.dtype)
        lo, up = lo.to(dtype).expand(shape).clone(), up.to(dtype).expand(shape).clone()
        if not (lo < up).all():
            i = int((~(lo < up)).flatten().nonzero()[0])
            raise ValueError(
                f"`lower` must be < `upper` elementwise, got lower {lo.flatten()[i].item()!r} "
                f">= upper {up.flatten()[i].item()!r} at flat index {i} (shape {tuple(shape)})."
            )
        self.lower, self.upper = lo, up

    def _params(self, x: Tensor) -> tuple[Tensor, Tensor]:
        return (
            self.lower.to(device=x.device, dtype=x.dtype),
            self.upper.to(device=x.device, dtype=x.dtype),
        )

    def project(self, x: Tensor) -> Tensor:
        r"""Clamp each coordinate: ``... x d`` -> ``... x d``."""
        x = _points(x, self.dim)
        lo, up = self._params(x)
        return torch.minimum(torch.maximum(x, lo), up)

    def contains(self, x: Tensor, atol: float | Tensor | None = None) -> Tensor:
        r"""``...`` booleans: ``lower - atol <= x <= upper + atol`` in every coordinate."""
        x = _points(x, self.dim)
        lo, up = self._params(x)
        if atol is None:
            atol = 8 * torch.finfo(x.dtype).eps * (1 + torch.maximum(lo.abs(), up.abs()))
        return ((x >= lo - atol) & (x <= up + atol)).all(dim=-1)

    @property
    def dim(self) -> int:
        return self.lower.shape[-1]

    @property
    def diameter(self) -> float:
        r"""``||upper - lower||_2`` (the largest over batched boxes)."""
        return float(torch.linalg.vector_norm(self.upper - self.lower, dim=-1).max())

    def shrink(self, h: float | Tensor) -> Box:
        r"""``[lower + h, upper - h]``: ``||h z||_inf <= ||h z||_1 = h`` for ``z`` on the l1
        unit sphere, so ``x +- h z`` stays in the box. ``h``: a float or a ``...`` tensor
        (one radius per batched box)."""
        ht = _shrink_amount(h).to(self.lower.dtype).unsqueeze(-1)
        lo, up = self.lower + ht, self.upper - ht
        if not (lo < up).all():
            raise ValueError(
                f"`h` = {_shrink_amount(h).tolist()!r} is too large: the box has a side of "
                f"length {float((self.upper - self.lower).min())} <= 2h."
            )
        return Box(lo, up)

    def describe(self) -> dict:
        return {
            "type": "Box",
            "lower": self.lower.tolist(),
            "upper": self.upper.tolist(),
            "diameter": self.diameter,
        }


class _Ball(ConvexSet):
    _kind = ""

    def __init__(self, center: Any, radius: Any = 1.0) -> None:
        c = _as_param(center, "center")
        if c.dim() < 1 or c.shape[-1] < 1:
            raise ValueError(
                f"`center` must be ``... x d`` with d >= 1, got shape {tuple(c.shape)}."
            )
        r = _positive(radius, "radius")
        try:
            torch.broadcast_shapes(r.shape, c.shape[:-1])
        except RuntimeError as e:
            raise ValueError(
                f"`radius` of shape {tuple(r.shape)} must broadcast with the batch shape "
                f"{tuple(c.shape[:-1])} of `center`."
            ) from e
        self.center, self.radius = c, r

    def _params(self, x: Tensor) -> tuple[Tensor, Tensor]:
        return (
            self.center.to(device=x.device, dtype=x.dtype),
            self.radius.to(device=x.device, dtype=x.dtype),
        )

    @property
    def dim(self) -> int:
        return self.center.shape[-1]

    @property
    def diameter(self) -> float:
        r"""``2 r`` (the largest over batched balls)."""
        return 2.0 * float(self.radius.max())

    def shrink(self, h: float | Tensor) -> _Ball:
        ht = _shrink_amount(h).to(self.radius.dtype)
        r = self.radius - ht
        if not (r > 0).all():
            raise ValueError(
                f"`h` = {ht.tolist()!r} is too large for the radius {self.radius.tolist()!r}."
            )
        return type(self)(self.center, r)

    def contains(self, x: Tensor, atol: float | Tensor | None = None) -> Tensor:
        r"""``...`` booleans: ``||x - center|| <= radius + atol``."""
        x = _points(x, self.dim)
        c, r = self._params(x)
        ord_ = 1 if self._kind == "l1" else 2
        n = torch.linalg.vector_norm(x - c, ord=ord_, dim=-1)
        if atol is None:
            atol = _default_atol(x, r + c.abs().amax(dim=-1))
        return n <= r + atol

    def describe(self) -> dict:
        return {
            "type": type(self).__name__,
            "center": self.center.tolist(),
            "radius": self.radius.tolist(),
            "diameter": self.diameter,
        }


class L2Ball(_Ball):
    r"""The Euclidean ball ``{x : ||x - center||_2 <= radius}``.

    Args:
        center: ``... x d`` (or ``d``) centres.
        radius: ``> 0``, a float or a ``...`` tensor.

    ``shrink(h)``: radius ``r - h`` (``||h z||_2 <= ||h z||_1 = h``).
    """

    _kind = "l2"

    def project(self, x: Tensor) -> Tensor:
        r"""Radial scaling of ``x - center`` onto the ball: ``... x d`` -> ``... x d``."""
        x = _points(x, self.dim)
        c, r = self._params(x)
        v = x - c
        # scaled by the largest entry: ||v|| of a finite point must not overflow
        big = v.abs().amax(-1).clamp_min(torch.finfo(v.dtype).tiny)
        n = big * torch.linalg.vector_norm(v / big.unsqueeze(-1), dim=-1)
        factor = torch.where(n > r, r / n.clamp_min(torch.finfo(x.dtype).tiny), torch.ones_like(n))
        return c + factor.unsqueeze(-1) * v


def _simplex_threshold(u_abs: Tensor, r: Tensor) -> Tensor:
    r"""Threshold ``theta`` of the projection of ``u_abs`` (``... x d``, any reals) onto
    ``{w >= 0, sum w = r}``: ``w = max(u_abs - theta, 0)`` (Duchi et al. 2008, Fig. 1)."""
    d = u_abs.shape[-1]
    mu = torch.sort(u_abs, dim=-1, descending=True).values
    css = torch.cumsum(mu, dim=-1) - r.unsqueeze(-1)
    k = torch.arange(1, d + 1, device=u_abs.device, dtype=u_abs.dtype)
    cond = mu * k > css  # mu_k - (css_k - r) / k > 0, true on a prefix (k = 1 always)
    rho = (cond * torch.arange(1, d + 1, device=u_abs.device)).amax(dim=-1, keepdim=True)
    rho = rho.clamp_min(1)
    theta = css.gather(-1, rho - 1).squeeze(-1) / rho.squeeze(-1).to(u_abs.dtype)
    return theta


class L1Ball(_Ball):
    r"""The l1 ball ``{x : ||x - center||_1 <= radius}``.

    Args:
        center: ``... x d`` (or ``d``) centres.
        radius: ``> 0``, a float or a ``...`` tensor.

    ``shrink(h)``: radius ``r - h`` (``||h z||_1 = h``).
    """

    _kind = "l1"

    def project(self, x: Tensor) -> Tensor:
        r"""Exact projection (soft thresholding of ``x - center`` at the sort-based
        threshold of Duchi et al. 2008; points inside are returned unchanged)."""
        x = _points(x, self.dim)
        c, r = self._params(x)
        v = x - c
        batch = torch.broadcast_shapes(v.shape[:-1], r.shape)  # per-run radii, one point
        v, c, x = (t.expand(*batch, t.shape[-1]) for t in (v, c.expand_as(v), x.expand_as(v)))
        a = v.abs()
        r = r.expand(batch)
        inside = a.sum(dim=-1) <= r
        theta = _simplex_threshold(a, r).clamp_min(0)
        w = torch.sign(v) * (a - theta.unsqueeze(-1)).clamp_min(0)
        return torch.where(inside.unsqueeze(-1), x, c + w)


class Simplex(ConvexSet):
    r"""The scaled probability simplex ``{x : x >= 0, sum_j x_j = radius}`` (any ``d``).

    Args:
        radius: ``> 0``, a float or a tensor of batch shape ``...`` (one per run).

    The simplex has an empty interior in ``R^d``, so ``shrink`` is not defined.
    """

    def __init__(self, radius: Any = 1.0) -> None:
        self.radius = _positive(radius, "radius")

    def project(self, x: Tensor) -> Tensor:
        r"""Exact sort-based projection (Duchi et al. 2008): ``... x d`` -> ``... x d``."""
        x = _points(x)
        r = self.radius.to(device=x.device, dtype=x.dtype)
        try:
            r = r.expand(x.shape[:-1])
        except RuntimeError as e:
            raise ValueError(
                f"`radius` of shape {tuple(r.shape)} must broadcast to the batch shape "
                f"{tuple(x.shape[:-1])} of `x`."
            ) from e
        theta = _simplex_threshold(x, r)
        return (x - theta.unsqueeze(-1)).clamp_min(0)

    def contains(self, x: Tensor, atol: float | Tensor | None = None) -> Tensor:
        r"""``...`` booleans: ``x >= -atol`` and ``|sum x - radius| <= atol``."""
        x = _points(x)
        r = self.radius.to(device=x.device, dtype=x.dtype)
        if atol is None:
            atol = _default_atol(x, r)
        atol = torch.as_tensor(atol, dtype=x.dtype, device=x.device)
        nonneg = (x >= -atol.unsqueeze(-1)).all(dim=-1)
        return nonneg & ((x.sum(dim=-1) - r).abs() <= atol)

    @property
    def diameter(self) -> float:
        r"""``radius * sqrt(2)`` (the distance between two vertices; ``d >= 2``)."""
        return math.sqrt(2.0) * float(self.radius.max())

    def shrink(self, h: float | Tensor) -> Simplex:
        raise NotImplementedError(
            "Simplex.shrink: the simplex has an empty interior in R^d (it lies in the "
            "hyperplane sum x = radius), so no point x has x +- h z inside it for all z on "
            "the l1 sphere; optimise over a full-dimensional set (Box, L1Ball, L2Ball) "
            "or reparametrise."
        )

    def describe(self) -> dict:
        return {"type": "Simplex", "radius": self.radius.tolist(), "diameter": self.diameter}
