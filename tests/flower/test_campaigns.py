r"""Campaigns on the Flower app: runs that survive restarts, and ask/tell parties.

Over the in-memory grid (tests/helpers/fake_grid.py; the real ServerApp program,
``ClientApp``, agents on Unix sockets, records and transport): a campaign whose ServerApp
dies mid-round is resumed from its checkpoint and ends exactly as the in-process run; so
does one whose party agent is replaced by a fresh process of the same state; ask/tell
parties, whose operator reports every measurement through :class:`Party`, end exactly as
the in-process run of the same objective. A party answers a position once: a different
message there, a skipped position and a resume with other options are refused."""

from __future__ import annotations

import json
import threading
import time

import pytest
import torch

pytest.importorskip("flwr")

from botorch_fed.flower import server_app  # noqa: E402
from botorch_fed.flower.agent import REPORT, PartyAgent  # noqa: E402
from botorch_fed.flower.party import serve  # noqa: E402
from botorch_fed.flower.party_errors import is_public_refusal  # noqa: E402
from botorch_fed.flower.run_options import MAX_HOLD, prepare  # noqa: E402
from botorch_fed.flower.server_app import run_on_flower  # noqa: E402
from botorch_fed.problems.ask_tell import Party  # noqa: E402
from botorch_fed.protocol.checkpoint import CheckpointError  # noqa: E402
from botorch_fed.protocol.runner import run_federated  # noqa: E402
from botorch_fed.secure import available_backends  # noqa: E402
from tests.helpers.fake_grid import EXPERIMENT, FakeGrid  # noqa: E402
from tests.helpers.flower_runs import comparable, short_argv  # noqa: E402

pytestmark = pytest.mark.usefixtures("quiet_single_thread")


class Crash(RuntimeError):
    r"""The ServerApp process dies."""


class Federation:
    r"""A :class:`FakeGrid` whose parties' agents keep state files (and, for
    ``ask_tell`` parties, ask their operator), and can be replaced by fresh agents of the
    same state (a restarted process)."""

    def __init__(self, tmp_path, argv, ask_tell=(), crypto=True) -> None:
        from botorch_fed.algorithms import get_algorithm
        from botorch_fed.flower.keys import write_keyset
        from botorch_fed.protocol.runner import build_context

        run = prepare(argv)
        spec = get_algorithm(run.algorithm)
        self.ids = build_context(spec, run.setup, run.settings).client_ids
        self.tmp, self.ask_tell, self.keyset = tmp_path, set(ask_tell), ""
        if spec.secure_aggregation:
            self.keyset, _ = write_keyset(run.setup, self.ids, tmp_path / "keys")
        self.grid = FakeGrid(len(self.ids), str(tmp_path), key_dir=tmp_path / "keys")
        self.nodes = sorted(self.grid.sockets)
        self.starts = 0
        for i in range(len(self.ids)):
            self.restart_agent(i)
        self.argv = argv

    def restart_agent(self, i: int) -> PartyAgent:
        r"""A fresh agent for party ``i`` (its state file and ask folder as before)."""
        self.starts += 1
        path = str(self.tmp / f"a{i}-{self.starts}.sock")
        agent = PartyAgent(
            i,
            len(self.ids),
            self.tmp / "keys",
            policy=EXPERIMENT,
            state_file=self.tmp / f"party-{i}.json",
            ask_tell=self.tmp / f"ask-{i}" if i in self.ask_tell else None,
        )
        ready = threading.Event()
        threading.Thread(target=serve, args=(agent, path, ready.set), daemon=True).start()
        ready.wait(10)
        self.grid.sockets[self.nodes[i]] = path
        return agent

    def config(self, **extra) -> dict:
        return {
            "argv": json.dumps(self.argv),
            "out": "out.json",
            "clients": len(self.ids),
            "timeout": 30.0,
            "on-dropout": "fail",
            "server-key": self.keyset,
            "keyset": self.keyset,
            "campaign": "c1",
            **extra,
        }

    def run(self, **extra):
        self.grid.run_config = self.config(**extra)
        return run_on_flower(self.grid, self.grid.run_config, log=lambda s: None, folder=self.tmp)


