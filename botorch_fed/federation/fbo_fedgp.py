r"""FBO-FedGP as a round-based program on the federation protocol (Alg. 1 + Alg. 2).

Initialisation (Alg. 2 lines 1-11): every client evaluates an initial design; the
support set is chosen by federated k-means (Alg. 1: clients send k-means centres,
the server clusters them) or at random (the paper's ablation); the shared GP
hyperparameters are set from aggregated quantities.

Round ``t`` (Alg. 2 lines 12-28): each client draws a local step with probability
``p_t = 1 - t^-c`` (its own seeded generator). A local step fits/updates the client's
own GP and maximises the acquisition on it. If any client draws a global step, all
clients contribute to the secure sums -- outcome moments in two passes (federated
standardisation), optionally the hyperparameters, and the whitened dPITC summaries --
after which every client holds the global summary ``G`` and the global-step clients
maximise the acquisition on the :class:`~botorch_fed.models.FederatedPITCGP` built
from it. With CKKS the sums stay on the clients (the server cannot decrypt); with
masking or plaintext the server learns them and forwards them. Every client then
evaluates its point and adds it to its private data.

``mixing="expected"`` replaces the draw by the ``p_t``-weighted combination of the
local and global UCB (every round is then a global round).

Presets (``FBOFedGPConfig.preset``; :data:`PRESET_VALUES`): ``"paper"`` is Alg. 2 as
above, with hyperparameters averaged from the clients' local fits every 10 rounds.
``"default"`` (the best configuration ``benchmarks/fbo_fedgp_pays.py`` has measured so
far; see its results for where it beats local BO) takes every step
as a global step (``mixing="global"``) on the client's own distributed PIC model
(``global_model="pic"``, :class:`~botorch_fed.models.FederatedPICGP`: the summed
summaries plus the client's own data block, exact), with federated hyperparameters
every 5 rounds, and its clients add Gaussian noise of std 0.1 (``center_noise``, from
their private generators) to the k-means centres they share (the paper's are exact;
``benchmarks/fbo_fedgp_support_privacy.py``: regret not significantly worse than
with exact centres over 32 paired runs, while a random support was).

Choices of this implementation where the paper is silent (all configurable):

- clients taking a global step in the same round share one model, so Alg. 2 read
  literally has them evaluate the same point; on the dPITC model (the paper preset,
  ``global_batch="distinct"``) they run the same seeded search and take distinct optima
  by rank (no data is exchanged for this; each client derives the search's seed itself
  from a secret the clients share and the server does not -- the secure-aggregation
  role's federation secret, under ``ckks`` and ``masking`` -- with the run's public
  seed and the round, :meth:`FBOFedGPClient.search_seed`, so a server holding the
  summed summaries cannot replay the search; it checks the server's rank and count,
  :meth:`FBOFedGPClient._check_global_step`);
- clients send only centres of clusters with at least ``min_cluster_size`` (2) points:
  with ``|D_i| = 4`` and ``k = 4`` Alg. 1 would otherwise send the raw initial points;
- the support set is re-selected by Alg. 1 every ``support_every`` (5) rounds, as the
  data grow (App. C.7 also grows it: ``support_growth``);
- outcomes are standardised with federated moments before summarising, in two secure
  sums: ``[n, sum y]``, then ``[sum (y - mu), sum (y - mu)^2]`` around the first
  pass's mean ``mu``, every sum rounded by its client to 40 significant bits and sent
  as exact integer limbs (accurate for any finite outcomes, and no party learns exact
  sums; see :mod:`botorch_fed.models.federated_standardize`); every other secure sum
  travels in the exact limb encoding (``botorch_fed.secure.limbs``).

Hyperparameters of the global model (refreshed every ``hyper_every`` rounds):

- ``"average"``: the client-size-weighted average of the clients' local GP
  hyperparameters (one secure sum; works with every backend);
- ``"federated"``: exact PITC type-II maximum likelihood from aggregated summaries
  and vector-Jacobian products (two secure sums per L-BFGS-B evaluation). The
  optimiser runs on a coordinator client (the lowest id): every client holds the
  sums, derives the loss and adjoint itself and contributes its vector-Jacobian
  product; the server relays the secure sums and sees only the (public)
  hyperparameter iterates. Works with every backend, CKKS included.

References:

.. [FBO-FedGP] Secure federated Bayesian optimisation with distributed sparse GPs
   (paper 000 in ``shared/papers``), Alg. 1, Alg. 2, eq. 3 and App. C.7.
"""

from __future__ import annotations

import logging
import math
import numbers
from dataclasses import dataclass, field, replace

import numpy as np
import torch
from botorch.acquisition import qLogExpectedImprovement, qUpperConfidenceBound
from botorch.models.transforms.outcome import Standardize
from botorch.models.utils.gpytorch_modules import (
    get_covar_module_with_dim_scaled_prior,
    get_gaussian_likelihood_with_lognormal_prior,
)
from gpytorch.means import ConstantMean
from torch import Tensor

from botorch_fed.acquisition import (
    MixedLocalGlobalUCB,
    MixingSchedule,
    maximize_step_acquisition,
)
from botorch_fed.federation.bo_client import BOClient, BOSettings
from botorch_fed.federation.checkpoint import CheckpointError, check_tensor, split_state
from botorch_fed.federation.fbo_fedgp_domain import (
    FIT_EVALUATIONS_PER_ITERATION,
    clamp_to_domain,
    in_domain,
    outcome_bound,
    theta_domain,
)
from botorch_fed.federation.messages import Message
from botorch_fed.federation.registry import AlgorithmSpec, register_algorithm
from botorch_fed.federation.roles import FederatedServer, ProtocolViolation
from botorch_fed.federation.stepped_minimizer import SteppedMinimizer
from botorch_fed.inducing import global_support, local_centers, random_support
from botorch_fed.models import (
    CENTRED_MOMENTS_LENGTH,
    OUTCOME_MOMENTS_LENGTH,
    FederatedPICGP,
    FederatedPITCGP,
    PITCFitClient,
    PITCHyperparameters,
    SparseSummary,
    center_from_moments,
    centred_moments,
    compute_local_summary,
    outcome_moments,
    pitc_loss_and_adjoint,
    standardize_from_moments,
)
from botorch_fed.models.federated_standardize import MAX_LIMB as MOMENT_MAX_LIMB
from botorch_fed.secure.crypto import hkdf, mac_tag, mac_verify

_LOG = logging.getLogger(__name__)
COORDINATOR = 0  # the client that runs a federated fit's optimiser (the lowest id)

SUPPORTS = ("clustered", "random")
MAX_SUPPORT_SIZE = 4096  # a client refuses a larger support set or k from the server
HYPERPARAMETERS = ("average", "federated")
MIXINGS = ("sample", "expected", "global")
GLOBAL_BATCHES = ("distinct", "independent", "batch")
GLOBAL_MODELS = ("pitc", "pic")
PRESETS = ("default", "paper")
# What a preset decides for the settings left at None. "paper" is Alg. 2 as published
# (with this implementation's documented choices where the paper is silent); "default"
# is the best configuration benchmarks/fbo_fedgp_pays.py has measured so far
# (plaintext aggregation, 5 clients, 20 rounds; see its results for where it wins).
# `global_batch` follows the global model ("distinct" on the shared dPITC model,
# "independent" on each client's own PIC model, and "independent" with mixing
# "expected"); an explicit shared-model batch rule ("distinct", "batch") or acquisition
# "kg" selects the dPITC model.
PRESET_VALUES = {
    "paper": {"mixing": "sample", "global_model": "pitc", "hyperparameters": "average",
              "hyper_every": 10, "support": "clustered", "center_noise": 0.0},
    "default": {"mixing": "global", "global_model": "pic", "hyperparameters": "federated",
                "hyper_every": 5, "support": "clustered", "center_noise": 0.1},
}  # fmt: skip
# The default's support: k-means centres with noise of std 0.1 (unit cube) from each
# client's private generator -- the least revealing arm whose regret was not
# significantly worse than exact centres' (benchmarks/results/
# fbo_fedgp_support_privacy.md: random support was, p = 0.016); the paper keeps Alg. 1's
# exact centres.


