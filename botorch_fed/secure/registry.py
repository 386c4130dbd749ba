r"""Backend registry: :func:`get_backend` builds a backend from its name and options.

The names are ``"plaintext"`` (reference, no privacy), ``"ckks"`` (CKKS homomorphic
encryption, TenSEAL) and ``"masking"`` (Bonawitz et al. double masking). Options are
the keyword arguments of the backend classes; unknown names or options raise
:class:`~botorch_fed.secure.errors.ConfigurationError` (a ``ValueError``) naming the
offending name and the allowed values.

TenSEAL is optional (the ``secure`` extra) and imported only when a ``ckks`` backend
is created: :func:`available_backends` lists ``"ckks"`` only where TenSEAL imports,
and :func:`get_backend` raises
:class:`~botorch_fed.secure.errors.BackendUnavailableError` saying why and naming
``"masking"`` as the alternative. ``plaintext`` and ``masking`` need only
``cryptography``.
"""

from __future__ import annotations

import inspect
from typing import Any

from botorch_fed.secure.base import SecureAggregationBackend
from botorch_fed.secure.ckks import CKKSBackend
from botorch_fed.secure.ckks_keys import tenseal_unavailable_reason
from botorch_fed.secure.errors import BackendUnavailableError, ConfigurationError
from botorch_fed.secure.masking import MaskingBackend
from botorch_fed.secure.plaintext import PlaintextBackend

__all__ = [
    "BACKENDS",
    "available_backends",
    "backend_options",
    "backend_unavailable_reason",
    "get_backend",
    "require_backend",
]

BACKENDS: dict[str, type[SecureAggregationBackend]] = {
    "plaintext": PlaintextBackend,
    "ckks": CKKSBackend,
    "masking": MaskingBackend,
}
"""Every known backend, whether or not its optional dependency is installed."""

_OPTIONAL_DEPENDENCY_CHECKS = {"ckks": tenseal_unavailable_reason}


def backend_unavailable_reason(name: str) -> str | None:
    """Why backend ``name`` cannot be used here, or None if it can.

    Args:
        name: A known backend name (a key of :data:`BACKENDS`).

    Returns:
        None, or a message saying which optional dependency does not import, how to
        install it and which backend to use instead.

    Raises:
        ConfigurationError: Unknown name.
    """
    _lookup(name)
    check = _OPTIONAL_DEPENDENCY_CHECKS.get(name)
    return None if check is None else check()


def require_backend(name: str) -> None:
    """Raise unless backend ``name`` is known and usable here.

    Raises:
        ConfigurationError: Unknown name.
        BackendUnavailableError: Known, but its optional dependency does not import
            (``"ckks"`` without TenSEAL); the message names the alternative.
    """
    reason = backend_unavailable_reason(name)
    if reason is not None:
        raise BackendUnavailableError(reason)


def available_backends() -> tuple[str, ...]:
    """Names of the backends usable here (``"ckks"`` only where TenSEAL imports).

    Every known name is a key of :data:`BACKENDS`; :func:`backend_unavailable_reason`
    says why a known backend is missing from this tuple.
    """
    return tuple(name for name in BACKENDS if backend_unavailable_reason(name) is None)


def backend_options(name: str) -> tuple[str, ...]:
    """Option names accepted by backend ``name``."""
    cls = _lookup(name)
    return tuple(
        p.name
        for p in inspect.signature(cls.__init__).parameters.values()
        if p.kind is inspect.Parameter.KEYWORD_ONLY
    )


def _lookup(name: str) -> type[SecureAggregationBackend]:
    if not isinstance(name, str) or name not in BACKENDS:
        raise ConfigurationError(
            f"unknown secure-aggregation backend {name!r}; allowed: {list(BACKENDS)}"
        )
    return BACKENDS[name]


def get_backend(name: str, **options: Any) -> SecureAggregationBackend:
    """Create a secure-aggregation backend.

    Args:
        name: ``"plaintext"``, ``"ckks"`` or ``"masking"``.
        **options: Backend options, e.g. ``min_clients=5`` or, for ``"ckks"``,
            ``poly_modulus_degree=16384``; see the backend classes.

    Returns:
        The backend.

    Raises:
        ConfigurationError: Unknown name, unknown option or invalid option value.
        BackendUnavailableError: ``"ckks"`` where TenSEAL does not import; the
            message says why and names ``"masking"`` as the alternative.
    """
    cls = _lookup(name)
    require_backend(name)
    allowed = backend_options(name)
    for key in options:
        if key not in allowed:
            raise ConfigurationError(
                f"unknown option {key!r} for backend {name!r}; allowed: {list(allowed)}"
            )
    return cls(**options)
