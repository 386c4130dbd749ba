r"""Backend registry: :func:`get_backend` builds a backend from its name and options.

The names are ``"plaintext"`` (reference, no privacy), ``"ckks"`` (CKKS homomorphic
encryption, TenSEAL) and ``"masking"`` (Bonawitz et al. double masking). Options are
the keyword arguments of the backend classes; unknown names or options raise
:class:`~botorch_fed.secure.errors.ConfigurationError` (a ``ValueError``) naming the
offending name and the allowed values.
"""

from __future__ import annotations

import inspect

from botorch_fed.secure.base import SecureAggregationBackend
from botorch_fed.secure.ckks import CKKSBackend
from botorch_fed.secure.errors import ConfigurationError
from botorch_fed.secure.masking import MaskingBackend
from botorch_fed.secure.plaintext import PlaintextBackend

__all__ = ["BACKENDS", "available_backends", "backend_options", "get_backend"]

BACKENDS: dict[str, type[SecureAggregationBackend]] = {
    "plaintext": PlaintextBackend,
    "ckks": CKKSBackend,
    "masking": MaskingBackend,
}


def available_backends() -> tuple[str, ...]:
    """Names accepted by :func:`get_backend`."""
    return tuple(BACKENDS)


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


def get_backend(name: str, **options: object) -> SecureAggregationBackend:
    """Create a secure-aggregation backend.

    Args:
        name: ``"plaintext"``, ``"ckks"`` or ``"masking"``.
        **options: Backend options, e.g. ``min_clients=5`` or, for ``"ckks"``,
            ``poly_modulus_degree=16384``; see the backend classes.

    Returns:
        The backend.

    Raises:
        ConfigurationError: Unknown name, unknown option or invalid option value.
    """
    cls = _lookup(name)
    allowed = backend_options(name)
    for key in options:
        if key not in allowed:
            raise ConfigurationError(
                f"unknown option {key!r} for backend {name!r}; allowed: {list(allowed)}"
            )
    return cls(**options)
