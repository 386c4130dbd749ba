r"""A ``masking`` client's long-term identity material: its format (the tag of
:meth:`~botorch_fed.secure.masking.MaskingBackend.setup`'s material) and its parsing
and checks, which yield the client's pairwise MAC keys (:class:`_Identity`).
"""

from __future__ import annotations

from dataclasses import dataclass

from botorch_fed.secure.crypto import (
    ed25519_public,
    ed25519_verify,
    x25519_private_from_bytes,
    x25519_public,
    x25519_shared,
)
from botorch_fed.secure.errors import ConfigurationError, KeyMismatchError, TamperedMessageError
from botorch_fed.secure.masking_derivations import _pair_mac_key, _static_key_message
from botorch_fed.secure.wire import PayloadReader

_SIGNATURE = 64  # bytes of an Ed25519 signature (static keys in the directory)
_FEDERATION_KEY = 32  # bytes of the clients' shared federation key (setup material)
# the material starts with this tag; material of the earlier format (no static keys)
# has none and is refused by name
_MATERIAL_TAG = b"botorch-fed/masking-material/v2\x00"


@dataclass(frozen=True)
class _Identity:
    """A client's long-term material, checked, with its MAC keys derived."""

    signing_key: bytes  # Ed25519 private key (the root of trust; signs the static key)
    static_pk: bytes  # its static X25519 public key
    directory: dict[int, tuple[bytes, bytes]]  # {client: (Ed25519 pk, static X25519 pk)}
    federation_key: bytes
    send_keys: dict[int, bytes]  # {peer v: K[u->v]}
    receive_keys: dict[int, bytes]  # {peer v: K[v->u]}


def _old_format(material: bytes) -> bool:
    """Whether ``material`` parses as the earlier format (signing key, ids, one
    Ed25519 public key per client, federation key; no static keys)."""
    try:
        reader = PayloadReader(material)
        reader.raw(32)
        ids = reader.ids()
        for _ in ids:
            reader.raw(32)
        reader.raw(_FEDERATION_KEY)
        reader.done()
    except TamperedMessageError:
        return False
    return True


def _identity(client_id: int, material: bytes) -> _Identity:
    """Parse and check this client's material; derive its pairwise MAC keys."""
    if not material:
        raise ConfigurationError(
            f"masking client {client_id} needs its identity material (signing key, static "
            "key, the directory of public keys and the federation key) from "
            "MaskingBackend.setup(); got none"
        )
    material = bytes(material)
    if not material.startswith(_MATERIAL_TAG):
        if _old_format(material):
            raise ConfigurationError(
                f"masking client {client_id}: identity material of the earlier format, "
                "without static key-agreement keys (peers now authenticate each other "
                "with tags under keys derived from them); refusing it: run "
                "MaskingBackend.setup() again and distribute the new material"
            )
        raise ConfigurationError(
            f"masking client {client_id}: malformed identity material (no format tag; "
            "expected the material of MaskingBackend.setup(): the signing key, the static "
            "key, the directory of signed public keys and the 32-byte federation key)"
        )
    try:
        reader = PayloadReader(material)
        reader.raw(len(_MATERIAL_TAG))
        signing_key = reader.raw(32)
        static_private_raw = reader.raw(32)
        ids = reader.ids()
        entries = {cid: (reader.raw(32), reader.raw(32), reader.raw(_SIGNATURE)) for cid in ids}
        federation_key = reader.raw(_FEDERATION_KEY)
        reader.done()
    except TamperedMessageError as exc:
        raise ConfigurationError(
            f"masking client {client_id}: malformed identity material ({exc}; expected "
            "the signing key, the static key, the directory of signed public keys and the "
            "32-byte federation key)"
        ) from exc
    if federation_key == bytes(_FEDERATION_KEY):
        raise ConfigurationError(
            f"masking client {client_id}: the federation key of its identity material is "
            "all zero (a placeholder, not a secret); refusing it"
        )
    if list(ids) != sorted(set(ids)):
        raise ConfigurationError(
            f"masking client {client_id}: the directory's client ids {list(ids)} are not "
            "distinct and sorted; refusing it"
        )
    if len({e[0] for e in entries.values()}) != len(entries):
        raise ConfigurationError(
            f"masking client {client_id}: the directory lists one public key for several "
            "clients (one identity would vouch for each of them); refusing it"
        )
    if len({e[1] for e in entries.values()}) != len(entries):
        raise ConfigurationError(
            f"masking client {client_id}: the directory lists one static key for several "
            "clients (their tags could not be told apart); refusing it"
        )
    mine = entries.get(client_id)
    if mine is None:
        raise ConfigurationError(
            f"masking client {client_id} is not in the directory of its identity material"
        )
    if ed25519_public(signing_key) != mine[0]:
        raise ConfigurationError(
            f"masking client {client_id}: the directory's public key is not this client's"
        )
    if x25519_public(static_private_raw) != mine[1]:
        raise ConfigurationError(
            f"masking client {client_id}: the directory's static key is not this client's"
        )
    for cid, (public, static_pk, signature) in entries.items():
        if not ed25519_verify(public, signature, _static_key_message(cid, static_pk)):
            raise KeyMismatchError(
                f"the directory's static key of client {cid} carries no valid signature of "
                f"client {cid}'s identity (substituted or altered); refusing the directory",
                client_id=cid,
            )
    static_private = x25519_private_from_bytes(static_private_raw)
    send_keys, receive_keys = {}, {}
    for v, (_, static_pk, _) in entries.items():
        if v == client_id:
            continue
        try:
            shared = x25519_shared(static_private, static_pk)
        except TamperedMessageError as exc:
            raise KeyMismatchError(
                f"the directory's static key of client {v} is not a usable X25519 key "
                f"({exc.detail}); refusing the directory",
                client_id=v,
            ) from exc
        send_keys[v] = _pair_mac_key(shared, client_id, v, mine[1], static_pk)
        receive_keys[v] = _pair_mac_key(shared, v, client_id, static_pk, mine[1])
    return _Identity(
        signing_key=signing_key,
        static_pk=mine[1],
        directory={cid: (e[0], e[1]) for cid, e in entries.items()},
        federation_key=federation_key,
        send_keys=send_keys,
        receive_keys=receive_keys,
    )
