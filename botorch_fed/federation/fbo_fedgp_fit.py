r"""The client side of FBO-FedGP's federated hyperparameter fit, and what a client
checks of it (docs/security.md, "Values the server chooses").

A coordinator client (:data:`COORDINATOR`) runs L-BFGS-B in the declared domain
(:mod:`~botorch_fed.federation.fbo_fedgp_domain`) and hands out each iterate with a
tag under the federation secret; every client sums its PITC summary at a tagged iterate
once, in order, then its vector-Jacobian product with the adjoint it derives from the
summed summaries; the coordinator feeds the summed product to its optimiser. A refresh
comes only in a round due one, at most ``2 * federated_maxiter`` evaluations long, and
its result must be one of its iterates. :class:`FederatedFitClient` is a mixin of
:class:`~botorch_fed.federation.fbo_fedgp.FBOFedGPClient`: it uses the client's
modules, support, standardisation, round and secure-aggregation role.
"""

from __future__ import annotations

import logging
import math

import numpy as np

from botorch_fed.federation.fbo_fedgp_domain import (
    FIT_EVALUATIONS_PER_ITERATION,
    clamp_to_domain,
    in_domain,
)
from botorch_fed.federation.fbo_fedgp_seeds import _check_count, _encode_count
from botorch_fed.federation.roles import ProtocolViolation
from botorch_fed.federation.stepped_minimizer import SteppedMinimizer
from botorch_fed.models import (
    PITCFitClient,
    PITCHyperparameters,
    SparseSummary,
    pitc_loss_and_adjoint,
)
from botorch_fed.secure.crypto import hkdf, mac_tag, mac_verify

_LOG = logging.getLogger("botorch_fed.federation.fbo_fedgp")  # the algorithm's log
COORDINATOR = 0  # the client that runs a federated fit's optimiser (the lowest id)
_FAILED_LOSS = 1e300  # the loss of an evaluation whose summed summaries are not honest
_ADJOINT_LIMIT = 1e100  # |adjoint| entries; a product with it stays finite


class FederatedFitClient:
    r"""The federated fit's messages and checks of an FBO-FedGP client (a mixin)."""

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
