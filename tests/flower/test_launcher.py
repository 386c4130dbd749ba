r"""The process launcher of a loopback Flower federation (botorch_fed.flower.launcher).

The tests marked ``flower`` start real SuperLink/SuperNode processes with stand-in
party agents (a few lines that bind the Unix socket and sleep), so they do not
depend on the party module. A session-level safety net calls ``down`` on every
state folder a test used, so no process outlives the tests. The state folder is private
to its user: ``up`` makes it so, and ``submit`` runs nothing from one others can write.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import stat
import subprocess
import sys
import time
import tomllib
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip("flwr")

from botorch_fed.flower import (  # noqa: E402
    launch_errors,
    launcher,
    processes,
    state_folder,
    submission,
)
from botorch_fed.flower.launch_errors import FlowerLaunchError  # noqa: E402
from botorch_fed.flower.launcher import down, status, up  # noqa: E402
from botorch_fed.flower.state_folder import STATE_ENV  # noqa: E402
from botorch_fed.flower.submission import submit  # noqa: E402

# a stand-in party agent: serve the Unix socket, exit on SIGTERM
AGENT = (
    "import signal, socket, sys, time\n"
    "s = socket.socket(socket.AF_UNIX)\n"
    "s.bind(sys.argv[1])\n"
    "s.listen()\n"
    "signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))\n"
    "while True:\n"
    "    time.sleep(1)\n"
)
DYING_AGENT = "import sys\nprint('stand-in agent gives up')\nsys.exit(1)\n"


def stand_in(i: int, sock: Path) -> list[str]:
    return [sys.executable, "-c", AGENT, str(sock)]


def dying(i: int, sock: Path) -> list[str]:
    return [sys.executable, "-c", DYING_AGENT, str(sock)]


@pytest.fixture(scope="session")
def _used_states():
    r"""Safety net: every state folder handed out is brought down at session end."""
    states: list[Path] = []
    yield states
    for state in states:
        down(state)


@pytest.fixture
def state(tmp_path_factory, _used_states) -> Path:
    path = tmp_path_factory.mktemp("fed") / "state"
    _used_states.append(path)
    yield path
    down(path)


@pytest.fixture(scope="module")
def fed(tmp_path_factory, _used_states):
    r"""One running 2-client federation shared by the read-only tests below."""
    path = tmp_path_factory.mktemp("fed") / "state"
    _used_states.append(path)
    yield up(2, path, agent_command=stand_in, timeout=60)
    down(path)


def _leftovers(state_dir: Path) -> set[int]:
    r"""Live processes started for this federation (children of Flower's included)."""
    marker = f"{STATE_ENV}={Path(state_dir).resolve()}"
    return processes.with_environment(marker, processes.process_table())


def _listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.mark.flower
def test_up_ready_and_recorded(fed):
    state = Path(fed["state_dir"])
    assert fed["ready"] and fed["clients"] == 2
    assert json.loads((state / "federation.json").read_text()) == fed
    names = {"superlink", "agent-0", "agent-1", "supernode-0", "supernode-1"}
    assert set(fed["pids"]) == set(fed["start_times"]) == set(fed["logs"]) == names
    assert set(fed["ports"]) == {"superlink", "supernode-0", "supernode-1"}
    assert len(set(fed["ports"].values())) == 3
    for port in fed["ports"].values():
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
            assert r.status == 200
    assert fed["address"] == f"127.0.0.1:{fed['ports']['superlink']}"
    for name, sock in fed["sockets"].items():
        assert Path(sock).is_socket(), name
    st = status(state)
    assert st["running"] and all(p["alive"] for p in st["processes"].values())
    for name in names:
        assert Path(fed["logs"][name]).parent == state / "logs"


@pytest.mark.flower
def test_node_config_carries_agent_socket_as_str(fed):
    from flwr.common.config import parse_config_args

    argv = fed["argv"]["supernode-1"]
    node_config = parse_config_args([argv[argv.index("--node-config") + 1]])
    assert node_config == {
        "partition-id": 1,
        "num-partitions": 2,
        "agent": fed["sockets"]["agent-1"],
    }


@pytest.mark.flower
def test_flower_config_and_app(fed):
    state = Path(fed["state_dir"])
    with (state / "flwr_home" / "config.toml").open("rb") as f:
        assert tomllib.load(f) == {
            "superlink": {
                "default": "local-deployment",
                "local-deployment": {"address": fed["address"], "insecure": True},
            }
        }
    with (state / "app" / "pyproject.toml").open("rb") as f:
        app = tomllib.load(f)
    assert app["tool"]["flwr"]["app"]["publisher"] == "botorch-fed"
    assert app["tool"]["flwr"]["app"]["components"] == {
        "serverapp": "botorch_fed.flower.server_app:app",
        "clientapp": "botorch_fed.flower.client_app:app",
    }
    config = app["tool"]["flwr"]["app"]["config"]
    assert config == state_folder.APP_CONFIG
    assert isinstance(config["timeout"], float) and isinstance(config["clients"], int)
    # what `flwr run` checks before building the FAB (modules not imported here)
    from flwr.cli.config_utils import load_and_validate

    _, warnings = load_and_validate(state / "app" / "pyproject.toml", check_module=False)
    assert warnings == []


@pytest.mark.flower
def test_children_import_from_the_folder_up_was_called_from(fed):
    assert fed["import_dir"] == os.getcwd()
    for name in ("superlink", "agent-0", "supernode-1"):
        environ = Path(f"/proc/{fed['pids'][name]}/environ").read_bytes().split(b"\0")
        env = dict(e.decode().split("=", 1) for e in environ if b"=" in e)
        assert env["PYTHONPATH"].split(os.pathsep)[0] == fed["import_dir"], name
        assert Path(f"/proc/{fed['pids'][name]}/cwd").resolve() == Path(fed["state_dir"])


def _environ(pid: int) -> dict[str, str]:
    environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(e.decode(errors="replace").split("=", 1) for e in environ if b"=" in e)


@pytest.mark.flower
def test_the_serverapp_learns_its_folder_from_up_not_from_a_run(fed):
    # the SuperLink alone gets the state folder; Flower starts its SuperExec (and, for
    # each run, the ServerApp process) with the SuperLink's environment
    from botorch_fed.flower.run_options import SERVER_DIR_ENV

    state = fed["state_dir"]
    assert (Path(state) / "results").is_dir()
    assert _environ(fed["pids"]["superlink"])[SERVER_DIR_ENV] == state
    for name in ("agent-0", "supernode-0"):
        assert SERVER_DIR_ENV not in _environ(fed["pids"][name]), name
    below = processes.descendants([fed["pids"]["superlink"]], processes.process_table())
    execs = [pid for pid in below if b"superexec" in Path(f"/proc/{pid}/cmdline").read_bytes()]
    assert execs, "the SuperLink started no SuperExec"
    assert all(_environ(pid)[SERVER_DIR_ENV] == state for pid in execs)


@pytest.mark.flower
def test_up_twice_is_refused(fed):
    before = dict(fed["pids"])
    with pytest.raises(launch_errors.FederationRunningError, match="down") as err:
        up(1, fed["state_dir"], agent_command=stand_in)
    assert err.value.state == Path(fed["state_dir"]) and "superlink" in err.value.live
    assert json.loads((Path(fed["state_dir"]) / "federation.json").read_text())["pids"] == before
    assert status(fed["state_dir"])["running"]


@pytest.mark.flower
def test_submit_rejects_undeclared_run_config_keys(fed):
    with pytest.raises(FlowerLaunchError, match="bogus"):
        submit(fed["state_dir"], {"bogus": 1})
    with pytest.raises(TypeError, match="argv"):
        submit(fed["state_dir"], {"argv": ["a"]})
    with pytest.raises(TypeError, match="clients"):
        submit(fed["state_dir"], {"clients": "2"})
    with pytest.raises(TypeError, match="timeout"):
        submit(fed["state_dir"], {"timeout": True})
    assert list((Path(fed["state_dir"]) / "runs").iterdir()) == []  # nothing submitted


@pytest.mark.flower
def test_down_stops_everything(state):
    fed = up(2, state, agent_command=stand_in)
    pids = dict(fed["pids"])
    assert _leftovers(state) >= set(pids.values())
    stopped = down(state)
    assert stopped == ["supernode-0", "supernode-1", "agent-0", "agent-1", "superlink"]
    assert not any(processes.alive(pid, None) for pid in pids.values())
    assert _leftovers(state) == set()  # flower-superexec & co. included
    for port in fed["ports"].values():
        assert not _listening(port)
    assert not any(Path(s).exists() for s in fed["sockets"].values())
    assert Path(fed["logs"]["superlink"]).stat().st_size > 0  # logs kept
    assert not status(state)["running"]
    assert down(state) == []


def _sigkill(fed: dict, *names: str) -> None:
    r"""SIGKILL the recorded processes ``names`` (each alone, as a crash ends it)."""
    for name in names:
        os.kill(fed["pids"][name], signal.SIGKILL)
    for name in names:
        while processes.alive(fed["pids"][name], fed["start_times"][name]):
            time.sleep(0.02)


@pytest.mark.flower
def test_up_restarts_the_processes_sigkill_ended(state):
    # measured: ~11 s (up 3 s; agent + SuperNode 2 s; SuperLink with both SuperNodes
    # 4 s; `flwr supernode list` 2 s)
    t0 = time.monotonic()
    first = up(2, state, agent_command=stand_in)
    _sigkill(first, "agent-0", "supernode-1")
    second = up(2, state, agent_command=stand_in)
    assert second["restarted"] == ["agent-0", "supernode-1"]
    for name in ("superlink", "agent-1", "supernode-0"):
        assert second["pids"][name] == first["pids"][name], name
    _sigkill(second, "superlink")
    third = up(2, state, agent_command=stand_in)
    # Flower 1.41: a restarted SuperLink's SuperNodes must start again to register
    assert third["restarted"] == ["superlink", "supernode-0", "supernode-1"]
    for name in ("agent-0", "agent-1"):
        assert third["pids"][name] == second["pids"][name], name
    assert third["ports"] == first["ports"]
    for port in third["ports"].values():
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
            assert r.status == 200
    # both SuperNodes registered at the new SuperLink, which knows no other
    env = launcher._env_of(third, "supernode-0")
    flwr = Path(sys.executable).parent / "flwr"
    listed = subprocess.run(
        [str(flwr), "supernode", "list", "--format", "json"],
        env=env, cwd=state, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert listed.returncode == 0, listed.stderr
    nodes = json.loads(listed.stdout)["nodes"]
    assert [n["status"] for n in nodes] == ["online", "online"], nodes
    # nothing of the killed processes lives on (a SuperExec watching a dead parent)
    live = list(third["pids"].values())
    ours = set(live) | processes.descendants(live, processes.process_table())
    assert _leftovers(state) <= ours
    assert time.monotonic() - t0 < 40


@pytest.mark.flower
def test_taken_port_starts_nothing(state):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(FlowerLaunchError, match=f"port {port}"):
            up(1, state, port=port, agent_command=stand_in)
    assert not (state / "federation.json").exists()
    assert _leftovers(state) == set()


@pytest.mark.flower
def test_child_dying_at_start_is_named_and_everything_stopped(state):
    with pytest.raises(FlowerLaunchError) as err:
        up(2, state, agent_command=dying, timeout=30)
    msg = str(err.value)
    # both agents die at once: whichever is seen dead first is named
    assert re.match(r"agent-[01] \(pid \d+\) exited with code 1", msg), msg
    assert "stand-in agent gives up" in msg  # the log tail
    assert not status(state)["running"]
    assert _leftovers(state) == set()


def test_down_and_status_without_federation(tmp_path):
    assert down(tmp_path) == []
    assert down(tmp_path / "missing") == []
    assert status(tmp_path) == {
        "state_dir": str(tmp_path.resolve()),
        "address": None,
        "clients": None,
        "running": False,
        "processes": {},
    }


def test_submit_without_federation(tmp_path):
    with pytest.raises(launch_errors.NoFederationError, match="no live federation") as err:
        submit(tmp_path, {})
    assert err.value.state == tmp_path.resolve()
    assert isinstance(err.value, FlowerLaunchError)


# the state folder: another local user must not be able to plant files in it
@pytest.mark.usefixtures("quiet_single_thread")
def test_submit_refuses_a_state_folder_others_can_write(tmp_path):
    state = tmp_path / "botorch-fed-flower-victim"
    state.mkdir()
    os.chmod(state, 0o777)  # as another user would leave it
    evil = tmp_path / "evil"
    evil.mkdir()
    marker = tmp_path / "pwned"
    flwr = evil / "flwr"
    flwr.write_text(f"#!/bin/sh\ntouch {marker}\n")
    flwr.chmod(0o755)
    app = tmp_path / "app"
    app.mkdir()
    (app / "pyproject.toml").write_text("[tool.flwr.app]\npublisher = 'x'\n")
    pid = os.getpid()  # any live process of the victim passes for the SuperLink
    fed = {
        "python": str(evil / "python"),
        "app_dir": str(app),
        "pids": {"superlink": pid},
        "start_times": {"superlink": processes.start_time(pid)},
    }
    (state / "federation.json").write_text(json.dumps(fed))
    try:
        submission.submit(state, {}, stream=lambda line: None)
    except Exception:  # noqa: BLE001 - refused, as it must be
        pass
    assert not marker.exists(), "the victim ran the attacker's `flwr`"


@pytest.mark.usefixtures("quiet_single_thread")
def test_up_makes_a_private_state_folder(tmp_path):
    fake = tmp_path / "bin"
    fake.mkdir()
    for name in ("python", "flower-superlink", "flower-supernode"):
        (fake / name).write_text("#!/bin/sh\nexit 1\n")
        (fake / name).chmod(0o755)
    state = tmp_path / "state"
    old = os.umask(0o022)
    try:
        with pytest.raises(launch_errors.FlowerLaunchError):
            launcher.up(1, state, timeout=5, python=str(fake / "python"))
    finally:
        os.umask(old)
    mode = stat.S_IMODE(os.stat(state).st_mode)
    assert mode & 0o077 == 0, oct(mode)


def test_child_env_puts_the_callers_folder_first_on_pythonpath(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(["/elsewhere", str(tmp_path)]))
    monkeypatch.chdir(tmp_path)
    env = launcher._child_env(tmp_path / "state", sys.executable, launcher._import_dir())
    assert env["PYTHONPATH"].split(os.pathsep) == [str(tmp_path), "/elsewhere"]
    assert env["FLWR_HOME"] == str(tmp_path / "state" / "flwr_home")
    monkeypatch.delenv("PYTHONPATH")
    env = launcher._child_env(tmp_path / "state", sys.executable, str(tmp_path))
    assert env["PYTHONPATH"] == str(tmp_path)
    env = launcher._child_env(tmp_path / "state", sys.executable)  # no folder: unchanged
    assert "PYTHONPATH" not in env


def test_an_objective_next_to_the_caller_imports_in_a_child(tmp_path, monkeypatch):
    # what an agent or the ServerApp does with --objective mymod:f, in a child run as up
    # runs it: in the state folder, with the environment up gives it
    work, state = tmp_path / "work", tmp_path / "state"
    work.mkdir()
    state.mkdir()
    (work / "bfed_user_objective.py").write_text("def f(X):\n    return 42\n")
    monkeypatch.chdir(work)
    env = launcher._child_env(state, sys.executable, launcher._import_dir())
    code = "import bfed_user_objective as m; print(m.f(None))"
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=state, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "42"


def test_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match="clients"):
        up(0, tmp_path)
    with pytest.raises(ValueError, match="port"):
        up(1, tmp_path, port=70000)
    assert not (tmp_path / "federation.json").exists()


def test_long_state_path_uses_short_socket_folder(tmp_path):
    long_state = tmp_path / ("x" * 120)
    sock_dir, temporary = launcher._socket_dir(long_state)
    try:
        assert temporary and len(str(sock_dir / "agent-999.sock")) <= 107
    finally:
        sock_dir.rmdir()
    assert launcher._socket_dir(tmp_path) == (tmp_path / "sockets", False)


# a stand-in `flwr`: `run` names its run and streams until killed; `stop` records it
# (or fails, when a file `stop-fails` lies beside it)
FAKE_FLWR = """#!/bin/sh
here="$(dirname "$0")"
if [ "$1" = stop ]; then
  [ -e "$here/stop-fails" ] && exit 1
  echo "$2 $3" > "$here/stopped"; exit 0
fi
printf 'Loading project configuration\nSuccessfully started run 42\n'
exec sleep 60
"""


@pytest.fixture
def fake_federation(tmp_path):
    r"""A state folder whose federation runs the stand-in ``flwr`` (its ``superlink``
    a sleeping process of this test): ``(state, bin folder)``."""
    bin_dir, state = tmp_path / "bin", tmp_path / "state"
    bin_dir.mkdir()
    state.mkdir(mode=0o700)
    (bin_dir / "flwr").write_text(FAKE_FLWR)
    (bin_dir / "flwr").chmod(0o755)
    link = subprocess.Popen(["sleep", "120"])
    processes.track(link)
    fed = {
        "python": str(bin_dir / "python"),
        "app_dir": str(state_folder._write_app(state / "app").parent),
        "pids": {"superlink": link.pid},
        "start_times": {"superlink": processes.start_time(link.pid)},
    }
    state_folder._write_federation(state, fed)
    yield state, bin_dir
    link.kill()
    link.wait()


def test_a_run_that_times_out_is_stopped_at_the_superlink(fake_federation):
    state, bin_dir = fake_federation
    with pytest.raises(FlowerLaunchError, match="run 42 is stopped at the SuperLink"):
        submit(state, {}, stream=lambda line: None, timeout=2)
    assert (bin_dir / "stopped").read_text().split() == ["42", state_folder.CONNECTION]


@pytest.mark.parametrize(
    "at",
    [
        "Successfully started run",  # as Ctrl-C while the run's lines stream
        "Loading project",  # the first line: the run's id is still in the pipe
    ],
    ids=["after-its-id", "before-its-id-was-read"],
)
def test_ctrl_c_on_submit_stops_the_run_it_started(at, fake_federation):
    state, bin_dir = fake_federation

    def interrupt(line):
        if line.startswith(at):
            raise KeyboardInterrupt

    with pytest.raises(submission.RunInterrupted, match="run 42 is stopped") as err:
        submit(state, {}, stream=interrupt)
    assert err.value.run_id == 42
    assert (bin_dir / "stopped").read_text().split() == ["42", state_folder.CONNECTION]


def test_a_failing_stream_stops_the_run_and_its_error_goes_on(fake_federation):
    state, bin_dir = fake_federation

    def fail(line):
        if "started run" in line:
            raise OSError("the caller's terminal is gone")

    with pytest.raises(OSError, match="terminal is gone"):
        submit(state, {}, stream=fail)
    assert (bin_dir / "stopped").read_text().split() == ["42", state_folder.CONNECTION]


def test_sigterm_on_submit_stops_the_run_and_restores_the_handler(fake_federation):
    state, bin_dir = fake_federation
    caught = []

    def callers_handler(signum, frame):
        caught.append(signum)

    def terminated(line):
        if "started run" in line:
            os.kill(os.getpid(), signal.SIGTERM)

    previous = signal.signal(signal.SIGTERM, callers_handler)
    try:
        with pytest.raises(submission.RunInterrupted, match="run 42 is stopped") as err:
            submit(state, {}, stream=terminated, timeout=20)
        assert signal.getsignal(signal.SIGTERM) is callers_handler
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert caught == []  # submit's own handler took it
    assert err.value.signum == signal.SIGTERM
    assert (bin_dir / "stopped").read_text().split() == ["42", state_folder.CONNECTION]


def test_a_hangup_the_caller_ignores_does_not_stop_the_run(fake_federation):
    # `nohup botorch-fed flower run ...`: closing the terminal must not stop the run
    state, bin_dir = fake_federation

    def hang_up(line):
        if "started run" in line:
            os.kill(os.getpid(), signal.SIGHUP)

    previous = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        with pytest.raises(FlowerLaunchError, match="did not finish within timeout=2"):
            submit(state, {}, stream=hang_up, timeout=2)
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
    except KeyboardInterrupt:  # RunInterrupted: pytest would stop the session on it
        pytest.fail("an ignored SIGHUP stopped the run")
    finally:
        signal.signal(signal.SIGHUP, previous)


def test_a_second_ctrl_c_does_not_cut_stopping_the_run(fake_federation, monkeypatch):
    state, bin_dir = fake_federation
    real_stop = submission._stop_run

    def stop_after_another_ctrl_c(*args):
        os.kill(os.getpid(), signal.SIGINT)  # the user presses Ctrl-C again
        return real_stop(*args)

    monkeypatch.setattr(submission, "_stop_run", stop_after_another_ctrl_c)

    def interrupt(line):
        if "started run" in line:
            raise KeyboardInterrupt

    # Ctrl-C raises here, whatever the test process inherited (a worker may ignore it)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        submit(state, {}, stream=interrupt)
    except submission.RunInterrupted as err:
        assert "run 42 is stopped" in str(err) and err.signum == signal.SIGINT
    except KeyboardInterrupt:  # the second one escaped: the run was not stopped
        pytest.fail("a second Ctrl-C cut stopping the run")
    else:
        pytest.fail("submit was not interrupted")
    finally:
        restored = signal.signal(signal.SIGINT, previous)
    assert (bin_dir / "stopped").read_text().split() == ["42", state_folder.CONNECTION]
    assert restored is signal.default_int_handler  # the caller's handler, back


def test_a_failed_stop_says_the_run_may_still_be_running(fake_federation):
    state, bin_dir = fake_federation
    (bin_dir / "stop-fails").touch()
    with pytest.raises(
        FlowerLaunchError, match=r"failed, so it may still be running: `flwr stop 42"
    ):
        submit(state, {}, stream=lambda line: None, timeout=2)
    assert not (bin_dir / "stopped").exists()


def test_the_app_in_the_deployment_docs_is_the_one_up_writes(tmp_path):
    docs = (Path(__file__).resolve().parents[2] / "docs" / "deployment.md").read_text()
    block = re.search(r"```toml\n# app/pyproject.toml[^\n]*\n(.*?)```", docs, re.DOTALL)
    assert block, "docs/deployment.md shows no app/pyproject.toml"
    written = tomllib.loads(state_folder._write_app(tmp_path / "app").read_text())
    assert tomllib.loads(block.group(1)) == written
