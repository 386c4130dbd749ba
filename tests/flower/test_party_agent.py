r"""What a party's agent keeps to itself whatever the run config (the server's) asks,
and against another local user of the party's machine: the run config cannot learn
which paths exist on the party's machine, an error of the run's client reaches the
server without its text (a failed evaluation's private point, a private value quoted by
a protocol check) while a refusal of the party's policy keeps its text, a run's client
is never reset nor started again (not even after the agent restarted), a full agent
refuses a new run rather than drop an active one, an LDP user spends its privacy budget
once per party, the agent's state file cannot be swapped or rewritten by others, and a
client sends its noisy cluster centres once per data. (What the party's policy refuses:
test_policy.py; what the state file costs and keeps: test_agent_state_file.py.)

Everything runs on the agent directly (its socket at most): no Flower processes."""

from __future__ import annotations

import json
import os
import re
import stat
import sys

import numpy as np
import pytest

pytest.importorskip("flwr")

from botorch_fed.flower.agent import (  # noqa: E402
    IDLE_BEFORE_DROP,
    MAX_RUNS,
    REPORT,
    PartyAgent,
)
from botorch_fed.flower.client_app import AgentError, forward  # noqa: E402
from botorch_fed.flower.keys import write_keyset  # noqa: E402
from botorch_fed.flower.party import serve  # noqa: E402
from botorch_fed.flower.party_errors import is_public_refusal, refusal  # noqa: E402
from botorch_fed.flower.policy import PartyPolicy, PolicyError  # noqa: E402
from botorch_fed.flower.run_options import prepare  # noqa: E402
from botorch_fed.flower.transport import ClientFailed, FlowerTransport  # noqa: E402
from botorch_fed.protocol.declarations import ProtocolViolation  # noqa: E402
from botorch_fed.protocol.messages import Message  # noqa: E402
from botorch_fed.protocol.registry import get_algorithm  # noqa: E402
from botorch_fed.protocol.runner import build_context  # noqa: E402
from botorch_fed.secure.errors import HeadroomError  # noqa: E402
from tests.helpers.flower_runs import short_argv  # noqa: E402

pytestmark = pytest.mark.usefixtures("quiet_single_thread")


def _send(agent: PartyAgent, run: int, argv: list[str], type_: str, payload=None, keyset=""):
    r"""One message of run ``run`` as the ClientApp forwards it (the run config is the
    server's)."""
    config = {"argv": json.dumps(argv), "keyset": keyset}
    return agent.answer({"run": run, "type": type_, "config": config}, payload or {})


def _local_argv() -> list[str]:
    # no --crypto-seed: the party's default policy accepts the run; 3 rounds, so a run
    # can be asked for round 2
    argv = short_argv("local", rounds=3)
    i = argv.index("--crypto-seed")
    return argv[:i] + argv[i + 2 :]


# --- the run's --out / --plot cannot probe the party's file system -------------------
def _outcome(agent: PartyAgent, run: int, argv: list[str], path: str) -> str:
    try:
        _send(agent, run, [*argv, "--out", path], "init")
    except Exception as exc:  # noqa: BLE001 - what the server is told
        return f"{type(exc).__name__}: {exc}".replace(path, "<PATH>")
    return "accepted"


def test_the_run_config_cannot_probe_the_partys_files(tmp_path):
    argv = _local_argv()
    agent = PartyAgent(0, 3)
    probes = {
        "missing folder": str(tmp_path / "no-such-project" / "x.json"),
        "existing folder": str(tmp_path / "x.json"),
        "a folder": str(tmp_path),
    }
    seen = {name: _outcome(agent, i + 1, argv, p) for i, (name, p) in enumerate(probes.items())}
    # were they accepted / "the folder ... does not exist" / "... is a folder", the
    # server would learn which paths exist on the party's machine
    assert len(set(seen.values())) == 1, seen


# --- a failed evaluation keeps the party's private point and its error text ---------
BOX = """
calls = []

def f(X):
    calls.append(X.clone())
    if len(calls) > 3:  # after the (public) initial design: the party's own steps
        raise ValueError("lab instrument 7 read 123.456 mV, out of range")
    return X.sum(-1)
"""


