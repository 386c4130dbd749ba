r"""The server role of the ``masking`` backend: it routes the clients' keys, encrypted
shares and tags, sums the masked inputs and removes the masks with the reconstructed
secrets (see :mod:`botorch_fed.secure.masking`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from botorch_fed.secure import fixed_point, shamir
from botorch_fed.secure.crypto import x25519_private_from_bytes, x25519_shared
from botorch_fed.secure.errors import ProtocolError, TamperedMessageError
from botorch_fed.secure.masking_derivations import _commit, _pair_mask, _read_tags, _self_mask
from botorch_fed.secure.server_role import ServerRole
from botorch_fed.secure.validation import error_context
from botorch_fed.secure.wire import PayloadReader, PayloadWriter

if TYPE_CHECKING:
    from botorch_fed.secure.masking import MaskingBackend


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
