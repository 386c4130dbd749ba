r"""The randomness of a privacy mechanism: a ChaCha20 keystream with a 256-bit key.

A mechanism's noise is only as private as its random numbers are unpredictable to the
party it protects against. A ``torch.Generator`` (Mersenne Twister) keeps 32 bits of
its seed -- a server that sees a few dozen privatised values can try every seed and
subtract the noise exactly -- so :class:`~botorch_fed.privacy.LaplaceMechanism` draws
from this stream instead: ChaCha20 (``cryptography``) keyed with 32 bytes of OS
entropy, or, for tests and reproducible simulations only, with SHA-256 of an integer
seed (whoever knows that seed knows the noise).

The stream is addressable: :attr:`KeyStream.position` counts the bytes drawn, and
:meth:`KeyStream.advance_to` moves it forward only. A user that persists the position
of every release before the release leaves it (see
:class:`~botorch_fed.algorithms.ldp_bo.client.LDPUserClient`) never draws the same noise twice,
even when it is restored from an older checkpoint.
"""

from __future__ import annotations

import hashlib
import secrets

import torch
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms
from torch import Tensor

KEY_BYTES = 32
_BLOCK = 64  # ChaCha20 block size in bytes
_DOMAIN = b"botorch-fed/privacy/KeyStream/v1"


class KeyStream:
    r"""Uniform random numbers from a ChaCha20 keystream.

    Args:
        key: 32 secret bytes (``None``: fresh OS entropy).
        position: Bytes of the stream already used.
    """

    def __init__(self, key: bytes | None = None, position: int = 0) -> None:
        if key is None:
            key = secrets.token_bytes(KEY_BYTES)
        if not isinstance(key, bytes | bytearray) or len(key) != KEY_BYTES:
            raise ValueError(f"`key` must be {KEY_BYTES} bytes, got {key!r:.40}.")
        if isinstance(position, bool) or not isinstance(position, int) or position < 0:
            raise ValueError(f"`position` must be a non-negative integer, got {position!r}.")
        self._key = bytes(key)
        self._position = position

    @classmethod
    def from_seed(cls, seed: int) -> KeyStream:
        r"""A deterministic stream for tests and reproducible simulations: the key is
        SHA-256 of ``seed`` (any integer; every bit counts). Not private against anyone
        who knows ``seed``."""
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ValueError(f"`seed` must be an integer, got {seed!r}.")
        width = max(16, (seed.bit_length() + 8) // 8 + 1)
        data = _DOMAIN + seed.to_bytes(width, "little", signed=True)
        return cls(hashlib.sha256(data).digest())

    def fingerprint(self) -> str:
        r"""A public fingerprint of the key (SHA-256 of a domain tag and the key, first
        16 bytes in hex): names the key without revealing it."""
        return hashlib.sha256(_DOMAIN + b"/fingerprint" + self._key).hexdigest()[:32]

    @property
    def position(self) -> int:
        r"""Bytes drawn so far."""
        return self._position

    def advance_to(self, position: int) -> None:
        r"""Skip forward to ``position`` (never backwards: drawn bytes are not reused)."""
        if isinstance(position, bool) or not isinstance(position, int) or position < 0:
            raise ValueError(f"`position` must be a non-negative integer, got {position!r}.")
        if position >= 2**64:
            raise ValueError(f"`position`={position} is beyond the stream (2^64 bytes).")
        if position < self._position:
            raise ValueError(
                f"The stream is at byte {self._position}; it cannot go back to {position} "
                "(that would reuse noise)."
            )
        self._position = position

    def _bytes(self, n: int) -> bytes:
        start = self._position
        if start + n > 2**64:
            raise ValueError("The key stream is exhausted (2^64 bytes).")
        out = []
        while n > 0:  # one read per 2^32-block segment (the counter must not wrap)
            block, offset = divmod(self._position, _BLOCK)
            room = (2**32 - block % 2**32) * _BLOCK - offset
            take = min(n, room)
            # cryptography's ChaCha20 nonce: 4-byte little-endian block counter + 12 bytes
            nonce = (block % 2**32).to_bytes(4, "little") + (block // 2**32).to_bytes(12, "little")
            encryptor = Cipher(algorithms.ChaCha20(self._key, nonce), mode=None).encryptor()
            out.append(encryptor.update(bytes(offset + take))[offset:])
            self._position += take
            n -= take
        return b"".join(out)

    def uniform(self, n: int) -> Tensor:
        r"""``n`` i.i.d. uniforms on the open interval ``(0, 1)`` (float64, CPU):
        ``(k + 1/2) / 2^52`` for 52-bit integers ``k`` of the stream (exact in float64,
        so never 0 or 1)."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(f"`n` must be a non-negative integer, got {n!r}.")
        raw = torch.frombuffer(bytearray(self._bytes(8 * n)), dtype=torch.int64)
        k = torch.bitwise_right_shift(raw, 12) & ((1 << 52) - 1)  # top 52 bits
        return (k.to(torch.float64) + 0.5) / 2.0**52

    def state(self) -> Tensor:
        r"""Key and position as a 40-byte ``uint8`` tensor (checkpoints; secret)."""
        data = self._key + self._position.to_bytes(8, "little")
        return torch.frombuffer(bytearray(data), dtype=torch.uint8).clone()

    @classmethod
    def from_state(cls, state: Tensor) -> KeyStream:
        r"""The stream :meth:`state` describes."""
        if not isinstance(state, Tensor) or state.dtype != torch.uint8:
            raise TypeError(f"A stream state must be a uint8 tensor, got {type(state).__name__}.")
        if state.shape != (KEY_BYTES + 8,):
            raise ValueError(
                f"A stream state must have {KEY_BYTES + 8} bytes, got shape {tuple(state.shape)}."
            )
        data = bytes(state.tolist())
        return cls(data[:KEY_BYTES], int.from_bytes(data[KEY_BYTES:], "little"))
