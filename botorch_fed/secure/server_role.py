r"""The server side of a secure-aggregation backend: :class:`ServerRole`, which opens
sessions, authenticates the clients' frames, routes the round messages and computes
the aggregate (the protocol is described in :mod:`botorch_fed.secure.base`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

import numpy as np

from botorch_fed.secure.crypto import RandomSource, channel_key, x25519_keypair, x25519_shared
from botorch_fed.secure.errors import (
    DropoutError,
    ProtocolError,
    SecureAggregationError,
    TamperedMessageError,
    TooFewClientsError,
)
from botorch_fed.secure.validation import error_context, validate_client_ids, validate_length
from botorch_fed.secure.wire import (
    CLIENT_TO_SERVER,
    SERVER_TO_CLIENT,
    PayloadWriter,
    parse_frame,
    seal_frame,
)

if TYPE_CHECKING:
    from botorch_fed.secure.base import SecureAggregationBackend

__all__ = ["ServerRole"]


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

    def use_key(self, key: bytes) -> None:
        """Draw this role's randomness from ``key``'s ChaCha20 stream
        (:meth:`~botorch_fed.secure.crypto.RandomSource.keyed`) from now on."""
        self._rand = RandomSource.keyed(key, 0)

    def random_state(self) -> dict | None:
        """The state of a seeded role's randomness between sessions (session ids and
        channel keys), ``None`` for OS randomness: a server resumed from it opens the
        same sessions as before."""
        return self._rand.get_state()

    def restore_random_state(self, state: dict) -> None:
        """Restore :meth:`random_state` (a seeded role only; ``InputError`` otherwise)."""
        self._rand.set_state(state)

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

    def committed_nonces(self) -> dict[int, bytes]:
        """``{client: nonce}`` the clients committed to for their next session, where the
        backend has such commitments (``ckks``), to save with the server's state."""
        return {}

    def restore_committed_nonces(self, commitments: dict[int, bytes]) -> None:
        """Restore :meth:`commitments` (a resumed server); ``{}`` only, here."""
        if commitments:
            raise ProtocolError(f"backend {self.backend.name!r} takes no committed nonces")

    def last_round_unanswered(self) -> bool:
        """Whether the messages :meth:`step` just returned are the session's last and
        their replies hold nothing for the server (it may :meth:`finish_unanswered`)."""
        return False

    def finish_unanswered(self) -> None:
        """End the session without the replies of its last round (see
        :meth:`last_round_unanswered`): the clients hold the sum once they answer it."""
        if not self.last_round_unanswered():
            raise ProtocolError("the session's last round is not one whose replies are empty")
        self._finished = True
        self._awaiting = frozenset()

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
