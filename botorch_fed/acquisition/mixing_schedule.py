r"""The local/global mixing schedule of FBO-FedGP: Alg. 2 / eq. 3 of [FBO-FedGP].

At round ``t = 1, 2, ...`` client ``i`` takes a *local* step (its own GP) with
probability ``p_t^(i)`` and a *global* step (secure aggregation, global dPITC model)
with probability ``1 - p_t^(i)`` (Alg. 2, lines 14-15: draw ``r ~ U(0, 1)``, local iff
``r < p_t``). Sec. 4.3 asks for a non-decreasing schedule with

    (eq. 3)    sum_t (1 - p_t) = inf    and    sum_t (1 - p_t)^2 < inf,

and proposes the power family ``p_t = 1 - t^-c``, ``0 < c <= 1`` (experiments:
``c = 0.5``; App. D.5 compares ``c = 1, 0.5, 0.25, 0.75``).

Discrepancy with the paper. For the power family ``1 - p_t = t^-c``, so the first sum
is the p-series ``sum t^-c`` (diverges iff ``c <= 1``) and the second is
``sum t^-2c`` (converges iff ``2c > 1``). Both conditions of eq. 3 therefore hold iff
``1/2 < c <= 1``, not for all ``0 < c <= 1`` as Sec. 4.3 states: the paper's default
``c = 0.5`` gives ``sum 1/t = inf`` and ``c = 0.25`` (App. D.5) diverges too.
:meth:`MixingSchedule.satisfies_eq3` returns the correct answer. (In the proof steps
of App. C that we read, Step 3 of Thm. 10, only the first condition,
``E[T_g] = sum (1 - p_t) -> inf``, is invoked.) Note also that ``p_1 = 0`` for the
whole family -- the first round is always global -- while Alg. 2 (line 10) states
``p^(i) in (0, 1]^T`` and Thm. 3 assumes ``p_t in (0, 1)``.

References:

.. [FBO-FedGP] Secure federated Bayesian optimisation with distributed sparse GPs,
   Alg. 2, Sec. 4.3 (eq. 3) and App. D.5 (paper 000 in ``shared/papers``).
"""

from __future__ import annotations

import math
import numbers
import operator
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from botorch_fed.acquisition._rng import SeedLike, uniform_draws

# Slack for floating point round-off when checking custom schedules.
_TOL = 1e-12


def _check_t(t: Any, name: str = "t") -> int:
    r"""``t`` as a Python int >= 1 (rounds are 1-based), else ValueError naming it."""
    if isinstance(t, bool):
        raise ValueError(f"`{name}` must be an int >= 1, got {t!r}.")
    try:
        value = operator.index(t)
    except TypeError:
        raise ValueError(
            f"`{name}` must be an int >= 1 (rounds are 1-based), got {t!r} of type "
            f"{type(t).__name__}."
        ) from None
    if value < 1:
        raise ValueError(f"`{name}` must be an int >= 1 (rounds are 1-based), got {value}.")
    return value


def _check_c(c: object, name: str) -> float:
    if isinstance(c, bool) or not isinstance(c, numbers.Real):
        raise ValueError(f"`{name}` must be a real number in (0, 1], got {c!r}.")
    value = float(c)
    if not (math.isfinite(value) and 0.0 < value <= 1.0):
        raise ValueError(
            f"`{name}` must satisfy 0 < c <= 1 (p_t = 1 - t^-c is then non-decreasing "
            f"in [0, 1) and sum_t t^-c = inf), got {c!r}."
        )
    return value


def _check_prob(value: object, name: str, t: int) -> float:
    try:
        p = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ValueError(f"`{name}` returned {value!r} at t={t}; expected a float.") from None
    if not (math.isfinite(p) and 0.0 <= p <= 1.0):
        raise ValueError(f"`{name}` returned p_t = {p!r} at t={t}, outside [0, 1].")
    return p


