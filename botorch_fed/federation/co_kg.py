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
instead sum the weighted means ``sum_n w_n mu_n`` through the secure-aggregation
backends (``mean_aggregation="secure"``); the local Co-KG, Co-EI and Co-ES terms need
each agent's own mean, so only ``beta = 0`` runs with hidden means.

References:

.. [Co-KG] D. Zhan, H. Zhang, R. Righter, Z. Zheng, J. Anderson. Collaborative
   Bayesian optimization via Wasserstein barycenters (paper 001 in ``shared/papers``;
   slides, IEEE CDC 2025), Alg. 1 and "Experimental Setup".
"""

from __future__ import annotations

import math
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
from botorch_fed.models import BarycenterGP, agent_weights

SUPPORTS = ("auto", "grid", "sobol", "kmeans")
WEIGHTS = ("uniform", "data", "precision")
BETA_SCHEDULES = BETA_KINDS
MEAN_AGGREGATIONS = ("clear", "secure")
MAX_SUPPORT_SIZE = 4096  # agents refuse a larger support from the server
MIN_CLUSTER_SIZE = 2  # k-means support: never the centre of one point (a raw input)
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
            agent sends its mean, as the paper) or ``"secure"`` (the weighted means are
            summed by the `--aggregator` backend: the server learns only their sum;
            ``plaintext`` or ``masking``, not ``ckks``, whose sums stay on the agents).
    """

    mean_aggregation: str = field(default="clear", metadata={"choices": MEAN_AGGREGATIONS})

    def validate(self) -> None:
        r"""Raise ``ValueError`` naming the first invalid setting."""
        CollaborativeSettings.validate(self)
        self._validate_kg()
        _choice(self, "mean_aggregation", MEAN_AGGREGATIONS)

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


# --- the agent -------------------------------------------------------------------------


