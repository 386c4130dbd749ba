r"""Settings of Co-KG and its family (Co-EI, Co-ES, barycenter-qKG; paper 001), and the
shared support they name.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, cast

from torch import Tensor

from botorch_fed.acquisition import BETA_KINDS, BetaSchedule
from botorch_fed.inducing import grid_support, sobol_support

if TYPE_CHECKING:
    from typing import Protocol

    from botorch_fed.acquisition.beta_schedule import BetaKind

    class _BetaSettings(Protocol):
        r"""What :meth:`_BetaFields._check` uses of the settings it is mixed into."""

        beta_schedule: str
        beta0: float
        beta_rate: float
        beta_power: float
        num_rounds: int

        def make_beta_schedule(self) -> BetaSchedule: ...


SUPPORTS = ("auto", "grid", "sobol", "kmeans")
WEIGHTS = ("uniform", "data", "precision")
MEAN_AGGREGATIONS = ("clear", "secure")
MAX_SUPPORT_SIZE = 4096  # agents refuse a larger support from the server
MIN_CLUSTER_SIZE = 2  # k-means support: never the centre of one point (a raw input)
MIN_SECURE_AGENTS = 3  # a secure mean over fewer reveals each input to the others
_COUNTS = (  # the positive integers of CollaborativeSettings
    *("num_init", "num_rounds", "points_per_dim", "support_size", "centers_per_client"),
    *("local_refit_every", "fit_maxiter", "num_restarts", "raw_samples", "maxiter"),
)


def _positive_int(settings, name: str, low: int = 1) -> None:
    value = getattr(settings, name)
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        kind = "positive" if low == 1 else "non-negative"
        raise ValueError(f"`{name}` must be a {kind} integer, got {value!r}.")


def _choice(settings, name: str, allowed: tuple) -> None:
    if getattr(settings, name) not in allowed:
        raise ValueError(f"`{name}`={getattr(settings, name)!r} must be one of {allowed}.")


@dataclass
class CollaborativeSettings:
    r"""Settings every collaborative (barycenter) algorithm shares.

    Attributes:
        num_init: Initial design size per agent (the warm-up).
        num_rounds: Number of rounds ``T``.
        support: The shared support: ``"grid"`` (``points_per_dim`` per axis, the
            slides), ``"sobol"`` (``support_size`` scrambled Sobol points), ``"kmeans"``
            (federated k-means of the agents' inputs, at most ``support_size`` points,
            as FBO-FedGP; leaks coarse locations) or ``"auto"`` (grid for d <= 2, Sobol
            otherwise).
        points_per_dim: Grid points per axis (the slides: 10 or 30).
        support_size: Size of a Sobol or k-means support.
        centers_per_client: k of each agent's local k-means (``"kmeans"``).
        support_every: Re-select a k-means support every K rounds (0: only after the
            warm-up).
        weights: Barycenter weights of the agents: ``"uniform"`` (the paper), by
            ``"data"`` size, or by posterior ``"precision"`` on the support.
        local_refit_every: Refit each agent's GP hyperparameters on every K-th update
            (in between, the last fitted values are reused).
        fit_maxiter: L-BFGS-B iterations of an agent's refit.
        num_restarts: Restarts of the server's acquisition optimisation.
        raw_samples: Raw samples of the server's acquisition optimisation.
        maxiter: L-BFGS-B iterations of the server's acquisition optimisation.
    """

    num_init: int = 4
    num_rounds: int = 30
    support: str = field(default="auto", metadata={"choices": SUPPORTS})
    points_per_dim: int = 10
    support_size: int = 128
    centers_per_client: int = 8
    support_every: int = 0
    weights: str = field(default="uniform", metadata={"choices": WEIGHTS})
    local_refit_every: int = 5
    fit_maxiter: int = 50
    num_restarts: int = 2
    raw_samples: int = 64
    maxiter: int = 50

    def validate(self) -> None:
        r"""Raise ``ValueError`` naming the first invalid setting: the checks (``_check``)
        of this class, then of each mixin and subclass, in reverse method resolution
        order."""
        for klass in reversed(type(self).__mro__):
            if "_check" in vars(klass):
                vars(klass)["_check"](self)

    def _check(self) -> None:
        for name in _COUNTS:
            _positive_int(self, name)
        _positive_int(self, "support_every", low=0)
        _choice(self, "support", SUPPORTS)
        _choice(self, "weights", WEIGHTS)
        if self.support_size > MAX_SUPPORT_SIZE:
            raise ValueError(
                f"`support_size`={self.support_size} exceeds {MAX_SUPPORT_SIZE} (agents "
                "refuse larger supports)."
            )
        if self.points_per_dim < 2:
            raise ValueError(
                f"`points_per_dim`={self.points_per_dim}: a grid needs at least 2 points per "
                "axis (one point is a support of one point)."
            )
        if self.support == "kmeans" and self.num_init < MIN_CLUSTER_SIZE:
            raise ValueError(
                f"`num_init`={self.num_init}: a k-means support needs at least "
                f"{MIN_CLUSTER_SIZE} initial points per agent (a centre of one point is "
                "that point)."
            )

    def make_beta_schedule(self) -> BetaSchedule:
        r"""The :class:`~botorch_fed.acquisition.BetaSchedule` (``beta_t = 0`` here)."""
        return BetaSchedule("constant", beta0=0.0)

    def hides_means(self) -> bool:
        r"""Whether the agents' means are summed securely instead of sent."""
        return False