def test_a_failed_evaluation_does_not_send_the_private_point_to_the_server(
    tmp_path, monkeypatch, capsys
):
    (tmp_path / "private_box.py").write_text(BOX)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    sys.modules.pop("private_box", None)
    argv = ["local", "--objective", "private_box:f", "--bounds", "0,1;0,1", "--clients", "3"]
    argv += ["--num-rounds", "1", "--num-init", "3", "--seed", "2", "--fail-on-error"]
    argv += ["--num-restarts", "2", "--raw-samples", "16", "--maxiter", "15"]
    agent = PartyAgent(0, 3, policy=PartyPolicy(objectives=("private_box:f@0,1;0,1",)))
    _send(agent, 1, argv, "init")  # the public initial design
    config = {"argv": json.dumps(argv), "keyset": ""}
    # a local step: a point only the party knows; reply() is what _serve_one sends
    meta, _ = agent.reply({"run": 1, "type": "round", "config": config}, {"t": 1})
    assert not meta["ok"], "the black box did not fail"
    told = meta["error"]
    import private_box

    private = private_box.calls[3].reshape(-1).tolist()
    # what must not reach the server: "EvaluationError: Client 0, round 1: evaluating
    # 'private_box:f' at [x1, x2] failed (ValueError: lab instrument 7 read 123.456 mV,
    # out of range)."
    assert "123.456" not in told and not any(repr(x) in told for x in private), told
    assert told.startswith("EvaluationError: client 0, message 'round', round 1"), told
    assert "123.456" in capsys.readouterr().err  # the party's own log keeps it


# --- what a client's error tells the server: its type and the message, no more ---------
class _Quoting:
    r"""A run's client whose protocol checks quote a private value (as a bound check
    quotes ``max|x|`` of a private vector, or a count of the party's own outcomes)."""

    history: list = []

    def __init__(self, error: BaseException) -> None:
        self.error = error

    def handle(self, message):
        raise self.error


PRIVATE = "0.123456"
CLIENT_ERRORS = [
    ProtocolViolation(f"Client 0, request 'b', round 4: the sum reports n={PRIVATE} outcomes"),
    HeadroomError(f"max|x| = {PRIVATE} exceeds the encoding's headroom"),
    PolicyError(f"a check inside the client that quotes {PRIVATE}"),  # the type is no pass
    ValueError(f"x = {PRIVATE} is out of range"),
    # an error object the agent once marked as a refusal, raised again by the client
    refusal(PolicyError(f"a refusal the client kept, now quoting {PRIVATE}")),
]


@pytest.fixture
def agent_socket(tmp_path):
    r"""``(agent, socket path)``: an agent serving a Unix socket in a thread."""
    import threading

    agent = PartyAgent(0, 3, policy=PartyPolicy(share_results=True))
    path = str(tmp_path / "agent.sock")
    ready = threading.Event()
    threading.Thread(target=serve, args=(agent, path, ready.set), daemon=True).start()
    assert ready.wait(10)
    return agent, path


@pytest.mark.parametrize(
    "error", CLIENT_ERRORS, ids=["violation", "headroom", "policy", "value", "kept"]
)
def test_a_client_error_reaches_the_wire_without_its_private_text(
    error, agent_socket, monkeypatch, capsys
):
    agent, path = agent_socket
    monkeypatch.setattr(agent, "_build", lambda config, *_: _Quoting(error))
    config = {"argv": json.dumps(_local_argv()), "keyset": ""}
    meta = {"run": 1, "type": "secagg", "config": config}
    with pytest.raises(AgentError) as told:  # what the ClientApp raises, Flower forwards
        forward(path, meta, {"request": "b", "round": 4, "data": b"x"}, timeout=30)
    text = str(told.value)
    assert PRIVATE not in text, text
    name = type(error).__name__
    assert text == (
        f"{name}: client 0, message 'secagg', request 'b', round 4 "
        "(the details stay in the party's log)"
    )
    assert PRIVATE in capsys.readouterr().err  # the party's log has it all
    assert not is_public_refusal(error)


