r"""The client role of the federation protocol.

A :class:`FederatedClient` owns its private state (data, local model, keys) and
answers declared messages (:mod:`~botorch_fed.protocol.declarations`):
``handle(Message("round", {"t": 3}))`` decodes the payload against the declaration of
``"round"`` and calls the method registered for it with ``@handles`` on the typed
message; undeclared types and out-of-domain fields are refused first.

Secure sums (:mod:`~botorch_fed.protocol.secure_sum`): the first message of a session
names the vector the client contributes (``request``), which it computes with the
method it declared with ``@contributes(request)``. Depending on the backend the sum
ends on the server (plaintext, masking) or only on the clients (CKKS: the server
cannot decrypt); afterwards every client holds the sum in
:attr:`FederatedClient.last_sum`. The server is not trusted with results: a client
accepts one only for the session it contributed to, prefers its own decryption (under
CKKS with ``release="clients"`` it refuses any sum the server supplies), checks the
length and the limb sums against what honest contributors can produce, and turns a
result that does not decode into a :class:`ProtocolViolation` naming the client, the
request and the round.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, ClassVar

import numpy as np
import torch

from botorch_fed.protocol.checkpoint import CheckpointError, check_tensor, expect_keys
from botorch_fed.protocol.declarations import (
    ProtocolViolation,
    Refused,
    handler_table,
    handles,
)
from botorch_fed.protocol.messages import TIME_PREFIX, Message
from botorch_fed.protocol.secure_sum import (
    SECAGG,
    SUM_RESULT,
    SecureSumResult,
    SecureSumStep,
    limb_encoding,
    relayed_digest,
)
from botorch_fed.secure.errors import InputError, SecureAggregationError
from botorch_fed.secure.limbs import LimbEncoding
from botorch_fed.secure.wire import parse_frame

_LOG = logging.getLogger(__name__)


class FederatedClient:
    r"""Base class of a client: answers declared messages with the handlers its class
    registers (:attr:`HANDLERS`).

    What the server tells every client alike is bound into the next secure sum: each
    client chains the messages whose declaration is relayed (the federation's values:
    support, hyperparameters, centres requests, rounds), each session's opening
    fields (``request``, ``arg:*``, ``wide``, ``round``), the sums the server forwards
    and the sums it accepts into one digest of the whole run (:func:`relayed_digest`;
    never reset, so an abandoned session cannot clear a divergence) and hands it to its
    backend role with every session's opening frame (``ClientRole.step(...,
    transcript=...)``). Under ``masking`` and ``ckks`` a session whose contributors
    were told different values then yields no sum: the server cannot equivocate to
    isolate one client's contribution (docs/security.md, **Relayed values**).

    Args:
        client_id: This client's id.
        secagg: This client's role in the secure-aggregation backend (``None``:
            the client cannot take part in secure sums).
    """

    HANDLERS: ClassVar[dict[str, tuple[Any, str]]] = {}
    r"""``{message type: (declaration, method name)}``: the messages this client handles
    (methods decorated with :func:`~botorch_fed.protocol.declarations.handles`); any
    other type is refused before anything runs."""
    CONTRIBUTIONS: ClassVar[dict[str, tuple[Any, str]]] = {}
    r"""``{request: ((request, arguments declaration), method name)}``: the secure sums
    this client contributes to (methods decorated with
    :func:`~botorch_fed.protocol.declarations.contributes`)."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.HANDLERS = handler_table(cls)
        cls.CONTRIBUTIONS = handler_table(cls, "__contributes__")

    def sum_requests(self) -> tuple[str, ...]:
        r"""The secure-sum requests this client contributes to."""
        return tuple(self.CONTRIBUTIONS)

    def __init__(self, client_id: int, secagg=None) -> None:
        self.client_id = int(client_id)
        self.secagg = secagg
        self.last_sum: np.ndarray | None = None
        self._pending: np.ndarray | None = None
        self._request: str | None = None
        self._encoding: LimbEncoding | None = None
        self._length: int | None = None
        self.round: int | None = None  # the federation round the server last announced
        self._timings: dict[str, float] = {}
        self.relayed = b""  # digest of every relayed value of the run so far
        self._torch_rng: torch.Tensor | None = None  # own_torch_rng
        self._handling = False  # inside handle (with the own stream swapped in)

    def own_torch_rng(self, seed: int) -> None:
        r"""Give this client its own stream of torch's global random numbers, seeded
        with ``seed``: every message is handled with it swapped in (and saved after),
        so what the client draws from the global generator (BoTorch's random restarts,
        scrambled Sobol starts without a seed) depends on its own history only -- not
        on the other parties', nor on which process it lives in. Runners call it for
        every client, so a run ends the same in process and on Flower. The CPU generator
        only: CUDA generators stay the process's."""
        self._torch_rng = torch.Generator().manual_seed(int(seed)).get_state()

    def handle(self, message: Message) -> Message:
        r"""Answer one message (the transport calls this)."""
        entry = self.HANDLERS.get(message.type)
        if entry is None:
            raise ProtocolViolation(
                f"Client {self.client_id} cannot handle messages of type {message.type!r}."
            )
        declaration, name = entry
        try:  # checked against its declaration before anything of this client runs
            decoded = declaration.decode(message.payload, self)
        except Refused as exc:
            if declaration is SecureSumResult:  # a refused result ends its session too
                self._pending = self._request = self.last_sum = None
            raise self.violation(exc.describe(), message.type) from None
        handler = getattr(self, name)
        self._timings = {}
        if declaration.RELAYED:
            self.relayed = relayed_digest(self.relayed, message.type, message.payload)
        if self._torch_rng is None or self._handling:  # a nested call: already swapped
            payload = handler(decoded) or {}
        else:
            with torch.random.fork_rng(devices=[]):
                torch.set_rng_state(self._torch_rng)
                self._handling = True
                try:
                    payload = handler(decoded) or {}
                finally:
                    self._handling = False
                    self._torch_rng = torch.get_rng_state()
        payload.update({f"{TIME_PREFIX}{k}": v for k, v in self._timings.items()})
        return Message(message.type, payload)

    @contextmanager
    def timed(self, stage: str) -> Iterator[None]:
        r"""Time a block of this client's work as ``stage`` (reported to the ledger)."""
        t0 = time.perf_counter()
        try:
            yield
        finally:
            dt = time.perf_counter() - t0
            self._timings[stage] = self._timings.get(stage, 0.0) + dt

    # --- checkpoints ------------------------------------------------------------------
    def state_dict(self) -> dict:
        r"""This client's state between rounds (subclasses add theirs).

        Raises:
            ProtocolViolation: A secure-sum session is pending (state is only
                consistent between rounds).
        """
        if self._pending is not None:
            raise self.violation("cannot checkpoint in the middle of a secure sum", self._request)
        last = None if self.last_sum is None else torch.from_numpy(self.last_sum.copy())
        rng = None if self._torch_rng is None else self._torch_rng.clone()
        return {
            "round": self.round,
            "last_sum": last,
            "relayed": self.relayed.hex(),
            "torch_rng": rng,
        }

    def load_state_dict(self, state: dict) -> None:
        r"""Restore :meth:`state_dict` (subclasses restore theirs)."""
        owner = f"Client {self.client_id}"
        expect_keys(owner, state, ("round", "last_sum", "relayed", "torch_rng"))
        rng = state["torch_rng"]
        if rng is not None:
            size = torch.get_rng_state().numel()
            rng = check_tensor(owner, "torch_rng", rng, (size,), torch.uint8).clone()
        last = state["last_sum"]
        if last is not None:
            last = check_tensor(owner, "last_sum", last, (None,)).numpy().copy()
        relayed = state["relayed"]
        try:
            relayed = bytes.fromhex(relayed)
        except (TypeError, ValueError):
            relayed = None
        if relayed is None or len(relayed) not in (0, 32):
            raise CheckpointError(
                f"{owner}: `relayed` must be the hex of a 32-byte digest or empty, got "
                f"{state['relayed']!r:.80}."
            )
        self.round = None if state["round"] is None else int(state["round"])
        self.last_sum = last
        self.relayed = relayed
        self._torch_rng = rng

    # --- secure sums -------------------------------------------------------------
    def violation(self, problem: str, request: str | None = None) -> ProtocolViolation:
        r"""A :class:`ProtocolViolation` naming this client, ``request`` and the round."""
        round_ = "?" if self.round is None else self.round
        return ProtocolViolation(
            f"Client {self.client_id}, request {request!r}, round {round_}: {problem}"
        )

    @property
    def sum_contributors(self) -> int | None:
        r"""At most this many clients contribute to a secure sum (the session's clients)."""
        return getattr(self.secagg, "n_clients", None) or None

    @handles(SecureSumStep)
    def on_secagg(self, message: SecureSumStep) -> dict:
        if self.secagg is None:
            raise ProtocolViolation(f"Client {self.client_id} has no secure-aggregation role.")
        if message.request is not None:  # first message of a session: compute the vector
            request = message.request
            # a request opens a new secure session (its round-0 frame, which also clears
            # the backend's last sum): a later frame of an older session would let that
            # session's sum pass for this request's
            if parse_frame(message.data).round != 0:
                raise self.violation(
                    "a request must come with the opening frame of a new secure session",
                    request,
                )
            if message.round is not None:
                self.round = message.round
            (_, arguments), method = self.CONTRIBUTIONS[request]
            if arguments is None and message.args:
                raise self.violation(
                    f"the request takes no arguments, got {sorted(message.args)}", request
                )
            try:
                args = (
                    {}
                    if arguments is None
                    else dict(arguments.decode(message.args or {}, self).payload())
                )
            except Refused as exc:
                raise self.violation(exc.describe(), request) from None
            # the encoding is this client's, per request; the server's `wide` must agree
            # (a server choosing raw floats could make whether a vector fits depend on it)
            high = self.sum_encoding(request)
            if message.wide != high:
                raise self.violation(
                    f"the session asks for the encoding `wide`={message.wide!r}; this client "
                    f"sends {request!r} vectors with `wide`={high}",
                    request,
                )
            vector = np.asarray(getattr(self, method)(**args), dtype=np.float64)
            if vector.ndim != 1 or not np.isfinite(vector).all():
                raise InputError(
                    f"Client {self.client_id}: its {request!r} vector for secure aggregation "
                    f"must be a finite 1-D array, got shape {vector.shape} with "
                    f"{int((~np.isfinite(vector)).sum())} non-finite entries."
                )
            self._encoding = limb_encoding(high) if high else None
            if self._encoding is not None:
                vector = self._saturated(vector, request)
            self._pending = self._encoding.encode(vector) if self._encoding else vector
            self._request = request
            self._length = vector.size
            self.last_sum = None
            # the session binds everything this client was told in the run, this
            # opening's fields included (not its frame: that is per client)
            fields = {k: v for k, v in message.wire().items() if k != "data"}
            self.relayed = transcript = relayed_digest(self.relayed, SECAGG, fields)
            if hasattr(self.secagg, "input_bound"):  # what every contributor sends at most
                self.secagg.input_bound = self.sum_bound(request)
            with self.timed("secure_aggregation"):
                data = self.secagg.step(message.data, self._pending, transcript=transcript)
            return {"data": data}
        if self._pending is None:
            raise ProtocolViolation(f"Client {self.client_id}: secure-sum round without a vector.")
        try:
            opening = parse_frame(message.data).round == 0
        except SecureAggregationError:
            opening = False  # the backend names what is wrong with it
        if opening or message.wide is not None or message.round is not None or message.args:
            # a new session would take the last request's vector and bind no transcript
            self._pending = None
            raise self.violation(
                "the opening frame of a new secure session came without a request; refusing",
                self._request,
            )
        with self.timed("secure_aggregation"):
            data = self.secagg.step(message.data, self._pending)
        return {"data": data}

    def sum_encoding(self, request: str) -> int:
        r"""The encoding this client sends ``request`` vectors in: ``high`` of the
        limb encoding (:func:`limb_encoding`, exact to ``2^-40`` below ``2^high``), or 0
        for raw float64 values. A session opening with another ``wide`` is refused.

        The client decides it, not the server: under a raw encoding, whether a vector
        fits the backend's headroom would depend on its private values, and a refusal
        would tell the server so. Subclasses name the requests whose vectors are exact
        small integers already (0); every other request is sent in limbs below
        ``2^64``."""
        return 64

    def sum_bound(self, request: str) -> float | None:
        r"""The largest ``|x|`` any contributor's ``request`` vector has as sent (after
        the encoding): the limb encoding's largest digit, or ``None`` (raw values,
        bounded by the backend only). A backend that can use it (CKKS) narrows its
        integrity check's tolerance to it."""
        high = self.sum_encoding(request)
        return float(limb_encoding(high).max_limb()) if high else None

    def _saturated(self, vector: np.ndarray, request: str) -> np.ndarray:
        r"""``vector`` clipped into the limb encoding's range.

        Honest vectors stay far below ``2^64`` (each algorithm bounds what it
        computes on); only values derived from a forged sum could exceed it. Refusing
        them would tell the server one bit about private data, so they are saturated
        instead and the party's own log says so."""
        assert self._encoding is not None  # called once the session's encoding is set
        limit = np.nextafter(2.0**self._encoding.high, 0.0)
        if np.abs(vector).max(initial=0.0) <= limit:
            return vector
        _LOG.warning(
            "Client %s, request %r, round %s: a vector exceeded the encoding's range 2^%d "
            "and was saturated (only a forged sum can cause this)",
            self.client_id,
            request,
            self.round,
            self._encoding.high,
        )
        return np.clip(vector, -limit, limit)

    @handles(SecureSumResult)
    def on_secagg_result(self, message: SecureSumResult) -> dict:
        payload = message.payload()
        request = self._request
        if self._pending is None or request is None:  # last_sum stays as it was
            raise self.violation(
                "a secure-sum result arrived with no session pending (replayed or forged)"
            )
        # what the server forwards is part of what the next session binds
        self.relayed = relayed_digest(self.relayed, SUM_RESULT, payload)
        try:
            self.last_sum = None
            total = self._received_sum(payload, request)
            # and the sum it accepted (under ckks its own decryption, which the server's
            # message does not hold): clients holding different sums part ways
            self.relayed = relayed_digest(self.relayed, "accepted", {"sum": total})
            self.last_sum = total
            return self.sum_received(request, total) or {}
        except ValueError as exc:  # a forged or garbled sum that does not decode
            self.last_sum = None
            raise self.violation(f"the sum does not decode ({exc})", request) from exc
        except ProtocolViolation:
            self.last_sum = None
            raise
        finally:  # done, or abandoned: a replay of this result is refused
            self._pending = None
            self._request = None

    def _sums_stay_on_clients(self) -> bool:
        r"""Whether the backend delivers sums to the clients only (CKKS, release to
        clients, with the secret key): the server cannot know the sum then."""
        backend = getattr(self.secagg, "backend", None)
        return getattr(backend, "release", None) == "clients" and bool(
            getattr(self.secagg, "can_decrypt", False)
        )

    def _received_sum(self, payload: dict, request: str) -> np.ndarray:
        r"""The sum of the finished session: this client's own decryption if it has one
        (the server's copy must then agree, and under CKKS it must send none), else the
        server's; checked against what honest contributors can produce."""
        own = getattr(self.secagg, "result", None)
        stays = self._sums_stay_on_clients()
        if stays and "sum" in payload:
            raise self.violation(
                "the server supplied a sum, but under this backend sums stay on the clients "
                "(the server cannot decrypt); refusing it",
                request,
            )
        if own is not None:
            own = np.asarray(own, dtype=np.float64)
            if self._encoding is not None:
                peak = float(np.abs(np.round(own)).max(initial=0.0))
                bound = (self.sum_contributors or 1) * self._encoding.max_limb()
                if not peak <= bound and stays:
                    # the server never sees this sum (it may have offset it): whether it
                    # is refused would be a bit of it, so it is clamped (and logged)
                    _LOG.warning(
                        "Client %s, request %r, round %s: a limb sum beyond what honest "
                        "contributors produce was clamped (a forged sum)",
                        self.client_id,
                        request,
                        self.round,
                    )
                    own = np.clip(np.nan_to_num(own), -bound, bound)
                elif not peak <= bound:
                    raise self.violation(
                        f"a limb sum of {peak:.6g} exceeds {bound} ({self.sum_contributors} "
                        "contributors x the largest limb): not a sum of honest inputs",
                        request,
                    )
                total = self._encoding.decode(own)
            else:
                total = own.copy()
            if "sum" in payload and not np.array_equal(
                np.asarray(payload["sum"], dtype=np.float64), total
            ):
                raise self.violation(
                    "the server's sum differs from this client's own decryption", request
                )
        elif stays:
            raise self.violation(
                "holds no decrypted sum (the server skipped the decryption round)", request
            )
        elif "sum" in payload:
            total = np.asarray(payload["sum"], dtype=np.float64)
        else:
            raise self.violation("no sum: the server sent none and this client holds none", request)
        if total.shape != (self._length,):
            raise self.violation(
                f"the sum has shape {total.shape}, the session summed vectors of length "
                f"{self._length}",
                request,
            )
        return total

    def sum_received(self, request: str | None, total: np.ndarray) -> dict | None:
        r"""Hook: a secure sum of ``request`` vectors is now in ``last_sum``.

        Subclasses act on it here (e.g. apply averaged hyperparameters) and may return
        a reply payload.
        """
        return None


FederatedClient.HANDLERS = handler_table(FederatedClient)
