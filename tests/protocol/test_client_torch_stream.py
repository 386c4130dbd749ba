r"""Each client draws torch's global random numbers from its own stream
(``FederatedClient.own_torch_rng``): what one party draws does not depend on what the
others draw, nor on the process it lives in, and a checkpoint continues the stream."""

from __future__ import annotations

import numpy as np
import torch

from botorch_fed.algorithms import build_federation
from botorch_fed.protocol import FederationSetup
from botorch_fed.protocol.client import FederatedClient
from botorch_fed.protocol.declarations import Declared, declare, handles
from botorch_fed.protocol.messages import Message


@declare("draw")
class _Draw(Declared):
    pass


class _Drawing(FederatedClient):
    @handles(_Draw)
    def on_draw(self, message: _Draw) -> dict:
        return {"x": torch.rand(4).numpy()}


def _expected(seed: int, n: int) -> np.ndarray:
    return torch.rand(n, generator=torch.Generator().manual_seed(seed)).numpy()


def test_two_clients_draw_their_own_streams_whatever_else_draws():
    a, b = _Drawing(0), _Drawing(1)
    a.own_torch_rng(5)
    b.own_torch_rng(6)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        out_a, out_b = [], []
        for _ in range(3):  # interleaved with each other and with the process's draws
            out_a.append(a.handle(Message("draw")).payload["x"])
            torch.rand(7)
            out_b.append(b.handle(Message("draw")).payload["x"])
        after = torch.rand(1)
        torch.manual_seed(0)
        torch.rand(7)
        torch.rand(7)
        torch.rand(7)
        assert torch.equal(after, torch.rand(1))  # the process's stream went on untouched
    np.testing.assert_array_equal(np.concatenate(out_a), _expected(5, 12))
    np.testing.assert_array_equal(np.concatenate(out_b), _expected(6, 12))


def test_a_checkpoint_continues_the_stream():
    a = _Drawing(0)
    a.own_torch_rng(5)
    first = a.handle(Message("draw")).payload["x"]
    state = a.state_dict()
    resumed = _Drawing(0)
    resumed.own_torch_rng(99)  # as rebuilt, then loaded
    resumed.load_state_dict(state)
    second = resumed.handle(Message("draw")).payload["x"]
    np.testing.assert_array_equal(np.concatenate([first, second]), _expected(5, 8))


def test_runners_give_every_client_its_own_stream():
    setup = FederationSetup(problem="branin", num_clients=3, seed=2)
    _, clients, _ = build_federation("local", setup)
    states = [c.state_dict()["torch_rng"] for c in clients.values()]
    assert all(s is not None for s in states)
    assert not torch.equal(states[0], states[1]) and not torch.equal(states[1], states[2])
