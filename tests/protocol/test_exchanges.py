r"""Exchanges per round: every send of the server's (one message to each addressed client
and their replies) is counted in its round, in process and on Flower alike (the Flower
tests compare whole results, this field included), and survives a checkpoint."""

from __future__ import annotations

from collections import Counter

import pytest

from botorch_fed.flower.run_options import prepare
from botorch_fed.protocol.ledger import Ledger
from botorch_fed.protocol.runner import run_federated
from tests.helpers.flower_runs import short_argv


def _run_counting_replies(argv):
    r"""The run, and each client's replies per round (from the transport's hook, which
    sees every reply but not how they were grouped into sends)."""
    run = prepare(argv)
    replies: Counter = Counter()
    holder: dict = {}

    def on_receive(cid, reply):
        replies[(holder["ledger"].round, cid)] += 1

    import botorch_fed.protocol.transport as transport

    original = transport.InProcessTransport.__init__

    def remember(self, *args, **kwargs):
        original(self, *args, **kwargs)
        holder["ledger"] = self.ledger

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(transport.InProcessTransport, "__init__", remember)
        result = run_federated(run.algorithm, run.setup, run.settings, on_receive=on_receive)
    return result, replies


@pytest.mark.parametrize(
    "argv",
    [
        short_argv("local", rounds=2),
        short_argv("fbo-fedgp", rounds=2),
        short_argv("fbo-fedgp", aggregator="masking", rounds=1),
        short_argv("co-kg", rounds=1),
    ],
    ids=["local", "fbo-fedgp", "fbo-fedgp-masking", "co-kg"],
)
def test_exchanges_per_round_bound_the_replies_each_round(argv):
    result, replies = _run_counting_replies(argv)
    rounds = len(result.best_per_round)
    counts = result.exchanges_per_round
    assert len(counts) == rounds and all(isinstance(n, int) for n in counts)
    clients = {cid for _, cid in replies}
    for r in range(rounds):
        per_client = [replies[(r, cid)] for cid in clients]
        # each exchange brings at most one reply per client, and at least one reply
        assert max(per_client) <= counts[r] <= sum(per_client), (r, counts, per_client)
    assert sum(replies.values()) == result.ledger["messages"]
    assert sum(counts) == result.ledger["exchanges"]
    if argv[0] == "local":  # one evaluation request a round, to every client
        assert counts == [1] * rounds


def test_a_resumed_run_counts_its_exchanges_as_the_uninterrupted_one(tmp_path):
    run = prepare(short_argv("fbo-fedgp", rounds=2))
    whole = run_federated(run.algorithm, run.setup, run.settings)
    short = prepare(short_argv("fbo-fedgp", rounds=1))
    run_federated(short.algorithm, short.setup, short.settings, checkpoint=tmp_path / "ck")
    resumed = run_federated(run.algorithm, run.setup, run.settings, resume=tmp_path / "ck")
    assert resumed.exchanges_per_round == whole.exchanges_per_round


def test_the_ledger_keeps_exchanges_per_round_through_its_state():
    ledger = Ledger()
    ledger.add_exchange()
    ledger.round = 2
    ledger.add_exchange()
    ledger.add_exchange()
    assert ledger.exchanges_per_round() == [1, 0, 2]
    assert ledger.exchanges_per_round(4) == [1, 0, 2, 0]
    again = Ledger()
    again.load_state_dict(ledger.state_dict())
    assert again.exchanges_per_round() == [1, 0, 2] and again.to_dict()["exchanges"] == 3
    state = ledger.state_dict()
    del state["exchanges"]  # a ledger of before exchanges were counted
    with pytest.raises(ValueError, match="Ledger state has keys .* expected .*'exchanges'"):
        Ledger().load_state_dict(state)
