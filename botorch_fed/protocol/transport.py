r"""Transports: how the server's messages reach the clients.

:class:`InProcessTransport` calls the client objects' ``handle`` directly (tests,
benchmarks, the CLI) and records bytes and the clients' reported stage times in the
:class:`~botorch_fed.protocol.ledger.Ledger`. The deployment over real processes
implements the same interface on Flower
(:class:`~botorch_fed.flower.transport.FlowerTransport`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Protocol

from botorch_fed.protocol.ledger import Ledger
from botorch_fed.protocol.messages import Message

if TYPE_CHECKING:

    class _Handler(Protocol):
        r"""A client object: answers one message (``FederatedClient.handle``)."""

        def handle(self, message: Message) -> Message: ...


class Transport(ABC):
    r"""Delivers one message to each addressed client and returns their replies."""

    ledger: Ledger

    @property
    @abstractmethod
    def client_ids(self) -> tuple[int, ...]:
        r"""The ids of the clients this transport reaches."""

    @abstractmethod
    def send(self, messages: Mapping[int, Message]) -> dict[int, Message]:
        r"""Send ``{client id: message}``; return ``{client id: reply}``.

        A client that does not answer is absent from the result (a dropout).
        """


class InProcessTransport(Transport):
    r"""Calls ``client.handle(message)`` for clients living in this process.

    Args:
        clients: ``{client id: client object}`` with a ``handle(Message) -> Message``.
        ledger: Where bytes and client stage times are recorded.
        on_receive: Optional hook ``(client id, reply) -> None`` called for every
            reply before the server sees it (instrumentation, e.g. privacy tests).
    """

    def __init__(
        self,
        clients: Mapping[int, _Handler],
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
        replies = {}
        for cid in sorted(messages):
            if cid not in self._clients:
                raise KeyError(f"No client with id {cid} on this transport.")
            msg = messages[cid]
            if not isinstance(msg, Message):
                raise TypeError(f"Message to client {cid} is a {type(msg).__name__}, not Message.")
            reply = self._clients[cid].handle(msg)
            if not isinstance(reply, Message):
                raise TypeError(f"Client {cid} answered with a {type(reply).__name__}.")
            self.ledger.add_message(cid, msg.nbytes, reply.nbytes)
            for stage, seconds in reply.timings().items():
                self.ledger.add_time(stage, seconds, party=cid)
            if self._on_receive is not None:
                self._on_receive(cid, reply)
            replies[cid] = reply
        return replies
