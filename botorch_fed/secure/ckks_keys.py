r"""CKKS parameters (validated against the HE standard) and the client-side key holder.

Parameters follow the Homomorphic Encryption Security Standard (Albrecht et al.,
HomomorphicEncryption.org, 2018, Table 1, classical 128-bit security, ternary
secret): for a ring dimension ``N`` the total coefficient modulus may have at most
``HE_STANDARD_MAX_LOGQ[N]`` bits. The default ``N = 8192``, primes of
``[60, 60, 60]`` bits (180 <= 218) and scale ``2^50`` are those of the FBO-FedGP
paper's secure aggregation (paper 000, App. B) scaled down to the aggregation-only
circuit: there are no multiplications, so one data level (two data primes plus the
special prime) suffices.

Accuracy and headroom (see :meth:`CKKSParameters.error_bound`): CKKS is approximate.
Besides the encryption noise and the rounding at the scale ``2^scale_bits`` (an
*absolute* error), SEAL encodes and decodes with a double-precision FFT over all the
slots of a ciphertext, which adds an error *relative* to the magnitudes encrypted
(``~2^-53`` times a small factor, measured at most ``~12 * 2^-53`` times
``sum_i max|x_i|``), and it lands in every slot, the guard slots included. The
promised bound is ``M * 2^(20 - scale_bits) + 2^-46 * sum_i max|x_i|``; the guard
check allows exactly that, so the magnitudes must be capped
(:meth:`CKKSParameters.max_abs_supported`) to keep the check meaningful.

The :class:`CKKSKeyHolder` is a *client-side* role: it generates the keys (TenSEAL /
Microsoft SEAL), hands every client its material out of band (never through the
server) and gives the server only a public context (``serialize(save_secret_key=
False)``, no relinearisation or Galois keys: the server only adds).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from botorch_fed.secure.crypto import RandomSource
from botorch_fed.secure.errors import (
    BackendUnavailableError,
    ConfigurationError,
    TamperedMessageError,
)
from botorch_fed.secure.wire import PayloadReader, PayloadWriter

if TYPE_CHECKING:
    from botorch_fed.secure.ckks import CKKSBackend

__all__ = [
    "GUARD_BUDGET_BITS",
    "GUARD_SLOTS",
    "HE_STANDARD_MAX_LOGQ",
    "REL_ERROR_BITS",
    "CKKSKeyHolder",
    "CKKSParameters",
    "ClientKeyMaterial",
    "ServerKeyMaterial",
    "import_tenseal",
    "tenseal_unavailable_reason",
]

HE_STANDARD_MAX_LOGQ = {1024: 27, 2048: 54, 4096: 109, 8192: 218, 16384: 438, 32768: 881}
GUARD_SLOTS = 4
REL_ERROR_BITS = 46
"""``2^-46``: bound on the encode/decode error relative to ``sum_i max|x_i|``.

SEAL's CKKS encoder/decoder runs a double-precision FFT over all slots, so its error is
relative to the encrypted magnitudes; the worst measured over thousands of sums
(``N`` from 4096 to 32768, 1 to 100 clients, symmetric and asymmetric, constant,
random, alternating, spiky and cancelling inputs) was ``~12 * 2^-53`` in a data slot
and ``~6 * 2^-53`` in a guard slot: ``2^-46 = 128 * 2^-53`` leaves a 10x margin."""
GUARD_BUDGET_BITS = 16
"""``2^-16``: the most the magnitude-dependent error may add to the guard tolerance.

