r"""What the ``ckks`` backend's integrity checks are made of: the session nonce size,
the session binding, the clients' secret guard canaries and linear tags (from the group
key the server does not have) and the check that a ciphertext has the shape of a sum of
fresh encryptions (see :mod:`botorch_fed.secure.ckks`).
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np

from botorch_fed.secure.ckks_keys import GUARD_SLOTS, CKKSParameters
from botorch_fed.secure.crypto import chacha20_uint64, hkdf, label
from botorch_fed.secure.wire import PayloadWriter

_NONCE = 16


def _canaries(group_key: bytes, binding: bytes, client_id: int, chunk: int) -> np.ndarray:
    """Secret guard values in ``[1, 2)`` of one client and chunk in the session bound
    to ``binding`` (see :func:`_binding`)."""
    words = np.frombuffer(
        hkdf(group_key, label("ckks/canary", binding, client_id, chunk), 8 * GUARD_SLOTS),
        dtype="<u8",
    )
    return 1.0 + (words >> np.uint64(11)).astype(np.float64) * 2.0**-53


def _tag_weights(group_key: bytes, binding: bytes, chunk: int, used: int, data_slots: int):
    """The ``GUARD_SLOTS x used`` secret weights of the linear tags of chunk ``chunk``'s
    first ``used`` data slots in the session bound to ``binding`` (the same on every
    client, unknown to the server), each in ``[s, 2 s)`` with ``s = 1 / (2 data_slots)``
    -- so a tag ``w . x`` is at most ``max|x|`` in magnitude --, 32 random bits each,
    from ChaCha20 keyed by HKDF of the group key; one independent tag per guard slot.

    An offset ``delta`` the server adds to the data slots changes guard slot ``g`` by
    ``w_g . delta``, which it can only guess: compensating the guard slots by its best
    guess leaves ``(w_g - E w_g) . delta``, of width ``s |delta|`` per slot. The offset
    goes unnoticed only if that stays within ``3 tol`` in all four slots. With a
    declared input bound (``input_bound``: limb digits, at most 2048) ``tol`` is ~1e-9
    per contributor, and a single offset of 1 passes with probability ~``(6 tol /
    s)^4`` ~ 1e-16 at 3 contributors."""
    key = hkdf(group_key, label("ckks/tag", binding, chunk), 32)
    words = chacha20_uint64(key, (GUARD_SLOTS * used + 1) // 2).view("<u4")
    weights = words[: GUARD_SLOTS * used].reshape(GUARD_SLOTS, used)
    return (1.0 + weights.astype(np.float64) * 2.0**-32) / (2 * data_slots)


def _binding(session: bytes, nonces: dict[int, bytes], transcript: bytes) -> bytes:
    """The session's binding: SHA-256 of the server's session id, every client's
    nonce (fresh per session on each client, so the server cannot repeat it) and the
    client's transcript (:meth:`ClientRole.step`: contributors told different values
    derive different canaries, and the aggregate fails the guard check)."""
    writer = PayloadWriter().ids(tuple(nonces))
    for cid in nonces:
        writer.raw(nonces[cid])
    writer.blob(transcript)
    return hashlib.sha256(label("ckks/binding", session) + writer.getvalue()).digest()


def _is_fresh_shape(vec: Any, params: CKKSParameters) -> bool:
    """Whether a ciphertext has the slots, scale, level and size of a fresh encryption.

    Sums and differences of fresh ciphertexts keep all four; a product with a
    plaintext changes the scale (or, once rescaled, the level), so the decryptor can
    refuse aggregates in which the server masked slots with plaintext weights.
    """
    cts = vec.ciphertext()
    ct = cts[0] if len(cts) == 1 else None
    return (
        vec.size() == params.slots
        and ct is not None
        and ct.scale == 2.0**params.scale_bits
        and ct.size() == 2
        and ct.coeff_modulus_size() == len(params.coeff_mod_bit_sizes) - 1
    )
