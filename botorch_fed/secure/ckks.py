r"""The ``ckks`` backend: additively homomorphic aggregation with CKKS (TenSEAL).

Cheon, Kim, Kim, Song, "Homomorphic Encryption for Arithmetic of Approximate
Numbers", ASIACRYPT 2017, via TenSEAL (Benaissa et al., 2021) over Microsoft SEAL;
the secure aggregation of the FBO-FedGP paper (paper 000, Sec. 2 and App. B) with a
single key shared by the clients (the paper's multi-key / threshold decryption is
not available in TenSEAL; see ``docs/security.md``).

A client-side :class:`~botorch_fed.secure.ckks_keys.CKKSKeyHolder` generates the keys
(:meth:`CKKSBackend.setup`); the server receives only the public context and cannot
decrypt. Rounds:

0. ``nonces``: each client checks the session's key id and its input (headroom,
   shape, finiteness) and sends a fresh random 16-byte nonce.
1. ``encrypt``: the server broadcasts the nonces; each client checks that its own is
   among them and binds the session to all of them (``SHA-256`` of the server's
   session id, the clients and their nonces), splits the vector it checked in round 0
   into chunks of ``N/2 - 4`` values, appends 4 *guard* slots holding a secret
   per-client canary, the first plus a secret linear tag of the chunk's data (both derived
   from a group key the server does not have and the binding) and sends one
   ciphertext per chunk. The server adds the ciphertexts.
   Because every binding holds a fresh nonce of each client, a server that reuses a
   session id, or replays ciphertexts or an aggregate of another session, fails the
   guard check.
2. ``decrypt``: the server sends the encrypted aggregate and the contributor list
   to every surviving contributor; each decrypts, and the sum stays on the clients
   (``ClientRole.result``); the server receives an empty acknowledgement and
   :meth:`ServerRole.step` returns None. The server never sees any decryption, which
   rules out the IND-CPA^D key-recovery attack of Li & Micciancio (EUROCRYPT 2021)
   by the server. (The former ``release="server"``, a noise-flooded sum returned to
   the server, was removed: the server could average its noise away by
   re-randomising the ciphertext.)

   Before accepting the sum, the decrypting client checks the aggregate's
   structure (scale ``2^scale_bits``, top level, two polynomials: only sums and
   differences of fresh ciphertexts, no plaintext multiplication that could mask
   slots), the guard slots (the sum of the contributors' canaries plus the tag of the
   decrypted data), the padding slots (zero) and the magnitude bound, so a corrupted,
   substituted or partial aggregate raises instead of yielding a wrong sum. The guard
   check comes first: a plaintext offset the server adds to the data slots fails the
   tag whatever the data, so whether a later check on the data's values refuses
   cannot tell the server anything about them.

Accuracy: every slot of the decrypted sum of ``M`` inputs is within
``M * 2^(20 - scale_bits) + 2^-46 * sum_i max|x_i|`` of the exact sum
(:meth:`~botorch_fed.secure.ckks_keys.CKKSParameters.error_bound`): an absolute part
(``M * 9.3e-10`` at the default scale ``2^50``; measured ``~1e-12``) plus a part
relative to the magnitudes (``2^-46 ~ 1.4e-14`` of ``sum_i max|x_i|``; measured
``~1.3e-15``) from SEAL's double-precision FFT, which also perturbs the guard slots.
The guard checks allow that bound at the largest supported magnitude, and
:meth:`CKKSBackend.max_abs_supported` caps the magnitudes (``2^30 / M``) so that the
magnitude-dependent part never exceeds ``2^-16``: honest sums up to the bound always
pass, a forged aggregate passes with probability ``<= ~2^-60`` per ciphertext, and
larger inputs raise :class:`~botorch_fed.secure.errors.HeadroomError` on the client
before anything is encrypted. To sum larger values, divide them by a power of two
first (the absolute part of the error grows by the same factor).
"""

from __future__ import annotations

import hashlib

import numpy as np

from botorch_fed.secure.base import (
    BackendSetup,
    ClientRole,
    RoundSpec,
    SecureAggregationBackend,
    ServerRole,
)
from botorch_fed.secure.ckks_keys import (
    GUARD_SLOTS,
    CKKSKeyHolder,
    CKKSParameters,
    ClientKeyMaterial,
    ServerKeyMaterial,
    import_tenseal,
)
from botorch_fed.secure.crypto import chacha20_uint64, hkdf, label
from botorch_fed.secure.errors import (
    ConfigurationError,
    DropoutError,
    KeyMismatchError,
    ProtocolError,
    TamperedMessageError,
    TooFewClientsError,
)
from botorch_fed.secure.validation import error_context, validate_client_ids
from botorch_fed.secure.wire import PayloadReader, PayloadWriter