It caps :meth:`CKKSParameters.max_abs_supported` at ``2^(46 - 16) / M = 2^30 / M``;
a forged aggregate then passes the 4 guard slots of a ciphertext with probability
at most ``(2 * tolerance)^4 ~ 2^-60`` (at the default scale ``2^50``)."""
_MIN_HEADROOM_BITS = 12
_ENCRYPTION_CODES = {"symmetric": 0, "asymmetric": 1}
_SERVER_MAGIC = b"BFCKKS-S"
_CLIENT_MAGIC = b"BFCKKS-C"


def tenseal_unavailable_reason() -> str | None:
    """Why the ``ckks`` backend cannot be used here, or None if TenSEAL imports.

    TenSEAL is an optional dependency (the ``secure`` extra) and is imported only
    here, when a CKKS backend is created or used, never when
    :mod:`botorch_fed.secure` is imported: the other backends work without it.
    """
    try:
        import tenseal  # noqa: F401
    except ImportError as exc:
        if isinstance(exc, ModuleNotFoundError) and exc.name == "tenseal":
            why = "TenSEAL is not installed"
        else:  # installed but broken, e.g. a wheel built for another platform
            why = f"TenSEAL is installed but does not import ({exc})"
        return (
            f"the 'ckks' secure-aggregation backend is unavailable: {why}. Install it "
            "with pip install 'botorch-fed[secure]' (TenSEAL publishes binary wheels "
            "only for some platforms and CPython versions; elsewhere pip has to build "
            "it from source, which needs CMake and a C++ compiler), or use the "
            "'masking' backend instead (pairwise secure masking, needs only "
            "'cryptography'): get_backend('masking') / --aggregator masking"
        )
    return None


def import_tenseal() -> Any:
    """Import TenSEAL lazily (it is an optional dependency).

    Raises:
        BackendUnavailableError: TenSEAL does not import; the message says why and
            what to use instead (also an ``ImportError``).
    """
    try:
        import tenseal
    except ImportError as exc:
        raise BackendUnavailableError(tenseal_unavailable_reason() or str(exc)) from exc
    return tenseal


@dataclass(frozen=True)
class CKKSParameters:
    """CKKS encryption parameters.

    Args:
        poly_modulus_degree: Ring dimension ``N`` (a key of
            :data:`HE_STANDARD_MAX_LOGQ`); a ciphertext holds ``N / 2`` slots.
        coeff_mod_bit_sizes: Bit sizes of the coefficient-modulus primes; the last is
            the special (key-switching) prime, the others hold data. Their sum must
            not exceed ``HE_STANDARD_MAX_LOGQ[N]``.
        scale_bits: ``log2`` of the global scale (precision ~ ``2^-scale_bits``).
    """

    poly_modulus_degree: int = 8192
    coeff_mod_bit_sizes: tuple[int, ...] = (60, 60, 60)
    scale_bits: int = 50

    def __post_init__(self) -> None:
        n = self.poly_modulus_degree
        if isinstance(n, bool) or not isinstance(n, int) or n not in HE_STANDARD_MAX_LOGQ:
            raise ConfigurationError(
                f"option 'poly_modulus_degree' must be one of "
                f"{sorted(HE_STANDARD_MAX_LOGQ)}, got {n!r}"
            )
        bits = self.coeff_mod_bit_sizes
        if (
            not isinstance(bits, tuple | list)
            or len(bits) < 2
            or any(isinstance(b, bool) or not isinstance(b, int) or not 1 <= b <= 60 for b in bits)
        ):
            raise ConfigurationError(
                "option 'coeff_mod_bit_sizes' must be a sequence of at least two ints in "
                f"[1, 60] (data primes then the special prime), got {bits!r}"
            )
        object.__setattr__(self, "coeff_mod_bit_sizes", tuple(int(b) for b in bits))
        max_logq = HE_STANDARD_MAX_LOGQ[n]
        if sum(bits) > max_logq:
            raise ConfigurationError(
                f"option 'coeff_mod_bit_sizes'={list(bits)} totals {sum(bits)} bits, more "
                f"than the {max_logq} bits the HE standard allows for 128-bit security "
                f"at poly_modulus_degree={n} (allowed: {HE_STANDARD_MAX_LOGQ})"
            )
        sb = self.scale_bits
        if isinstance(sb, bool) or not isinstance(sb, int) or not 20 <= sb <= 60:
            raise ConfigurationError(f"option 'scale_bits' must be an int in [20, 60], got {sb!r}")
        if self.headroom_bits < _MIN_HEADROOM_BITS:
            raise ConfigurationError(
                f"option 'scale_bits'={sb} leaves {self.headroom_bits} bits of headroom "
                f"with data primes {list(bits[:-1])}; at least {_MIN_HEADROOM_BITS} are "
                "needed (lower scale_bits or use larger/more data primes)"
            )

    @property
    def slots(self) -> int:
        """Slots per ciphertext (``N / 2``)."""
        return self.poly_modulus_degree // 2

    @property
    def data_slots(self) -> int:
        """Input values per ciphertext (``N / 2`` minus the guard slots)."""
        return self.slots - GUARD_SLOTS

    @property
    def headroom_bits(self) -> int:
        """``log2`` bound on ``|sum|``: data modulus bits minus scale and safety bits.

        A fresh ciphertext lives at the top data level (modulus ``q`` = product of
        the data primes, each at least ``2^(bits - 1)``); decryption is correct while
        every coefficient of ``scale * sum`` stays below ``q / 2``, and coefficients
        are bounded by the slot values' maximum. Two more bits absorb the noise.
        """
        data = self.coeff_mod_bit_sizes[:-1]
        return sum(data) - len(data) - 1 - 2 - self.scale_bits

    @property
    def tolerance_bits(self) -> int:
        """``log2`` of the per-contributor *absolute* error (noise and scale rounding).

        ``2^20`` in scaled units: at least 8x the largest fresh-encryption error we
        measured (``~2^17`` for a sum of 10 asymmetric ciphertexts at ``N = 32768``);
        the checks get weaker as the scale shrinks (``~1e-9`` per client at ``2^50``).
        The error relative to the magnitudes is :data:`REL_ERROR_BITS`.
        """
        return 20 - self.scale_bits

    def wrap_bound(self, n_clients: int) -> float:
        """Largest ``max|x_i|`` such that the sum of ``n_clients`` inputs cannot wrap."""
        n = max(int(n_clients), 1)
        return max(2.0**self.headroom_bits - 2.0 * n, 0.0) / n

    def precision_bound(self, n_clients: int) -> float:
        """Largest ``max|x_i|`` whose relative error fits the guard budget.

        ``2^(REL_ERROR_BITS - GUARD_BUDGET_BITS) / n_clients = 2^30 / n_clients``: at
        this magnitude the relative part of :meth:`error_bound` reaches
        ``2^-GUARD_BUDGET_BITS``. It does not depend on the scale (the FFT runs in
        double precision whatever the scale).
        """
        n = max(int(n_clients), 1)
        return 2.0 ** (REL_ERROR_BITS - GUARD_BUDGET_BITS) / n

    def max_abs_supported(self, n_clients: int) -> float:
        """Largest ``max|x_i|`` for which a sum of ``n_clients`` inputs is supported.

        The minimum of :meth:`wrap_bound` (decryption without wrap-around) and
        :meth:`precision_bound` (the sum passes the guard-slot integrity check and
        meets :meth:`error_bound`). ``2^30 / n_clients`` for the default parameters.
        """
        return min(self.wrap_bound(n_clients), self.precision_bound(n_clients))

    def error_bound(self, n_contributors: int, sum_max_abs: float) -> float:
        """Promised bound on ``max|decrypted sum - exact sum|`` (every slot).

        Args:
            n_contributors: Number of inputs in the sum.
            sum_max_abs: ``sum_i max|x_i|`` over the contributors (at most
                ``n_contributors * max_abs_supported(n_clients)``).

        Returns:
            ``n_contributors * 2^tolerance_bits + 2^-REL_ERROR_BITS * sum_max_abs``:
            an absolute part (noise and rounding at the scale) plus a part relative
            to the magnitudes (double-precision FFT of the encoder/decoder).
        """
        return n_contributors * 2.0**self.tolerance_bits + 2.0**-REL_ERROR_BITS * sum_max_abs

    def guard_tolerance(self, n_contributors: int, n_clients: int) -> float:
        """Tolerance of the decryptor's guard/padding checks.

        :meth:`error_bound` for ``n_contributors`` inputs at the largest supported
        magnitude of a session of ``n_clients``: the decryptor cannot see the
        individual magnitudes (they may cancel in the sum), so it allows the worst
        case. At most ``n_contributors * 2^tolerance_bits + 2^-GUARD_BUDGET_BITS``.
        """
        return self.error_bound(n_contributors, n_contributors * self.max_abs_supported(n_clients))

    def write(self, writer: PayloadWriter) -> None:
        """Append the parameters to a payload."""
        writer.u32(self.poly_modulus_degree).ids(self.coeff_mod_bit_sizes).u32(self.scale_bits)

    @classmethod
    def read(cls, reader: PayloadReader) -> CKKSParameters:
        """Read parameters written by :meth:`write`."""
        n = reader.u32()
        bits = reader.ids()
        return cls(n, tuple(bits), reader.u32())


@dataclass(frozen=True)
class ServerKeyMaterial:
    """What the server may know: parameters, key id, decryptors, public context."""

    params: CKKSParameters
    encryption: str
    key_id: bytes
    decryptors: tuple[int, ...]
    context: bytes

    def to_bytes(self) -> bytes:
        """Serialise."""
        w = PayloadWriter().raw(_SERVER_MAGIC)
        self.params.write(w)
        w.u32(_ENCRYPTION_CODES[self.encryption]).raw(self.key_id).ids(self.decryptors)
        return w.blob(self.context).getvalue()

    @classmethod
    def from_bytes(cls, data: bytes) -> ServerKeyMaterial:
        """Parse; raises ConfigurationError if it is not server material."""
        return _parse(data, _SERVER_MAGIC, server=True)


@dataclass(frozen=True)
class ClientKeyMaterial:
    """A client's secret material: context (with or without secret key), group key."""

    params: CKKSParameters
    encryption: str
    key_id: bytes
    group_key: bytes
    has_secret_key: bool
    context: bytes

    def to_bytes(self) -> bytes:
        """Serialise (this contains secrets: transmit out of band, encrypted)."""
        w = PayloadWriter().raw(_CLIENT_MAGIC)
        self.params.write(w)
        w.u32(_ENCRYPTION_CODES[self.encryption]).raw(self.key_id).raw(self.group_key)
        return w.u32(int(self.has_secret_key)).blob(self.context).getvalue()

    @classmethod
    def from_bytes(cls, data: bytes) -> ClientKeyMaterial:
        """Parse; raises ConfigurationError if it is not client material."""
        return _parse(data, _CLIENT_MAGIC, server=False)


