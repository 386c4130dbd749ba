r"""A party's client draws torch's global random numbers from its own stream
(``FederatedClient.own_torch_rng``) in a party agent's process too: a nested
:meth:`handle` continues the stream instead of starting it again, a checkpoint's
``torch_rng`` of the wrong size is refused, and building a party's client leaves the
process's generator alone. The controls (``test_control_*``) show the premise of the
test after them holds (so it fails for the reason it names, not for a broken set-up).
The stream itself: tests/protocol/test_client_torch_stream.py."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

pytest.importorskip("flwr")

from botorch_fed.flower.agent import PartyAgent  # noqa: E402
from botorch_fed.flower.policy import PartyPolicy  # noqa: E402
from botorch_fed.protocol.checkpoint import CheckpointError  # noqa: E402
from botorch_fed.protocol.client import FederatedClient  # noqa: E402
from botorch_fed.protocol.declarations import Declared, declare, handles  # noqa: E402
from botorch_fed.protocol.messages import Message  # noqa: E402
from tests.helpers.flower_runs import short_argv  # noqa: E402

pytestmark = pytest.mark.usefixtures("quiet_single_thread")


@declare("one")
class _One(Declared):
    pass


@declare("outer")
class _Outer(Declared):
    pass


@declare("inner")
class _Inner(Declared):
    pass


class _Drawing(FederatedClient):
    r"""A client whose handlers draw from torch's global generator; ``outer`` answers
    a message of its own through :meth:`handle` in the middle (a nested call)."""

    @handles(_One)
    def on_one(self, message: _One) -> dict:
        return {"x": torch.rand(3).numpy()}

    @handles(_Outer)
    def on_outer(self, message: _Outer) -> dict:
        a = torch.rand(1).item()
        b = float(self.handle(Message("inner")).payload["x"])
        c = torch.rand(1).item()
        return {"draws": np.array([a, b, c])}

    @handles(_Inner)
    def on_inner(self, message: _Inner) -> dict:
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


def test_building_a_partys_client_leaves_the_process_rng_alone():
    agent = PartyAgent(0, 3, policy=PartyPolicy(allow_crypto_seed=True))
    config = {"argv": json.dumps(short_argv("random")), "keyset": ""}
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(12345)
        before = torch.get_rng_state()
        meta, _ = agent.answer({"run": 1, "type": "init", "config": config}, {})
        assert meta["ok"]
        assert torch.equal(torch.get_rng_state(), before)
