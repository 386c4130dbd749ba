r"""The ``masking`` backend: pairwise double masking with dropout recovery, secure
against an actively malicious server.

Bonawitz, Ivanov, Kreuter, Marcedone, McMahan, Patel, Ramage, Segal, Seth, "Practical
Secure Aggregation for Privacy-Preserving Machine Learning", CCS 2017, the protocol
of Fig. 4 *with* its active-security steps: every client holds a long-term Ed25519
signing identity whose public key reaches every other client out of band (with the
rest of the setup material, :meth:`MaskingBackend.setup`), signs the keys it
advertises, and reveals shares only after a consistency round. Each client ``u``
encodes its vector in fixed point mod 2^64 (resolution 2^-40, see
:mod:`botorch_fed.secure.fixed_point`) and sends

.. code-block:: text

    y_u = x_u + PRG(b_u) + sum_{v in U2, u < v} PRG(s_uv) - sum_{v in U2, v < u} PRG(s_uv)

where ``s_uv`` is an X25519 agreement between ``u`` and ``v`` (HKDF-SHA256 bound to
the session, the round and the pair), ``b_u`` a fresh self-mask seed, and PRG the
ChaCha20 keystream. Pairwise masks cancel in the sum; the self masks are removed
with ``b_u`` reconstructed from Shamir shares (threshold ``t``, default
``2M // 3 + 1``) held by the other clients, and the pairwise masks of clients that
dropped after sharing their keys are removed with their X25519 mask key
reconstructed the same way. A client never reveals both secrets of one peer. Shares
travel through the server encrypted with ChaCha20-Poly1305 under a key from a
second X25519 agreement, so the server cannot read them.

Rounds:

0. ``advertise_keys``: clients send two X25519 public keys (share encryption, masks)
   and their Ed25519 signature over (session, client, keys).
1. ``share_keys``: the server broadcasts the signed keys of the responders ``U1``;
   every client checks every signature against the peer's long-term public key (a
   server that substitutes a key is caught: ``KeyMismatchError``), then sends
   encrypted Shamir shares of (mask private key, ``b_u``) for every peer and a
   SHA-256 commitment to ``b_u``.
2. ``masked_input``: the server routes the shares to the responders ``U2``; clients
   send ``y_u``.
3. ``consistency_check``: the server announces the contributors ``U3``; every
   contributor signs (session, itself, ``U3``, the digest of the signed-key list
   ``U1`` it saw). ``U1`` holds every client's fresh keys of this session, so a
   signature from another session, even one with the same id, never verifies.
4. ``unmasking``: the server forwards the signatures of the responders ``U4``; a
   client reveals shares only if ``U4`` is a subset of its ``U3`` with at least ``t``
   members and the first ``t`` signatures cover *its* ``U3`` and ``U1`` (else
   ``TamperedMessageError``: the server showed clients different lists). Survivors
   then send the ``b`` shares of ``U3`` and the mask-key shares of ``U2 \ U3``. The
   server reconstructs, checks every secret against its commitment / public key,
   removes the masks and decodes the sum.

Why the consistency round suffices: an honest client signs only the one ``U3`` it was
shown, so two different survivor sets cannot both gather ``t`` signatures from honest
clients when ``t > M / 2``; a peer's self-mask seed and mask key are therefore never
both revealed. With ``c`` clients colluding with the server the condition is
``t > (M + c) / 2``: the default ``2M // 3 + 1`` covers ``c < M / 3``.
"""

from __future__ import annotations

import hashlib
import struct

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
    x25519_keypair,
    x25519_private_from_bytes,
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


_SIGNATURE = 64
_FEDERATION_KEY = 32  # bytes of the clients' shared federation key (setup material)


def default_threshold(n_clients: int) -> int:
    """Default Shamir threshold ``t = 2n // 3 + 1`` (more than two thirds: secure
    against a malicious server colluding with fewer than ``n / 3`` clients)."""
    return 2 * n_clients // 3 + 1


def _keys_message(session: bytes, u: int, c_pk: bytes, s_pk: bytes) -> bytes:
    return label("masking/r0/signed-keys", session, u) + c_pk + s_pk


def _survivors_message(
    session: bytes, signer: int, u3: tuple[int, ...], u1_digest: bytes, transcript: bytes
) -> bytes:
    # the signer, the contributor list, the digest of the signed-key list U1 that the
    # verifier itself saw and the verifier's own transcript (ClientRole.step): U1 holds
    # every client's fresh keys of this session, so a signature made in another session
    # (even one with the same id), over a different U1 view or by a client the server
    # told something else never verifies
    head = label("masking/r3/survivors", session, signer, len(u3), *u3)
    return head + u1_digest + label("masking/r3/transcript", transcript)


