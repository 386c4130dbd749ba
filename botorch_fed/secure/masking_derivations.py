r"""What the ``masking`` backend derives from its keys under its labels: the messages
its signatures and pairwise tags cover, the pairwise MAC keys, the U1 digest, the
pairwise and self masks, the self-mask commitments and the share nonces; and the
reader of a client's list of tags (see :mod:`botorch_fed.secure.masking`).
"""

from __future__ import annotations

import hashlib
import struct

import numpy as np

from botorch_fed.secure.crypto import MAC_SIZE, chacha20_uint64, hkdf, label
from botorch_fed.secure.errors import ProtocolError
from botorch_fed.secure.wire import PayloadReader, PayloadWriter


def _static_key_message(cid: int, static_pk: bytes) -> bytes:
    # what client ``cid``'s Ed25519 identity signs: its long-term static X25519 key
    return label("masking/static-key", b"", cid) + static_pk


def _pair_mac_key(
    shared: bytes, sender: int, recipient: int, sender_pk: bytes, recipient_pk: bytes
) -> bytes:
    # long-term key of the direction sender -> recipient, from the static-static
    # agreement; both directions of a pair have different keys
    info = label("masking/pair-mac", b"", sender, recipient) + sender_pk + recipient_pk
    return hkdf(shared, info)


def _keys_message(
    session: bytes, sender: int, recipient: int, c_pk: bytes, s_pk: bytes, transcript: bytes
) -> bytes:
    # the transcript (ClientRole.step) is the recipient's own when it verifies: a peer
    # the server told something else fails here, before any masked input is sent, so
    # no contributor's transcript goes unchecked (not even one the server later drops)
    head = label("masking/r0/keys", session, sender, recipient) + c_pk + s_pk
    return head + label("masking/r0/transcript", transcript)


def _survivors_message(
    session: bytes,
    sender: int,
    recipient: int,
    u3: tuple[int, ...],
    u1_digest: bytes,
    transcript: bytes,
) -> bytes:
    # the sender, the recipient, the contributor list, the digest of the key list U1
    # that the recipient itself saw and the recipient's own transcript (ClientRole.step):
    # U1 holds every client's fresh keys of this session, so a tag made in another
    # session (even one with the same id), over a different U1 view or by a client the
    # server told something else never verifies
    head = label("masking/r3/survivors", session, sender, recipient, len(u3), *u3)
    return head + u1_digest + label("masking/r3/transcript", transcript)


def _u1_digest(session: bytes, keys: dict[int, tuple[bytes, bytes]]) -> bytes:
    writer = PayloadWriter().ids(tuple(keys))
    for v in keys:
        writer.raw(keys[v][0]).raw(keys[v][1])
    return hashlib.sha256(label("masking/u1", session) + writer.getvalue()).digest()


def _pair_mask(shared: bytes, session: bytes, u: int, v: int, length: int) -> np.ndarray:
    lo, hi = (u, v) if u < v else (v, u)
    return chacha20_uint64(hkdf(shared, label("masking/r2/pair-mask", session, lo, hi)), length)


def _self_mask(seed: bytes, session: bytes, u: int, length: int) -> np.ndarray:
    return chacha20_uint64(hkdf(seed, label("masking/r2/self-mask", session, u)), length)


def _commit(seed: bytes, session: bytes, u: int) -> bytes:
    return hashlib.sha256(label("masking/b-commit", session, u) + seed).digest()


def _share_nonce(u: int, v: int) -> bytes:
    return struct.pack(">II", u, v) + bytes(4)


def _read_tags(reader: PayloadReader, expected: list[int], what: str, sender: int) -> dict:
    """``{recipient: tag}`` of a client's reply; the recipients must be ``expected``."""
    n = reader.u32()
    if n != len(expected):
        raise ProtocolError(
            f"{what} must address every other client of the list exactly once "
            f"({len(expected)} tags), got {n}",
            client_id=sender,
        )
    tags = {}
    for _ in range(n):
        v = reader.u32()
        tags[v] = reader.raw(MAC_SIZE)
    if list(tags) != expected:
        raise ProtocolError(
            f"{what} must address every other client of the list exactly once, in order "
            f"({expected}), got {list(tags)}",
            client_id=sender,
        )
    return tags
