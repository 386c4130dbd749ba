r"""Code review of the Flower deployment and the clients' own torch streams (issue 15).

Every test but the controls (``test_control_*``) is a defect found in review: each
failed when it was written and passes since its fix. The controls show that a test's
premise holds (so it fails for the reason it names, not for a broken set-up).
"""

from __future__ import annotations

import json
import os
import struct

import numpy as np
import pytest
import torch

pytest.importorskip("flwr")

from flwr.app import Message as FlowerMessage  # noqa: E402
from flwr.app import RecordDict  # noqa: E402

from botorch_fed.federation.checkpoint import CheckpointError  # noqa: E402
from botorch_fed.federation.messages import Message  # noqa: E402
from botorch_fed.federation.roles import FederatedClient  # noqa: E402
from botorch_fed.flower.party import PartyAgent  # noqa: E402
from botorch_fed.flower.policy import PartyPolicy  # noqa: E402
from botorch_fed.flower.records import decode_frame  # noqa: E402
from botorch_fed.flower.transport import (  # noqa: E402
    ClientFailed,
    ClientUnavailable,
    FlowerTransport,
)
from botorch_fed.secure import available_backends  # noqa: E402
from tests.helpers.flower_runs import short_argv  # noqa: E402

pytestmark = pytest.mark.usefixtures("quiet_single_thread")


# --- the clients' own torch streams (roles.py) ----------------------------------------
class _Drawing(FederatedClient):
    r"""A client whose handlers draw from torch's global generator; ``outer`` answers
    a message of its own through :meth:`handle` in the middle (a nested call)."""

    def on_one(self, payload: dict) -> dict:
        return {"x": torch.rand(3).numpy()}

    def on_outer(self, payload: dict) -> dict:
        a = torch.rand(1).item()
        b = float(self.handle(Message("inner")).payload["x"])
        c = torch.rand(1).item()
        return {"draws": np.array([a, b, c])}

    def on_inner(self, payload: dict) -> dict:
        return {"x": torch.rand(1).item()}


def _stream(seed: int, n: int) -> np.ndarray:
    g = torch.Generator().manual_seed(seed)
    return np.array([torch.rand(1, generator=g).item() for _ in range(n)])


def test_control_a_client_draws_from_its_own_stream():
    # the premise of the nested-call test: one handle() continues the client's stream,
    # whatever the process's global generator is doing
    client = _Drawing(0)
    client.own_torch_rng(11)
    torch.manual_seed(999)
    first = client.handle(Message("one")).payload["x"]
    torch.rand(5)
    second = client.handle(Message("one")).payload["x"]
    g = torch.Generator().manual_seed(11)
    expected = torch.rand(6, generator=g).numpy()
    np.testing.assert_array_equal(np.concatenate([first, second]), expected)


def test_a_nested_handle_does_not_repeat_the_outer_draws():
    client = _Drawing(0)
    client.own_torch_rng(11)
    draws = client.handle(Message("outer")).payload["draws"]
    assert draws[1] != draws[0], "the inner handler drew the outer handler's number again"
    np.testing.assert_array_equal(draws, _stream(11, 3))


def test_a_torch_rng_of_the_wrong_size_is_refused_at_load():
    client = _Drawing(0)
    client.own_torch_rng(11)
    state = client.state_dict()
    state["torch_rng"] = torch.zeros(10, dtype=torch.uint8)
    with pytest.raises(CheckpointError, match="Client 0.*torch_rng"):
        client.load_state_dict(state)


def test_control_a_checkpoint_without_torch_rng_keeps_the_seeded_stream():
    # an old checkpoint (before the key existed) loads; the stream stays as seeded
    client = _Drawing(0)
    client.own_torch_rng(11)
    state = client.state_dict()
    del state["torch_rng"]
    client.load_state_dict(state)
    np.testing.assert_array_equal(client.handle(Message("one")).payload["x"], _stream(11, 3))


def test_building_a_partys_client_leaves_the_process_rng_alone():
    agent = PartyAgent(0, 3, policy=PartyPolicy(allow_crypto_seed=True))
    config = {"argv": json.dumps(short_argv("random")), "keyset": ""}
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(12345)
        before = torch.get_rng_state()
        meta, _ = agent.answer({"run": 1, "type": "init", "config": config}, {})
        assert meta["ok"]
        assert torch.equal(torch.get_rng_state(), before)


# --- FlowerTransport ------------------------------------------------------------------
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


# --- records.decode_frame -------------------------------------------------------------
def _body(header: bytes) -> bytes:
    return struct.pack("<Q", len(header)) + header


@pytest.mark.parametrize(
    "header",
    [
        json.dumps({"meta": {}, "entries": [["k", "a", "<f8", [2**70]]]}).encode(),
        b"[" * 100_000 + b"]" * 100_000,
    ],
    ids=["shape-beyond-int64", "deeply-nested-header"],
)
def test_a_malformed_frame_raises_value_error(header):
    with pytest.raises(ValueError, match="malformed frame"):
        decode_frame(_body(header))


# --- a party whose agent is gone --------------------------------------------------------
@pytest.mark.skipif("masking" not in available_backends(), reason="masking")
def test_a_party_whose_agent_died_drops_out_under_masking(tmp_path, monkeypatch):
    import tests.flower.test_same_as_in_process as same
    from tests.helpers.fake_grid import FakeGrid

    class AgentDies(FakeGrid):
        def push_messages(self, messages):
            messages = list(messages)
            for msg in messages:  # client 3 (node 1021): its agent dies after init
                node = msg.metadata.dst_node_id
                if node == 1021 and self.answered.get(node, 0) >= 2:
                    self.sockets[node] = os.path.join(os.path.dirname(self.sockets[node]), "gone")
            return super().push_messages(messages)

    monkeypatch.setattr(same, "FakeGrid", AgentDies)
    argv = short_argv("fbo-fedgp", "masking", rounds=1, clients=4)
    result, _ = same.flower_run(argv, tmp_path, on_dropout="continue")
    assert {e["client"] for e in result.evaluations} == {0, 1, 2}


# --- the parties' reports (server_app.py) ----------------------------------------------
def test_a_malformed_report_is_named(tmp_path, monkeypatch):
    import botorch_fed.flower.party as party
    import botorch_fed.flower.server_app as server_app
    from tests.flower import test_same_as_in_process
    from tests.flower.test_same_as_in_process import flower_run

    honest = party._report

    def report(client):
        out = honest(client)
        if client.client_id == 1:
            out["history"] = json.dumps([{"x": [0.5, 0.5], "value": 1.0, "step": "init"}])
        return out

    monkeypatch.setattr(party, "_report", report)
    # the run is scored without that report, and the log names the client
    lines = []
    monkeypatch.setattr(
        test_same_as_in_process, "run_on_flower", _with_log(server_app.run_on_flower, lines)
    )
    result, _ = flower_run(short_argv("random"), tmp_path)
    assert {e["client"] for e in result.evaluations} == {0, 2}
    assert any(line.startswith("client 1: its report is left out") for line in lines), lines


def _with_log(run, lines):
    def logged(grid, config, log=None):
        return run(grid, config, log=lines.append)

    return logged
