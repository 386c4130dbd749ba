r"""Wire format shared by every secure-aggregation backend.

A message is a *frame*::

    header (34 bytes, big endian)                      payload         tag (32 bytes)
    magic "BFSA" | version u8 | backend u8 | direction u8 | tag kind u8 |
    round u16 | session id (16 bytes) | client id u32 | payload length u32

The header binds every frame to one session, one protocol round, one client and one
direction (server to client or client to server), so a replayed, stale or misrouted
frame is rejected (:class:`~botorch_fed.secure.errors.ProtocolError`). The tag is
HMAC-SHA256 over header and payload with the per-session channel key of that client
(see :func:`botorch_fed.secure.crypto.channel_key`); only the very first server
message of a session, sent before the channel key exists, carries a SHA-256 checksum
instead. A flipped, truncated or extended frame therefore fails with
:class:`~botorch_fed.secure.errors.TamperedMessageError`.

Payloads are written with :class:`PayloadWriter` and read with :class:`PayloadReader`,
a minimal length-checked binary codec (no pickling, nothing executable).
"""

from __future__ import annotations

import hashlib
import hmac
import struct
from dataclasses import dataclass

import numpy as np

from botorch_fed.secure.errors import ProtocolError, TamperedMessageError

__all__ = [
    "HEADER_SIZE",
    "MAGIC",
    "SERVER_TO_CLIENT",
    "CLIENT_TO_SERVER",
    "TAG_SIZE",
    "Frame",
    "PayloadReader",
    "PayloadWriter",
    "parse_frame",
    "seal_frame",
]

MAGIC = b"BFSA"
VERSION = 2  # 2: CKKS guard slots carry the data's tags (a party of version 1 cannot join)
SERVER_TO_CLIENT = 0
CLIENT_TO_SERVER = 1
_TAG_CHECKSUM = 0
_TAG_HMAC = 1
_HEADER = struct.Struct(">4sBBBBH16sII")
HEADER_SIZE = _HEADER.size
TAG_SIZE = 32
SESSION_ID_SIZE = 16
MAX_CLIENT_ID = 2**32 - 1
_DIRECTIONS = {SERVER_TO_CLIENT: "server-to-client", CLIENT_TO_SERVER: "client-to-server"}


@dataclass(frozen=True)
class Frame:
    """A parsed (not yet authenticated) frame.

    Attributes:
        backend: Wire code of the backend that wrote it.
        direction: ``SERVER_TO_CLIENT`` or ``CLIENT_TO_SERVER``.
        round: Protocol round index.
        session: 16-byte session id.
        client_id: The client the frame is addressed to / comes from.
        mac: True if the tag is an HMAC, False if it is a plain checksum.
        payload: The payload bytes.
        signed: Header and payload (the bytes the tag covers).
        tag: The 32-byte tag.
    """

    backend: int
    direction: int
    round: int
    session: bytes
    client_id: int
    mac: bool
    payload: bytes
    signed: bytes
    tag: bytes

    def expect(
        self,
        *,
        backend: int,
        direction: int,
        round: int,
        client_id: int,
        session: bytes | None,
    ) -> None:
        """Check the header against what the receiver expects.

        Args:
            backend: Expected backend wire code.
            direction: Expected direction.
            round: Expected round index.
            client_id: Expected client id.
            session: Expected session id, or None to accept any (a new session).

        Raises:
            ProtocolError: On any mismatch (replayed, stale or misrouted frame).
        """
        if self.backend != backend:
            raise ProtocolError(
                f"frame was written by backend code {self.backend}, expected {backend}"
            )
        if self.direction != direction:
            raise ProtocolError(
                f"frame travels {_DIRECTIONS.get(self.direction, self.direction)}, "
                f"expected {_DIRECTIONS[direction]}"
            )
        if session is not None and self.session != session:
            raise ProtocolError(
                f"frame belongs to session {self.session.hex()}, expected "
                f"{session.hex()} (replayed from another session or misrouted)"
            )
        if self.round != round:
            raise ProtocolError(
                f"frame is for round {self.round}, expected round {round} "
                "(replayed, stale or out of order)"
            )
        if self.client_id != client_id:
            raise ProtocolError(
                f"frame is addressed to/from client {self.client_id}, expected client {client_id}"
            )

    def verify(self, key: bytes | None) -> bytes:
        """Check the tag and return the payload.

        Args:
            key: The channel key (HMAC-SHA256), or None where only a checksum is
                possible (the first server message of a session).

        Returns:
            The authenticated payload.

        Raises:
            TamperedMessageError: If the tag does not match or has the wrong kind.
        """
        if key is None:
            if self.mac:
                raise TamperedMessageError("unexpected MAC tag on a checksum frame")
            expected = hashlib.sha256(self.signed).digest()
        else:
            if not self.mac:
                raise TamperedMessageError("frame carries only a checksum where a MAC is required")
            expected = hmac.digest(key, self.signed, "sha256")
        if not hmac.compare_digest(expected, self.tag):
            raise TamperedMessageError(
                "frame authentication failed (bytes altered in transit or wrong key)"
            )
        return self.payload


