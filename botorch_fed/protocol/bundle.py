r"""Several messages to one client as one: a :data:`BUNDLE` travels in one exchange, the
client handles its parts in order and answers them in one reply (an error in a part ends
the bundle there). The server bundles what needs no answer before its next message -- a
secure sum's closing steps -- with that message (:meth:`FederatedServer.send
<botorch_fed.protocol.server.FederatedServer.send>`), so each costs no round trip of its own.

On the wire a bundle is a flat payload like any other: ``parts`` (their count),
``type/<i>`` (part ``i``'s type) and ``<i>/<key>`` (its fields). A part the client refuses
raises as it would alone; what the parts before it did stays done (as it would had they
come alone), their replies are not sent."""

from __future__ import annotations

from collections.abc import Sequence

from botorch_fed.protocol.messages import TIME_PREFIX, Message

BUNDLE = "bundle"
#: parts of one bundle at most (a server's closing steps and its message fit many times)
MAX_PARTS = 16
_TYPE = "type/"


def bundle(parts: Sequence[Message]) -> Message:
    r"""``parts`` (at least two, none a bundle) as one :data:`BUNDLE` message."""
    if not 2 <= len(parts) <= MAX_PARTS:
        raise ValueError(f"A bundle holds 2 to {MAX_PARTS} messages, got {len(parts)}.")
    payload: dict = {"parts": len(parts)}
    for i, part in enumerate(parts):
        if part.type == BUNDLE:
            raise ValueError("A bundle cannot hold another bundle.")
        payload[f"{_TYPE}{i}"] = part.type
        payload.update({f"{i}/{key}": value for key, value in part.payload.items()})
    return Message(BUNDLE, payload)


def unbundle(message: Message) -> list[Message]:
    r"""The parts of a :data:`BUNDLE` message, in order.

    Raises:
        ValueError: Not a well-formed bundle (naming what is wrong): a count outside
            ``[2, MAX_PARTS]``, a part without a type, a nested bundle, a field of no part.
    """
    payload = dict(message.payload)
    count = payload.pop("parts", None)
    if isinstance(count, bool) or not isinstance(count, int) or not 2 <= count <= MAX_PARTS:
        raise ValueError(f"`parts` must be an int in [2, {MAX_PARTS}], got {count!r:.40}.")
    types: dict[int, str] = {}
    fields: list[dict] = [{} for _ in range(count)]
    for key, value in payload.items():
        if key.startswith(_TYPE):
            index = _index(key[len(_TYPE) :], count, key)
            if not isinstance(value, str) or not value or value == BUNDLE:
                raise ValueError(f"`{key}` must name a message type other than a bundle.")
            types[index] = value
        else:
            head, sep, rest = key.partition("/")
            if not sep:
                raise ValueError(f"`{key:.60}` is a field of no part of the bundle.")
            fields[_index(head, count, key)][rest] = value
    missing = sorted(set(range(count)) - set(types))
    if missing:
        raise ValueError(f"part {missing[0]} of the bundle has no type.")
    return [Message(types[i], fields[i]) for i in range(count)]


def bundled_reply(replies: Sequence[Message]) -> Message:
    r"""The replies to a bundle's parts as one reply; their stage timings are added up
    into the reply's own ``time:<stage>`` entries (what the ledger reads)."""
    times: dict[str, float] = {}
    parts = []
    for reply in replies:
        for stage, seconds in reply.timings().items():
            times[stage] = times.get(stage, 0.0) + seconds
        timeless = {k: v for k, v in reply.payload.items() if not k.startswith(TIME_PREFIX)}
        parts.append(Message(reply.type, timeless))
    payload = bundle(parts).payload
    return Message(BUNDLE, {**payload, **{f"{TIME_PREFIX}{k}": v for k, v in times.items()}})


def reply_parts(reply: Message) -> list[Message]:
    r"""The parts of a client's reply to a bundle (its own timings left out)."""
    if reply.type != BUNDLE:
        raise ValueError(f"A reply to a bundle must be a bundle, got {reply.type!r}.")
    fields = {k: v for k, v in reply.payload.items() if not k.startswith(TIME_PREFIX)}
    return unbundle(Message(BUNDLE, fields))


def _index(text: str, count: int, key: str) -> int:
    if text not in {str(i) for i in range(count)}:  # "01", "\u0661", "+1": no part
        raise ValueError(f"`{key:.60}` names no part of a bundle of {count}.")
    return int(text)
