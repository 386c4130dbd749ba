r""":class:`FlowerTransport` accounts for every message it pushes: a client whose message
the grid did not push (Flower's ``HttpGrid`` returns ``None`` for it, or ``[]`` for a
batch the SuperLink refuses as too large) is named or dropped, never waited for in
silence. The grid here answers every pushed message at once (tests/flower/
test_same_as_in_process.py runs the transport over the in-memory Flower grid). The
control (``test_control_*``) shows the premise: every pushed message is answered."""

from __future__ import annotations

import pytest

pytest.importorskip("flwr")

from flwr.app import Message as FlowerMessage  # noqa: E402
from flwr.app import RecordDict  # noqa: E402

from botorch_fed.flower.transport import (  # noqa: E402
    ClientFailed,
    ClientUnavailable,
    FlowerTransport,
)
from botorch_fed.protocol.messages import Message  # noqa: E402

pytestmark = pytest.mark.usefixtures("quiet_single_thread")


class _EchoGrid:
    r"""A ``Grid`` whose nodes answer at once with an empty reply; ``push_ids`` decides
    what ``push_messages`` returns for the messages pushed (Flower's ``HttpGrid``
    returns ``None`` for a message it could not push and ``[]`` when the SuperLink
    refuses the batch as too large)."""

    def __init__(self, push_ids) -> None:
        from flwr.supercore.task_identity import TaskIdentity

        TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 7, 0, 1
        self.push_ids = push_ids
        self._replies: dict[str, FlowerMessage] = {}

    def push_messages(self, messages):
        messages = list(messages)
        ids = self.push_ids(len(messages))
        for mid, msg in zip(ids, messages, strict=False):
            if mid is not None:
                msg.metadata.__dict__["_message_id"] = mid
                self._replies[mid] = FlowerMessage(RecordDict(), reply_to=msg)
        return ids

    def pull_messages(self, message_ids):
        return [self._replies.pop(m) for m in list(message_ids) if m in self._replies]


def _send_to_three(grid, **kwargs):
    transport = FlowerTransport(grid, {0: 10, 1: 11, 2: 12}, timeout=0.2, poll=0.01, **kwargs)
    replies = transport.exchange({cid: Message("ping") for cid in range(3)})
    return transport, replies


def test_control_every_pushed_message_is_answered():
    transport, replies = _send_to_three(_EchoGrid(lambda n: [f"m{i}" for i in range(n)]))
    assert sorted(replies) == [0, 1, 2] and not transport.dropped


def test_a_refused_push_names_the_clients():
    with pytest.raises((ClientFailed, ClientUnavailable), match="client 0"):
        _send_to_three(_EchoGrid(lambda n: []))


def test_every_client_whose_message_was_not_pushed_is_accounted_for():
    transport, replies = _send_to_three(
        _EchoGrid(lambda n: [None, None] + [f"m{i}" for i in range(2, n)]),
        on_dropout="continue",
    )
    assert 2 in replies
    for cid in (0, 1):
        assert cid in transport.dropped, f"client {cid} got no reply and is not dropped"