def _u1_digest(session: bytes, signed: dict[int, tuple[bytes, bytes, bytes]]) -> bytes:
    writer = PayloadWriter().ids(tuple(signed))
    for v in signed:
        writer.raw(signed[v][0]).raw(signed[v][1])
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


class MaskingBackend(SecureAggregationBackend):
    """Bonawitz-style double masking (X25519, HKDF-SHA256, ChaCha20, Shamir, Ed25519),
    secure against a malicious server (see the module docstring).

    Every client needs its material from :meth:`setup`: its Ed25519 signing key, the
    federation's directory of public keys and the federation key (the source of
    :meth:`~botorch_fed.secure.base.ClientRole.federation_secret`).

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
        """Give every client a long-term Ed25519 signing identity and the federation key.

        In a deployment each client draws its own key pair and the public keys are
        exchanged out of band (never through the server); here the identities are
        drawn for all clients at once. The federation key is 32 random bytes that
        every client of the federation receives with its identity and the server
        never does (in a deployment one client draws it and sends it to the others
        over the same authenticated, confidential channel): the clients derive
        :meth:`~botorch_fed.secure.base.ClientRole.federation_secret` from it.

        Args:
            client_ids: The clients of the federation.
            seed: Seed for reproducible identities and federation key (tests only),
                or None.

        Returns:
            No server material; for each client its private key, the directory of
            every client's public key, then the federation key.
        """
        ids = validate_client_ids(client_ids)
        identities = {cid: ed25519_keypair(RandomSource(seed, 3, cid)) for cid in ids}
        federation_key = RandomSource(seed, 4).bytes(_FEDERATION_KEY)
        directory = PayloadWriter().ids(ids)
        for cid in ids:
            directory.raw(identities[cid][1])
        shared = directory.raw(federation_key).getvalue()
        return BackendSetup(b"", {cid: identities[cid][0] + shared for cid in ids})

    def client(
        self, client_id: int, material: bytes = b"", *, seed: int | None = None
    ) -> ClientRole:
        """Create the role of client ``client_id``.

        Args:
            client_id: This client's id.
            material: ``setup(...).for_client(client_id)``: its signing key, the
                directory of public keys and the federation key, received out of band.
            seed: Seed for this client's session keys (tests only), or None.

        Raises:
            ConfigurationError: Missing or malformed material (a federation key
                missing or all zero included), or a directory whose key for
                ``client_id`` is not this client's.
        """
        return _MaskingClient(self, client_id, _identity(client_id, material), seed=seed)

    def max_abs_supported(self, n_clients: int) -> float:
        """``2^(63 - fraction_bits) / n_clients`` (the fixed-point headroom)."""
        return fixed_point.max_abs_supported(n_clients, self.fraction_bits)


def _identity(client_id: int, material: bytes) -> tuple[bytes, dict[int, bytes], bytes]:
    """This client's signing key, the directory ``{client: Ed25519 public key}`` and
    the federation key."""
    if not material:
        raise ConfigurationError(
            f"masking client {client_id} needs its identity material (signing key, the "
            "directory of public keys and the federation key) from MaskingBackend.setup(); "
            "got none"
        )
    try:
        reader = PayloadReader(material)
        private = reader.raw(32)
        ids = reader.ids()
        directory = {cid: reader.raw(32) for cid in ids}
        federation_key = reader.raw(_FEDERATION_KEY)
        reader.done()
    except TamperedMessageError as exc:
        raise ConfigurationError(
            f"masking client {client_id}: malformed identity material ({exc}; expected "
            "the signing key, the directory of public keys and the 32-byte federation key)"
        ) from exc
    if federation_key == bytes(_FEDERATION_KEY):
        raise ConfigurationError(
            f"masking client {client_id}: the federation key of its identity material is "
            "all zero (a placeholder, not a secret); refusing it"
        )
    if len(set(directory.values())) != len(directory):
        raise ConfigurationError(
            f"masking client {client_id}: the directory lists one public key for several "
            "clients (one signature would count for each of them); refusing it"
        )
    mine = directory.get(client_id)
    if mine is None:
        raise ConfigurationError(
            f"masking client {client_id} is not in the directory of its identity material"
        )
    if ed25519_public(private) != mine:
        raise ConfigurationError(
            f"masking client {client_id}: the directory's public key is not this client's"
        )
    return private, directory, federation_key


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
            return self._route_signatures(payloads)
        return self._unmask(payloads)

    def _route_keys(self, payloads: dict[int, bytes]) -> dict[int, bytes]:
        self.u1 = self._require(payloads, self.need, "advertised keys")
        self.keys: dict[int, tuple[bytes, bytes]] = {}
        signatures: dict[int, bytes] = {}
        seen: set[bytes] = set()
        for cid in self.u1:
            with error_context(cid, None, None):
                reader = PayloadReader(payloads[cid])
                c_pk, s_pk = reader.raw(32), reader.raw(32)
                signatures[cid] = reader.raw(_SIGNATURE)
                reader.done()
            if c_pk in seen or s_pk in seen or c_pk == s_pk:
                raise ProtocolError("reused X25519 public key", client_id=cid)
            seen.update((c_pk, s_pk))
            self.keys[cid] = (c_pk, s_pk)
        writer = PayloadWriter().ids(self.u1)
        for cid in self.u1:
            writer.raw(self.keys[cid][0]).raw(self.keys[cid][1]).raw(signatures[cid])
        broadcast = writer.getvalue()
        return dict.fromkeys(self.u1, broadcast)

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

    def _route_signatures(self, payloads: dict[int, bytes]) -> dict[int, bytes]:
        self.u4 = self._require(payloads, self.need, "signed the contributor list")
        writer = PayloadWriter().ids(self.u4)
        for u in self.u4:
            with error_context(u, None, None):
                reader = PayloadReader(payloads[u])
                writer.raw(reader.raw(_SIGNATURE))
                reader.done()
        broadcast = writer.getvalue()
        return dict.fromkeys(self.u4, broadcast)

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
        identity: tuple[bytes, dict[int, bytes], bytes],
        *,
        seed: int | None = None,
    ) -> None:
        super().__init__(backend, client_id, seed=seed)
        self._signing_key, self._directory, self._federation_key = identity

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
        message = _keys_message(self.session_id or b"", self.client_id, self._c_pk, self._s_pk)
        return self._c_pk + self._s_pk + ed25519_sign(self._signing_key, message)

    def _handle(self, round: int, reader: PayloadReader, x: np.ndarray | None) -> bytes:
        if round == 1:
            return self._share_keys(reader)
        if round == 2:
            return self._masked_input(reader, x)
        if round == 3:
            return self._sign_contributors(reader)
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
        u1 = reader.ids()
        signed = {v: (reader.raw(32), reader.raw(32), reader.raw(_SIGNATURE)) for v in u1}
        reader.done()
        self._check_view(u1, self.client_ids, "key list U1")
        peers = {v: (c_pk, s_pk) for v, (c_pk, s_pk, _) in signed.items()}
        if peers[self.client_id] != (self._c_pk, self._s_pk):
            raise KeyMismatchError("server advertised different public keys for this client")
        for v, (c_pk, s_pk, signature) in signed.items():
            if v == self.client_id:  # its own keys were compared above
                continue
            message = _keys_message(self.session_id or b"", v, c_pk, s_pk)
            if not ed25519_verify(self._directory[v], signature, message):
                raise KeyMismatchError(
                    f"the public keys the server forwarded for client {v} carry no valid "
                    f"signature of client {v} (substituted or altered); refusing"
                )
        flat = [k for pair in peers.values() for k in pair]
        if len(set(flat)) != len(flat):
            raise ProtocolError("server's key list reuses a public key")
        self.u1, self._peers = u1, peers
        self._u1_digest = _u1_digest(self.session_id or b"", signed)
        self._share_keys_cache: dict[int, bytes] = {}
        session = self.session_id or b""
        u = self.client_id
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

    def _sign_contributors(self, reader: PayloadReader) -> bytes:
        u3 = reader.ids()
        reader.done()
        self._check_view(u3, self.u2, "contributor list U3")
        self.u3 = u3
        message = _survivors_message(
            self.session_id or b"", self.client_id, u3, self._u1_digest, self._transcript
        )
        return ed25519_sign(self._signing_key, message)

    def _unmasking_shares(self, reader: PayloadReader) -> bytes:
        u4 = reader.ids()
        signatures = {v: reader.raw(_SIGNATURE) for v in u4}
        reader.done()
        self._check_view(u4, self.u3, "signer list U4")
        session = self.session_id or b""
        # t valid signatures on this client's own lists are what the argument needs;
        # an invalid one before that ends the session, later ones are not read
        valid = 0
        for v, signature in signatures.items():
            if valid >= self.t:
                break
            message = _survivors_message(session, v, self.u3, self._u1_digest, self._transcript)
            valid += 1
            if not ed25519_verify(self._directory[v], signature, message):
                raise TamperedMessageError(
                    f"consistency check failed: client {v}'s signature does not cover this "
                    f"client's contributor list {list(self.u3)}, key list U1 and transcript "
                    "of this session (the server showed clients different lists or told "
                    "them different values, replayed a signature or altered one); "
                    "revealing no shares"
                )
        survivors = set(self.u3)
        writer = PayloadWriter()
        for v in self.u2:
            s_share, b_share = self._received[v]
            # Never both secrets of one peer: b for contributors, s for dropouts.
            writer.u32(v).raw(shamir.share_to_bytes(b_share if v in survivors else s_share))
        return writer.getvalue()
