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

from botorch_fed.flower.records import (
    PENDING_RECORD,
    flower_type,
    from_records,
    to_records,
    wire_bytes,
)
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
        hold: Seconds a party's agent may hold a message before it answers "pending"
            (the run config's ``hold``; :meth:`exchange`).
        wait_for_agents: Wait for a party whose agent does not answer rather than
            drop it (a campaign: its agent restarts and continues from its journal).
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
        hold: float = 0.0,
        wait_for_agents: bool = False,
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
        self.hold = float(hold)
        self.wait_for_agents = bool(wait_for_agents)
        self.sequence: dict[int, int] = {}  # protocol messages sent to each client
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
        r""":meth:`send`; with ``record=False`` nothing enters the ledger and the messages
        are not numbered (the harness's own messages: discovery and the final report);
        with ``tolerate=True`` a client that fails or does not answer is only logged and
        left out of the replies.

        A protocol message to client ``c`` is its ``sequence[c]``-th (its Flower group id
        ``"<round>:<seq>"``). A party that answers "pending" (its agent held the message
        ``hold`` seconds and is still working on it: an ask/tell evaluation) is asked
        again at once with the same message; with ``wait_for_agents`` a party whose
        agent does not answer (stopped, restarting) is asked again after a growing pause
        (1 s doubling to 60 s). Neither counts against ``timeout``, which bounds each
        message's answer (its time to live is ``timeout + hold``). While it waits, the
        transport pulls replies less often (every ``poll`` seconds at first, growing with
        the time waited to one every 5 s: after 200 s at a 0.25 s poll)."""
        from flwr.app import Message as FlowerMessage

        outgoing, sizes = {}, {}
        if record:
            self.ledger.add_exchange()
        for cid in sorted(messages):
            if cid not in self.nodes:
                raise KeyError(f"No client with id {cid} on this transport.")
            msg = messages[cid]
            if not isinstance(msg, Message):
                raise TypeError(f"Message to client {cid} is a {type(msg).__name__}, not Message.")
            if cid in self.dropped:
                continue
            group = str(self.ledger.round)
            if record:
                group = f"{self.ledger.round}:{self.sequence.get(cid, 0)}"
                self.sequence[cid] = self.sequence.get(cid, 0) + 1
            ttl = self.timeout + self.hold
            fmsg = FlowerMessage(
                to_records(msg.payload), self.nodes[cid], flower_type(msg.type), ttl=ttl,
                group_id=group,
            )  # fmt: skip
            outgoing[cid] = (msg, fmsg.content, group)
            sizes[cid] = wire_bytes(fmsg)
        replies: dict[int, Any] = {}
        errors: dict[int, tuple[int | None, str]] = {}
        waiting: dict[str, int] = {}
        deadlines: dict[int, float] = {}
        later: dict[int, float] = {}  # client -> when to ask again (its agent is away)
        pauses: dict[int, float] = {}
        self._push(outgoing, list(outgoing), waiting, deadlines, errors)
        start = time.monotonic()
        while waiting or later:
            now = time.monotonic()
            again = []
            for reply in self.grid.pull_messages(list(waiting)) if waiting else []:
                mid = reply.metadata.reply_to_message_id
                if mid not in waiting:
                    continue
                cid = waiting.pop(mid)
                if reply.has_error():
                    code: int | None = int(reply.error.code)
                    reason = str(reply.error.reason)
                    if AGENT_GONE in reason:  # the party's agent is not there
                        if self.wait_for_agents:
                            pause = pauses[cid] = min(2 * pauses.get(cid, 0.5), 60.0)
                            if pause == 1.0:
                                self._log(
                                    f"{self._describe(cid)}: its agent does not answer; "
                                    "waiting for it (`botorch-fed flower up` restarts it)"
                                )
                            later[cid] = now + pause
                            continue
                        code = None  # a dropout
                    errors[cid] = (code, reason)
                elif PENDING_RECORD in set(reply.content.keys()):
                    again.append(cid)  # its agent held it `hold` s: ask again at once
                else:
                    replies[cid] = reply
            again += [cid for cid, when in later.items() if when <= now]
            for cid in again:
                later.pop(cid, None)
            if again:
                self._push(outgoing, again, waiting, deadlines, errors)
            for mid, cid in list(waiting.items()):
                if now > deadlines[cid]:
                    del waiting[mid]
                    errors[cid] = (None, f"no answer within {self.timeout:g} s")
            if not waiting and not later:
                break
            waited = time.monotonic() - start
            time.sleep(min(5.0, self.poll * max(1.0, waited / 10.0)))
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

    def _push(self, outgoing, cids, waiting, deadlines, errors) -> None:
        r"""Push the messages of ``cids`` (again: a fresh Flower message of the same
        content and group id each time)."""
        from flwr.app import Message as FlowerMessage

        batch = []
        for cid in cids:
            msg, content, group = outgoing[cid]
            batch.append(
                FlowerMessage(
                    content,
                    self.nodes[cid],
                    flower_type(msg.type),
                    ttl=self.timeout + self.hold,
                    group_id=group,
                )  # fmt: skip
            )
        ids = list(self.grid.push_messages(batch))
        if len(ids) != len(batch):  # Flower refused the whole batch (e.g. too large)
            ids = [None] * len(batch)
        now = time.monotonic()
        for mid, cid in zip(ids, cids, strict=True):
            if mid is None:  # this message was not pushed
                errors[cid] = (None, "Flower did not accept the message for delivery")
            else:
                waiting[mid] = cid
                deadlines[cid] = now + self.timeout + self.hold

    def state_dict(self) -> dict:
        r"""What a resumed server's transport needs: how many messages went to each
        client (the parties answer a message they answered again only at its position)."""
        return {"sequence": {str(c): n for c, n in sorted(self.sequence.items())}}

    def load_state_dict(self, state: dict) -> None:
        r"""Restore :meth:`state_dict`."""
        sequence = state.get("sequence") if isinstance(state, dict) else None
        if not isinstance(sequence, dict) or not all(
            isinstance(n, int) and n >= 0 for n in sequence.values()
        ):
            raise ValueError("The transport's state must map clients to message counts.")
        self.sequence = {int(c): int(n) for c, n in sequence.items()}

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
