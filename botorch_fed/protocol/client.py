r"""The client role: :class:`FederatedClient` answers declared messages and takes part in
secure sums (:mod:`~botorch_fed.protocol.secure_sum`), trusting no sum the server sends.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, ClassVar

import numpy as np
import torch

from botorch_fed.protocol.bundle import BUNDLE, bundled_reply, unbundle
from botorch_fed.protocol.checkpoint import CheckpointError, check_tensor, expect_keys
from botorch_fed.protocol.declarations import ProtocolViolation, Refused, handler_table, handles
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
    r"""Base class of a client: answers the declared messages its class handles.

    Every relayed value, session opening and sum forwarded or accepted is chained into one
    digest of the run (:attr:`relayed`, never reset) that binds the next secure session: a
    server that tells contributors different values gets no sum (docs/security.md).

    Args:
        client_id: This client's id.
        secagg: This client's secure-aggregation role (``None``: no secure sums).
    """

    #: ``{message type: (declaration, method name)}`` (``@handles``); others are refused
    HANDLERS: ClassVar[dict[str, tuple[Any, str]]] = {}
    #: ``{request: ((request, arguments declaration), method name)}`` (``@contributes``)
    CONTRIBUTIONS: ClassVar[dict[str, tuple[Any, str]]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.HANDLERS = handler_table(cls)
        cls.CONTRIBUTIONS = handler_table(cls, "__contributes__")

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
        r"""Handle every message with this client's own stream of torch's global (CPU)
        random numbers, seeded ``seed``, so its draws depend on its own history only."""
        self._torch_rng = torch.Generator().manual_seed(int(seed)).get_state()

    def handle(self, message: Message) -> Message:
        r"""Answer one message (the transport calls this); a bundle's parts in order, each
        as if it came alone (:mod:`~botorch_fed.protocol.bundle`)."""
        if message.type == BUNDLE:
            try:
                parts = unbundle(message)
            except ValueError as exc:
                raise self.violation(f"a malformed bundle: {exc}", BUNDLE) from None
            return bundled_reply([self.handle(part) for part in parts])
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
            self._timings[stage] = self._timings.get(stage, 0.0) + (time.perf_counter() - t0)

    def state_dict(self) -> dict:
        r"""This client's state between rounds (subclasses add theirs); refused mid-session."""
        if self._pending is not None:
            raise self.violation("cannot checkpoint in the middle of a secure sum", self._request)
        return {
            "round": self.round,
            "last_sum": None if self.last_sum is None else torch.from_numpy(self.last_sum.copy()),
            "relayed": self.relayed.hex(),
            "torch_rng": None if self._torch_rng is None else self._torch_rng.clone(),
        }

    def load_state_dict(self, state: dict) -> None:
        r"""Restore :meth:`state_dict` (subclasses restore theirs)."""
        owner = f"Client {self.client_id}"
        expect_keys(owner, state, ("round", "last_sum", "relayed", "torch_rng"))
        rng, last = state["torch_rng"], state["last_sum"]
        if rng is not None:
            size = torch.get_rng_state().numel()
            rng = check_tensor(owner, "torch_rng", rng, (size,), torch.uint8).clone()
        if last is not None:
            last = check_tensor(owner, "last_sum", last, (None,)).numpy().copy()
        try:
            relayed = bytes.fromhex(state["relayed"])
        except (TypeError, ValueError):
            relayed = None
        if relayed is None or len(relayed) not in (0, 32):
            raise CheckpointError(
                f"{owner}: `relayed` must be the hex of a 32-byte digest or empty, got "
                f"{state['relayed']!r:.80}."
            )
        self.round = None if state["round"] is None else int(state["round"])
        self.last_sum, self.relayed, self._torch_rng = last, relayed, rng

    def violation(self, problem: str, request: str | None = None) -> ProtocolViolation:
        r"""A :class:`ProtocolViolation` naming this client, ``request`` and the round."""
        round_ = "?" if self.round is None else self.round
        return ProtocolViolation(
            f"Client {self.client_id}, request {request!r}, round {round_}: {problem}"
        )

    # --- secure sums -------------------------------------------------------------
    @property
    def sum_contributors(self) -> int | None:
        r"""At most this many clients contribute to a secure sum (the session's clients)."""
        return getattr(self.secagg, "n_clients", None) or None

    @handles(SecureSumStep)
    def on_secagg(self, message: SecureSumStep) -> dict:
        if self.secagg is None:
            raise ProtocolViolation(f"Client {self.client_id} has no secure-aggregation role.")
        if message.request is None:  # a later step of the pending session
            if self._pending is None:
                raise ProtocolViolation(
                    f"Client {self.client_id}: secure-sum round without a vector."
                )
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
                return {"data": self.secagg.step(message.data, self._pending)}
        request = message.request
        # only a new session's opening frame: a later frame of an older session would let
        # that session's sum pass for this request's
        if parse_frame(message.data).round != 0:
            raise self.violation(
                "a request must come with the opening frame of a new secure session", request
            )
        if message.round is not None:
            self.round = message.round
        (_, arguments), method = self.CONTRIBUTIONS[request]
        if arguments is None and message.args:
            raise self.violation(
                f"the request takes no arguments, got {sorted(message.args)}", request
            )
        try:
            args = {} if arguments is None else arguments.decode(message.args or {}, self).payload()
        except Refused as exc:
            raise self.violation(exc.describe(), request) from None
        # the client decides the encoding: under raw floats whether a vector fits would
        # depend on private values
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
            # only a forged sum can push a vector past 2^high; refusing would tell the
            # server a bit of private data, so it is saturated (and logged)
            limit = np.nextafter(2.0**self._encoding.high, 0.0)
            if np.abs(vector).max(initial=0.0) > limit:
                problem = f"a vector exceeded the encoding's range 2^{high} and was saturated"
                _LOG.warning(
                    "%s (only a forged sum can cause this)", self.violation(problem, request)
                )
                vector = np.clip(vector, -limit, limit)
        self._pending = self._encoding.encode(vector) if self._encoding else vector
        self._request, self._length, self.last_sum = request, vector.size, None
        # the session binds everything this client was told, this opening's fields too
        fields = {k: v for k, v in message.wire().items() if k != "data"}
        self.relayed = transcript = relayed_digest(self.relayed, SECAGG, fields)
        if hasattr(self.secagg, "input_bound"):  # what every contributor sends at most
            self.secagg.input_bound = self.sum_bound(request)
        with self.timed("secure_aggregation"):
            return {"data": self.secagg.step(message.data, self._pending, transcript=transcript)}

    def sum_encoding(self, request: str) -> int:
        r"""``high`` of the limb encoding this client sends ``request`` vectors in (exact to
        ``2^-40`` below ``2^high``), or 0 for raw float64; the client decides, not the server."""
        return 64

    def sum_bound(self, request: str) -> float | None:
        r"""The largest ``|x|`` of any contributor's encoded ``request`` vector (``None``:
        raw values); CKKS narrows its integrity check to it."""
        high = self.sum_encoding(request)
        return float(limb_encoding(high).max_limb()) if high else None

    @handles(SecureSumResult)
    def on_secagg_result(self, message: SecureSumResult) -> dict:
        r"""Accept the sum of the pending session only (a replay is refused)."""
        payload, request = message.payload(), self._request
        if self._pending is None or request is None:  # last_sum stays as it was
            raise self.violation(
                "a secure-sum result arrived with no session pending (replayed or forged)"
            )
        # what the server forwards is part of what the next session binds
        self.relayed = relayed_digest(self.relayed, SUM_RESULT, payload)
        try:
            self.last_sum = None
            total = self._received_sum(payload, request)
            # and the sum accepted: clients holding different sums part ways
            self.relayed = relayed_digest(self.relayed, "accepted", {"sum": total})
            self.last_sum = total
            return self.sum_received(request, total) or {}
        except (ValueError, ProtocolViolation) as exc:
            self.last_sum = None
            if isinstance(exc, ProtocolViolation):
                raise
            raise self.violation(f"the sum does not decode ({exc})", request) from exc
        finally:  # done, or abandoned: a replay of this result is refused
            self._pending = self._request = None

    def _sums_stay_on_clients(self) -> bool:
        r"""Whether only the clients learn sums (CKKS released to clients holding the key)."""
        backend = getattr(self.secagg, "backend", None)
        return getattr(backend, "release", None) == "clients" and bool(
            getattr(self.secagg, "can_decrypt", False)
        )

    def _received_sum(self, payload: dict, request: str) -> np.ndarray:
        r"""The session's sum: this client's own decryption if any (the server's copy must
        agree), else the server's; checked against what honest contributors produce."""
        own = getattr(self.secagg, "result", None)
        stays = self._sums_stay_on_clients()
        if stays and "sum" in payload:
            raise self.violation(
                "the server supplied a sum, but under this backend sums stay on the clients "
                "(the server cannot decrypt); refusing it",
                request,
            )
        if own is not None:
            total = np.array(own, dtype=np.float64)
            if self._encoding is not None:
                peak = float(np.abs(np.round(total)).max(initial=0.0))
                bound = (self.sum_contributors or 1) * self._encoding.max_limb()
                if not peak <= bound and not stays:
                    raise self.violation(
                        f"a limb sum of {peak:.6g} exceeds {bound} ({self.sum_contributors} "
                        "contributors x the largest limb): not a sum of honest inputs",
                        request,
                    )
                if not peak <= bound:  # the server never sees it: a refusal would leak a bit
                    problem = "a limb sum beyond what honest contributors produce was clamped"
                    _LOG.warning("%s (a forged sum)", self.violation(problem, request))
                    total = np.clip(np.nan_to_num(total), -bound, bound)
                total = self._encoding.decode(total)
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
        r"""Hook: a sum of ``request`` vectors is now in ``last_sum``; may return a reply."""
        return None


FederatedClient.HANDLERS = handler_table(FederatedClient)