def test_a_refusal_before_the_client_keeps_its_text(agent_socket):
    # the submitter needs to know what to allow: the policy's and the options' text
    _, path = agent_socket
    refused = ["central", *_local_argv()[1:]]  # the default policy does not join `central`
    bad = [*_local_argv(), "--num-init", "-1"]  # options that do not parse
    for argv, match in ((refused, r"PolicyError: .*'central'.*--allow-algorithm central"),
                        (bad, r"ValueError: .*--num-init")):  # fmt: skip
        config = {"argv": json.dumps(argv), "keyset": ""}
        with pytest.raises(AgentError, match=match):
            forward(path, {"run": 5, "type": "init", "config": config}, {}, timeout=30)


def test_the_server_is_told_a_clients_error_by_type_and_message(tmp_path, monkeypatch):
    # through the ClientApp, Flower's wire and the server's transport: what ends the run
    from tests.helpers.fake_grid import FakeGrid

    error = ProtocolViolation(f"the sum reports n={PRIVATE} outcomes")
    monkeypatch.setattr(PartyAgent, "_build", lambda self, config, *_: _Quoting(error))
    grid = FakeGrid(3, str(tmp_path))
    grid.run_config = {"argv": json.dumps(_local_argv()), "keyset": ""}
    transport = FlowerTransport(grid, {0: 1000, 1: 1007, 2: 1014}, timeout=30, poll=0.01)
    with pytest.raises(ClientFailed) as failed:
        transport.send({0: Message("secagg", {"request": "b", "round": 3, "data": b"x"})})
    assert PRIVATE not in str(failed.value)
    assert str(failed.value) == (
        "client 0 (Flower node 1000), message 'secagg' failed: ProtocolViolation: client 0, "
        "message 'secagg', request 'b', round 3 (the details stay in the party's log)"
    )


# --- a run's client cannot be reset (evaluated again, its ledger forgotten) ----------
class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize("how", ["report", "eviction"])
def test_a_runs_client_cannot_be_reset_to_evaluate_its_design_again(how):
    argv = _local_argv()
    clock = Clock()
    agent = PartyAgent(0, 3, clock=clock)  # default policy: keeps its results
    _send(agent, 1, argv, "init")
    if how == "report":
        with pytest.raises(PolicyError):
            _send(agent, 1, argv, REPORT)
    else:
        clock.now = IDLE_BEFORE_DROP + 1  # run 1 idle long enough to be dropped
        for run in range(2, MAX_RUNS + 2):  # cheap runs of the same server (or another)
            _send(agent, run, argv, "round", {"t": 1})
    with pytest.raises(ProtocolViolation, match="over for this party"):
        _send(agent, 1, argv, "init")  # a fresh client would evaluate its design again


def _full_agent(policy: PartyPolicy | None = None) -> tuple[PartyAgent, Clock]:
    r"""An agent holding :data:`MAX_RUNS` runs (ids 1..MAX_RUNS) that started at time 0."""
    clock = Clock()
    agent = PartyAgent(0, 3, clock=clock, policy=policy)
    for run in range(1, MAX_RUNS + 1):
        _send(agent, run, _local_argv(), "init")
    return agent, clock


def _all_answer(agent: PartyAgent) -> None:
    for run in range(1, MAX_RUNS + 1):  # none was dropped
        _send(agent, run, _local_argv(), "round", {"t": 1})


def test_the_party_refuses_a_new_run_rather_than_drop_an_active_one():
    # nine concurrent runs on eight slots must not drop a running one
    argv = _local_argv()
    agent, clock = _full_agent()
    clock.now = IDLE_BEFORE_DROP  # every run active within the limit
    with pytest.raises(PolicyError, match=f"holds {MAX_RUNS} runs.*takes no new run"):
        _send(agent, 99, argv, "init")
    clock.now = 2 * IDLE_BEFORE_DROP
    _send(agent, 1, argv, "round", {"t": 1})  # run 1 active again; run 2 idle longest
    _send(agent, 100, argv, "init")  # takes run 2's place
    with pytest.raises(ProtocolViolation, match=r"dropped after \d+ s idle"):
        _send(agent, 2, argv, "round", {"t": 1})
    _send(agent, 1, argv, "round", {"t": 2})  # run 1 kept its client


