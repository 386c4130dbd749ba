r"""Co-KG as a round-based program on the federation protocol (Alg. 1 of [Co-KG]).

Warm-up (Alg. 1 line 2): every agent evaluates its initial design on its own; the
server fixes the shared support -- the slides' regular grid (default in 2-D), a
scrambled Sobol sample (default for ``d > 2``), or a k-means support from the agents'
cluster centres as in FBO-FedGP (:func:`~botorch_fed.inducing.global_support`) -- and
broadcasts it. A grid or Sobol support depends on public settings only, so every
agent recomputes it and refuses any other.

Round ``t`` (lines 4-8):

1. every agent fits its own GP (``SingleTaskGP``, refitted every
   ``local_refit_every`` rounds by :class:`~botorch_fed.models.ExactGPRefitter`, as
   the local BO baseline does) and sends its *discretised posterior*: the posterior
   mean ``mu_n`` and latent covariance ``C_n`` on the support, in original outcome
   units (the agents maximise; a minimised objective enters negated), plus what the
   server needs off the support: its fitted hyperparameters in original units
   (lengthscales, signal variance ``std_y^2`` -- BoTorch's default RBF kernel has no
   output scale, the outcome transform supplies it --, noise variance and prior-mean
   constant), its number of observations and its local optimum on the support (the
   largest ``mu_n`` and where);
2. the server forms the central model
   :class:`~botorch_fed.models.BarycenterGP` -- the barycenter of the
   ``N`` posteriors, warm-started from the previous round's barycenter covariance
   (kept in the server's state, so a resumed run repeats bit for bit) -- with the
   shared prior off the support: lengthscales, signal and noise variance are the
   data-size-weighted geometric means of the agents' values, the prior mean their
   weighted arithmetic mean; agent ``n``'s local model is its own discretised
   posterior (a one-agent ``BarycenterGP`` with its own hyperparameters off the
   support). An agent without data (all its evaluations failed) counts with the
   shared prior as its posterior;
3. the server maximises the acquisition over the batch ``x_1..x_N`` (agent ``n`` gets
   ``x_n``; :func:`~botorch_fed.acquisition.optimize_co_acquisition`): Co-KG
   (``co-kg``, with ``beta_t`` from a :class:`~botorch_fed.acquisition.BetaSchedule`),
   Co-EI (``co-ei``), Co-ES (``co-es``) or Co-KG with ``beta = 0``
   (``barycenter-qkg``), and sends every agent its point, which the agent evaluates.

Output (line 10): ``x^`` = the local optimum of the agent whose local optimum is
largest, from the agents' posteriors after the last round
(:attr:`CoKGServer.recommendation`; every round's is in
:attr:`CoKGServer.recommendations`).

Privacy: the posteriors travel in the clear, as in the paper; docs/security.md
("Co-KG") says what the server learns from them -- the data. ``barycenter-qkg`` can
instead sum the uniform mean ``sum_n mu_n / M`` with the ``masking`` backend
(``mean_aggregation="secure"``: each agent weighs its own mean, one sum per posterior
request, over the whole federation; it hides the individual means as masking hides
any input, docs/security.md, but the sums of a few rounds still give the outcomes away);
the local Co-KG, Co-EI and Co-ES terms need each agent's own mean, so only ``beta = 0``
runs with hidden means.

Against a malicious server an agent answers posterior requests only for its own
rounds ``1..num_rounds``, each once and in order (at most ``num_init + num_rounds``
evaluations); against a malicious agent the server checks every field of its replies
(:meth:`CoKGServer._parse`) and names the agent.

References:

.. [Co-KG] D. Zhan, H. Zhang, R. Righter, Z. Zheng, J. Anderson. Collaborative
   Bayesian optimization via Wasserstein barycenters (paper 001 in ``shared/papers``;
   slides, IEEE CDC 2025), Alg. 1 and "Experimental Setup".
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field

import numpy as np
import torch
from botorch.exceptions.errors import UnsupportedError
from botorch.models import SingleTaskGP
from gpytorch.kernels import RBFKernel, ScaleKernel
from torch import Tensor

from botorch_fed.acquisition import (
    BETA_KINDS,
    BetaSchedule,
    optimize_co_acquisition,
    qCoExpectedImprovement,
    qCoKnowledgeGradient,
    qCoMaxValueEntropy,
)
from botorch_fed.federation.bo_client import BOClient
from botorch_fed.federation.checkpoint import CheckpointError, check_tensor, split_state
from botorch_fed.federation.messages import Message
from botorch_fed.federation.registry import AlgorithmSpec, register_algorithm
from botorch_fed.federation.roles import FederatedServer, ProtocolViolation
from botorch_fed.inducing import global_support, grid_support, local_centers, sobol_support
from botorch_fed.models import BarycenterGP, agent_weights, exact_gp_state, fit_exact_gp

SUPPORTS = ("auto", "grid", "sobol", "kmeans")
WEIGHTS = ("uniform", "data", "precision")
BETA_SCHEDULES = BETA_KINDS
MEAN_AGGREGATIONS = ("clear", "secure")
MAX_SUPPORT_SIZE = 4096  # agents refuse a larger support from the server
MIN_CLUSTER_SIZE = 2  # k-means support: never the centre of one point (a raw input)
MIN_SECURE_AGENTS = 3  # a secure mean over fewer reveals each input to the others
# What the server accepts from an agent (wide: every honest fit lies far inside; they
# keep the server's numerics finite and name an agent that sends the impossible).
# Lengthscales in the unit cube (BoTorch's default fit: >= 0.025; a few measured above 10).
LENGTHSCALE_RANGE = (1e-3, 1e4)
# Signal variance in the outcome's units squared (CEC-2005 functions reach ~1e21):
# outcome standard deviations between 1e-20 and 1e20.
OUTPUTSCALE_RANGE = (1e-40, 1e40)
# Noise variance relative to the signal variance (BoTorch's default fit: >= 1e-4).
NOISE_RATIO_RANGE = (1e-10, 1e3)
# |mean - prior mean| in signal standard deviations, for the means on the support (clear)
# and the local optimum (measured: at most 3.5 on the test functions).
MAX_MEAN_DEVIATION = 100.0
# The posterior variance is at most the prior's: diag(C) <= outputscale (1 + this).
PRIOR_VARIANCE_TOL = 1e-3
STEP = "collaborative"  # the history's step name of an assigned evaluation
# Relative change per iteration at which the barycenter iteration stops. It converges
# only linearly on the numerically singular posterior covariances of a grid (at 1e-10,
# BarycenterGP's default, it runs into max_iter=500 every round: ~2 s for 3 agents on
# 10 x 10, measured); 1e-6 is far below the Monte Carlo error of the acquisitions.
BARYCENTER_TOL = 1e-6


def _positive_int(settings, name: str) -> None:
    value = getattr(settings, name)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"`{name}` must be a positive integer, got {value!r}.")


def _finite_number(settings, name: str, nullable: bool = False) -> None:
    value = getattr(settings, name)
    if nullable and value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"`{name}` must be a finite number, got {value!r}.")


def _choice(settings, name: str, allowed: tuple) -> None:
    if getattr(settings, name) not in allowed:
        raise ValueError(f"`{name}`={getattr(settings, name)!r} must be one of {allowed}.")


# --- settings ---------------------------------------------------------------------------


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
        r"""Raise ``ValueError`` naming the first invalid setting."""
        for name in (
            "num_init",
            "num_rounds",
            "points_per_dim",
            "support_size",
            "centers_per_client",
            "local_refit_every",
            "fit_maxiter",
            "num_restarts",
            "raw_samples",
            "maxiter",
        ):
            _positive_int(self, name)
        value = self.support_every
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"`support_every` must be a non-negative integer, got {value!r}.")
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

    # the parts a server and its acquisition read
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

    beta_schedule: str = field(default="linear", metadata={"choices": BETA_SCHEDULES})
    beta0: float = 0.0
    beta_rate: float = 0.1
    beta_power: float = 1.0

    def _validate_beta(self) -> None:
        _choice(self, "beta_schedule", BETA_SCHEDULES)
        for name in ("beta0", "beta_rate", "beta_power"):
            _finite_number(self, name)
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
        kind = self.beta_schedule
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

    def _validate_kg(self) -> None:
        _positive_int(self, "num_fantasies")
        if not isinstance(self.discrete, bool):
            raise ValueError(f"`discrete` must be True or False, got {self.discrete!r}.")


@dataclass
class CoKGSettings(_KGFields, _BetaFields, CollaborativeSettings):
    r"""Settings of Co-KG (``co-kg``): the central batch q-KG on the barycenter plus
    ``beta_t`` times each agent's KG on its own posterior."""

    def validate(self) -> None:
        r"""Raise ``ValueError`` naming the first invalid setting."""
        CollaborativeSettings.validate(self)
        self._validate_beta()
        self._validate_kg()


