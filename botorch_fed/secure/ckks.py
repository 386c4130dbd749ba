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

from collections.abc import Iterable

from botorch_fed.secure.base import BackendSetup, RoundSpec, SecureAggregationBackend
from botorch_fed.secure.ckks_client import _CKKSClient
from botorch_fed.secure.ckks_keys import (
    CKKSKeyHolder,
    CKKSParameters,
    ClientKeyMaterial,
    ServerKeyMaterial,
    import_tenseal,
)
from botorch_fed.secure.ckks_server import _CKKSServer
from botorch_fed.secure.client_role import ClientRole
from botorch_fed.secure.errors import ConfigurationError
from botorch_fed.secure.server_role import ServerRole
from botorch_fed.secure.validation import validate_client_ids

__all__ = ["CKKSBackend"]

_ENCRYPTIONS = ("symmetric", "asymmetric")


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
        client_ids: Iterable[int],
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
