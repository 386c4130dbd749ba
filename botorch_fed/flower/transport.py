r""":class:`FlowerTransport`: the protocol's :class:`Transport` on Flower's ``Grid``.

The server program calls ``send({client id: Message})`` exactly as on the in-process
transport. Here each message becomes a Flower message of type ``query.<type>``
(:mod:`.records`) to the client's SuperNode, and the replies are pulled until every
addressed client answered or ``timeout`` passed. The ledger records the bytes Flower
actually carries (:func:`~.records.wire_bytes`) and the clients' stage times.

A client that does not answer in time, or whose SuperNode left the federation, is a
dropout: with ``on_dropout="fail"`` the run stops with :class:`ClientUnavailable`
naming the client and its node; with ``"continue"`` the client is left out of this and
every later message (it is absent from the replies, as the :class:`Transport` contract
says), and the run goes on where the algorithm and secure backend tolerate it (masking
does; a plaintext or CKKS sum needs every contributor). A client whose handler raised
(a protocol violation, its black box failing) stops the run with :class:`ClientFailed`.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping
from typing import Any

from botorch_fed.flower.records import flower_type, from_records, to_records, wire_bytes
from botorch_fed.protocol.ledger import Ledger
from botorch_fed.protocol.messages import Message
from botorch_fed.protocol.transport import Transport

_UNAVAILABLE = (3, 4, 5, 8)  # MESSAGE / REPLY_MESSAGE / NODE unavailable, CLIENT_APP_CRASHED
# the ClientApp's error (Flower's reason names its class) when the party's agent is gone
AGENT_GONE = "client_app.AgentUnavailable'>"


# how flwr-clientapp reports a ClientApp's exception: "<class 'module.Name'>:<'message'>"
_RAISED = re.compile(r"<class '(?:[\w.]+\.)?(\w+)'>:<'(.*)'>", re.DOTALL)


def plain_reason(reason: str) -> str:
    r"""Flower's error ``reason`` as a sentence: a ClientApp's exception as
    ``Name: message`` (the party agent's own refusals as their message, which names its
    kind), without the trailing full stop of Flower's own reasons."""
    if (raised := _RAISED.fullmatch(reason.strip())) is not None:
        name, message = raised.groups()
        reason = message if name in ("AgentError", "AgentUnavailable") else f"{name}: {message}"
    return reason.strip().rstrip(".")


class ClientUnavailable(RuntimeError):
    r"""A client did not answer (timeout, its SuperNode gone) and the run cannot go on."""


class ClientFailed(RuntimeError):
    r"""A client answered with an error (its handler raised)."""