@dataclass
class CoEISettings(_BetaFields, CollaborativeSettings):
    r"""Settings of Co-EI (``co-ei``): the central q-log-EI on the barycenter (incumbent:
    its largest mean on the support) plus ``beta_t`` times each agent's log-EI."""

    def validate(self) -> None:
        r"""Raise ``ValueError`` naming the first invalid setting."""
        CollaborativeSettings.validate(self)
        self._validate_beta()


@dataclass
class CoESSettings(_BetaFields, CollaborativeSettings):
    r"""Settings of Co-ES (``co-es``): max-value entropy search on the barycenter plus
    ``beta_t`` times each agent's, with the support as candidate set.

    Attributes:
        num_mv_samples: Max-value samples of the entropy search.
    """

    num_mv_samples: int = 16

    def validate(self) -> None:
        r"""Raise ``ValueError`` naming the first invalid setting."""
        CollaborativeSettings.validate(self)
        self._validate_beta()
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

    def validate(self) -> None:
        r"""Raise ``ValueError`` naming the first invalid setting."""
        CollaborativeSettings.validate(self)
        self._validate_kg()
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


def resolve_support_kind(kind: str, dim: int) -> str:
    r"""``"auto"`` -> ``"grid"`` for ``dim <= 2``, ``"sobol"`` otherwise."""
    if kind == "auto":
        return "grid" if dim <= 2 else "sobol"
    return kind


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
        ValueError: A grid of more than 4096 points.
    """
    kind = resolve_support_kind(settings.support, dim)
    if kind == "grid":
        return grid_support(dim, settings.points_per_dim, max_points=MAX_SUPPORT_SIZE)
    if kind == "sobol":
        return sobol_support(dim, settings.support_size, seed=seed)
    return None


# --- hyperparameters in original units -----------------------------------------------


def original_hyperparameters(model: SingleTaskGP) -> dict[str, Tensor]:
    r"""A fitted ``SingleTaskGP``'s hyperparameters in original outcome units.

    With BoTorch's defaults (RBF kernel without output scale on standardised outcomes,
    ``Standardize`` outcome transform with mean ``m_y`` and std ``s_y``) the prior in
    original units is ``GP(m_y + s_y c, s_y^2 k_RBF)`` and the noise variance
    ``s_y^2 sigma^2``.

    Args:
        model: The agent's model (RBF or scaled RBF kernel, constant mean, Gaussian
            likelihood, optional ``Standardize``).

    Returns:
        ``lengthscale`` (``d``), ``outputscale``, ``noise`` and ``mean_constant``
        (0-dim), float64.

    Raises:
        UnsupportedError: Another kernel or outcome transform.
    """
    covar = model.covar_module
    scale = torch.ones((), dtype=torch.float64)
    if isinstance(covar, ScaleKernel):
        scale = covar.outputscale.detach().to(torch.float64).reshape(())
        covar = covar.base_kernel
    if not isinstance(covar, RBFKernel):
        raise UnsupportedError(
            f"Co-KG's shared prior is an RBF kernel; the agent's model has a "
            f"{type(covar).__name__}."
        )
    d = model.train_inputs[0].shape[-1]
    lengthscale = covar.lengthscale.detach().to(torch.float64).reshape(-1).expand(d).clone()
    noise = model.likelihood.noise.detach().to(torch.float64).reshape(-1)[0]
    constant = model.mean_module.constant.detach().to(torch.float64).reshape(())
    mean_y, std_y = torch.zeros((), dtype=torch.float64), torch.ones((), dtype=torch.float64)
    transform = getattr(model, "outcome_transform", None)
    if transform is not None:
        if not hasattr(transform, "stdvs"):
            raise UnsupportedError(
                f"Co-KG reads a Standardize outcome transform, got {type(transform).__name__}."
            )
        mean_y = transform.means.detach().to(torch.float64).reshape(())
        std_y = transform.stdvs.detach().to(torch.float64).reshape(())
    return {
        "lengthscale": lengthscale,
        "outputscale": scale * std_y**2,
        "noise": noise * std_y**2,
        "mean_constant": mean_y + std_y * constant,
    }


def shared_kernel(lengthscale: Tensor, outputscale: Tensor) -> ScaleKernel:
    r"""``outputscale * RBF(lengthscale)`` as a float64 gpytorch kernel (no priors).

    Args:
        lengthscale: ``d`` lengthscales.
        outputscale: The signal variance.

    Returns:
        The kernel.
    """
    d = lengthscale.numel()
    kernel = ScaleKernel(RBFKernel(ard_num_dims=d)).to(torch.float64)
    kernel.base_kernel.lengthscale = lengthscale.reshape(1, d).to(torch.float64)
    kernel.outputscale = outputscale.to(torch.float64).reshape(())
    return kernel


def _psd(C: Tensor) -> Tensor:
    r"""``C`` symmetrised; its negative eigenvalues clipped when rounding made it
    indefinite beyond the barycenter's tolerance."""
    C = 0.5 * (C + C.transpose(-1, -2))
    scale = C.diagonal().abs().max().clamp_min(1e-300)
    eye = torch.eye(C.shape[-1], dtype=C.dtype)
    if torch.linalg.cholesky_ex(C + 1e-13 * scale * eye).info == 0:
        return C
    evals, evecs = torch.linalg.eigh(C)
    C = (evecs * evals.clamp_min(0.0)) @ evecs.transpose(-1, -2)
    return 0.5 * (C + C.transpose(-1, -2))