def _crash_after(grid: FakeGrid, pushes: int) -> None:
    r"""The ServerApp dies when it pulls after its ``pushes``-th push (the parties have
    answered: a resumed server asks them again)."""
    count = {"pushes": 0}
    push, pull = grid.push_messages, grid.pull_messages

    def counting_push(messages):
        count["pushes"] += 1
        return push(messages)

    def crashing_pull(ids):
        if count["pushes"] >= pushes:
            grid.push_messages, grid.pull_messages = push, pull
            raise Crash(f"the ServerApp died after push {pushes}")
        return pull(ids)

    grid.push_messages, grid.pull_messages = counting_push, crashing_pull


def _cases():
    yield pytest.param(short_argv("local", rounds=3), 5, id="local")
    # before the server's first round ended (the initial design), and once the parties
    # sent their final reports (they answer the report again)
    yield pytest.param(short_argv("local", rounds=3), 2, id="local-initial-design")
    yield pytest.param(short_argv("local", rounds=3), 6, id="local-final-report")
    argv = short_argv("fbo-fedgp", "plaintext", rounds=2) + ["--hyperparameters", "average"]
    yield pytest.param(argv, 9, id="fbo-fedgp-plaintext")
    marks = [] if "ckks" in available_backends() else [pytest.mark.skip(reason="ckks")]
    argv = short_argv("fbo-fedgp", "ckks", rounds=2) + ["--hyperparameters", "average"]
    yield pytest.param(argv, 13, id="fbo-fedgp-ckks", marks=marks)


@pytest.mark.parametrize("argv, crash", list(_cases()))
def test_a_campaign_resumed_after_its_serverapp_died_ends_as_the_uninterrupted_run(
    argv, crash, tmp_path
):
    fed = Federation(tmp_path, argv)
    _crash_after(fed.grid, crash)  # mid-round: the parties answered messages of it
    with pytest.raises(Crash):
        fed.run()
    with pytest.raises(CheckpointError, match="exists on the server: resume it"):
        fed.run()  # a campaign begins once
    resumed = fed.run(resume=True)
    run = prepare(argv)
    assert comparable(resumed) == comparable(run_federated(run.algorithm, run.setup, run.settings))
    with pytest.raises(CheckpointError, match="finished: nothing to resume"):
        fed.run(resume=True)  # the parties reported: the campaign is over


def _restart_cases():
    for aggregator in ("plaintext", "masking", "ckks"):
        marks = [] if aggregator in available_backends() else [pytest.mark.skip(reason=aggregator)]
        # (round, k): before the k-th message of the round; in round 2, behind the first
        # round's secure sums (the role's randomness has moved on since the campaign began)
        # (an FBO-FedGP round is 3 to 6 exchanges: the round with its moments, the
        # secure sums' closing steps each with the next opening, the global step)
        for where in ((1, 3),) if aggregator == "plaintext" else ((1, 0), (2, 1)):
            yield pytest.param(
                aggregator, where, id=f"{aggregator}-{where[0]}.{where[1]}", marks=marks
            )


@pytest.mark.parametrize("aggregator, where", list(_restart_cases()))
def test_a_campaign_goes_on_after_a_party_agent_restarts_mid_round(aggregator, where, tmp_path):
    # with the parties' own randomness (no --crypto-seed): the restarted agent seeds its
    # secure-aggregation role from its journal and handles the round again to the answers
    # it gave; with --crypto-seed the run also ends as the in-process run
    for crypto in (True, False):
        argv = short_argv("fbo-fedgp", aggregator, rounds=2) + ["--hyperparameters", "average"]
        if not crypto:
            argv = [a for a in argv if a not in ("--crypto-seed", "5")]
        folder = tmp_path / str(crypto)
        folder.mkdir()
        fed = Federation(folder, argv)
        pushed = fed.grid.push_messages
        seen: list[str] = []

        def restarting_push(messages, fed=fed, pushed=pushed, seen=seen):
            groups = {m.metadata.group_id for m in messages}
            new = [g for g in sorted(groups) if ":" in g and g not in seen]
            seen.extend(new)
            in_round = [g for g in seen if g.startswith(f"{where[0]}:")]
            if new and len(in_round) == where[1] + 1:  # party 1's agent restarts now
                fed.restart_agent(1)
            return pushed(messages)

        fed.grid.push_messages = restarting_push
        result = fed.run()  # a stale party would stop it (StaleCampaign)
        assert fed.starts == 3 + 1  # it did restart
        if crypto:
            run = prepare(argv)
            local = run_federated(run.algorithm, run.setup, run.settings)
            assert comparable(result) == comparable(local)


