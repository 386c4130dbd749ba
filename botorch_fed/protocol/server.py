r"""The server role: :class:`FederatedServer` drives the rounds through a transport and
relays secure sums, learning a sum only if the backend reveals it (never under CKKS)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import TypeVar

import numpy as np

from botorch_fed.protocol.bundle import MAX_PARTS, bundle, reply_parts
from botorch_fed.protocol.checkpoint import CheckpointError, expect_keys
from botorch_fed.protocol.declarations import Declared, ProtocolViolation, Refused
from botorch_fed.protocol.ledger import Ledger
from botorch_fed.protocol.messages import TIME_PREFIX, Message
from botorch_fed.protocol.secure_sum import ARG_PREFIX, SECAGG, SUM_RESULT, limb_encoding
from botorch_fed.protocol.transport import Transport

_R = TypeVar("_R", bound=Declared)


def as_message(message: str | Declared, payload: dict | None = None) -> Message:
    r"""A declared message, or a type and its payload, as a :class:`Message`."""
    if isinstance(message, Declared):
        if payload is not None:
            raise TypeError("A declared message carries its own payload.")
        return Message(message.TYPE, message.wire())
    return Message(message, dict(payload or {}))


class FederatedServer:
    r"""Base class of a server program (subclasses hold the run's ``settings``).

    Args:
        transport: How messages reach the clients.
        secagg: The server role of a secure-aggregation backend (``None``: no secure sums).
    """

    def __init__(self, transport: Transport, secagg=None) -> None:
        self.transport = transport
        self.secagg = secagg
        self._carry: dict[int, list[tuple[Message, str | None]]] = {}  # (:meth:`carry`)
        self._kept: dict[str, dict[int, Message]] = {}  # replies to carried messages kept
        self._lost = False  # an exchange with carried messages failed

    @property
    def ledger(self) -> Ledger:
        return self.transport.ledger

    @property
    def client_ids(self) -> tuple[int, ...]:
        return self.transport.client_ids

    def initialize(self) -> None:
        r"""Round 0: the clients evaluate their initial designs (subclasses add theirs)."""
        self.broadcast("init")

    def run_round(self, t: int) -> None:
        r"""Round ``t >= 1`` of the algorithm."""
        raise NotImplementedError(f"{type(self).__name__} does not implement run_round.")

    def run(
        self, on_round: Callable[[int], None] | None = None, start_round: int | None = None
    ) -> None:
        r"""Run round 0 (``initialize``, unless resuming after ``start_round``) and rounds
        up to ``settings.num_rounds``, calling ``on_round(t)`` after each."""
        after = on_round or (lambda t: None)
        if start_round is None:
            start_round = self.ledger.round = 0
            self.initialize()
            self.flush()
            after(0)
        for t in range(start_round + 1, self.settings.num_rounds + 1):  # type: ignore[attr-defined]
            self.ledger.round = t
            self.run_round(t)
            self.flush()
            after(t)

    def state_dict(self) -> dict:
        r"""The server's state between rounds (subclasses add theirs): its ledger and the
        nonces the clients committed to for their next secure sums (``ckks``: a resumed
        server opens the sessions it opened before, which parties that kept their
        commitments answer as before; see :meth:`forget_commitments`)."""
        if self._carry or self._kept or self._lost:
            raise ProtocolViolation(
                "Server: cannot checkpoint with messages still to send, replies unread or "
                "carried messages lost with a failed exchange."
            )
        held = {} if self.secagg is None else self.secagg.committed_nonces()
        return {
            "ledger": self.ledger.state_dict(),
            "commitments": {int(c): nonce.hex() for c, nonce in sorted(held.items())},
        }

    def load_state_dict(self, state: dict) -> None:
        r"""Restore :meth:`state_dict` (subclasses restore theirs)."""
        expect_keys("Server", state, ("ledger", "commitments"))
        held = state["commitments"]
        try:
            commitments = {int(c): bytes.fromhex(n) for c, n in held.items()}
        except (AttributeError, TypeError, ValueError):
            raise CheckpointError(
                f"Server: `commitments` must map client ids to hex nonces, got {held!r:.80}."
            ) from None
        self.ledger.load_state_dict(state["ledger"])
        if self.secagg is not None:
            self.secagg.restore_committed_nonces(commitments)
        elif commitments:
            raise CheckpointError("Server: committed nonces, but no secure-aggregation backend.")

    def forget_commitments(self) -> None:
        r"""Drop the clients' committed nonces: clients rebuilt with fresh secure-aggregation
        roles hold none (a commitment restored into a fresh role would let a server replay
        a session it ran after the checkpoint), so the next sums start with a nonce round."""
        if self.secagg is not None:
            self.secagg.restore_committed_nonces({})

    def decode_reply(
        self, declaration: type[_R], cid: int, what: str, payload: Mapping, party: object = None
    ) -> _R:
        r"""Client ``cid``'s reply (the ``what``, timings dropped) decoded against ``declaration``
        on ``party`` (default this server), or a :class:`ProtocolViolation` naming the client."""
        fields = {k: v for k, v in payload.items() if not k.startswith(TIME_PREFIX)}
        try:
            return declaration.decode(fields, self if party is None else party)
        except Refused as exc:
            raise ProtocolViolation(
                f"Server: refused the {what} of client {cid}: {exc.describe('its')}."
            ) from None

    def broadcast(
        self,
        type: str | Declared,
        payload: dict | None = None,
        clients: Iterable[int] | None = None,
    ) -> dict[int, Message]:
        r"""Send one message (declared, or a type and ``payload``) to ``clients`` (default
        all); return the replies."""
        ids = self.client_ids if clients is None else tuple(clients)
        return self.send(dict.fromkeys(ids, as_message(type, payload)))

    def send(self, messages: Mapping[int, Message | Declared]) -> dict[int, Message]:
        r"""Send individual messages (declared or :class:`Message`) in one exchange, each
        after what :meth:`carry` queued for its client (bundled); return the replies to
        ``messages`` (a client that dropped out is absent).

        Raises:
            ProtocolViolation: A client's reply to a bundle is not one of its parts'
                replies (naming the client).
        """
        outgoing = {
            cid: m if isinstance(m, Message) else as_message(m) for cid, m in messages.items()
        }
        carried = self._carry
        keep = {cid: [label for _, label in queued] for cid, queued in carried.items()}
        parts = {
            cid: [m for m, _ in carried.get(cid, [])] + ([outgoing[cid]] if cid in outgoing else [])
            for cid in sorted(set(outgoing) | set(carried))
        }
        if not parts:
            return {}
        self._carry = {}  # sent, or lost with an exchange that failed (which ends the round)
        try:
            replies = self.transport.send(
                {cid: p[0] if len(p) == 1 else bundle(p) for cid, p in parts.items()}
            )
        except BaseException:
            self._lost = bool(carried)  # clients may hold some parts: no checkpoint of it
            raise
        answers = {}
        for cid, reply in replies.items():
            if len(parts[cid]) > 1:
                try:
                    got = reply_parts(reply)
                except ValueError as exc:
                    raise ProtocolViolation(f"Server: client {cid}'s reply: {exc}") from None
                if [r.type for r in got] != [m.type for m in parts[cid]]:
                    raise ProtocolViolation(
                        f"Server: client {cid} answered a bundle of {len(parts[cid])} "
                        f"messages with {len(got)} replies of other types."
                    )
                labels = keep.get(cid, [])
                for label, answer in zip(labels, got[: len(labels)], strict=True):
                    if label is not None:
                        self._kept.setdefault(label, {})[cid] = answer
                reply = got[-1]
            elif cid not in outgoing and (label := keep[cid][0]) is not None:
                self._kept.setdefault(label, {})[cid] = reply
            if cid in outgoing:
                answers[cid] = reply
        return answers

    def carry(self, messages: Mapping[int, Message | Declared], keep: str | None = None) -> None:
        r"""Queue messages the server need not wait for: each goes to its client with the
        server's next :meth:`send`, bundled before that send's message (a client the send
        does not address gets them alone, in the same exchange). With ``keep``, their
        replies are kept for :meth:`carried_replies` (``keep``)."""
        if keep is not None:
            queued = any(label == keep for q in self._carry.values() for _, label in q)
            if queued or keep in self._kept:
                raise ProtocolViolation(
                    f"Server: replies kept as {keep!r} are still to be sent or read."
                )
        for cid, message in messages.items():
            message = message if isinstance(message, Message) else as_message(message)
            if len(self._carry.get(cid, ())) >= MAX_PARTS - 1:  # a bundle holds no more
                self.flush()
            self._carry.setdefault(cid, []).append((message, keep))

    def carried_replies(self, keep: str) -> dict[int, Message]:
        r"""The replies to the messages carried with ``keep`` (once, after the send that
        took them; a client that dropped out is absent)."""
        return self._kept.pop(keep, {})

    def flush(self) -> None:
        r"""Send what :meth:`carry` queued, if anything (every round ends with none)."""
        if self._carry:
            self.send({})

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
            request: Which vector the clients contribute (``@contributes(request)``).
            length: Its length.
            args: The request's arguments (each client checks them).
            clients: Contributors (default all).
            share: Tell the contributors the outcome (each then holds it in ``last_sum``).
            wide: ``high`` of the limb encoding (0: raw float64), the clients' choice.

        Returns:
            The sum if the backend reveals it to the server, else ``None``.
        """
        if self.secagg is None:
            raise ProtocolViolation("This server has no secure-aggregation backend.")
        ids = self.client_ids if clients is None else tuple(clients)
        extra = {
            "request": request,
            **{f"{ARG_PREFIX}{k}": v for k, v in (args or {}).items()},
            "wide": int(wide),
            "round": int(self.ledger.round),
        }
        encoding = limb_encoding(wide) if wide else None
        with self.ledger.timer("secure_aggregation"):
            out = self.secagg.start(ids, encoding.encoded_length(length) if encoding else length)
        while isinstance(out, dict):
            steps = {cid: Message(SECAGG, {"data": data, **extra}) for cid, data in out.items()}
            if self.secagg.last_round_unanswered():  # it goes with the next message
                self.carry(steps)
                self.secagg.finish_unanswered()
                out = None
                break
            replies = self.send(steps)
            extra = {}
            with self.ledger.timer("secure_aggregation"):
                out = self.secagg.step({cid: r.payload["data"] for cid, r in replies.items()})
        result = out if isinstance(out, np.ndarray) else None
        if result is not None and encoding is not None:
            result = encoding.decode(result)
        if share:  # with the next message too: the server needs no reply
            message = Message(SUM_RESULT, {} if result is None else {"sum": result})
            self.carry(dict.fromkeys(self.secagg.contributors, message))
        return result