# --- checking an agent's replies (server side) ------------------------------------------

# As in the barycenter (botorch_fed.models.barycenter): asymmetry and negative
# eigenvalues beyond this times the largest variance are refused.
COVARIANCE_TOL = 1e3 * torch.finfo(torch.float64).eps


def _finite_float(value) -> float | None:
    r"""``value`` as a finite float, or ``None`` (not a real number, or not finite)."""
    if isinstance(value, bool) or not isinstance(value, int | float | np.integer | np.floating):
        return None
    try:
        value = float(value)
    except OverflowError:
        return None
    return value if math.isfinite(value) else None


def _count(payload: dict, bad, bound: int) -> int:
    r"""An agent's ``num_data``: an int in ``0..bound`` (else ``bad(...)`` is raised)."""
    n = payload.get("num_data")
    if isinstance(n, bool) or not isinstance(n, int | np.integer) or not 0 <= n <= bound:
        raise bad(f"has `num_data`={n!r:.40} (expected an int in 0..{bound})")
    return int(n)


def _optimum(payload: dict, bad, size: int) -> tuple[int, float]:
    r"""An agent's local optimum: ``best_index`` an int in ``0..size - 1`` and
    ``best_value`` a finite number (else ``bad(...)`` is raised)."""
    best, value = payload.get("best_index"), _finite_float(payload.get("best_value"))
    if (
        isinstance(best, bool)
        or not isinstance(best, int | np.integer)
        or not 0 <= best < size
        or value is None
    ):
        raise bad("has no valid local optimum (`best_index`, `best_value`)")
    return int(best), value


# --- the agent -------------------------------------------------------------------------


