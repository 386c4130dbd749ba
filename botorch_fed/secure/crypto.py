r"""Thin wrappers around the ``cryptography`` primitives the backends use.

Nothing here is a hand-written cipher: key agreement is X25519, key derivation is
HKDF-SHA256 (RFC 5869), the pseudo-random generator for masks is the ChaCha20
keystream (RFC 8439) and authenticated encryption is ChaCha20-Poly1305, all from the
``cryptography`` package (OpenSSL). The wrappers fix the encodings, bind every
derived key to its purpose, session and parties (HKDF ``info``), and turn library
exceptions into :mod:`botorch_fed.secure.errors`.

Randomness for key material comes from :func:`os.urandom` unless a seed is given;
a seeded :class:`RandomSource` (numpy ``Generator`` over a ``SeedSequence``) makes
tests and benchmarks reproducible and must never be used in a deployment: anyone who
knows the seed knows every key.
"""

from __future__ import annotations

import hmac
import os
import struct

import numpy as np
from cryptography.exceptions import InvalidSignature, InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)
from cryptography.hazmat.primitives.asymmetric.x25519 import (
    X25519PrivateKey,
    X25519PublicKey,
)
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from botorch_fed.secure.errors import InputError, TamperedMessageError

__all__ = [
    "MAC_SIZE",
    "RandomSource",
    "aead_open",
    "aead_seal",
    "channel_key",
    "chacha20_uint64",
    "ed25519_keypair",
    "ed25519_public",
    "ed25519_sign",
    "ed25519_verify",
    "hkdf",
    "label",
    "mac_tag",
    "mac_verify",
    "x25519_keypair",
    "x25519_private_from_bytes",
    "x25519_public",
    "x25519_shared",
]

_ZERO_NONCE16 = bytes(16)


def label(purpose: str, session: bytes, *ids: int) -> bytes:
    """Build an HKDF ``info`` string binding a key to a purpose, session and ids.

    Args:
        purpose: Short ASCII purpose, e.g. ``"masking/pair-mask"``.
        session: The 16-byte session id.
        *ids: Client ids (u32 each), in a canonical order chosen by the caller.

    Returns:
        ``b"botorch-fed/" + purpose + 0x00 + session + ids``.
    """
    return b"botorch-fed/" + purpose.encode("ascii") + b"\x00" + session + _pack_ids(ids)


def _pack_ids(ids: tuple[int, ...]) -> bytes:
    return struct.pack(f">{len(ids)}I", *ids)