def seal_frame(
    *,
    backend: int,
    direction: int,
    round: int,
    session: bytes,
    client_id: int,
    payload: bytes,
    key: bytes | None,
) -> bytes:
    """Write a frame.

    Args:
        backend: Backend wire code.
        direction: ``SERVER_TO_CLIENT`` or ``CLIENT_TO_SERVER``.
        round: Protocol round index (``0 <= round < 2**16``).
        session: 16-byte session id.
        client_id: The addressee (server to client) or sender (client to server).
        payload: Payload bytes.
        key: Channel key for HMAC-SHA256, or None for a SHA-256 checksum.

    Returns:
        The frame bytes.
    """
    header = _HEADER.pack(
        MAGIC,
        VERSION,
        backend,
        direction,
        _TAG_CHECKSUM if key is None else _TAG_HMAC,
        round,
        session,
        client_id,
        len(payload),
    )
    signed = header + payload
    tag = hashlib.sha256(signed).digest() if key is None else hmac.digest(key, signed, "sha256")
    return signed + tag


def parse_frame(data: object) -> Frame:
    """Parse a frame's structure (the caller then checks the header and the tag).

    Args:
        data: The received bytes.

    Returns:
        The parsed :class:`Frame`.

    Raises:
        ProtocolError: If ``data`` is not bytes-like.
        TamperedMessageError: If the frame is truncated, extended or not a frame.
    """
    if not isinstance(data, bytes | bytearray | memoryview):
        raise ProtocolError(f"a message must be bytes, got {type(data).__name__}")
    data = bytes(data)
    if len(data) < HEADER_SIZE + TAG_SIZE:
        raise TamperedMessageError(
            f"truncated frame: {len(data)} bytes, a frame has at least {HEADER_SIZE + TAG_SIZE}"
        )
    (magic, version, backend, direction, tag_kind, rnd, session, cid, n) = _HEADER.unpack_from(data)
    if magic != MAGIC or version != VERSION:
        raise TamperedMessageError("not a botorch-fed secure-aggregation frame (bad magic/version)")
    if tag_kind not in (_TAG_CHECKSUM, _TAG_HMAC) or direction not in _DIRECTIONS:
        raise TamperedMessageError("corrupted frame header")
    if len(data) != HEADER_SIZE + n + TAG_SIZE:
        raise TamperedMessageError(
            f"frame length {len(data)} does not match its header "
            f"({HEADER_SIZE + n + TAG_SIZE}): truncated or extended"
        )
    return Frame(
        backend=backend,
        direction=direction,
        round=rnd,
        session=session,
        client_id=cid,
        mac=tag_kind == _TAG_HMAC,
        payload=data[HEADER_SIZE : HEADER_SIZE + n],
        signed=data[: HEADER_SIZE + n],
        tag=data[HEADER_SIZE + n :],
    )