__all__ = ["CKKSBackend"]

_ENCRYPTIONS = ("symmetric", "asymmetric")
_NONCE = 16


def _canaries(group_key: bytes, binding: bytes, client_id: int, chunk: int) -> np.ndarray:
    """Secret guard values in ``[1, 2)`` of one client and chunk in the session bound
    to ``binding`` (see :func:`_binding`)."""
    words = np.frombuffer(
        hkdf(group_key, label("ckks/canary", binding, client_id, chunk), 8 * GUARD_SLOTS),
        dtype="<u8",
    )
    return 1.0 + (words >> np.uint64(11)).astype(np.float64) * 2.0**-53


def _tag_weights(group_key: bytes, binding: bytes, chunk: int, used: int, data_slots: int):
    """The ``GUARD_SLOTS x used`` secret weights of the linear tags of chunk ``chunk``'s
    first ``used`` data slots in the session bound to ``binding`` (the same on every
    client, unknown to the server), each in ``[s, 2 s)`` with ``s = 1 / (2 data_slots)``
    -- so a tag ``w . x`` is at most ``max|x|`` in magnitude --, 32 random bits each,
    from ChaCha20 keyed by HKDF of the group key; one independent tag per guard slot.

    An offset ``delta`` the server adds to the data slots changes guard slot ``g`` by
    ``w_g . delta``, which it can only guess: compensating the guard slots by its best
    guess leaves ``(w_g - E w_g) . delta``, of width ``s |delta|`` per slot. The offset
    goes unnoticed only if that stays within ``3 tol`` in all four slots. With a
    declared input bound (``input_bound``: limb digits, at most 2048) ``tol`` is ~1e-9
    per contributor, and a single offset of 1 passes with probability ~``(6 tol /
    s)^4`` ~ 1e-16 at 3 contributors."""
    key = hkdf(group_key, label("ckks/tag", binding, chunk), 32)
    words = chacha20_uint64(key, (GUARD_SLOTS * used + 1) // 2).view("<u4")
    weights = words[: GUARD_SLOTS * used].reshape(GUARD_SLOTS, used)
    return (1.0 + weights.astype(np.float64) * 2.0**-32) / (2 * data_slots)


def _binding(session: bytes, nonces: dict[int, bytes], transcript: bytes) -> bytes:
    """The session's binding: SHA-256 of the server's session id, every client's
    nonce (fresh per session on each client, so the server cannot repeat it) and the
    client's transcript (:meth:`ClientRole.step`: contributors told different values
    derive different canaries, and the aggregate fails the guard check)."""
    writer = PayloadWriter().ids(tuple(nonces))
    for cid in nonces:
        writer.raw(nonces[cid])
    writer.blob(transcript)
    return hashlib.sha256(label("ckks/binding", session) + writer.getvalue()).digest()


def _is_fresh_shape(vec: object, params: CKKSParameters) -> bool:
    """Whether a ciphertext has the slots, scale, level and size of a fresh encryption.

    Sums and differences of fresh ciphertexts keep all four; a product with a
    plaintext changes the scale (or, once rescaled, the level), so the decryptor can
    refuse aggregates in which the server masked slots with plaintext weights.
    """
    cts = vec.ciphertext()
    ct = cts[0] if len(cts) == 1 else None
    return (
        vec.size() == params.slots
        and ct is not None
        and ct.scale == 2.0**params.scale_bits
        and ct.size() == 2
        and ct.coeff_modulus_size() == len(params.coeff_mod_bit_sizes) - 1
    )


class CKKSBackend(SecureAggregationBackend):
    """CKKS homomorphic aggregation with client-side decryption.

    Args:
        poly_modulus_degree: Ring dimension ``N`` (default 8192).
        coeff_mod_bit_sizes: Coefficient-modulus prime sizes (default ``(60, 60, 60)``),
            validated against the HE-standard 128-bit bound for ``N``.
        scale_bits: ``log2`` of the global scale (default 50).
        encryption: ``"symmetric"`` (default; every client holds the secret key, the
            server cannot encrypt) or ``"asymmetric"`` (public-key encryption; every
            client still holds the secret key and decrypts).
        release: ``"clients"``, the only choice: the sum stays on the clients.
            ``"server"`` was removed (the server could average a noise-flooded
            release away by re-randomising the ciphertext).
        n_threads: TenSEAL threads per context (default 1).
        min_clients: Minimum number of contributors (default 3).
        allow_two_clients: Must be True to allow ``min_clients=2``.

    Accuracy promise: with ``M`` contributors and ``max|x_i| <= max_abs_supported(M)``
    (``2^30 / M`` for the default parameters: ``3.6e8`` for 3 clients, ``1.1e8`` for
    10, ``1.1e7`` for 100), every value of the sum is within
    ``M * 2^(20 - scale_bits) + 2^-46 * sum_i max|x_i|`` of the exact float64 sum,
    i.e. ``M * 9.3e-10`` absolute plus ``1.4e-14`` relative to ``sum_i max|x_i|`` at
    the default scale (at most ``M * 9.3e-10 + 1.5e-5`` at the bound). Inputs with
    ``max|x_i|`` above the bound raise :class:`~botorch_fed.secure.errors.HeadroomError`
    on that client before it encrypts anything.

    Raises:
        BackendUnavailableError: TenSEAL does not import here (it is optional, the
            ``secure`` extra); the message names the ``masking`` alternative.
    """

    name = "ckks"
    code = 2
    rounds = (
        RoundSpec("nonces", "client_encode", "server_aggregate"),
        RoundSpec("encrypt", "client_encode", "server_aggregate"),
        RoundSpec("decrypt", "decrypt_unmask", "decrypt_unmask"),
    )

    def __init__(
        self,
        *,
        poly_modulus_degree: int = 8192,
        coeff_mod_bit_sizes: tuple[int, ...] = (60, 60, 60),
        scale_bits: int = 50,
        encryption: str = "symmetric",
        release: str = "clients",
        n_threads: int = 1,
        min_clients: int = 3,
        allow_two_clients: bool = False,
    ) -> None:
        import_tenseal()  # fail here, with the reason and the alternative, not mid-protocol
        super().__init__(min_clients=min_clients, allow_two_clients=allow_two_clients)
        self.params = CKKSParameters(poly_modulus_degree, coeff_mod_bit_sizes, scale_bits)
        if encryption not in _ENCRYPTIONS:
            raise ConfigurationError(
                f"option 'encryption' must be one of {_ENCRYPTIONS}, got {encryption!r}"
            )
        if release != "clients":
            raise ConfigurationError(
                f"option 'release' must be 'clients' (the sum stays on the clients), got "
                f"{release!r}; 'server' was removed: a malicious server could average the "
                "noise of repeated releases away by re-randomising the ciphertext"
            )
        if isinstance(n_threads, bool) or not isinstance(n_threads, int) or n_threads < 1:
            raise ConfigurationError(f"option 'n_threads' must be an int >= 1, got {n_threads!r}")
        self.encryption = encryption
        self.release = release
        self.n_threads = n_threads

    @property
    def options(self) -> dict[str, object]:
        """The options this backend was created with."""
        return {
            **super().options,
            "poly_modulus_degree": self.params.poly_modulus_degree,
            "coeff_mod_bit_sizes": list(self.params.coeff_mod_bit_sizes),
            "scale_bits": self.params.scale_bits,
            "encryption": self.encryption,
            "release": self.release,
            "n_threads": self.n_threads,
        }

    def key_holder(self, client_id: int, *, seed: int | None = None) -> CKKSKeyHolder:
        """Create the client-side key holder (it generates the keys)."""
        return CKKSKeyHolder(self, client_id, seed=seed)

    def setup(
        self,
        client_ids: list[int] | tuple[int, ...],
        *,
        seed: int | None = None,
        key_holder: int | None = None,
    ) -> BackendSetup:
        """Generate the keys on the key-holding client and package the material.

        Args:
            client_ids: The clients of the federation.
            seed: Seed for the key id / group key (tests only).
            key_holder: The client generating the keys (default: the smallest id).

        Returns:
            Public server material and per-client secret material (every client
            receives the secret key: every contributor decrypts the sum).
        """
        ids = validate_client_ids(client_ids)
        holder_id = ids[0] if key_holder is None else key_holder
        if holder_id not in ids:
            raise ConfigurationError(f"key_holder {holder_id} is not one of {list(ids)}")
        holder = self.key_holder(holder_id, seed=seed)
        clients = {cid: holder.client_material(with_secret_key=True) for cid in ids}
        return BackendSetup(holder.server_material(ids), clients)

    def server(self, material: bytes = b"", *, seed: int | None = None) -> ServerRole:
        """Create the server role from the key holder's public material."""
        return _CKKSServer(self, ServerKeyMaterial.from_bytes(material), seed=seed)

    def client(
        self, client_id: int, material: bytes = b"", *, seed: int | None = None
    ) -> ClientRole:
        """Create a client role from its secret material (received out of band)."""
        return _CKKSClient(self, client_id, ClientKeyMaterial.from_bytes(material), seed=seed)

    def max_abs_supported(self, n_clients: int) -> float:
        """Largest ``max|x_i|`` each of ``n_clients`` inputs may have.

        Below it the CKKS sum neither wraps around nor loses the promised accuracy,
        and it passes the decryptor's integrity checks: ``min(wrap bound, 2^30 /
        n_clients)``, see :meth:`CKKSParameters.max_abs_supported
        <botorch_fed.secure.ckks_keys.CKKSParameters.max_abs_supported>`.
        """
        return self.params.max_abs_supported(n_clients)

    def error_bound(self, n_contributors: int, sum_max_abs: float) -> float:
        """Promised bound on the error of every value of a sum (see the class doc)."""
        return self.params.error_bound(n_contributors, sum_max_abs)

    def _check_material(self, material: ServerKeyMaterial | ClientKeyMaterial) -> None:
        if material.params != self.params or material.encryption != self.encryption:
            raise ConfigurationError(
                f"key material was made for {material.params} ({material.encryption}), "
                f"this backend uses {self.params} ({self.encryption})"
            )
        group_key = getattr(material, "group_key", None)
        if group_key is not None and not any(group_key):
            # the canaries and federation_secret() would follow from public values
            raise ConfigurationError("client key material holds an all-zero group key")

    def n_chunks(self, length: int) -> int:
        """Ciphertexts per vector of ``length`` values."""
        return -(-length // self.params.data_slots)


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

    def _begin(self) -> dict[int, bytes]:
        return dict.fromkeys(self.client_ids, self._key_id)

    def _handle(
        self, round: int, payloads: dict[int, bytes]
    ) -> dict[int, bytes] | np.ndarray | None:
        if round == 0:
            return self._route_nonces(payloads)
        if round == 1:
            return self._aggregate(payloads)
        return self._finish(payloads)

    def _route_nonces(self, payloads: dict[int, bytes]) -> dict[int, bytes]:
        ids = self._require(payloads, self.backend.min_clients, "sent a nonce")
        writer = PayloadWriter().ids(ids)
        for cid in ids:
            with error_context(cid, None, None):
                reader = PayloadReader(payloads[cid])
                writer.raw(reader.raw(_NONCE))
                reader.done()
        broadcast = writer.getvalue()
        return dict.fromkeys(ids, broadcast)

    def _aggregate(self, payloads: dict[int, bytes]) -> dict[int, bytes]:
        ids = self._require(payloads, self.backend.min_clients, "submitted ciphertexts")
        n_chunks = self.backend.n_chunks(self.length)
        acc: list = [None] * n_chunks
        for cid in ids:
            reader = PayloadReader(payloads[cid])
            with error_context(cid, None, None):
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

    def federation_secret(self) -> bytes:
        """HKDF-SHA256 of the group key (every client holds it, the server does not)
        under its own label, bound to the key id: the same on every client of the
        federation, independent of the canaries derived from the same key."""
        return hkdf(self._group_key, label("ckks/federation-secret", self._key_id))

    def _begin(self, reader: PayloadReader, x: np.ndarray | None) -> bytes:
        key_id = reader.raw(16)
        reader.done()
        if key_id != self._key_id:
            raise KeyMismatchError(
                f"session uses CKKS key {key_id.hex()}, this client holds key "
                f"{self._key_id.hex()} (wrong key material or wrong federation)"
            )
        # the input is checked now, before anything is sent, and encrypted next round
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
        self._nonce = self._rand.bytes(_NONCE)
        self._binding: bytes | None = None
        self._bound: tuple[int, ...] = ()
        return self._nonce

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
        arr = self._input
        # the declared input bound enters the binding: contributors that declared
        # different bounds derive different canaries and the sum fails the guard check
        bound = np.array([self._session_bound], dtype="<f8").tobytes()
        self._binding = _binding(self.session_id or b"", nonces, self._transcript + bound)
        self._bound = ids
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
