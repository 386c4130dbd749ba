r"""Round-based, transport-agnostic interface of the secure-aggregation backends.

A backend computes ``sum_i x_i`` over clients' float64 vectors ``x_i`` (``length``)
so that the server learns at most the sum. It is a conversation in rounds in which
every message is ``bytes`` (so the same objects run in one process, see
:mod:`botorch_fed.secure.driver`, or over a network such as Flower):

.. code-block:: text

    server.start(client_ids, length)   -> {cid: bytes}                      round 0
    client.step(msg, x)                -> bytes            (each addressed client)
    server.step({cid: reply})          -> {cid: bytes}                      next round
                                        | np.ndarray       the sum, learnt by the server
                                        | None             done; the sum is held by the
                                                           clients (``client.result``)

A client that does not answer a round has dropped out (the server records it in
``dropped``). The client and server roles are separate objects: client state (keys,
secret shares, the input) lives only in :class:`ClientRole` objects, and the
:class:`ServerRole` only ever sees the bytes it is handed. Key material that must
exist before a session (the CKKS key holder's keys) is produced client-side by
:meth:`SecureAggregationBackend.setup`; only ``BackendSetup.server_material`` may be
given to the server, the client material is distributed out of band.

Every frame is bound to its session, round, client and direction and is
authenticated (see :mod:`botorch_fed.secure.wire`): the first server message of a
session carries an ephemeral X25519 public key, every client answers with its own,
and all later frames in both directions carry an HMAC-SHA256 tag over header and
payload under the per-client channel key. This authenticates against
third parties on the network (not against an active man in the middle of the very
first exchange; there is no PKI), not against the server, which holds every channel
key. A role abandons its session on any error (fail closed): after a malformed,
misrouted or unauthenticated frame, even a genuine frame of that session is refused.

Every backend enforces a minimum number of contributors (default 3; a sum over two
clients reveals each one's input to the other): the server refuses to start or
finish with fewer, and a client refuses a session that announces fewer.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

from botorch_fed.secure.crypto import (
    RandomSource,
    channel_key,
    x25519_keypair,
    x25519_shared,
)
from botorch_fed.secure.errors import (
    ConfigurationError,
    DropoutError,
    HeadroomError,
    InputError,
    ProtocolError,
    SecureAggregationError,
    TamperedMessageError,
    TooFewClientsError,
)
from botorch_fed.secure.validation import (
    error_context,
    validate_client_ids,
    validate_length,
)
from botorch_fed.secure.wire import (
    CLIENT_TO_SERVER,
    SERVER_TO_CLIENT,
    Frame,
    PayloadReader,
    PayloadWriter,
    parse_frame,
    seal_frame,
)

__all__ = [
    "STAGES",
    "BackendSetup",
    "ClientRole",
    "RoundSpec",
    "SecureAggregationBackend",
    "ServerRole",
]

STAGES = ("client_encode", "server_aggregate", "decrypt_unmask")


@dataclass(frozen=True)
class RoundSpec:
    """Name of a protocol round and the timing stage each side's work belongs to.

    Attributes:
        name: Round name used in errors and statistics.
        client_stage: Stage of the clients' work answering this round (one of
            :data:`STAGES`).
        server_stage: Stage of the server's work on the replies of this round.
    """

    name: str
    client_stage: str
    server_stage: str


@dataclass(frozen=True)
class BackendSetup:
    """Key material produced client-side before a session.

    Attributes:
        server_material: Public material for the server role (e.g. a CKKS public
            context); empty for backends that need none.
        client_material: Per-client secret material, distributed out of band (never
            through the server).
    """

    server_material: bytes = b""
    client_material: Mapping[int, bytes] = field(default_factory=dict)

    def for_client(self, client_id: int) -> bytes:
        """Material for ``client_id`` (empty if the backend needs none)."""
        return self.client_material.get(client_id, b"")


class SecureAggregationBackend(ABC):
    """A secure-aggregation protocol: a factory for its server and client roles.

    Args:
        min_clients: Minimum number of contributors to a sum (default 3).
        allow_two_clients: Must be True to set ``min_clients=2``: with two
            contributors each learns the other's input from the sum.
    """

    name: ClassVar[str]
    code: ClassVar[int]
    rounds: ClassVar[tuple[RoundSpec, ...]]

    def __init__(self, *, min_clients: int = 3, allow_two_clients: bool = False) -> None:
        if not isinstance(allow_two_clients, bool):
            raise ConfigurationError(
                f"option 'allow_two_clients' must be True or False, got {allow_two_clients!r}"
            )
        if isinstance(min_clients, bool) or not isinstance(min_clients, int):
            raise ConfigurationError(
                f"option 'min_clients' must be an int >= 3 (>= 2 with "
                f"allow_two_clients=True), got {min_clients!r}"
            )
        if min_clients < 2:
            raise ConfigurationError(
                f"option 'min_clients' must be >= 2 (a 'sum' of one input is that "
                f"input), got {min_clients}"
            )
        if min_clients == 2 and not allow_two_clients:
            raise ConfigurationError(
                "option 'min_clients'=2 lets each of two contributors recover the "
                "other's input from the sum; pass allow_two_clients=True to accept "
                "that, or use min_clients >= 3"
            )
        self.min_clients = min_clients
        self.allow_two_clients = allow_two_clients

    @property
    def options(self) -> dict[str, object]:
        """The options this backend was created with (JSON-friendly)."""
        return {"min_clients": self.min_clients, "allow_two_clients": self.allow_two_clients}

    def __repr__(self) -> str:
        opts = ", ".join(f"{k}={v!r}" for k, v in self.options.items())
        return f"{type(self).__name__}({opts})"

    def round_name(self, round: int) -> str:
        """Name of round ``round`` (for messages and statistics)."""
        return self.rounds[round].name if 0 <= round < len(self.rounds) else "?"

    def setup(self, client_ids: Iterable[int], *, seed: int | None = None) -> BackendSetup:
        """Produce the key material a session needs before it starts (client-side).

        Args:
            client_ids: The clients of the federation.
            seed: Seed for reproducible key material (tests only), or None.

        Returns:
            The material; the default backend needs none.
        """
        ids = validate_client_ids(client_ids)
        return BackendSetup(b"", {cid: b"" for cid in ids})

    @abstractmethod
    def server(self, material: bytes = b"", *, seed: int | None = None) -> ServerRole:
        """Create the server role.

        Args:
            material: ``BackendSetup.server_material`` (public only).
            seed: Seed for the session ids / ephemeral keys (tests only), or None.
        """

    @abstractmethod
    def client(
        self, client_id: int, material: bytes = b"", *, seed: int | None = None
    ) -> ClientRole:
        """Create the role of client ``client_id``.

        Args:
            client_id: This client's id.
            material: ``BackendSetup.for_client(client_id)``, received out of band.
            seed: Seed for this client's key material (tests only), or None.
        """

    @abstractmethod
    def max_abs_supported(self, n_clients: int) -> float:
        """Largest ``max|x_i|`` each of ``n_clients`` inputs may have.

        Beyond it the sum could overflow (wrap around) or, for approximate encodings
        (CKKS), miss the backend's accuracy promise; clients raise HeadroomError.
        """


class ServerRole(ABC):
    """The server side of a backend: routes messages and computes the aggregate.

    Args:
        backend: The backend that created it.
        seed: Seed for session ids and ephemeral keys (tests only), or None.
    """

    def __init__(self, backend: SecureAggregationBackend, *, seed: int | None = None):
        self.backend = backend
        self._rand = RandomSource(seed, 0)
        self._session: bytes | None = None
        self._finished = False
        self._round = -1
        self._awaiting: frozenset[int] = frozenset()
        self._channel_keys: dict[int, bytes] = {}
        self._dropped: dict[int, int] = {}
        self._contributors: tuple[int, ...] = ()
        self.client_ids: tuple[int, ...] = ()
        self.length = 0

    @property
    def session_id(self) -> bytes | None:
        """The current session id (16 bytes), None before :meth:`start`."""
        return self._session

    @property
    def round(self) -> int:
        """Index of the round whose replies the server is waiting for."""
        return self._round

    @property
    def finished(self) -> bool:
        """Whether the current session produced its result."""
        return self._finished

    @property
    def dropped(self) -> dict[int, int]:
        """``{client id: round}`` of the clients that did not answer that round."""
        return dict(self._dropped)

    @property
    def contributors(self) -> tuple[int, ...]:
        """The clients whose inputs are in the sum (known once finished)."""
        return self._contributors

    def start(self, client_ids: Iterable[int], length: int) -> dict[int, bytes]:
        """Start a new session.

        Args:
            client_ids: The clients asked to contribute.
            length: Length of every input vector.

        Returns:
            The round-0 message of every client.

        Raises:
            TooFewClientsError: Fewer than ``min_clients`` clients.
            InputError: Invalid ids or length.
        """
        ids = validate_client_ids(client_ids)
        if len(ids) < self.backend.min_clients:
            raise TooFewClientsError(
                f"{len(ids)} clients {list(ids)} is fewer than min_clients="
                f"{self.backend.min_clients}",
                round=0,
                round_name=self.backend.round_name(0),
            )
        self.length = validate_length(length)
        self.client_ids = ids
        self._session = self._rand.bytes(16)
        self._finished = False
        self._round = 0
        self._channel_keys = {}
        self._dropped = {}
        self._contributors = ()
        self._channel_private, server_pk = x25519_keypair(self._rand)
        with error_context(None, 0, self.backend.round_name(0)):
            tails = self._begin()
        common = PayloadWriter().raw(server_pk).u32(len(ids)).u32(self.length).ids(ids)
        common_bytes = common.getvalue()
        self._awaiting = frozenset(ids)
        return {cid: self._seal(cid, common_bytes + tails.get(cid, b""), None) for cid in ids}

    def step(self, replies: Mapping[int, bytes]) -> dict[int, bytes] | np.ndarray | None:
        """Process the replies to the current round.

        Args:
            replies: ``{client id: reply bytes}``; clients that were asked and do not
                appear have dropped out.

        Returns:
            The next round's messages, the sum ``length`` (backends where the server
            learns it), or None when the sum is held by the clients only.

        Raises:
            ProtocolError, TamperedMessageError, DropoutError: See
                :mod:`botorch_fed.secure.errors`. After any error the session is
                abandoned (fail closed); call :meth:`start` for a new one.
        """
        rnd = self._round
        name = self.backend.round_name(rnd)
        if self._session is None or self._finished:
            raise ProtocolError("step() called with no session in progress; call start()")
        try:
            out = self._process(rnd, name, replies)
        except SecureAggregationError:
            self._session = None  # fail closed: the session is abandoned
            raise
        if isinstance(out, dict):
            self._round += 1
            self._awaiting = frozenset(out)
            return {
                cid: self._seal(cid, payload, self._channel_keys[cid])
                for cid, payload in out.items()
            }
        self._finished = True
        self._awaiting = frozenset()
        return out

    def _process(
        self, rnd: int, name: str, replies: Mapping[int, bytes]
    ) -> dict[int, bytes] | np.ndarray | None:
        if not isinstance(replies, Mapping):
            raise ProtocolError(f"replies must be a mapping, got {type(replies).__name__}")
        for cid in replies:
            if cid not in self._awaiting:
                raise ProtocolError(
                    "reply from a client that was not asked in this round",
                    client_id=cid,
                    round=rnd,
                    round_name=name,
                )
        payloads: dict[int, bytes] = {}
        for cid in sorted(replies):
            with error_context(cid, rnd, name):
                payloads[cid] = self._open(cid, replies[cid])
        for cid in self._awaiting - set(replies):
            self._dropped.setdefault(cid, rnd)
        with error_context(None, rnd, name):
            return self._handle(rnd, payloads)

    def _seal(self, cid: int, payload: bytes, key: bytes | None) -> bytes:
        assert self._session is not None
        return seal_frame(
            backend=self.backend.code,
            direction=SERVER_TO_CLIENT,
            round=self._round,
            session=self._session,
            client_id=cid,
            payload=payload,
            key=key,
        )

    def _open(self, cid: int, data: bytes) -> bytes:
        frame = parse_frame(data)
        frame.expect(
            backend=self.backend.code,
            direction=CLIENT_TO_SERVER,
            round=self._round,
            client_id=cid,
            session=self._session,
        )
        if self._round == 0:
            if len(frame.payload) < 32:
                raise TamperedMessageError("round-0 reply too short for a channel key")
            shared = x25519_shared(self._channel_private, frame.payload[:32])
            key = channel_key(shared, frame.session, cid)
            payload = frame.verify(key)[32:]
            self._channel_keys[cid] = key
            return payload
        return frame.verify(self._channel_keys[cid])

    def _begin(self) -> dict[int, bytes]:
        """Backend-specific part of the round-0 message of each client."""
        return {}

    @abstractmethod
    def _handle(
        self, round: int, payloads: dict[int, bytes]
    ) -> dict[int, bytes] | np.ndarray | None:
        """Process authenticated reply payloads of round ``round``."""

    def _require(self, ids: Iterable[int], need: int, what: str) -> tuple[int, ...]:
        """Check that at least ``need`` clients survived, else raise DropoutError."""
        ids = tuple(sorted(ids))
        if len(ids) < need:
            dropped = sorted(set(self.client_ids) - set(ids))
            raise DropoutError(
                f"only {len(ids)} clients {list(ids)} {what}, {need} needed (dropped: {dropped})"
            )
        return ids


def _checked_transcript(transcript: object) -> bytes:
    if transcript is None:
        return b""
    if not isinstance(transcript, bytes):
        raise InputError(
            f"`transcript` must be a 32-byte digest or None, got {type(transcript).__name__}"
        )
    if len(transcript) != 32:
        raise InputError(f"`transcript` must be a 32-byte digest, got {len(transcript)} bytes")
    return transcript


class ClientRole(ABC):
    """The client side of a backend: holds the client's keys and answers rounds.

    Args:
        backend: The backend that created it.
        client_id: This client's id.
        seed: Seed for this client's key material (tests only), or None.
    """

    def __init__(
        self, backend: SecureAggregationBackend, client_id: int, *, seed: int | None = None
    ) -> None:
        (self.client_id,) = validate_client_ids([client_id])
        self.backend = backend
        self._rand = RandomSource(seed, 1, self.client_id)
        self._session: bytes | None = None
        self._round = -1
        self._key: bytes | None = None
        self.n_clients = 0
        self.length = 0
        self.client_ids: tuple[int, ...] = ()
        self.result: np.ndarray | None = None
        """The sum, where the backend delivers it to the clients (else None)."""
        self._joined: set[bytes] = set()  # session ids this role has joined (never twice)
        self._transcript = b""  # of the current session (see ``step``)

    @property
    def session_id(self) -> bytes | None:
        """The current session id, None before the first message."""
        return self._session

    def federation_secret(self) -> bytes | None:
        """A 32-byte secret that every client of the federation holds and the server
        does not, or None where the backend has none.

        It comes from the client's key material (never from a session, so it is the
        same in every session and after a resume from a checkpoint) and is derived
        under its own HKDF label, so using it reveals nothing about the keys it comes
        from. Algorithms use it for randomness that all clients must share and the
        server must not predict (e.g. the seed of FBO-FedGP's shared global search).
        ``ckks``: derived from the group key; ``masking``: derived from the federation
        key of :meth:`MaskingBackend.setup
        <botorch_fed.secure.masking.MaskingBackend.setup>`; ``plaintext``: None (no
        secret exists, so there is no such protection).
        """
        return None

    def step(
        self, msg: bytes, x: np.ndarray | None = None, *, transcript: bytes | None = None
    ) -> bytes:
        """Answer one server message.

        Args:
            msg: The message bytes from the server.
            x: This client's input vector ``length`` (float64-convertible); only read
                in the round(s) where the backend encodes it, may be None otherwise.
            transcript: A 32-byte digest of what this client was told besides the
                session (e.g. the federation values the server relayed to it) that
                every contributor must have been told identically, or None (nothing).
                Read with the session's opening frame only (round 0). Under ``masking``
                it is covered by the key round's and the consistency round's tags and
                under ``ckks`` by the guard canaries, so a session whose contributors
                hold different transcripts yields no sum (``KeyMismatchError`` before
                any masked input is sent, or ``TamperedMessageError`` at decryption);
                ``plaintext`` ignores it.

        Returns:
            The reply bytes.

        Raises:
            InputError, HeadroomError, ProtocolError, TamperedMessageError,
            TooFewClientsError: See :mod:`botorch_fed.secure.errors`.
        """
        expected = self._round + 1 if self._session is not None else 0
        with error_context(self.client_id, expected, self.backend.round_name(expected)):
            try:
                frame = parse_frame(msg)
            except SecureAggregationError:
                self._session = None  # fail closed, as for any other integrity error
                self.result = None
                raise
        if frame.round == 0:
            rnd = 0
            with error_context(self.client_id, 0, self.backend.round_name(0)):
                try:
                    self._transcript = b""
                    self._transcript = _checked_transcript(transcript)
                    reply = self._start_session(frame, x)
                except SecureAggregationError:
                    self._session = None  # fail closed: any session in progress ends
                    self.result = None
                    raise
        else:
            rnd = expected
            with error_context(self.client_id, rnd, self.backend.round_name(rnd)):
                if self._session is None:
                    self.result = None
                    raise ProtocolError("message for a session this client never joined")
                try:
                    frame.expect(
                        backend=self.backend.code,
                        direction=SERVER_TO_CLIENT,
                        round=rnd,
                        client_id=self.client_id,
                        session=self._session,
                    )
                    payload = frame.verify(self._key)
                    self._round = rnd
                    reply = self._handle(rnd, PayloadReader(payload), x)
                except SecureAggregationError:
                    # fail closed: a frame that is not the expected authentic one ends
                    # the session; a genuine frame arriving afterwards is refused
                    self._session = None
                    self.result = None
                    raise
        assert self._session is not None
        return seal_frame(
            backend=self.backend.code,
            direction=CLIENT_TO_SERVER,
            round=rnd,
            session=self._session,
            client_id=self.client_id,
            payload=reply,
            key=self._key,
        )

    def _start_session(self, frame: Frame, x: np.ndarray | None) -> bytes:
        self.result = None  # whatever happens next, no earlier sum stays readable
        if frame.session in self._joined:
            raise ProtocolError(
                f"session id {frame.session.hex()} was used before; a server that reuses "
                "session ids could replay messages of the earlier session; refusing"
            )
        # joined from its first frame on: if this one fails a check, a later "genuine"
        # opening frame of the same session is refused too (fail closed)
        self._joined.add(frame.session)
        frame.expect(
            backend=self.backend.code,
            direction=SERVER_TO_CLIENT,
            round=0,
            client_id=self.client_id,
            session=None,
        )
        reader = PayloadReader(frame.verify(None))
        server_pk = reader.raw(32)
        n_clients = reader.u32()
        length = reader.u32()
        ids = reader.ids()
        if len(ids) != n_clients or list(ids) != sorted(set(ids)):
            raise TamperedMessageError("inconsistent client list in the session header")
        if self.client_id not in ids:
            raise ProtocolError(f"client is not in the session's client list {list(ids)}")
        if n_clients < self.backend.min_clients:
            raise TooFewClientsError(
                f"session announces {n_clients} clients, fewer than this client's "
                f"min_clients={self.backend.min_clients}; refusing to contribute"
            )
        self.length = validate_length(length)
        self.n_clients = n_clients
        self.client_ids = ids
        self._session = None
        self.result = None
        channel_private, client_pk = x25519_keypair(self._rand)
        self._key = channel_key(
            x25519_shared(channel_private, server_pk), frame.session, self.client_id
        )
        self._session = frame.session
        self._round = 0
        try:
            tail = self._begin(reader, x)
        except SecureAggregationError:
            self._session = None
            raise
        return client_pk + tail

    @abstractmethod
    def _begin(self, reader: PayloadReader, x: np.ndarray | None) -> bytes:
        """Read the backend part of the round-0 message; return the reply payload."""

    def _handle(self, round: int, reader: PayloadReader, x: np.ndarray | None) -> bytes:
        """Answer round ``round >= 1`` (backends with a single round need not)."""
        raise ProtocolError(f"backend {self.backend.name!r} has no round {round}")

    def checked_input(
        self, x: object, max_abs: float, *, reason: str = "the sum would wrap around"
    ) -> np.ndarray:
        """Validate this client's input for the current session.

        Args:
            x: The input, ``length``, real-valued.
            max_abs: Largest supported ``max|x|`` (headroom of the encoding).
            reason: Why larger inputs are refused (for the HeadroomError message).

        Returns:
            A float64 copy ``length``.

        Raises:
            InputError: Not 1-D real, wrong length, NaN or inf.
            HeadroomError: ``max|x| > max_abs``.
        """
        if x is None:
            raise InputError("this round needs the client's input vector, got None")
        arr = np.asarray(x)
        if arr.dtype.kind not in "fiu":
            raise InputError(f"input must be real-valued, got dtype {arr.dtype}")
        if arr.ndim != 1:
            raise InputError(f"input must be 1-D ``length``, got shape {arr.shape}")
        if arr.shape[0] != self.length:
            raise InputError(f"input has length {arr.shape[0]}, the session expects {self.length}")
        arr = arr.astype(np.float64)
        finite = np.isfinite(arr)
        if not finite.all():
            bad = int(np.flatnonzero(~finite)[0])
            raise InputError(f"input contains NaN/inf (first at index {bad}: {arr[bad]})")
        peak = float(np.max(np.abs(arr)))
        if peak > max_abs:
            raise HeadroomError(
                f"max|x| = {peak:.6g} exceeds {max_abs:.6g}, the largest magnitude the "
                f"{self.backend.name} encoding supports for {self.n_clients} clients "
                f"({reason}); rescale the inputs"
            )
        return arr
