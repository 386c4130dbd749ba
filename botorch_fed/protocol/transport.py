r"""Transports: how the server's messages reach the clients (:class:`InProcessTransport`
here; :class:`~botorch_fed.flower.transport.FlowerTransport` over real processes)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from typing import Any

from botorch_fed.protocol.ledger import Ledger
from botorch_fed.protocol.messages import Message


class Transport(ABC):
    r"""Delivers one message to each addressed client and returns their replies."""

    ledger: Ledger

    @property
    @abstractmethod
    def client_ids(self) -> tuple[int, ...]:
        r"""The ids of the clients this transport reaches."""

    @abstractmethod
    def send(self, messages: Mapping[int, Message]) -> dict[int, Message]:
        r"""Send ``{client id: message}``; return ``{client id: reply}`` (a dropout is absent)."""


class InProcessTransport(Transport):
    r"""Calls ``client.handle(message)`` for clients living in this process.

    Args:
        clients: ``{client id: client}``, each with ``handle(Message) -> Message``.
        ledger: Where bytes and client stage times are recorded.
        on_receive: Optional hook ``(client id, reply) -> None`` called for every reply
            before the server sees it (instrumentation).
    """

    def __init__(
        self,
        clients: Mapping[int, Any],
        ledger: Ledger | None = None,
        on_receive: Callable[[int, Message], None] | None = None,
    ) -> None:
        self._clients = dict(clients)
        self.ledger = Ledger() if ledger is None else ledger
        self._on_receive = on_receive

    @property
    def client_ids(self) -> tuple[int, ...]:
        return tuple(sorted(self._clients))

    def send(self, messages: Mapping[int, Message]) -> dict[int, Message]:
        self.ledger.add_exchange()
        replies = {}
        for cid in sorted(messages):
            if cid not in self._clients:
                raise KeyError(f"No client with id {cid} on this transport.")
            msg = messages[cid]
            reply = self._clients[cid].handle(msg)
            self.ledger.add_message(cid, msg.nbytes, reply.nbytes)
            for stage, seconds in reply.timings().items():
                self.ledger.add_time(stage, seconds, party=cid)
            if self._on_receive is not None:
                self._on_receive(cid, reply)
            replies[cid] = reply
        return replies
