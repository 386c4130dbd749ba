r"""The messages a transport carried, bundles opened: what a client handled, part by part."""

from __future__ import annotations

from botorch_fed.protocol.bundle import BUNDLE, reply_parts, unbundle
from botorch_fed.protocol.messages import Message


def parts(message: Message) -> list[Message]:
    r"""``message``'s parts in order if it is a bundle, else ``[message]``."""
    return unbundle(message) if message.type == BUNDLE else [message]


def reply_parts_of(reply: Message) -> list[Message]:
    r"""The replies to a bundle's parts (timings left out), else ``[reply]``."""
    return reply_parts(reply) if reply.type == BUNDLE else [reply]
