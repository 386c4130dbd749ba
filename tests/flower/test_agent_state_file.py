r"""A party agent's state file (``--state-file``): what it keeps and what that costs.

The agent keeps the runs it began (none may start again, not even after a restart) and
the LDP epsilon it spent over all runs (its cap bounds the party's privacy loss). A
server can send any number of run ids: runs the agent refuses, or final reports of runs
it never held, must leave nothing behind; a run it holds costs one appended line,
whatever came before (no file rewritten at every event, growing with the history); the
epsilon spent is written atomically before the answer that spent it leaves. The memory
of runs is bounded: past its cap the agent refuses new runs rather than forget old ones.

Everything runs on the agent directly: no Flower processes."""

from __future__ import annotations

import json
import os
import stat

import pytest

pytest.importorskip("flwr")

import botorch_fed.flower.agent as agent_module  # noqa: E402
import botorch_fed.flower.agent_state as agent_state  # noqa: E402
from botorch_fed.flower.agent import REPORT, PartyAgent  # noqa: E402
from botorch_fed.flower.party_errors import is_public_refusal  # noqa: E402
from botorch_fed.flower.policy import PartyPolicy, PolicyError  # noqa: E402
from botorch_fed.flower.run_options import prepare  # noqa: E402
from botorch_fed.protocol.declarations import ProtocolViolation  # noqa: E402
from botorch_fed.protocol.registry import get_algorithm  # noqa: E402
from botorch_fed.protocol.runner import build_context  # noqa: E402
from tests.helpers.flower_runs import short_argv  # noqa: E402

pytestmark = pytest.mark.usefixtures("quiet_single_thread")

FIRST = 10**15  # Flower's run ids are random 64-bit numbers: these all have 16 digits


def _send(agent: PartyAgent, run: int, argv: list[str], type_: str, payload=None):
    config = {"argv": json.dumps(argv), "keyset": ""}
    return agent.answer({"run": run, "type": type_, "config": config}, payload or {})


def _local_argv() -> list[str]:
    argv = short_argv("local")
    i = argv.index("--crypto-seed")  # the default policy refuses a crypto seed
    return argv[:i] + argv[i + 2 :]


def _ldp_argv() -> list[str]:
    argv = ["ldp-tgp", "--problem", "ldp-synthetic", "--clients", "3", "--num-rounds", "3"]
    return argv + ["--seed", "2", "--epsilon", "1", "--user-budget", "1"]


def _files(folder) -> dict[str, int]:
    return {name: os.path.getsize(folder / name) for name in sorted(os.listdir(folder))}


@pytest.fixture
def writes(monkeypatch):
    r"""Every write to the agent's state: ``[("append" | "replace", path, bytes)]``."""
    seen: list[tuple[str, str, int]] = []
    append, replace = getattr(agent_state, "_append", None), getattr(agent_state, "_replace", None)

    def appending(path, text):
        seen.append(("append", str(path), len(text)))
        return append(path, text)

    def replacing(path, text):
        seen.append(("replace", str(path), len(text)))
        return replace(path, text)

    monkeypatch.setattr(agent_state, "_append", appending, raising=False)
    monkeypatch.setattr(agent_state, "_replace", replacing, raising=False)
    return seen


def test_runs_it_refuses_or_never_held_leave_nothing_behind(tmp_path, writes):
    # 3,000 final reports of runs the party never held (the party keeps its results:
    # refused), runs its policy refuses, and reports it answers of runs it never held:
    # none of them released anything, none is kept
    state = tmp_path / "party-0.json"
    argv = _local_argv()
    agent = PartyAgent(0, 3, state_file=state)
    for k in range(3000):
        with pytest.raises(PolicyError, match="keeps its evaluations"):
            _send(agent, FIRST + k, argv, REPORT)
    refused = ["central", *argv[1:]]  # the default policy does not join `central`
    for k in range(20):
        with pytest.raises(PolicyError, match="'central'"):
            _send(agent, 2 * FIRST + k, refused, "init")
    sharing = PartyAgent(0, 3, policy=PartyPolicy(share_results=True), state_file=state)
    for k in range(20):
        _, report = _send(sharing, 3 * FIRST + k, argv, REPORT)
        assert json.loads(report["history"]) == []
    assert writes == [] and _files(tmp_path) == {}
    assert agent._over == {} and sharing._over == {}  # nor in memory
    _send(sharing, FIRST, argv, "init")  # a run never held may still begin


def test_a_run_it_holds_costs_one_line_whatever_came_before(tmp_path, writes):
    state = tmp_path / "party-0.json"
    argv = _local_argv()
    agent = PartyAgent(0, 3, state_file=state)
    journal = tmp_path / "party-0.json.runs"
    sizes, inodes = [], set()
    runs = 40
    for k in range(runs):
        _send(agent, FIRST + k, argv, "init")  # begins: recorded before it answers
        with pytest.raises(PolicyError):
            _send(agent, FIRST + k, argv, REPORT)  # over (the party keeps its results)
        sizes.append(os.path.getsize(journal))
        inodes.add(os.stat(journal).st_ino)
    # one append of one line per run, the same size for the first run and the last: the
    # file is appended to, never rewritten (one inode), and the epsilon file not touched
    assert writes == [("append", str(journal), 17)] * runs
    assert sizes == [17 * (k + 1) for k in range(runs)] and len(inodes) == 1
    assert _files(tmp_path) == {"party-0.json.runs": 17 * runs}
    assert stat.S_IMODE(os.stat(journal).st_mode) == 0o600