def _operator(folder, objective, stop: threading.Event, seen: list) -> None:
    r"""Party's operator: reports the objective's value at each pending point."""
    party = Party(folder)
    while not stop.is_set():
        for ask in party.pending() if folder.exists() else []:
            x = torch.tensor([ask["x"]], dtype=torch.float64)
            value = float(objective.function.evaluate_true(x).item())
            party.report(ask["id"], value)
            seen.append(ask["id"])
        time.sleep(0.05)


def test_ask_tell_parties_end_as_the_in_process_run_of_their_objectives(tmp_path):
    argv = short_argv("local", rounds=2)
    fed = Federation(tmp_path, argv, ask_tell=(0, 2))
    run = prepare(argv)
    objectives = run.setup.make_objectives()
    stop, seen = threading.Event(), {0: [], 2: []}
    operators = [
        threading.Thread(
            target=_operator, args=(tmp_path / f"ask-{i}", objectives[i], stop, seen[i])
        )
        for i in (0, 2)
    ]
    for t in operators:
        t.start()
    try:
        # the agents hold a message 0.2 s, then answer "pending": the server asks again
        result = fed.run(hold=0.2)
    finally:
        stop.set()
        for t in operators:
            t.join()
    local = run_federated(run.algorithm, run.setup, run.settings)
    assert comparable(result) == comparable(local)
    evaluations = 3 + 2  # --num-init 3, one point a round
    assert [len(seen[i]) for i in (0, 2)] == [evaluations, evaluations]  # none asked twice
    assert len(set(seen[0])) == evaluations
    # each point shows its operator the run and the round it was asked in
    history = Party(tmp_path / "ask-0").history()
    rounds = [ask["context"]["round"] for ask in sorted(history, key=lambda a: a["sequence"])]
    assert rounds == [0, 0, 0, 1, 2]  # the initial design, then one point a round
    assert {ask["context"]["run"] for ask in history} == {"campaign 'c1'"}


def _campaign_agent(tmp_path, **kwargs) -> PartyAgent:
    return PartyAgent(0, 3, policy=EXPERIMENT, state_file=tmp_path / "party-0.json", **kwargs)


def _message(
    agent: PartyAgent, seq: int, round_: int, type_: str, payload=None, num_init=3, **config
):
    argv = short_argv("local", rounds=3)
    argv[argv.index("--num-init") + 1] = str(num_init)
    run_config = {"argv": json.dumps(argv), "keyset": "", "campaign": "c1", **config}
    meta = {"run": 7, "type": type_, "config": run_config, "seq": seq, "round": round_}
    return agent.answer(meta, payload or {})


def test_a_position_is_answered_once_and_only_for_the_same_message(tmp_path):
    from botorch_fed.protocol.declarations import ProtocolViolation

    agent = _campaign_agent(tmp_path)
    first = _message(agent, 0, 0, "init")
    assert _message(agent, 0, 0, "init") == first  # the same message: the same answer
    one = _message(agent, 1, 1, "round", {"t": 1})
    with pytest.raises(ProtocolViolation, match="message #1 differs"):
        _message(agent, 1, 1, "round", {"t": 2})  # another question at an answered position
    with pytest.raises(ProtocolViolation, match="next message of this run is #2"):
        _message(agent, 3, 3, "round", {"t": 3})  # a skipped position
    # a restarted agent answers the journalled positions again, byte for byte, and goes on
    again = _campaign_agent(tmp_path)
    assert _message(again, 1, 1, "round", {"t": 1}) == one
    with pytest.raises(ProtocolViolation, match="message #1 differs"):
        _message(again, 1, 1, "round", {"t": 2})
    assert _message(again, 2, 2, "round", {"t": 2})[0] == {"ok": True}


