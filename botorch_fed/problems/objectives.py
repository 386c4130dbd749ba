r"""The black boxes clients evaluate, seen through the unit cube ``[0, 1]^d``: an
:class:`Objective` maps unit-cube points to its ``bounds`` and reports values in the
user's convention (``minimize``), with what [LDP-BO] (paper 002, Sec. 2, 5.1) may assume
known (a finite domain, ``B >= |f|``, ``R >= |noise|``, the kernel).
"""

from __future__ import annotations

import hashlib
import math
from abc import ABC, abstractmethod
from collections.abc import Callable

import numpy as np
import torch
from botorch.utils.transforms import unnormalize
from torch import Tensor


class EvaluationError(RuntimeError):
    r"""A client's black box raised or returned a non-finite value."""


class ObjectiveContractError(TypeError):
    r"""A callable returned something that is not one number per point (a bug in the
    callable, not a failed evaluation: always raised)."""


def _float64(value, name: str, shape: str) -> Tensor:
    if isinstance(value, Tensor):
        value = value.detach().cpu()
    try:
        return torch.as_tensor(np.asarray(value, dtype=np.float64), dtype=torch.float64)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"`{name}` must be {shape} array of numbers, got {value!r:.80}.") from exc


def check_bounds(bounds, name: str = "bounds") -> Tensor:
    r"""``bounds`` (lower row, upper row) as a ``2 x d`` float64 CPU tensor, or a
    ``ValueError`` naming ``name``."""
    b = _float64(bounds, name, "a 2 x d")
    if b.ndim != 2 or b.shape[0] != 2 or b.shape[1] < 1:
        hint = ""
        if b.ndim == 2 and b.shape[1] == 2:
            hint = (
                " It looks like one [lower, upper] pair per dimension: BoTorch's bounds are "
                "the lower row then the upper row, i.e. the transpose."
            )
        raise ValueError(
            f"`{name}` must have shape 2 x d (lower bounds, then upper bounds) with d >= 1, "
            f"got {tuple(b.shape)}.{hint}"
        )
    if not torch.isfinite(b).all():
        raise ValueError(f"`{name}` must be finite, got {b.tolist()}.")
    bad = (b[0] >= b[1]).nonzero().flatten().tolist()
    if bad:
        raise ValueError(
            f"`{name}`: every lower bound must be below its upper bound; not so in "
            f"dimension(s) {bad} ({b[:, bad].T.tolist()})."
        )
    return b


def check_candidates(candidates, bounds: Tensor, name: str = "candidates") -> Tensor:
    r"""``n >= 1`` points within ``bounds`` (``n x d``; 1-D when ``d = 1``) as ``n x d``
    float64 unit-cube points, or a ``ValueError`` naming ``name`` and the first bad row."""
    c, d = _float64(candidates, name, "an n x d"), bounds.shape[-1]
    if c.ndim == 1 and d == 1:
        c = c.unsqueeze(-1)
    if c.ndim >= 1 and c.shape[0] == 0:
        raise ValueError(f"`{name}`: empty domain (0 points); give at least one point.")
    if c.ndim != 2 or c.shape[-1] != d:
        raise ValueError(f"`{name}` must have shape n x {d}, got {tuple(c.shape)}.")
    if not torch.isfinite(c).all():
        row = int((~torch.isfinite(c).all(dim=-1)).nonzero()[0])
        raise ValueError(f"`{name}` must be finite; row {row} is {c[row].tolist()}.")
    outside = ((c < bounds[0]) | (c > bounds[1])).any(dim=-1)
    if outside.any():
        rows = outside.nonzero().flatten().tolist()
        raise ValueError(
            f"`{name}` must lie within the bounds {bounds.tolist()}; {len(rows)} point(s) "
            f"do not, e.g. row {rows[0]}: {c[rows[0]].tolist()}."
        )
    return ((c - bounds[0]) / (bounds[1] - bounds[0])).clamp(0.0, 1.0)