@dataclass
class FBOFedGPConfig(BOSettings):
    r"""Settings of FBO-FedGP (sizes default to the paper's synthetic setting, Sec. 5.1;
    the algorithm's choices to the ``preset``).

    Adds to :class:`~botorch_fed.federation.bo_client.BOSettings`:

    Attributes:
        support_size: Support-set size ``|S|``.
        support: ``"clustered"`` (Alg. 1: federated k-means on the clients' centres)
            or ``"random"`` (App. D.3 ablation: uniform points drawn by the server, no
            client data involved); ``None``: the preset's.
        center_noise: With ``"clustered"``: the standard deviation of Gaussian noise a
            client adds to every centre it sends (unit-cube units, per coordinate; the
            noisy centre is clamped into the cube), drawn from the client's *private*
            generator (never from the public seeds); 0: exact centres. An obfuscation,
            not differential privacy (docs/security.md, "Cluster centres"). ``None``:
            the preset's with ``"clustered"`` (default 0.1, paper 0), 0 with ``"random"``.
        support_every: Re-select the support every ``K`` rounds (0: never).
        support_growth: Points added to ``|S|`` at each re-selection (App. C.7).
        centers_per_client: k of each client's local k-means.
        min_cluster_size: Clients only send centres of clusters with at least this
            many points (a singleton's centre is a raw data point).
        schedule: ``c`` of ``p_t = 1 - t^-c`` (eq. 3), in ``(0, 1]``; used by
            ``mixing`` "sample" and "expected" only.
        preset: ``"default"`` or ``"paper"``: decides the settings below that are left
            at ``None`` (``PRESET_VALUES``; the paper's Alg. 2, or the measured default).
        mixing: ``"sample"`` (Alg. 2: a local step with probability ``p_t``),
            ``"expected"`` (p_t-weighted UCB) or ``"global"`` (every step on the global
            model); ``None``: the preset's.
        global_model: The model of a global step: ``"pitc"`` (the dPITC model of the
            summed summaries, Alg. 2) or ``"pic"`` (the client's distributed PIC model:
            the same summaries plus its own data block treated exactly, so it predicts
            its own neighbourhood as its local GP does and the rest as dPITC);
            ``None``: the preset's.
        hyperparameters: Of the global model: ``"average"`` (the clients' local GP fits,
            averaged by one secure sum) or ``"federated"`` (type-II maximum likelihood on
            the PITC objective, two secure sums per L-BFGS-B step; the iterates reach the
            server in clear); ``None``: the preset's.
        hyper_every: Refresh the global hyperparameters every ``K`` rounds; ``None``:
            the preset's.
        federated_maxiter: L-BFGS-B iterations of a ``"federated"`` refresh.
        global_batch: How clients taking a global step in the same round choose:
            ``"independent"`` (Alg. 2 literally: each maximises its acquisition on its
            global model -- with ``"pitc"`` the same model, so they usually evaluate the
            same point), ``"distinct"`` (they run the same seeded multi-start search on
            the shared dPITC model and take distinct local optima by rank) or
            ``"batch"`` (they compute the same sequential-greedy ``q``-batch of the
            shared dPITC model -- each point conditioned on the earlier ones, as
            BoTorch's ``q``-acquisitions -- and take the point of their rank). No
            private data is exchanged for any of them. ``None``: the preset's (a given
            "distinct" or "batch" selects the dPITC model when ``global_model`` is None).
    """

    support_size: int = 16
    support: str | None = field(default=None, metadata={"choices": SUPPORTS})
    center_noise: float | None = None
    support_every: int = 5
    support_growth: int = 0
    centers_per_client: int = 4
    min_cluster_size: int = 2
    schedule: float = 0.5
    preset: str = field(default="default", metadata={"choices": PRESETS})
    mixing: str | None = field(default=None, metadata={"choices": MIXINGS})
    global_model: str | None = field(default=None, metadata={"choices": GLOBAL_MODELS})
    hyperparameters: str | None = field(default=None, metadata={"choices": HYPERPARAMETERS})
    hyper_every: int | None = None
    federated_maxiter: int = 30
    global_batch: str | None = field(default=None, metadata={"choices": GLOBAL_BATCHES})

    def resolved(self) -> FBOFedGPConfig:
        r"""A copy with the settings left at ``None`` decided by the preset (see
        :data:`PRESET_VALUES`); the algorithm runs on it. Resolution happens here, not
        at construction, so ``dataclasses.replace(config, preset="paper")`` changes the
        algorithm as it says."""
        if self.preset not in PRESETS:
            raise ValueError(f"`preset`={self.preset!r} must be one of {PRESETS}.")
        preset = PRESET_VALUES[self.preset]
        mixing = preset["mixing"] if self.mixing is None else self.mixing
        model = self.global_model
        if model is None:
            shared = self.global_batch in ("distinct", "batch") or self.acquisition == "kg"
            model = "pitc" if shared else preset["global_model"]
        batch = self.global_batch
        if batch is None:
            batch = "distinct" if model == "pitc" and mixing != "expected" else "independent"
        hyper = {
            name: preset[name] if getattr(self, name) is None else getattr(self, name)
            for name in ("hyperparameters", "hyper_every")
        }
        support = preset["support"] if self.support is None else self.support
        noise = self.center_noise
        if noise is None:  # the preset's noise belongs to its clustered support
            noise = preset["center_noise"] if support == "clustered" else 0.0
        elif isinstance(noise, numbers.Real) and not isinstance(noise, bool | np.bool_):
            noise = float(noise)  # a numpy scalar, say: recorded settings hold plain floats
        return replace(
            self,
            mixing=mixing,
            global_model=model,
            global_batch=batch,
            support=support,
            center_noise=noise,
            **hyper,
        )

    @classmethod
    def paper(cls, **overrides) -> FBOFedGPConfig:
        r"""The paper's algorithm (Alg. 2 of [FBO-FedGP]): ``preset="paper"``."""
        return cls(preset="paper", **overrides)

    def validate(self) -> None:
        r"""Raise ``ValueError`` naming the first invalid setting (of the resolved
        settings, :meth:`resolved`)."""
        super().validate()
        if self.preset not in PRESETS:
            raise ValueError(f"`preset`={self.preset!r} must be one of {PRESETS}.")
        if None in (
            self.mixing,
            self.global_model,
            self.global_batch,
            self.hyperparameters,
            self.hyper_every,
            self.support,
            self.center_noise,
        ):
            self.resolved().validate()
            return
        for name in (
            "support_size",
            "centers_per_client",
            "min_cluster_size",
            "hyper_every",
            "federated_maxiter",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"`{name}` must be a positive integer, got {value!r}.")
        for name in ("support_every", "support_growth"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"`{name}` must be a non-negative integer, got {value!r}.")
        choices = {
            "support": SUPPORTS,
            "preset": PRESETS,
            "mixing": MIXINGS,
            "global_model": GLOBAL_MODELS,
            "hyperparameters": HYPERPARAMETERS,
            "global_batch": GLOBAL_BATCHES,
        }
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise ValueError(f"`{name}`={getattr(self, name)!r} must be one of {allowed}.")
        MixingSchedule(c=self.schedule)  # validates 0 < c <= 1
        noise = self.center_noise
        if (
            isinstance(noise, bool | np.bool_)
            or not isinstance(noise, numbers.Real)
            or not math.isfinite(noise)
            or noise < 0
        ):
            raise ValueError(f"`center_noise` must be a finite number >= 0, got {noise!r}.")
        if noise > 0 and self.support != "clustered":
            raise ValueError(
                f"`center_noise`={noise} noises cluster centres, but `support`="
                f"{self.support!r} sends none (use `support`='clustered')."
            )
        if self.support_size > MAX_SUPPORT_SIZE:
            raise ValueError(
                f"`support_size`={self.support_size} exceeds {MAX_SUPPORT_SIZE} (clients refuse "
                "larger support sets)."
            )
        if self.support == "clustered" and self.num_init < self.min_cluster_size:
            raise ValueError(
                f"`num_init`={self.num_init} is below `min_cluster_size`="
                f"{self.min_cluster_size}: a client's first support round would have no "
                "cluster large enough to share a centre of."
            )
        if self.mixing == "expected" and self.acquisition != "ucb":
            raise ValueError("`mixing`='expected' is defined for `acquisition`='ucb' only.")
        if self.mixing == "expected" and self.global_batch != "independent":
            raise ValueError(
                f"`mixing`='expected' takes every global step on the p_t-weighted UCB of one "
                f"client; `global_batch`={self.global_batch!r} would be ignored (use "
                "'independent')."
            )
        if self.global_batch in ("distinct", "batch") and self.global_model == "pic":
            raise ValueError(
                f"`global_batch`={self.global_batch!r} needs the shared dPITC model "
                "(`global_model`='pitc'): every client's PIC model is its own."
            )
        if self.global_batch == "batch" and self.acquisition not in ("ucb", "ei"):
            raise ValueError("`global_batch`='batch' is defined for `acquisition` 'ucb' or 'ei'.")
        if self.global_model == "pic" and self.acquisition == "kg":
            raise ValueError(
                "`global_model`='pic' does not support `acquisition`='kg' (no fantasies)."
            )