def test_runs_that_began_are_refused_after_a_restart(tmp_path):
    state = tmp_path / "party-0.json"
    argv = _local_argv()
    agent = PartyAgent(0, 3, state_file=state)
    for k in range(5):
        _send(agent, FIRST + k, argv, "init")
    for k in range(3):  # three of them end, two were running when the agent stopped
        with pytest.raises(PolicyError):
            _send(agent, FIRST + k, argv, REPORT)
    again = PartyAgent(0, 3, state_file=state)
    for k in range(5):
        for type_ in ("init", "round", REPORT):
            with pytest.raises(ProtocolViolation, match="began before this party's agent") as e:
                _send(again, FIRST + k, argv, type_, {"t": 1})
            assert is_public_refusal(e.value)
    _send(again, FIRST + 5, argv, "init")  # a new run begins


def test_a_torn_last_line_is_cut_off(tmp_path):
    # a crash while a run's line was appended: that run had answered nothing yet
    state = tmp_path / "party-0.json"
    journal = tmp_path / "party-0.json.runs"
    journal.write_text(f"{FIRST}\n{FIRST + 1}\n{FIRST + 2}"[:-3])
    journal.chmod(0o600)
    agent = PartyAgent(0, 3, state_file=state)
    assert journal.read_text() == f"{FIRST}\n{FIRST + 1}\n"
    _send(agent, 7, _local_argv(), "init")  # its line starts a line of its own
    assert journal.read_text() == f"{FIRST}\n{FIRST + 1}\n7\n"
    assert sorted(PartyAgent(0, 3, state_file=state)._over) == [7, FIRST, FIRST + 1]
    journal.write_text("12\nnot a run\n")
    with pytest.raises(ValueError, match="--state-file .*not an agent runs journal"):
        PartyAgent(0, 3, state_file=state)


def test_past_its_cap_the_agent_refuses_new_runs_rather_than_forget(tmp_path, monkeypatch):
    monkeypatch.setattr(agent_module, "MAX_REMEMBERED", 3)
    state = tmp_path / "party-0.json"
    argv = _local_argv()
    agent = PartyAgent(0, 3, state_file=state)
    for k in range(3):
        _send(agent, FIRST + k, argv, "init")
    size = os.path.getsize(tmp_path / "party-0.json.runs")
    for who in (agent, PartyAgent(0, 3, state_file=state)):  # and after a restart
        with pytest.raises(PolicyError, match="remembers 3 runs it began") as refused:
            _send(who, FIRST + 3, argv, "init")
        assert is_public_refusal(refused.value)
    assert os.path.getsize(tmp_path / "party-0.json.runs") == size
    # the party's operator, and only the party's, may choose to forget
    os.rename(tmp_path / "party-0.json.runs", tmp_path / "old-runs")
    _send(PartyAgent(0, 3, state_file=state), FIRST + 3, argv, "init")


def _ldp_query() -> dict:
    run = prepare(_ldp_argv())
    box = build_context(get_algorithm(run.algorithm), run.setup, run.settings).objectives[0]
    return {"x": box.candidates[37].numpy(), "t": 1}


def test_the_epsilon_spent_is_written_before_the_answer_leaves(tmp_path, writes, monkeypatch):
    state = tmp_path / "party-0.json"
    argv, query = _ldp_argv(), _ldp_query()
    policy = PartyPolicy(max_total_epsilon=10.0)
    agent = PartyAgent(0, 3, policy=policy, state_file=state)
    _send(agent, FIRST, argv, "query", query)
    assert json.loads(state.read_text()) == {"format": 2, "epsilon_spent": 1.0}
    assert [w[0] for w in writes] == ["append", "replace"]  # the run's line, then epsilon
    assert stat.S_IMODE(os.stat(state).st_mode) == 0o600

    # the disk fails while the next answer's epsilon is written: the answer does not
    # leave, and the file holds the total before it, whole (no torn JSON, no temp file)
    def failing(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", failing)
    with pytest.raises(OSError, match="No space left"):
        _send(agent, FIRST + 1, argv, "query", query)
    monkeypatch.undo()
    assert json.loads(state.read_text()) == {"format": 2, "epsilon_spent": 1.0}
    assert sorted(os.listdir(tmp_path)) == ["party-0.json", "party-0.json.runs"]
    assert PartyAgent(0, 3, policy=policy, state_file=state).epsilon_spent == 1.0
    # an epsilon event rewrites a file of constant size, however many runs came before
    sizes = {w[2] for w in writes if w[0] == "replace"}
    assert len(sizes) == 1 and sizes.pop() < 60


def test_a_state_file_of_the_earlier_format_is_converted(tmp_path):
    # one JSON file that held every run id: its runs move to the journal, its epsilon stays
    state = tmp_path / "party-0.json"
    earlier = {"over": {str(FIRST): "it reported"}, "started": [FIRST + 1], "epsilon_spent": 2.5}
    state.write_text(json.dumps(earlier))
    state.chmod(0o600)
    agent = PartyAgent(0, 3, state_file=state)
    assert agent.epsilon_spent == 2.5
    assert json.loads(state.read_text()) == {"format": 2, "epsilon_spent": 2.5}
    journal = tmp_path / "party-0.json.runs"
    assert journal.read_text() == f"{FIRST}\n{FIRST + 1}\n"
    for who in (agent, PartyAgent(0, 3, state_file=state)):
        for run in (FIRST, FIRST + 1):
            with pytest.raises(ProtocolViolation, match="a run does not start again"):
                _send(who, run, _local_argv(), "init")