def test_a_refused_run_drops_no_other_run():
    agent, clock = _full_agent()
    clock.now = 10 * IDLE_BEFORE_DROP  # every run could be dropped now
    refused = ["central", *_local_argv()[1:]]  # the default policy does not join `central`
    with pytest.raises(PolicyError, match="'central'"):
        _send(agent, 99, refused, "init")
    _all_answer(agent)


def test_a_report_of_a_run_never_held_drops_no_other_run():
    agent, clock = _full_agent(PartyPolicy(share_results=True))
    clock.now = 10 * IDLE_BEFORE_DROP  # every run could be dropped now
    _, report = _send(agent, 999, _local_argv(), REPORT)  # a party never sent a message
    assert json.loads(report["history"]) == []
    _all_answer(agent)
    # nothing of run 999 was released, so nothing of it is kept (test_agent_state_file.py):
    # it is refused as any new run of a full agent, not as a run that is over
    with pytest.raises(PolicyError, match="takes no new run"):
        _send(agent, 999, _local_argv(), "init")


# --- LDP: the user's budget is per party, not per client object ----------------------
def _ldp_argv() -> list[str]:
    argv = ["ldp-tgp", "--problem", "ldp-synthetic", "--clients", "3", "--num-rounds", "3"]
    return argv + ["--seed", "2", "--epsilon", "1", "--user-budget", "1"]


@pytest.mark.parametrize("how", ["report", "new run"])
def test_an_ldp_user_spends_its_budget_once(how):
    # neither a reset within a run (the run is over for the party after its report) nor
    # new runs (the party's own --max-total-epsilon caps what all its runs spend) buy more
    argv = _ldp_argv()
    run = prepare(argv)
    box = build_context(get_algorithm(run.algorithm), run.setup, run.settings).objectives[0]
    query = {"x": box.candidates[37].numpy(), "t": 1}  # a point of the finite domain
    agent = PartyAgent(0, 3, policy=PartyPolicy(max_total_epsilon=3.0))
    _send(agent, 1, argv, "query", query)
    with pytest.raises(Exception, match="budget"):  # the run's own check holds
        _send(agent, 1, argv, "query", query)
    answers = []
    for k in range(40):  # the server resets the user 40 times
        rid = 1 if how == "report" else 100 + k
        if how == "report":  # refused, and the run is over for the party from then on
            with pytest.raises((PolicyError, ProtocolViolation)):
                _send(agent, 1, argv, REPORT)
        try:
            _, out = _send(agent, rid, argv, "query", query)
        except (PolicyError, ProtocolViolation) as exc:  # refused, as it must be
            assert how == "report" or re.search("--max-total-epsilon|no new run", str(exc))
            continue
        answers.append(out["y"])
    # were they answered: 40 more releases at one point, 41 epsilon in all; their mean
    # is the raw reward up to the Laplace scale / sqrt(40). So new runs get what the
    # party's cap leaves (3 epsilon in all: 2 more answers), a reset run nothing
    assert len(answers) == (0 if how == "report" else 2), answers
    assert agent.epsilon_spent == (1.0 if how == "report" else 3.0)


def test_a_bundle_of_ldp_queries_is_charged_every_part_before_it_runs():
    # one message holding several releases must fit the party's cap as a whole: else a
    # bundle of 16 queries would spend 16 epsilon on a check for one
    from botorch_fed.protocol.bundle import bundle

    argv = _ldp_argv()[:-2] + ["--user-budget", "10"]
    argv[argv.index("--num-rounds") + 1] = "9"  # client 0's turns: rounds 1, 4 and 7
    run = prepare(argv)
    box = build_context(get_algorithm(run.algorithm), run.setup, run.settings).objectives[0]
    queries = [
        Message("query", {"x": box.candidates[37 + k].numpy(), "t": 1 + 3 * k}) for k in range(3)
    ]
    agent = PartyAgent(0, 3, policy=PartyPolicy(max_total_epsilon=2.0))
    many = bundle(queries)
    with pytest.raises(PolicyError, match="3 more answers .*--max-total-epsilon"):
        _send(agent, 1, argv, many.type, many.payload)
    assert agent.epsilon_spent == 0.0  # nothing ran
    two = bundle(queries[:2])
    _send(agent, 1, argv, two.type, two.payload)  # 2 of 2
    assert agent.epsilon_spent == 2.0