def _identity_standardize() -> Standardize:
    r"""``Standardize`` with mean 0 and standard deviation 1 (eval mode)."""
    tf = Standardize(m=1, min_stdv=1e-8)
    tf.means = torch.zeros(1, 1, dtype=torch.float64)
    tf.stdvs = torch.ones(1, 1, dtype=torch.float64)
    tf._stdvs_sq = torch.ones(1, 1, dtype=torch.float64)
    tf._is_trained = torch.tensor(True)
    tf.eval()
    return tf


_FAILED_LOSS = 1e300  # the loss of an evaluation whose summed summaries are not honest
_ADJOINT_LIMIT = 1e100  # |adjoint| entries; a product with it stays finite

SEED_RANGE = 2**31  # seeds of the acquisition searches (``BOClient.step_seed`` too)
_SEED_LABEL = b"botorch-fed/fbo-fedgp/global-step-seed\x00"


def global_step_seed(run_seed: int, t: int) -> int:
    r"""The *public* seed of round ``t``'s shared global search, from the run's public
    seed: what the clients of a federation without a shared secret (the ``plaintext``
    backend) use. Anyone who knows the run seed, the server included, can compute it
    (see :func:`secret_step_seed`)."""
    return (int(run_seed) * 10_007 + int(t)) % SEED_RANGE


def _check_count(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"`{name}` must be a non-negative int, got {value!r}.")
    return value


