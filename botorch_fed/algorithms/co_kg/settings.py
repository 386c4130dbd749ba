r"""Settings of Co-KG and its family (Co-EI, Co-ES, barycenter-qKG) and their shared
support (Zhan et al., "Collaborative Bayesian optimization via Wasserstein barycenters",
paper 001, Alg. 1 and "Experimental Setup").
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, cast

from torch import Tensor

from botorch_fed.acquisition import BETA_KINDS, BetaSchedule
from botorch_fed.inducing import grid_support, sobol_support
from botorch_fed.protocol.declarations import Choice, Flag, Int, Real, check_settings

if TYPE_CHECKING:
    from botorch_fed.acquisition.beta_schedule import BetaKind

SUPPORTS = ("auto", "grid", "sobol", "kmeans")
WEIGHTS = ("uniform", "data", "precision")
MEAN_AGGREGATIONS = ("clear", "secure")
MAX_SUPPORT_SIZE = 4096  # agents refuse a larger support from the server
MIN_CLUSTER_SIZE = 2  # k-means support: never the centre of one point (a raw input)
MIN_SECURE_AGENTS = 3  # a secure mean over fewer reveals each input to the others


@dataclass
class CollaborativeSettings:
    r"""Settings every collaborative (barycenter) algorithm shares.

    Attributes:
        num_init: Initial design size per agent.
        num_rounds: Number of rounds ``T``.
        support: ``"grid"`` (``points_per_dim`` per axis), ``"sobol"`` (``support_size``
            points), ``"kmeans"`` (of the agents' inputs; leaks coarse locations) or
            ``"auto"`` (grid for d <= 2, Sobol otherwise).
        points_per_dim: Grid points per axis.
        support_size: Size of a Sobol or k-means support.
        centers_per_client: k of each agent's local k-means.
        support_every: Re-select a k-means support every K rounds (0: never).
        weights: Barycenter weights of the agents: ``"uniform"`` (the paper), by
            ``"data"`` size, or by posterior ``"precision"`` on the support.
        local_refit_every: Refit an agent's GP hyperparameters on every K-th update.
        fit_maxiter: L-BFGS-B iterations of an agent's refit.
        num_restarts: Restarts of the server's acquisition optimisation.
        raw_samples: Raw samples of the server's acquisition optimisation.
        maxiter: L-BFGS-B iterations of the server's acquisition optimisation.
    """

    num_init: Annotated[int, Int(1)] = 4
    num_rounds: Annotated[int, Int(1)] = 30
    support: Annotated[str, Choice(SUPPORTS)] = "auto"
    points_per_dim: Annotated[int, Int(2)] = 10
    support_size: Annotated[int, Int(1, MAX_SUPPORT_SIZE)] = 128
    centers_per_client: Annotated[int, Int(1)] = 8
    support_every: Annotated[int, Int(0)] = 0
    weights: Annotated[str, Choice(WEIGHTS)] = "uniform"
    local_refit_every: Annotated[int, Int(1)] = 5
    fit_maxiter: Annotated[int, Int(1)] = 50
    num_restarts: Annotated[int, Int(1)] = 2
    raw_samples: Annotated[int, Int(1)] = 64
    maxiter: Annotated[int, Int(1)] = 50

    def validate(self) -> None:
        r"""Raise ``ValueError`` naming the first invalid setting."""
        check_settings(self)
        if self.support == "kmeans" and self.num_init < MIN_CLUSTER_SIZE:
            raise ValueError(
                f"`num_init`={self.num_init}: a k-means support needs at least "
                f"{MIN_CLUSTER_SIZE} initial points per agent (a centre of one is that point)."
            )

    def make_beta_schedule(self) -> BetaSchedule:
        r"""The ``beta_t`` schedule (``beta_t = 0`` here)."""
        return BetaSchedule("constant", beta0=0.0)

    def hides_means(self) -> bool:
        r"""Whether the agents' means are summed securely instead of sent."""
        return False

    def support_kind(self, dim: int) -> str:
        r"""The support kind, ``"auto"`` resolved (grid for ``dim <= 2``)."""
        return ("grid" if dim <= 2 else "sobol") if self.support == "auto" else self.support

    def public_support(self, dim: int, seed: int) -> Tensor | None:
        r"""The ``s x dim`` grid (``ValueError`` over :data:`MAX_SUPPORT_SIZE` points) or
        Sobol support (``seed``: public) in ``[0, 1]^dim``, or ``None`` for k-means."""
        kind = self.support_kind(dim)
        if kind == "grid":
            return grid_support(dim, self.points_per_dim, max_points=MAX_SUPPORT_SIZE)
        return sobol_support(dim, self.support_size, seed=seed) if kind == "sobol" else None


@dataclass
class _BetaSettings(CollaborativeSettings):
    r"""Adds the ``beta_t`` schedule of the agents' own terms.

    Attributes:
        beta_schedule: ``"constant"`` (beta0), ``"linear"`` (beta0 + beta_rate (t - 1))
            or ``"power"`` (beta0 t^beta_power).
        beta0: ``beta_1 >= 0``.
        beta_rate: Slope of the linear schedule (>= 0).
        beta_power: Exponent of the power schedule.
    """

    beta_schedule: Annotated[str, Choice(BETA_KINDS)] = "linear"
    beta0: Annotated[float, Real(0)] = 0.0
    beta_rate: Annotated[float, Real(0)] = 0.1
    beta_power: Annotated[float, Real()] = 1.0

    def validate(self) -> None:
        super().validate()
        if self.beta_schedule in ("constant", "power") and self.beta0 == 0:
            msg = f"`beta0`=0 with the {self.beta_schedule!r} schedule: that is barycenter-qKG."
            warnings.warn(msg, UserWarning, stacklevel=2)
        schedule = self.make_beta_schedule()
        for t in (1, self.num_rounds):  # beta_t must stay finite over the run
            try:
                schedule(t)
            except ValueError as exc:
                raise ValueError(f"`beta_power`={self.beta_power!r}: {exc}") from exc

    def make_beta_schedule(self) -> BetaSchedule:
        kind = cast("BetaKind", self.beta_schedule)
        return BetaSchedule(
            kind,
            beta0=float(self.beta0),
            rate=float(self.beta_rate) if kind == "linear" else None,
            power=float(self.beta_power) if kind == "power" else None,
        )


@dataclass
class KGFields:
    r"""The knowledge gradient's Monte Carlo.

    Attributes:
        num_fantasies: Fantasies per model of the knowledge gradient.
        discrete: Inner maxima over the support (not one-shot over the domain).
    """

    num_fantasies: Annotated[int, Int(1)] = 16
    discrete: Annotated[bool, Flag()] = False


@dataclass
class CoKGSettings(KGFields, _BetaSettings):
    r"""Settings of Co-KG (``co-kg``): q-KG on the barycenter plus ``beta_t`` times each
    agent's KG."""


@dataclass
class CoEISettings(_BetaSettings):
    r"""Settings of Co-EI (``co-ei``): q-log-EI on the barycenter (incumbent: its largest
    mean on the support) plus ``beta_t`` times each agent's log-EI."""


@dataclass
class CoESSettings(_BetaSettings):
    r"""Settings of Co-ES (``co-es``): max-value entropy search on the barycenter
    (candidates: the support) plus ``beta_t`` times each agent's.

    Attributes:
        num_mv_samples: Max-value samples of the entropy search.
    """

    num_mv_samples: Annotated[int, Int(1)] = 16


@dataclass
class BarycenterQKGSettings(KGFields, CollaborativeSettings):
    r"""Settings of barycenter-qKG (``barycenter-qkg``): q-KG on the barycenter alone.

    Attributes:
        mean_aggregation: ``"clear"`` (agents send their means) or ``"secure"`` (a masked
            sum of ``mu_n / M``: the server learns the uniform mean, not the agents', as
            ``masking`` hides any input: against an actively malicious server colluding
            with fewer than ``M/3`` agents; needs uniform weights, a grid or Sobol support
            and ``--aggregator masking``).
    """

    mean_aggregation: Annotated[str, Choice(MEAN_AGGREGATIONS)] = "clear"

    def validate(self) -> None:
        super().validate()
        if self.mean_aggregation != "secure":
            return
        if self.weights != "uniform":  # a weight the server sent could single one agent out
            raise ValueError(
                f"`weights`={self.weights!r} with `mean_aggregation`='secure': use 'uniform'."
            )
        if self.support == "kmeans":  # the server's choice: one point reveals a hidden mean
            raise ValueError(
                "`support`='kmeans' with `mean_aggregation`='secure': use a grid or Sobol support."
            )

    def hides_means(self) -> bool:
        return self.mean_aggregation == "secure"