class PayloadWriter:
    """Append-only binary payload builder (big-endian integers, raw arrays)."""

    def __init__(self) -> None:
        self._parts: list[bytes] = []

    def u32(self, value: int) -> PayloadWriter:
        """Append an unsigned 32-bit integer."""
        self._parts.append(struct.pack(">I", value))
        return self

    def raw(self, data: bytes) -> PayloadWriter:
        """Append bytes of a length both sides know."""
        self._parts.append(bytes(data))
        return self

    def blob(self, data: bytes) -> PayloadWriter:
        """Append length-prefixed bytes."""
        self._parts.append(struct.pack(">I", len(data)))
        self._parts.append(bytes(data))
        return self

    def ids(self, ids: list[int] | tuple[int, ...]) -> PayloadWriter:
        """Append a count-prefixed list of client ids (u32 each)."""
        self._parts.append(struct.pack(">I", len(ids)))
        self._parts.append(np.asarray(ids, dtype=">u4").tobytes())
        return self

    def array(self, values: np.ndarray) -> PayloadWriter:
        """Append a count-prefixed 1-D float64 (``<f8``) or uint64 (``<u8``) array."""
        arr = np.ascontiguousarray(values)
        code = {"f": b"f", "u": b"u"}[arr.dtype.kind]
        self._parts.append(code + struct.pack(">I", arr.size))
        self._parts.append(arr.astype("<" + code.decode() + "8", copy=False).tobytes())
        return self

    def getvalue(self) -> bytes:
        """Return the payload bytes."""
        return b"".join(self._parts)


class PayloadReader:
    """Length-checked reader matching :class:`PayloadWriter`.

    Every read past the end, every impossible count and every trailing byte raises
    :class:`~botorch_fed.secure.errors.TamperedMessageError`.
    """

    def __init__(self, data: bytes) -> None:
        self._data = memoryview(bytes(data))
        self._pos = 0

    def _take(self, n: int) -> memoryview:
        if n < 0 or self._pos + n > len(self._data):
            raise TamperedMessageError(
                f"payload truncated: needed {n} bytes at offset {self._pos}, "
                f"{len(self._data) - self._pos} left"
            )
        out = self._data[self._pos : self._pos + n]
        self._pos += n
        return out

    def u32(self) -> int:
        """Read an unsigned 32-bit integer."""
        return struct.unpack(">I", self._take(4))[0]

    def raw(self, n: int) -> bytes:
        """Read ``n`` bytes."""
        return bytes(self._take(n))

    def blob(self) -> bytes:
        """Read length-prefixed bytes."""
        return bytes(self._take(self.u32()))

    def ids(self) -> tuple[int, ...]:
        """Read a list of client ids written by :meth:`PayloadWriter.ids`."""
        n = self.u32()
        return tuple(int(v) for v in np.frombuffer(self._take(4 * n), dtype=">u4"))

    def array(self, kind: str, size: int | None = None) -> np.ndarray:
        """Read an array written by :meth:`PayloadWriter.array`.

        Args:
            kind: ``"f"`` (float64) or ``"u"`` (uint64).
            size: Expected number of elements, or None for any.

        Returns:
            A native-endian copy, ``size``.
        """
        code = bytes(self._take(1))
        n = self.u32()
        if code != kind.encode():
            raise TamperedMessageError(f"expected a {kind!r} array, got {code!r}")
        if size is not None and n != size:
            raise TamperedMessageError(f"array has {n} elements, expected {size}")
        dtype = "<f8" if kind == "f" else "<u8"
        return np.frombuffer(self._take(8 * n), dtype=dtype).astype(
            np.float64 if kind == "f" else np.uint64
        )

    def done(self) -> None:
        """Check that the whole payload was consumed."""
        if self._pos != len(self._data):
            raise TamperedMessageError(
                f"{len(self._data) - self._pos} unexpected trailing payload bytes"
            )
