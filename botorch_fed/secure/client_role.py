r"""The client side of a secure-aggregation backend: :class:`ClientRole`, which holds
the client's keys and input, checks the server's frames and answers each round (the
protocol is described in :mod:`botorch_fed.secure.base`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING

import numpy as np

from botorch_fed.secure.crypto import RandomSource, channel_key, x25519_keypair, x25519_shared
from botorch_fed.secure.errors import (
    HeadroomError,
    InputError,
    ProtocolError,
    SecureAggregationError,
    TamperedMessageError,
    TooFewClientsError,
)
from botorch_fed.secure.validation import error_context, validate_client_ids, validate_length
from botorch_fed.secure.wire import (
    CLIENT_TO_SERVER,
    SERVER_TO_CLIENT,
    Frame,
    PayloadReader,
    parse_frame,
    seal_frame,
)

if TYPE_CHECKING:
    from botorch_fed.secure.base import SecureAggregationBackend

__all__ = ["ClientRole", "opening_client_ids"]


def opening_client_ids(msg: bytes) -> tuple[int, ...]:
    """The client list a session's opening frame (round 0) announces, read without joining
    it (the protocol above may refuse a session by its clients before any input is read).

    Raises:
        SecureAggregationError: Not a well-formed opening frame (naming what is wrong).
    """
    frame = parse_frame(msg)
    if frame.round != 0:
        raise ProtocolError(f"not an opening frame: round {frame.round}")
    reader = PayloadReader(frame.verify(None))
    reader.raw(32)  # the server's key
    reader.u32()  # the number of clients
    reader.u32()  # the length
    return reader.ids()


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

    def use_key(self, key: bytes) -> None:
        """Draw this role's randomness from ``key``'s ChaCha20 stream
        (:meth:`RandomSource.keyed`) from now on: secret, and drawn again by a role of
        the same key restored to :meth:`saved_state` (a restarted party)."""
        self._rand = RandomSource.keyed(key, 1, self.client_id)

    def saved_state(self) -> dict:
        """What this role keeps between sessions, for a restarted party: the sessions it
        joined (it joins none twice) and the state of its randomness (``None``: OS
        randomness, which cannot be saved). JSON-able."""
        return {"rng": self._rand.get_state(), "joined": sorted(s.hex() for s in self._joined)}

    def restore_state(self, state: dict) -> None:
        """Restore :meth:`saved_state` into a fresh role of the same key material.

        Raises:
            InputError: ``state`` is not one, or holds a random state this role (seeded
                differently, or drawing from the OS) cannot take.
        """
        try:
            joined = {bytes.fromhex(s) for s in state["joined"]}
            rng = state["rng"]
        except (TypeError, KeyError, ValueError) as exc:
            raise InputError(f"not a saved client-role state ({exc})") from None
        if rng is not None:
            self._rand.set_state(rng)
        self._joined = joined

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