def test_the_runs_that_ended_and_the_epsilon_spent_outlive_the_agent(tmp_path):
    state = tmp_path / "party-0.json"
    argv = _ldp_argv()
    run = prepare(argv)
    box = build_context(get_algorithm(run.algorithm), run.setup, run.settings).objectives[0]
    query = {"x": box.candidates[37].numpy(), "t": 1}
    policy = PartyPolicy(max_total_epsilon=2.0)
    agent = PartyAgent(0, 3, policy=policy, state_file=state)
    _send(agent, 1, argv, "query", query)  # epsilon 1 of 2
    with pytest.raises(PolicyError):
        _send(agent, 1, argv, REPORT)  # run 1 is over
    assert stat.S_IMODE(os.stat(state).st_mode) == 0o600
    again = PartyAgent(0, 3, policy=policy, state_file=state)  # the agent restarted
    assert again.epsilon_spent == 1.0
    with pytest.raises(ProtocolViolation, match="over for this party"):
        _send(again, 1, argv, "query", query)
    _send(again, 2, argv, "query", query)  # epsilon 2 of 2
    with pytest.raises(PolicyError, match="--max-total-epsilon") as refused:
        _send(PartyAgent(0, 3, policy=policy, state_file=state), 3, argv, "query", query)
    # what the party spent in its other runs (another federation's) is not the server's
    assert "2" not in str(refused.value) and "spent" not in str(refused.value)
    state.write_text('{"over": {}, "started": [], "epsilon_spent": -1}')
    with pytest.raises(ValueError, match="--state-file .*epsilon_spent -1"):
        PartyAgent(0, 3, state_file=state)
    state.write_text("not json")
    with pytest.raises(ValueError, match="--state-file .*not an agent state file"):
        PartyAgent(0, 3, state_file=state)


def test_a_run_that_was_running_when_the_agent_restarted_does_not_start_again(tmp_path):
    # not only the runs that had ended are kept: a restarted agent must not evaluate the
    # initial design of a running run again
    state = tmp_path / "party-0.json"
    argv = _local_argv()
    _send(PartyAgent(0, 3, state_file=state), 1, argv, "init")
    again = PartyAgent(0, 3, state_file=state)  # crashed and restarted
    with pytest.raises(ProtocolViolation, match="began before this party's agent restarted"):
        _send(again, 1, argv, "init")
    _send(again, 2, argv, "init")  # a new run is fine


def test_another_local_user_cannot_swap_or_rewrite_the_state_file(tmp_path):
    # a planted link must not be followed, nor a file others could write (it would reset
    # the budget at the next restart) be read
    folder = tmp_path / "parties"
    folder.mkdir(mode=0o700)
    state = folder / "party-0.json"
    victim = tmp_path / "victim"
    victim.write_text("keep")
    state.symlink_to(victim)
    with pytest.raises(ValueError, match="not a regular file"):
        PartyAgent(0, 3, state_file=state)
    state.unlink()
    journal = folder / "party-0.json.runs"  # the runs it began: the same checks
    journal.symlink_to(victim)
    with pytest.raises(ValueError, match="not a regular file"):
        PartyAgent(0, 3, state_file=state)
    journal.unlink()
    state.write_text('{"over": {}, "started": [], "epsilon_spent": 0}')
    state.chmod(0o666)
    with pytest.raises(ValueError, match="writable by other users"):
        PartyAgent(0, 3, state_file=state)
    state.chmod(0o600)
    folder.chmod(0o777)
    with pytest.raises(ValueError, match="the folder is writable by other users"):
        PartyAgent(0, 3, state_file=state)
    folder.chmod(0o700)
    agent = PartyAgent(0, 3, state_file=state)
    _send(agent, 1, _local_argv(), "init")
    assert victim.read_text() == "keep"
    assert stat.S_IMODE(os.stat(state).st_mode) == 0o600
    # the run it began, appended to its journal; the epsilon file is as the test wrote
    # it (test_agent_state_file.py: when it is written); no temporary file left
    assert sorted(os.listdir(folder)) == ["party-0.json", "party-0.json.runs"]
    assert stat.S_IMODE(os.stat(folder / "party-0.json.runs").st_mode) == 0o600


