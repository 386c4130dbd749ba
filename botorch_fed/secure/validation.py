r"""Validation helpers shared by the roles: client ids, lengths, error context."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager

import numpy as np

from botorch_fed.secure.errors import InputError, SecureAggregationError
from botorch_fed.secure.wire import MAX_CLIENT_ID

__all__ = ["MAX_LENGTH", "error_context", "validate_client_ids", "validate_length"]

MAX_LENGTH = 1 << 24


@contextmanager
def error_context(
    client_id: int | None, round: int | None, round_name: str | None
) -> Iterator[None]:
    """Add the client id / round to :class:`SecureAggregationError` s lacking them."""
    try:
        yield
    except SecureAggregationError as exc:
        if (exc.client_id is None and client_id is not None) or (
            exc.round is None and round is not None
        ):
            raise type(exc)(
                exc.detail,
                client_id=exc.client_id if exc.client_id is not None else client_id,
                round=exc.round if exc.round is not None else round,
                round_name=exc.round_name if exc.round is not None else round_name,
            ) from exc
        raise


def validate_client_ids(client_ids: Iterable[int]) -> tuple[int, ...]:
    """Check client ids (distinct ints in ``[0, 2**32)``) and return them sorted."""
    try:
        ids = list(client_ids)
    except TypeError as exc:
        raise InputError(f"client_ids must be an iterable of ints: {exc}") from exc
    out = []
    for cid in ids:
        if isinstance(cid, bool) or not isinstance(cid, int | np.integer):
            raise InputError(f"client ids must be ints, got {cid!r}")
        if not 0 <= int(cid) <= MAX_CLIENT_ID:
            raise InputError(f"client id {cid} outside [0, {MAX_CLIENT_ID}]")
        out.append(int(cid))
    if len(set(out)) != len(out):
        raise InputError(f"duplicate client ids in {sorted(out)}")
    return tuple(sorted(out))


def validate_length(length: int) -> int:
    """Check a vector length (``1 <= length <= MAX_LENGTH``)."""
    if isinstance(length, bool) or not isinstance(length, int | np.integer):
        raise InputError(f"length must be an int, got {length!r}")
    if not 1 <= int(length) <= MAX_LENGTH:
        raise InputError(f"length must be in [1, {MAX_LENGTH}], got {length}")
    return int(length)
