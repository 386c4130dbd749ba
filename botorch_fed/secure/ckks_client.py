r"""The client role of the ``ckks`` backend: it checks its input, encrypts it with the
guard slots of the session and decrypts and checks the aggregate (see
:mod:`botorch_fed.secure.ckks`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from botorch_fed.secure.ckks_guards import (
    _NONCE,
    _binding,
    _canaries,
    _is_fresh_shape,
    _tag_weights,
)
from botorch_fed.secure.ckks_keys import ClientKeyMaterial, import_tenseal
from botorch_fed.secure.client_role import ClientRole
from botorch_fed.secure.crypto import hkdf, label
from botorch_fed.secure.errors import (
    InputError,
    KeyMismatchError,
    ProtocolError,
    TamperedMessageError,
    TooFewClientsError,
)
from botorch_fed.secure.wire import Frame, PayloadReader, PayloadWriter

if TYPE_CHECKING:
    from botorch_fed.secure.ckks import CKKSBackend


class _CKKSClient(ClientRole):
    backend: CKKSBackend

    def __init__(
        self,
        backend: CKKSBackend,
        client_id: int,
        material: ClientKeyMaterial,
        *,
        seed: int | None,
    ) -> None:
        super().__init__(backend, client_id, seed=seed)
        backend._check_material(material)
        self._ts = import_tenseal()
        self._context = self._ts.context_from(material.context, n_threads=backend.n_threads)
        self._key_id = material.key_id
        self._group_key = material.group_key
        self.can_decrypt = bool(material.has_secret_key and self._context.is_private())
        self.input_bound: float | None = None
        r"""The largest ``|x|`` any contributor's input of the next sessions has, when the
        protocol above declares one (e.g. limb digits: 2048; every contributor must
        declare the same); it narrows the decryptor's tolerance, hence what an offset
        added to the aggregate can hide in. ``None``: ``max_abs_supported``."""
        self._session_bound = backend.max_abs_supported(2)
        self._committed: bytes | None = None  # the nonce of this client's next session
        self._offered: bytes | None = None  # the commitment the opening in progress used up

    def federation_secret(self) -> bytes:
        """HKDF-SHA256 of the group key (every client holds it, the server does not)
        under its own label, bound to the key id: the same on every client of the
        federation, independent of the canaries derived from the same key."""
        return hkdf(self._group_key, label("ckks/federation-secret", self._key_id))

    def committed_nonce(self) -> bytes | None:
        """The nonce this client committed to for its next session (sent with its last
        ciphertexts), or None."""
        return self._committed

    def restore_committed_nonce(self, nonce: bytes | None) -> None:
        """Restore :meth:`committed_nonce` (a restarted client of the same session)."""
        if nonce is not None and (not isinstance(nonce, bytes) or len(nonce) != _NONCE):
            raise InputError(f"a committed nonce must be {_NONCE} bytes or None")
        self._committed = nonce

    def saved_state(self) -> dict:
        """Adds the committed nonce (hex, or None)."""
        committed = self._committed
        return {
            **super().saved_state(),
            "committed": None if committed is None else committed.hex(),
        }

    def restore_state(self, state: dict) -> None:
        super().restore_state(state)
        committed = state.get("committed") if isinstance(state, dict) else None
        try:
            self.restore_committed_nonce(None if committed is None else bytes.fromhex(committed))
        except (TypeError, ValueError) as exc:
            raise InputError(f"not a saved client-role state ({exc})") from None

    def _start_session(self, frame: Frame, x: np.ndarray | None) -> bytes:
        self._committed, committed = None, self._committed  # used up by any opening
        self._offered = committed
        return super()._start_session(frame, x)

    def _begin(self, reader: PayloadReader, x: np.ndarray | None) -> bytes:
        key_id = reader.raw(16)
        committed = reader.u32()
        # every opening used the commitment up, whatever it asks (fail closed)
        own, self._offered = self._offered, None
        nonces = {}
        if committed:
            ids = reader.ids()
            nonces = {cid: reader.raw(_NONCE) for cid in ids}
            if ids != self.client_ids:
                raise TamperedMessageError(
                    f"the committed nonces are of clients {list(ids)}, the session's are "
                    f"{list(self.client_ids)}"
                )
        reader.done()
        if key_id != self._key_id:
            raise KeyMismatchError(
                f"session uses CKKS key {key_id.hex()}, this client holds key "
                f"{self._key_id.hex()} (wrong key material or wrong federation)"
            )
        if committed and (own is None or nonces[self.client_id] != own):
            raise TamperedMessageError(
                "the server replaced the nonce this client committed to for this session "
                "(a reused or foreign session, or one it never committed to); refusing"
            )
        # the input is checked now, before anything is sent
        self._session_bound = self.backend.max_abs_supported(self.n_clients)
        if self.input_bound is not None:
            self._session_bound = min(self._session_bound, float(self.input_bound))
        self._input = self.checked_input(
            x,
            self._session_bound,
            reason=(
                "beyond it CKKS's rounding error, which grows with the magnitude, "
                "would exceed the promised accuracy and the integrity checks' "
                "tolerance, or the sum would wrap around"
            ),
        )
        self._binding: bytes | None = None
        self._bound: tuple[int, ...] = ()
        if not committed:  # a nonce now, the ciphertexts next round
            self._nonce = self._rand.bytes(_NONCE)
            return self._nonce + self._commit()
        ciphertexts = self._encrypt_bound(nonces)
        self._round = 1  # the decryption comes as round 2, as in an uncommitted session
        return self._commit() + ciphertexts

    def _commit(self) -> bytes:
        """Draw the nonce of this client's next session (sent now, used then)."""
        self._committed = self._rand.bytes(_NONCE)
        return self._committed

    def _handle(self, round: int, reader: PayloadReader, x: np.ndarray | None) -> bytes:
        if round == 1:
            return self._encrypt(reader, x)
        if round == 2:
            return self._decrypt(reader)
        raise ProtocolError(f"the ckks protocol has no round {round}")

    def _check_list(
        self, ids: tuple[int, ...], superset: tuple[int, ...], what: str, action: str
    ) -> None:
        """A sorted list of distinct ids within ``superset`` that holds this client and
        at least ``min_clients`` clients, else a named error."""
        if (
            list(ids) != sorted(set(ids))
            or not set(ids) <= set(superset)
            or self.client_id not in ids
        ):
            raise ProtocolError(f"implausible {what} {list(ids)}")
        if len(ids) < self.backend.min_clients:
            raise TooFewClientsError(
                f"the server's {what} has {len(ids)} clients, fewer than min_clients="
                f"{self.backend.min_clients}; refusing to {action}"
            )

    def _encrypt(self, reader: PayloadReader, x: np.ndarray | None) -> bytes:
        del x  # the vector checked in round 0 is the one encrypted
        ids = reader.ids()
        nonces = {cid: reader.raw(_NONCE) for cid in ids}
        reader.done()
        self._check_list(ids, self.client_ids, "list of nonce holders", "contribute")
        if nonces[self.client_id] != self._nonce:
            raise TamperedMessageError(
                "the server replaced this client's session nonce (a reused or foreign "
                "session); refusing to encrypt"
            )
        return self._encrypt_bound(nonces)

    def _encrypt_bound(self, nonces: dict[int, bytes]) -> bytes:
        """The ciphertexts of the checked input, bound to ``nonces`` (every client's)."""
        arr = self._input
        # the declared input bound enters the binding: contributors that declared
        # different bounds derive different canaries and the sum fails the guard check
        bound = np.array([self._session_bound], dtype="<f8").tobytes()
        self._binding = _binding(self.session_id or b"", nonces, self._transcript + bound)
        self._bound = tuple(nonces)
        params = self.backend.params
        d = params.data_slots
        n_chunks = self.backend.n_chunks(self.length)
        writer = PayloadWriter().u32(n_chunks)
        buf = np.zeros(params.slots)
        for k in range(n_chunks):
            part = arr[k * d : (k + 1) * d]
            buf[:] = 0.0
            buf[: part.size] = part
            # guard slots: the canary plus a secret linear tag of the data slots, so
            # any offset of the aggregate's data fails the check, whatever the data
            tags = _tag_weights(self._group_key, self._binding, k, part.size, d) @ part
            buf[d:] = _canaries(self._group_key, self._binding, self.client_id, k) + tags
            writer.blob(self._ts.ckks_vector(self._context, buf.tolist()).serialize())
        return writer.getvalue()

    def _decrypt(self, reader: PayloadReader) -> bytes:
        contributors = reader.ids()
        n_chunks = reader.u32()
        blobs = [reader.blob() for _ in range(n_chunks)]
        reader.done()
        self._check_list(contributors, self._bound, "contributor list", "decrypt")
        if n_chunks != self.backend.n_chunks(self.length):
            raise TamperedMessageError(f"aggregate has {n_chunks} ciphertexts")
        if not self.can_decrypt:
            raise ProtocolError("this client holds no secret key and cannot decrypt")
        self.result = self._decrypt_checked(contributors, blobs)
        return b""

    def _expected_guards(
        self, contributors: tuple[int, ...], k: int, values: np.ndarray
    ) -> np.ndarray:
        """What an honest aggregate's guard slots hold for chunk ``k``: the sum of the
        contributors' canaries plus the tag of the decrypted data slots. The tag's
        error is at most the slots' error bound (its weights sum to at most 1), hence
        the check's ``3 tol``: the guard slot's own error, the tag's, and a margin."""
        d = self.backend.params.data_slots
        used = min(d, self.length - k * d)
        assert self._binding is not None  # set when the client encrypted its input
        guards = sum(_canaries(self._group_key, self._binding, cid, k) for cid in contributors)
        return guards + _tag_weights(self._group_key, self._binding, k, used, d) @ values[:used]

    def _decrypt_checked(self, contributors: tuple[int, ...], blobs: list[bytes]) -> np.ndarray:
        params = self.backend.params
        d = params.data_slots
        n = len(contributors)
        # Honest inputs are each at most the session's bound in magnitude (the declared
        # input bound, else max_abs_supported(n_clients)); the decryptor cannot see them
        # individually (they may cancel in the sum), so the tolerance is the promised
        # error bound at that magnitude (the guard slots hold up to it plus a canary).
        tol = params.error_bound(n, n * (self._session_bound + 2.0))
        bound = n * self._session_bound + tol
        assert self._binding is not None
        parts = []
        for k, blob in enumerate(blobs):
            try:
                vec = self._ts.ckks_vector_from(self._context, blob)
                fresh_shape = _is_fresh_shape(vec, params)
            except Exception as exc:
                raise TamperedMessageError(
                    f"aggregate ciphertext {k} does not deserialise/decrypt ({exc})"
                ) from exc
            if not fresh_shape:
                raise TamperedMessageError(
                    f"aggregate ciphertext {k} failed the integrity checks (its slots, "
                    "scale, level or size are not those of a sum of fresh ciphertexts: "
                    "multiplied, rescaled or from other parameters)"
                )
            try:
                values = np.asarray(vec.decrypt(), dtype=np.float64)
            except Exception as exc:
                raise TamperedMessageError(
                    f"aggregate ciphertext {k} does not deserialise/decrypt ({exc})"
                ) from exc
            if values.shape != (params.slots,):
                raise TamperedMessageError(f"aggregate ciphertext {k} has the wrong size")
            used = min(d, self.length - k * d)
            if not np.isfinite(values).all():
                problem = "non-finite values"
            elif np.max(np.abs(values[d:] - self._expected_guards(contributors, k, values))) > (
                3 * tol
            ):
                # checked before anything about the data slots' values: an offset added
                # to the aggregate fails here whatever the data, so no refusal below
                # can depend on it
                problem = (
                    f"guard slots do not hold the {n} contributors' canaries and the data's "
                    "tag (an offset or substituted aggregate, or contributors told "
                    "different values: transcripts differ)"
                )
            elif used < d and np.max(np.abs(values[used:d])) > tol:
                problem = "padding slots are not zero"
            elif np.max(np.abs(values[:used])) > bound:
                problem = f"values exceed {n} times the supported magnitude"
            else:
                parts.append(values[:used])
                continue
            raise TamperedMessageError(
                f"aggregate ciphertext {k} failed the integrity checks ({problem}, "
                f"tolerance {tol:.3g}): corrupted, substituted or encrypted under "
                "another key"
            )
        return np.concatenate(parts)