# --- the noisy cluster centres a client sends -----------------------------------------
def test_a_client_sends_its_noisy_centres_once_per_data(tmp_path):
    # were each request answered with fresh noise, the median of 2000 `centers` requests
    # in one round would be within 0.003 of a private point
    argv = short_argv("fbo-fedgp", "masking")
    i = argv.index("--crypto-seed")
    argv = argv[:i] + argv[i + 2 :] + ["--support-selection", "clustered"]
    argv += ["--centers-per-client", "2"]  # the k a client takes is the run's
    keyset, _ = write_keyset(prepare(argv).setup, [0, 1, 2], tmp_path)
    agent = PartyAgent(0, 3, tmp_path, policy=PartyPolicy(allow_masking=True))
    _send(agent, 1, argv, "init", keyset=keyset)
    first = _send(agent, 1, argv, "centers", {"k": 2}, keyset=keyset)[1]["centers"]
    assert len(first)
    for _ in range(5):
        again = _send(agent, 1, argv, "centers", {"k": 2}, keyset=keyset)[1]["centers"]
        np.testing.assert_array_equal(again, first)  # the same noise: nothing to average
    with pytest.raises(ProtocolViolation, match=r"`k`=3 lies outside its domain \[2, 2\]"):
        _send(agent, 1, argv, "centers", {"k": 3}, keyset=keyset)


@pytest.mark.parametrize("share", [False, True])
def test_a_partys_stage_timings_go_with_its_results_only(share):
    # how long a party's local fit or acquisition took depends on its data (and shows
    # which branch its code took): without --share-results its answers carry none
    agent = PartyAgent(0, 3, policy=PartyPolicy(share_results=share))
    argv = _local_argv()
    _send(agent, 1, argv, "init")
    _, reply = _send(agent, 1, argv, "round", {"t": 1})
    timings = sorted(k for k in reply if k.startswith("time:"))
    assert timings == (["time:acquisition", "time:evaluation", "time:local_fit"] if share else [])


def test_an_error_building_the_partys_own_client_is_not_told(monkeypatch, capfd):
    # the run's options passed every check; what then fails is the party's own code
    # (its objective, its data): the server learns the error's type, not its text
    import botorch_fed.protocol.runner as runner

    def broken(*args, **kwargs):
        raise ValueError("calibration file /home/lab/secret.csv has 0.4242 in row 7")

    monkeypatch.setattr(runner, "make_client", broken)
    agent = PartyAgent(0, 3)
    config = {"argv": json.dumps(_local_argv()), "keyset": ""}
    meta, _ = agent.reply({"run": 1, "type": "init", "config": config}, {})
    assert not meta["ok"] and "RuntimeError" in meta["error"]
    assert "0.4242" not in meta["error"] and "secret.csv" not in meta["error"]
    assert "0.4242" in capfd.readouterr().err  # the party's own log has it


@pytest.mark.parametrize("module", ["no_such_party_module", "broken_party_module"])
def test_an_objective_that_does_not_load_is_refused_without_its_text(
    module, tmp_path, monkeypatch, capfd
):
    # the party's module's own error, its working directory and the module's names
    # stay in the party's log; the server learns only that the objective does not load
    (tmp_path / "broken_party_module.py").write_text("raise RuntimeError('key 0.4242')\n")
    monkeypatch.chdir(tmp_path)
    name = f"{module}:f"
    agent = PartyAgent(0, 3, policy=PartyPolicy(objectives=(f"{name}@0,1;0,1",)))
    argv = [*_local_argv(), "--objective", name, "--bounds", "0,1;0,1"]
    argv = [a for a in argv if a not in ("--problem", "branin")]
    config = {"argv": json.dumps(argv), "keyset": ""}
    meta, _ = agent.reply({"run": 1, "type": "init", "config": config}, {})
    assert not meta["ok"] and "cannot load the run's objective" in meta["error"]
    assert str(tmp_path) not in meta["error"] and "0.4242" not in meta["error"]
    log = capfd.readouterr().err
    assert module in log
