r"""FBO-FedGP's federated hyperparameter fit over secure sums (paper 000;
:mod:`botorch_fed.protocol.federated_fit`) and what a client checks of it (docs/security.md):
each evaluation is one secure sum of the clients' summaries and their Jacobians at an
iterate of the coordinator's trust region (:class:`SummaryTrustRegion`), which it tags under
the federation secret; each iterate is summarised once, in order, at most
``federated_maxiter + 1`` times in a round due a refresh; the result is one of them."""

from __future__ import annotations

import logging
from copy import deepcopy
from typing import TYPE_CHECKING

import numpy as np

from botorch_fed.algorithms.fbo_fedgp.domain import clamp_to_domain
from botorch_fed.algorithms.fbo_fedgp.messages import ApplyTheta, HyperFeed, PITCSummaryArgs
from botorch_fed.algorithms.fbo_fedgp.seeds import _check_count, _encode_count
from botorch_fed.models import PITCFitClient, PITCHyperparameters, SparseSummary
from botorch_fed.protocol.declarations import ProtocolViolation, contributes, handles
from botorch_fed.protocol.federated_fit import SummaryTrustRegion, fit_loss
from botorch_fed.protocol.secure_sum import SecureSumStep
from botorch_fed.secure.client_role import opening_client_ids
from botorch_fed.secure.crypto import hkdf, mac_tag, mac_verify
from botorch_fed.secure.errors import SecureAggregationError

if TYPE_CHECKING:
    from botorch.models.transforms.outcome import Standardize
    from torch import Tensor

    from botorch_fed.algorithms.fbo_fedgp.settings import FBOFedGPSettings, GlobalModules
    from botorch_fed.protocol.bo_client import BOClient

    _Base = BOClient  # the type checker sees the client this mixin is part of
else:
    _Base = object

_LOG = logging.getLogger("botorch_fed.algorithms.fbo_fedgp.client")  # the algorithm's log
COORDINATOR = 0  # the client that runs a federated fit's optimiser (the lowest id)


