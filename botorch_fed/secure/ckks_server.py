r"""The server role of the ``ckks`` backend: it routes the clients' nonces, adds their
ciphertexts under the public context (it holds no secret key) and sends the encrypted
aggregate to the contributors (see :mod:`botorch_fed.secure.ckks`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from botorch_fed.secure.ckks_guards import _NONCE, _is_fresh_shape
from botorch_fed.secure.ckks_keys import ServerKeyMaterial, import_tenseal
from botorch_fed.secure.errors import (
    ConfigurationError,
    DropoutError,
    KeyMismatchError,
    TamperedMessageError,
)
from botorch_fed.secure.server_role import ServerRole
from botorch_fed.secure.validation import error_context
from botorch_fed.secure.wire import PayloadReader, PayloadWriter

if TYPE_CHECKING:
    from botorch_fed.secure.ckks import CKKSBackend


class _CKKSServer(ServerRole):
    backend: CKKSBackend

    def __init__(
        self, backend: CKKSBackend, material: ServerKeyMaterial, *, seed: int | None
    ) -> None:
        super().__init__(backend, seed=seed)
        backend._check_material(material)
        ts = import_tenseal()
        context = ts.context_from(material.context, n_threads=backend.n_threads)
        if context.is_private():
            raise ConfigurationError(
                "the server material contains a secret key; the server must only get "
                "the public context (serialize(save_secret_key=False))"
            )
        context.auto_mod_switch = False
        context.auto_rescale = False
        context.auto_relin = False
        self.context = context
        self._ts = ts
        self._key_id = material.key_id
        self._decryptors = material.decryptors
        self._commitments: dict[int, bytes] = {}  # each client's nonce for its next session
        self._committed = False  # whether the session in progress opened with them

    def committed_nonces(self) -> dict[int, bytes]:
        """``{client: nonce}`` the clients committed to for their next session."""
        return dict(self._commitments)

    def restore_committed_nonces(self, commitments: dict[int, bytes]) -> None:
        """Restore :meth:`commitments` (a resumed server)."""
        for cid, nonce in commitments.items():
            if not isinstance(nonce, bytes) or len(nonce) != _NONCE:
                raise ConfigurationError(f"client {cid}'s committed nonce must be {_NONCE} bytes")
        self._commitments = dict(commitments)

    def last_round_unanswered(self) -> bool:
        """The decryption round: its replies are empty acknowledgements."""
        return self._session is not None and not self.finished and self.round == 2

    def _begin(self) -> dict[int, bytes]:
        # with every client's committed nonce the session binds them at once and the
        # clients encrypt in round 0; otherwise a round of nonces first. Either way the
        # commitments are used up (the clients' are too).
        held = [self._commitments.pop(cid, None) for cid in self.client_ids]
        self._committed = all(nonce is not None for nonce in held)
        writer = PayloadWriter().raw(self._key_id).u32(int(self._committed))
        if self._committed:
            writer.ids(self.client_ids)
            for nonce in held:
                assert nonce is not None
                writer.raw(nonce)
        return dict.fromkeys(self.client_ids, writer.getvalue())

    def _handle(
        self, round: int, payloads: dict[int, bytes]
    ) -> dict[int, bytes] | np.ndarray | None:
        if round == 0 and self._committed:
            out = self._aggregate(payloads, committed=True)
            self._round = 1  # the decryption is round 2, as in an uncommitted session
            return out
        if round == 0:
            return self._route_nonces(payloads)
        if round == 1:
            return self._aggregate(payloads)
        self._finish(payloads)
        return None

    def _route_nonces(self, payloads: dict[int, bytes]) -> dict[int, bytes]:
        ids = self._require(payloads, self.backend.min_clients, "sent a nonce")
        writer = PayloadWriter().ids(ids)
        for cid in ids:
            with error_context(cid, None, None):
                reader = PayloadReader(payloads[cid])
                writer.raw(reader.raw(_NONCE))
                commitment = reader.raw(_NONCE)
                reader.done()
            self._commitments[cid] = commitment
        broadcast = writer.getvalue()
        return dict.fromkeys(ids, broadcast)

    def _aggregate(self, payloads: dict[int, bytes], committed: bool = False) -> dict[int, bytes]:
        ids = self._require(payloads, self.backend.min_clients, "submitted ciphertexts")
        n_chunks = self.backend.n_chunks(self.length)
        acc: list = [None] * n_chunks
        for cid in ids:
            reader = PayloadReader(payloads[cid])
            with error_context(cid, None, None):
                if committed:  # the nonce of its next session comes first
                    self._commitments[cid] = reader.raw(_NONCE)
                if reader.u32() != n_chunks:
                    raise TamperedMessageError(f"expected {n_chunks} ciphertexts")
                blobs = [reader.blob() for _ in range(n_chunks)]
                reader.done()
            for k, blob in enumerate(blobs):
                try:
                    vec = self._ts.ckks_vector_from(self.context, blob)
                except Exception as exc:  # TenSEAL raises ValueError/RuntimeError
                    raise TamperedMessageError(
                        f"ciphertext {k} does not deserialise under the session's public "
                        f"context ({exc})",
                        client_id=cid,
                    ) from exc
                self._check_ciphertext(vec, k, cid)
                try:
                    acc[k] = vec if acc[k] is None else acc[k].add_(vec)
                except Exception as exc:
                    raise KeyMismatchError(
                        f"ciphertext {k} is incompatible with the others ({exc})",
                        client_id=cid,
                    ) from exc
        self._contributors = ids
        writer = PayloadWriter().ids(ids).u32(n_chunks)
        for vec in acc:
            writer.blob(vec.serialize())
        message = writer.getvalue()
        able = [cid for cid in ids if cid in set(self._decryptors)]
        if not able:
            raise DropoutError(
                f"no client holding the secret key {list(self._decryptors)} contributed; "
                "nobody can decrypt"
            )
        return dict.fromkeys(able, message)

    def _check_ciphertext(self, vec: object, k: int, cid: int) -> None:
        """Reject ciphertexts with another shape, scale, level or size (context mismatch)."""
        if not _is_fresh_shape(vec, self.backend.params):
            raise KeyMismatchError(
                f"ciphertext {k} does not match the session's parameters (slots, scale, "
                f"level or size differ: context mismatch)",
                client_id=cid,
            )

    def _finish(self, payloads: dict[int, bytes]) -> None:
        ids = self._require(payloads, 1, "decrypted the aggregate")
        for cid in ids:
            PayloadReader(payloads[cid]).done()  # empty acknowledgement
        return None
