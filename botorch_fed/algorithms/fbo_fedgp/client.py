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

Presets (``FBOFedGPSettings.preset``; :data:`PRESET_VALUES`): ``"paper"`` is Alg. 2 as
above, with hyperparameters averaged from the clients' local fits every 10 rounds.
``"default"`` takes every step as a global step (``mixing="global"``) on the client's
own distributed PIC model (``global_model="pic"``,
:class:`~botorch_fed.models.FederatedPICGP`: the summed summaries plus the client's own
data block, exact), with federated hyperparameters every 5 rounds, and its clients add
Gaussian noise of std 0.1 (``center_noise``, from their private generators) to the
k-means centres they share (the paper's are exact). How it compares:
``benchmarks/results/fbo_fedgp_pays*.md`` and ``fbo_fedgp_support_privacy.md``.

Choices of this implementation where the paper is silent (all configurable):

- clients taking a global step in the same round share one model, so Alg. 2 read
  literally has them evaluate the same point; on the dPITC model (the paper preset,
  ``global_batch="distinct"``) they run the same seeded search and take distinct optima
  by rank (no data is exchanged for this; each client derives the search's seed itself
  from a secret the clients share and the server does not -- the secure-aggregation
  role's federation secret, under ``ckks`` and ``masking`` -- with the run's public
  seed and the round, :meth:`FBOFedGPClient.search_seed`, so a server holding the
  summed summaries cannot replay the search; rank and count are declared,
  :class:`~botorch_fed.algorithms.fbo_fedgp.messages.GlobalStep`);
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

import numpy as np
import torch
from botorch.models.transforms.outcome import Standardize
from torch import Tensor

from botorch_fed.acquisition import (
    MixingSchedule,
)
from botorch_fed.algorithms.fbo_fedgp.domain import (
    clamp_to_domain,
    outcome_bound,
    theta_domain,
)
from botorch_fed.algorithms.fbo_fedgp.fit import FederatedFitClient
from botorch_fed.algorithms.fbo_fedgp.global_step import GlobalStepClient
from botorch_fed.algorithms.fbo_fedgp.messages import Centers, Round, Support
from botorch_fed.algorithms.fbo_fedgp.settings import (
    MAX_SUPPORT_SIZE,
    FBOFedGPSettings,
    global_modules,
)
from botorch_fed.inducing import local_centers
from botorch_fed.models import (
    FederatedPITCGP,
    PITCFitClient,
    PITCHyperparameters,
    SparseSummary,
    center_from_moments,
    centred_moments,
    compute_local_summary,
    outcome_moments,
    standardize_from_moments,
)
from botorch_fed.models.federated_standardize import MAX_LIMB as MOMENT_MAX_LIMB
from botorch_fed.protocol.bo_client import BOClient
from botorch_fed.protocol.checkpoint import CheckpointError, check_tensor, split_state
from botorch_fed.protocol.declarations import ProtocolViolation, contributes, handles
from botorch_fed.protocol.stepped_minimizer import SteppedMinimizer

_LOG = logging.getLogger(__name__)


def _identity_standardize() -> Standardize:
    r"""``Standardize`` with mean 0 and standard deviation 1 (eval mode)."""
    tf = Standardize(m=1, min_stdv=1e-8)
    tf.means = torch.zeros(1, 1, dtype=torch.float64)
    tf.stdvs = torch.ones(1, 1, dtype=torch.float64)
    tf._stdvs_sq = torch.ones(1, 1, dtype=torch.float64)
    tf._is_trained = torch.tensor(True)
    tf.eval()
    return tf


class FBOFedGPClient(GlobalStepClient, FederatedFitClient, BOClient):
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

    def __init__(
        self,
        client_id: int,
        objective,
        settings: FBOFedGPSettings,
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
        ``[-Z, Z]`` (:func:`~botorch_fed.algorithms.fbo_fedgp.domain.outcome_bound`):
        honest moments never put one outside, forged ones (a server may offset a
        CKKS sum) cannot make the summaries unbounded."""
        assert self.standardize is not None  # every caller checks it first
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

    @handles(Centers)
    def on_centers(self, message: Centers) -> dict:
        r"""Alg. 1: this client's k-means centres (with its private noise), the same
        answer while its data are the same."""
        k = message.k
        if len(self.X) < self.config.min_cluster_size:  # too few points to share a centre of
            return {"centers": np.empty((0, self.dim))}
        noise = self.config.center_noise
        assert noise is not None  # resolved() sets it
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

    @handles(Support)
    def on_support(self, message: Support) -> dict:
        self.support = torch.as_tensor(message.support)
        # summaries on the old support: a product still due for one is refused
        self._fit_client, self._fit_theta = None, None
        return {}

    @handles(Round)
    def on_round(self, message: Round) -> dict:
        r"""Round ``t``: only the next round of the run's budget
        (:meth:`~botorch_fed.protocol.bo_client.BOClient.accept_round`); the client
        draws its step (a local step is evaluated here)."""
        self._global_round = None
        t = self.accept_round(message.t, "round")
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

    # --- vectors contributed to secure sums ----------------------------------------------
    @contributes("moments")
    def vector_moments(self) -> np.ndarray:
        self._admit_sum("moments")
        return outcome_moments(self.Y)

    @contributes("centred_moments")
    def vector_centred_moments(self) -> np.ndarray:
        self._admit_sum("centred_moments")
        if self._moments_center is None:
            raise self.violation(
                "centred moments requested before the first pass", "centred_moments"
            )
        return centred_moments(self.Y, self._moments_center)

    @contributes("hyper")
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
    @contributes("summary")
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
            # summaries of the old outcomes: a product still due for one is refused
            self._fit_client, self._fit_theta = None, None
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