def _encode_count(value: int) -> bytes:
    raw = value.to_bytes(max(1, (value.bit_length() + 7) // 8), "big")
    return len(raw).to_bytes(2, "big") + raw


def secret_step_seed(secret: bytes, run_seed: int, t: int, client_id: int | None = None) -> int:
    r"""The seed of round ``t``'s search on the shared dPITC model, from a secret that
    the clients share and the server does not.

    HKDF-SHA256 (``cryptography``) of ``secret`` with an ``info`` that binds the run
    seed, the round and, for a search of one client only, its id (lengths prefixed,
    so no two inputs share an encoding), reduced modulo :data:`SEED_RANGE` (the bias
    of reducing 64 bits is below ``2^-32``). Every client holding ``secret`` derives
    the same seed; without it the seed is unpredictable.

    Args:
        secret: The federation's secret, at least 16 bytes
            (:meth:`~botorch_fed.secure.base.ClientRole.federation_secret`).
        run_seed: The run's public seed (non-negative int).
        t: The round (non-negative int).
        client_id: ``None`` for the search that every global client of the round runs
            (``global_batch`` "distinct" or "batch"); a client's id for a search of its
            own on the shared model ("independent", Thompson sampling).

    Returns:
        A seed in ``[0, SEED_RANGE)``.

    Raises:
        ValueError: ``secret`` is not bytes of at least 16 bytes, or ``run_seed``,
            ``t`` or ``client_id`` is not a non-negative int.
    """
    if not isinstance(secret, bytes) or len(secret) < 16:
        kind = f"{len(secret)} bytes" if isinstance(secret, bytes) else type(secret).__name__
        raise ValueError(f"`secret` must be bytes of at least 16 bytes, got {kind}.")
    info = _SEED_LABEL + _encode_count(_check_count("run_seed", run_seed))
    info += _encode_count(_check_count("t", t))
    if client_id is None:
        info += b"\x00"
    else:
        info += b"\x01" + _encode_count(_check_count("client_id", client_id))
    return int.from_bytes(hkdf(secret, info, 8), "big") % SEED_RANGE


def global_modules(dim: int) -> tuple:
    r"""Kernel, likelihood and mean of the global dPITC model: BoTorch's defaults."""
    covar = get_covar_module_with_dim_scaled_prior(dim).to(torch.float64)
    likelihood = get_gaussian_likelihood_with_lognormal_prior().to(torch.float64)
    return covar, likelihood, ConstantMean().to(torch.float64)


class FBOFedGPClient(BOClient):
    r"""An FBO-FedGP client: private data, local GP, its share of the global model.

    Args:
        client_id: The id.
        objective: The client's black box.
        settings: The algorithm settings (shared by all parties).
        seed: The client's seed (initial design, mixing draws, acquisition restarts).
        secagg: The client's secure-aggregation role.
        init_region: Optional ``2 x d`` sub-box for the initial design.
        evaluation_errors: ``"record"`` or ``"raise"`` (see :class:`BOClient`).
        private_seed: Seed of the private generator (see :class:`BOClient`).
        num_clients: The federation's size: a global step's ``count`` may not exceed
            it (``None``: not checked; the registry always passes it).
        run_seed: The run's public seed. With the federation secret of its
            secure-aggregation role, the client derives the seed of a round's search on
            the shared dPITC model from both (:meth:`search_seed`,
            :func:`secret_step_seed`); without one, from the run seed alone
            (:func:`global_step_seed`). The server sends no seed. ``None``: a global
            step on the shared model is refused (the registry always passes it).
    """

    # what the server sends every client alike (bound into the next secure sum)
    RELAYED = frozenset({"init", "round", "centers", "support", "apply_theta"})

    def __init__(
        self,
        client_id: int,
        objective,
        settings: FBOFedGPConfig,
        seed: int,
        secagg=None,
        init_region: Tensor | None = None,
        evaluation_errors: str = "record",
        private_seed: int | None = None,
        *,
        num_clients: int | None = None,
        run_seed: int | None = None,
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
        self.config = settings.resolved()  # the preset's choices filled in
        self.num_clients = num_clients
        self.run_seed = run_seed
        self.schedule = MixingSchedule(c=settings.schedule)
        self.support: Tensor | None = None
        self.modules = global_modules(self.dim)
        self.standardize: Standardize | None = None
        self._first_moments: np.ndarray | None = None  # pass 1 of the standardisation
        self._moments_center: float | None = None
        self._fit_client: PITCFitClient | None = None
        self._minimizer: SteppedMinimizer | None = None
        self._fit_theta: np.ndarray | None = None  # the theta of the summary session open
        self._fit_sum: np.ndarray | None = None  # its summed summaries (for the product)
        self._fit_index = -1  # the last evaluation index of the round's fit computed at
        self._fit_loss = 0.0
        self._fit_prior_grad: np.ndarray | None = None
        self._global_round: int | None = None  # the round this client drew a global step
        self.theta_domain = theta_domain(PITCHyperparameters(*self.modules))
        self._t: int | None = None  # the round the server announced last (checked)
        self._sums: dict[str, int] = {}  # secure sums of each request in round _t
        self._fit_round: int | None = None  # the round of the fit in progress
        self._fit_thetas: list[np.ndarray] = []  # the iterates of the fit in progress
        self._last_fit_round: int | None = None  # the round of the last refresh
        self._pending_theta: np.ndarray | None = None  # the coordinator's iterate
        self._fed: np.ndarray | None = None  # the summed product at the pending iterate
        self._handed_out = 0  # the coordinator: iterates handed out in the round's fit
        self._pending_evaluated = False  # the coordinator: its iterate's summary is done
        self._vjp_for_pending = False  # the product session open is at the pending iterate
        # the last centres sent, by (number of points, k): not checkpointed (a restored
        # client draws fresh noise once more)
        self._centers: tuple[tuple[int, int], np.ndarray] | None = None

    _FBO_STATE = ("support", "modules", "standardize", "first_moments", "moments_center")
    _OPTIONAL_STATE = {"last_fit_round": None}  # absent from earlier checkpoints

    def state_dict(self) -> dict:
        r"""Adds the support set, the shared GP modules' hyperparameters and the
        federated outcome transform to :meth:`BOClient.state_dict`."""
        if self._minimizer is not None:
            raise self.violation("cannot checkpoint during a federated fit", "hyper")
        state = super().state_dict()
        first = self._first_moments
        state.update(
            support=None if self.support is None else self.support.clone(),
            modules=[m.state_dict() for m in self.modules],
            standardize=None if self.standardize is None else self.standardize.state_dict(),
            first_moments=None if first is None else torch.from_numpy(first.copy()),
            moments_center=self._moments_center,
            last_fit_round=self._last_fit_round,
        )
        return state

    def load_state_dict(self, state: dict) -> None:
        owner = f"Client {self.client_id}"
        if isinstance(state, dict):
            state = {**self._OPTIONAL_STATE, **state}
        own, rest = split_state(owner, state, (*self._FBO_STATE, *self._OPTIONAL_STATE))
        last_fit = own["last_fit_round"]
        if last_fit is not None and (
            isinstance(last_fit, bool) or not isinstance(last_fit, int) or last_fit < 0
        ):
            raise CheckpointError(f"{owner}: `last_fit_round` must be None or an int >= 0.")
        super().load_state_dict(rest)
        support = own["support"]
        if support is not None:
            support = check_tensor(owner, "support", support, (None, self.dim)).clone()
        modules = own["modules"]
        if not isinstance(modules, list) or len(modules) != len(self.modules):
            raise CheckpointError(f"{owner}: `modules` must be {len(self.modules)} state dicts.")
        try:
            for module, module_state in zip(self.modules, modules, strict=True):
                module.load_state_dict(module_state)
        except (RuntimeError, KeyError, TypeError) as exc:
            raise CheckpointError(f"{owner}: the GP modules' state does not load ({exc}).") from exc
        standardize = None
        if own["standardize"] is not None:
            standardize = Standardize(m=1, min_stdv=1e-8)
            try:
                standardize.load_state_dict(own["standardize"])
            except (RuntimeError, KeyError, TypeError) as exc:
                raise CheckpointError(f"{owner}: `standardize` does not load ({exc}).") from exc
            standardize.eval()
        first = own["first_moments"]
        if first is not None:
            first = check_tensor(owner, "first_moments", first, (None,)).numpy().copy()
        self.support, self.standardize = support, standardize
        self._first_moments, self._moments_center = first, own["moments_center"]
        self._last_fit_round = last_fit
        self._fit_client = None  # derived from the above on demand

    def global_model(self) -> FederatedPITCGP:
        r"""The dPITC model from the last aggregated summary (Alg. 2 line 22)."""
        if self.last_sum is None or self.support is None or self.standardize is None:
            raise ProtocolViolation(f"Client {self.client_id} has no global summary yet.")
        with self.timed("global_model"):
            summary = SparseSummary.from_numpy(self.last_sum, len(self.support))
            return FederatedPITCGP(
                self.support, summary, *self.modules, outcome_transform=self.standardize
            )

    def _transformed_Y(self) -> Tensor:
        r"""This client's outcomes under the federated standardisation, clamped into
        ``[-Z, Z]`` (:func:`~botorch_fed.federation.fbo_fedgp_domain.outcome_bound`):
        honest moments never put one outside, forged ones (a server may offset a
        CKKS sum) cannot make the summaries unbounded."""
        Y = self.standardize(self.Y)[0]
        if self.num_clients is None:
            return Y
        bound = outcome_bound(self.num_clients, self.settings.num_init, self.settings.num_rounds)
        return Y.clamp(-bound, bound)

    # --- protocol handlers ----------------------------------------------------------
    def max_support_size(self) -> int:
        r"""The largest support the run's settings make: ``support_size`` plus
        ``support_growth`` at each re-selection (every ``support_every`` rounds), at most
        :data:`MAX_SUPPORT_SIZE`. A client refuses a larger one: its cost (a party's
        policy caps it on the settings) is the settings', not the server's choice."""
        c = self.config
        grown = (self.settings.num_rounds - 1) // c.support_every if c.support_every else 0
        return min(MAX_SUPPORT_SIZE, c.support_size + c.support_growth * max(grown, 0))

    def on_centers(self, payload: dict) -> dict:
        k = payload.get("k")
        if isinstance(k, bool | np.bool_) or not isinstance(k, int | np.integer):
            raise self.violation(f"`k`={k!r:.40} must be an int", "centers")
        k = int(k)
        if k != self.config.centers_per_client:
            raise self.violation(
                f"`k`={k}, but the run's `centers_per_client` is {self.config.centers_per_client}",
                "centers",
            )
        if len(self.X) < self.config.min_cluster_size:  # too few points to share a centre of
            return {"centers": np.empty((0, self.dim))}
        noise = self.config.center_noise
        key = (len(self.X), k)
        if self._centers is not None and self._centers[0][0] == key[0]:
            # asked again about the same data: the same answer, so that a server
            # asking many times has no fresh noise to average away (k is the run's)
            return {"centers": self._centers[1].copy()}
        # the noise's seed comes from the private generator: the client's `seed` is
        # public (the server can derive it from the run seed), so noise drawn from it
        # could be subtracted
        noise_seed = self.private_seed_draw() if noise > 0 else None
        with self.timed("support"):
            centers = local_centers(
                self.X,
                k=k,
                seed=self.seed,
                noise_std=noise,
                noise_seed=noise_seed,
                min_cluster_size=self.config.min_cluster_size,
            )
        # noise can push a centre out of the cube, where no support point may lie
        answer = centers.clamp(0.0, 1.0).numpy()
        self._centers = (key, answer.copy())
        return {"centers": answer}

    def private_seed_draw(self) -> int:
        r"""A 248-bit seed from the client's private generator (four 62-bit draws,
        the first in the lowest bits; ``private_seed``: OS randomness unless the run's
        ``crypto_seed`` is set), for randomness the server must not be able to
        reproduce (the noise of :meth:`on_centers`; ``numpy.random.default_rng`` takes
        every bit of it)."""
        draws = torch.randint(2**62, (4,), generator=self.private_rng).tolist()
        return sum(int(d) << (62 * i) for i, d in enumerate(draws))

    def on_support(self, payload: dict) -> dict:
        support = torch.as_tensor(np.asarray(payload["support"], dtype=np.float64))
        limit = self.max_support_size()
        if not (
            support.ndim == 2
            and support.shape[-1] == self.dim
            and 1 <= support.shape[0] <= limit
            and torch.isfinite(support).all()
            and ((support >= 0) & (support <= 1)).all()
        ):
            raise self.violation(
                f"the support must be 1..{limit} finite points of [0, 1]^{self.dim}, got shape "
                f"{tuple(support.shape)}",
                "support",
            )
        self.support = support
        self._fit_client = None  # its summaries were on the old support
        return {}

    def on_round(self, payload: dict) -> dict:
        r"""Round ``t``: only the next round of the run's budget
        (:meth:`~botorch_fed.federation.bo_client.BOClient.accept_round`); the client
        draws its step (a local step is evaluated here)."""
        self._global_round = None
        t = self.accept_round(payload.get("t"), "round")
        self._t, self._sums = t, {}
        if len(self.X) == 0:  # every evaluation failed so far: a random step, no model
            self.evaluate(self.propose_local(t), t, "local")
            return {"global": False}
        if self.config.mixing in ("expected", "global"):
            self._global_round = t
            return {"global": True}
        local = bool(self.schedule.sample(t, seed=self.rng))  # Alg. 2 lines 14-15
        if local:
            self.evaluate(self.propose_local(t), t, "local")
        else:
            self._global_round = t
        return {"global": not local}

    def on_global_step(self, payload: dict) -> dict:
        t = payload.get("t")
        if isinstance(t, bool | np.bool_) or not isinstance(t, int | np.integer):
            raise self.violation(f"the round `t`={t!r:.40} must be an integer", "global_step")
        t = int(t)
        if self._global_round is None or t != self._global_round:
            raise self.violation(
                f"a global step for round {t}, but this client drew "
                + (
                    "no global step"
                    if self._global_round is None
                    else f"round {self._global_round}"
                ),
                "global_step",
            )
        self._global_round = None  # one global step per draw
        rank, count = self._check_global_step(payload)
        if not self._global_summary_usable():
            # only a forged sum gets here; refusing would be a bit of the sum (under
            # ckks the server never sees it), so the client takes a local step instead
            _LOG.warning(
                "Client %s, round %s: the summed summary is no honest sum (I + A not "
                "positive definite with margin, or not finite); a local step instead",
                self.client_id,
                t,
            )
            self.evaluate(self.propose_local(t), t, "local")
            return {}
        model = self.global_model()
        if self.config.global_model == "pic" and len(self.X) > 0:
            with self.timed("global_model"):
                model = FederatedPICGP.from_pitc(model, self.X, self._transformed_Y())
        if self.config.mixing == "expected" and len(self.X) > 0:
            acqf = MixedLocalGlobalUCB(
                self.local_model(),
                model,
                beta=self.config.beta_at(t, self.dim),
                p_local=self.schedule.prob_local(t),
                mode="expected",
            )
            x = self.acquire(model, t, acqf=acqf)
        elif self.config.global_batch == "batch" and count > 1:
            x = self._batch_point(model, t, rank, count, self.search_seed(t))
        elif self.config.global_batch == "distinct" and self.config.acquisition != "ts":
            # every global client of round t holds the same model: same seeded search,
            # then one distinct optimum each (see BOClient.acquire). The acquisition must
            # be the same on every client too: EI's incumbent is taken from the shared
            # model (its best posterior mean on the support), not from local data.
            acqf = None
            if self.config.acquisition == "ei":
                with torch.no_grad():
                    best_f = model.posterior(self.support).mean.max()
                acqf = self.make_acquisition(model, t, best_f=best_f)
            seed = self.search_seed(t)
            x = self.acquire(model, t, acqf=acqf, rank=rank, count=count, seed=seed)
        elif self.config.global_model == "pitc":
            # a search of this client's own on the shared model (Thompson sampling,
            # "independent", a batch of one): the server may hold that model too
            x = self.acquire(model, t, seed=self.search_seed(t, own=True))
        else:  # the client's PIC model, which holds its own data
            x = self.acquire(model, t)
        self.evaluate(x, t, "global")
        return {}

    def federation_secret(self) -> bytes | None:
        r"""The secret this client shares with the other clients and not with the
        server (:meth:`~botorch_fed.secure.base.ClientRole.federation_secret` of its
        secure-aggregation role; ``None`` under ``plaintext`` or without a role)."""
        if self.secagg is None:
            return None
        return self.secagg.federation_secret()

    def search_seed(self, t: int, *, own: bool = False) -> int:
        r"""The seed of round ``t``'s search on the shared dPITC model, derived by the
        client itself (the server sends none).

        With a federation secret (``ckks``, ``masking``): :func:`secret_step_seed` of
        the secret, the run seed and ``t`` -- the same on every client of the
        federation, so the shared search of ``global_batch`` "distinct" / "batch" is
        still one search, and unpredictable to the server, which therefore cannot
        replay it. Without one (``plaintext``): the public :func:`global_step_seed`
        (or, with ``own``, the client's public :meth:`step_seed`), which the server can
        recompute.

        Args:
            t: The round.
            own: A search of this client's only (its id enters the derivation).

        Raises:
            ProtocolViolation: The client has no run seed.
        """
        if self.run_seed is None:
            raise self.violation(
                "no run seed to derive the round's search seed from (pass `run_seed`)",
                "global_step",
            )
        secret = self.federation_secret()
        if secret is None:
            return self.step_seed(t) if own else global_step_seed(self.run_seed, t)
        return secret_step_seed(secret, self.run_seed, t, client_id=self.client_id if own else None)

    def _global_summary_usable(self) -> bool:
        r"""Whether the summed summary (``last_sum``) is one honest clients can produce:
        finite, of the support's packed length, and with ``I + A`` positive definite
        with margin (``A`` is a sum of positive semi-definite matrices: every
        eigenvalue of ``I + A`` is at least 1; the check asks ``A + I/2`` for a Cholesky
        factor). A server that offset a CKKS sum could otherwise make the model's
        factorisation fail -- or not -- depending on the sum."""
        if self.last_sum is None or self.support is None:
            return False
        m = len(self.support)
        if self.last_sum.shape != (SparseSummary.packed_length(m),):
            return False
        if not np.isfinite(self.last_sum).all():
            return False
        A = SparseSummary.from_numpy(self.last_sum, m).A
        eye = torch.eye(m, dtype=A.dtype)
        _, info = torch.linalg.cholesky_ex(A + 0.5 * eye)
        return int(info) == 0

    def _check_global_step(self, payload: dict) -> tuple[int, int]:
        r"""``(rank, count)`` of a global step, refused unless
        ``0 <= rank < count <= num_clients`` (a server that picked ranks freely could
        steer a client to a point of its choosing, or ask for ``2 count`` restarts
        without bound), and refused if the message carries anything else: the seed
        of the search is the client's own (:meth:`search_seed`), never the server's."""
        extra = sorted(set(payload) - {"t", "rank", "count"})
        if extra:
            raise self.violation(
                f"unexpected fields {extra} in a global step (only `t`, `rank` and `count`; "
                "the client derives the search's seed itself)",
                "global_step",
            )
        rank, count = payload.get("rank"), payload.get("count")
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in (rank, count)):
            raise self.violation(
                f"`rank` and `count` must be ints, got {rank!r}, {count!r}", "global_step"
            )
        limit = self.num_clients if self.num_clients is not None else count
        if not (1 <= count <= limit and 0 <= rank < count):
            raise self.violation(
                f"a global step of rank {rank} among {count} clients (the federation has "
                f"{self.num_clients}): needs 0 <= rank < count <= the number of clients",
                "global_step",
            )
        return rank, count

    def _batch_point(
        self, model: FederatedPITCGP, t: int, rank: int, count: int, seed: int
    ) -> Tensor:
        r"""This client's point of the round's shared sequential-greedy ``q``-batch on
        the shared dPITC model (every global client computes the same batch from the
        same model and seed, and takes the point of its rank)."""
        s = self.config
        if s.acquisition == "ucb":
            acqf = qUpperConfidenceBound(model, beta=s.beta_at(t, self.dim))
        else:  # EI's incumbent from the shared model, as for "distinct"
            with torch.no_grad():
                best_f = model.posterior(self.support).mean.max()
            acqf = qLogExpectedImprovement(model, best_f=best_f)
        with self.timed("acquisition"):
            X = maximize_step_acquisition(
                acqf,
                self.bounds,
                seed=seed,
                q=count,
                num_restarts=s.num_restarts,
                raw_samples=s.raw_samples,
                maxiter=s.maxiter,
                sequential=True,
            )
        x = X[rank].reshape(1, self.dim).clamp(0.0, 1.0)
        return self.avoid_failures(x)

    def on_apply_theta(self, payload: dict) -> dict:
        r"""Adopt the result of the round's federated fit: one of the iterates this
        client summarised its data at in the fit (so inside the declared domain, and
        checked by the coordinator to be its own), once per fit."""
        theta = self._checked_theta(payload.get("theta"), "apply_theta")
        if self._fit_round is None or self._fit_round != self._t:
            raise self.violation(
                "hyperparameters to apply, but no fit ran in this round", "apply_theta"
            )
        if not any(np.array_equal(theta, seen) for seen in self._fit_thetas):
            raise self.violation(
                "the hyperparameters to apply are none of the fit's iterates", "apply_theta"
            )
        PITCHyperparameters(*self.modules).set_theta(theta)
        self._end_fit()
        self._fit_client = None
        return {}

    # --- what the server chose: checked against the declared domains -----------------
    def sum_encoding(self, request: str) -> int:
        r"""The outcome moments are exact small-integer limbs already (raw values);
        every other sum travels in limbs below ``2^64``."""
        return 0 if request in ("moments", "centred_moments") else 64

    def sum_bound(self, request: str) -> float | None:
        r"""The outcome moments are digits of at most ``MAX_LIMB`` (2048) too."""
        if request in ("moments", "centred_moments"):
            return float(MOMENT_MAX_LIMB)
        return super().sum_bound(request)

    def _checked_theta(self, theta: object, request: str) -> np.ndarray:
        r"""``theta`` as float64 if it lies in the declared domain
        (:func:`~botorch_fed.federation.fbo_fedgp_domain.theta_domain`), else a
        refusal -- decided on the server's value alone, before any private data."""
        value = np.asarray(theta) if isinstance(theta, np.ndarray | list | tuple) else None
        if value is None or value.dtype.kind not in "fi":
            raise self.violation(
                f"hyperparameters must be an array, got {type(theta).__name__}", request
            )
        value = value.astype(np.float64)
        if not in_domain(value, self.theta_domain):
            raise self.violation(
                f"hyperparameters outside the declared domain (lower {self.theta_domain[:, 0]},"
                f" upper {self.theta_domain[:, 1]})",
                request,
            )
        return value

    def _fit_budget(self) -> int:
        return FIT_EVALUATIONS_PER_ITERATION * self.config.federated_maxiter

    def _refresh_due(self) -> bool:
        r"""Whether the current round may refresh the hyperparameters (the server's
        schedule: the first global round, then every ``hyper_every`` rounds)."""
        last = self._last_fit_round
        return last is None or self._t - last >= self.config.hyper_every

    def _admit_sum(self, request: str) -> None:
        r"""Refuse a secure sum the round does not have: each sum once per round
        (outcome moments, summary, averaged hyperparameters), a federated fit's sums
        only in a round due a refresh and at most :meth:`_fit_budget` times."""
        if self._t is None:
            raise self.violation("a secure sum before any round", request)
        self._fed, self._vjp_for_pending = None, False  # a new session: no stale product
        if request != "pitc_vjp":  # the product belongs to the summary session before it
            self._fit_theta = self._fit_sum = None
        count = self._sums[request] = self._sums.get(request, 0) + 1
        fit = request in ("pitc_summary", "pitc_vjp")
        limit = self._fit_budget() if fit else 1
        if count > limit:
            raise self.violation(
                f"{count} {request!r} sums in round {self._t}; the round has at most {limit}",
                request,
            )
        if fit or request == "hyper":
            wanted = "federated" if fit else "average"
            if self.config.hyperparameters != wanted:
                raise self.violation(
                    f"a {request!r} sum, but the run's hyperparameters are "
                    f"{self.config.hyperparameters!r}",
                    request,
                )
            if self._fit_round != self._t:  # a new refresh
                if not self._refresh_due():
                    raise self.violation(
                        f"a hyperparameter refresh in round {self._t}, the last was in round "
                        f"{self._last_fit_round} (every {self.config.hyper_every} rounds)",
                        request,
                    )
                self._start_fit()

    def _start_fit(self) -> None:
        # the refresh counts from its start: an abandoned fit is a refresh too
        self._fit_round, self._fit_thetas, self._last_fit_round = self._t, [], self._t
        self._pending_theta, self._fed = None, None
        self._fit_index, self._handed_out, self._pending_evaluated = -1, 0, False

    def _end_fit(self) -> None:
        self._fit_round, self._fit_thetas, self._pending_theta = None, [], None

    # --- vectors contributed to secure sums ----------------------------------------------
    def vector_moments(self) -> np.ndarray:
        self._admit_sum("moments")
        return outcome_moments(self.Y)

    def vector_centred_moments(self) -> np.ndarray:
        self._admit_sum("centred_moments")
        if self._moments_center is None:
            raise self.violation(
                "centred moments requested before the first pass", "centred_moments"
            )
        return centred_moments(self.Y, self._moments_center)

    def vector_hyper(self) -> np.ndarray:
        self._admit_sum("hyper")
        # The local GP's values are in this client's own standardised units. With
        # BoTorch's default kernel (no outputscale: signal variance 1) the noise is a
        # noise-to-signal ratio and the lengthscales are unit-free, so the size-weighted
        # average carries over to the globally standardised model; the constant mean
        # (~0 in either) is the one approximate entry.
        if len(self.X) == 0:  # every evaluation failed so far: no weight in the average
            return np.zeros(PITCHyperparameters(*self.modules).size + 1)
        model = self.local_model()
        hyper = PITCHyperparameters(model.covar_module, model.likelihood, model.mean_module)
        n = float(len(self.X))
        return np.concatenate([n * hyper.get_values(), [n]])

    # A client without data (every evaluation failed so far) contributes zeros: the
    # sums are then those of the other clients.
    def vector_summary(self) -> np.ndarray:
        self._admit_sum("summary")
        if self.support is None or self.standardize is None:
            raise self.violation("a summary before the support and the standardisation", "summary")
        if len(self.X) == 0:
            return np.zeros(SparseSummary.packed_length(len(self.support)))
        with self.timed("summary"), torch.no_grad():
            summary = compute_local_summary(
                self.X, self._transformed_Y(), self.support, *self.modules
            )
            return summary.to_numpy()

    def vector_pitc_summary(
        self, theta: np.ndarray, tag: bytes = b"", index: int = -1
    ) -> np.ndarray:
        theta = self._checked_theta(theta, "pitc_summary")
        index = self._check_iterate_tag(theta, tag, index)
        if self.client_id == COORDINATOR and self._pending_theta is None:
            raise self.violation(
                "a fit evaluation, but the coordinator's fit handed out no iterate", "pitc_summary"
            )
        if self._pending_theta is not None and not np.array_equal(theta, self._pending_theta):
            # the coordinator's own check: the server may not query the loss elsewhere
            raise self.violation("`theta` is not the fit's pending iterate", "pitc_summary")
        if self._pending_theta is not None and self._pending_evaluated:
            raise self.violation("a second summary at the pending iterate", "pitc_summary")
        if self.support is None or self.standardize is None:
            raise self.violation(
                "a summary before the support and the standardisation", "pitc_summary"
            )
        self._admit_sum("pitc_summary")
        if self.federation_secret() is not None:  # each tagged evaluation once, in order
            self._fit_index = index
        if self._pending_theta is not None:  # the coordinator: one summary per iterate
            self._pending_evaluated = True
        self._fit_thetas.append(theta.copy())
        self._fit_theta = theta
        if len(self.X) == 0:
            return np.zeros(SparseSummary.packed_length(len(self.support)))
        with self.timed("summary"):
            if self._fit_client is None:
                self._fit_client = PITCFitClient(
                    self.X, self._transformed_Y(), self.support, *self.modules
                )
            return self._fit_client.summary(theta)

    def vector_pitc_vjp(self) -> np.ndarray:
        # every client holds the summed summaries: it derives the loss and the adjoint
        # itself (no party sends them), then contributes its vector-Jacobian product
        if self._fit_theta is None or self._fit_sum is None:
            raise self.violation(
                "a product without the summary sum at its iterate just before", "pitc_vjp"
            )
        self._admit_sum("pitc_vjp")
        theta, self._fit_theta = self._fit_theta, None  # one VJP per summary
        with self.timed("hyperparameters"):
            hyper = PITCHyperparameters(*self.modules)
            hyper.set_theta(theta)
            adjoint = self._fit_adjoint(hyper)
        self._vjp_for_pending = self._pending_theta is not None and np.array_equal(
            theta, self._pending_theta
        )
        if len(self.X) == 0:
            return np.zeros(hyper.size)
        with self.timed("summary"):
            return self._fit_client.vjp(adjoint)

    def on_secagg(self, payload: dict) -> dict:
        r"""A secure-sum message; a federated fit's sessions must include the
        coordinator (client :data:`COORDINATOR`), which checks that the ``theta`` is its
        own pending iterate -- and, the values relayed to every client being bound into
        the session, that every contributor was told that same iterate."""
        reply = super().on_secagg(payload)
        request = str(payload.get("request", ""))
        if request in ("pitc_summary", "pitc_vjp"):
            session = tuple(int(c) for c in getattr(self.secagg, "client_ids", ()) or ())
            if COORDINATOR not in session:
                self._pending = self._request = None  # nothing of it leaves this client
                raise self.violation(
                    f"a fit's secure sum over clients {list(session)}, without the "
                    f"coordinator {COORDINATOR}",
                    request,
                )
        return reply

    def _fit_adjoint(self, hyper: PITCHyperparameters) -> np.ndarray:
        r"""The adjoint of the loss at the summed summaries of this iterate (the
        ``pitc_summary`` sum just before), which every client derives itself; sets the
        loss and the prior's gradient.

        A sum the server forged (it may offset a CKKS sum) can make the loss undefined
        (no Cholesky factor) or the adjoint unbounded. Refusing then would tell the
        server a bit about the sum, so the client goes on with a zero adjoint and a
        huge loss (which the coordinator's line search backs away from) and logs it;
        an honest sum never takes this path."""
        m = len(self.support)
        try:
            loss, adjoint, prior_grad = pitc_loss_and_adjoint(self._fit_sum, m, hyper)
        except (ValueError, RuntimeError) as exc:  # torch's linalg errors are RuntimeErrors
            loss, adjoint, prior_grad = math.inf, None, np.zeros(hyper.size)
            reason = type(exc).__name__
        else:
            reason = None if np.isfinite(adjoint).all() and math.isfinite(loss) else "not finite"
        if reason is not None:
            _LOG.warning(
                "Client %s, round %s: the fit's summed summaries give no finite loss (%s); "
                "contributing a zero product (only a forged sum can cause this)",
                self.client_id,
                self._t,
                reason,
            )
            loss, adjoint = _FAILED_LOSS, np.zeros(len(self._fit_sum))
        self._fit_loss, self._fit_prior_grad = loss, prior_grad
        return np.clip(adjoint, -_ADJOINT_LIMIT, _ADJOINT_LIMIT)

    def on_hyper_start(self, payload: dict) -> dict:
        r"""The coordinator starts the round's fit: L-BFGS-B in the declared domain
        from the current hyperparameters (clamped into it), at most
        ``federated_maxiter`` iterations and twice as many evaluations."""
        if self._minimizer is not None:  # an earlier fit was abandoned mid-protocol
            self._minimizer.close()
            self._minimizer = None
        if self.config.hyperparameters != "federated" or self._t is None:
            raise self.violation("a federated fit outside a federated refresh", "hyper_start")
        if self._fit_round != self._t and not self._refresh_due():
            raise self.violation(
                f"a hyperparameter refresh in round {self._t}, the last was in round "
                f"{self._last_fit_round} (every {self.config.hyper_every} rounds)",
                "hyper_start",
            )
        if self._fit_round == self._t and self._fit_thetas:
            raise self.violation("a second fit in one round", "hyper_start")
        self._start_fit()
        hyper = PITCHyperparameters(*self.modules)
        x0 = clamp_to_domain(hyper.get_theta(), self.theta_domain)
        self._minimizer = SteppedMinimizer(
            x0,
            self.theta_domain,
            maxiter=self.config.federated_maxiter,
            maxfun=self._fit_budget(),
        )
        return self._hyper_reply(self._minimizer.start())

    def on_hyper_feed(self, payload: dict) -> dict:
        if self._minimizer is None:
            raise ProtocolViolation(f"Client {self.client_id} is not running a fit.")
        if self._fed is None:  # the product sum of the pending iterate, nothing since
            raise self.violation(
                "a feed before the pending iterate's summary and product", "hyper_feed"
            )
        grad, self._fed = self._fed + self._fit_prior_grad, None
        return self._hyper_reply(self._minimizer.feed(self._fit_loss, grad))

    def _hyper_reply(self, theta: np.ndarray | None) -> dict:
        if theta is None:
            theta, self._minimizer = self._minimizer.result.x, None
            self._pending_theta = None
            return {"theta": theta, "done": True}
        self._pending_theta, self._fed = np.array(theta, dtype=np.float64), None
        self._pending_evaluated = False
        self._handed_out += 1
        index = self._handed_out
        tag = self._iterate_tag(self._pending_theta, index)
        return {"theta": theta, "done": False, "tag": tag, "index": index}

    _ITERATE_LABEL = b"botorch-fed/fbo-fedgp/fit-iterate\x00"

    def _iterate_message(self, theta: np.ndarray, index: int) -> bytes:
        message = self._ITERATE_LABEL + _encode_count(_check_count("run_seed", self.run_seed or 0))
        message += _encode_count(self._t or 0) + _encode_count(int(index))
        return message + np.ascontiguousarray(theta, dtype="<f8").tobytes()

    def _iterate_tag(self, theta: np.ndarray, index: int) -> bytes:
        r"""The coordinator's tag of the ``index``-th iterate it hands out in this
        round's fit: HMAC-SHA256 under the federation secret (which the server lacks)
        of the run seed, the round, ``index`` and ``theta``; empty without a secret
        (``plaintext``, where the server sees the sums anyway)."""
        secret = self.federation_secret()
        if secret is None:
            return b""
        return mac_tag(hkdf(secret, self._ITERATE_LABEL), self._iterate_message(theta, index))

    def _check_iterate_tag(self, theta: np.ndarray, tag: object, index: object) -> int:
        r"""Refuse a fit evaluation at a ``theta`` the coordinator did not hand out in
        this round (its tag does not verify), or at an iterate this client already
        computed at (indices increase): decisions on the server's message alone. Without
        a federation secret there is nothing to check. Returns the index."""
        secret = self.federation_secret()
        if secret is None:
            return -1
        if isinstance(index, bool | np.bool_) or not isinstance(index, int | np.integer):
            raise self.violation(
                f"the iterate's `index`={index!r:.40} must be an int", "pitc_summary"
            )
        index = int(index)
        key = hkdf(secret, self._ITERATE_LABEL)
        message = self._iterate_message(theta, index) if index >= 1 else b""
        if not isinstance(tag, bytes) or not mac_verify(key, tag, message):
            raise self.violation(
                "a fit evaluation at a `theta` the coordinator did not hand out (its tag "
                "does not verify)",
                "pitc_summary",
            )
        if self._fit_round == self._t and index <= self._fit_index:
            raise self.violation(
                f"iterate {index} of the round's fit, after iterate {self._fit_index}: each "
                "iterate is evaluated once, in order",
                "pitc_summary",
            )
        return index

    def _forged_sum(self, request: str, exc: ValueError) -> float:
        r"""A moments sum that no honest federation produces. Where the server holds
        the sums (``plaintext``, ``masking``) it is refused by name; where they stay on
        the clients (``ckks``, whose server may offset a sum) a refusal would tell the
        server a bit of a sum it must not learn, so the client goes on (centre 0, then
        the identity standardisation, its outcomes clamped) and its own log says so."""
        if not self._sums_stay_on_clients():
            raise self.violation(f"the sum does not decode ({exc})", request) from exc
        _LOG.warning(
            "Client %s, request %r, round %s: a forged moments sum (%s); going on with the "
            "identity standardisation",
            self.client_id,
            request,
            self._t,
            type(exc).__name__,
        )
        return 0.0

    def sum_received(self, request: str | None, total: np.ndarray) -> dict | None:
        if request == "moments":
            # pass 1: the count and the centre of pass 2 (limb sums beyond what the
            # session's clients can produce, or fewer outcomes than this client's own,
            # are a forged sum)
            self._first_moments = self._moments_center = None
            try:
                n, center = center_from_moments(total, max_contributors=self.sum_contributors)
                if n < len(self.Y):
                    raise ValueError(
                        f"the sum reports n={n} outcomes, fewer than this client's own "
                        f"{len(self.Y)}"
                    )
            except ValueError as exc:
                center = self._forged_sum(request, exc)
            self._first_moments, self._moments_center = total.copy(), center
        elif request == "centred_moments":
            if self._first_moments is None:
                raise self.violation("centred moments without a first pass", request)
            first, self._first_moments, self._moments_center = self._first_moments, None, None
            try:
                self.standardize = standardize_from_moments(
                    first, total, max_contributors=self.sum_contributors
                )
            except ValueError as exc:
                self._forged_sum(request, exc)
                self.standardize = _identity_standardize()
            self._fit_client = None
        elif request == "pitc_summary" and self._fit_theta is not None:
            self._fit_sum = total.copy()  # what this iterate's product derives from
        elif request == "pitc_vjp" and self._vjp_for_pending:
            self._fed = total.copy()  # what the coordinator's next feed uses, nothing else
        elif request == "hyper":
            # a sum is never refused for its value (that would be a bit of it): the
            # average is clamped into the declared domain
            with np.errstate(divide="ignore", invalid="ignore"):
                values = total[:-1] / total[-1]
            PITCHyperparameters(*self.modules).set_values(
                clamp_to_domain(values, self.theta_domain)
            )
            self._end_fit()
        return None


class FBOFedGPServer(FederatedServer):
    r"""The FBO-FedGP server: support set, rounds, secure aggregation relay.

    Args:
        transport: Reaches the clients.
        config: The algorithm settings.
        dim: Problem dimension.
        secagg: The server role of the secure-aggregation backend.
        seed: Seed of the server's own randomness (global k-means, random support).
    """

    def __init__(self, transport, config: FBOFedGPConfig, dim: int, secagg, seed: int) -> None:
        super().__init__(transport, secagg)
        config.validate()
        self.config = self.settings = config.resolved()
        self.dim = dim
        self.seed = int(seed)
        self.support_size = config.support_size
        self.support: Tensor | None = None
        self._hyper_round: int | None = None
        self.hyper = PITCHyperparameters(*global_modules(dim))  # structure only (and priors)

    def state_dict(self) -> dict:
        r"""Adds the support set, its size, the last hyperparameter refresh and the
        hyperparameters to :meth:`FederatedServer.state_dict`."""
        state = super().state_dict()
        state.update(
            support=None if self.support is None else self.support.clone(),
            support_size=self.support_size,
            hyper_round=self._hyper_round,
            theta=torch.from_numpy(np.array(self.hyper.get_theta(), dtype=np.float64)),
        )
        return state

    def load_state_dict(self, state: dict) -> None:
        own, rest = split_state(
            "Server", state, ("support", "support_size", "hyper_round", "theta")
        )
        super().load_state_dict(rest)
        support = own["support"]
        if support is not None:
            support = check_tensor("Server", "support", support, (None, self.dim)).clone()
        theta = check_tensor("Server", "theta", own["theta"], (self.hyper.size,))
        self.support, self.support_size = support, int(own["support_size"])
        self._hyper_round = None if own["hyper_round"] is None else int(own["hyper_round"])
        self.hyper.set_theta(theta.numpy().copy())

    def select_support(self, t: int) -> None:
        r"""Alg. 1 (or a random support) and its broadcast."""
        cfg = self.config
        # the server's timers cover its own work only; the clients report theirs
        if cfg.support == "random":
            with self.ledger.timer("support"):
                bounds = torch.stack([torch.zeros(self.dim), torch.ones(self.dim)]).double()
                support = random_support(bounds, self.support_size, seed=self.seed + t)
        else:
            replies = self.broadcast("centers", {"k": cfg.centers_per_client})
            with self.ledger.timer("support"):
                centers = [
                    torch.as_tensor(replies[c].payload["centers"], dtype=torch.float64)
                    for c in sorted(replies)
                ]
                centers = [c for c in centers if len(c)]  # clients with too few points
                if centers:
                    support = global_support(centers, self.support_size, seed=self.seed + t)
                else:  # no client holds enough data yet
                    bounds = torch.stack([torch.zeros(self.dim), torch.ones(self.dim)]).double()
                    support = random_support(bounds, self.support_size, seed=self.seed + t)
        # k-means centres are means of points of the unit cube: rounding can leave one
        # a few ulps outside, which the clients would refuse
        self.support = support = support.clamp(0.0, 1.0)
        self.broadcast("support", {"support": support.numpy()})

    def refresh_hyperparameters(self, t: int) -> None:
        cfg = self.config
        if cfg.hyperparameters == "average":
            self.secure_sum("hyper", self.hyper.size + 1)
        else:
            self._fit_federated()
        self._hyper_round = t

    def _fit_federated(self) -> None:
        r"""Exact PITC type-II ML: a coordinator client runs L-BFGS-B; each evaluation
        is two secure sums (summaries at ``theta``, then vector-Jacobian products with
        the adjoint every client derives from the summed summaries)."""
        coordinator = COORDINATOR
        if coordinator not in self.client_ids:
            raise ProtocolViolation(
                f"Server: a federated fit needs its coordinator, client {coordinator}."
            )
        length = SparseSummary.packed_length(len(self.support))
        # the server only relays here: all the fit's time is the clients' (their ledger
        # entries) and the secure sums'
        budget = FIT_EVALUATIONS_PER_ITERATION * self.config.federated_maxiter
        reply = self.send({coordinator: Message("hyper_start")})[coordinator].payload
        evaluations = 0
        while not reply["done"]:
            evaluations += 1
            if evaluations > budget:  # the coordinator is another party: not trusted
                raise ProtocolViolation(
                    f"Server: the coordinator (client {coordinator}) asked for more than "
                    f"{budget} evaluations in one fit (`federated_maxiter`="
                    f"{self.config.federated_maxiter})."
                )
            args = {"theta": reply["theta"], "tag": reply.get("tag", b"")}
            if "index" in reply:
                args["index"] = reply["index"]
            self.secure_sum("pitc_summary", length, args)
            self.secure_sum("pitc_vjp", self.hyper.size)
            reply = self.send({coordinator: Message("hyper_feed")})[coordinator].payload
        self.hyper.set_theta(np.asarray(reply["theta"]))
        self.broadcast("apply_theta", {"theta": reply["theta"]})

    def standardize_outcomes(self) -> None:
        r"""Federated outcome standardisation: two secure sums of the clients' outcome
        moments (``[n, sum y]``, then the sums centred at its mean), after which every
        client holds the ``Standardize`` transform of all outcomes pooled."""
        # the moments already are exact small-integer limbs (outcome_moments,
        # centred_moments): exact and within headroom under every backend, so no wide
        # encoding on top
        self.secure_sum("moments", OUTCOME_MOMENTS_LENGTH, wide=0)
        self.secure_sum("centred_moments", CENTRED_MOMENTS_LENGTH, wide=0)

    def global_round(self, t: int, clients: list[int]) -> None:
        cfg = self.config
        self.standardize_outcomes()
        if self._hyper_round is None or t - self._hyper_round >= cfg.hyper_every:
            self.refresh_hyperparameters(t)
        self.secure_sum("summary", SparseSummary.packed_length(len(self.support)))
        # no seed: each client derives the search's seed itself (FBOFedGPClient.search_seed)
        self.send(
            {
                cid: Message("global_step", {"t": t, "rank": r, "count": len(clients)})
                for r, cid in enumerate(clients)
            }
        )

    def initialize(self) -> None:
        r"""Initial designs, then the first support set (Alg. 2 lines 1-11)."""
        self.broadcast("init")
        self.select_support(0)

    def run_round(self, t: int) -> None:
        r"""Round ``t``: re-select the support when due, let every client draw its step,
        and run a global round if any client drew a global step (Alg. 2 lines 12-28)."""
        cfg = self.config
        if cfg.support_every and t > 1 and (t - 1) % cfg.support_every == 0:
            self.support_size += cfg.support_growth
            self.select_support(t)
        replies = self.broadcast("round", {"t": t})
        global_clients = sorted(c for c, r in replies.items() if r.payload["global"])
        if global_clients:
            self.global_round(t, global_clients)


register_algorithm(
    AlgorithmSpec(
        name="fbo-fedgp",
        summary=(
            "FBO-FedGP: GP-UCB on each client's distributed PIC model, built from dPITC "
            "summaries under secure aggregation (paper 000; --preset paper: Alg. 2's mix of "
            "local and global dPITC steps)"
        ),
        settings_class=FBOFedGPConfig,
        make_client=lambda ctx, cid: FBOFedGPClient(
            secagg=ctx.secagg_clients[cid],
            num_clients=ctx.setup.num_clients,
            run_seed=ctx.setup.seed,
            **ctx.client_arguments(cid),
        ),
        make_server=lambda ctx, transport: FBOFedGPServer(
            transport, ctx.settings, ctx.dim, ctx.secagg_server, seed=ctx.setup.seed
        ),
        secure_aggregation=True,
        min_clients=2,
    )
)
