r"""What a party's errors tell the server: the mark of a *public refusal*
(:func:`refusal`, :func:`is_public_refusal`), whose full text may go to the server,
and the text the server is told for any other error (:func:`wire_error`); the rule
is in :mod:`.agent`'s docstring.
"""

from __future__ import annotations

import numbers

__all__ = ["is_public_refusal", "refusal", "wire_error"]

#: the public refusal's mark (:func:`refusal`)
_PUBLIC = "botorch_fed_public_refusal"


def refusal(exc: BaseException) -> BaseException:
    r"""Mark ``exc`` a public refusal: one decided before the run's client is used, from
    the run's options, the party's policy and the agent's bookkeeping alone, whose full
    text may go to the server. Returns ``exc`` (``raise refusal(PolicyError(...))``)."""
    setattr(exc, _PUBLIC, True)
    return exc


def is_public_refusal(exc: BaseException) -> bool:
    r"""Whether ``exc`` was marked by :func:`refusal` (and not taken back since)."""
    return getattr(exc, _PUBLIC, False) is True


def _private(exc: BaseException) -> None:
    r"""Take back any mark from ``exc``: it came from the run's client, so its text is
    the party's own, whatever its type (an exception object the client kept and raised
    again must not carry a mark from before)."""
    if getattr(exc, _PUBLIC, False):
        setattr(exc, _PUBLIC, False)


def wire_error(exc: BaseException, partition_id: int, meta, payload) -> str:
    r"""The error text the server is told for ``exc``, raised while this agent answered
    ``(meta, payload)``: a public refusal's full text (:func:`is_public_refusal`),
    otherwise only the error's type, the client id and what the server itself sent --
    the message type, for a secure sum its request, and the round.

    The round is the message's ``round`` or ``t`` field (an integer the server chose);
    the request is its ``request`` field (``secagg`` opens a session with one); strings
    are cut to 64 characters, so an answer stays short whatever the server sent."""
    name = type(exc).__name__
    if is_public_refusal(exc):
        return f"{name}: {exc}"
    where = [f"client {int(partition_id)}"]
    meta = meta if isinstance(meta, dict) else {}
    payload = payload if isinstance(payload, dict) else {}
    type_ = meta.get("type")
    if isinstance(type_, str):
        where.append(f"message {type_[:64]!r}")
    request = payload.get("request")
    if isinstance(request, str):
        where.append(f"request {request[:64]!r}")
    for key in ("round", "t"):
        value = payload.get(key)
        if isinstance(value, numbers.Integral) and not isinstance(value, bool):
            where.append(f"round {int(value)}")
            break
    return f"{name}: {', '.join(where)} (the details stay in the party's log)"
