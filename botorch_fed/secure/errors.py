r"""Exceptions raised by the secure-aggregation backends.

Every error is a :class:`SecureAggregationError`, itself a :class:`ValueError` (the
project's convention for bad inputs, see ``DESIGN.md``). Where it applies, the
exception names the client and the protocol round it concerns; both are also
available as attributes (``client_id``, ``round``, ``round_name``).

Which error is raised when:

============================  ==========================================================
Exception                     Raised when
============================  ==========================================================
:class:`ConfigurationError`   unknown backend name or option; invalid option value;
                              CKKS parameters outside the HE-standard 128-bit table;
                              key material of the wrong kind (e.g. a secret key handed
                              to the server role).
                              A known backend whose optional dependency does not
                              import here (``ckks`` without TenSEAL) raises the
                              subclass :class:`BackendUnavailableError` (also an
                              ``ImportError``).
:class:`InputError`           a client's vector is not 1-D real, has the wrong length,
                              or contains NaN/inf; invalid client ids or seed.
:class:`HeadroomError`        ``max|x|`` exceeds ``max_abs_supported(n_clients)``, what
                              the encoding supports (fixed point mod 2^64; CKKS modulus
                              and magnitude-relative precision); raised on the client
                              before anything is encrypted or masked.
:class:`ProtocolError`        a message for the wrong session, round, recipient or
                              direction (replayed, stale or misrouted); a reply from a
                              client that was not asked; a step out of order; an
                              inconsistent view sent by the server (e.g. a survivor list
                              that is not a subset of the previous one).
:class:`TamperedMessageError` bytes that fail the frame checksum/MAC or an AEAD tag, are
                              truncated or extended, do not parse, or decrypt to values
                              that fail the integrity checks (CKKS guard slots, Shamir
                              reconstruction not matching the commitment/public key).
:class:`KeyMismatchError`     the key material of a client does not match the session's
                              (CKKS key id / context mismatch; a client's advertised key
                              altered). Subclass of :class:`TamperedMessageError`.
:class:`TooFewClientsError`   a session is started with fewer than ``min_clients``
                              clients (or a client refuses such a session).
:class:`DropoutError`         so many clients dropped that fewer than the threshold /
                              ``min_clients`` survivors remain at some round. Subclass of
                              :class:`TooFewClientsError`.
============================  ==========================================================
"""

from __future__ import annotations

__all__ = [
    "BackendUnavailableError",
    "ConfigurationError",
    "DropoutError",
    "HeadroomError",
    "InputError",
    "KeyMismatchError",
    "ProtocolError",
    "SecureAggregationError",
    "TamperedMessageError",
    "TooFewClientsError",
]


class SecureAggregationError(ValueError):
    """Base class of every error raised by :mod:`botorch_fed.secure`.

    Args:
        message: What went wrong.
        client_id: The client the error concerns, if any.
        round: The protocol round index the error concerns, if any.
        round_name: The name of that round (e.g. ``"masked_input"``), if known.
    """

    def __init__(
        self,
        message: str,
        *,
        client_id: int | None = None,
        round: int | None = None,
        round_name: str | None = None,
    ) -> None:
        self.client_id = client_id
        self.round = round
        self.round_name = round_name
        where = []
        if client_id is not None:
            where.append(f"client {client_id}")
        if round is not None:
            where.append(f"round {round}" + (f" ({round_name})" if round_name else ""))
        self.detail = message
        super().__init__(f"{message} [{', '.join(where)}]" if where else message)


class ConfigurationError(SecureAggregationError):
    """Unknown backend/option, invalid option value or unsuitable key material."""


class BackendUnavailableError(ConfigurationError, ImportError):
    """A known backend cannot be used here: its optional dependency does not import.

    Both a :class:`ConfigurationError` (so a ``ValueError``, the project's convention)
    and an ``ImportError`` (what a missing optional dependency raises elsewhere).
    """


class InputError(SecureAggregationError):
    """A client's input vector (or the client ids) is invalid."""


class HeadroomError(InputError):
    """The inputs are too large for the encoding: the sum would wrap around (or, for
    CKKS, lose the promised accuracy and fail the integrity checks)."""


class ProtocolError(SecureAggregationError):
    """A message for the wrong session/round/recipient, or a step out of order."""


class TamperedMessageError(SecureAggregationError):
    """Bytes that fail authentication, are truncated, or do not decode."""


class KeyMismatchError(TamperedMessageError):
    """A client's key material does not match the session's."""


class TooFewClientsError(SecureAggregationError):
    """Fewer clients than the minimum number of contributors."""


class DropoutError(TooFewClientsError):
    """Too few clients survived a round to finish the aggregation."""
