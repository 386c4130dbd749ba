r"""Server and client roles of the federation protocol.

A :class:`FederatedClient` owns its private state (data, local model, keys) and
answers messages by type: ``handle(Message("fit", ...))`` calls ``on_fit(payload)``.
A :class:`FederatedServer` drives the rounds through a
:class:`~botorch_fed.federation.transport.Transport` and never touches client
objects.

Secure sums are a sub-protocol both roles share (:meth:`FederatedServer.secure_sum`):
the server starts a session of a ``botorch_fed.secure`` backend and relays its
bytes; the first message of the session also names the vector the clients should
contribute (``request``), which each client computes with ``vector_<request>``.
Depending on the backend the sum ends on the server (plaintext, masking) or only on
the clients (CKKS: the server cannot decrypt). :meth:`FederatedServer.secure_sum`
then tells every client the outcome, so that afterwards every client holds the sum
in :attr:`FederatedClient.last_sum` and the server knows it only if the backend
revealed it to the server.

The server is not trusted with results: a client accepts one only for the session it
contributed to, prefers its own decryption (under CKKS with ``release="clients"`` it
refuses any sum the server supplies), checks the length and the limb sums against
what honest contributors can produce, and turns a result that does not decode into a
:class:`ProtocolViolation` naming the client, the request and the round.
"""

from __future__ import annotations

import hashlib
import logging
import struct
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager

import numpy as np
import torch

from botorch_fed.federation.checkpoint import CheckpointError, check_tensor, expect_keys
from botorch_fed.federation.ledger import Ledger
from botorch_fed.federation.messages import TIME_PREFIX, Message
from botorch_fed.federation.transport import Transport
from botorch_fed.secure.errors import InputError, SecureAggregationError
from botorch_fed.secure.limbs import LimbEncoding
from botorch_fed.secure.wire import parse_frame

_LOG = logging.getLogger(__name__)

SECAGG = "secagg"
SUM_RESULT = "secagg_result"


def limb_encoding(high: int) -> LimbEncoding:
    r"""The limb encoding for values below ``2^high`` (resolution ``2^-40``)."""
    return LimbEncoding(bits=12, low=-40, high=int(high))


class ProtocolViolation(RuntimeError):
    r"""A party received a message it cannot handle in its current state."""


def relayed_digest(previous: bytes, type: str, payload: Mapping) -> bytes:
    r"""``previous`` chained with one relayed message (SHA-256 of a canonical encoding).

    The encoding is exact and unambiguous: keys sorted; each value tagged with its kind
    (bool, int, float, str, bytes, array), arrays with their kind, shape and values as
    little-endian int64 / float64 / bool bytes, so two payloads get the same digest iff
    they hold the same values.

    Raises:
        TypeError: A value that is not a payload value (naming its key).
    """
    h = hashlib.sha256(b"botorch-fed/relayed\x00" + previous)
    h.update(_field(type.encode()))
    for key in sorted(payload):
        h.update(_field(key.encode()) + _value(key, payload[key]))
    return h.digest()


def _field(data: bytes) -> bytes:
    return struct.pack("<Q", len(data)) + data


def _value(key: str, value: object) -> bytes:
    if isinstance(value, bool | np.bool_):
        return b"b" + _field(b"\x01" if value else b"\x00")
    if isinstance(value, int | np.integer):
        return b"i" + _field(str(int(value)).encode())
    if isinstance(value, float | np.floating):
        return b"f" + _field(struct.pack("<d", float(value)))
    if isinstance(value, str):
        return b"s" + _field(value.encode())
    if isinstance(value, bytes):
        return b"y" + _field(value)
    if isinstance(value, np.ndarray) and value.dtype.kind in "biuf":
        kind = {"b": "?", "i": "<i8", "u": "<i8", "f": "<f8"}[value.dtype.kind]
        if value.dtype.kind == "u" and value.size and value.max() >= 2**63:
            kind = "<u8"
        data = np.ascontiguousarray(value, dtype=kind).tobytes()
        shape = struct.pack(f"<{value.ndim}Q", *value.shape)
        return b"a" + _field(kind.encode()) + _field(shape) + _field(data)
    raise TypeError(f"Payload entry {key!r} of type {type(value).__name__} cannot be relayed.")


