r"""``up`` on a federation some of whose processes died (botorch_fed.flower.launcher):
it restarts exactly the dead ones as they were started, and refuses to change a
federation that still runs; ``up(..., ask_tell=...)`` and ``ask_folder``.

These tests start no Flower: the federation's ``python`` is a folder whose
``flower-superlink`` and ``flower-supernode`` are stand-ins (a few lines that answer
``GET /health`` on the ``--port`` they are given; the SuperLink's also starts a child
that watches it with ``--parent-pid``, as Flower's SuperExec does), and the agents are
stand-ins that bind their socket. Each stand-in notes ``<name> start|ready <pid>`` in an
events file, so the order of a restart can be read back. The test with real Flower
processes is in test_launcher.py (``flower`` marker).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import stat
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

pytest.importorskip("tomli_w")  # up writes the Flower App with it (extra ``flower``)

from botorch_fed.flower import launcher, ports, processes, state_folder  # noqa: E402
from botorch_fed.flower.launch_errors import (  # noqa: E402
    FederationChangedError,
    FederationRunningError,
    FlowerLaunchError,
)
from botorch_fed.flower.launcher import ask_folder, down, up  # noqa: E402
from botorch_fed.flower.ports import free_ports  # noqa: E402

# a stand-in flower-superlink / flower-supernode
SERVER = """#!{python}
import http.server, os, subprocess, sys
from pathlib import Path
argv = sys.argv[1:]
port = int(argv[argv.index("--port") + 1])
name = Path(sys.argv[0]).name.removeprefix("flower-")
if name == "supernode":
    name += "-" + argv[argv.index("--node-config") + 1].split("partition-id=")[1].split()[0]
events = Path(os.environ["BFED_TEST_EVENTS"])
def note(what):
    with events.open("a") as f:
        f.write(f"{{name}} {{what}} {{os.getpid()}}\\n")
note("start")
if (events.parent / f"fail-{{name}}").exists():
    print(f"{{name}} refuses to start", flush=True)
    sys.exit(3)
if name == "superlink":  # as Flower's SuperExec: a child watching its parent's pid
    code = "import time; time.sleep(600)"
    subprocess.Popen([sys.executable, "-c", code, "--parent-pid", str(os.getpid())])
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()
    def log_message(self, *args):
        pass
server = http.server.HTTPServer(("127.0.0.1", port), Health)
print(f"{{name}} serving on port {{port}}", flush=True)
note("ready")
server.serve_forever()
"""

# a stand-in party agent: bind the socket, exit on SIGTERM
AGENT = """
import os, signal, socket, sys, time
from pathlib import Path
name = "agent-" + sys.argv[2]
events = Path(os.environ["BFED_TEST_EVENTS"])
def note(what):
    with events.open("a") as f:
        f.write(f"{name} {what} {os.getpid()}\\n")
note("start")
if (events.parent / f"fail-{name}").exists():
    print(f"{name} refuses to start", flush=True)
    sys.exit(3)
s = socket.socket(socket.AF_UNIX)
s.bind(sys.argv[1])
s.listen()
print(f"{name} listening", flush=True)
note("ready")
signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
while True:
    time.sleep(1)
