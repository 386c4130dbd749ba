r"""Bundles: several messages to one client in one exchange, answered in order as if each
came alone; what the server carries goes with its next send (one exchange, not two)."""

from __future__ import annotations

from typing import Annotated

import numpy as np
import pytest

from botorch_fed.protocol.bundle import (
    BUNDLE,
    MAX_PARTS,
    bundle,
    bundled_reply,
    reply_parts,
    unbundle,
)
from botorch_fed.protocol.client import FederatedClient
from botorch_fed.protocol.declarations import Declared, Int, ProtocolViolation, declare, handles
from botorch_fed.protocol.messages import Message
from botorch_fed.protocol.server import FederatedServer
from botorch_fed.protocol.transport import InProcessTransport


@declare("tick")
class _Tick(Declared):
    k: Annotated[int, Int(0, 100)]


class _Client(FederatedClient):
    def __init__(self, client_id: int) -> None:
        super().__init__(client_id)
        self.seen: list[int] = []

    @handles(_Tick)
    def on_tick(self, message: _Tick) -> dict:
        with self.timed("work"):
            self.seen.append(message.k)
        return {"k2": message.k * 2, "array": np.arange(message.k, dtype=np.float64)}


class _Server(FederatedServer):
    settings = None


def _federation(n=3):
    clients = {c: _Client(c) for c in range(n)}
    return _Server(InProcessTransport(clients)), clients


def _tick(k):
    return Message("tick", {"k": k})


def test_a_bundle_holds_its_parts_in_order_and_gives_them_back_unchanged():
    parts = [_tick(1), Message("other", {"a/b": b"x", "time:s": 1.0}), _tick(3)]
    message = bundle(parts)
    assert message.type == BUNDLE and message.payload["parts"] == 3
    back = unbundle(message)
    assert [m.type for m in back] == ["tick", "other", "tick"]
    assert [m.payload for m in back] == [m.payload for m in parts]


@pytest.mark.parametrize(
    "payload, problem",
    [
        ({"parts": 1, "type/0": "tick"}, "`parts`"),
        ({"parts": MAX_PARTS + 1}, "`parts`"),
        ({"parts": True}, "`parts`"),
        ({"parts": 2, "type/0": "tick"}, "part 1 of the bundle has no type"),
        ({"parts": 2, "type/0": "tick", "type/1": BUNDLE}, "other than a bundle"),
        ({"parts": 2, "type/0": "tick", "type/1": "tick", "2/k": 1}, "names no part"),
        ({"parts": 2, "type/0": "tick", "type/1": "tick", "01/k": 1}, "names no part"),
        ({"parts": 2, "type/0": "tick", "type/1": "tick", "\u0661/k": 1}, "names no part"),
        ({"parts": 2, "type/0": "tick", "type/1": "tick", "k": 1}, "field of no part"),
        ({"type/0": "tick", "type/1": "tick"}, "`parts`"),
    ],
)
def test_a_malformed_bundle_is_refused_by_name(payload, problem):
    with pytest.raises(ValueError, match=problem):
        unbundle(Message(BUNDLE, payload))
    client = _Client(0)
    with pytest.raises(ProtocolViolation, match="malformed bundle"):
        client.handle(Message(BUNDLE, payload))
    assert client.seen == []


def test_bundles_hold_two_to_max_parts_and_never_another_bundle():
    with pytest.raises(ValueError, match="2 to"):
        bundle([_tick(1)])
    with pytest.raises(ValueError, match="another bundle"):
        bundle([_tick(1), bundle([_tick(2), _tick(3)])])


def test_a_client_answers_each_part_as_if_it_came_alone():
    alone, bundled = _Client(0), _Client(0)
    replies = [alone.handle(_tick(k)) for k in (4, 5, 6)]
    reply = bundled.handle(bundle([_tick(4), _tick(5), _tick(6)]))
    assert bundled.seen == alone.seen == [4, 5, 6]
    got = reply_parts(reply)
    strip = lambda m: {k: v for k, v in m.payload.items() if not k.startswith("time:")}  # noqa: E731
    for a, b in zip(got, replies, strict=True):
        assert a.type == b.type and strip(a).keys() == strip(b).keys()
        assert all(np.array_equal(strip(a)[k], strip(b)[k]) for k in strip(b))
    # the parts' stage timings are added up into the bundle's own (what the ledger reads)
    assert set(reply.timings()) == {"work"} and all(not r.timings() for r in got)


def test_a_part_that_is_refused_ends_the_bundle_there():
    client = _Client(0)
    with pytest.raises(ProtocolViolation):
        client.handle(bundle([_tick(1), _tick(1000), _tick(3)]))
    assert client.seen == [1]


def test_what_the_server_carries_goes_with_its_next_send_in_one_exchange():
    server, clients = _federation()
    server.carry({0: _tick(1), 1: _tick(2)}, keep="first")
    server.carry({0: _tick(3)})
    before = server.ledger.exchanges_per_round()
    replies = server.send({0: _tick(9), 2: _tick(7)})
    assert sum(server.ledger.exchanges_per_round()) - sum(before) == 1
    assert clients[0].seen == [1, 3, 9] and clients[1].seen == [2] and clients[2].seen == [7]
    assert sorted(replies) == [0, 2] and replies[0].payload["k2"] == 18  # the send's own
    kept = server.carried_replies("first")
    assert sorted(kept) == [0, 1] and kept[0].payload["k2"] == 2 and kept[1].payload["k2"] == 4
    assert server.carried_replies("first") == {}  # once
    server.send({0: _tick(5)})
    assert clients[0].seen == [1, 3, 9, 5]  # nothing carried twice


def test_flush_sends_what_is_carried_and_a_round_ends_with_nothing_carried():
    server, clients = _federation()
    server.flush()
    assert sum(server.ledger.exchanges_per_round()) == 0  # nothing to send: no exchange
    server.carry(dict.fromkeys(range(3), _tick(1)))
    with pytest.raises(ProtocolViolation, match="messages still to send"):
        server.state_dict()
    server.flush()
    assert all(c.seen == [1] for c in clients.values())
    assert sum(server.ledger.exchanges_per_round()) == 1
    server.state_dict()


def test_a_full_queue_is_sent_before_it_outgrows_a_bundle():
    server, clients = _federation(1)
    for k in range(MAX_PARTS + 3):
        server.carry({0: _tick(k)})
    server.flush()
    assert clients[0].seen == list(range(MAX_PARTS + 3))
    assert sum(server.ledger.exchanges_per_round()) == 2


class _Lying(InProcessTransport):
    def send(self, messages):
        replies = super().send(messages)
        lie = Message("other", {})  # a reply of another type in the place of the first
        return {cid: bundled_reply([lie, *reply_parts(r)[1:]]) for cid, r in replies.items()}


def test_the_server_refuses_a_reply_that_is_not_its_bundles_replies():
    clients = {c: _Client(c) for c in range(3)}
    server = _Server(_Lying(clients))
    server.carry({0: _tick(2)})
    with pytest.raises(ProtocolViolation, match="client 0 answered a bundle"):
        server.send({0: _tick(1)})