class RandomSource:
    """Bytes for key material: :func:`os.urandom`, or reproducible from a seed.

    Args:
        seed: None for OS randomness; a non-negative int for reproducible bytes
            (tests/benchmarks only).
        *labels: Non-negative ints that separate the streams of different roles
            sharing one seed (e.g. ``(1, client_id)``).
    """

    def __init__(self, seed: int | None, *labels: int) -> None:
        self._key: bytes | None = None  # keyed(): a ChaCha20 key stream
        self._calls = 0
        if seed is None:
            self._rng = None
        else:
            if isinstance(seed, bool) or not isinstance(seed, int | np.integer):
                raise InputError(f"seed must be None or an int, got {seed!r}")
            if seed < 0:
                raise InputError(f"seed must be non-negative, got {seed}")
            self._rng = np.random.default_rng(
                np.random.SeedSequence([int(seed), *map(int, labels)])
            )

    @classmethod
    def keyed(cls, key: bytes, *labels: int) -> RandomSource:
        """Secret, reproducible bytes: the ChaCha20 key stream of a 32-byte ``key`` (from
        :func:`os.urandom`, kept by its owner), one nonce per call. Whoever lacks the key
        cannot predict them; whoever holds it and the number of calls so far
        (:meth:`get_state`) draws the same bytes again -- a restarted party that handles
        a round again.

        Raises:
            InputError: ``key`` is not 32 bytes.
        """
        if not isinstance(key, bytes) or len(key) != 32:
            raise InputError("a random source's key must be 32 bytes")
        source = cls(None)
        info = b"botorch-fed/random-source" + struct.pack(f">{len(labels)}Q", *labels)
        source._key = hkdf(key, info)
        return source

    @property
    def seeded(self) -> bool:
        """Whether the bytes are reproducible from a seed (not secret!)."""
        return self._rng is not None

    @property
    def reproducible(self) -> bool:
        """Whether the bytes can be drawn again (seeded, or keyed: :meth:`keyed`)."""
        return self._rng is not None or self._key is not None

    def bytes(self, n: int) -> bytes:
        """Return ``n`` random bytes."""
        if self._key is not None:
            nonce = b"\0\0\0\0" + struct.pack("<Q", self._calls) + b"\0\0\0\0"
            self._calls += 1
            encryptor = Cipher(algorithms.ChaCha20(self._key, nonce), mode=None).encryptor()
            return encryptor.update(bytes(n))
        return os.urandom(n) if self._rng is None else self._rng.bytes(n)

    def get_state(self) -> dict | None:
        """The state that draws the next bytes again (JSON-able): a keyed source's call
        count, a seeded one's generator state; ``None`` for OS randomness."""
        if self._key is not None:
            return {"calls": self._calls}
        return None if self._rng is None else dict(self._rng.bit_generator.state)

    def set_state(self, state: dict) -> None:
        """Restore :meth:`get_state` of a source of the same kind (and key or seed).

        Raises:
            InputError: This source draws from the OS, or ``state`` is not a state of
                its kind.
        """
        if self._key is not None:
            calls = state.get("calls") if isinstance(state, dict) else None
            if isinstance(calls, bool) or not isinstance(calls, int) or calls < 0:
                raise InputError("not a state of this keyed random source")
            self._calls = calls
            return
        if self._rng is None:
            raise InputError("an unseeded random source has no state to restore")
        try:
            self._rng.bit_generator.state = state
        except (TypeError, ValueError, KeyError) as exc:
            raise InputError(f"not a state of this random source ({exc})") from None


def hkdf(key_material: bytes, info: bytes, length: int = 32) -> bytes:
    """HKDF-SHA256 with an empty salt.

    Args:
        key_material: Input keying material (e.g. an X25519 shared secret).
        info: Context binding (see :func:`label`).
        length: Output length in bytes.

    Returns:
        ``length`` bytes of derived key.
    """
    return HKDF(algorithm=hashes.SHA256(), length=length, salt=None, info=info).derive(key_material)


def x25519_private_from_bytes(raw: bytes) -> X25519PrivateKey:
    """Load a raw 32-byte X25519 private key.

    Raises:
        TamperedMessageError: If ``raw`` is not 32 bytes.
    """
    if len(raw) != 32:
        raise TamperedMessageError(f"X25519 private key must be 32 bytes, got {len(raw)}")
    return X25519PrivateKey.from_private_bytes(raw)


def x25519_public(private_raw: bytes) -> bytes:
    """The raw 32-byte public key of a raw 32-byte X25519 private key.

    Raises:
        TamperedMessageError: If ``private_raw`` is not 32 bytes.
    """
    return x25519_private_from_bytes(private_raw).public_key().public_bytes_raw()


def x25519_keypair(rand: RandomSource) -> tuple[X25519PrivateKey, bytes]:
    """Draw an X25519 key pair.

    Args:
        rand: Source of the 32 private-key bytes.

    Returns:
        The private key and the raw 32-byte public key.
    """
    if rand.reproducible:
        private = X25519PrivateKey.from_private_bytes(rand.bytes(32))
    else:
        private = X25519PrivateKey.generate()
    return private, private.public_key().public_bytes_raw()


def x25519_shared(private: X25519PrivateKey, public_raw: bytes) -> bytes:
    """X25519 key agreement with a peer's raw public key.

    Raises:
        TamperedMessageError: If the public key is malformed or a low-order point.
    """
    if len(public_raw) != 32:
        raise TamperedMessageError(f"X25519 public key must be 32 bytes, got {len(public_raw)}")
    try:
        return private.exchange(X25519PublicKey.from_public_bytes(public_raw))
    except ValueError as exc:  # all-zero shared secret: low-order point
        raise TamperedMessageError(f"invalid X25519 public key: {exc}") from exc