class FederatedClient:
    r"""Base class of a client: dispatches messages to ``on_<type>`` methods.

    What the server tells every client alike is bound into the next secure sum: each
    client chains the messages whose type is in :attr:`RELAYED` (the federation's
    values: support, hyperparameters, centres requests, rounds), each session's opening
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

    RELAYED: frozenset[str] = frozenset()
    r"""Message types the server sends every client identically (subclasses list
    theirs; messages meant for one client, such as its own query point, are not)."""

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
        handler = getattr(self, f"on_{message.type}", None)
        if handler is None:
            raise ProtocolViolation(
                f"Client {self.client_id} cannot handle messages of type {message.type!r}."
            )
        self._timings = {}
        if message.type in self.RELAYED:
            self.relayed = relayed_digest(self.relayed, message.type, message.payload)
        if self._torch_rng is None or self._handling:  # a nested call: already swapped
            payload = handler(message.payload) or {}
        else:
            with torch.random.fork_rng(devices=[]):
                torch.set_rng_state(self._torch_rng)
                self._handling = True
                try:
                    payload = handler(message.payload) or {}
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
        r"""Restore :meth:`state_dict` (subclasses restore theirs). A checkpoint from
        before the relayed digest existed restores an empty one; one from before the
        client's own torch stream keeps the stream as seeded (the resumed run is then
        not bit for bit the uninterrupted one)."""
        owner = f"Client {self.client_id}"
        if isinstance(state, Mapping) and "relayed" not in state:
            state = {**state, "relayed": ""}
        if isinstance(state, Mapping) and "torch_rng" not in state:
            state = {**state, "torch_rng": self._torch_rng}
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

    def on_secagg(self, payload: dict) -> dict:
        if self.secagg is None:
            raise ProtocolViolation(f"Client {self.client_id} has no secure-aggregation role.")
        if "request" in payload:  # first message of a session: compute the vector
            request = str(payload["request"])
            # a request opens a new secure session (its round-0 frame, which also clears
            # the backend's last sum): a later frame of an older session would let that
            # session's sum pass for this request's
            if parse_frame(bytes(payload["data"])).round != 0:
                raise self.violation(
                    "a request must come with the opening frame of a new secure session",
                    request,
                )
            if "round" in payload:
                self.round = int(payload["round"])
            compute = getattr(self, f"vector_{request}", None)
            if compute is None:
                raise ProtocolViolation(
                    f"Client {self.client_id} cannot contribute a {request!r} vector."
                )
            # the encoding is this client's, per request; the server's `wide` must agree
            # (a server choosing raw floats could make whether a vector fits depend on it)
            high = self.sum_encoding(request)
            wide = payload.get("wide")
            if isinstance(wide, bool) or not isinstance(wide, int | np.integer) or wide != high:
                raise self.violation(
                    f"the session asks for the encoding `wide`={wide!r}; this client sends "
                    f"{request!r} vectors with `wide`={high}",
                    request,
                )
            args = {k[len("arg:") :]: v for k, v in payload.items() if k.startswith("arg:")}
            vector = np.asarray(compute(**args), dtype=np.float64)
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
            opening = {k: v for k, v in payload.items() if k != "data"}
            self.relayed = transcript = relayed_digest(self.relayed, SECAGG, opening)
            if hasattr(self.secagg, "input_bound"):  # what every contributor sends at most
                self.secagg.input_bound = self.sum_bound(request)
            with self.timed("secure_aggregation"):
                data = self.secagg.step(
                    bytes(payload["data"]), self._pending, transcript=transcript
                )
            return {"data": data}
        if self._pending is None:
            raise ProtocolViolation(f"Client {self.client_id}: secure-sum round without a vector.")
        try:
            opening = parse_frame(bytes(payload["data"])).round == 0
        except (SecureAggregationError, KeyError, TypeError):
            opening = False  # the backend names what is wrong with it
        if opening:
            # a new session would take the last request's vector and bind no transcript
            self._pending = None
            raise self.violation(
                "the opening frame of a new secure session came without a request; refusing",
                self._request,
            )
        with self.timed("secure_aggregation"):
            data = self.secagg.step(bytes(payload["data"]), self._pending)
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

    def on_secagg_result(self, payload: dict) -> dict:
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
        r"""Hook: a secure sum of ``vector_<request>`` vectors is now in ``last_sum``.

        Subclasses act on it here (e.g. apply averaged hyperparameters) and may return
        a reply payload.
        """
        return None


class FederatedServer:
    r"""Base class of a server program.

    Args:
        transport: How messages reach the clients.
        secagg: The server role of a secure-aggregation backend (``None``: no secure
            sums).
    """

    def __init__(self, transport: Transport, secagg=None) -> None:
        self.transport = transport
        self.secagg = secagg

    # --- the round-based program ------------------------------------------------------
    def initialize(self) -> None:
        r"""Round 0: the clients evaluate their initial designs (subclasses add the
        algorithm's own set-up)."""
        self.broadcast("init")

    def state_dict(self) -> dict:
        r"""The server's state between rounds (subclasses add theirs): its ledger."""
        return {"ledger": self.ledger.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        r"""Restore :meth:`state_dict` (subclasses restore theirs)."""
        expect_keys("Server", state, ("ledger",))
        self.ledger.load_state_dict(state["ledger"])

    def run_round(self, t: int) -> None:
        r"""Round ``t >= 1`` of the algorithm."""
        raise NotImplementedError(f"{type(self).__name__} does not implement run_round.")

    def run(
        self, on_round: Callable[[int], None] | None = None, start_round: int | None = None
    ) -> None:
        r"""Run the initialisation (round 0) and rounds ``1 .. settings.num_rounds``.

        Args:
            on_round: Called with ``t`` after each round (0: initialisation).
            start_round: The last round already done: a resumed run continues after
                it (0: after the initialisation). ``None``: a fresh run.
        """
        if start_round is None:
            start_round = 0
            self.ledger.round = 0
            self.initialize()
            if on_round is not None:
                on_round(0)
        for t in range(start_round + 1, self.settings.num_rounds + 1):
            self.ledger.round = t
            self.run_round(t)
            if on_round is not None:
                on_round(t)

    @property
    def ledger(self) -> Ledger:
        return self.transport.ledger

    @property
    def client_ids(self) -> tuple[int, ...]:
        return self.transport.client_ids

    def broadcast(
        self, type: str, payload: dict | None = None, clients: Iterable[int] | None = None
    ) -> dict[int, Message]:
        r"""Send the same message to ``clients`` (default all); return the replies."""
        ids = self.client_ids if clients is None else tuple(clients)
        msg = Message(type, dict(payload or {}))
        return self.transport.send(dict.fromkeys(ids, msg))

    def send(self, messages: Mapping[int, Message]) -> dict[int, Message]:
        r"""Send individual messages; return the replies."""
        return self.transport.send(messages)

    def secure_sum(
        self,
        request: str,
        length: int,
        args: dict | None = None,
        clients: Iterable[int] | None = None,
        share: bool = True,
        wide: int = 64,
    ) -> np.ndarray | None:
        r"""Sum a vector over clients with the secure-aggregation backend.

        Args:
            request: Which vector the clients contribute (``vector_<request>``).
            length: Its length.
            args: Scalars/arrays passed to ``vector_<request>(**args)``.
            clients: Contributors (default all).
            share: Tell the clients the outcome so each holds the sum in
                ``last_sum`` (the server forwards it if it learnt it).
            wide: Send the vectors in the wide-range limb encoding
                (:class:`~botorch_fed.secure.limbs.LimbEncoding`): exact to ``2^-40``
                for any magnitude below ``2^wide``, at ``num_limbs`` times the length
                (0: raw float64 values). The clients decide the encoding of each
                request (:meth:`FederatedClient.sum_encoding`) and refuse a session
                that names another: this must be theirs.

        Returns:
            The sum if the backend reveals it to the server, else ``None`` (the
            clients hold it).
        """
        if self.secagg is None:
            raise ProtocolViolation("This server has no secure-aggregation backend.")
        ids = self.client_ids if clients is None else tuple(clients)
        first = {"request": request, **{f"arg:{k}": v for k, v in (args or {}).items()}}
        first["wide"] = int(wide)
        first["round"] = int(self.ledger.round)
        encoding = limb_encoding(wide) if wide else None
        with self.ledger.timer("secure_aggregation"):
            outgoing = self.secagg.start(
                ids, encoding.encoded_length(length) if encoding else length
            )
        extra = first
        while True:
            replies = self.send(
                {cid: Message(SECAGG, {"data": data, **extra}) for cid, data in outgoing.items()}
            )
            extra = {}
            with self.ledger.timer("secure_aggregation"):
                out = self.secagg.step({cid: r.payload["data"] for cid, r in replies.items()})
            if isinstance(out, dict):
                outgoing = out
                continue
            break
        result = out if isinstance(out, np.ndarray) else None
        if result is not None and encoding is not None:
            result = encoding.decode(result)
        if share:
            payload = {} if result is None else {"sum": result}
            self.broadcast(SUM_RESULT, payload, clients=self.secagg.contributors)
        return result
