r"""The client role of the ``masking`` backend: it checks the peers' tags, shares its
secrets, sends its masked input, endorses the contributor list and reveals shares
(see :mod:`botorch_fed.secure.masking`).
"""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING

import numpy as np

from botorch_fed.secure import fixed_point, shamir
from botorch_fed.secure.client_role import ClientRole
from botorch_fed.secure.crypto import (
    MAC_SIZE,
    aead_open,
    aead_seal,
    hkdf,
    label,
    mac_tag,
    mac_verify,
    x25519_keypair,
    x25519_shared,
)
from botorch_fed.secure.errors import (
    KeyMismatchError,
    ProtocolError,
    TamperedMessageError,
    TooFewClientsError,
)
from botorch_fed.secure.masking_derivations import (
    _commit,
    _keys_message,
    _pair_mask,
    _self_mask,
    _share_nonce,
    _survivors_message,
    _u1_digest,
)
from botorch_fed.secure.masking_identity import _Identity
from botorch_fed.secure.wire import PayloadReader, PayloadWriter

if TYPE_CHECKING:
    from botorch_fed.secure.masking import MaskingBackend

_SHARE_PLAINTEXT = 8 + 2 * shamir.SHARE_SIZE


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