"""


def agent(i: int, sock: Path) -> list[str]:
    return [sys.executable, "-c", AGENT, str(sock), str(i)]


def flagged_agent(i: int, sock: Path) -> list[str]:
    r"""The same agent with another policy."""
    return [*agent(i, sock), "--allow-masking"]


@dataclass
class Fake:
    python: str
    state: Path
    events: Path

    def up(self, clients: int = 2, **kwargs) -> dict:
        kwargs.setdefault("agent_command", agent)
        return up(clients, self.state, python=self.python, timeout=20, **kwargs)

    def record(self) -> dict:
        return json.loads((self.state / "federation.json").read_text())

    def fail(self, name: str, fails: bool = True) -> None:
        path = self.events.parent / f"fail-{name}"
        path.touch() if fails else path.unlink()

    def order(self) -> list[tuple[str, str]]:
        r"""``(name, start|ready)`` in the order the stand-ins noted them."""
        return [tuple(line.split()[:2]) for line in self.events.read_text().splitlines()]


@pytest.fixture
def fake(tmp_path, monkeypatch):
    r"""A state folder and a ``python`` whose Flower console scripts are stand-ins."""
    monkeypatch.setattr(ports, "PORT_GRACE", 0.5)  # a taken port is named sooner
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python").symlink_to(sys.executable)
    for name in ("flower-superlink", "flower-supernode"):
        (bin_dir / name).write_text(SERVER.format(python=sys.executable))
        (bin_dir / name).chmod(0o755)
    events = tmp_path / "events" / "events.txt"
    events.parent.mkdir()
    events.touch()
    # recorded in federation.json with the rest of the environment at the first up
    monkeypatch.setenv("BFED_TEST_EVENTS", str(events))
    state = tmp_path / "state"
    yield Fake(str(bin_dir / "python"), state, events)
    down(state)


def kill(fed: dict, *names: str) -> None:
    r"""SIGKILL the recorded processes ``names`` (each alone, not its group)."""
    for name in names:
        os.kill(fed["pids"][name], signal.SIGKILL)
    deadline = time.monotonic() + 10
    while any(processes.alive(fed["pids"][n], fed["start_times"][n]) for n in names):
        assert time.monotonic() < deadline, f"{names} outlived SIGKILL"
        time.sleep(0.02)


def healthy(port: int) -> bool:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
        return r.status == 200


def environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(e.decode(errors="replace").split("=", 1) for e in raw if b"=" in e)


def tree(folder: Path) -> dict[str, tuple[bytes, int]]:
    r"""Every file below ``folder``: its bytes and modification time."""
    return {
        str(p.relative_to(folder)): (p.read_bytes(), p.stat().st_mtime_ns)
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def lives(fed: dict, name: str) -> bool:
    return processes.alive(fed["pids"][name], fed["start_times"][name])


ALL = ["superlink", "agent-0", "agent-1", "supernode-0", "supernode-1"]


# ------------------------------------------------------------------ restarts


def test_up_restarts_exactly_the_dead_agent_and_supernode(fake, monkeypatch):
    before = fake.up()
    parties = fake.state / "parties"
    # an agent's state file, the runs it began, an ask/tell journal: never touched
    (parties / "party-0.json").write_text('{"epsilon_spent": 1.5}')
    (parties / "party-0.json.runs").mkdir()
    (parties / "party-0.json.runs" / "run-7").write_text("begun")
    (parties / "party-1-ask").mkdir()
    (parties / "party-1-ask" / "pending-3.json").write_text('{"x": [0.25]}')
    kept = tree(parties)
    old_logs = {n: Path(before["logs"][n]).read_bytes() for n in ("agent-0", "supernode-1")}
    kill(before, "agent-0", "supernode-1")
    fake.events.write_text("")
    monkeypatch.setenv("BFED_TEST_CALLER", "the caller's environment since")

    after = fake.up()

    assert after["restarted"] == ["agent-0", "supernode-1"]
    assert fake.record() == after and after["ready"]
    for name in ALL:
        same = before["pids"][name] == after["pids"][name]
        assert same == (name not in after["restarted"]), name
        assert lives(after, name), name
    assert after["start_times"]["agent-0"] != before["start_times"]["agent-0"]
    # as they were started: command line, environment, ports, sockets
    assert after["argv"] == before["argv"] and after["env"] == before["env"]
    assert after["ports"] == before["ports"] and after["sockets"] == before["sockets"]
    for name in after["restarted"]:
        assert environ(after["pids"][name]) == launcher._env_of(before, name), name
        assert "BFED_TEST_CALLER" not in environ(after["pids"][name])
        argv = before["argv"][name]  # a script's: after its interpreter
        assert processes.command_line(after["pids"][name])[-len(argv) :] == argv, name
    for port in after["ports"].values():
        assert healthy(port)
    assert Path(after["sockets"]["agent-0"]).is_socket()
    # an agent ready before its SuperNode starts
    order = fake.order()
    assert order.index(("agent-0", "ready")) < order.index(("supernode-1", "start"))
    # the logs go on where they were
    for name, old in old_logs.items():
        log = Path(after["logs"][name]).read_bytes()
        assert log.startswith(old) and len(log) > len(old), name
        assert b"botorch-fed up starts " + name.encode() + b" again" in log[len(old) :]
    assert b"agent-0 listening" in Path(after["logs"]["agent-0"]).read_bytes()[len(old) :]
    assert tree(parties) == kept


def test_a_dead_superlink_restarts_first_and_every_supernode_with_it(fake):
    before = fake.up()
    table = processes.process_table()
    below = processes.descendants([before["pids"]["superlink"]], table)
    (superexec,) = [p for p in below if processes.watched_parent(p) == before["pids"]["superlink"]]
    kill(before, "superlink")
    assert processes.alive(superexec, None)  # left behind, as a SIGKILL leaves it
    assert lives(before, "supernode-0") and lives(before, "supernode-1")
    fake.events.write_text("")

    after = fake.up()

    # Flower's SuperNodes exit once a restarted SuperLink refuses their heartbeat
    assert after["restarted"] == ["superlink", "supernode-0", "supernode-1"]
    for name in ("agent-0", "agent-1"):
        assert after["pids"][name] == before["pids"][name]
    for name in ("supernode-0", "supernode-1"):
        assert not lives(before, name)  # the old ones were stopped
    assert all(lives(after, name) for name in ALL)
    assert after["ports"] == before["ports"]
    for port in after["ports"].values():
        assert healthy(port)
    assert not processes.alive(superexec, None), "the dead SuperLink's SuperExec lives on"
    order = fake.order()
    assert order.index(("superlink", "ready")) < min(
        order.index((f"supernode-{i}", "start")) for i in range(2)
    )
    assert fake.record() == after


def test_a_federation_with_no_live_process_restarts_on_its_ports(fake):
    before = fake.up()
    kill(before, *ALL)
    after = fake.up()
    assert after["restarted"] == ALL  # in start order
    assert after["ports"] == before["ports"] and after["argv"] == before["argv"]
    assert all(lives(after, name) for name in ALL)
    # the SuperLink's port taken meanwhile: named, and nothing starts
    kill(after, *ALL)
    recorded = (fake.state / "federation.json").read_bytes()
    port = after["ports"]["superlink"]
    with socket.socket() as taken:
        taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # past TIME_WAIT
        taken.bind(("127.0.0.1", port))
        taken.listen()
        with pytest.raises(FlowerLaunchError, match=f"superlink .* port {port} .* taken"):
            fake.up()
    assert (fake.state / "federation.json").read_bytes() == recorded
    assert not any(lives(after, name) for name in ALL)


def test_a_dead_supernodes_taken_port_is_named_and_nothing_changes(fake):
    before = fake.up()
    kill(before, "supernode-1")
    recorded = (fake.state / "federation.json").read_bytes()
    port = before["ports"]["supernode-1"]
    with socket.socket() as taken:
        taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # past TIME_WAIT
        taken.bind(("127.0.0.1", port))
        taken.listen()
        with pytest.raises(FlowerLaunchError, match=f"supernode-1 .* port {port} .* taken"):
            fake.up()
    assert (fake.state / "federation.json").read_bytes() == recorded
    assert [lives(before, n) for n in ALL] == [True, True, True, True, False]


def test_a_failed_restart_stops_what_it_started_and_keeps_the_rest(fake):
    before = fake.up()
    kill(before, "agent-0", "supernode-0")
    fake.fail("supernode-0")
    with pytest.raises(FlowerLaunchError, match=r"supernode-0 \(pid \d+\) exited with code 3"):
        fake.up()
    failed = fake.record()
    assert not lives(failed, "agent-0")  # restarted by that call, stopped again
    for name in ("superlink", "agent-1", "supernode-1"):
        assert failed["pids"][name] == before["pids"][name] and lives(failed, name)
    fake.fail("supernode-0", False)
    after = fake.up()
    assert after["restarted"] == ["agent-0", "supernode-0"]
    assert all(lives(after, name) for name in ALL)


def test_the_error_shows_the_log_of_the_failed_start_only(fake):
    before = fake.up()
    kill(before, "supernode-0")
    fake.fail("supernode-0")
    with pytest.raises(FlowerLaunchError) as err:
        fake.up()
    assert "supernode-0 refuses to start" in str(err.value)
    assert "serving on port" not in str(err.value)  # the earlier process's lines


def test_every_process_alive_is_refused(fake):
    before = fake.up()
    recorded = (fake.state / "federation.json").read_bytes()
    for kwargs in ({}, {"clients": 3}, {"ask_tell": (0,)}):
        with pytest.raises(FederationRunningError, match="down") as err:
            fake.up(**kwargs)
        assert sorted(err.value.live) == sorted(ALL)
    assert (fake.state / "federation.json").read_bytes() == recorded
    assert all(lives(before, name) for name in ALL)


@pytest.mark.parametrize(
    ("change", "phrase"),
    [
        ({"clients": 3}, "clients=3, but it has 2 parties"),
        ({"port": "free"}, "but its SuperLink listens on port"),
        ({"agent_command": flagged_agent}, "agent-0, agent-1 would start with --allow-masking"),
        ({"ask_tell": (1,)}, "agent-1 would start with --ask-tell"),
    ],
    ids=["clients", "port", "policy", "ask-tell"],
)
def test_other_arguments_on_a_partly_live_federation_are_refused(change, phrase, fake):
    before = fake.up()
    kill(before, "agent-0")
    recorded = (fake.state / "federation.json").read_bytes()
    if change.get("port") == "free":
        change = {"port": free_ports(1)[0]}
    with pytest.raises(FederationChangedError, match="down") as err:
        fake.up(**change)
    assert phrase in str(err.value)
    assert err.value.state == fake.state.resolve() and "superlink" in err.value.live
    assert (fake.state / "federation.json").read_bytes() == recorded
    assert not lives(before, "agent-0")  # nothing restarted
    assert all(lives(before, n) for n in ALL if n != "agent-0")


def test_other_arguments_with_nothing_alive_start_a_new_federation(fake):
    before = fake.up()
    kill(before, *ALL)
    after = fake.up(3)
    assert after["clients"] == 3 and after["restarted"] == [] and after["ready"]
    assert len(after["pids"]) == 7 and all(lives(after, n) for n in after["pids"])


def test_after_down_up_starts_afresh(fake):
    before = fake.up()
    old_log = Path(before["logs"]["superlink"]).read_bytes()
    assert down(fake.state) == ["supernode-0", "supernode-1", "agent-0", "agent-1", "superlink"]
    assert fake.record()["ready"] is False
    after = fake.up()
    assert after["restarted"] == [] and after["ready"]
    assert not set(after["pids"].values()) & set(before["pids"].values())
    assert Path(after["logs"]["superlink"]).read_bytes().startswith(old_log)  # appended


def test_federation_json_is_private(fake):
    fake.up()
    mode = stat.S_IMODE((fake.state / "federation.json").stat().st_mode)
    assert mode == 0o600, oct(mode)  # it holds the children's environment


# -------------------------------------------------------- what up compares


def _record(tmp_path: Path, flags: tuple[str, ...], ask: tuple[int, ...] = ()) -> dict:
    r"""What federation.json records of 2 default agents with the policy ``flags``."""
    fed = {
        "state_dir": str(tmp_path),
        "clients": 2,
        "address": "127.0.0.1:9000",
        "ports": {"superlink": 9000, "supernode-0": 9001, "supernode-1": 9002},
        "sockets": {f"agent-{i}": str(tmp_path / f"agent-{i}.sock") for i in range(2)},
    }
    fed["argv"] = state_folder._command_lines(fed, sys.executable, _agent(tmp_path, flags), ask)
    return fed


def _agent(state: Path, flags: tuple[str, ...]):
    return launcher._default_agent_command(sys.executable, state, 2, flags)


def test_changed_policy_flags_are_named(tmp_path):
    fed = _record(tmp_path, ("--allow-plaintext", "--max-epsilon", "1.0"))

    def changes(port=None, flags=(), state=tmp_path, clients=2):
        command = _agent(state, flags)
        return state_folder._changes(fed, state, clients, port, sys.executable, command, ())

    assert changes(flags=("--allow-masking", "--max-epsilon", "2.0")) == [
        "agent-0, agent-1 would start --allow-masking instead of --allow-plaintext, "
        "--max-epsilon 2.0 instead of --max-epsilon 1.0"
    ]
    assert changes(flags=("--allow-plaintext",)) == [
        "agent-0, agent-1 would start without --max-epsilon 1.0"
    ]
    assert changes(9000, ("--allow-plaintext", "--max-epsilon", "1.0")) == []
    assert changes(9005, ("--allow-plaintext", "--max-epsilon", "1.0")) == [
        "port=9005, but its SuperLink listens on port 9000"
    ]
    assert changes(clients=3) == ["clients=3, but it has 2 parties"]
    assert changes(state=tmp_path / "x") == [
        f"its federation.json was written for the folder {tmp_path}"
    ]


# -------------------------------------------------------------------- ask/tell


def test_ask_tell_appends_each_listed_partys_ask_folder(fake):
    fed = fake.up(3, ask_tell=[2, 0])
    state = fake.state.resolve()
    for i in (0, 2):
        assert fed["argv"][f"agent-{i}"][-2:] == ["--ask-tell", str(ask_folder(state, i))]
    assert "--ask-tell" not in fed["argv"]["agent-1"]
    assert ask_folder(fake.state, 2) == state / "parties" / "party-2-ask"
    # a restarted agent keeps it
    kill(fed, "agent-2")
    after = fake.up(3, ask_tell=(0, 2))
    assert after["restarted"] == ["agent-2"] and after["argv"] == fed["argv"]


def test_the_default_agent_gets_ask_tell_after_its_policy(tmp_path):
    fed = _record(tmp_path, ("--allow-masking",), ask=(1,))
    assert fed["argv"]["agent-1"][-3:] == [
        "--allow-masking",
        "--ask-tell",
        str(tmp_path / "parties" / "party-1-ask"),
    ]
    assert fed["argv"]["agent-0"][-1] == "--allow-masking"


@pytest.mark.parametrize(
    ("ask_tell", "message"),
    [
        ((3,), "ask_tell names party 3, but clients=3 has parties 0..2"),
        ((-1,), "ask_tell names party -1"),
        ((1, 0, 1), "ask_tell names party 1 twice"),
        ("all", "ask_tell must be a sequence of party indices"),
        (1, "ask_tell must be a sequence of party indices"),
        ((True,), "ask_tell must hold party indices (ints), got True"),
        ((1.0,), "ask_tell must hold party indices (ints), got 1.0"),
    ],
)
def test_bad_ask_tell(ask_tell, message, tmp_path):
    with pytest.raises(ValueError) as err:
        up(3, tmp_path / "state", ask_tell=ask_tell)
    assert message in str(err.value)
    assert not (tmp_path / "state").exists()  # refused before anything


def test_ask_folder_checks_its_index_and_the_folder(tmp_path):
    assert ask_folder(tmp_path, 0) == tmp_path.resolve() / "parties" / "party-0-ask"
    for bad in (-1, True, 1.5, "0"):
        with pytest.raises(ValueError, match="index must be a party index"):
            ask_folder(tmp_path, bad)
    open_folder = tmp_path / "open"
    open_folder.mkdir()
    open_folder.chmod(0o777)
    with pytest.raises(FlowerLaunchError, match="open to other users"):
        ask_folder(open_folder, 0)


# ----------------------------------------------- another user's socket folder


def test_a_recreated_socket_folder_must_be_private(tmp_path):
    # a temporary socket folder gone after a reboot is made again under the same name
    # in /tmp: one that another user planted there could serve a fake agent's socket
    made = state_folder._private_dir(tmp_path / "bfed-x", "the agents' socket folder")
    assert stat.S_IMODE(made.stat().st_mode) == 0o700
    planted = tmp_path / "bfed-y"
    planted.mkdir()
    planted.chmod(0o777)
    with pytest.raises(FlowerLaunchError, match="open to other users"):
        state_folder._private_dir(planted, "the agents' socket folder")
    (tmp_path / "bfed-z").symlink_to(made)
    with pytest.raises(FlowerLaunchError, match="not a folder"):
        state_folder._private_dir(tmp_path / "bfed-z", "the agents' socket folder")


def test_a_restart_refuses_an_open_temporary_socket_folder(fake, monkeypatch):
    monkeypatch.setattr(launcher, "_SOCKET_PATH_MAX", 10)  # a long state path
    fed = fake.up()
    assert fed["socket_dir_temporary"]
    kill(fed, "agent-1")
    Path(fed["socket_dir"]).chmod(0o777)
    try:
        with pytest.raises(FlowerLaunchError, match="socket folder .* open to other users"):
            fake.up()
        assert not lives(fake.record(), "agent-1")
    finally:
        Path(fed["socket_dir"]).chmod(0o700)