class CoKGClient(BOClient):
    r"""A Co-KG agent: private data, its own GP, its discretised posterior.

    The agent trusts the server with nothing it can check itself: it answers a
    posterior request only for the rounds ``1..num_rounds`` of its own settings, each
    at most once and in increasing order, and evaluates one point per posterior it
    sent (so the server has it evaluate at most ``num_init + num_rounds`` points); it
    refuses a support other than the public grid or Sobol one, ``centers`` requests
    unless the settings pick a k-means support, and any malformed field (a
    :class:`~botorch_fed.federation.roles.ProtocolViolation` naming the agent). Under
    ``mean_aggregation="secure"`` it contributes ``mu_n / M`` (``M``: ``num_agents``,
    never a weight from the server) to one masked sum over the whole federation per
    posterior request, and forgets ``mu_n`` after it (or after the round).

    Args:
        client_id: The id.
        objective: The agent's black box.
        settings: The algorithm's settings (shared by all parties).
        seed: The agent's seed (initial design, GP fits, k-means).
        secagg: Its secure-aggregation role (``barycenter-qkg`` only).
        init_region: Optional ``2 x d`` sub-box for the initial design.
        evaluation_errors: ``"record"`` or ``"raise"`` (see :class:`BOClient`).
        private_seed: Seed of the private generator (see :class:`BOClient`).
        support_seed: The run's public seed: the Sobol support it expects.
        num_agents: ``M``, the number of agents of the federation (ids ``0..M-1``):
            required with ``mean_aggregation="secure"`` (at least 3), where the agent
            weighs its own mean by ``1/M`` and contributes only to sums over all ``M``.
    """

    # what the server sends every client alike (bound into the next secure sum)
    RELAYED = frozenset({"init", "centers", "support", "posterior", "optimum"})

    def __init__(
        self,
        client_id: int,
        objective,
        settings: CollaborativeSettings,
        seed: int,
        secagg=None,
        init_region: Tensor | None = None,
        evaluation_errors: str = "record",
        private_seed: int | None = None,
        support_seed: int = 0,
        num_agents: int | None = None,
    ) -> None:
        super().__init__(
            client_id,
            objective,
            settings,
            seed,
            secagg,
            init_region,
            evaluation_errors,
            private_seed,
        )
        M = num_agents
        if M is not None and (isinstance(M, bool) or not isinstance(M, int) or M < 1):
            raise ValueError(f"`num_agents` must be a positive integer or None, got {M!r}.")
        if settings.hides_means() and (M is None or M < MIN_SECURE_AGENTS):
            raise ValueError(
                f"`num_agents`={M!r}: an agent of `mean_aggregation`='secure' needs the "
                f"federation's size M >= {MIN_SECURE_AGENTS} (it weighs its own mean by 1/M "
                "and sums only over all M agents)."
            )
        if settings.hides_means() and not 0 <= self.client_id < M:
            raise ValueError(f"`client_id`={client_id} is not one of the {M} agents 0..{M - 1}.")
        self.num_agents = M
        self.support_seed = int(support_seed)
        self.support: Tensor | None = None
        self._last_round = 0  # the last round whose posterior request it answered
        self._assigned_round: int | None = None  # the round whose point it may evaluate
        self._secure_armed = False  # a posterior request awaits its one secure sum
        self._hidden_mean: Tensor | None = None  # that request's mean (None: no data)

    _COKG_STATE = ("support", "assigned_round", "last_round")

    def state_dict(self) -> dict:
        r"""Adds the support, the round whose point it may still evaluate and the last
        round it answered a posterior for to :meth:`BOClient.state_dict` (a hidden
        mean is never state: it lives from a posterior request to its secure sum or
        the end of the round)."""
        state = super().state_dict()
        state.update(
            support=None if self.support is None else self.support.clone(),
            assigned_round=self._assigned_round,
            last_round=self._last_round,
        )
        return state

    def load_state_dict(self, state: dict) -> None:
        owner = f"Client {self.client_id}"
        own, rest = split_state(owner, state, self._COKG_STATE)
        super().load_state_dict(rest)
        support = own["support"]
        if support is not None:
            support = check_tensor(owner, "support", support, (None, self.dim)).clone()
        assigned, last = own["assigned_round"], own["last_round"]
        if assigned is not None and (isinstance(assigned, bool) or not isinstance(assigned, int)):
            raise CheckpointError(f"{owner}: `assigned_round` must be an int or None.")
        if isinstance(last, bool) or not isinstance(last, int) or last < 0:
            raise CheckpointError(
                f"{owner}: `last_round` must be a non-negative int, got {last!r}."
            )
        self.support, self._assigned_round, self._last_round = support, assigned, last
        self._secure_armed, self._hidden_mean = False, None

    # --- the server's fields, checked -----------------------------------------------------
    def _field(self, payload: dict, key: str, request: str):
        if key not in payload:
            raise self.violation(f"the request has no `{key}`", request)
        return payload[key]

    def _int_field(self, payload: dict, key: str, request: str) -> int:
        value = self._field(payload, key, request)
        if isinstance(value, bool) or not isinstance(value, int | np.integer):
            raise self.violation(f"`{key}`={value!r:.40} must be an integer", request)
        return int(value)

    def _array_field(self, payload: dict, key: str, request: str) -> np.ndarray:
        value = self._field(payload, key, request)
        kind = np.asarray(value).dtype.kind if not isinstance(value, str | bytes) else "S"
        if kind not in "iuf":  # not text (np.asarray("0.5", float) would parse it)
            raise self.violation(f"`{key}` must be an array of numbers, got {value!r:.40}", request)
        return np.asarray(value, dtype=np.float64)

    def _round_field(self, payload: dict, request: str) -> int:
        r"""The round ``t`` of a posterior request: an int in ``1..num_rounds``, the
        round after the last one answered (every round asks every agent)."""
        t = self._int_field(payload, "t", request)
        T = self.settings.num_rounds
        if not 1 <= t <= T:
            raise self.violation(f"round t={t} is not one of this run's rounds 1..{T}", request)
        if t <= self._last_round:
            raise self.violation(
                f"round t={t}, but this agent already answered round {self._last_round} (each "
                "round once, in increasing order)",
                request,
            )
        if t != self._last_round + 1:
            raise self.violation(
                f"round t={t}, but the next round of this agent is {self._last_round + 1} "
                "(no round is skipped)",
                request,
            )
        return t

    # --- support ------------------------------------------------------------------------
    def on_centers(self, payload: dict) -> dict:
        if resolve_support_kind(self.settings.support, self.dim) != "kmeans":
            kind = resolve_support_kind(self.settings.support, self.dim)
            raise self.violation(
                f"this run's support is the public {kind} support: no centres of the data",
                "centers",
            )
        k = self._int_field(payload, "k", "centers")
        if not 1 <= k <= MAX_SUPPORT_SIZE:
            raise self.violation(f"`k`={k} must be in 1..{MAX_SUPPORT_SIZE}", "centers")
        if len(self.X) < MIN_CLUSTER_SIZE:  # too few points to share a centre of
            return {"centers": np.empty((0, self.dim))}
        with self.timed("support"):
            centers = local_centers(self.X, k=k, seed=self.seed, min_cluster_size=MIN_CLUSTER_SIZE)
        return {"centers": centers.numpy()}

    def on_support(self, payload: dict) -> dict:
        support = torch.as_tensor(self._array_field(payload, "support", "support"))
        if not (
            support.ndim == 2
            and support.shape[-1] == self.dim
            and 1 <= support.shape[0] <= MAX_SUPPORT_SIZE
            and torch.isfinite(support).all()
            and ((support >= 0) & (support <= 1)).all()
        ):
            raise self.violation(
                f"the support must be 1..{MAX_SUPPORT_SIZE} finite points of [0, 1]^{self.dim}, "
                f"got shape {tuple(support.shape)}",
                "support",
            )
        expected = public_support(self.settings, self.dim, self.support_seed)
        if expected is not None and not torch.equal(support, expected):
            # a grid or Sobol support is public: a server that sends another one (e.g.
            # points clustered around this agent's data) is refused
            kind = resolve_support_kind(self.settings.support, self.dim)
            raise self.violation(
                f"the support differs from the {kind} support of the settings", "support"
            )
        self.support = support
        return {}

    # --- the round -----------------------------------------------------------------------
    def posterior_summary(self) -> dict[str, Tensor]:
        r"""This agent's discretised posterior on the support (what it shares).

        Returns:
            ``mean`` (``s``), ``covariance`` (``s x s``, latent), ``lengthscale``
            (``d``), ``outputscale``, ``noise``, ``mean_constant`` -- original outcome
            units, in the agents' maximisation convention.
        """
        if self.support is None:
            raise ProtocolViolation(f"Client {self.client_id} holds no support yet.")
        model = self.local_model()
        with self.timed("summary"), torch.no_grad():
            posterior = model.posterior(self.support)
            mean = posterior.mean.reshape(-1).to(torch.float64)
            covariance = _psd(posterior.covariance_matrix.to(torch.float64).reshape(len(mean), -1))
            return {"mean": mean, "covariance": covariance, **original_hyperparameters(model)}

    def on_posterior(self, payload: dict) -> dict:
        t = self._round_field(payload, "posterior")
        if self.support is None:
            raise self.violation("no support yet (the support comes before round 1)", "posterior")
        mean = None
        if len(self.X) == 0:  # every evaluation failed so far: no posterior of its own
            reply = {"num_data": 0}
        else:
            summary = self.posterior_summary()
            mean = summary.pop("mean")
            best = int(mean.argmax())
            reply = {
                "num_data": len(self.X),
                "best_index": best,
                "best_value": float(mean[best]),
                **{k: v.numpy() for k, v in summary.items()},
            }
            if not self.settings.hides_means():
                reply["mean"] = mean.numpy()
        # answered: round t is spent, and it arms one evaluation (and one secure sum)
        self.round = self._last_round = self._assigned_round = t
        self._secure_armed = self.settings.hides_means()
        self._hidden_mean = mean if self._secure_armed else None
        return reply

    def on_secagg(self, payload: dict) -> dict:
        r"""A secure-sum message; a ``weighted_mean`` session must run on the masking
        backend over all ``num_agents`` agents (the session header the backend
        authenticates, not only the ``clients`` argument the server names)."""
        if "request" in payload and str(payload["request"]) == "weighted_mean":
            backend = getattr(getattr(self.secagg, "backend", None), "name", None)
            if backend != "masking":
                raise self.violation(
                    f"a secure mean through the {backend!r} backend (only masking hides the "
                    "inputs from the server)",
                    "weighted_mean",
                )
            reply = super().on_secagg(payload)
            session = tuple(int(c) for c in getattr(self.secagg, "client_ids", ()))
            if session != tuple(range(self.num_agents)):
                self._pending = self._request = None  # nothing of it leaves this agent
                raise self.violation(
                    f"the secure-sum session runs over clients {list(session)}, not the whole "
                    f"federation 0..{self.num_agents - 1}",
                    "weighted_mean",
                )
            return reply
        return super().on_secagg(payload)

    def vector_weighted_mean(self, weights: np.ndarray, clients: np.ndarray) -> np.ndarray:
        r"""``mu_n / M`` for the secure sum of the uniform barycenter mean (zeros
        without data: the server adds the prior's share itself).

        The weight is this agent's own ``1/M``; the server's ``weights`` and
        ``clients`` must agree with it (uniform over all ``M`` agents). A posterior
        request answers at most one secure sum, refused or not: the hidden mean is
        gone after the first attempt.

        Raises:
            ProtocolViolation: No posterior request armed this sum (or it was used),
                the clients are not the whole federation, or the weights are not
                ``1/M`` each.
        """
        request = "weighted_mean"
        if not self.settings.hides_means():
            raise self.violation("this run sends its means in clear: no secure mean", request)
        if self.support is None:
            raise self.violation("a secure mean before the support", request)
        armed, mean = self._secure_armed, self._hidden_mean
        self._secure_armed, self._hidden_mean = False, None  # one sum per posterior request
        if not armed:
            raise self.violation(
                "a secure mean without a posterior request (each request answers one sum)",
                request,
            )
        M = self.num_agents
        try:
            ids = [int(c) for c in np.asarray(clients).reshape(-1).tolist()]
        except (TypeError, ValueError, OverflowError):
            ids = None
        if ids is None or sorted(ids) != list(range(M)):
            raise self.violation(
                f"the clients {clients!r:.80} are not the whole federation 0..{M - 1}", request
            )
        try:
            weights = np.asarray(weights, dtype=np.float64).reshape(-1)
        except (TypeError, ValueError, OverflowError):
            weights = np.empty(0)
        if weights.shape != (M,) or not np.allclose(weights, 1.0 / M, rtol=1e-12, atol=0.0):
            raise self.violation(
                f"invalid weights {weights.tolist()!r:.80}: the secure mean is uniform, 1/{M} "
                "per agent",
                request,
            )
        if mean is None:
            return np.zeros(len(self.support))
        return (1.0 / M) * mean.numpy()

    def on_evaluate(self, payload: dict) -> dict:
        t = self._int_field(payload, "t", "evaluate")
        if self._assigned_round != t:
            # one evaluation per posterior the agent sent: a server cannot spend the
            # agent's budget on points of its choosing outside the protocol
            raise self.violation(
                f"an evaluation for round {t}, but this agent's last posterior was for "
                f"round {self._assigned_round}",
                "evaluate",
            )
        x = self._array_field(payload, "x", "evaluate")
        if x.shape != (self.dim,) or not np.isfinite(x).all() or (x < 0).any() or (x > 1).any():
            raise self.violation(
                f"the point must be {self.dim} finite values in [0, 1], got {x.tolist()}",
                "evaluate",
            )
        # the round ends here: no second evaluation, and a hidden mean not summed by now
        # is dropped (as a resumed agent, which never holds one, would)
        self._assigned_round = None
        self._secure_armed, self._hidden_mean = False, None
        x = torch.as_tensor(x).reshape(1, self.dim)
        # the server's models never learn of a failed point: do not evaluate it again
        self.evaluate(self.avoid_failures(x), t, STEP)
        return {}

    def on_optimum(self, payload: dict) -> dict:
        r"""Alg. 1 line 10: this agent's local optimum (largest posterior mean on the
        support) after the last round."""
        if len(self.X) == 0 or self.support is None:
            return {"num_data": 0}
        # the answer of the run: hyperparameters refitted on all the data (between
        # refits, local_refit_every, the model reuses older ones)
        with self.timed("local_fit"):
            model = fit_exact_gp(
                self.X,
                self.Y,
                seed=self.seed,
                warm_start=exact_gp_state(self.local_model()),
                maxiter=self.settings.fit_maxiter,
            )
        with self.timed("summary"), torch.no_grad():
            mean = model.posterior(self.support).mean.reshape(-1)
        best = int(mean.argmax())
        return {"num_data": len(self.X), "best_index": best, "best_value": float(mean[best])}


