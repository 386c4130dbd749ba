r"""The server role of the federation protocol.

A :class:`FederatedServer` drives the rounds through a
:class:`~botorch_fed.protocol.transport.Transport` and never touches client objects:
it sends declared messages (or a type and a payload) and reads the replies. Its
:meth:`FederatedServer.secure_sum` starts a session of a ``botorch_fed.secure`` backend,
relays its bytes and then tells every contributor the outcome; the server learns the
sum only if the backend reveals it (plaintext, masking; never under CKKS).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Protocol

import numpy as np

from botorch_fed.protocol.checkpoint import expect_keys
from botorch_fed.protocol.declarations import (
    Declared,
    ProtocolViolation,
)
from botorch_fed.protocol.ledger import Ledger
from botorch_fed.protocol.messages import Message
from botorch_fed.protocol.secure_sum import (
    SECAGG,
    SUM_RESULT,
    limb_encoding,
)
from botorch_fed.protocol.transport import Transport

if TYPE_CHECKING:
    from botorch_fed.protocol.round_budget import _RoundSettings

    class _RunnableServer(Protocol):
        r"""What :meth:`FederatedServer.run` uses of a server: its subclasses hold the
        run's ``settings`` (which name ``num_rounds``)."""

        @property
        def settings(self) -> _RoundSettings: ...

        @property
        def ledger(self) -> Ledger: ...

        def initialize(self) -> None: ...

        def run_round(self, t: int) -> None: ...


def as_message(message: str | Declared, payload: dict | None = None) -> Message:
    r"""A declared message, or a type and its payload, as a :class:`Message`."""
    if isinstance(message, Declared):
        if payload is not None:
            raise TypeError("A declared message carries its own payload.")
        return Message(message.TYPE, message.wire())
    return Message(message, dict(payload or {}))


class FederatedServer:
    r"""Base class of a server program.

    Args:
        transport: How messages reach the clients.
        secagg: The server role of a secure-aggregation backend (``None``: no secure
            sums).
    """

    def __init__(self, transport: Transport, secagg=None) -> None:
        self.transport = transport
        self.secagg = secagg

    # --- the round-based program ------------------------------------------------------
    def initialize(self) -> None:
        r"""Round 0: the clients evaluate their initial designs (subclasses add the
        algorithm's own set-up)."""
        self.broadcast("init")

    def state_dict(self) -> dict:
        r"""The server's state between rounds (subclasses add theirs): its ledger."""
        return {"ledger": self.ledger.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        r"""Restore :meth:`state_dict` (subclasses restore theirs)."""
        expect_keys("Server", state, ("ledger",))
        self.ledger.load_state_dict(state["ledger"])

    def run_round(self, t: int) -> None:
        r"""Round ``t >= 1`` of the algorithm."""
        raise NotImplementedError(f"{type(self).__name__} does not implement run_round.")

    def run(
        self: _RunnableServer,
        on_round: Callable[[int], None] | None = None,
        start_round: int | None = None,
    ) -> None:
        r"""Run the initialisation (round 0) and rounds ``1 .. settings.num_rounds``.

        Args:
            on_round: Called with ``t`` after each round (0: initialisation).
            start_round: The last round already done: a resumed run continues after
                it (0: after the initialisation). ``None``: a fresh run.
        """
        if start_round is None:
            start_round = 0
            self.ledger.round = 0
            self.initialize()
            if on_round is not None:
                on_round(0)
        for t in range(start_round + 1, self.settings.num_rounds + 1):
            self.ledger.round = t
            self.run_round(t)
            if on_round is not None:
                on_round(t)

    @property
    def ledger(self) -> Ledger:
        return self.transport.ledger

    @property
    def client_ids(self) -> tuple[int, ...]:
        return self.transport.client_ids

    def broadcast(
        self,
        type: str | Declared,
        payload: dict | None = None,
        clients: Iterable[int] | None = None,
    ) -> dict[int, Message]:
        r"""Send the same message to ``clients`` (default all); return the replies.

        ``type`` is a declared message (then without ``payload``) or a message type."""
        ids = self.client_ids if clients is None else tuple(clients)
        msg = as_message(type, payload)
        return self.transport.send(dict.fromkeys(ids, msg))

    def send(self, messages: Mapping[int, Message | Declared]) -> dict[int, Message]:
        r"""Send individual messages (declared or :class:`Message`); return the replies."""
        return self.transport.send(
            {cid: m if isinstance(m, Message) else as_message(m) for cid, m in messages.items()}
        )

    def secure_sum(
        self,
        request: str,
        length: int,
        args: dict | None = None,
        clients: Iterable[int] | None = None,
        share: bool = True,
        wide: int = 64,
    ) -> np.ndarray | None:
        r"""Sum a vector over clients with the secure-aggregation backend.

        Args:
            request: Which vector the clients contribute (declared by each client with
                ``@contributes(request)``).
            length: Its length.
            args: The request's arguments (checked by each client against the request's
                declaration).
            clients: Contributors (default all).
            share: Tell the clients the outcome so each holds the sum in
                ``last_sum`` (the server forwards it if it learnt it).
            wide: Send the vectors in the wide-range limb encoding
                (:class:`~botorch_fed.secure.limbs.LimbEncoding`): exact to ``2^-40``
                for any magnitude below ``2^wide``, at ``num_limbs`` times the length
                (0: raw float64 values). The clients decide the encoding of each
                request (:meth:`FederatedClient.sum_encoding`) and refuse a session
                that names another: this must be theirs.

        Returns:
            The sum if the backend reveals it to the server, else ``None`` (the
            clients hold it).
        """
        if self.secagg is None:
            raise ProtocolViolation("This server has no secure-aggregation backend.")
        ids = self.client_ids if clients is None else tuple(clients)
        first = {"request": request, **{f"arg:{k}": v for k, v in (args or {}).items()}}
        first["wide"] = int(wide)
        first["round"] = int(self.ledger.round)
        encoding = limb_encoding(wide) if wide else None
        with self.ledger.timer("secure_aggregation"):
            outgoing = self.secagg.start(
                ids, encoding.encoded_length(length) if encoding else length
            )
        extra = first
        while True:
            replies = self.send(
                {cid: Message(SECAGG, {"data": data, **extra}) for cid, data in outgoing.items()}
            )
            extra = {}
            with self.ledger.timer("secure_aggregation"):
                out = self.secagg.step({cid: r.payload["data"] for cid, r in replies.items()})
            if isinstance(out, dict):
                outgoing = out
                continue
            break
        result = out if isinstance(out, np.ndarray) else None
        if result is not None and encoding is not None:
            result = encoding.decode(result)
        if share:
            payload = {} if result is None else {"sum": result}
            self.broadcast(SUM_RESULT, payload, clients=self.secagg.contributors)
        return result
