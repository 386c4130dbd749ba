r"""The seeds of FBO-FedGP's shared global searches: public (:func:`global_step_seed`)
or from the clients' federation secret (:func:`secret_step_seed`)."""

from __future__ import annotations

from botorch_fed.secure.crypto import hkdf

SEED_RANGE = 2**31  # seeds of the acquisition searches (``BOClient.step_seed`` too)
_SEED_LABEL = b"botorch-fed/fbo-fedgp/global-step-seed\x00"


def global_step_seed(run_seed: int, t: int) -> int:
    r"""The *public* seed of round ``t``'s shared search (``plaintext``: no secret)."""
    return (int(run_seed) * 10_007 + int(t)) % SEED_RANGE


def _check_count(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"`{name}` must be a non-negative int, got {value!r}.")
    return value


def _encode_count(value: int) -> bytes:
    raw = value.to_bytes(max(1, (value.bit_length() + 7) // 8), "big")
    return len(raw).to_bytes(2, "big") + raw


def secret_step_seed(secret: bytes, run_seed: int, t: int, client_id: int | None = None) -> int:
    r"""Round ``t``'s seed of the search on the shared dPITC model (``client_id``: a
    client's own search), unpredictable without the clients' ``secret`` (>= 16 bytes):
    HKDF-SHA256 of it binding the run seed, ``t`` and ``client_id``, mod :data:`SEED_RANGE`.

    Raises:
        ValueError: A short ``secret``, or a count that is not a non-negative int.
    """
    if not isinstance(secret, bytes) or len(secret) < 16:
        kind = f"{len(secret)} bytes" if isinstance(secret, bytes) else type(secret).__name__
        raise ValueError(f"`secret` must be bytes of at least 16 bytes, got {kind}.")
    info = _SEED_LABEL + _encode_count(_check_count("run_seed", run_seed))
    info += _encode_count(_check_count("t", t))
    if client_id is None:
        info += b"\x00"
    else:
        info += b"\x01" + _encode_count(_check_count("client_id", client_id))
    return int.from_bytes(hkdf(secret, info, 8), "big") % SEED_RANGE