def test_a_campaign_resumes_only_with_its_options(tmp_path):
    agent = _campaign_agent(tmp_path)
    _message(agent, 0, 0, "init")
    restarted = _campaign_agent(tmp_path)
    other = json.dumps(short_argv("local", rounds=4))
    with pytest.raises(ValueError, match="began on this party with other options"):
        _message(restarted, 1, 1, "round", {"t": 1}, argv=other)


def test_a_campaign_needs_a_state_file_and_a_plain_name(tmp_path):
    from botorch_fed.flower.policy import PolicyError

    with pytest.raises(PolicyError, match="keeps no state"):
        _message(PartyAgent(0, 3, policy=EXPERIMENT), 0, 0, "init")
    with pytest.raises(ValueError, match="`campaign` must be a plain name"):
        _message(_campaign_agent(tmp_path), 0, 0, "init", campaign="../x")


def test_a_waiting_answer_is_pending_then_given_once_ready(tmp_path):
    # an ask/tell party: its agent holds the message `hold` s, then answers "pending"; asked
    # again, it waits on the same computation (the point is asked once) until the report
    agent = _campaign_agent(tmp_path, ask_tell=tmp_path / "ask")
    assert _message(agent, 0, 0, "init", hold=0.2) == ({"ok": True, "pending": True}, {})
    party = Party(tmp_path / "ask")
    (ask,) = party.pending()
    assert _message(agent, 0, 0, "init", hold=0.2)[0] == {"ok": True, "pending": True}
    assert [a["id"] for a in party.pending()] == [ask["id"]]  # not asked twice
    for k in range(3):  # the initial design: three points, one at a time
        (ask,) = party.pending()
        party.report(ask["id"], float(k))
        out = _message(agent, 0, 0, "init", hold=5.0)
    assert out[0] == {"ok": True}
    assert len(party.history()) == 3
    assert party.status()["state"] == "waiting for the federation"
    # the server asks for the final report: the run ended, and its operator reads so
    _message(agent, 1, 1, REPORT)
    assert party.status()["state"] == "finished"


def test_a_finished_run_the_folder_cannot_record_still_reports(tmp_path, monkeypatch, capsys):
    from botorch_fed.problems.ask_tell import AskTellObjective

    def unwritable(self) -> None:
        self.close()
        raise OSError("No space left on device")

    monkeypatch.setattr(AskTellObjective, "finish", unwritable)
    agent = _campaign_agent(tmp_path, ask_tell=tmp_path / "ask")
    party = Party(tmp_path / "ask")
    _message(agent, 0, 0, "init", hold=0.2, num_init=1)
    while not party.pending():
        time.sleep(0.01)
    (ask,) = party.pending()
    party.report(ask["id"], 1.0)
    assert _message(agent, 0, 0, "init", hold=5.0, num_init=1)[0] == {"ok": True}
    reply, report = _message(agent, 1, 1, REPORT, num_init=1)
    assert reply == {"ok": True} and report  # the report leaves; the folder says why not
    assert "could not record the run as finished: No space left" in capsys.readouterr().err
    assert party.status()["state"] == "no run active"


@pytest.mark.parametrize("hold", [0, -1.0, True, "60", MAX_HOLD * 2])
def test_a_hold_outside_its_domain_is_refused_in_public_words(tmp_path, hold):
    agent = _campaign_agent(tmp_path)
    with pytest.raises(ValueError, match=r"`hold` must be in \(0, 86400\] s") as err:
        _message(agent, 0, 0, "init", hold=hold)
    assert is_public_refusal(err.value)
    reply, _ = agent.reply(
        {"run": 7, "type": "init", "seq": 0, "round": 0, "config": {"hold": hold}}, {}
    )
    assert not reply["ok"] and "`hold` must be in" in reply["error"]
    with pytest.raises(ValueError, match="`hold` must be in"):
        server_app._config({"hold": hold})  # the server checks it before round 0
