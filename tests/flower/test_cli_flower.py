r"""``botorch-fed flower ...``: what it refuses before any process starts, and ``keys``.
(tests/flower/test_loopback.py runs ``flower run`` on a real federation.)"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("flwr")

from botorch_fed.cli import main  # noqa: E402
from botorch_fed.cli.flower import FLOWER_HELP  # noqa: E402
from botorch_fed.flower import launcher, processes, submission  # noqa: E402
from botorch_fed.flower.policy_flags import add_policy_arguments, policy_from_arguments  # noqa: E402
from botorch_fed.flower.run_options import prepare  # noqa: E402
from botorch_fed.protocol.registry import get_algorithm  # noqa: E402

FLOWER_PAGE = Path(__file__).resolve().parents[2] / "docs" / "flower.md"


@pytest.fixture(autouse=True)
def wide_console(monkeypatch):
    monkeypatch.setenv("COLUMNS", "400")


def _out(capsys) -> str:
    captured = capsys.readouterr()
    return " ".join((captured.out + captured.err).split())


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--checkpoint", "ck"], "--checkpoint is not available on Flower"),
        (["--resume", "ck"], "--resume is not available on Flower"),
        (["--rounds", "0"], "=0 must be >= 1"),
        (["--timeout", "0"], "--timeout must be > 0 seconds"),
        (["--on-dropout", "ignore"], "invalid choice: 'ignore'"),
    ],
)
def test_flower_run_refuses_bad_options_before_anything_runs(extra, message, tmp_path, capsys):
    argv = ["flower", "run", "local", "--problem", "branin", "--clients", "3"]
    code = main([*argv, "--state-dir", str(tmp_path), *extra])
    assert code == 2
    assert message in _out(capsys)


@pytest.fixture
def live_federation(tmp_path):
    r"""A state folder whose ``federation.json`` records a running "superlink" of 3
    parties (a sleeping stand-in process): what ``flower run`` / ``up`` check first."""
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    fed = {
        "state_dir": str(state),
        "address": "127.0.0.1:1",
        "clients": 3,
        "pids": {"superlink": proc.pid},
        "start_times": {"superlink": processes.start_time(proc.pid)},
    }
    (state / "federation.json").write_text(json.dumps(fed))
    try:
        yield state
    finally:
        proc.kill()
        proc.wait()


def test_flower_run_without_a_federation_says_how_to_start_one(tmp_path, capsys):
    argv = ["flower", "run", "local", "--problem", "branin", "--clients", "3"]
    assert main([*argv, "--num-rounds", "1", "--state-dir", str(tmp_path)]) == 1
    text = _out(capsys)
    assert "No live federation in" in text and str(tmp_path) in text
    assert f"`botorch-fed flower up --clients 3 --state-dir {tmp_path}`" in text
    assert "up(" not in text  # the command line's words, not the Python API's


@pytest.mark.parametrize("aggregator", ["ckks", "masking"])
def test_flower_run_refused_writes_no_keys_and_makes_no_folder(aggregator, tmp_path, capsys):
    argv = ["flower", "run", "fbo-fedgp", "--problem", "branin", "--clients", "3",
            "--num-rounds", "1", "--aggregator", aggregator]  # fmt: skip
    missing = tmp_path / "missing" / "state"
    assert main([*argv, "--state-dir", str(missing)]) == 1
    assert "No live federation" in _out(capsys)
    assert not (tmp_path / "missing").exists()  # not even the parent
    # and the folder stays usable by status and down (nothing made with mode 755)
    assert main(["flower", "status", "--state-dir", str(missing)]) == 0
    assert main(["flower", "down", "--state-dir", str(missing)]) == 0
    assert not (tmp_path / "missing").exists()
    # a folder without a live federation gets no key set either
    empty = tmp_path / "empty"
    empty.mkdir(mode=0o700)
    assert main([*argv, "--state-dir", str(empty)]) == 1
    assert list(empty.iterdir()) == []


def test_flower_run_with_other_client_count_says_pass_clients(live_federation, capsys):
    argv = ["flower", "run", "fbo-fedgp", "--problem", "branin", "--clients", "4",
            "--num-rounds", "1", "--aggregator", "masking"]  # fmt: skip
    assert main([*argv, "--state-dir", str(live_federation)]) == 2
    text = _out(capsys)
    assert "has 3 parties: pass `--clients 3` to the run" in text
    assert f"botorch-fed flower up --clients 4 --state-dir {live_federation}" in text
    assert sorted(p.name for p in live_federation.iterdir()) == ["federation.json"]


@pytest.mark.parametrize(
    "extra, reason",
    [
        (["--crypto-seed", "1"], "party 0: The run sets --crypto-seed"),
        (["--objective", "bfed_cli_objective:f", "--bounds", "0,1"],
         "party 0: The run names the objective 'bfed_cli_objective:f'"),
    ],
)  # fmt: skip
def test_flower_run_refused_by_the_parties_policy_says_so_before_submitting(
    extra, reason, live_federation, tmp_path, monkeypatch, capsys
):
    # the agents `up` started with --allow-plaintext only: the run is refused at once,
    # naming the flag, with no key set written and nothing submitted
    monkeypatch.chdir(tmp_path)
    (tmp_path / "bfed_cli_objective.py").write_text("def f(X):\n    return X.sum(-1)\n")
    fed = json.loads((live_federation / "federation.json").read_text())
    command = launcher._default_agent_command(
        sys.executable, live_federation, 3, ("--allow-plaintext", "--threads", "1")
    )
    for i in range(3):
        fed["pids"][f"agent-{i}"] = fed["pids"]["superlink"]
        fed["start_times"][f"agent-{i}"] = fed["start_times"]["superlink"]
        fed.setdefault("argv", {})[f"agent-{i}"] = command(i, tmp_path / f"a{i}")
    (live_federation / "federation.json").write_text(json.dumps(fed))
    argv = ["flower", "run", "local", "--clients", "3", "--num-rounds", "1", *extra]
    if "--objective" not in extra:
        argv += ["--problem", "branin"]
    assert main([*argv, "--state-dir", str(live_federation)]) == 1
    captured = capsys.readouterr()
    text = " ".join(captured.err.split())
    assert f"the parties refuse this run: {reason}" in text, text
    assert f"botorch-fed flower down --state-dir {live_federation}" in text
    assert "Traceback" not in captured.out + captured.err
    assert sorted(p.name for p in live_federation.iterdir()) == ["federation.json"]


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_flower_run_interrupted_exits_as_the_signal_ended_it(
    signum, live_federation, monkeypatch, capsys
):
    def submit(state, config, stream):
        raise submission.RunInterrupted(7, "run 7 is stopped at the SuperLink", signum)

    monkeypatch.setattr(submission, "submit", submit)
    argv = ["flower", "run", "local", "--problem", "branin", "--clients", "3"]
    assert main([*argv, "--state-dir", str(live_federation)]) == 128 + signum
    assert "interrupted: run 7 is stopped at the SuperLink." in _out(capsys)


def _serverapp_stand_in(state: Path, seen: dict, error: str | None = None):
    r"""A ``submission.submit`` that does what the ServerApp does with the run config: its
    results (a real run's JSON) go to ``<state>/results/<out>``, ``out`` a plain name."""
    from botorch_fed.flower.run_options import RESULTS_WRITTEN, results_files
    from botorch_fed.protocol.runner import run_federated

    run = prepare(["random", "--problem", "branin", "--clients", "3", "--num-rounds", "1"])
    data = run_federated(run.algorithm, run.setup, run.settings).to_dict()

    def submit(state_dir, config, stream):
        seen.update(config)
        results, failed = results_files(state_dir, config["out"])  # a name, not a path
        results.parent.mkdir(exist_ok=True)
        if error is None:
            results.write_text(json.dumps(data))
            stream(f"{RESULTS_WRITTEN}results/{config['out']}")
        else:
            failed.write_text(error)
        return 0

    return submit, data


@pytest.mark.parametrize("aggregator", ["masking", None])
def test_flower_run_out_is_the_submitters_file(
    aggregator, live_federation, tmp_path, monkeypatch, capsys
):
    # the run config names the results file in the federation's folder; `flower run`
    # reads it there and writes the user's --out itself, on the user's machine
    seen: dict = {}
    submit, data = _serverapp_stand_in(live_federation, seen)
    monkeypatch.setattr(submission, "submit", submit)
    user = tmp_path / "mine" / "r.json"
    user.parent.mkdir()
    argv = ["flower", "run", "random", "--problem", "branin", "--clients", "3"]
    if aggregator:
        argv = ["flower", "run", "fbo-fedgp", "--problem", "branin", "--clients", "3",
                "--aggregator", aggregator]  # fmt: skip
    assert main([*argv, "--num-rounds", "1", "--out", str(user), "--state-dir",
                 str(live_federation)]) == 0  # fmt: skip
    assert "/" not in seen["out"] and json.loads(user.read_text()) == data
    assert f"results written to {user}" in _out(capsys)
    assert list((live_federation / "results").iterdir()) == []  # read and removed
    if aggregator:  # a key set's name: the ServerApp reads keys/<name>/server.key
        assert seen["server-key"] == seen["keyset"] and "/" not in seen["keyset"]
        assert (live_federation / "keys" / seen["keyset"] / "server.key").exists()
    else:
        assert seen["server-key"] == seen["keyset"] == ""


def test_flower_run_says_why_the_run_failed(live_federation, monkeypatch, capsys):
    seen: dict = {}
    submit, _ = _serverapp_stand_in(live_federation, seen, error="ClientFailed: client 1 ...")
    monkeypatch.setattr(submission, "submit", submit)
    argv = ["flower", "run", "random", "--problem", "branin", "--clients", "3"]
    assert main([*argv, "--state-dir", str(live_federation)]) == 1
    assert "the run failed: ClientFailed: client 1 ..." in _out(capsys)
    assert list((live_federation / "results").iterdir()) == []


def test_the_pre_check_reads_agents_as_they_read_themselves(tmp_path):
    from botorch_fed.cli.flower import _refused_by_a_party
    from botorch_fed.flower.party import agent_parser
    from botorch_fed.flower.run_options import check_argv

    argv = ["local", "--problem", "branin", "--clients", "2", "--crypto-seed", "1"]
    run = prepare(check_argv(argv))
    spec = get_algorithm(run.algorithm)
    agent = launcher._default_agent_command(sys.executable, tmp_path, 2)

    def refused(*flags: str, command=agent) -> str | None:
        processes = {f"agent-{i}": {"argv": [*command(i, tmp_path / "s"), *flags]}
                     for i in range(2)}  # fmt: skip
        return _refused_by_a_party(processes, argv, spec, run)

    assert "party 0: The run sets --crypto-seed" in refused()
    assert refused("--allow-crypto-seed") is None
    # an agent refuses an abbreviated policy flag, so the pre-check does not read one
    with pytest.raises(SystemExit):
        agent_parser().parse_args(agent(0, tmp_path / "s")[3:] + ["--allow-crypto"])
    assert refused("--allow-crypto") is None
    # an agent started otherwise is left to its own check
    assert refused(command=lambda i, sock: ["my-agent", "--socket", str(sock)]) is None


def test_flower_up_on_a_running_federation_says_how_to_stop_it(live_federation, capsys):
    before = (live_federation / "federation.json").read_text()
    assert main(["flower", "up", "--clients", "2", "--state-dir", str(live_federation)]) == 1
    text = _out(capsys)
    assert "already has a running federation (superlink)" in text
    assert f"`botorch-fed flower down --state-dir {live_federation}`" in text
    assert "second federation in another folder (`--state-dir DIR`)" in text
    assert "down(" not in text  # the command line's words, not the Python API's
    assert (live_federation / "federation.json").read_text() == before  # nothing started


def test_flower_run_unknown_option_has_one_error_prefix(tmp_path, capsys):
    argv = ["flower", "run", "local", "--problem", "branin", "--clients", "3", "--bogus", "1"]
    assert main([*argv, "--state-dir", str(tmp_path)]) == 2
    text = _out(capsys)
    assert "error: unrecognized arguments: --bogus 1" in text
    assert text.count("error:") == 1, text
    assert main([*argv[:-2], "--rounds", "x", "--state-dir", str(tmp_path)]) == 2
    text = _out(capsys)
    assert "error: argument --num-rounds/--rounds: invalid int value: 'x'" in text
    assert text.count("error:") == 1, text


def _commands(text: str) -> list[list[str]]:
    r"""The ``botorch-fed flower ...`` commands of ``text`` (``\`` continues a line),
    each as the arguments after ``flower``."""
    joined = re.sub(r"\\\n\s*", " ", text)
    found = []
    for line in joined.splitlines():
        tokens = shlex.split(line.strip()) if "botorch-fed flower " in line else []
        if tokens and tokens[0].endswith("botorch-fed") and tokens[1] == "flower":
            found.append(tokens[2:])
    return found


def _check_accepted(commands: list[list[str]]) -> int:
    r"""Every ``flower run`` of ``commands`` is one that the policy of the ``flower up``
    before it accepts (its --clients too); returns how many runs were checked."""
    checked, up, clients = 0, None, None
    for command in commands:
        if command[0] == "up":
            p = argparse.ArgumentParser()
            p.add_argument("--clients", type=int)
            add_policy_arguments(p)
            args = p.parse_args(command[1:])
            up, clients = policy_from_arguments(args), args.clients
        elif command[0] == "run":
            assert up is not None, f"`flower run` before `flower up`: {command}"
            argv = [a for a in command[1:]]
            if "--out" in argv:
                del argv[argv.index("--out") : argv.index("--out") + 2]
            run = prepare(argv, check=up.check_options)
            up.check(get_algorithm(run.algorithm), run.setup, run.settings)  # PolicyError
            assert run.setup.num_clients == clients, command
            checked += 1
    return checked


def test_flower_help_example_is_accepted_by_the_parties_it_starts():
    assert _check_accepted(_commands(FLOWER_HELP)) == 1


def test_the_documented_flower_commands_are_accepted_by_the_parties_they_start():
    assert _check_accepted(_commands(FLOWER_PAGE.read_text())) >= 1


def test_flower_up_refuses_no_clients(tmp_path, capsys):
    assert main(["flower", "up", "--clients", "0", "--state-dir", str(tmp_path)]) == 2
    assert "--clients must be >= 1" in _out(capsys)


def test_flower_up_takes_policy_flags_only_spelt_out(tmp_path, monkeypatch, capsys):
    # as each agent takes them (an abbreviation is not read as the flag it starts)
    def up(*args, **kwargs):
        raise AssertionError("nothing may start")

    monkeypatch.setattr(launcher, "up", up)
    argv = ["flower", "up", "--clients", "1", "--allow-crypto", "--state-dir", str(tmp_path)]
    assert main(argv) == 2
    assert "unrecognized arguments: --allow-crypto" in _out(capsys)


@pytest.mark.parametrize("extra, threads", [([], "1"), (["--threads", "3"], "3")])
def test_flower_up_gives_every_agent_its_threads(extra, threads, tmp_path, monkeypatch):
    # a run's JSON equals `botorch-fed run`'s only with the parties' thread count too
    from botorch_fed.flower import launcher
    from botorch_fed.flower.party import main as agent_main

    given = {}

    def up(clients, state_dir, **kwargs):
        given.update(kwargs)
        return {"address": "127.0.0.1:1"}

    monkeypatch.setattr(launcher, "up", up)
    argv = ["flower", "up", "--clients", "2", "--state-dir", str(tmp_path), *extra]
    assert main([*argv, "--allow-plaintext"]) == 0
    flags = given["agent_flags"]
    assert flags[-2:] == ["--threads", threads] and "--allow-plaintext" in flags
    built = {}
    monkeypatch.setattr("botorch_fed.flower.party.serve", lambda agent, path: built.update(a=agent))
    monkeypatch.setattr("signal.signal", lambda *args: None)  # the agent's SIGTERM handler
    agent_main(["--socket", str(tmp_path / "s"), "--partition-id", "0", "--num-partitions", "2"])
    assert built["a"].threads == 1  # the agent's own default
    agent_main(["--socket", "s", "--partition-id", "0", "--num-partitions", "2", *flags])
    assert built["a"].threads == int(threads) and built["a"].policy.allow_plaintext


@pytest.mark.parametrize("value", ["0", "-2"])
def test_flower_up_and_the_agent_refuse_threads_below_one(value, tmp_path, capsys):
    from botorch_fed.flower.party import main as agent_main

    argv = ["flower", "up", "--clients", "2", "--threads", value, "--state-dir", str(tmp_path)]
    assert main(argv) == 2
    assert f"--threads must be >= 1, got {value}" in _out(capsys)
    with pytest.raises(SystemExit):
        agent_main(["--socket", "s", "--partition-id", "0", "--num-partitions", "2",
                    "--threads", value])  # fmt: skip
    assert f"--threads must be an int >= 1, got {value}" in _out(capsys)


def test_flower_down_and_status_with_nothing_running(tmp_path, capsys):
    assert main(["flower", "down", "--state-dir", str(tmp_path)]) == 0
    assert "nothing running" in _out(capsys)
    assert main(["flower", "status", "--state-dir", str(tmp_path)]) == 0
    assert "no federation in" in _out(capsys)


def test_flower_keys_writes_one_private_file_per_party(tmp_path, capsys):
    code = main(["flower", "keys", "--aggregator", "masking", "--clients", "3",
                 "--key-dir", str(tmp_path)])  # fmt: skip
    assert code == 0
    (folder,) = tmp_path.iterdir()
    assert folder.name.startswith("masking-") and folder.name in _out(capsys)
    names = sorted(p.name for p in folder.iterdir())
    assert names == ["client-0.key", "client-1.key", "client-2.key", "server.key"]
    for p in folder.iterdir():
        assert stat.S_IMODE(os.stat(p).st_mode) == 0o600, p
    assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700
    keys = [(folder / f"client-{i}.key").read_bytes() for i in range(3)]
    assert len(set(keys)) == 3 and all(keys)  # each party's own secret material


@pytest.mark.parametrize("argv", [[], ["--state-dir", "x"], ["--timeout", "5"]])
def test_flower_run_without_an_algorithm_exits_2(argv, capsys):
    assert main(["flower", "run", *argv]) == 2
    captured = capsys.readouterr()
    assert "the following arguments are required: ALGORITHM" in captured.err


def test_flower_run_help_lists_its_own_options_and_the_runs(capsys):
    assert main(["flower", "run", "--help"]) == 0
    text = capsys.readouterr().out
    for flag in ("--state-dir DIR", "--timeout SECONDS", "--on-dropout"):
        assert flag in text
    assert main(["flower", "run", "local", "--help"]) == 0
    text = capsys.readouterr().out
    assert "--timeout SECONDS" in text and "usage: botorch-fed run local" in text


def test_flower_up_on_a_taken_port_says_it_in_the_command_lines_words(tmp_path, capsys):
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        argv = ["flower", "up", "--clients", "1", "--port", str(port)]
        assert main([*argv, "--state-dir", str(tmp_path / "s")]) == 1
    text = " ".join(capsys.readouterr().err.split())
    assert f"port {port} on 127.0.0.1 is taken" in text and "leave out --port" in text
    assert "port=None" not in text
