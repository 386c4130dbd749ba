r"""The botorch-fed ``ClientApp``: every message goes to the party's agent.

Flower starts this app in a fresh process for each message; the party's client lives
in its agent (:mod:`.party`), whose Unix socket the SuperNode's node config names
(``agent="<path>"``). The one handler takes every ``query.<type>`` message, forwards
the protocol type and payload (:mod:`.records`) with the run's id and config and the
message's position (its group id ``"<round>:<seq>"``), and answers with the agent's
reply -- or, when the agent answered that it is still working on the message (an
ask/tell evaluation waits for the party's operator), with a reply holding only the
record ``pending``, and the server asks again. An error of the agent is raised here, so Flower hands
the server an error reply naming it: the agent's text, which is all the server may know
(:meth:`~.agent.PartyAgent.reply`: a refusal in full; an error of the run's client only
as its type, the client, the message and the round -- the rest stays in the agent's log).

This module imports no torch: the ``ClientApp`` process stays light.
"""

from __future__ import annotations

import socket

from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp

from botorch_fed.flower.records import (
    PENDING_RECORD,
    encode_frame,
    from_records,
    protocol_type,
    read_frame,
    to_records,
)

#: the agent's answer "still working on it, ask again" (:meth:`~.agent.PartyAgent.answer`)
PENDING: dict = {}


class AgentError(RuntimeError):
    r"""The party's agent refused or failed a message (its reason in the message, as the
    agent words it for the server)."""


class AgentUnavailable(AgentError):
    r"""The party's agent does not answer (not running, its socket gone): the server's
    transport treats the party as dropped out, as when its SuperNode leaves."""


def forward(path: str, meta: dict, payload: dict, timeout: float | None = None) -> dict:
    r"""Send ``(meta, payload)`` to the agent at ``path``; return its reply payload, or
    :data:`PENDING` (the very object) when the agent is still working on it.

    Raises:
        AgentUnavailable: The agent is not there (or its answer broke off).
        AgentError: It answered with an error.
    """
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout)
            sock.connect(path)
            sock.sendall(encode_frame(meta, payload))
            out_meta, out = read_frame(sock)
    except (OSError, ValueError) as exc:
        raise AgentUnavailable(f"the party's agent at {path} did not answer ({exc})") from None
    if not out_meta.get("ok"):
        raise AgentError(str(out_meta.get("error", "unknown error")))
    if out_meta.get("pending") is True:
        return PENDING
    return out


class AgentClientApp(ClientApp):
    r"""A ``ClientApp`` whose one handler serves every ``query.<type>`` message."""

    def __call__(self, message: Message, context: Context) -> Message:
        with self._lifespan(context):
            type_ = protocol_type(message.metadata.message_type)
            path = context.node_config.get("agent")
            if not isinstance(path, str) or not path:
                raise AgentError(
                    "This SuperNode's node config names no agent socket: start it with "
                    "--node-config 'partition-id=I num-partitions=N agent=\"<socket path>\"'."
                )
            meta = {"run": int(context.run_id), "type": type_, "config": dict(context.run_config)}
            meta |= position(message.metadata.group_id)
            reply = forward(path, meta, from_records(message.content))
            if reply is PENDING:
                return Message(RecordDict({PENDING_RECORD: ConfigRecord({})}), reply_to=message)
            return Message(to_records(reply), reply_to=message)


def position(group_id: str) -> dict:
    r"""``{"round": r, "seq": s}`` of a message's group id ``"<round>:<seq>"`` (the
    server's transport numbers its messages so); ``{}`` for another group id."""
    round_, sep, seq = str(group_id).partition(":")
    if not sep or not (round_.isdigit() and seq.isdigit()) or len(round_ + seq) > 12:
        return {}
    return {"round": int(round_), "seq": int(seq)}


app = AgentClientApp()
