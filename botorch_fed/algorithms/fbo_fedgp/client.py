r"""The FBO-FedGP client (Alg. 1 + Alg. 2 of paper 000): a local step with probability
``p_t = 1 - t^-c``, else a global step on the model of the securely summed dPITC
summaries (after the summed outcome moments and hyperparameters, :mod:`.fit`)."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import torch
from botorch.acquisition import AcquisitionFunction, qLogExpectedImprovement, qUpperConfidenceBound
from botorch.models.transforms.outcome import Standardize
from torch import Tensor

from botorch_fed.acquisition import MixedLocalGlobalUCB, MixingSchedule, maximize_step_acquisition
from botorch_fed.algorithms.fbo_fedgp.domain import clamp_to_domain, outcome_bound, theta_domain
from botorch_fed.algorithms.fbo_fedgp.fit import FederatedFitClient
from botorch_fed.algorithms.fbo_fedgp.messages import Centers, GlobalStep, Round, Support
from botorch_fed.algorithms.fbo_fedgp.seeds import global_step_seed, secret_step_seed
from botorch_fed.algorithms.fbo_fedgp.settings import (
    MAX_SUPPORT_SIZE,
    FBOFedGPSettings,
    global_modules,
)
from botorch_fed.inducing import local_centers
from botorch_fed.models import (
    FederatedPICGP,
    FederatedPITCGP,
    PITCHyperparameters,
    SparseSummary,
    center_from_moments,
    centred_moments,
    compute_local_summary,
    moments_around,
    outcome_count,
    outcome_moments,
    standardize_around,
    standardize_from_moments,
)
from botorch_fed.models.federated_standardize import MAX_LIMB as MOMENT_MAX_LIMB
from botorch_fed.protocol.bo_client import BOClient
from botorch_fed.protocol.checkpoint import CheckpointError, check_tensor, split_state
from botorch_fed.protocol.declarations import ProtocolViolation, contributes, handles

_LOG = logging.getLogger(__name__)


class FBOFedGPClient(FederatedFitClient, BOClient):
    r"""An FBO-FedGP client: private data, local GP, its share of the global model.

    Args (beyond :class:`~botorch_fed.protocol.bo_client.BOClient`'s, passed on):
        num_clients: The federation's size, bounding a global step's ``count`` and
            the standardised outcomes (``None``: not checked).
        run_seed: The run's public seed, for the search seeds (:meth:`search_seed`;
            ``None``: a global step on the shared model is refused).
    """

    def __init__(
        self,
        client_id: int,
        objective,
        settings: FBOFedGPSettings,
        *args,
        num_clients: int | None = None,
        run_seed: int | None = None,
        **kwargs,
    ) -> None:
        super().__init__(client_id, objective, settings, *args, **kwargs)
        self.config = settings.resolved()  # the preset's choices filled in
        self.num_clients, self.run_seed = num_clients, run_seed
        self.schedule = MixingSchedule(c=settings.schedule)
        self.support: Tensor | None = None
        self.modules = global_modules(self.dim)
        self.standardize: Standardize | None = None
        self._first_moments: np.ndarray | None = None  # pass 1 of the standardisation
        self._moments_center: float | None = None
        self._global_round: int | None = None  # the round this client drew a global step
        self.theta_domain = theta_domain(PITCHyperparameters(*self.modules))
        # (n, centres sent): the same answer while the data are the same (saved: a client
        # restored from a checkpoint must not answer again with fresh noise)
        self._centers: tuple[int, np.ndarray] | None = None

    _FBO_STATE = ("support", "modules", "standardize", "first_moments", "moments_center")

    def state_dict(self) -> dict:
        r"""Adds the support, the global modules and the federated standardisation."""
        if self._minimizer is not None:
            raise self.violation("cannot checkpoint during a federated fit", "hyper")
        state, first, tf = super().state_dict(), self._first_moments, self.standardize
        state.update(
            support=None if self.support is None else self.support.clone(),
            modules=[m.state_dict() for m in self.modules],
            standardize=None if tf is None else tf.state_dict(),
            first_moments=None if first is None else torch.from_numpy(first.copy()),
            moments_center=self._moments_center,
            last_fit_round=self._last_fit_round,
            centers=None
            if self._centers is None
            else (self._centers[0], torch.from_numpy(self._centers[1].copy())),
        )
        return state

    def load_state_dict(self, state: dict) -> None:
        owner = f"Client {self.client_id}"
        if isinstance(state, dict):  # absent from earlier checkpoints
            state = {"last_fit_round": None, "centers": None, **state}
        own, rest = split_state(owner, state, (*self._FBO_STATE, "last_fit_round", "centers"))
        centers = own["centers"]
        if centers is not None:
            ok = isinstance(centers, tuple | list) and len(centers) == 2
            if not ok or type(centers[0]) is not int or centers[0] < 0:
                raise CheckpointError(f"{owner}: `centers` must be None or (n, centres).")
            centers = (centers[0], check_tensor(owner, "centers", centers[1], (None, self.dim)))
        last_fit = own["last_fit_round"]
        if not (last_fit is None or type(last_fit) is int and last_fit >= 0):
            raise CheckpointError(f"{owner}: `last_fit_round` must be None or an int >= 0.")
        super().load_state_dict(rest)
        support, modules, first = own["support"], own["modules"], own["first_moments"]
        if support is not None:
            support = check_tensor(owner, "support", support, (None, self.dim)).clone()
        if first is not None:
            first = check_tensor(owner, "first_moments", first, (None,)).numpy().copy()
        if not isinstance(modules, list) or len(modules) != len(self.modules):
            raise CheckpointError(f"{owner}: `modules` must be {len(self.modules)} state dicts.")
        tf = None if own["standardize"] is None else Standardize(m=1, min_stdv=1e-8).double()
        try:
            for module, module_state in zip(self.modules, modules, strict=True):
                module.load_state_dict(module_state)
            if tf is not None:
                tf.load_state_dict(own["standardize"])
        except (RuntimeError, KeyError, TypeError) as exc:
            raise CheckpointError(f"{owner}: the GP modules' state does not load ({exc}).") from exc
        self.support, self.standardize = support, tf if tf is None else tf.eval()
        self._first_moments, self._moments_center = first, own["moments_center"]
        self._last_fit_round, self._fit_client = last_fit, None
        self._centers = None if centers is None else (centers[0], centers[1].numpy().copy())

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
        r"""The outcomes under the federated standardisation, clamped into ``[-Z, Z]``
        (:func:`~.domain.outcome_bound`: only a forged standardisation leaves it)."""
        assert self.standardize is not None  # every caller checks it first
        Y = self.standardize(self.Y)[0]
        if self.num_clients is None:
            return Y
        bound = outcome_bound(self.num_clients, self.settings.num_init, self.settings.num_rounds)
        return Y.clamp(-bound, bound)

    def max_support_size(self) -> int:
        r"""The largest support the settings make (at most ``MAX_SUPPORT_SIZE``; refused above)."""
        c = self.config
        grown = (self.settings.num_rounds - 1) // c.support_every if c.support_every else 0
        return min(MAX_SUPPORT_SIZE, c.support_size + c.support_growth * max(grown, 0))

    # --- protocol handlers ----------------------------------------------------------
    @handles(Centers)
    def on_centers(self, message: Centers) -> dict:
        r"""Alg. 1: this client's k-means centres (with its private noise); the same
        answer while its data are the same, so there is no fresh noise to average."""
        noise, size = self.config.center_noise, self.config.min_cluster_size
        if len(self.X) < size:  # too few points to share a centre of
            return {"centers": np.empty((0, self.dim))}
        if self._centers is not None and self._centers[0] == len(self.X):
            return {"centers": self._centers[1].copy()}
        assert noise is not None  # resolved() sets it
        noise_seed = None  # 248 bits of the private generator (the client's `seed` is public)
        if noise > 0:
            draws = torch.randint(2**62, (4,), generator=self.private_rng).tolist()
            noise_seed = sum(int(d) << (62 * i) for i, d in enumerate(draws))
        options: dict[str, Any] = {"seed": self.seed, "noise_std": noise, "min_cluster_size": size}
        with self.timed("support"):
            centers = local_centers(self.X, message.k, noise_seed=noise_seed, **options)
        answer = centers.clamp(0.0, 1.0).numpy()  # noise may leave the cube
        self._centers = (len(self.X), answer.copy())
        return {"centers": answer}

    @handles(Support)
    def on_support(self, message: Support) -> dict:
        self.support = torch.as_tensor(message.support)
        # summaries on the old support: a feed still due for one is refused
        self._fit_client, self._fit_theta, self._fed = None, None, None
        return {}

    @handles(Round)
    def on_round(self, message: Round) -> dict:
        r"""Round ``t``: draw the step (Alg. 2 lines 14-15), take a local one at once."""
        self._global_round = None
        t = self._t = self.accept_round(message.t, "round")
        self._sums = {}
        # no data (every evaluation failed so far): a local step, random
        local = len(self.X) == 0 or (
            self.config.mixing == "sample" and bool(self.schedule.sample(t, seed=self.rng))
        )
        if local:
            self.evaluate(self.propose_local(t), t, "local")
        self._global_round = None if local else t
        return {"global": not local}

    @handles(GlobalStep)
    def on_global_step(self, message: GlobalStep) -> dict:
        r"""The global step (Alg. 2 lines 22-27) of the round this client drew one in,
        as the ``rank``-th of ``count`` (``rank < count``: a server picking ranks
        freely could steer a client to a point of its choosing)."""
        t, rank, count = message.t, message.rank, message.count
        if self._global_round is None or t != self._global_round:
            drew = "no global step" if self._global_round is None else f"round {self._global_round}"
            raise self.violation(
                f"a global step for round {t}, but this client drew {drew}", "global_step"
            )
        self._global_round = None  # one global step per draw
        if rank >= count:
            raise self.violation(
                f"a global step of rank {rank} among {count} clients: needs rank < count",
                "global_step",
            )
        if not self._global_summary_usable():
            # only a forged sum gets here; refusing would be a bit of the sum
            msg = "Client %s, round %s: the summed summary is no honest sum; a local step"
            _LOG.warning(msg, self.client_id, t)
            self.evaluate(self.propose_local(t), t, "local")
            return {}
        model = self.global_model()
        c = self.config
        if c.global_model == "pic" and len(self.X) > 0:
            with self.timed("global_model"):
                model = FederatedPICGP.from_pitc(model, self.X, self._transformed_Y())
        if c.mixing == "expected" and len(self.X) > 0:
            beta, p_local = c.beta_at(t, self.dim), self.schedule.prob_local(t)
            acqf: AcquisitionFunction | None = MixedLocalGlobalUCB(
                self.local_model(), model, beta, p_local, mode="expected"
            )
            x = self.acquire(model, t, acqf=acqf)
        elif c.global_batch == "batch" and count > 1:
            x = self._batch_point(model, t, rank, count)
        elif c.global_batch == "distinct" and c.acquisition != "ts":
            # the same seeded search on the same model, then one distinct optimum each;
            # EI's incumbent comes from the shared model, not from local data
            ei = c.acquisition == "ei"
            acqf = self.make_acquisition(model, t, best_f=self._shared_best(model)) if ei else None
            x = self.acquire(model, t, acqf=acqf, rank=rank, count=count, seed=self.search_seed(t))
        elif c.global_model == "pitc":  # a search of its own on the shared model
            x = self.acquire(model, t, seed=self.search_seed(t, own=True))
        else:  # the client's PIC model, which holds its own data
            x = self.acquire(model, t)
        self.evaluate(x, t, "global")
        return {}

    def search_seed(self, t: int, *, own: bool = False) -> int:
        r"""Round ``t``'s seed of the search on the shared model (``own``: this client's
        own search): secret with a federation secret (the server cannot replay it)."""
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
        r"""Whether ``last_sum`` is a summed summary honest clients can produce: finite,
        of the support's length, ``A + I/2`` positive definite."""
        total, support = self.last_sum, self.support
        if total is None or support is None:
            return False
        m = len(support)
        if total.shape != (SparseSummary.packed_length(m),) or not np.isfinite(total).all():
            return False
        A = SparseSummary.from_numpy(total, m).A
        _, info = torch.linalg.cholesky_ex(A + 0.5 * torch.eye(m, dtype=A.dtype))
        return int(info) == 0

    def _shared_best(self, model: FederatedPITCGP) -> Tensor:
        r"""EI's incumbent on the shared model: its best posterior mean on the support."""
        assert self.support is not None  # global_model() requires it
        with torch.no_grad():
            return model.posterior(self.support).mean.max()  # type: ignore[attr-defined]

    def _batch_point(self, model: FederatedPITCGP, t: int, rank: int, count: int) -> Tensor:
        r"""This client's point of the round's sequential-greedy batch on the shared model."""
        s = self.config
        if s.acquisition == "ucb":
            acqf: AcquisitionFunction = qUpperConfidenceBound(model, beta=s.beta_at(t, self.dim))
        else:
            acqf = qLogExpectedImprovement(model, best_f=self._shared_best(model))
        search: dict[str, Any] = {"num_restarts": s.num_restarts, "raw_samples": s.raw_samples}
        search.update(seed=self.search_seed(t), q=count, maxiter=s.maxiter, sequential=True)
        with self.timed("acquisition"):
            X = maximize_step_acquisition(acqf, self.bounds, **search)
        return self.avoid_failures(X[rank].reshape(1, self.dim).clamp(0.0, 1.0))

    # --- secure sums --------------------------------------------------------------------
    # exact small-integer limbs <= MAX_LIMB already
    _MOMENTS = ("moments", "centred_moments", "moments_around")

    def sum_encoding(self, request: str) -> int:
        return 0 if request in self._MOMENTS else 64  # others: in limbs below 2^64

    def sum_bound(self, request: str) -> float | None:
        return float(MOMENT_MAX_LIMB) if request in self._MOMENTS else super().sum_bound(request)

    @contributes("moments")
    def vector_moments(self) -> np.ndarray:
        self._admit_sum("moments")
        return outcome_moments(self.Y)

    @contributes("centred_moments")
    def vector_centred_moments(self) -> np.ndarray:
        self._admit_sum("centred_moments")
        if self._moments_center is None:
            raise self.violation("centred moments before the first pass", "centred_moments")
        return centred_moments(self.Y, self._moments_center)

    @contributes("moments_around")
    def vector_moments_around(self) -> np.ndarray:
        r"""One pass around the mean of the last federated standardisation (every client
        holds the same: each accepted the same sum, which the next session binds under
        ``ckks`` and ``masking``, so clients told different sums get no sum; ``plaintext``
        binds nothing, and a client that missed the last sum would centre elsewhere)."""
        self._admit_sum("moments_around")
        if self.standardize is None:
            raise self.violation(
                "moments around the last standardisation's mean, but there was none",
                "moments_around",
            )
        self._first_moments = None
        self._moments_center = center = float(self.standardize.means.reshape(-1)[0])
        return moments_around(self.Y, center)

    @contributes("hyper")
    def vector_hyper(self) -> np.ndarray:
        r"""``[n * values, n]`` of the local fit (in its own standardised units)."""
        self._admit_sum("hyper")
        if len(self.X) == 0:  # every evaluation failed so far: no weight in the average
            return np.zeros(PITCHyperparameters(*self.modules).size + 1)
        model = self.local_model()
        hyper = PITCHyperparameters(model.covar_module, model.likelihood, model.mean_module)
        n = float(len(self.X))
        return np.concatenate([n * hyper.get_values(), [n]])

    @contributes("summary")
    def vector_summary(self) -> np.ndarray:
        self._admit_sum("summary")
        if self.support is None or self.standardize is None:
            raise self.violation("a summary before the support and the standardisation", "summary")
        if len(self.X) == 0:  # no data: zeros, the sum is the other clients'
            return np.zeros(SparseSummary.packed_length(len(self.support)))
        with self.timed("summary"), torch.no_grad():
            Y = self._transformed_Y()
            return compute_local_summary(self.X, Y, self.support, *self.modules).to_numpy()

    @staticmethod
    def _identity_standardize() -> Standardize:
        tf = Standardize(m=1, min_stdv=1e-8).to(torch.float64)
        tf._is_trained = torch.tensor(True)
        return tf.eval()

    def _forged_sum(self, request: str, exc: ValueError) -> float:
        r"""A forged moments sum: refused where the server holds the sums; under ``ckks``
        (a refusal would be a bit of it) logged, going on with centre 0 / identity."""
        if not self._sums_stay_on_clients():
            raise self.violation(f"the sum does not decode ({exc})", request) from exc
        msg = "Client %s, request %r, round %s: a forged moments sum (%s); going on"
        _LOG.warning(msg, self.client_id, request, self._t, type(exc).__name__)
        return 0.0

    def sum_received(self, request: str | None, total: np.ndarray) -> dict | None:
        # no client holds an outcome yet (every evaluation failed): nothing to standardise
        if request in ("moments", "moments_around") and len(self.Y) == 0:
            if outcome_count(total) == 0:
                first = total.copy() if request == "moments" else None
                self._first_moments, self._moments_center = (
                    first,
                    0.0 if first is not None else None,
                )
                return None
        first = self._first_moments
        if request == "centred_moments" and len(self.Y) == 0 and first is not None:
            if outcome_count(first) == 0:
                self._first_moments = self._moments_center = None
                return None
        if request == "moments":  # pass 1: the count and the centre of pass 2
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
                self.standardize = self._identity_standardize()
            # summaries of the old outcomes: a feed still due for one is refused
            self._fit_client, self._fit_theta = None, None
        elif request == "moments_around":
            around, self._moments_center = self._moments_center, None
            assert around is not None  # set when this client contributed
            try:
                count = outcome_count(total)
                if count is not None and count < len(self.Y):
                    raise ValueError(
                        f"the sum reports n={count} outcomes, fewer than this client's own "
                        f"{len(self.Y)}"
                    )
                self.standardize = standardize_around(
                    total, around, max_contributors=self.sum_contributors
                )
            except ValueError as exc:
                self._forged_sum(request, exc)
                self.standardize = self._identity_standardize()
            self._fit_client, self._fit_theta = None, None
        elif request == "pitc_summary" and self._fit_theta is not None:
            theta, pending, self._fit_theta = self._fit_theta, self._pending_theta, None
            if pending is not None and np.array_equal(theta, pending):
                self._fed = total.copy()  # what the coordinator's next feed uses, nothing else
        elif request == "hyper":  # never refused for its value: clamped into the domain
            with np.errstate(divide="ignore", invalid="ignore"):
                values = clamp_to_domain(total[:-1] / total[-1], self.theta_domain)
            PITCHyperparameters(*self.modules).set_values(values)
            self._end_fit()
        return None