class FlowerTransport(Transport):
    r"""Sends the protocol's messages through a Flower ``Grid``.

    Args:
        grid: The ServerApp's ``Grid``.
        nodes: ``{client id: Flower node id}``.
        timeout: Seconds each ``send`` waits for the replies.
        on_dropout: ``"fail"`` or ``"continue"`` (module docstring).
        ledger: Where bytes and the clients' stage times go.
        poll: Seconds between two pulls of the replies (0.25 s, as Flower's own
            runtime polls: each pull is an HTTP request the SuperLink answers, and a
            message's round trip takes seconds anyway).
        log: Called with a line for each dropout.
        describe: How errors name a client (default ``client <id> (Flower node <n>)``).
    """

    def __init__(
        self,
        grid,
        nodes: Mapping[int, int],
        timeout: float,
        on_dropout: str = "fail",
        ledger: Ledger | None = None,
        poll: float = 0.25,
        log: Callable[[str], None] | None = None,
        describe: Callable[[int], str] | None = None,
    ) -> None:
        if on_dropout not in ("fail", "continue"):
            raise ValueError(f"`on_dropout` must be 'fail' or 'continue', got {on_dropout!r}.")
        if not (isinstance(timeout, int | float) and timeout > 0):
            raise ValueError(f"`timeout` must be a positive number of seconds, got {timeout!r}.")
        self.grid = grid
        self.nodes = {int(c): int(n) for c, n in nodes.items()}
        self.timeout = float(timeout)
        self.on_dropout = on_dropout
        self.ledger = Ledger() if ledger is None else ledger
        self.poll = float(poll)
        self.dropped: dict[int, str] = {}
        self._log = log or (lambda line: None)
        self._describe = describe or (lambda cid: f"client {cid} (Flower node {self.nodes[cid]})")

    @property
    def client_ids(self) -> tuple[int, ...]:
        return tuple(sorted(self.nodes))

    def send(self, messages: Mapping[int, Message]) -> dict[int, Message]:
        return self.exchange(messages, record=True)

    def exchange(
        self, messages: Mapping[int, Message], record: bool = True, tolerate: bool = False
    ) -> dict[int, Message]:
        r""":meth:`send`; with ``record=False`` nothing enters the ledger (the harness's
        own messages: discovery and the final report); with ``tolerate=True`` a client
        that fails or does not answer is only logged and left out of the replies."""
        from flwr.app import Message as FlowerMessage

        outgoing, sizes = {}, {}
        for cid in sorted(messages):
            if cid not in self.nodes:
                raise KeyError(f"No client with id {cid} on this transport.")
            msg = messages[cid]
            if not isinstance(msg, Message):
                raise TypeError(f"Message to client {cid} is a {type(msg).__name__}, not Message.")
            if cid in self.dropped:
                continue
            fmsg = FlowerMessage(
                to_records(msg.payload),
                self.nodes[cid],
                flower_type(msg.type),
                ttl=self.timeout,  # a late message is not delivered after the run gave up
                group_id=str(self.ledger.round),
            )
            outgoing[cid] = (msg, fmsg)
            sizes[cid] = wire_bytes(fmsg)
        ids = list(self.grid.push_messages([f for _, f in outgoing.values()]))
        replies: dict[int, Any] = {}
        errors: dict[int, tuple[int | None, str]] = {}
        if len(ids) != len(outgoing):  # Flower refused the whole batch (e.g. too large)
            ids = [None] * len(outgoing)
        waiting: dict[str, int] = {}
        for mid, cid in zip(ids, outgoing, strict=True):
            if mid is None:  # this message was not pushed
                errors[cid] = (None, "Flower did not accept the message for delivery")
            else:
                waiting[mid] = cid
        deadline = time.monotonic() + self.timeout
        while waiting:
            for reply in self.grid.pull_messages(list(waiting)):
                mid = reply.metadata.reply_to_message_id
                if mid not in waiting:
                    continue
                cid = waiting.pop(mid)
                if reply.has_error():
                    code: int | None = int(reply.error.code)
                    reason = str(reply.error.reason)
                    if AGENT_GONE in reason:  # the party's agent is not there: a dropout
                        code = None
                    errors[cid] = (code, reason)
                else:
                    replies[cid] = reply
            if not waiting or time.monotonic() > deadline:
                break
            time.sleep(self.poll)
        for cid in waiting.values():
            errors[cid] = (None, f"no answer within {self.timeout:g} s")
        for cid, (code, reason) in sorted(errors.items()):
            if tolerate:
                where = f"{self._describe(cid)}, message {outgoing[cid][0].type!r}"
                self._log(f"{where}: {plain_reason(reason)}")
                continue
            self._failed(cid, code, reason, outgoing[cid][0].type)
        out = {}
        for cid in sorted(replies):
            request = outgoing[cid][0]
            reply = Message(request.type, from_records(replies[cid].content))
            if record:
                self.ledger.add_message(cid, sizes[cid], wire_bytes(replies[cid]))
                for stage, seconds in reply.timings().items():
                    self.ledger.add_time(stage, seconds, party=cid)
            out[cid] = reply
        return out

    def _failed(self, cid: int, code: int | None, reason: str, type_: str) -> None:
        where = f"{self._describe(cid)}, message {type_!r}"
        reason = plain_reason(reason)
        if code is not None and code not in _UNAVAILABLE:
            raise ClientFailed(f"{where} failed: {reason}")
        if self.on_dropout == "fail":
            raise ClientUnavailable(
                f"{where}: {reason}. The run stops (on-dropout 'fail'; 'continue' goes on "
                "without it where the algorithm and secure backend tolerate dropouts)."
            )
        self.dropped[cid] = reason
        self._log(f"{where}: {reason}; it drops out of the run.")
