r"""The black boxes clients evaluate: the user's own callables or built-in test functions.

Every algorithm sees an :class:`Objective` through the unit cube ``[0, 1]^d``: a client
proposes unit-cube points, the objective maps them to its own domain (``bounds``),
evaluates, and reports values in the *user's* convention (``minimize``). Clients turn
them into BoTorch's maximisation convention themselves.

- :class:`CallableObjective` wraps any Python function of an ``n x d`` tensor in the
  user's domain (a hospital's validation loss, a lab's experiment, a device's
  latency). Clients of one federation may hold different callables over the same
  bounds.
- :class:`~botorch_fed.protocol.problem.ClientObjective` wraps a built-in test
  function (optionally noisy, shifted per client); it also knows the noise-free value
  and the optimum, which result tables use.

An evaluation may fail (the callable raises, or returns NaN/inf): the client records
the failure and carries on (see :class:`~botorch_fed.protocol.bo_client.BOClient`),
unless the federation says ``evaluation_errors="raise"``.

Finite domains and declared constants. An objective may declare what the
algorithms of [LDP-BO] (paper 002) assume known (its Sec. 2 and 5.1): a finite
domain ``D`` (:attr:`Objective.candidates`), ``B`` with ``|f| <= B``
(:attr:`Objective.reward_bound`), ``R`` with ``|noise| <= R`` almost surely
(:attr:`Objective.noise_bound`), and the kernel that generated ``f``
(:attr:`Objective.kernel_hint`). All default to ``None`` (unknown); algorithms that
do not use them ignore them.
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


def check_bounds(bounds, name: str = "bounds") -> Tensor:
    r"""``bounds`` as a float64 ``2 x d`` tensor; raise ``ValueError`` naming ``name``.

    Args:
        bounds: Lower and upper bounds (tensor, array or nested lists), ``2 x d``.
        name: The argument's name for error messages.

    Returns:
        The bounds as a ``2 x d`` float64 CPU tensor.
    """
    if isinstance(bounds, Tensor):
        bounds = bounds.detach().cpu()
    try:
        b = torch.as_tensor(np.asarray(bounds, dtype=np.float64), dtype=torch.float64)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"`{name}` must be a 2 x d array of numbers, got {bounds!r}.") from exc
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
    r"""A finite domain given in the user's domain, as float64 unit-cube points.

    Args:
        candidates: ``n x d`` points (tensor, array or nested lists; a 1-D sequence
            is read as ``n x 1`` when ``d = 1``) within ``bounds``, ``n >= 1``.
        bounds: ``2 x d`` float64 bounds (see :func:`check_bounds`).
        name: The argument's name for error messages.

    Returns:
        ``n x d`` float64 CPU points in ``[0, 1]^d``:
        ``(candidates - lower) / (upper - lower)``, clamped to ``[0, 1]`` against
        rounding.

    Raises:
        ValueError: For an empty domain (``n = 0``), a wrong shape, non-finite
            entries, or points outside ``bounds`` (naming the first offending row).
    """
    if isinstance(candidates, Tensor):
        candidates = candidates.detach().cpu()
    try:
        c = torch.as_tensor(np.asarray(candidates, dtype=np.float64), dtype=torch.float64)
    except (TypeError, ValueError) as exc:
        raise ValueError(
            f"`{name}` must be an n x d array of numbers, got {candidates!r:.80}."
        ) from exc
    d = bounds.shape[-1]
    if c.ndim == 1 and d == 1:
        c = c.unsqueeze(-1)
    if c.ndim >= 1 and c.shape[0] == 0:
        raise ValueError(f"`{name}`: empty domain (0 points); give at least one point.")
    if c.ndim != 2 or c.shape[-1] != d:
        raise ValueError(f"`{name}` must have shape n x {d}, got {tuple(c.shape)}.")
    finite = torch.isfinite(c).all(dim=-1)
    if not finite.all():
        row = int((~finite).nonzero()[0])
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
    r"""A declared bound (``B`` or ``R``): ``None``, or a number ``>= 0``.

    Args:
        value: The bound.
        name: The argument's name for error messages.
        allow_inf: Read ``math.inf`` as "unbounded", returned as ``None``.

    Returns:
        The bound as a float, or ``None`` (unknown / unbounded).
    """
    if value is None:
        return None
    ok = isinstance(value, int | float | np.integer | np.floating) and not isinstance(
        value, bool | np.bool_
    )
    if ok and allow_inf and value == math.inf:
        return None
    if not (ok and 0 <= value < math.inf):
        what = "a finite number >= 0, math.inf (unbounded)" if allow_inf else "a finite number >= 0"
        raise ValueError(f"`{name}` must be {what} or None, got {value!r}.")
    return float(value)


def candidates_digest(candidates: Tensor) -> str:
    r"""The first 16 hex digits of the SHA-256 of the candidates' float64 bytes
    (C order), identifying a finite domain in a result file."""
    data = candidates.detach().to(device="cpu", dtype=torch.float64).contiguous().numpy()
    return hashlib.sha256(data.tobytes()).hexdigest()[:16]


class Objective(ABC):
    r"""A client's black box, evaluated at unit-cube points.

    Attributes:
        bounds: ``2 x d`` float64 bounds of the user's domain.
        minimize: Whether smaller values are better (the user's convention).
        name: A name for result tables.
        optimal_value: The known optimum in the user's convention (``None``: unknown).
        candidates: The finite domain ``D`` as ``n x d`` float64 *unit-cube* points
            (``None``: the whole box). Algorithms that support finite domains
            maximise exactly over these points ([LDP-BO] Sec. 5.1); the others
            ignore it.
        reward_bound: ``B`` with ``|f(x)| <= B`` on the domain, in the user's
            convention (``None``: unknown).
        noise_bound: ``R`` with ``|noise| <= R`` almost surely (``None``: unknown or
            unbounded; ``0.0``: noise-free).
        kernel_hint: The kernel that generated ``f`` when known, e.g.
            ``{"kernel": "se", "lengthscale": 0.2, "nu": 2.5}`` (lengthscale in
            unit-cube coordinates; ``None``: unknown).
    """

    bounds: Tensor
    minimize: bool = True
    name: str = "objective"
    optimal_value: float | None = None
    candidates: Tensor | None = None
    reward_bound: float | None = None
    noise_bound: float | None = None
    kernel_hint: dict | None = None

    @property
    def dim(self) -> int:
        r"""The input dimension ``d``."""
        return self.bounds.shape[-1]

    def to_domain(self, X: Tensor) -> Tensor:
        r"""Map unit-cube points to the user's domain.

        Args:
            X: ``n x d`` points in ``[0, 1]^d``.

        Returns:
            ``n x d`` float64 points within ``bounds``.
        """
        if X.ndim != 2 or X.shape[-1] != self.dim:
            raise ValueError(f"`X` must have shape n x {self.dim}, got {tuple(X.shape)}.")
        if not torch.isfinite(X).all() or (X < 0).any() or (X > 1).any():
            raise ValueError("`X` must lie in the unit cube [0, 1]^d.")
        return unnormalize(X.to(torch.float64), self.bounds.to(X.device))

    @abstractmethod
    def evaluate(self, X: Tensor) -> tuple[Tensor, Tensor]:
        r"""Evaluate the black box.

        Args:
            X: ``n x d`` unit-cube points.

        Returns:
            ``(observed, reported)``, each ``n`` float64 values in the user's
            convention: what the client learns from (possibly noisy) and what result
            tables report (the noise-free value where it is known, else the observed
            one).
        """

    def state_dict(self) -> dict:
        r"""State that evolves between evaluations (e.g. a noise generator)."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        r"""Restore :meth:`state_dict` (checkpoints)."""
        if state:
            raise ValueError(f"{type(self).__name__} has no state, got keys {sorted(state)}.")

    def describe(self) -> dict:
        r"""What identifies this objective in a checkpoint or a result file.

        ``candidates``, ``reward_bound``, ``noise_bound`` and ``kernel_hint`` are
        included when not ``None``; the candidates as
        ``{"count": n, "sha256": <first 16 hex digits>}`` (:func:`candidates_digest`).
        """
        out = {
            "name": self.name,
            "dim": self.dim,
            "bounds": self.bounds.tolist(),
            "minimize": bool(self.minimize),
        }
        if self.candidates is not None:
            out["candidates"] = {
                "count": int(self.candidates.shape[0]),
                "sha256": candidates_digest(self.candidates),
            }
        if self.reward_bound is not None:
            out["reward_bound"] = float(self.reward_bound)
        if self.noise_bound is not None:
            out["noise_bound"] = float(self.noise_bound)
        if self.kernel_hint is not None:
            out["kernel_hint"] = dict(self.kernel_hint)
        return out


class CallableObjective(Objective):
    r"""The user's own black box: a Python function of points in the user's domain.

    Example:
        >>> def validation_loss(X):  # X: n x 2 (learning rate, depth)
        ...     return torch.stack([train_and_score(lr, depth) for lr, depth in X])
        >>> objective = CallableObjective(validation_loss, bounds=[[1e-4, 1], [1, 10]])

    Args:
        fn: Called with an ``n x d`` float64 tensor of points within ``bounds``;
            returns ``n`` or ``n x 1`` values (a tensor, an array, a list, or a float
            when ``n = 1``). It may raise or return NaN/inf for a failed evaluation.
        bounds: ``2 x d`` lower and upper bounds of the domain.
        minimize: Whether smaller values are better (default: a loss).
        name: A name for result tables (default: the function's name).
        candidates: A finite domain: ``n x d`` points in the *user's* domain, within
            ``bounds`` (a 1-D sequence when ``d = 1``); stored as unit-cube points in
            :attr:`candidates`. ``None``: the whole box.
        reward_bound: ``B >= 0`` with ``|fn(x)| <= B`` (``None``: unknown).
        noise_bound: ``R >= 0`` with ``|noise| <= R`` almost surely; ``math.inf``
            (unbounded) is stored as ``None``, like "unknown": an algorithm that
            needs ``R`` can use neither.

    Note:
        Checkpoints save the clients' data and the algorithms' state, not ``fn``: a
        resumed run repeats the uninterrupted one exactly when ``fn`` is a function
        of its input only (seed any randomness inside it from the input).
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
            raise ValueError(f"`minimize` must be True or False, got {minimize!r}.")
        minimize = bool(minimize)
        self.fn = fn
        self.bounds = check_bounds(bounds)
        self.minimize = minimize
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
        return (
            f"CallableObjective({self.name}, d={self.dim}, "
            f"{'minimize' if self.minimize else 'maximize'})"
        )

    def evaluate(self, X: Tensor) -> tuple[Tensor, Tensor]:
        Z = self.to_domain(X)
        # not under no_grad: the black box may train a torch model (backward inside)
        out = self.fn(Z.detach().clone())
        values = self._as_values(out, len(Z))
        return values, values

    def _as_values(self, out, n: int) -> Tensor:
        r"""The callable's return value as ``n`` float64 values, or a clear error."""
        if isinstance(out, Tensor):
            kind_ok = not (out.is_complex() or out.dtype == torch.bool)
            values = out.detach().to(device="cpu") if kind_ok else None
        else:
            if isinstance(out, list | tuple):  # e.g. a list of (grad-carrying) tensors
                out = [o.detach().cpu().numpy() if isinstance(o, Tensor) else o for o in out]
            try:
                if np.ma.isMaskedArray(out) or out is np.ma.masked:  # masked: no value
                    out = np.ma.filled(np.ma.asarray(out, dtype=np.float64), np.nan)
                array = None if out is None else np.asarray(out)
            except (TypeError, ValueError, RuntimeError):  # ragged, unconvertible
                array = None
            kind_ok = array is not None and array.dtype.kind in "iuf"
            values = torch.as_tensor(array) if kind_ok else None
        if values is None:
            raise ObjectiveContractError(
                f"Objective {self.name!r} returned {type(out).__name__}"
                f"{'' if out is None else ' ' + repr(out)[:60]}; expected {n} real numbers "
                "(a tensor, an array, a list, or a float for one point)."
            )
        values = values.to(torch.float64)
        if values.ndim == 0:
            values = values.reshape(1)
        if values.ndim == 2 and values.shape[-1] == 1:
            values = values.squeeze(-1)
        if values.shape != (n,):
            raise ObjectiveContractError(
                f"Objective {self.name!r} returned shape {tuple(values.shape)} for {n} points; "
                f"expected ({n},) or ({n}, 1)."
            )
        return values


def describe_failure(exc: BaseException | None, values: Tensor | None = None) -> str:
    r"""A one-line description of a failed evaluation for results."""
    if exc is not None:
        return f"{type(exc).__name__}: {exc}"
    bad = [v for v in (values.tolist() if values is not None else []) if not math.isfinite(v)]
    return f"non-finite value {bad[0] if bad else float('nan')}"