class FederatedFitClient(_Base):
    r"""The federated fit's messages and checks of an FBO-FedGP client (a mixin)."""

    config: FBOFedGPSettings  # these six: set in FBOFedGPClient.__init__
    run_seed: int | None
    support: Tensor | None
    standardize: Standardize | None
    modules: GlobalModules
    theta_domain: np.ndarray
    _t: int | None = None  # the round the server announced last (checked)
    _sums: dict[str, int]  # secure sums of each request in round _t
    _fit_client: PITCFitClient | None = None  # derived from the data, support, standardisation
    _minimizer: SummaryTrustRegion | None = None  # the coordinator's
    _fit_theta: np.ndarray | None = None  # the theta of the summary session open
    _fit_index = -1  # the last evaluation index of the round's fit computed at
    _fit_round: int | None = None  # the round of the fit in progress
    _fit_thetas: tuple[np.ndarray, ...] = ()  # the iterates of the fit in progress
    _last_fit_round: int | None = None  # the round of the last refresh
    _cohort: tuple[int, tuple[int, ...]] | None = None  # (round, its secure sums' clients)
    _pending_theta: np.ndarray | None = None  # the coordinator's iterate
    _fed: np.ndarray | None = None  # the coordinator: the summed summary and Jacobian there
    _handed_out = 0  # the coordinator: iterates handed out in the round's fit
    _pending_evaluated = False  # the coordinator: its iterate's summary is done

    if TYPE_CHECKING:

        def _transformed_Y(self) -> Tensor: ...

    def federation_secret(self) -> bytes | None:
        r"""The secret the clients share and the server lacks (``None`` without one)."""
        return None if self.secagg is None else self.secagg.federation_secret()

    @handles(ApplyTheta)
    def on_apply_theta(self, message: ApplyTheta) -> dict:
        r"""Adopt the round's fit result: one of its iterates, once per fit."""
        theta = message.theta
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

    def _fit_budget(self) -> int:
        return self.config.federated_maxiter + 1

    def _admit_sum(self, request: str) -> None:
        r"""Refuse a secure sum the round does not have: each sum once per round, a
        fit's sums only in a round due a refresh and at most :meth:`_fit_budget` times."""
        if self._t is None:
            raise self.violation("a secure sum before any round", request)
        self._fed, self._fit_theta = None, None  # a new session: no stale sum to feed
        passes = {"moments_around"}, {"moments", "centred_moments"}
        for mine, other in (passes, passes[::-1]):
            if request in mine and other & set(self._sums):
                raise self.violation(
                    "the outcome moments in one pass and in two in the same round", request
                )
        count = self._sums[request] = self._sums.get(request, 0) + 1
        fit = request == "pitc_summary"
        limit = self._fit_budget() if fit else 1
        if count > limit:
            raise self.violation(
                f"{count} {request!r} sums in round {self._t}; the round has at most {limit}",
                request,
            )
        if fit or request == "hyper":
            have = self.config.hyperparameters
            if have != ("federated" if fit else "average"):
                raise self.violation(
                    f"a {request!r} sum, but the run's hyperparameters are {have!r}", request
                )
            if self._fit_round != self._t:  # a new refresh
                self._start_fit(request)

    def _start_fit(self, request: str) -> None:
        r"""Start the round's fit; a new refresh is refused before ``hyper_every`` rounds
        since the last (which counts from its start: an abandoned fit is one too)."""
        last, every = self._last_fit_round, self.config.hyper_every
        assert self._t is not None and every is not None  # callers check; resolved() sets it
        if self._fit_round != self._t and last is not None and self._t - last < every:
            raise self.violation(
                f"a hyperparameter refresh in round {self._t}, the last was in round "
                f"{last} (every {every} rounds)",
                request,
            )
        self._fit_round, self._fit_thetas, self._last_fit_round = self._t, (), self._t
        self._pending_theta, self._fed = None, None
        self._fit_index, self._handed_out, self._pending_evaluated = -1, 0, False

    def _end_fit(self) -> None:
        self._fit_round, self._fit_thetas, self._pending_theta = None, (), None

    @contributes("pitc_summary", args=PITCSummaryArgs)
    def vector_pitc_summary(
        self, theta: np.ndarray, tag: bytes = b"", index: int = -1
    ) -> np.ndarray:
        start = index == 0  # the fit's first point: see _check_start
        if start:
            self._check_start(theta, tag)
        else:
            index = self._check_iterate_tag(theta, tag, index)
        pending = self._pending_theta
        for broken, why in (  # the coordinator's checks: the server may not query elsewhere
            (self.client_id == COORDINATOR and pending is None and not start,
             "a fit evaluation, but the coordinator's fit handed out no iterate"),
            (pending is not None and not np.array_equal(theta, pending),
             "`theta` is not the fit's pending iterate"),
            (pending is not None and self._pending_evaluated,
             "a second summary at the pending iterate"),
            (self.support is None or self.standardize is None,
             "a summary before the support and the standardisation"),
        ):  # fmt: skip
            if broken:
                raise self.violation(why, "pitc_summary")
        self._admit_sum("pitc_summary")
        if start and self.client_id == COORDINATOR:
            self._start_minimizer(theta)
        if self.federation_secret() is not None:  # each tagged evaluation once, in order
            self._fit_index = index
        if self._pending_theta is not None:  # the coordinator: one summary per iterate
            self._pending_evaluated = True
        self._fit_thetas, self._fit_theta = (*self._fit_thetas, theta.copy()), theta
        assert self.support is not None  # checked above
        if len(self.X) == 0:
            size = PITCHyperparameters(*self.modules).size
            return np.zeros(SparseSummary.packed_length(len(self.support)) * (1 + size))
        with self.timed("summary"):
            if self._fit_client is None:
                Y = self._transformed_Y()
                self._fit_client = PITCFitClient(self.X, Y, self.support, *self.modules)
            packed, jacobian = self._fit_client.summary_and_jacobian(theta)
            return np.concatenate([packed, jacobian.reshape(-1)])

    def on_secagg(self, message: SecureSumStep) -> dict:
        r"""Every secure sum of a round is over the round's first session's clients (a
        server summing one quantity -- a fit iterate's summary and the model's summary
        at the applied iterate, or the moments in one and in two passes -- over two
        client sets would difference a client out). A fit's sessions must include the
        coordinator, which checks that ``theta`` is its pending iterate (bound into the
        session: every contributor got it)."""
        if message.request is not None:
            self._check_cohort(message)
        reply, request = super().on_secagg(message), message.request
        session = [int(c) for c in getattr(self.secagg, "client_ids", ()) or ()]
        if request == "pitc_summary" and COORDINATOR not in session:
            self._pending = self._request = None  # nothing of it leaves this client
            raise self.violation(
                f"a fit's secure sum over clients {session}, without the coordinator {COORDINATOR}",
                request,
            )
        return reply

    def _check_start(self, theta: np.ndarray, tag: bytes) -> None:
        r"""The first evaluation of a fit (index 0, untagged) is at this client's current
        hyperparameters clamped into the domain: every client holds the same (the last
        applied fit's), so the server chooses nothing, and the coordinator starts there."""
        if self.config.hyperparameters != "federated" or self._t is None:
            raise self.violation("a federated fit outside a federated refresh", "pitc_summary")
        if self._fit_round == self._t:
            raise self.violation("a second fit in one round", "pitc_summary")
        x0 = clamp_to_domain(PITCHyperparameters(*self.modules).get_theta(), self.theta_domain)
        if tag or not np.array_equal(theta, x0):
            raise self.violation(
                "a fit's first evaluation (index 0) must be at the current hyperparameters, "
                "untagged",
                "pitc_summary",
            )

    def _start_minimizer(self, x0: np.ndarray) -> None:
        r"""The coordinator's trust region from ``x0``, within the fit's budget; its first
        point is ``x0``, summed now."""
        hyper = PITCHyperparameters(*deepcopy(self.modules))  # the loss's; not the model's
        assert self.support is not None  # checked before
        support = len(self.support)

        def loss(summary: np.ndarray, theta: np.ndarray):
            hyper.set_theta(theta)
            return fit_loss(summary, support, hyper)

        self._minimizer = SummaryTrustRegion(
            x0, self.theta_domain, self.config.federated_maxiter, loss
        )
        self._pending_theta = self._minimizer.start()

    def _check_cohort(self, message: SecureSumStep) -> None:
        try:
            ids = opening_client_ids(message.data)
        except SecureAggregationError:
            return  # the session's own checks name what is wrong with the frame
        if self._t is None:
            return  # refused by the request's own check (no sum before a round)
        cohort = self._cohort
        if cohort is not None and cohort[0] == self._t and cohort[1] != ids:
            raise self.violation(
                f"a secure sum over clients {list(ids)} in round {self._t}, whose sums are "
                f"over clients {list(cohort[1])}: one set of clients per round",
                message.request,
            )
        self._cohort = (self._t, ids)

    @handles(HyperFeed)
    def on_hyper_feed(self, message: HyperFeed) -> dict:
        if self._minimizer is None:
            raise ProtocolViolation(f"Client {self.client_id} is not running a fit.")
        if self._fed is None:  # the summed summary of the pending iterate, nothing since
            raise self.violation("a feed before the pending iterate's summary", "hyper_feed")
        total, self._fed = self._fed, None
        assert self.support is not None  # the summary needed it
        length = SparseSummary.packed_length(len(self.support))
        jacobian = total[length:].reshape(length, -1)
        return self._hyper_reply(self._minimizer.feed(total[:length], jacobian))

    def _hyper_reply(self, theta: np.ndarray | None) -> dict:
        if theta is None:  # the minimisation has finished
            assert self._minimizer is not None and self._minimizer.result is not None
            theta, self._minimizer, self._pending_theta = self._minimizer.result.x, None, None
            return {"theta": theta, "done": True}
        self._pending_theta, self._fed = np.array(theta, dtype=np.float64), None
        self._pending_evaluated = False
        self._handed_out = index = self._handed_out + 1
        mac = self._iterate_mac(self._pending_theta, index)
        tag = b"" if mac is None else mac_tag(*mac)
        return {"theta": theta, "done": False, "tag": tag, "index": index}

    _ITERATE_LABEL = b"botorch-fed/fbo-fedgp/fit-iterate\x00"

    def _iterate_mac(self, theta: np.ndarray, index: int) -> tuple[bytes, bytes] | None:
        r"""``(key, message)`` of the coordinator's HMAC-SHA256 tag on iterate ``index`` at
        ``theta`` of the round, under the federation secret (``None`` without one)."""
        secret = self.federation_secret()
        if secret is None:
            return None
        message = self._ITERATE_LABEL + _encode_count(_check_count("run_seed", self.run_seed or 0))
        message += _encode_count(self._t or 0) + _encode_count(max(int(index), 0))
        message += np.ascontiguousarray(theta, dtype="<f8").tobytes()
        return hkdf(secret, self._ITERATE_LABEL), message

    def _check_iterate_tag(self, theta: np.ndarray, tag: bytes, index: int) -> int:
        r"""Refuse an iterate after the first the coordinator did not tag in this round,
        or one at or before the last this client computed at; returns ``index``."""
        mac = self._iterate_mac(theta, index)
        if mac is None:
            return -1
        if index < 1 or not mac_verify(mac[0], tag, mac[1]):
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