class MixingSchedule:
    r"""Probability ``p_t^(i)`` of a local step at round ``t`` (Alg. 2 of [FBO-FedGP]).

    Either the power family ``p_t = 1 - t^-c`` (default ``c = 0.5``, the paper's
    choice), one ``c`` shared by all clients or one per client, or a custom callable
    ``t -> p_t`` (one shared, or one per client). Custom schedules are checked to be
    non-decreasing with values in ``[0, 1]`` on ``t = 1, ..., validate_up_to`` at
    construction; later rounds are checked for ``[0, 1]`` and against
    ``p_{validate_up_to}`` when evaluated.

    Per-client schedules (a sequence of ``c`` or of callables) need a ``client`` index
    for the scalar queries (:meth:`prob_local`, :meth:`prob_global`,
    :meth:`expected_global_steps`); :meth:`sample` and :meth:`satisfies_eq3` without a
    ``client`` cover all clients.

    Example:
        >>> schedule = MixingSchedule(c=0.75, num_clients=4)
        >>> schedule.prob_local(4)  # 1 - 4^-0.75
        0.6464466094067263
        >>> schedule.sample(4, seed=0)  # one local/global coin per client
        tensor([False, False,  True, False])
        >>> MixingSchedule(c=0.5).satisfies_eq3()  # sum 1/t diverges
        False
    """

    def __init__(
        self,
        c: float | Sequence[float] | None = None,
        num_clients: int | None = None,
        *,
        prob_fn: Callable[[int], float] | Sequence[Callable[[int], float]] | None = None,
        validate_up_to: int = 1000,
    ) -> None:
        r"""
        Args:
            c: Exponent of ``p_t = 1 - t^-c``, ``0 < c <= 1``; a sequence gives one
                exponent per client. Default (``None`` with no ``prob_fn``): ``0.5``.
            num_clients: The number of clients ``M`` (optional for a shared schedule;
                must equal the length of a per-client ``c`` / ``prob_fn``). With
                ``num_clients``, :meth:`sample` draws one coin per client.
            prob_fn: A custom schedule ``t -> p_t`` (``t >= 1``), or one per client.
                Mutually exclusive with ``c``.
            validate_up_to: Custom schedules are validated on ``t = 1, ..., this``.
        """
        if c is not None and prob_fn is not None:
            raise ValueError("Pass either `c` (power schedule) or `prob_fn`, not both.")
        if isinstance(validate_up_to, bool) or not isinstance(validate_up_to, int):
            raise ValueError(f"`validate_up_to` must be an int >= 2, got {validate_up_to!r}.")
        if validate_up_to < 2:
            raise ValueError(f"`validate_up_to` must be an int >= 2, got {validate_up_to}.")
        self._validate_up_to = validate_up_to
        self._c: tuple[float, ...] | None = None
        self._fns: tuple[Callable[[int], float], ...] | None = None
        self._fn_last: tuple[float, ...] = ()
        if prob_fn is None:
            c = 0.5 if c is None else c
            if isinstance(c, Sequence) and not isinstance(c, str):
                self._per_client = True
                self._c = tuple(_check_c(ci, f"c[{i}]") for i, ci in enumerate(c))
            else:
                self._per_client = False
                self._c = (_check_c(c, "c"),)
        else:
            fns: tuple[Callable[[int], float], ...]
            if callable(prob_fn):
                self._per_client = False
                fns = (prob_fn,)
            elif isinstance(prob_fn, Sequence) and all(callable(f) for f in prob_fn):
                self._per_client = True
                fns = tuple(prob_fn)
            else:
                raise ValueError(
                    f"`prob_fn` must be a callable t -> p_t or a sequence of them, got {prob_fn!r}."
                )
            self._fns = fns
            self._fn_last = tuple(
                self._validate_fn(f, "prob_fn" if not self._per_client else f"prob_fn[{i}]")
                for i, f in enumerate(fns)
            )
        schedules = self._c if self._c is not None else self._fns
        assert schedules is not None  # one of the two is set above
        n_schedules = len(schedules)
        if self._per_client and n_schedules == 0:
            raise ValueError("A per-client `c` / `prob_fn` needs at least one client.")
        if num_clients is not None:
            if isinstance(num_clients, bool) or not isinstance(num_clients, int):
                raise ValueError(f"`num_clients` must be an int >= 1, got {num_clients!r}.")
            if num_clients < 1:
                raise ValueError(f"`num_clients` must be an int >= 1, got {num_clients}.")
            if self._per_client and num_clients != n_schedules:
                raise ValueError(
                    f"`num_clients`={num_clients} but {n_schedules} per-client schedules "
                    "were given."
                )
        self.num_clients: int | None = n_schedules if self._per_client else num_clients

    def _validate_fn(self, fn: Callable[[int], float], name: str) -> float:
        r"""Check ``fn`` on ``t = 1..validate_up_to``; return ``p`` at the last ``t``."""
        prev = -math.inf
        prev_t = 0
        for t in range(1, self._validate_up_to + 1):
            p = _check_prob(fn(t), name, t)
            if p < prev - _TOL:
                raise ValueError(
                    f"`{name}` is not monotonically non-decreasing: p_{prev_t} = {prev!r} > "
                    f"p_{t} = {p!r}."
                )
            prev, prev_t = p, t
        return prev

    # ------------------------------------------------------------------ properties
    @property
    def per_client(self) -> bool:
        r"""Whether each client has its own schedule."""
        return self._per_client

    @property
    def is_power_family(self) -> bool:
        r"""Whether the schedule is ``p_t = 1 - t^-c`` (as opposed to a custom one)."""
        return self._c is not None

    @property
    def c(self) -> float | tuple[float, ...] | None:
        r"""The exponent (a tuple for per-client schedules; ``None`` if custom)."""
        if self._c is None:
            return None
        return self._c if self._per_client else self._c[0]

    def __repr__(self) -> str:
        spec = f"c={self.c!r}" if self.is_power_family else "prob_fn=<custom>"
        return f"{type(self).__name__}({spec}, num_clients={self.num_clients})"

    # --------------------------------------------------------------------- queries
    def _index(self, client: int | None, name: str = "client") -> int:
        r"""Index of the schedule that applies to ``client``."""
        if client is None:
            if self._per_client:
                raise ValueError(
                    f"`{name}` is required: this schedule has one entry per client "
                    f"({self.num_clients} clients)."
                )
            return 0
        if isinstance(client, bool):
            raise ValueError(f"`{name}` must be an int >= 0, got {client!r}.")
        try:
            idx = operator.index(client)
        except TypeError:
            raise ValueError(f"`{name}` must be an int >= 0, got {client!r}.") from None
        if idx < 0 or (self.num_clients is not None and idx >= self.num_clients):
            bound = "" if self.num_clients is None else f" and < {self.num_clients}"
            raise ValueError(f"`{name}` must be >= 0{bound}, got {idx}.")
        return idx if self._per_client else 0

    def _p(self, t: int, k: int) -> float:
        if self._c is not None:
            return 1.0 - float(t) ** (-self._c[k])
        assert self._fns is not None  # a custom schedule (no ``c``)
        name = "prob_fn" if not self._per_client else f"prob_fn[{k}]"
        p = _check_prob(self._fns[k](t), name, t)
        if t > self._validate_up_to and p < self._fn_last[k] - _TOL:
            raise ValueError(
                f"`{name}` is not monotonically non-decreasing: p_{self._validate_up_to} = "
                f"{self._fn_last[k]!r} > p_{t} = {p!r}."
            )
        return p

    def prob_local(self, t: int, client: int | None = None) -> float:
        r"""``p_t``: the probability that ``client`` takes a local step at round ``t``.

        Args:
            t: The round, an int ``>= 1``.
            client: The client index (required for per-client schedules).

        Returns:
            ``p_t`` in ``[0, 1]`` (``1 - t^-c`` for the power family; ``p_1 = 0``).
        """
        return self._p(_check_t(t), self._index(client))

    def prob_global(self, t: int, client: int | None = None) -> float:
        r"""``1 - p_t``: the probability of a global (secure aggregation) step.

        Args:
            t: The round, an int ``>= 1``.
            client: The client index (required for per-client schedules).

        Returns:
            ``1 - p_t`` (``t^-c`` for the power family, computed directly).
        """
        t, k = _check_t(t), self._index(client)
        if self._c is not None:
            return float(t) ** (-self._c[k])
        return 1.0 - self._p(t, k)

    def sample(self, t: int, seed: SeedLike = None, client: int | None = None) -> bool | Tensor:
        r"""Draw the local/global decision(s) of round ``t`` (Alg. 2, lines 14-15).

        For each client, ``r ~ U(0, 1)`` and the step is local iff ``r < p_t``.

        Args:
            t: The round, an int ``>= 1``.
            seed: An ``int`` seed, a ``torch.Generator`` or ``numpy.random.Generator``
                (advanced by the draw), or ``None`` (fresh entropy, not reproducible).
                The global RNG is not used.
            client: Draw for this client only. If ``None`` and the number of clients
                is known, one coin per client is drawn.

        Returns:
            ``True`` for a local step (a Python ``bool``) if ``client`` is given or the
            number of clients is unknown; else a ``num_clients``-dim bool tensor.
        """
        t = _check_t(t)
        if client is not None or self.num_clients is None:
            k = self._index(client)
            return bool(uniform_draws(1, seed)[0] < self._p(t, k))
        probs = torch.tensor(
            [self._p(t, self._index(i)) for i in range(self.num_clients)], dtype=torch.float64
        )
        return uniform_draws(self.num_clients, seed) < probs

    def expected_global_steps(self, T: int, client: int | None = None) -> float:
        r"""``E[T_g] = sum_{t=1}^T (1 - p_t)``: expected number of global steps of a client.

        Args:
            T: The horizon, an int ``>= 0``.
            client: The client index (required for per-client schedules).

        Returns:
            The expected number of global steps in rounds ``1..T`` (for one client).
        """
        if isinstance(T, bool):
            raise ValueError(f"`T` must be an int >= 0, got {T!r}.")
        try:
            T = operator.index(T)
        except TypeError:
            raise ValueError(f"`T` must be an int >= 0, got {T!r}.") from None
        if T < 0:
            raise ValueError(f"`T` must be an int >= 0, got {T}.")
        k = self._index(client)
        if T == 0:
            return 0.0
        if self._c is not None:
            t = torch.arange(1, T + 1, dtype=torch.float64)
            return float(t.pow(-self._c[k]).sum())
        return math.fsum(1.0 - self._p(t, k) for t in range(1, T + 1))

    def eq3_conditions(self, client: int | None = None) -> tuple[bool, bool]:
        r"""The two conditions of eq. 3, decided analytically for the power family.

        With ``1 - p_t = t^-c``: ``sum_t t^-c = inf`` iff ``c <= 1`` (always true in
        the allowed range) and ``sum_t t^-2c < inf`` iff ``c > 1/2``.

        Args:
            client: The client index; ``None`` for a per-client schedule means "all
                clients" (each condition must hold for every client).

        Returns:
            ``(sum (1 - p_t) = inf, sum (1 - p_t)^2 < inf)``.

        Raises:
            NotImplementedError: For custom schedules (infinite sums cannot be decided
                from finitely many values).
        """
        if self._c is None:
            raise NotImplementedError(
                "eq. 3 involves infinite sums, which cannot be decided from finitely many "
                "values of a custom `prob_fn`; check it analytically."
            )
        if client is None and self._per_client:
            cs = self._c
        else:
            cs = (self._c[self._index(client)],)
        return all(ci <= 1.0 for ci in cs), all(ci > 0.5 for ci in cs)

    def satisfies_eq3(self, client: int | None = None) -> bool:
        r"""Whether both conditions of eq. 3 hold (power family: iff ``1/2 < c <= 1``).

        Sec. 4.3 of [FBO-FedGP] claims they hold for every ``0 < c <= 1``; for
        ``c <= 1/2`` the second sum ``sum t^-2c`` diverges (``c = 0.5``: the harmonic
        series), so this returns ``False`` there.

        Args:
            client: See :meth:`eq3_conditions`.

        Returns:
            ``True`` iff both conditions hold (for all clients if ``client`` is ``None``).
        """
        first, second = self.eq3_conditions(client)
        return first and second