@dataclass
class _BetaFields:
    r"""The ``beta_t`` schedule of the local terms.

    Attributes:
        beta_schedule: How ``beta_t`` (weight of the agents' own acquisitions) moves
            with the round: ``"constant"`` (beta0), ``"linear"`` (beta0 + beta_rate
            (t - 1)) or ``"power"`` (beta0 t^beta_power).
        beta0: ``beta_1 >= 0``.
        beta_rate: Slope of the linear schedule (>= 0).
        beta_power: Exponent of the power schedule.
    """

    beta_schedule: str = field(default="linear", metadata={"choices": BETA_KINDS})
    beta0: float = 0.0
    beta_rate: float = 0.1
    beta_power: float = 1.0

    def _check(self: _BetaSettings) -> None:
        _choice(self, "beta_schedule", BETA_KINDS)
        for name in ("beta0", "beta_rate", "beta_power"):
            value = getattr(self, name)
            if (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or not math.isfinite(value)
            ):
                raise ValueError(f"`{name}` must be a finite number, got {value!r}.")
        if self.beta0 < 0:
            raise ValueError(f"`beta0` must be >= 0, got {self.beta0!r}.")
        if self.beta_rate < 0:
            raise ValueError(f"`beta_rate` must be >= 0, got {self.beta_rate!r}.")
        if self.beta_schedule in ("constant", "power") and self.beta0 == 0:
            warnings.warn(
                f"`beta0`=0 with the {self.beta_schedule!r} schedule makes beta_t = 0 in every "
                "round: the agents' own terms never count (that is barycenter-qKG); give "
                "beta0 > 0.",
                UserWarning,
                stacklevel=2,
            )
        schedule = self.make_beta_schedule()
        for t in (1, self.num_rounds):  # beta_t must stay finite over the run
            try:
                schedule(t)
            except ValueError as exc:
                raise ValueError(f"`beta_power`={self.beta_power!r}: {exc}") from exc

    def make_beta_schedule(self) -> BetaSchedule:
        r"""The :class:`~botorch_fed.acquisition.BetaSchedule` of these fields."""
        kind = cast("BetaKind", self.beta_schedule)  # one of BETA_KINDS (_check)
        return BetaSchedule(
            kind,
            beta0=float(self.beta0),
            rate=float(self.beta_rate) if kind == "linear" else None,
            power=float(self.beta_power) if kind == "power" else None,
        )


@dataclass
class _KGFields:
    r"""The knowledge gradient's Monte Carlo.

    Attributes:
        num_fantasies: Fantasies per model of the knowledge gradient.
        discrete: Take the knowledge gradient's inner maxima exactly over the support
            (instead of one-shot over the continuous domain).
    """

    num_fantasies: int = 16
    discrete: bool = False

    def _check(self) -> None:
        _positive_int(self, "num_fantasies")
        if not isinstance(self.discrete, bool):
            raise ValueError(f"`discrete` must be True or False, got {self.discrete!r}.")