class CoKGClient(BOClient):
    r"""A Co-KG agent: private data, its own GP, its discretised posterior.

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
    """

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
        self.support_seed = int(support_seed)
        self.support: Tensor | None = None
        self._assigned_round: int | None = None  # the round whose point it may evaluate
        self._hidden_mean: Tensor | None = None  # this round's mean, for the secure sum

    _COKG_STATE = ("support", "assigned_round")

    def state_dict(self) -> dict:
        r"""Adds the support and the round it was last asked for its posterior to
        :meth:`BOClient.state_dict`."""
        state = super().state_dict()
        state.update(
            support=None if self.support is None else self.support.clone(),
            assigned_round=self._assigned_round,
        )
        return state

    def load_state_dict(self, state: dict) -> None:
        owner = f"Client {self.client_id}"
        own, rest = split_state(owner, state, self._COKG_STATE)
        super().load_state_dict(rest)
        support = own["support"]
        if support is not None:
            support = check_tensor(owner, "support", support, (None, self.dim)).clone()
        assigned = own["assigned_round"]
        if assigned is not None and (isinstance(assigned, bool) or not isinstance(assigned, int)):
            raise CheckpointError(f"{owner}: `assigned_round` must be an int or None.")
        self.support, self._assigned_round = support, assigned
        self._hidden_mean = None

    # --- support ------------------------------------------------------------------------
    def on_centers(self, payload: dict) -> dict:
        k = int(payload["k"])
        if not 1 <= k <= MAX_SUPPORT_SIZE:
            raise self.violation(f"`k`={k} must be in 1..{MAX_SUPPORT_SIZE}", "centers")
        if len(self.X) < MIN_CLUSTER_SIZE:  # too few points to share a centre of
            return {"centers": np.empty((0, self.dim))}
        with self.timed("support"):
            centers = local_centers(self.X, k=k, seed=self.seed, min_cluster_size=MIN_CLUSTER_SIZE)
        return {"centers": centers.numpy()}

    def on_support(self, payload: dict) -> dict:
        support = torch.as_tensor(np.asarray(payload["support"], dtype=np.float64))
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
        t = int(payload["t"])
        self.round = t
        self._assigned_round = t
        self._hidden_mean = None
        if len(self.X) == 0:  # every evaluation failed so far: no posterior of its own
            return {"num_data": 0}
        summary = self.posterior_summary()
        mean = summary.pop("mean")
        best = int(mean.argmax())
        reply = {
            "num_data": len(self.X),
            "best_index": best,
            "best_value": float(mean[best]),
            **{k: v.numpy() for k, v in summary.items()},
        }
        if self.settings.hides_means():
            self._hidden_mean = mean  # only its weighted share leaves, in a secure sum
        else:
            reply["mean"] = mean.numpy()
        return reply

    def vector_weighted_mean(self, weights: np.ndarray, clients: np.ndarray) -> np.ndarray:
        r"""``w_n * mu_n`` for the secure sum of the barycenter mean (zeros without data:
        the server adds the prior's share itself)."""
        if self.support is None:
            raise self.violation("a secure mean before the support", "weighted_mean")
        clients = np.asarray(clients).reshape(-1).tolist()
        weights = np.asarray(weights, dtype=np.float64).reshape(-1)
        if self.client_id not in clients or len(weights) != len(clients):
            raise self.violation("the weights do not name this client", "weighted_mean")
        w = float(weights[clients.index(self.client_id)])
        if not (np.isfinite(weights).all() and (weights >= 0).all() and 0 <= w <= 1):
            raise self.violation(f"invalid weights {weights.tolist()}", "weighted_mean")
        if self._hidden_mean is None:
            if len(self.X) > 0:
                raise self.violation("a secure mean without a posterior request", "weighted_mean")
            return np.zeros(len(self.support))
        return w * self._hidden_mean.numpy()

    def on_evaluate(self, payload: dict) -> dict:
        t = int(payload["t"])
        if self._assigned_round != t:
            # one evaluation per posterior the agent sent: a server cannot spend the
            # agent's budget on points of its choosing outside the protocol
            raise self.violation(
                f"an evaluation for round {t}, but this agent's last posterior was for "
                f"round {self._assigned_round}",
                "evaluate",
            )
        x = np.asarray(payload["x"], dtype=np.float64)
        if x.shape != (self.dim,) or not np.isfinite(x).all() or (x < 0).any() or (x > 1).any():
            raise self.violation(
                f"the point must be {self.dim} finite values in [0, 1], got {x.tolist()}",
                "evaluate",
            )
        self._assigned_round = None
        x = torch.as_tensor(x).reshape(1, self.dim)
        # the server's models never learn of a failed point: do not evaluate it again
        self.evaluate(self.avoid_failures(x), t, STEP)
        return {}

    def on_optimum(self, payload: dict) -> dict:
        r"""Alg. 1 line 10: this agent's local optimum (largest posterior mean on the
        support) after the last round."""
        if len(self.X) == 0 or self.support is None:
            return {"num_data": 0}
        model = self.local_model()
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
            replies = self.broadcast("centers", {"k": self.settings.centers_per_client})
            with self.ledger.timer("support"):
                centers = [
                    torch.as_tensor(replies[c].payload["centers"], dtype=torch.float64)
                    for c in sorted(replies)
                ]
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
        posteriors = {cid: self._parse(cid, replies[cid].payload) for cid in ids}
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

    def _parse(self, cid: int, payload: dict) -> dict | None:
        r"""One agent's posterior reply, checked (``None``: the agent has no data)."""
        s, d = len(self.support), self.dim

        def bad(problem: str) -> ProtocolViolation:
            return ProtocolViolation(f"Server: the posterior of client {cid} {problem}.")

        n = payload.get("num_data")
        if isinstance(n, bool) or not isinstance(n, int | np.integer) or n < 0:
            raise bad(f"has `num_data`={n!r}")
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
        out: dict = {"num_data": int(n)}
        for key, shape in shapes.items():
            value = np.asarray(payload.get(key, np.empty(0)), dtype=np.float64)
            if value.shape != shape or not np.isfinite(value).all():
                raise bad(f"has `{key}` of shape {value.shape} (expected {shape}, finite)")
            out[key] = torch.as_tensor(value)
        for key in ("lengthscale", "outputscale", "noise"):
            if not (out[key] > 0).all():
                raise bad(f"has a non-positive `{key}`")
        best = payload.get("best_index")
        value = payload.get("best_value")
        if (
            isinstance(best, bool)
            or not isinstance(best, int | np.integer)
            or not 0 <= best < s
            or isinstance(value, bool)
            or not isinstance(value, int | float | np.floating)
            or not math.isfinite(value)
        ):
            raise bad("has no valid local optimum (`best_index`, `best_value`)")
        out["best_index"], out["best_value"] = int(best), float(value)
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
        local optimum after the last round, and ``x^`` (:attr:`recommendation`)."""
        super().run(on_round=on_round, start_round=start_round)
        replies = self.broadcast("optimum")
        optima = {}
        for cid in sorted(replies):
            payload = dict(replies[cid].payload)
            n = payload.get("num_data", 0)
            optima[cid] = (
                None
                if not n
                else {
                    "best_index": int(payload["best_index"]),
                    "best_value": float(payload["best_value"]),
                }
            )
            if optima[cid] is not None and not (
                0 <= optima[cid]["best_index"] < len(self.support)
                and math.isfinite(optima[cid]["best_value"])
            ):
                raise ProtocolViolation(f"Server: client {cid} sent an invalid local optimum.")
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


def _make_client(ctx, cid: int) -> CoKGClient:
    return CoKGClient(
        secagg=ctx.secagg_clients.get(cid),
        support_seed=ctx.setup.seed,
        **ctx.client_arguments(cid),
    )


def _server_maker(algorithm: str):
    def make(ctx, transport) -> CoKGServer:
        settings = ctx.settings
        secure = settings.hides_means()
        if secure and ctx.setup.aggregator == "ckks":
            raise ValueError(
                "`mean_aggregation`='secure' with `aggregator`='ckks': the server needs the "
                "barycenter mean, and CKKS sums stay on the agents; use plaintext or masking."
            )
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