# --- the server ------------------------------------------------------------------------


class CoKGServer(FederatedServer):
    r"""The Co-KG server: support, barycenter, acquisition, assignments.

    Args:
        transport: Reaches the agents.
        settings: The algorithm's settings.
        dim: Problem dimension.
        seed: The run's seed (Sobol support, k-means, acquisition seeds).
        algorithm: ``"co-kg"``, ``"co-ei"``, ``"co-es"`` or ``"barycenter-qkg"``.
        secagg: The server role of the secure-aggregation backend (``barycenter-qkg``
            with ``mean_aggregation="secure"``).
        bounds: ``2 x d`` bounds of the objectives' domain (public): ``x^`` is reported
            in it.
        minimize: The objectives' convention (public): ``x^``'s value is reported in it.
    """

    def __init__(
        self,
        transport,
        settings: CollaborativeSettings,
        dim: int,
        seed: int,
        algorithm: str = "co-kg",
        secagg=None,
        bounds: Tensor | None = None,
        minimize: bool = False,
    ) -> None:
        super().__init__(transport, secagg)
        settings.validate()
        if algorithm not in ACQUISITIONS:
            raise ValueError(f"`algorithm`={algorithm!r} must be one of {tuple(ACQUISITIONS)}.")
        if settings.hides_means() and secagg is None:
            raise ValueError(
                "`mean_aggregation`='secure' needs a secure-aggregation backend (`aggregator`)."
            )
        self.settings = settings
        self.algorithm = algorithm
        self.dim = int(dim)
        self.seed = int(seed)
        self.schedule = settings.make_beta_schedule()
        self.bounds = bounds
        self.minimize = bool(minimize)
        self.support: Tensor | None = public_support(settings, self.dim, self.seed)
        self.barycenter_covariance: Tensor | None = None  # warm start of the next round
        self.recommendations: list[dict] = []
        self.recommendation: dict | None = None
        self.last_central = None  # this round's central model (not state: rebuilt each round)

    # --- checkpoints ---------------------------------------------------------------------
    def state_dict(self) -> dict:
        r"""Adds the support, the barycenter warm start and the recommendations to
        :meth:`FederatedServer.state_dict`."""
        state = super().state_dict()
        cov = self.barycenter_covariance
        state.update(
            support=None if self.support is None else self.support.clone(),
            barycenter_covariance=None if cov is None else cov.clone(),
            recommendations=[dict(r) for r in self.recommendations],
        )
        return state

    def load_state_dict(self, state: dict) -> None:
        own, rest = split_state(
            "Server", state, ("support", "barycenter_covariance", "recommendations")
        )
        super().load_state_dict(rest)
        support = own["support"]
        if support is not None:
            support = check_tensor("Server", "support", support, (None, self.dim)).clone()
        cov = own["barycenter_covariance"]
        if cov is not None:
            s = None if support is None else len(support)
            cov = check_tensor("Server", "barycenter_covariance", cov, (s, s)).clone()
        recs = own["recommendations"]
        if not isinstance(recs, list) or not all(isinstance(r, dict) for r in recs):
            raise CheckpointError("Server: `recommendations` must be a list of dicts.")
        self.support, self.barycenter_covariance = support, cov
        self.recommendations = [dict(r) for r in recs]
        self.recommendation = self.recommendations[-1] if self.recommendations else None

    # --- support ---------------------------------------------------------------------------
    def select_support(self, t: int) -> None:
        r"""The k-means support from the agents' centres (or the public grid/Sobol
        support) and its broadcast; a new support drops the barycenter warm start."""
        if resolve_support_kind(self.settings.support, self.dim) == "kmeans":
            k = self.settings.centers_per_client
            replies = self.broadcast("centers", {"k": k})
            with self.ledger.timer("support"):
                centers = [self._centers(c, replies[c].payload, k) for c in sorted(replies)]
                centers = [c for c in centers if len(c)]
                if centers:
                    support = global_support(
                        centers, self.settings.support_size, seed=self.seed + t
                    )
                else:  # no agent holds enough data yet: a data-independent support
                    support = sobol_support(self.dim, self.settings.support_size, seed=self.seed)
            if self.support is None or not torch.equal(support, self.support):
                self.barycenter_covariance = None
            self.support = support
        self.broadcast("support", {"support": self.support.numpy()})

    def _centers(self, cid: int, payload: dict, k: int) -> Tensor:
        r"""Agent ``cid``'s k-means centres: at most ``k`` finite points of the unit
        cube (else a :class:`ProtocolViolation` naming the agent)."""
        try:
            centers = np.asarray(payload.get("centers"), dtype=np.float64)
        except (TypeError, ValueError, OverflowError):
            centers = None
        if (
            centers is None
            or centers.ndim != 2
            or centers.shape[1] != self.dim
            or len(centers) > k
            or not np.isfinite(centers).all()
            or (centers < 0).any()
            or (centers > 1).any()
        ):
            shape = None if centers is None else centers.shape
            raise ProtocolViolation(
                f"Server: the k-means centres of client {cid} must be at most {k} finite points "
                f"of [0, 1]^{self.dim}, got shape {shape}."
            )
        return torch.as_tensor(centers)

    def initialize(self) -> None:
        r"""Warm-up (Alg. 1 line 2), then the shared support."""
        self.broadcast("init")
        self.select_support(0)

    # --- the round -----------------------------------------------------------------------
    def round_seed(self, t: int) -> int:
        r"""The seed of round ``t``'s acquisition (samplers and search)."""
        return (self.seed * 1_000_003 + t) % (2**31)

    def run_round(self, t: int) -> None:
        r"""Round ``t`` (Alg. 1 lines 4-8): posteriors in, barycenter, acquisition,
        one point out to every agent."""
        cfg = self.settings
        kmeans = resolve_support_kind(cfg.support, self.dim) == "kmeans"
        if kmeans and cfg.support_every and t > 1 and (t - 1) % cfg.support_every == 0:
            self.select_support(t)
        replies = self.broadcast("posterior", {"t": t})
        ids = sorted(replies)
        posteriors = {cid: self._parse(cid, replies[cid].payload, t) for cid in ids}
        self._recommend(t, posteriors)
        if all(p is None for p in posteriors.values()):
            # every evaluation failed so far: a seeded random batch
            g = torch.Generator().manual_seed(self.round_seed(t))
            X = torch.rand(len(ids), self.dim, generator=g, dtype=torch.float64)
        else:
            X = self._batch(t, ids, posteriors)
        self.send(
            {cid: Message("evaluate", {"x": X[i].numpy(), "t": t}) for i, cid in enumerate(ids)}
        )

    def _parse(self, cid: int, payload: dict, t: int) -> dict | None:
        r"""Agent ``cid``'s posterior reply of round ``t``, every field checked.

        Shapes and finiteness; ``num_data`` an int in ``0..num_init + t - 1`` (what an
        agent can hold by round ``t``); lengthscales, signal variance and the noise
        (relative to the signal) within :data:`LENGTHSCALE_RANGE`,
        :data:`OUTPUTSCALE_RANGE`, :data:`NOISE_RATIO_RANGE`; the covariance symmetric,
        positive semi-definite (as the barycenter requires) and at most the prior
        variance; the means (clear) or the local optimum (secure) within
        :data:`MAX_MEAN_DEVIATION` signal standard deviations of the prior mean; and in
        clear mode ``best_value`` the mean at ``best_index``, its maximum.

        Returns:
            The parsed posterior, or ``None`` for an agent without data.

        Raises:
            ProtocolViolation: A field an honest agent cannot send, naming the agent.
        """
        s, d = len(self.support), self.dim

        def bad(problem: str) -> ProtocolViolation:
            return ProtocolViolation(f"Server: the posterior of client {cid} {problem}.")

        n = _count(payload, bad, self.settings.num_init + t - 1)
        if n == 0:
            return None
        shapes = {
            "covariance": (s, s),
            "lengthscale": (d,),
            "outputscale": (),
            "noise": (),
            "mean_constant": (),
        }
        if not self.settings.hides_means():
            shapes["mean"] = (s,)
        out: dict = {"num_data": n}
        for key, shape in shapes.items():
            try:
                value = np.asarray(payload.get(key, np.empty(0)), dtype=np.float64)
            except (TypeError, ValueError, OverflowError):
                raise bad(f"has a non-numeric `{key}`") from None
            if value.shape != shape or not np.isfinite(value).all():
                raise bad(f"has `{key}` of shape {value.shape} (expected {shape}, finite)")
            out[key] = torch.as_tensor(value)
        for key in ("lengthscale", "outputscale", "noise"):
            if not (out[key] > 0).all():
                raise bad(f"has a non-positive `{key}`")
        lengthscale, outputscale = out["lengthscale"], float(out["outputscale"])
        low, high = LENGTHSCALE_RANGE
        if not ((lengthscale >= low) & (lengthscale <= high)).all():
            raise bad(f"has `lengthscale` {lengthscale.tolist()} outside [{low}, {high}]")
        low, high = OUTPUTSCALE_RANGE
        if not low <= outputscale <= high:
            raise bad(f"has `outputscale`={outputscale:.6g} outside [{low}, {high}]")
        ratio = float(out["noise"]) / outputscale
        low, high = NOISE_RATIO_RANGE
        if not low <= ratio <= high:
            raise bad(f"has `noise` {ratio:.3g} x `outputscale`, outside [{low}, {high}] x")
        C = out["covariance"]
        if (C - C.T).abs().max() > COVARIANCE_TOL * C.diagonal().abs().max().clamp_min(1e-300):
            raise bad("has a `covariance` that is not symmetric")
        eye = torch.eye(s, dtype=torch.float64)
        scale = C.diagonal().abs().max().clamp_min(1e-300)
        if torch.linalg.cholesky_ex(0.5 * (C + C.T) + COVARIANCE_TOL * scale * eye).info != 0:
            raise bad("has a `covariance` that is not positive semi-definite")
        if C.diagonal().max() > outputscale * (1 + PRIOR_VARIANCE_TOL):
            raise bad(
                f"has posterior variances up to {float(C.diagonal().max()):.6g}, above its prior "
                f"variance `outputscale`={outputscale:.6g}"
            )
        out["best_index"], out["best_value"] = _optimum(payload, bad, s)
        sd, m = math.sqrt(outputscale), float(out["mean_constant"])
        R = MAX_MEAN_DEVIATION
        if self.settings.hides_means():
            if abs(out["best_value"] - m) > R * sd:
                raise bad(
                    f"has `best_value`={out['best_value']:.6g} more than {R:g} signal standard "
                    f"deviations ({sd:.3g}) from `mean_constant`={m:.6g}"
                )
        else:
            mean = out["mean"]
            if float((mean - m).abs().max()) > R * sd:
                raise bad(
                    f"has `mean_constant`={m:.6g} more than {R:g} signal standard deviations "
                    f"({sd:.3g}) from its means on the support"
                )
            best = out["best_index"]
            if out["best_value"] != float(mean[best]) or float(mean[best]) != float(mean.max()):
                raise bad(
                    f"has `best_value`={out['best_value']!r} at `best_index`={best}, but its "
                    f"mean there is {float(mean[best])!r} and its largest {float(mean.max())!r}"
                )
        return out

    def _recommend(self, t: int, optima: dict[int, dict | None]) -> None:
        r"""``x^``: the largest of the agents' local optima (Alg. 1 line 10)."""
        known = {cid: o for cid, o in optima.items() if o is not None}
        if not known:
            return
        cid = max(sorted(known), key=lambda c: known[c]["best_value"])  # first of ties
        x = self.support[known[cid]["best_index"]]
        value = known[cid]["best_value"]
        domain = (
            x if self.bounds is None else self.bounds[0] + x * (self.bounds[1] - self.bounds[0])
        )
        self.recommendation = {
            "round": int(t),
            "client": int(cid),
            "x": domain.tolist(),
            "x_unit": x.tolist(),
            "predicted_value": -value if self.minimize else value,
        }
        self.recommendations.append(self.recommendation)

    def _shared_prior(self, posteriors: dict[int, dict | None]) -> dict[str, Tensor]:
        r"""The shared prior off the support: data-size-weighted geometric means of the
        agents' lengthscales, signal and noise variances; weighted mean of their prior
        means."""
        known = [p for p in posteriors.values() if p is not None]
        n = torch.tensor([p["num_data"] for p in known], dtype=torch.float64)
        w = n / n.sum()

        def geometric(key: str) -> Tensor:
            logs = torch.stack([p[key].log() for p in known])
            return (w.reshape(-1, *[1] * (logs.ndim - 1)) * logs).sum(0).exp()

        return {
            "lengthscale": geometric("lengthscale"),
            "outputscale": geometric("outputscale"),
            "noise": geometric("noise"),
            "mean_constant": (w * torch.stack([p["mean_constant"] for p in known])).sum(),
        }

    def _batch(self, t: int, ids: list[int], posteriors: dict[int, dict | None]) -> Tensor:
        cfg = self.settings
        S = self.support
        with self.ledger.timer("barycenter"):
            prior = self._shared_prior(posteriors)
            kernel = shared_kernel(prior["lengthscale"], prior["outputscale"])
            with torch.no_grad():
                K_SS = kernel(S).to_dense().to(torch.float64)
            m0 = prior["mean_constant"]
            covs = torch.stack(
                [K_SS if posteriors[c] is None else posteriors[c]["covariance"] for c in ids]
            )
            counts = [0 if posteriors[c] is None else posteriors[c]["num_data"] for c in ids]
            weights = agent_weights(cfg.weights, covariances=covs, num_data=counts)
            if cfg.hides_means():
                mean = self._secure_mean(ids, weights, posteriors, m0)
                means = mean.expand(len(ids), -1)  # a weighted mean of N copies is itself
            else:
                means = torch.stack(
                    [
                        m0.expand(len(S)) if posteriors[c] is None else posteriors[c]["mean"]
                        for c in ids
                    ]
                )
            central = BarycenterGP(
                S,
                means,
                covs,
                kernel,
                weights=weights,
                noise=prior["noise"],
                mean_constant=m0,
                barycenter_init=self.barycenter_covariance,
                tol=BARYCENTER_TOL,
            )
            self.barycenter_covariance = central.barycenter_covariance.detach().clone()
            self.last_central = central
            beta = float(self.schedule(t))
            if cfg.hides_means() or beta == 0:
                locals_ = [central] * len(ids)  # placeholders: not evaluated at beta = 0
            else:
                locals_ = [self._local_model(posteriors[c], prior, K_SS) for c in ids]
        with self.ledger.timer("acquisition"):
            acqf = self._acquisition(central, locals_, beta, t)
            bounds = torch.stack([torch.zeros(self.dim), torch.ones(self.dim)]).double()
            X = optimize_co_acquisition(
                acqf,
                bounds,
                num_restarts=cfg.num_restarts,
                raw_samples=cfg.raw_samples,
                seed=self.round_seed(t),
                options={"maxiter": cfg.maxiter},
            )
        return X.detach().reshape(len(ids), self.dim).clamp(0.0, 1.0)

    def _local_model(self, posterior: dict | None, prior: dict, K_SS: Tensor):
        r"""Agent ``n``'s discretised posterior as a one-agent ``BarycenterGP`` (its own
        hyperparameters off the support; the shared prior for an agent without data)."""
        S = self.support
        if posterior is None:
            return BarycenterGP(
                S,
                prior["mean_constant"].expand(1, len(S)),
                K_SS.unsqueeze(0),
                shared_kernel(prior["lengthscale"], prior["outputscale"]),
                noise=prior["noise"],
                mean_constant=prior["mean_constant"],
            )
        return BarycenterGP(
            S,
            posterior["mean"].unsqueeze(0),
            posterior["covariance"].unsqueeze(0),
            shared_kernel(posterior["lengthscale"], posterior["outputscale"]),
            noise=posterior["noise"],
            mean_constant=posterior["mean_constant"],
        )

    def _secure_mean(self, ids, weights: Tensor, posteriors, m0: Tensor) -> Tensor:
        r"""``sum_n w_n mu_n`` by a secure sum (agents without data add zeros; their
        share ``w_n m0`` of the prior is added here)."""
        total = self.secure_sum(
            "weighted_mean",
            len(self.support),
            args={"weights": weights.numpy(), "clients": np.asarray(ids, dtype=np.int64)},
            clients=ids,
        )
        if total is None:
            raise ProtocolViolation(
                "Server: the secure sum of the agents' means did not reach the server (the "
                "backend keeps sums on the clients); use `aggregator` plaintext or masking."
            )
        mean = torch.as_tensor(np.asarray(total, dtype=np.float64))
        missing = sum(float(weights[i]) for i, c in enumerate(ids) if posteriors[c] is None)
        return mean + missing * m0

    def _acquisition(self, central, locals_, beta: float, t: int):
        r"""Round ``t``'s acquisition on the central and the local models."""
        cfg = self.settings
        seed = self.round_seed(t)
        S = self.support
        if self.algorithm in ("co-kg", "barycenter-qkg"):
            return qCoKnowledgeGradient(
                central,
                locals_,
                beta=beta,
                num_fantasies=cfg.num_fantasies,
                discrete_support=S if cfg.discrete else None,
                seed=seed,
            )
        if self.algorithm == "co-ei":
            return qCoExpectedImprovement(central, locals_, beta=beta, seed=seed, support=S)
        return qCoMaxValueEntropy(
            central,
            locals_,
            beta=beta,
            candidate_set=S,
            num_mv_samples=cfg.num_mv_samples,
            seed=seed,
        )

    def run(self, on_round=None, start_round=None) -> None:
        r"""Rounds as :meth:`FederatedServer.run`, then Alg. 1's output: every agent's
        local optimum after the last round, and ``x^`` (:attr:`recommendation`).

        Raises:
            ProtocolViolation: An agent's reply fails a check (:meth:`_parse`; its final
                local optimum: ``num_data`` an int in ``0..num_init + num_rounds``,
                ``best_index`` an int on the support, ``best_value`` finite), naming
                the agent.
        """
        super().run(on_round=on_round, start_round=start_round)
        replies = self.broadcast("optimum")
        bound = self.settings.num_init + self.settings.num_rounds
        optima = {}
        for cid in sorted(replies):
            payload = replies[cid].payload

            def bad(problem: str, cid=cid) -> ProtocolViolation:
                return ProtocolViolation(f"Server: the local optimum of client {cid} {problem}.")

            if _count(payload, bad, bound) == 0:
                optima[cid] = None
                continue
            index, value = _optimum(payload, bad, len(self.support))
            optima[cid] = {"best_index": index, "best_value": value}
        self._recommend(self.settings.num_rounds, optima)