@dataclass
class CoKGSettings(_KGFields, _BetaFields, CollaborativeSettings):
    r"""Settings of Co-KG (``co-kg``): the central batch q-KG on the barycenter plus
    ``beta_t`` times each agent's KG on its own posterior."""


@dataclass
class CoEISettings(_BetaFields, CollaborativeSettings):
    r"""Settings of Co-EI (``co-ei``): the central q-log-EI on the barycenter (incumbent:
    its largest mean on the support) plus ``beta_t`` times each agent's log-EI."""


@dataclass
class CoESSettings(_BetaFields, CollaborativeSettings):
    r"""Settings of Co-ES (``co-es``): max-value entropy search on the barycenter
    (candidate set: the support) plus ``beta_t`` times each agent's.

    Attributes:
        num_mv_samples: Max-value samples of the entropy search.
    """

    num_mv_samples: int = 16

    def _check(self) -> None:
        _positive_int(self, "num_mv_samples")


@dataclass
class BarycenterQKGSettings(_KGFields, CollaborativeSettings):
    r"""Settings of barycenter-qKG (``barycenter-qkg``): Co-KG with ``beta = 0``, the
    central batch q-KG alone.

    Attributes:
        mean_aggregation: How the server gets the barycenter mean: ``"clear"`` (every
            agent sends its mean, as the paper) or ``"secure"`` (every agent sends
            ``mu_n / M`` to a secure sum of the ``masking`` backend, ``M`` the number
            of agents it was built with: the server learns the uniform mean, not the
            individual ones, as long as it follows the protocol -- docs/security.md,
            "Co-KG"). ``"secure"`` needs ``weights="uniform"`` (an agent never takes
            its weight from the server), a grid or Sobol support (a k-means support is
            the server's choice) and ``--aggregator masking`` (``plaintext`` sends
            every input in clear; ``ckks`` keeps sums on the agents).
    """

    mean_aggregation: str = field(default="clear", metadata={"choices": MEAN_AGGREGATIONS})

    def _check(self) -> None:
        _choice(self, "mean_aggregation", MEAN_AGGREGATIONS)
        if self.mean_aggregation == "secure":
            if self.weights != "uniform":
                raise ValueError(
                    f"`weights`={self.weights!r} with `mean_aggregation`='secure': the secure "
                    "mean is uniform over the whole federation (each agent weighs its own "
                    "mean by 1/M; a weight the server computed and sent could single one "
                    "agent out); use `weights`='uniform'."
                )
            if self.support == "kmeans":
                raise ValueError(
                    "`support`='kmeans' with `mean_aggregation`='secure': a k-means support "
                    "is the server's choice (a one-point support makes an agent's local "
                    "optimum its hidden mean at any point); use a grid or Sobol support."
                )

    def hides_means(self) -> bool:
        r"""Whether the agents' means are summed securely instead of sent."""
        return self.mean_aggregation == "secure"


def support_kind(settings: CollaborativeSettings, dim: int) -> str:
    r"""The settings' support kind, ``"auto"`` resolved: ``"grid"`` for ``dim <= 2``,
    ``"sobol"`` otherwise."""
    if settings.support == "auto":
        return "grid" if dim <= 2 else "sobol"
    return settings.support


def public_support(settings: CollaborativeSettings, dim: int, seed: int) -> Tensor | None:
    r"""The grid or Sobol support of ``settings`` in ``[0, 1]^dim`` (``None`` for
    k-means: it depends on the agents' data).

    Args:
        settings: The algorithm's settings.
        dim: The dimension.
        seed: The run's (public) seed: the Sobol scrambling.

    Returns:
        The ``s x dim`` float64 support, or ``None``.

    Raises:
        ValueError: A grid of more than :data:`MAX_SUPPORT_SIZE` points.
    """
    kind = support_kind(settings, dim)
    if kind == "grid":
        return grid_support(dim, settings.points_per_dim, max_points=MAX_SUPPORT_SIZE)
    if kind == "sobol":
        return sobol_support(dim, settings.support_size, seed=seed)
    return None
