r"""The ``masking`` backend: pairwise double masking with dropout recovery, secure
against an actively malicious server.

Bonawitz, Ivanov, Kreuter, Marcedone, McMahan, Patel, Ramage, Segal, Seth, "Practical
Secure Aggregation for Privacy-Preserving Machine Learning", CCS 2017, the protocol
of Fig. 4 *with* its active-security steps (authenticated keys and a consistency round
before any share is revealed). Each client ``u`` encodes its vector in fixed point mod
2^64 (resolution 2^-40, see :mod:`botorch_fed.secure.fixed_point`) and sends

.. code-block:: text

    y_u = x_u + PRG(b_u) + sum_{v in U2, u < v} PRG(s_uv) - sum_{v in U2, v < u} PRG(s_uv)

where ``s_uv`` is an X25519 agreement between ``u``'s and ``v``'s fresh mask keys of the
session (HKDF-SHA256 bound to the session, the round and the pair), ``b_u`` a fresh
self-mask seed, and PRG the ChaCha20 keystream. Pairwise masks cancel in the sum; the
self masks are removed with ``b_u`` reconstructed from Shamir shares (threshold ``t``,
default ``2M // 3 + 1``) held by the other clients, and the pairwise masks of clients
that dropped after sharing their keys are removed with their X25519 mask key
reconstructed the same way. A client never reveals both secrets of one peer. Shares
travel through the server encrypted with ChaCha20-Poly1305 under a key from a second
fresh X25519 agreement, so the server cannot read them.

Authentication (what replaces per-session signatures). Every client holds, in its
setup material (:meth:`MaskingBackend.setup`, distributed out of band):

- a long-term Ed25519 identity, the root of trust: the directory lists every client's
  Ed25519 public key, and those must reach the clients authentically (never through
  the server);
- a long-term *static* X25519 key whose public part is signed by the client's Ed25519
  identity; the directory carries every client's static public key and that signature.

When its role is created a client checks every signature in the directory once
(``KeyMismatchError`` naming the client whose static key is not vouched for by its
identity) and derives, for every peer ``v``, two long-term MAC keys from the
static-static agreement: ``K[u->v]`` and ``K[v->u]`` = HKDF-SHA256(X25519(static_u,
static_v), label "masking/pair-mac" with (sender, recipient) and both static public
keys). Per session a client authenticates what it tells peer ``v`` through the server
with an HMAC-SHA256 tag under ``K[u->v]`` -- one tag per (sender, recipient) pair,
routed by the server -- over a message that names its purpose (round), the session,
the sender and the recipient:

0. ``advertise_keys``: clients send two fresh X25519 public keys (share encryption,
   masks) and, for every other client ``v`` of the session, a tag under ``K[u->v]``
   over (session, u, v, keys, its transcript).
1. ``share_keys``: the server sends each client ``v`` the keys of the responders
   ``U1`` with the tags addressed to ``v``; ``v`` checks every tag against its own
   transcript (a server that substitutes a key, or told the two clients different
   values, is caught: ``KeyMismatchError``; every member of ``U1``, hence every
   contributor, is checked by every other before any masked input exists), then
   sends encrypted Shamir
   shares of (mask private key, ``b_u``) for every peer and a SHA-256 commitment to
   ``b_u``.
2. ``masked_input``: the server routes the shares to the responders ``U2``; clients
   send ``y_u``.
3. ``consistency_check``: the server announces the contributors ``U3``; every
   contributor ``u`` sends, for every other member ``v`` of its ``U3``, a tag under
   ``K[u->v]`` over (session, u, v, ``U3``, the digest of the key list ``U1`` it saw,
   its transcript). ``U1`` holds every client's fresh keys of this session, so a tag
   from another session, even one with the same id, never verifies.
4. ``unmasking``: the server forwards to each client of ``U4`` the tags addressed to
   it; a client reveals shares only if ``U4`` is a subset of its ``U3`` with at least
   ``max(t, min_clients)`` members (itself included) and the tag of every other member
   of ``U4`` verifies on *its own* ``U3``, ``U1`` digest and transcript (else
   ``TamperedMessageError``: the server showed clients different lists, told them
   different values, replayed or altered a tag). Survivors then send the ``b`` shares
   of ``U3`` and the mask-key shares of ``U2 \ U3``. The server reconstructs, checks
   every secret against its commitment / public key, removes the masks and decodes the
   sum.

Why tags authenticate as signatures did here. ``K[u->v]`` is computable only by ``u``
and ``v``: it needs one of their static private keys (the server, or any other client,
would have to solve CDH on X25519 to get it), and the static public keys it comes from
are the ones their Ed25519 identities signed, so a directory with a substituted static
key is refused before any session. For the recipient ``v`` -- who never made a tag
named ``u -> v`` (sender and recipient are in every tagged message, and the two
directions have different keys) -- a valid tag therefore proves that ``u`` made it, for
exactly that purpose, session, recipient and content, just as ``u``'s signature would.
What a tag lacks, transferability (``v`` cannot convince a third party), is never
used: every client verifies only what is addressed to it, and every check of the
protocol is a check by the recipient. A client colluding with the server knows its own
keys ``K[c->v]``, ``K[v->c]`` and so can endorse anything *as itself* (as with its own
signing key) or forge tags *to itself* (only deceiving itself), but not a tag from a
third client ``u`` to a fourth ``v``. (This is also why key-compromise impersonation
does not matter: forging tags to ``u`` needs ``u``'s static key, i.e. a corrupted
``u``, whose view is the adversary's anyway.)

Why the consistency round suffices. An honest client endorses (tags to everyone) only
the one ``U3`` it was shown; a client that reveals shares has valid tags from at least
``t`` distinct clients of its ``U3``, itself included, on its own ``U3``. So two
different survivor sets cannot both be endorsed by ``t`` clients when the honest
endorsers of each are disjoint: with ``c`` clients colluding with the server this
needs ``2 (t - c) > M - c``, i.e. ``t > (M + c) / 2``; the default ``2M // 3 + 1``
covers ``c < M / 3``. A peer's self-mask seed and mask key are therefore never both
revealed by ``t`` clients.
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass

import numpy as np

from botorch_fed.secure import fixed_point, shamir
from botorch_fed.secure.base import (
    BackendSetup,
    ClientRole,
    RoundSpec,
    SecureAggregationBackend,
    ServerRole,
)
from botorch_fed.secure.crypto import (
    MAC_SIZE,
    RandomSource,
    aead_open,
    aead_seal,
    chacha20_uint64,
    ed25519_keypair,
    ed25519_public,
    ed25519_sign,
    ed25519_verify,
    hkdf,
    label,
    mac_tag,
    mac_verify,
    x25519_keypair,
    x25519_private_from_bytes,
    x25519_public,
    x25519_shared,
)
from botorch_fed.secure.errors import (
    ConfigurationError,
    KeyMismatchError,
    ProtocolError,
    TamperedMessageError,
    TooFewClientsError,
)
from botorch_fed.secure.validation import error_context, validate_client_ids
from botorch_fed.secure.wire import PayloadReader, PayloadWriter

__all__ = ["MaskingBackend", "default_threshold"]

_SHARE_PLAINTEXT = 8 + 2 * shamir.SHARE_SIZE

_SIGNATURE = 64  # bytes of an Ed25519 signature (static keys in the directory)
_FEDERATION_KEY = 32  # bytes of the clients' shared federation key (setup material)
# the material starts with this tag; material of the earlier format (no static keys)
# has none and is refused by name
_MATERIAL_TAG = b"botorch-fed/masking-material/v2\x00"


def default_threshold(n_clients: int) -> int:
    """Default Shamir threshold ``t = 2n // 3 + 1`` (more than two thirds: secure
    against a malicious server colluding with fewer than ``n / 3`` clients)."""
    return 2 * n_clients // 3 + 1


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


class MaskingBackend(SecureAggregationBackend):
    """Bonawitz-style double masking (X25519, HKDF-SHA256, ChaCha20, Shamir; Ed25519
    identities vouching for static X25519 keys, HMAC-SHA256 tags between clients),
    secure against a malicious server (see the module docstring).

    Every client needs its material from :meth:`setup`: its Ed25519 signing key, its
    static X25519 key, the federation's directory (every client's Ed25519 public key,
    static public key and the identity's signature on it) and the federation key (the
    source of :meth:`~botorch_fed.secure.base.ClientRole.federation_secret`).

    Args:
        threshold: Shamir threshold ``t``: the sum is recovered if at least ``t``
            clients survive every round. None (default) means ``2M // 3 + 1`` for a
            session of ``M`` clients (a malicious server colluding with fewer than
            ``M / 3`` clients learns nothing beyond the sum); an int must satisfy
            ``M // 2 < t <= M`` (above ``M / 2`` the server alone cannot learn more than
            the sum; colluding clients need ``t > (M + c) / 2``).
        fraction_bits: Fixed-point fractional bits (default 40, in ``[8, 52]``).
        min_clients: Minimum number of contributors (default 3).
        allow_two_clients: Must be True to allow ``min_clients=2``.
    """

    name = "masking"
    code = 3
    rounds = (
        RoundSpec("advertise_keys", "client_encode", "server_aggregate"),
        RoundSpec("share_keys", "client_encode", "server_aggregate"),
        RoundSpec("masked_input", "client_encode", "server_aggregate"),
        RoundSpec("consistency_check", "decrypt_unmask", "decrypt_unmask"),
        RoundSpec("unmasking", "decrypt_unmask", "decrypt_unmask"),
    )

    def __init__(
        self,
        *,
        threshold: int | None = None,
        fraction_bits: int = fixed_point.DEFAULT_FRACTION_BITS,
        min_clients: int = 3,
        allow_two_clients: bool = False,
    ) -> None:
        super().__init__(min_clients=min_clients, allow_two_clients=allow_two_clients)
        if threshold is not None and (
            isinstance(threshold, bool) or not isinstance(threshold, int) or threshold < 2
        ):
            raise ConfigurationError(
                f"option 'threshold' must be None (2M // 3 + 1) or an int >= 2 with "
                f"M // 2 < threshold <= M, got {threshold!r}"
            )
        if (
            isinstance(fraction_bits, bool)
            or not isinstance(fraction_bits, int)
            or not 8 <= fraction_bits <= 52
        ):
            raise ConfigurationError(
                f"option 'fraction_bits' must be an int in [8, 52], got {fraction_bits!r}"
            )
        self.threshold = threshold
        self.fraction_bits = fraction_bits

    @property
    def options(self) -> dict[str, object]:
        """The options this backend was created with."""
        return {
            **super().options,
            "threshold": self.threshold,
            "fraction_bits": self.fraction_bits,
        }

    def session_threshold(self, n_clients: int) -> int:
        """The threshold ``t`` used for a session of ``n_clients``.

        Raises:
            ConfigurationError: If the configured threshold is not in
                ``(n_clients // 2, n_clients]``.
        """
        if self.threshold is None:
            return default_threshold(n_clients)
        if not n_clients // 2 < self.threshold <= n_clients:
            raise ConfigurationError(
                f"option 'threshold'={self.threshold} must satisfy "
                f"{n_clients} // 2 < threshold <= {n_clients} for {n_clients} clients"
            )
        return self.threshold

    def server(self, material: bytes = b"", *, seed: int | None = None) -> ServerRole:
        """Create the server role (``material`` must be empty)."""
        if material:
            raise ConfigurationError("the masking backend takes no server material")
        return _MaskingServer(self, seed=seed)

    def setup(self, client_ids, *, seed: int | None = None) -> BackendSetup:
        """Give every client a long-term Ed25519 identity, a static X25519 key signed
        by it, the directory of the federation and the federation key.

        In a deployment each client draws its own Ed25519 identity and static X25519
        key, signs the static public key with the identity (the message of
        ``_static_key_message``) and the directory entries (Ed25519 public key, static
        public key, signature) are exchanged out of band (never through the server;
        the Ed25519 public keys must arrive authentically, the signature protects the
        static keys); here everything is drawn for all clients at once. The federation
        key is 32 random bytes that every client of the federation receives with its
        identity and the server never does (in a deployment one client draws it and
        sends it to the others over the same authenticated, confidential channel):
        the clients derive
        :meth:`~botorch_fed.secure.base.ClientRole.federation_secret` from it.

        Args:
            client_ids: The clients of the federation.
            seed: Seed for reproducible identities, static keys and federation key
                (tests only), or None.

        Returns:
            No server material; for each client a format tag, its Ed25519 private key,
            its static X25519 private key, the directory (ids; per client its Ed25519
            public key, static public key and signature), then the federation key.
        """
        ids = validate_client_ids(client_ids)
        identities = {cid: ed25519_keypair(RandomSource(seed, 3, cid)) for cid in ids}
        statics = {cid: x25519_keypair(RandomSource(seed, 5, cid)) for cid in ids}
        federation_key = RandomSource(seed, 4).bytes(_FEDERATION_KEY)
        directory = PayloadWriter().ids(ids)
        for cid in ids:
            signing, public = identities[cid]
            static_pk = statics[cid][1]
            signature = ed25519_sign(signing, _static_key_message(cid, static_pk))
            directory.raw(public).raw(static_pk).raw(signature)
        shared = directory.raw(federation_key).getvalue()
        return BackendSetup(
            b"",
            {
                cid: _MATERIAL_TAG
                + identities[cid][0]
                + statics[cid][0].private_bytes_raw()
                + shared
                for cid in ids
            },
        )

    def client(
        self, client_id: int, material: bytes = b"", *, seed: int | None = None
    ) -> ClientRole:
        """Create the role of client ``client_id``.

        The role checks the directory once here (every static key's signature) and
        derives its long-term MAC keys with every peer; sessions reuse them.

        Args:
            client_id: This client's id.
            material: ``setup(...).for_client(client_id)``: its signing key, static
                key, the directory and the federation key, received out of band.
            seed: Seed for this client's session keys (tests only), or None.

        Raises:
            ConfigurationError: Missing or malformed material (material of the earlier
                format without static keys, a federation key missing or all zero
                included), or a directory whose keys for ``client_id`` are not this
                client's or that lists one key for several clients.
            KeyMismatchError: A directory entry whose static key carries no valid
                signature of that client's identity (or is not a usable X25519 key);
                the error names that client.
        """
        return _MaskingClient(self, client_id, _identity(client_id, material), seed=seed)

    def max_abs_supported(self, n_clients: int) -> float:
        """``2^(63 - fraction_bits) / n_clients`` (the fixed-point headroom)."""
        return fixed_point.max_abs_supported(n_clients, self.fraction_bits)


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


class _MaskingServer(ServerRole):
    backend: MaskingBackend

    def _begin(self) -> dict[int, bytes]:
        self.t = self.backend.session_threshold(len(self.client_ids))
        self.need = max(self.t, self.backend.min_clients)
        tail = PayloadWriter().u32(self.t).u32(self.backend.fraction_bits).getvalue()
        return dict.fromkeys(self.client_ids, tail)

    def _handle(self, round: int, payloads: dict[int, bytes]) -> dict[int, bytes] | np.ndarray:
        if round == 0:
            return self._route_keys(payloads)
        if round == 1:
            return self._route_shares(payloads)
        if round == 2:
            return self._collect_masked(payloads)
        if round == 3:
            return self._route_tags(payloads)
        return self._unmask(payloads)

    def _route_keys(self, payloads: dict[int, bytes]) -> dict[int, bytes]:
        self.u1 = self._require(payloads, self.need, "advertised keys")
        self.keys: dict[int, tuple[bytes, bytes]] = {}
        tags: dict[int, dict[int, bytes]] = {}  # sender -> {recipient: tag}
        seen: set[bytes] = set()
        for cid in self.u1:
            with error_context(cid, None, None):
                reader = PayloadReader(payloads[cid])
                c_pk, s_pk = reader.raw(32), reader.raw(32)
                others = [v for v in self.client_ids if v != cid]
                tags[cid] = _read_tags(reader, others, "key tags", cid)
                reader.done()
            if c_pk in seen or s_pk in seen or c_pk == s_pk:
                raise ProtocolError("reused X25519 public key", client_id=cid)
            seen.update((c_pk, s_pk))
            self.keys[cid] = (c_pk, s_pk)
        out = {}
        for v in self.u1:  # every client gets the keys with the tags addressed to it
            writer = PayloadWriter().ids(self.u1)
            for u in self.u1:
                writer.raw(self.keys[u][0]).raw(self.keys[u][1])
                if u != v:
                    writer.raw(tags[u][v])
            out[v] = writer.getvalue()
        return out

    def _route_shares(self, payloads: dict[int, bytes]) -> dict[int, bytes]:
        self.u2 = self._require(payloads, self.need, "shared their keys")
        self.commitments: dict[int, bytes] = {}
        inbox: dict[int, list[tuple[int, bytes]]] = {v: [] for v in self.u2}
        for u in self.u2:
            with error_context(u, None, None):
                reader = PayloadReader(payloads[u])
                self.commitments[u] = reader.raw(32)
                n = reader.u32()
                targets = []
                for _ in range(n):
                    v = reader.u32()
                    ct = reader.blob()
                    targets.append(v)
                    if v in inbox:
                        inbox[v].append((u, ct))
                reader.done()
            if sorted(targets) != [v for v in self.u1 if v != u]:
                raise ProtocolError(
                    "shares must address every other client of U1 exactly once",
                    client_id=u,
                )
        out = {}
        for v in self.u2:
            writer = PayloadWriter().ids(self.u2).u32(len(inbox[v]))
            for u, ct in inbox[v]:
                writer.u32(u).blob(ct)
            out[v] = writer.getvalue()
        return out

    def _collect_masked(self, payloads: dict[int, bytes]) -> dict[int, bytes]:
        self.u3 = self._require(payloads, self.need, "sent a masked input")
        total = np.zeros(self.length, dtype=np.uint64)
        for u in self.u3:
            with error_context(u, None, None):
                reader = PayloadReader(payloads[u])
                total += reader.array("u", self.length)
                reader.done()
        self.total = total
        announce = PayloadWriter().ids(self.u3).getvalue()
        return dict.fromkeys(self.u3, announce)

    def _route_tags(self, payloads: dict[int, bytes]) -> dict[int, bytes]:
        self.u4 = self._require(payloads, self.need, "endorsed the contributor list")
        tags: dict[int, dict[int, bytes]] = {}  # sender -> {recipient: tag}
        for u in self.u4:
            with error_context(u, None, None):
                reader = PayloadReader(payloads[u])
                others = [v for v in self.u3 if v != u]
                tags[u] = _read_tags(reader, others, "consistency tags", u)
                reader.done()
        out = {}
        for v in self.u4:
            writer = PayloadWriter().ids(self.u4)
            for u in self.u4:
                if u != v:
                    writer.raw(tags[u][v])
            out[v] = writer.getvalue()
        return out

    def _unmask(self, payloads: dict[int, bytes]) -> np.ndarray:
        responders = self._require(payloads, self.t, "sent unmasking shares")
        dropped = [v for v in self.u2 if v not in set(self.u3)]
        shares: dict[int, dict[int, int]] = {}  # peer -> {x: share}
        for u in responders:
            with error_context(u, None, None):
                reader = PayloadReader(payloads[u])
                for v in self.u2:
                    if reader.u32() != v:
                        raise TamperedMessageError("unmasking shares out of order")
                    shares.setdefault(v, {})[u + 1] = shamir.share_from_bytes(
                        reader.raw(shamir.SHARE_SIZE)
                    )
                reader.done()
        xs = [u + 1 for u in responders[: self.t]]
        lam = shamir.lagrange_at_zero(xs)
        session = self.session_id
        assert session is not None
        total = self.total.copy()
        for v in self.u3:
            seed = self._reconstruct(shares[v], xs, lam, v, "self-mask seed")
            if _commit(seed, session, v) != self.commitments[v]:
                raise TamperedMessageError(
                    f"reconstructed self-mask seed of client {v} does not match its "
                    "commitment (a survivor sent a wrong share)"
                )
            total -= _self_mask(seed, session, v, self.length)
        for d in dropped:
            raw = self._reconstruct(shares[d], xs, lam, d, "mask key")
            private = x25519_private_from_bytes(raw)
            if private.public_key().public_bytes_raw() != self.keys[d][1]:
                raise TamperedMessageError(
                    f"reconstructed mask key of dropped client {d} does not match its "
                    "advertised public key (a survivor sent a wrong share)"
                )
            for u in self.u3:
                mask = _pair_mask(
                    x25519_shared(private, self.keys[u][1]), session, u, d, self.length
                )
                if u < d:
                    total -= mask
                else:
                    total += mask
        self._contributors = self.u3
        return fixed_point.decode(total, self.backend.fraction_bits)

    @staticmethod
    def _reconstruct(
        shares: dict[int, int], xs: list[int], lam: list[int], v: int, what: str
    ) -> bytes:
        try:
            return shamir.reconstruct({x: shares[x] for x in xs}, 32, lam)
        except TamperedMessageError as exc:
            raise TamperedMessageError(
                f"shares of the {what} of client {v} are inconsistent ({exc.detail})"
            ) from exc


class _MaskingClient(ClientRole):
    backend: MaskingBackend

    def __init__(
        self,
        backend: MaskingBackend,
        client_id: int,
        identity: _Identity,
        *,
        seed: int | None = None,
    ) -> None:
        super().__init__(backend, client_id, seed=seed)
        self._signing_key = identity.signing_key
        self._directory = identity.directory
        self._federation_key = identity.federation_key
        # long-term, per peer: checked and derived once (``_identity``), never per session
        self._send_keys = identity.send_keys
        self._receive_keys = identity.receive_keys

    def federation_secret(self) -> bytes:
        """HKDF-SHA256 of the federation key of :meth:`MaskingBackend.setup` (every
        client holds it, the server does not) under its own label."""
        return hkdf(self._federation_key, label("masking/federation-secret", b""))

    def _check_view(self, ids: tuple[int, ...], superset: tuple[int, ...], what: str) -> None:
        if not set(ids) <= set(superset) or list(ids) != sorted(set(ids)):
            raise ProtocolError(f"server's {what} {list(ids)} is not a subset of {list(superset)}")
        if self.client_id not in ids:
            raise ProtocolError(f"this client is missing from the server's {what}")
        if len(ids) < self.need:
            raise TooFewClientsError(
                f"server's {what} has {len(ids)} clients, fewer than {self.need} "
                f"(threshold {self.t}, min_clients {self.backend.min_clients}); refusing"
            )

    def _begin(self, reader: PayloadReader, x: np.ndarray | None) -> bytes:
        t, fraction_bits = reader.u32(), reader.u32()
        reader.done()
        if fraction_bits != self.backend.fraction_bits:
            raise ProtocolError(
                f"session uses fraction_bits={fraction_bits}, this client is configured "
                f"with {self.backend.fraction_bits}"
            )
        own = self.backend.session_threshold(self.n_clients)
        if not own <= t <= self.n_clients:
            raise ProtocolError(
                f"session announces threshold {t}; this client requires "
                f"{own} <= t <= {self.n_clients}"
            )
        unknown = [cid for cid in self.client_ids if cid not in self._directory]
        if unknown:
            raise ProtocolError(
                f"the session lists clients {unknown} whose identities this client does not "
                "hold (not in its directory of public keys); refusing"
            )
        self.t = t
        self.need = max(t, self.backend.min_clients)
        self._c_private, self._c_pk = x25519_keypair(self._rand)
        self._s_private, self._s_pk = x25519_keypair(self._rand)
        session, u = self.session_id or b"", self.client_id
        others = [v for v in self.client_ids if v != u]
        writer = PayloadWriter().raw(self._c_pk).raw(self._s_pk).u32(len(others))
        for v in others:
            message = _keys_message(session, u, v, self._c_pk, self._s_pk, self._transcript)
            writer.u32(v).raw(mac_tag(self._send_keys[v], message))
        return writer.getvalue()

    def _handle(self, round: int, reader: PayloadReader, x: np.ndarray | None) -> bytes:
        if round == 1:
            return self._share_keys(reader)
        if round == 2:
            return self._masked_input(reader, x)
        if round == 3:
            return self._endorse_contributors(reader)
        if round == 4:
            return self._unmasking_shares(reader)
        raise ProtocolError(f"the masking protocol has no round {round}")

    def _share_key(self, v: int) -> bytes:
        key = self._share_keys_cache.get(v)
        if key is None:
            u = self.client_id
            lo, hi = (u, v) if u < v else (v, u)
            shared = x25519_shared(self._c_private, self._peers[v][0])
            key = hkdf(shared, label("masking/r1/share-enc", self.session_id or b"", lo, hi))
            self._share_keys_cache[v] = key
        return key

    def _share_keys(self, reader: PayloadReader) -> bytes:
        u = self.client_id
        u1 = reader.ids()
        peers: dict[int, tuple[bytes, bytes]] = {}
        tags: dict[int, bytes] = {}
        for v in u1:
            peers[v] = (reader.raw(32), reader.raw(32))
            if v != u:
                tags[v] = reader.raw(MAC_SIZE)
        reader.done()
        self._check_view(u1, self.client_ids, "key list U1")
        if peers[u] != (self._c_pk, self._s_pk):
            raise KeyMismatchError("server advertised different public keys for this client")
        session = self.session_id or b""
        for v, tag in tags.items():
            c_pk, s_pk = peers[v]
            message = _keys_message(session, v, u, c_pk, s_pk, self._transcript)
            if not mac_verify(self._receive_keys[v], tag, message):
                raise KeyMismatchError(
                    f"the public keys the server forwarded for client {v} carry no valid "
                    f"tag of client {v} over them and this client's transcript "
                    "(substituted, altered, from another session, or the server told "
                    "the two clients different values); refusing"
                )
        flat = [k for pair in peers.values() for k in pair]
        if len(set(flat)) != len(flat):
            raise ProtocolError("server's key list reuses a public key")
        self.u1, self._peers = u1, peers
        self._u1_digest = _u1_digest(session, peers)
        self._share_keys_cache: dict[int, bytes] = {}
        self._b = self._rand.bytes(32)
        xs = [v + 1 for v in u1]
        s_shares = shamir.split(self._s_private.private_bytes_raw(), xs, self.t, self._rand.bytes)
        b_shares = shamir.split(self._b, xs, self.t, self._rand.bytes)
        self._received = {u: (s_shares[u + 1], b_shares[u + 1])}
        writer = PayloadWriter().raw(_commit(self._b, session, u)).u32(len(u1) - 1)
        for v in u1:
            if v == u:
                continue
            plaintext = (
                struct.pack(">II", u, v)
                + shamir.share_to_bytes(s_shares[v + 1])
                + shamir.share_to_bytes(b_shares[v + 1])
            )
            ct = aead_seal(
                self._share_key(v), _share_nonce(u, v), plaintext, label("share", session, u, v)
            )
            writer.u32(v).blob(ct)
        return writer.getvalue()

    def _masked_input(self, reader: PayloadReader, x: np.ndarray | None) -> bytes:
        u2 = reader.ids()
        n = reader.u32()
        received = {}
        for _ in range(n):
            sender = reader.u32()
            received[sender] = reader.blob()
        reader.done()
        self._check_view(u2, self.u1, "share-holder list U2")
        u = self.client_id
        if sorted(received) != [v for v in u2 if v != u]:
            raise ProtocolError("server did not forward exactly one share per peer in U2")
        session = self.session_id or b""
        for sender, ct in received.items():
            try:
                plaintext = aead_open(
                    self._share_key(sender),
                    _share_nonce(sender, u),
                    ct,
                    label("share", session, sender, u),
                )
            except TamperedMessageError as exc:
                raise TamperedMessageError(
                    f"encrypted share from client {sender} failed authentication "
                    "(altered in transit or keys substituted)"
                ) from exc
            if len(plaintext) != _SHARE_PLAINTEXT or plaintext[:8] != struct.pack(">II", sender, u):
                raise TamperedMessageError(f"malformed share from client {sender}")
            self._received[sender] = (
                shamir.share_from_bytes(plaintext[8 : 8 + shamir.SHARE_SIZE]),
                shamir.share_from_bytes(plaintext[8 + shamir.SHARE_SIZE :]),
            )
        self.u2 = u2
        arr = self.checked_input(x, self.backend.max_abs_supported(self.n_clients))
        y = fixed_point.encode(arr, self.n_clients, self.backend.fraction_bits)
        y += _self_mask(self._b, session, u, self.length)
        for v in u2:
            if v == u:
                continue
            mask = _pair_mask(
                x25519_shared(self._s_private, self._peers[v][1]), session, u, v, self.length
            )
            if u < v:
                y += mask
            else:
                y -= mask
        return PayloadWriter().array(y).getvalue()

    def _endorse_contributors(self, reader: PayloadReader) -> bytes:
        u3 = reader.ids()
        reader.done()
        self._check_view(u3, self.u2, "contributor list U3")
        self.u3 = u3
        session, u = self.session_id or b"", self.client_id
        others = [v for v in u3 if v != u]
        writer = PayloadWriter().u32(len(others))
        for v in others:  # the one list this client endorses in this session, to everyone
            message = _survivors_message(session, u, v, u3, self._u1_digest, self._transcript)
            writer.u32(v).raw(mac_tag(self._send_keys[v], message))
        return writer.getvalue()

    def _unmasking_shares(self, reader: PayloadReader) -> bytes:
        u = self.client_id
        u4 = reader.ids()
        tags = {v: reader.raw(MAC_SIZE) for v in u4 if v != u}
        reader.done()
        self._check_view(u4, self.u3, "endorser list U4")
        session = self.session_id or b""
        # every member of U4 but this client must have endorsed this client's own lists;
        # with this client that makes |U4| >= max(t, min_clients) endorsers (_check_view)
        for v, tag in tags.items():
            message = _survivors_message(session, v, u, self.u3, self._u1_digest, self._transcript)
            if not mac_verify(self._receive_keys[v], tag, message):
                raise TamperedMessageError(
                    f"consistency check failed: client {v}'s tag does not cover this "
                    f"client's contributor list {list(self.u3)}, key list U1 and transcript "
                    "of this session (the server showed clients different lists or told "
                    "them different values, replayed a tag or altered one); "
                    "revealing no shares"
                )
        survivors = set(self.u3)
        writer = PayloadWriter()
        for v in self.u2:
            s_share, b_share = self._received[v]
            # Never both secrets of one peer: b for contributors, s for dropouts.
            writer.u32(v).raw(shamir.share_to_bytes(b_share if v in survivors else s_share))
        return writer.getvalue()