def check_declared_bound(value, name: str, allow_inf: bool = False) -> float | None:
    r"""A declared bound ``B`` or ``R`` (``None`` or a number ``>= 0``) as a float, or
    ``None``; with ``allow_inf``, ``math.inf`` (unbounded) is ``None`` too."""
    if value is None or (
        allow_inf and isinstance(value, float | np.floating) and value == math.inf
    ):
        return None
    if (
        isinstance(value, bool | np.bool_)
        or not isinstance(value, int | float | np.integer | np.floating)
        or not 0 <= value < math.inf
    ):
        raise ValueError(f"`{name}`={value!r} must be a finite number >= 0.")
    return float(value)


def check_unit(X: Tensor, dim: int, batch: bool = False) -> Tensor:
    r"""``X`` if it holds ``n x dim`` (``batch``: ``... x dim``) points of the unit cube."""
    if X.shape[-1:] != (dim,) or not (batch or X.ndim == 2):
        raise ValueError(f"`X` must have shape n x {dim}, got {tuple(X.shape)}.")
    if not torch.isfinite(X).all() or (X < 0).any() or (X > 1).any():
        raise ValueError("`X` must lie in the unit cube [0, 1]^d.")
    return X


class Objective(ABC):
    r"""A client's black box, evaluated at unit-cube points.

    Attributes:
        bounds: ``2 x d`` float64 bounds of the user's domain.
        minimize: Whether smaller values are better.
        name: A name for result tables.
        optimal_value: The known optimum (``None``: unknown, as below).
        optimum_bound: A value no point does better than (up to the rounding of a
            declared optimum), where the optimum itself may be unknown (a moved test
            function: the function's optimum); ``None``: none known.
        candidates: A finite domain as ``n x d`` float64 unit-cube points.
        reward_bound: ``B`` with ``|f(x)| <= B``.
        noise_bound: ``R`` with ``|noise| <= R`` almost surely (``0.0``: noise-free).
        kernel_hint: The kernel that generated ``f``, e.g. ``{"kernel": "se",
            "lengthscale": 0.2, "nu": 2.5}`` (unit-cube lengthscale).
    """

    bounds: Tensor
    minimize: bool = True
    name: str = "objective"
    optimal_value: float | None = None
    optimum_bound: float | None = None
    candidates: Tensor | None = None
    reward_bound: float | None = None
    noise_bound: float | None = None
    kernel_hint: dict | None = None

    @property
    def dim(self) -> int:
        r"""The input dimension ``d``."""
        return self.bounds.shape[-1]

    def to_domain(self, X: Tensor) -> Tensor:
        r"""``n x d`` unit-cube points as ``n x d`` float64 points within ``bounds``."""
        X = check_unit(X, self.dim)
        return unnormalize(X.to(torch.float64), self.bounds.to(X.device))

    @abstractmethod
    def evaluate(self, X: Tensor) -> tuple[Tensor, Tensor]:
        r"""``(observed, reported)`` at ``n x d`` unit-cube points: ``n`` float64 values
        each, what the client learns from and what results report (noise-free if known)."""

    def state_dict(self) -> dict:
        r"""State that evolves between evaluations (e.g. a noise generator)."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        r"""Restore :meth:`state_dict` (checkpoints)."""
        if state:
            raise ValueError(f"{type(self).__name__} has no state, got keys {sorted(state)}.")

    def describe(self) -> dict:
        r"""What identifies this objective in a checkpoint or a result file (declared
        constants when known; candidates as ``{"count": n, "sha256": ...}``)."""
        out: dict = {"name": self.name, "dim": self.dim, "bounds": self.bounds.tolist()}
        out["minimize"] = bool(self.minimize)
        if self.candidates is not None:  # the first 16 hex digits of its SHA-256
            data = self.candidates.detach().to(device="cpu", dtype=torch.float64).contiguous()
            digest = hashlib.sha256(data.numpy().tobytes()).hexdigest()[:16]
            out["candidates"] = {"count": int(self.candidates.shape[0]), "sha256": digest}
        for key in ("reward_bound", "noise_bound"):
            if getattr(self, key) is not None:
                out[key] = float(getattr(self, key))
        if self.kernel_hint is not None:
            out["kernel_hint"] = dict(self.kernel_hint)
        return out


class CallableObjective(Objective):
    r"""The user's own black box: a Python function of points in the user's domain.

    Args:
        fn: Called with an ``n x d`` float64 tensor of points within ``bounds``;
            returns ``n`` or ``n x 1`` real values (a tensor, an array, a list, or a
            float when ``n = 1``). Raising or returning NaN/inf is a failed
            evaluation; any other return value raises :class:`ObjectiveContractError`.
        bounds: ``2 x d`` lower and upper bounds of the domain (the user's units).
        minimize: Whether smaller values are better (default: a loss).
        name: A name for result tables (default: the function's name).
        candidates: A finite domain: ``n x d`` points within ``bounds`` (1-D when
            ``d = 1``; ``None``: the whole box).
        reward_bound: ``B >= 0`` with ``|fn(x)| <= B`` (``None``: unknown).
        noise_bound: ``R >= 0`` with ``|noise| <= R`` almost surely (``None`` or
            ``math.inf``: unknown or unbounded).

    A resumed run repeats the uninterrupted one when ``fn`` depends on its input only.
    """

    def __init__(
        self,
        fn: Callable[[Tensor], Tensor | np.ndarray | list | float],
        bounds,
        minimize: bool = True,
        name: str | None = None,
        candidates=None,
        reward_bound: float | None = None,
        noise_bound: float | None = None,
    ) -> None:
        if not callable(fn):
            raise ValueError(f"`fn` must be callable, got a {type(fn).__name__}.")
        if not isinstance(minimize, bool | np.bool_):
            raise ValueError(f"`minimize`={minimize!r} must be a bool.")
        minimize = bool(minimize)
        self.fn, self.bounds, self.minimize = fn, check_bounds(bounds), minimize
        if name is None:
            name = getattr(fn, "__name__", None) or type(fn).__name__
        if not isinstance(name, str) or not name:
            raise ValueError(f"`name` must be a non-empty string, got {name!r}.")
        self.name = name
        if candidates is not None:
            self.candidates = check_candidates(candidates, self.bounds)
        self.reward_bound = check_declared_bound(reward_bound, "reward_bound")
        self.noise_bound = check_declared_bound(noise_bound, "noise_bound", allow_inf=True)

    def __repr__(self) -> str:
        sense = "minimize" if self.minimize else "maximize"
        return f"CallableObjective({self.name}, d={self.dim}, {sense})"

    def evaluate(self, X: Tensor) -> tuple[Tensor, Tensor]:
        Z = self.to_domain(X)
        # not under no_grad: the black box may train a torch model (backward inside)
        out = self.fn(Z.detach().clone())
        n, values = len(Z), None
        if isinstance(out, Tensor):
            if not (out.is_complex() or out.dtype == torch.bool):
                values = out.detach().to(device="cpu")
        else:
            if isinstance(out, list | tuple):  # e.g. a list of (grad-carrying) tensors
                out = [o.detach().cpu().numpy() if isinstance(o, Tensor) else o for o in out]
            try:
                if np.ma.isMaskedArray(out) or out is np.ma.masked:  # masked: no value
                    out = np.ma.filled(np.ma.asarray(out, dtype=np.float64), np.nan)
                array = None if out is None else np.asarray(out)
            except (TypeError, ValueError, RuntimeError):  # ragged, unconvertible
                array = None
            if array is not None and array.dtype.kind in "iuf":
                values = torch.as_tensor(array)
        if values is None:
            raise ObjectiveContractError(
                f"Objective {self.name!r} returned {type(out).__name__}"
                f"{'' if out is None else ' ' + repr(out)[:60]}; expected {n} real numbers "
                "(a tensor, an array, a list, or a float for one point)."
            )
        values = values.to(torch.float64)
        if values.ndim == 0 or (values.ndim == 2 and values.shape[-1] == 1):
            values = values.reshape(-1)
        if values.shape != (n,):
            raise ObjectiveContractError(
                f"Objective {self.name!r} returned shape {tuple(values.shape)} for {n} points; "
                f"expected ({n},) or ({n}, 1)."
            )
        return values, values
