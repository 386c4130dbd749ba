r"""Secure aggregation backends (numpy + crypto libraries only; never imports torch).

Clients each hold a float64 vector (e.g. a packed, whitened dPITC summary of the
FBO-FedGP paper, paper 000, Sec. 2 / App. A-B); the server must obtain only the sum.
Backends are round-based and transport-agnostic (bytes in, bytes out), see
:mod:`botorch_fed.secure.base`:

- ``"plaintext"``: the reference (no privacy), :mod:`~botorch_fed.secure.plaintext`;
- ``"ckks"``: CKKS homomorphic encryption (TenSEAL), decryption on the clients,
  :mod:`~botorch_fed.secure.ckks`; TenSEAL is optional and imported only when a
  CKKS backend is created, so this package and the other backends work without it
  (:func:`available_backends` lists what is usable here);
- ``"masking"``: pairwise double masking with Shamir-shared dropout recovery
  (Bonawitz et al., CCS 2017), :mod:`~botorch_fed.secure.masking`.

Example:
    >>> import numpy as np
    >>> from botorch_fed.secure import aggregate, get_backend
    >>> xs = {i: np.full(4, float(i)) for i in range(3)}
    >>> aggregate(get_backend("masking"), xs, seed=0)
    array([3., 3., 3., 3.])

The threat model of every backend is in ``docs/security.md``.
"""

from __future__ import annotations

from botorch_fed.secure.aggregator import make_aggregator
from botorch_fed.secure.base import BackendSetup, RoundSpec, SecureAggregationBackend
from botorch_fed.secure.ckks import CKKSBackend
from botorch_fed.secure.ckks_keys import HE_STANDARD_MAX_LOGQ, CKKSKeyHolder, CKKSParameters
from botorch_fed.secure.client_role import ClientRole
from botorch_fed.secure.driver import aggregate, run_protocol
from botorch_fed.secure.errors import (
    BackendUnavailableError,
    ConfigurationError,
    DropoutError,
    HeadroomError,
    InputError,
    KeyMismatchError,
    ProtocolError,
    SecureAggregationError,
    TamperedMessageError,
    TooFewClientsError,
)
from botorch_fed.secure.limbs import LimbEncoding
from botorch_fed.secure.masking import MaskingBackend
from botorch_fed.secure.plaintext import PlaintextBackend
from botorch_fed.secure.registry import (
    available_backends,
    backend_options,
    backend_unavailable_reason,
    get_backend,
    require_backend,
)
from botorch_fed.secure.server_role import ServerRole

__all__ = [
    "HE_STANDARD_MAX_LOGQ",
    "BackendSetup",
    "BackendUnavailableError",
    "CKKSBackend",
    "CKKSKeyHolder",
    "CKKSParameters",
    "ClientRole",
    "ConfigurationError",
    "DropoutError",
    "HeadroomError",
    "InputError",
    "KeyMismatchError",
    "LimbEncoding",
    "MaskingBackend",
    "PlaintextBackend",
    "ProtocolError",
    "RoundSpec",
    "SecureAggregationBackend",
    "SecureAggregationError",
    "ServerRole",
    "TamperedMessageError",
    "TooFewClientsError",
    "aggregate",
    "available_backends",
    "backend_options",
    "backend_unavailable_reason",
    "get_backend",
    "make_aggregator",
    "require_backend",
    "run_protocol",
]
