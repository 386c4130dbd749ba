r"""Secure-aggregation key material of a Flower federation: one file per party.

Key material is made on the parties' side, never by the server: :func:`write_keyset`
runs the backend's ``setup`` (what the in-process runner does in the clients' name)
and writes each party's part into its own file, readable by its owner only --
``client-<i>.key`` holds client ``i``'s secret material, ``server.key`` the server's
public material (a CKKS public context, the masking directory of signed public keys).
Each party keeps its own file on its own machine (``--key-dir``); only ``server.key``
goes to the server. With ``--crypto-seed`` (reproducible experiments) the material is
the in-process run's, and each party's file starts with :data:`SEEDED_MARK`: whoever
knows the seed knows that material, so a party's agent takes such a key set only with
``--allow-crypto-seed``, whatever the run that names it says (:func:`party_material`).
"""

from __future__ import annotations

import os
import re
import secrets
from pathlib import Path

from botorch_fed.flower.policy import PolicyError

_KEYSET = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
SEEDED_MARK = b"botorch-fed key material from a crypto seed\n"
r"""The first bytes of a party's file of a key set made from a crypto seed."""


def check_keyset(name: str) -> str:
    r"""A key set's name: letters, digits, ``_.-`` (no path separators)."""
    if not isinstance(name, str) or not _KEYSET.fullmatch(name) or ".." in name:
        raise ValueError(
            f"Key set name {name!r} must be 1-64 letters, digits, '_', '.' or '-' (no '..')."
        )
    return name


def client_key_path(key_dir: str | os.PathLike, keyset: str, cid: int) -> Path:
    r"""Where client ``cid``'s material of ``keyset`` lies under ``key_dir``."""
    return Path(key_dir) / check_keyset(keyset) / f"client-{int(cid)}.key"


def write_keyset(setup, ids: list[int], key_dir: str | os.PathLike) -> tuple[str, Path]:
    r"""Generate the key material of a run and write one file per party.

    The material comes from ``setup.crypto_seed`` when the run has one (reproducible
    experiments: the same material as the in-process run; each party's file then
    starts with :data:`SEEDED_MARK`), else from OS randomness. It is made once and
    handed out: a backend's key generation need not be reproducible from a seed in
    another process (TenSEAL's is not).

    Args:
        setup: The run's :class:`~botorch_fed.protocol.setup.FederationSetup`.
        ids: The client ids.
        key_dir: Folder to create the key set in (``<key_dir>/<keyset>/``).

    Returns:
        ``(keyset name, path of server.key)``.
    """
    from botorch_fed.protocol.runner import secagg_backend

    material = secagg_backend(setup, ids).setup(ids, seed=setup.crypto_seed)
    mark = b"" if setup.crypto_seed is None else SEEDED_MARK
    name = f"{setup.aggregator}-{secrets.token_hex(8)}"
    folder = Path(key_dir) / name
    folder.mkdir(parents=True, mode=0o700)
    for cid in ids:
        _write_private(client_key_path(key_dir, name, cid), mark + material.for_client(cid))
    server = folder / "server.key"
    _write_private(server, material.server_material)
    return name, server


def _write_private(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def read_material(path: str | os.PathLike, who: str) -> bytes:
    r"""A party's key material file (``ValueError`` naming ``who`` and the path)."""
    if not str(path):
        raise ValueError(f"{who}: no key material file was given.")
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise ValueError(f"{who}: cannot read its key material {path} ({exc.strerror}).") from None


def party_material(
    key_dir: str | os.PathLike | None, keyset: str, cid: int, allow_crypto_seed: bool = False
) -> bytes:
    r"""Client ``cid``'s material of the run's key set.

    Args:
        key_dir: The party's key folder (``--key-dir``).
        keyset: The key set the run names.
        cid: The party's client id.
        allow_crypto_seed: Whether the party takes material made from a crypto seed
            (its agent's ``--allow-crypto-seed``).

    Returns:
        The material, without :data:`SEEDED_MARK`.

    Raises:
        ValueError: Naming what is missing.
        PolicyError: The key set was made from a crypto seed and ``allow_crypto_seed``
            is false.
    """
    if not keyset:
        raise ValueError(
            "The run names no key set (`keyset` in the run config): no party has key "
            "material for the secure aggregation."
        )
    if key_dir is None:
        raise ValueError(f"Client {cid}: its agent was started without --key-dir.")
    material = read_material(client_key_path(key_dir, keyset, cid), f"Client {cid}")
    if not material.startswith(SEEDED_MARK):
        return material
    if not allow_crypto_seed:
        raise PolicyError(
            f"The run's key set {keyset!r} was made from a crypto seed: whoever knows the "
            "seed knows this party's key material. This party's agent refuses it "
            "(--allow-crypto-seed allows it, for experiments)."
        )
    return material[len(SEEDED_MARK) :]