def ed25519_keypair(rand: RandomSource) -> tuple[bytes, bytes]:
    """Draw a long-term Ed25519 signing identity.

    Args:
        rand: Source of the 32 private-key bytes (OS randomness when unseeded).

    Returns:
        The raw 32-byte private key and the raw 32-byte public key.
    """
    if rand.seeded:
        private = Ed25519PrivateKey.from_private_bytes(rand.bytes(32))
    else:
        private = Ed25519PrivateKey.generate()
    return private.private_bytes_raw(), private.public_key().public_bytes_raw()


def ed25519_public(private_raw: bytes) -> bytes:
    """The raw 32-byte public key of a raw 32-byte Ed25519 private key."""
    return Ed25519PrivateKey.from_private_bytes(private_raw).public_key().public_bytes_raw()


def ed25519_sign(private_raw: bytes, message: bytes) -> bytes:
    """Sign ``message`` with a raw 32-byte Ed25519 private key (64-byte signature)."""
    return Ed25519PrivateKey.from_private_bytes(private_raw).sign(message)


def ed25519_verify(public_raw: bytes, signature: bytes, message: bytes) -> bool:
    """Whether ``signature`` is a valid Ed25519 signature of ``message`` under the raw
    32-byte public key ``public_raw`` (False for malformed keys or signatures)."""
    try:
        Ed25519PublicKey.from_public_bytes(public_raw).verify(signature, message)
    except (InvalidSignature, ValueError):
        return False
    return True


MAC_SIZE = 32  # bytes of an HMAC-SHA256 tag


def mac_tag(key: bytes, message: bytes) -> bytes:
    """HMAC-SHA256 of ``message`` under ``key`` (32-byte tag)."""
    return hmac.digest(key, message, "sha256")


def mac_verify(key: bytes, tag: bytes, message: bytes) -> bool:
    """Whether ``tag`` is the HMAC-SHA256 of ``message`` under ``key`` (constant-time
    comparison; False for a tag of the wrong length)."""
    return len(tag) == MAC_SIZE and hmac.compare_digest(hmac.digest(key, message, "sha256"), tag)


def channel_key(shared: bytes, session: bytes, client_id: int) -> bytes:
    """Per-session HMAC key of the server-client channel of ``client_id``."""
    return hkdf(shared, label("channel-mac", session, client_id))


def chacha20_uint64(key: bytes, length: int) -> np.ndarray:
    """ChaCha20 keystream as ``length`` little-endian uint64 words (the mask PRG).

    The key must be used for one stream only (it is derived per pair, session and
    purpose), so the all-zero nonce is safe.

    Args:
        key: 32-byte key.
        length: Number of 64-bit words.

    Returns:
        ``length`` uint64 array (writeable).
    """
    encryptor = Cipher(algorithms.ChaCha20(key, _ZERO_NONCE16), mode=None).encryptor()
    stream = encryptor.update(bytes(8 * length))
    return np.frombuffer(bytearray(stream), dtype="<u8")


def aead_seal(key: bytes, nonce: bytes, plaintext: bytes, associated: bytes) -> bytes:
    """ChaCha20-Poly1305 encryption (12-byte nonce, 16-byte tag appended)."""
    return ChaCha20Poly1305(key).encrypt(nonce, plaintext, associated)


def aead_open(key: bytes, nonce: bytes, ciphertext: bytes, associated: bytes) -> bytes:
    """ChaCha20-Poly1305 decryption.

    Raises:
        TamperedMessageError: If the tag does not verify (altered bytes, wrong key,
            wrong associated data).
    """
    try:
        return ChaCha20Poly1305(key).decrypt(nonce, ciphertext, associated)
    except InvalidTag as exc:
        raise TamperedMessageError(
            "encrypted share failed authentication (altered or wrong key)"
        ) from exc