def _parse(data: bytes, magic: bytes, *, server: bool) -> Any:
    kind = "server" if server else "client"
    if not isinstance(data, bytes | bytearray) or bytes(data[: len(magic)]) != magic:
        raise ConfigurationError(f"not CKKS {kind} key material (from CKKSKeyHolder)")
    try:
        r = PayloadReader(data)
        r.raw(len(magic))
        params = CKKSParameters.read(r)
        enc = {v: k for k, v in _ENCRYPTION_CODES.items()}[r.u32()]
        key_id = r.raw(16)
        out: ServerKeyMaterial | ClientKeyMaterial
        if server:
            out = ServerKeyMaterial(params, enc, key_id, r.ids(), r.blob())
        else:
            group_key = r.raw(32)
            out = ClientKeyMaterial(params, enc, key_id, group_key, bool(r.u32()), r.blob())
        r.done()
    except (TamperedMessageError, KeyError) as exc:
        raise ConfigurationError(f"corrupted CKKS {kind} key material: {exc}") from exc
    return out


class CKKSKeyHolder:
    """Client-side role generating the CKKS keys of a federation.

    Args:
        backend: The CKKS backend whose parameters/options to use.
        client_id: The id of the client acting as key holder.
        seed: Seed for the key id and group key (tests only). TenSEAL's own key
            generation cannot be seeded, so ciphertexts are never reproducible.
    """

    def __init__(self, backend: CKKSBackend, client_id: int, *, seed: int | None = None):
        ts = import_tenseal()
        self.backend = backend
        self.client_id = client_id
        params = backend.params
        rand = RandomSource(seed, 2, client_id)
        self.key_id = rand.bytes(16)
        self._group_key = rand.bytes(32)
        enc = (
            ts.ENCRYPTION_TYPE.SYMMETRIC
            if backend.encryption == "symmetric"
            else ts.ENCRYPTION_TYPE.ASYMMETRIC
        )
        try:
            context = ts.context(
                ts.SCHEME_TYPE.CKKS,
                params.poly_modulus_degree,
                coeff_mod_bit_sizes=list(params.coeff_mod_bit_sizes),
                encryption_type=enc,
                n_threads=backend.n_threads,
            )
        except (ValueError, RuntimeError) as exc:
            raise ConfigurationError(
                f"TenSEAL rejected the CKKS parameters {params}: {exc}"
            ) from exc
        context.global_scale = 2.0**params.scale_bits
        self._context = context

    def _serialize(self, *, secret: bool) -> bytes:
        return self._context.serialize(
            save_public_key=self.backend.encryption == "asymmetric",
            save_secret_key=secret,
            save_galois_keys=False,
            save_relin_keys=False,
        )

    def server_material(self, decryptors: tuple[int, ...]) -> bytes:
        """Public material for the server (no secret key).

        Args:
            decryptors: Clients that hold the secret key and may be asked to decrypt.
        """
        return ServerKeyMaterial(
            self.backend.params,
            self.backend.encryption,
            self.key_id,
            tuple(sorted(decryptors)),
            self._serialize(secret=False),
        ).to_bytes()

    def client_material(self, *, with_secret_key: bool) -> bytes:
        """Secret material for a client (to be sent out of band).

        Args:
            with_secret_key: Include the CKKS secret key (needed to decrypt, and to
                encrypt with symmetric encryption).
        """
        if self.backend.encryption == "symmetric" and not with_secret_key:
            raise ConfigurationError("with symmetric encryption every client needs the secret key")
        return ClientKeyMaterial(
            self.backend.params,
            self.backend.encryption,
            self.key_id,
            self._group_key,
            with_secret_key,
            self._serialize(secret=with_secret_key),
        ).to_bytes()
