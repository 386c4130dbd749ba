r"""Every algorithm's clients keep their evaluation budget whatever round the server names.

A client answers round ``t`` only when ``t`` is an ``int`` (not a ``bool``, not a
``float``), lies in ``1 .. num_rounds`` of its own settings and comes next (``last + 1``;
an LDP-BO user under ``users="round-robin"``: its next turn). A server that sends a round
past the budget, the same round again, an earlier one, a skip, ``t = 0``, ``True`` or
``1.5`` is refused with a ``ProtocolViolation`` before the client evaluates anything
(docs/security.md, "What an agent refuses"). The last round accepted survives a
checkpoint, and a run
resumed with a larger ``num_rounds`` goes on. Under LDP-BO a failed evaluation is a
release: with ``evaluation_errors="raise"`` it is counted -- in the user's ledger and in
its party's total -- before the error leaves the user.

The attack is mounted on the clients the runner builds, for every registered algorithm
(a new one is covered when it registers): the honest server runs rounds 1 and 2, and
each client is then sent its own last round's messages again with other rounds.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from botorch_fed.algorithms import (
    LDPBOSettings,
    available_algorithms,
    build_federation,
    get_algorithm,
)
from botorch_fed.problems.objectives import CallableObjective, EvaluationError
from botorch_fed.protocol import FederationSetup, Message, ProtocolViolation
from botorch_fed.protocol.bundle import BUNDLE
from botorch_fed.protocol.checkpoint import CheckpointError
from botorch_fed.protocol.round_budget import ROUND_STATE

pytestmark = pytest.mark.usefixtures("quiet_single_thread")

T = 2  # rounds of the honest run
M = 2  # clients
# what keeps every algorithm's round cheap (applied where its settings have the field)
SMALL = dict(
    num_init=3,
    num_restarts=1,
    raw_samples=16,
    maxiter=10,
    fit_maxiter=10,
    local_refit_every=2,
    ts_candidates=64,
    num_fantasies=4,
    num_mv_samples=4,
    points_per_dim=3,
    support_size=4,
    centers_per_client=2,
    federated_maxiter=3,
    plays_per_epoch=2,
    q=5.0,
    eta=0.05,  # FedZero: explicit steps (no Lipschitz constant declared)
    h=0.05,
)


def _settings(algorithm: str, num_rounds: int = T):
    cls = get_algorithm(algorithm).settings_class
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(num_rounds=num_rounds, **{k: v for k, v in SMALL.items() if k in names})


def _counting_objective(counter: dict, fail: bool = False) -> CallableObjective:
    r"""A black box on ``[0, 1]^2`` (``|f| <= 1``) that counts its evaluations."""

    def counting(X):
        counter["n"] += len(X)
        if fail:
            return torch.full_like(X[..., 0], torch.nan)
        return ((X - 0.3) ** 2).sum(-1)

    return CallableObjective(
        counting, bounds=[[0.0, 0.0], [1.0, 1.0]], reward_bound=1.0, noise_bound=0.0
    )


def _federation(algorithm: str, num_rounds: int = T):
    r"""The server and clients of a run as the runner builds them, and their counter."""
    counter = {"n": 0}
    setup = FederationSetup(objectives=_counting_objective(counter), num_clients=M, seed=3)
    server, clients, _ = build_federation(algorithm, setup, _settings(algorithm, num_rounds))
    return server, clients, counter


def _record(clients: dict, counter: dict) -> dict[int, list[tuple[Message, int]]]:
    r"""Record every message each client handles, with the evaluations it caused (a
    bundle's parts, each of which the client handles through ``handle`` again)."""
    log = {cid: [] for cid in clients}
    for cid, client in clients.items():

        def handle(message, cid=cid, inner=client.handle):
            before = counter["n"]
            reply = inner(message)
            if message.type != BUNDLE:
                entry = (Message(message.type, dict(message.payload)), counter["n"] - before)
                log[cid].append(entry)
            return reply

        client.handle = handle
    return log


def _honest_run(algorithm: str):
    server, clients, counter = _federation(algorithm)
    log = _record(clients, counter)
    server.run()
    rounds = {cid: [m.payload["t"] for m, _ in log[cid] if "t" in m.payload] for cid in clients}
    # the honest server named every round once, in order, and clients evaluated in them
    assert sorted({t for ts in rounds.values() for t in ts}) == list(range(1, T + 1))
    assert all(ts == sorted(ts) for ts in rounds.values())
    assert sum(n for cid in clients for _, n in log[cid]) == counter["n"] > 0
    return server, clients, counter, log


def _last_round_messages(log: list[tuple[Message, int]]) -> tuple[int, list[Message]]:
    r"""The last round a client was sent and that round's messages that name it."""
    last = max(m.payload["t"] for m, _ in log if "t" in m.payload)
    return last, [m for m, _ in log if m.payload.get("t") == last]


def _attack_rounds(last: int) -> list:
    r"""Rounds a client that answered round ``last`` of ``T`` must refuse."""
    return [last + 1, last, last - 1, last + 2, T + 1, 0, -1, True, 1.5, float(last + 1), "3"]


_MISSING = object()  # a message without `t`


def _refused(client, counter: dict, message: Message, t) -> None:
    r"""``message`` with round ``t`` is refused by ``client``, which evaluates nothing."""
    payload = {k: v for k, v in message.payload.items() if k != "t"}
    if t is not _MISSING:
        payload["t"] = t
    before = counter["n"]
    with pytest.raises(ProtocolViolation, match=f"Client {client.client_id}"):
        client.handle(Message(message.type, payload))
    assert counter["n"] == before, f"{message.type} with t={t!r} evaluated the black box"


@pytest.mark.parametrize("algorithm", available_algorithms())
def test_a_client_refuses_rounds_outside_its_budget(algorithm):
    _, clients, counter, log = _honest_run(algorithm)
    for cid, client in clients.items():
        last, messages = _last_round_messages(log[cid])
        assert messages
        for message in messages:
            for t in [*_attack_rounds(last), _MISSING]:
                _refused(client, counter, message, t)


@pytest.mark.parametrize("algorithm", available_algorithms())
def test_a_client_refuses_a_skipped_round(algorithm):
    # the server runs round 1 but names round 2 (LDP-BO: user 0's is not its turn)
    server, clients, counter = _federation(algorithm)
    server.ledger.round = 0
    server.initialize()
    after_init = counter["n"]
    for client in clients.values():
        handle = client.handle

        def shifted(message, handle=handle):
            payload = dict(message.payload)
            if "t" in payload:
                payload["t"] = payload["t"] + 1
            return handle(Message(message.type, payload))

        client.handle = shifted
    server.ledger.round = 1
    with pytest.raises(ProtocolViolation, match="round t=2"):
        server.run_round(1)
    assert counter["n"] == after_init


@pytest.mark.parametrize("algorithm", available_algorithms())
def test_the_last_round_survives_a_checkpoint(algorithm):
    server, clients, counter, log = _honest_run(algorithm)
    for cid, client in clients.items():
        state = client.state_dict()
        assert state[ROUND_STATE] == getattr(client, "accepted_round", 0)
        last, messages = _last_round_messages(log[cid])
        _, fresh, fresh_counter = _federation(algorithm)
        restored = fresh[cid]
        restored.load_state_dict(state)
        assert getattr(restored, "accepted_round", 0) == getattr(client, "accepted_round", 0)
        for message in messages:
            for t in (last, last + 1, T + 1):
                _refused(restored, fresh_counter, message, t)
    # resumed with a larger num_rounds, the run goes on
    states = {cid: c.state_dict() for cid, c in clients.items()}
    longer, resumed, resumed_counter = _federation(algorithm, num_rounds=T + 1)
    longer.load_state_dict(server.state_dict())
    for cid, c in resumed.items():
        c.load_state_dict(states[cid])
    longer.run(start_round=T)
    assert resumed_counter["n"] > 0
    assert any(h["round"] == T + 1 for c in resumed.values() for h in c.history)


def test_a_round_must_be_a_plain_integer():
    _, clients, counter = _federation("local")
    client = clients[0]
    client.handle(Message("init", {}))
    for t in (np.float64(1.0), np.bool_(True), "1", np.array([1]), 2**62):
        _refused(client, counter, Message("round", {}), t)
    assert client.accepted_round == 0
    client.handle(Message("round", {"t": np.int64(1)}))  # numpy integers are integers
    assert client.accepted_round == 1 and client.round == 1
    with pytest.raises(ProtocolViolation, match=r"rounds 1\.\.2 \(`num_rounds`=2"):
        client.handle(Message("round", {"t": 3}))


@pytest.mark.parametrize("t", [0, T + 1, 1.0, True])
def test_accept_round_keeps_the_budget_whatever_domain_a_message_declared(t):
    r"""An algorithm whose message declares ``t`` loosely (not :class:`RoundNumber`) still
    gets the budget: :meth:`accept_round` itself refuses a round that is not an integer
    in ``1..num_rounds``, before anything is evaluated."""
    _, clients, counter = _federation("local")
    client = clients[0]
    client.handle(Message("init", {}))
    before = counter["n"]
    with pytest.raises(ProtocolViolation, match="round `t`"):
        client.accept_round(t, "round")
    assert client.accepted_round == 0 and counter["n"] == before


def test_a_second_init_is_refused_after_a_failed_first_one():
    # evaluation_errors="raise": the initial design stops at its first point; a second
    # `init` would evaluate the design again (and again)
    counter = {"n": 0}
    setup = FederationSetup(
        objectives=_counting_objective(counter, fail=True),
        num_clients=1,
        seed=3,
        evaluation_errors="raise",
    )
    _, clients, _ = build_federation("local", setup, _settings("local"))
    with pytest.raises(EvaluationError):
        clients[0].handle(Message("init", {}))
    assert counter["n"] == 1
    with pytest.raises(ProtocolViolation, match="a second `init`"):
        clients[0].handle(Message("init", {}))
    assert counter["n"] == 1


def test_a_checkpoint_with_a_bad_last_round_is_refused():
    _, clients, _ = _federation("random")
    state = clients[0].state_dict()
    for bad in (-1, True, 1.0, "1"):
        with pytest.raises(CheckpointError, match=ROUND_STATE):
            clients[1].load_state_dict({**state, ROUND_STATE: bad})
    with pytest.raises(CheckpointError, match=ROUND_STATE):  # a state without it
        clients[1].load_state_dict({k: v for k, v in state.items() if k != ROUND_STATE})


def test_ldp_users_answer_on_their_turn_only():
    # round-robin, 2 users, 4 rounds: user 1 answers rounds 2 and 4, nothing else
    _, clients, counter = _federation("ldp-tgp", num_rounds=4)
    user = clients[1]
    query = {"x": np.array([0.5, 0.5])}
    for t in (1, 3):
        _refused(user, counter, Message("query", query), t)
    user.handle(Message("query", {**query, "t": 2}))
    for t in (2, 3, 5):
        _refused(user, counter, Message("query", query), t)
    user.handle(Message("query", {**query, "t": 4}))
    assert counter["n"] == 2 and user.privacy_ledger.releases(1) == 2
    # under users="random" any later round is a user's
    counter = {"n": 0}
    setup = FederationSetup(objectives=_counting_objective(counter), num_clients=M, seed=3)
    settings = dataclasses.replace(_settings("ldp-tgp", num_rounds=4), users="random")
    _, clients, _ = build_federation("ldp-tgp", setup, settings)
    clients[1].handle(Message("query", {**query, "t": 3}))
    _refused(clients[1], counter, Message("query", query), 2)
    clients[1].handle(Message("query", {**query, "t": 4}))
    assert counter["n"] == 2


_LDP_SMALL = dict(num_restarts=1, raw_samples=16, maxiter=10)


def _failing_ldp_user(epsilon: float = 0.5, budget: float | None = 1.0):
    counter = {"n": 0}
    setup = FederationSetup(
        objectives=_counting_objective(counter, fail=True),
        num_clients=M,
        seed=3,
        evaluation_errors="raise",
    )
    settings = LDPBOSettings(num_rounds=4, epsilon=epsilon, user_budget=budget, **_LDP_SMALL)
    _, clients, _ = build_federation("ldp-tgp", setup, settings)
    return clients[0], counter


def test_a_failed_ldp_evaluation_is_charged_before_the_error_is_raised():
    user, counter = _failing_ldp_user()
    query = {"x": np.array([0.5, 0.5])}
    with pytest.raises(EvaluationError, match="Client 0, round 1"):
        user.handle(Message("query", {**query, "t": 1}))
    assert counter["n"] == 1
    assert user.privacy_ledger.spent(0)[0] == pytest.approx(0.5)
    assert user.privacy_ledger.releases(0) == 1
    with pytest.raises(EvaluationError):
        user.handle(Message("query", {**query, "t": 3}))
    assert user.privacy_ledger.spent(0)[0] == pytest.approx(1.0)
    # the budget (1 = 2 x 0.5) is spent: no third failure bit
    with pytest.raises(ProtocolViolation, match="budget"):
        user.handle(Message("query", {**query, "t": 4}))
    assert counter["n"] == 2


def test_a_failed_ldp_evaluation_counts_against_the_partys_total():
    # the party's agent adds what a message released to its total, answered or not
    pytest.importorskip("flwr")
    from botorch_fed.flower.agent import PartyAgent
    from botorch_fed.flower.policy import PartyPolicy, PolicyError

    user, counter = _failing_ldp_user(budget=None)
    agent = PartyAgent(0, M, policy=PartyPolicy(max_total_epsilon=1.0))
    agent._build = lambda config, *_: user  # the run's client: this user, whose box fails
    query = {"x": np.array([0.5, 0.5])}
    for t in (1, 3):
        with pytest.raises(Exception, match="EvaluationError|evaluating") as info:
            agent.answer({"run": 1, "type": "query", "config": {}}, {**query, "t": t})
        assert not isinstance(info.value, ProtocolViolation | PolicyError)
    assert agent.epsilon_spent == pytest.approx(1.0)
    with pytest.raises(PolicyError, match="--max-total-epsilon"):  # the party's cap holds
        agent.answer({"run": 1, "type": "query", "config": {}}, {**query, "t": 4})
    assert counter["n"] == 2


@pytest.mark.parametrize(
    "algorithm, type_, field, values",
    [
        (
            "central",
            "evaluate",
            "x",
            [np.array([0.5, 1.5]), np.array([0.5, np.nan]), np.array([0.5]), "0.5"],
        ),
        ("fts", "round", "omega", [np.zeros(3), np.full(100, np.inf), "0.5"]),
    ],
)
def test_the_servers_values_of_a_round_are_checked(algorithm, type_, field, values):
    # central: the assigned point lies in the unit cube; FTS: a weight sample has one
    # finite value per shared feature -- refused before the round is spent
    _, clients, counter = _federation(algorithm)
    client = clients[0]
    client.handle(Message("init", {}))
    before = counter["n"]
    honest = {"x": np.array([0.5, 0.5])} if algorithm == "central" else {}
    for value in values:
        with pytest.raises(ProtocolViolation, match=f"`{field}`"):
            client.handle(Message(type_, {**honest, field: value, "t": 1}))
    assert counter["n"] == before and client.accepted_round == 0
    client.handle(Message(type_, {**honest, "t": 1}))
    assert counter["n"] == before + 1 and client.accepted_round == 1
