r"""The client side of FBO-FedGP's federated hyperparameter fit, and what a client
checks of it (docs/security.md, "Values the server chooses").

A coordinator client (:data:`COORDINATOR`) runs L-BFGS-B in the declared domain
(:mod:`~botorch_fed.algorithms.fbo_fedgp.domain`) and hands out each iterate with a
tag under the federation secret; every client sums its PITC summary at a tagged iterate
once, in order, then its vector-Jacobian product with the adjoint it derives from the
summed summaries; the coordinator feeds the summed product to its optimiser. A refresh
comes only in a round due one, at most ``2 * federated_maxiter`` evaluations long, and
its result must be one of its iterates. :class:`FederatedFitClient` is a mixin of
:class:`~botorch_fed.algorithms.fbo_fedgp.client.FBOFedGPClient`: it uses the client's
modules, support, standardisation, round and secure-aggregation role.
"""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING

import numpy as np

from botorch_fed.algorithms.fbo_fedgp.domain import FIT_EVALUATIONS_PER_ITERATION, clamp_to_domain
from botorch_fed.algorithms.fbo_fedgp.messages import (
    ApplyTheta,
    HyperFeed,
    HyperStart,
    PITCSummaryArgs,
)
from botorch_fed.algorithms.fbo_fedgp.seeds import _check_count, _encode_count
from botorch_fed.models import (
    PITCFitClient,
    PITCHyperparameters,
    SparseSummary,
    pitc_loss_and_adjoint,
)
from botorch_fed.protocol.declarations import ProtocolViolation, contributes, handles
from botorch_fed.protocol.secure_sum import SecureSumStep
from botorch_fed.protocol.stepped_minimizer import SteppedMinimizer
from botorch_fed.secure.crypto import hkdf, mac_tag, mac_verify

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
_FAILED_LOSS = 1e300  # the loss of an evaluation whose summed summaries are not honest
_ADJOINT_LIMIT = 1e100  # |adjoint| entries; a product with it stays finite


class FederatedFitClient(_Base):
    r"""The federated fit's messages and checks of an FBO-FedGP client (a mixin)."""

    # What this mixin uses of FBOFedGPClient (annotations only: set in its __init__)
    config: FBOFedGPSettings
    run_seed: int | None
    support: Tensor | None
    standardize: Standardize | None
    modules: GlobalModules
    theta_domain: np.ndarray
    _t: int | None
    _sums: dict[str, int]
    # the fit's state (initialised in FBOFedGPClient.__init__)
    _fit_client: PITCFitClient | None
    _minimizer: SteppedMinimizer | None
    _fit_theta: np.ndarray | None
    _fit_sum: np.ndarray | None
    _fit_index: int
    _fit_loss: float
    _fit_prior_grad: np.ndarray | None
    _fit_round: int | None
    _fit_thetas: list[np.ndarray]
    _last_fit_round: int | None
    _pending_theta: np.ndarray | None
    _fed: np.ndarray | None
    _handed_out: int
    _pending_evaluated: bool
    _vjp_for_pending: bool

    if TYPE_CHECKING:  # FBOFedGPClient's (and GlobalStepClient's) methods

        def federation_secret(self) -> bytes | None: ...

        def _transformed_Y(self) -> Tensor: ...

    @handles(ApplyTheta)
    def on_apply_theta(self, message: ApplyTheta) -> dict:
        r"""Adopt the result of the round's federated fit: one of the iterates this
        client summarised its data at in the fit (so inside the declared domain, and
        checked by the coordinator to be its own), once per fit."""
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
        return FIT_EVALUATIONS_PER_ITERATION * self.config.federated_maxiter

    def _refresh_due(self) -> bool:
        r"""Whether the current round may refresh the hyperparameters (the server's
        schedule: the first global round, then every ``hyper_every`` rounds)."""
        last = self._last_fit_round
        # its callers refuse a round-less client first; resolved() sets hyper_every
        assert self._t is not None and self.config.hyper_every is not None
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

    @contributes("pitc_summary", args=PITCSummaryArgs)
    def vector_pitc_summary(
        self, theta: np.ndarray, tag: bytes = b"", index: int = -1
    ) -> np.ndarray:
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

    @contributes("pitc_vjp")
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
        assert self._fit_client is not None  # the summary's (a new support clears both)
        with self.timed("summary"):
            return self._fit_client.vjp(adjoint)

    def on_secagg(self, message: SecureSumStep) -> dict:
        r"""A secure-sum message; a federated fit's sessions must include the
        coordinator (client :data:`COORDINATOR`), which checks that the ``theta`` is its
        own pending iterate -- and, the values relayed to every client being bound into
        the session, that every contributor was told that same iterate."""
        reply = super().on_secagg(message)
        request = message.request
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
        # vector_pitc_vjp checked the sum; the summary it sums needed the support
        assert self.support is not None and self._fit_sum is not None
        m = len(self.support)
        reason: str | None
        try:
            loss, adjoint, prior_grad = pitc_loss_and_adjoint(self._fit_sum, m, hyper)
        except (ValueError, RuntimeError) as exc:  # torch's linalg errors are RuntimeErrors
            loss, adjoint, prior_grad = math.inf, None, np.zeros(hyper.size)
            reason = type(exc).__name__
        else:
            assert adjoint is not None  # pitc_loss_and_adjoint returned one
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
        assert adjoint is not None  # computed (reason None) or zeros
        return np.clip(adjoint, -_ADJOINT_LIMIT, _ADJOINT_LIMIT)

    @handles(HyperStart)
    def on_hyper_start(self, message: HyperStart) -> dict:
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

    @handles(HyperFeed)
    def on_hyper_feed(self, message: HyperFeed) -> dict:
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
            # the minimisation this reply is of has finished (start/feed returned None)
            assert self._minimizer is not None and self._minimizer.result is not None
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

    def _check_iterate_tag(self, theta: np.ndarray, tag: bytes, index: int) -> int:
        r"""Refuse a fit evaluation at a ``theta`` the coordinator did not hand out in
        this round (its tag does not verify), or at an iterate this client already
        computed at (indices increase): decisions on the server's message alone. Without
        a federation secret there is nothing to check. Returns the index."""
        secret = self.federation_secret()
        if secret is None:
            return -1
        key = hkdf(secret, self._ITERATE_LABEL)
        message = self._iterate_message(theta, index) if index >= 1 else b""
        if not mac_verify(key, tag, message):
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
