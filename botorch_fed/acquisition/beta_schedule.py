r"""The trade-off schedule ``beta_t`` of the Co-KG acquisition of [CoKG].

Co-KG scores a batch ``x_1..x_N`` (one point per agent) as

    alpha(x) = alpha^c(x) + beta_t * sum_n alpha_n(x_n),

the central model's batch acquisition (collaboration) plus ``beta_t`` times the agents'
own acquisitions (self-reliance). The slides ask for ``beta_t -> 0`` early (sparse
data: trust the aggregated model) and large ``beta_t`` later (enough local data: trust
the agent's own model, free of the barycenter's approximation bias), but give no
formula. :class:`BetaSchedule` offers three families for rounds ``t = 1, 2, ...``:

- ``"constant"``: ``beta_t = beta0``;
- ``"linear"``:   ``beta_t = beta0 + rate * (t - 1)``, ``rate >= 0``;
- ``"power"``:    ``beta_t = beta0 * t ** power`` (any real ``power``; ``power > 0``
  grows, ``power < 0`` decays to 0).

``beta_t = 0`` is barycenter-qKG (the slides' "Barycenter-qKG" baseline).

References:

.. [CoKG] D. Zhan, H. Zhang, R. Righter, Z. Zheng, J. Anderson. Collaborative Bayesian
   Optimization via Wasserstein Barycenters. CDC 2025 (slides: paper 001 in
   ``shared/papers``), "The Co-KG Acquisition Function".
"""

from __future__ import annotations

import math
import numbers
import operator
from dataclasses import asdict, dataclass
from typing import Any, Literal

BetaKind = Literal["constant", "linear", "power"]
BETA_KINDS: tuple[str, ...] = ("constant", "linear", "power")


def _real(value: object, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"`{name}` must be a real number, got {value!r}.")
    out = float(value)
    if not math.isfinite(out):
        raise ValueError(f"`{name}` must be finite, got {value!r}.")
    return out


def _round(t: Any) -> int:
    if isinstance(t, bool):
        raise ValueError(f"`t` must be an int >= 1 (rounds are 1-based), got {t!r}.")
    try:
        value = operator.index(t)
    except TypeError:
        raise ValueError(
            f"`t` must be an int >= 1 (rounds are 1-based), got {t!r} of type {type(t).__name__}."
        ) from None
    if value < 1:
        raise ValueError(f"`t` must be an int >= 1 (rounds are 1-based), got {value}.")
    return value


@dataclass(frozen=True)
class BetaSchedule:
    r"""``beta_t`` of Co-KG for rounds ``t >= 1`` (see the module docstring).

    Immutable; its state is the four plain fields below (``kind`` and floats), so it
    round-trips through :meth:`to_dict` / :meth:`from_dict` (e.g. JSON checkpoints).

    Args:
        kind: ``"constant"``, ``"linear"`` or ``"power"``.
        beta0: ``beta_1``, finite and ``>= 0``.
        rate: The slope of ``"linear"`` (finite, ``>= 0`` so ``beta_t`` never turns
            negative); required there and rejected for the other kinds.
        power: The exponent of ``"power"`` (finite); required there and rejected for
            the other kinds.

    Example:
        >>> BetaSchedule("linear", beta0=0.0, rate=0.5)(3)
        1.0
        >>> BetaSchedule("power", beta0=0.1, power=1.0)(10)
        1.0
    """

    kind: BetaKind = "constant"
    beta0: float = 1.0
    rate: float | None = None
    power: float | None = None

    def __post_init__(self) -> None:
        if self.kind not in BETA_KINDS:
            raise ValueError(f"`kind` must be one of {BETA_KINDS}, got {self.kind!r}.")
        beta0 = _real(self.beta0, "beta0")
        if beta0 < 0:
            raise ValueError(f"`beta0` must be >= 0, got {self.beta0!r}.")
        object.__setattr__(self, "beta0", beta0)
        for field, needed_by in (("rate", "linear"), ("power", "power")):
            value = getattr(self, field)
            if self.kind == needed_by:
                if value is None:
                    raise ValueError(f"kind={self.kind!r} needs `{field}`.")
                object.__setattr__(self, field, _real(value, field))
            elif value is not None:
                raise ValueError(
                    f"`{field}` is only used by kind={needed_by!r}, got {field}={value!r} "
                    f"with kind={self.kind!r}."
                )
        if self.kind == "linear":
            assert self.rate is not None  # required just above
            if self.rate < 0:
                raise ValueError(
                    f"`rate` must be >= 0 (beta_t = beta0 + rate * (t - 1) would turn "
                    f"negative), got {self.rate!r}."
                )

    def __call__(self, t: int) -> float:
        r"""``beta_t`` at round ``t``.

        Args:
            t: The round, an ``int >= 1``.

        Returns:
            ``beta_t >= 0`` as a Python float.
        """
        t = _round(t)
        if self.kind == "constant":
            value = self.beta0
        elif self.kind == "linear":
            assert self.rate is not None  # __post_init__ requires it for "linear"
            value = self.beta0 + self.rate * (t - 1)
        else:
            assert self.power is not None  # __post_init__ requires it for "power"
            try:
                value = self.beta0 * float(t) ** self.power if self.beta0 else 0.0
            except OverflowError:
                value = math.inf
        if not math.isfinite(value):
            raise ValueError(f"beta_t overflows at t={t} for {self!r}.")
        return value

    def to_dict(self) -> dict[str, Any]:
        r"""The schedule as a plain ``dict`` (``kind``, ``beta0``, ``rate``, ``power``)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, state: dict[str, Any]) -> BetaSchedule:
        r"""Rebuild a schedule from :meth:`to_dict`'s output (validated again).

        Args:
            state: A mapping with the keys ``kind``, ``beta0`` and optionally ``rate``,
                ``power``.

        Returns:
            The schedule.
        """
        if not isinstance(state, dict):
            raise ValueError(f"`state` must be a dict, got {type(state).__name__}.")
        unknown = set(state) - {"kind", "beta0", "rate", "power"}
        if unknown:
            raise ValueError(f"`state` has unknown keys {sorted(unknown)}.")
        return cls(**state)