# --- registration -------------------------------------------------------------------------

ACQUISITIONS = {
    "co-kg": (
        CoKGSettings,
        "Co-KG: agents share GP posteriors on a support; the server's Wasserstein-barycenter "
        "GP and q-KG plus beta_t x the agents' own KG assign the points (paper 001)",
    ),
    "co-ei": (
        CoEISettings,
        "Co-EI: as co-kg with (log) expected improvement on the barycenter and the agents' "
        "GPs (paper 001's baseline)",
    ),
    "co-es": (
        CoESSettings,
        "Co-ES: as co-kg with max-value entropy search on the barycenter and the agents' "
        "GPs (paper 001's baseline)",
    ),
    "barycenter-qkg": (
        BarycenterQKGSettings,
        "barycenter-qKG: Co-KG with beta = 0, q-KG on the barycenter GP alone; the means "
        "can be securely aggregated (paper 001's baseline)",
    ),
}


def _check_secure_aggregator(ctx) -> None:
    r"""The secure mean runs on the masking backend only."""
    aggregator = ctx.setup.aggregator
    if not ctx.settings.hides_means() or aggregator == "masking":
        return
    why = {
        "ckks": "the server needs the barycenter mean, and CKKS sums stay on the agents",
        "plaintext": "the plaintext backend hands every agent's input to the server in clear",
    }.get(aggregator, "only masking hides the agents' inputs from the server")
    raise ValueError(
        f"`mean_aggregation`='secure' with `aggregator`={aggregator!r}: {why}; use masking."
    )


def _make_client(ctx, cid: int) -> CoKGClient:
    _check_secure_aggregator(ctx)
    return CoKGClient(
        secagg=ctx.secagg_clients.get(cid),
        support_seed=ctx.setup.seed,
        num_agents=len(ctx.client_ids),
        **ctx.client_arguments(cid),
    )


def _server_maker(algorithm: str):
    def make(ctx, transport) -> CoKGServer:
        settings = ctx.settings
        secure = settings.hides_means()
        _check_secure_aggregator(ctx)
        objective = ctx.objectives[0]
        return CoKGServer(
            transport,
            settings,
            ctx.dim,
            seed=ctx.setup.seed,
            algorithm=algorithm,
            secagg=ctx.secagg_server if secure else None,
            bounds=objective.bounds.to(torch.float64),
            minimize=objective.minimize,
        )

    return make


for _name, (_settings_class, _summary) in ACQUISITIONS.items():
    register_algorithm(
        AlgorithmSpec(
            name=_name,
            summary=_summary,
            settings_class=_settings_class,
            make_client=_make_client,
            make_server=_server_maker(_name),
            secure_aggregation=_name == "barycenter-qkg",
            min_clients=2 if _name == "barycenter-qkg" else 1,
        )
    )
