r"""The seeds of FBO-FedGP's shared global searches: public from the run seed
(:func:`global_step_seed`), or derived from a secret the clients share and the server
does not (:func:`secret_step_seed`)."""

from __future__ import annotations

from botorch_fed.secure.crypto import hkdf

SEED_RANGE = 2**31  # seeds of the acquisition searches (``BOClient.step_seed`` too)
_SEED_LABEL = b"botorch-fed/fbo-fedgp/global-step-seed\x00"


def global_step_seed(run_seed: int, t: int) -> int:
    r"""The *public* seed of round ``t``'s shared global search, from the run's public
    seed: what the clients of a federation without a shared secret (the ``plaintext``
    backend) use. Anyone who knows the run seed, the server included, can compute it
    (see :func:`secret_step_seed`)."""
    return (int(run_seed) * 10_007 + int(t)) % SEED_RANGE


def _check_count(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"`{name}` must be a non-negative int, got {value!r}.")
    return value


def _encode_count(value: int) -> bytes:
    raw = value.to_bytes(max(1, (value.bit_length() + 7) // 8), "big")
    return len(raw).to_bytes(2, "big") + raw


def secret_step_seed(secret: bytes, run_seed: int, t: int, client_id: int | None = None) -> int:
    r"""The seed of round ``t``'s search on the shared dPITC model, from a secret that
    the clients share and the server does not.

    HKDF-SHA256 (``cryptography``) of ``secret`` with an ``info`` that binds the run
    seed, the round and, for a search of one client only, its id (lengths prefixed,
    so no two inputs share an encoding), reduced modulo :data:`SEED_RANGE` (the bias
    of reducing 64 bits is below ``2^-32``). Every client holding ``secret`` derives
    the same seed; without it the seed is unpredictable.

    Args:
        secret: The federation's secret, at least 16 bytes
            (:meth:`~botorch_fed.secure.client_role.ClientRole.federation_secret`).
        run_seed: The run's public seed (non-negative int).
        t: The round (non-negative int).
        client_id: ``None`` for the search that every global client of the round runs
            (``global_batch`` "distinct" or "batch"); a client's id for a search of its
            own on the shared model ("independent", Thompson sampling).

    Returns:
        A seed in ``[0, SEED_RANGE)``.

    Raises:
        ValueError: ``secret`` is not bytes of at least 16 bytes, or ``run_seed``,
            ``t`` or ``client_id`` is not a non-negative int.
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
