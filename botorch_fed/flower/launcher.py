r"""Process launcher of a loopback Flower federation (``flwr`` 1.41, extra ``flower``).

One federation lives in a *state directory*; :func:`up` starts on ``127.0.0.1``

- one SuperLink (``flower-superlink``, one HTTP port for the Fleet, Control and
  Runtime APIs), with :data:`~.run_options.SERVER_DIR_ENV` set to the state
  directory: the ServerApp processes Flower starts under it inherit it and keep a run's
  files there (``results/``, ``keys/``), never where the run config says,
- ``clients`` party agents (``python -m botorch_fed.flower.party``), each serving a
  Unix socket that the ClientApp of its SuperNode talks to,
- ``clients`` SuperNodes (``flower-supernode``), SuperNode ``i`` with the node config
  ``partition-id=i num-partitions=N agent="<socket of agent i>"``,

each running in the state directory with the folder :func:`up` was called from first
on its PYTHONPATH (where a run's ``--objective`` module is found), and writes the
Flower configuration (``flwr_home/config.toml``, connection ``local-deployment``) and
the Flower App (``app/pyproject.toml``) that :func:`submit` runs with ``flwr run``.
:func:`down` stops what :func:`up` recorded in ``federation.json``; :func:`status`
reports it.

Layout of a state directory::

    federation.json      the description returned by up (pids, ports, sockets, logs)
    flwr_home/           FLWR_HOME of every child (config.toml, Flower's own state)
    app/pyproject.toml   the Flower App (components live in the installed botorch_fed)
    logs/<name>.log      stdout + stderr of each child (kept by down)
    keys/                the parties' key folder (``--key-dir``)
    parties/party-<i>.json  each agent's --state-file (the LDP epsilon spent; the runs
                         it began in party-<i>.json.runs)
    sockets/             the agents' Unix sockets (a short temporary folder instead
                         when the state path is too long for a socket address)
    runs/<id>.toml       run configs written by submit
    results/<out>        a run's results JSON (or <out>.error), written by the
                         ServerApp under the name its run config's ``out`` gives

The module imports neither torch nor flwr: it only starts processes.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from queue import Empty, Queue
from typing import Any

from botorch_fed.flower.processes import (
    alive,
    descendants,
    exit_code,
    process_table,
    start_time,
    terminate,
    track,
)
from botorch_fed.flower.run_options import RESULTS_DIR, RUN_CONFIG_DEFAULTS, SERVER_DIR_ENV

__all__ = [
    "APP_CONFIG",
    "CONNECTION",
    "FederationRunningError",
    "FlowerLaunchError",
    "NoFederationError",
    "RunInterrupted",
    "down",
    "status",
    "submit",
    "up",
]

HOST = "127.0.0.1"
CONNECTION = "local-deployment"
FEDERATION_FILE = "federation.json"
#: run-config keys of the Flower App and their defaults (declared in its pyproject.toml;
#: ``flwr run`` rejects overrides of keys not declared there)
APP_CONFIG: dict[str, str | int | float | bool] = dict(RUN_CONFIG_DEFAULTS)
#: marks every process started by ``up`` (inherited by Flower's own subprocesses),
#: so ``down`` also finds descendants that were re-parented away from their parent.
STATE_ENV = "BOTORCH_FED_FLOWER_STATE"

_POLL = 0.1
_LOG_TAIL = 20
_SOCKET_PATH_MAX = 100  # sun_path holds 108 bytes; keep a margin

AgentCommand = Callable[[int, Path], list[str]]


class FlowerLaunchError(RuntimeError):
    r"""A Flower federation could not be started, reached or stopped."""


class NoFederationError(FlowerLaunchError):
    r"""A state folder has no live federation (no SuperLink running): :func:`submit`.

    Attributes:
        state: The state folder (resolved).
    """

    def __init__(self, state: Path) -> None:
        self.state = state
        super().__init__(
            f"no live federation in {state}: start one with up(clients, {str(state)!r})"
        )


class FederationRunningError(FlowerLaunchError):
    r"""A state folder already has a running federation: :func:`up`.

    Attributes:
        state: The state folder (resolved).
        live: Names of its processes that still run.
    """

    def __init__(self, state: Path, live: list[str]) -> None:
        self.state = state
        self.live = list(live)
        super().__init__(
            f"{state} already has a running federation ({', '.join(live)}); run "
            f"down({str(state)!r}) first, or give up() another state folder for a second one"
        )


# --------------------------------------------------------------------- processes


def _marked(state: Path, table: dict[int, tuple[int, int]]) -> set[int]:
    r"""Live pids whose environment carries this federation's :data:`STATE_ENV`."""
    marker = f"{STATE_ENV}={state}".encode()
    found = set()
    for pid in table:
        if pid == os.getpid():
            continue
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            continue
        if marker in environ.split(b"\0"):
            found.add(pid)
    return found


# ------------------------------------------------------------------ state files


def _state(state_dir: str | os.PathLike[str], create: bool = False) -> Path:
    r"""The state folder, private to this user: created ``0700`` (``create``); an
    existing one must be ours and closed to others, since ``run`` executes what its
    ``federation.json`` names and ``down`` signals the pids it lists.

    Raises:
        FlowerLaunchError: The folder belongs to another user, or others can write into
            it or read it.
    """
    state = Path(state_dir).expanduser().resolve()
    if create and not state.exists():
        state.mkdir(parents=True, mode=0o700)
    if state.exists():
        info = state.stat()
        if info.st_uid != os.getuid():
            raise FlowerLaunchError(
                f"The state folder {state} belongs to another user (uid {info.st_uid}): "
                "give a folder of your own (--state-dir)."
            )
        if info.st_mode & 0o077:
            raise FlowerLaunchError(
                f"The state folder {state} is open to other users (mode "
                f"{oct(info.st_mode & 0o777)}): `chmod 700 {state}`, or give another folder."
            )
    return state


def _read_federation(state: Path) -> dict[str, Any] | None:
    r"""The description in ``<state>/federation.json``, ``None`` when there is none."""
    path = state / FEDERATION_FILE
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except json.JSONDecodeError as err:
        raise FlowerLaunchError(f"{path} is not valid JSON: {err}") from err


def _write_federation(state: Path, fed: dict[str, Any]) -> None:
    r"""Write ``fed`` to ``<state>/federation.json`` atomically (rename)."""
    tmp = state / f".{FEDERATION_FILE}.tmp"
    tmp.write_text(json.dumps(fed, indent=2, sort_keys=True) + "\n")
    tmp.replace(state / FEDERATION_FILE)


def _live_names(fed: dict[str, Any]) -> list[str]:
    r"""Names of the recorded processes of ``fed`` that still run."""
    starts = fed.get("start_times", {})
    return [n for n, pid in fed.get("pids", {}).items() if alive(pid, starts.get(n))]


def _log_tail(path: Path, lines: int = _LOG_TAIL) -> str:
    r"""The last ``lines`` lines of the log ``path`` (a note if it is empty/missing)."""
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        return f"(no log at {path})"
    tail = text.splitlines()[-lines:]
    return "\n".join(tail) if tail else f"({path} is empty)"


def _toml_string(value: str) -> str:
    r"""A TOML basic string of ``value`` (for ``--node-config``; no escapes needed)."""
    if any(c in value for c in "\"\\'\n\r\t"):
        raise FlowerLaunchError(
            f"path {value!r} cannot be passed in --node-config: it holds a quote, "
            "a backslash or a control character"
        )
    return f'"{value}"'


def _write_flower_config(flwr_home: Path, port: int) -> Path:
    r"""Write ``<flwr_home>/config.toml`` naming this SuperLink ``local-deployment``."""
    flwr_home.mkdir(parents=True, exist_ok=True)
    path = flwr_home / "config.toml"
    path.write_text(
        "[superlink]\n"
        f'default = "{CONNECTION}"\n\n'
        f"[superlink.{CONNECTION}]\n"
        f'address = "{HOST}:{port}"\n'
        "insecure = true\n"
    )
    return path


def _write_app(app_dir: Path) -> Path:
    r"""Write the Flower App ``<app_dir>/pyproject.toml`` (no code: botorch_fed is
    installed where the SuperLink and SuperNodes run).

    ``flwr run`` requires ``[project]`` ``name`` and ``version`` and
    ``[tool.flwr.app]`` ``publisher`` and ``components`` (``serverapp``,
    ``clientapp``); ``description`` and ``license`` only silence warnings.
    """
    import tomli_w  # a dependency of flwr, so part of the ``flower`` extra

    app_dir.mkdir(parents=True, exist_ok=True)
    doc = {
        "project": {
            "name": "botorch-fed-app",
            "version": "1.0.0",
            "description": "botorch-fed federation run through Flower",
            "license": "MIT",
            "dependencies": ["flwr>=1.41.0"],
        },
        "tool": {
            "flwr": {
                "app": {
                    "publisher": "botorch-fed",
                    "components": {
                        "serverapp": "botorch_fed.flower.server_app:app",
                        "clientapp": "botorch_fed.flower.client_app:app",
                    },
                    "config": dict(APP_CONFIG),
                }
            }
        },
    }
    path = app_dir / "pyproject.toml"
    path.write_text(tomli_w.dumps(doc))
    return path


# ----------------------------------------------------------------------- ports


def _free_ports(count: int) -> list[int]:
    r"""``count`` distinct free TCP ports on :data:`HOST`, chosen by the OS."""
    socks = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind((HOST, 0))
            socks.append(sock)
        return [s.getsockname()[1] for s in socks]
    finally:
        for sock in socks:
            sock.close()


def _check_port_free(port: int) -> None:
    r"""Raise :class:`FlowerLaunchError` naming ``port`` if it cannot be bound."""
    if not isinstance(port, int) or isinstance(port, bool) or not 0 < port < 65536:
        raise ValueError(f"port must be an int in 1..65535, got {port!r}")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # as uvicorn does, so a TIME_WAIT leftover does not count as taken
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((HOST, port))
        except OSError as err:
            raise FlowerLaunchError(
                f"port {port} on {HOST} is taken ({err.strerror}); pick another "
                "port or leave port=None for a free one"
            ) from None


def _health(port: int) -> bool:
    r"""Whether ``GET http://127.0.0.1:<port>/health`` answers 200."""
    try:
        with urllib.request.urlopen(f"http://{HOST}:{port}/health", timeout=0.5) as r:
            return r.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


# ------------------------------------------------------------------------- up


#: the module ``python -m`` runs as a party's agent
AGENT_MODULE = "botorch_fed.flower.party"


def _default_agent_command(
    python: str, state: Path, num: int, flags: tuple[str, ...] = ()
) -> AgentCommand:
    r"""The party agent command: ``python -m botorch_fed.flower.party ... *flags``."""

    def command(i: int, sock: Path) -> list[str]:
        return [
            python, "-m", AGENT_MODULE,
            "--socket", str(sock),
            "--partition-id", str(i),
            "--num-partitions", str(num),
            "--key-dir", str(state / "keys"),
            "--state-file", str(state / "parties" / f"party-{i}.json"),
            *flags,
        ]  # fmt: skip

    return command


def _import_dir() -> str | None:
    r"""The folder :func:`up` is called from (``None`` if it no longer exists)."""
    try:
        return os.getcwd()
    except OSError:
        return None


def _child_env(state: Path, python: str, import_dir: str | None = None) -> dict[str, str]:
    r"""Environment of the children: ``python``'s bin dir first on PATH (the Flower
    console scripts, which also start ``flower-superexec`` by name), ``import_dir``
    first on PYTHONPATH (the children run in ``state``, so a run's ``--objective
    mymod:f`` next to where ``up`` was called is found by the agents and, through
    Flower's own subprocesses, the ServerApp), FLWR_HOME, unbuffered output, no
    telemetry, SuperExec polling every 0.25 s, and the :data:`STATE_ENV` marker."""
    env = dict(os.environ)
    bin_dir = str(Path(python).parent)
    env["PATH"] = os.pathsep.join([bin_dir, env.get("PATH", "")]).rstrip(os.pathsep)
    if import_dir:
        paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
        env["PYTHONPATH"] = os.pathsep.join([import_dir, *(p for p in paths if p != import_dir)])
    env["FLWR_HOME"] = str(state / "flwr_home")
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("FLWR_TELEMETRY_ENABLED", "0")
    # SuperExec polls for tasks every second by default and every message waits for
    # it; 0.25 s, as Flower's own runtime polls (measured on 2 cores: an idle 3-party
    # federation keeps 10% of the CPUs busy at 0.1 s, 4% at 0.25 s)
    env.setdefault("FLWR_SUPEREXEC_TASK_POLL_INTERVAL", "0.25")
    env[STATE_ENV] = str(state)
    return env


def _console_script(python: str, name: str) -> str:
    r"""Path of the console script ``name`` next to ``python`` (error if missing)."""
    path = Path(python).parent / name
    if not os.access(path, os.X_OK):
        raise FlowerLaunchError(
            f"{name} not found next to python={python!r} (looked for {path}); "
            "install the extra: pip install 'botorch-fed[flower]'"
        )
    return str(path)


def _socket_dir(state: Path) -> tuple[Path, bool]:
    r"""Folder of the agents' sockets and whether it is a temporary one (the state
    path is too long for a Unix socket address)."""
    sockets = state / "sockets"
    if len(str(sockets / "agent-999.sock")) <= _SOCKET_PATH_MAX:
        return sockets, False
    return Path(tempfile.mkdtemp(prefix="bfed-")), True


def _spawn(
    fed: dict[str, Any], state: Path, name: str, argv: list[str], env: dict[str, str]
) -> int:
    r"""Start ``argv`` as ``name`` (own session, log file, no stdin) and record it
    in ``fed`` and ``federation.json`` at once."""
    log = state / "logs" / f"{name}.log"
    with log.open("wb") as out:
        try:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=state,
                start_new_session=True,
            )
        except OSError as err:
            raise FlowerLaunchError(f"cannot start {name} ({argv[0]}): {err}") from err
    track(proc)
    fed["pids"][name] = proc.pid
    fed["start_times"][name] = start_time(proc.pid)
    fed["logs"][name] = str(log)
    fed["argv"][name] = argv
    _write_federation(state, fed)
    return proc.pid


def _died(fed: dict[str, Any]) -> str | None:
    r"""Error text for the first recorded process that is no longer running."""
    for name, pid in fed["pids"].items():
        if not alive(pid, fed["start_times"].get(name)):
            code = exit_code(pid)
            how = "exited" if code is None else f"exited with code {code}"
            log = Path(fed["logs"][name])
            return (
                f"{name} (pid {pid}) {how} during start-up; last lines of {log}:\n{_log_tail(log)}"
            )
    return None


def _wait_ready(fed: dict[str, Any], timeout: float) -> None:
    r"""Poll until the SuperLink and SuperNodes answer ``/health`` and every agent
    socket exists; raise :class:`FlowerLaunchError` when a child dies or on timeout."""
    deadline = time.monotonic() + timeout
    ports = fed["ports"]
    pending: dict[str, Callable[[], bool]] = {
        name: (lambda p=port: _health(p)) for name, port in ports.items()
    }
    for name, path in fed["sockets"].items():
        pending[name] = lambda p=path: Path(p).exists()
    while True:
        if (err := _died(fed)) is not None:
            raise FlowerLaunchError(err)
        pending = {name: ready for name, ready in pending.items() if not ready()}
        if not pending:
            return
        if time.monotonic() > deadline:
            waiting = ", ".join(f"{n} (log {fed['logs'][n]})" for n in sorted(pending))
            raise FlowerLaunchError(
                f"federation in {fed['state_dir']} not ready after timeout={timeout} s;"
                f" still waiting for: {waiting}"
            )
        time.sleep(_POLL)


def _check_args(clients: int, timeout: float, python: str) -> None:
    if not isinstance(clients, int) or isinstance(clients, bool) or clients < 1:
        raise ValueError(f"clients must be an int >= 1, got {clients!r}")
    if not timeout > 0:
        raise ValueError(f"timeout must be > 0 seconds, got {timeout!r}")
    if not os.access(python, os.X_OK):
        raise FlowerLaunchError(f"python={python!r} is not an executable")


def _refuse_live(state: Path) -> None:
    r"""Raise if ``state`` already has a federation with a live process."""
    fed = _read_federation(state)
    if fed is not None and (live := _live_names(fed)):
        raise FederationRunningError(state, live)


def up(
    clients: int,
    state_dir: str | os.PathLike[str],
    *,
    port: int | None = None,
    timeout: float = 60.0,
    python: str = sys.executable,
    agent_command: AgentCommand | None = None,
    agent_flags: Sequence[str] = (),
) -> dict[str, Any]:
    r"""Start a loopback Flower federation of ``clients`` parties and wait until ready.

    Starts the SuperLink, ``clients`` party agents and ``clients`` SuperNodes, each
    in its own process group with its output in ``<state_dir>/logs/<name>.log``
    (names ``superlink``, ``agent-<i>``, ``supernode-<i>``), recording them in
    ``<state_dir>/federation.json`` as they start. The children run in ``state_dir``;
    the folder ``up`` is called from goes first on their PYTHONPATH (``import_dir``
    in the description), so a run's ``--objective mymod:f`` written there is found
    by the agents and the ServerApp. Ready means: the SuperLink and every SuperNode
    answer ``GET /health`` with 200 and every agent has created its socket. Whether
    the SuperNodes registered at the SuperLink is left to the ServerApp. The SuperLink
    alone gets :data:`~.run_options.SERVER_DIR_ENV` = ``state_dir`` (its SuperExec
    and ServerApp processes inherit it): a run's results go to ``<state_dir>/results/``
    and its server key is read from ``<state_dir>/keys/``, whatever the run config says.

    Args:
        clients: Number of parties (SuperNodes and agents), at least 1.
        state_dir: Folder of the federation (created if missing).
        port: SuperLink HTTP port (Fleet, Control and Runtime APIs); ``None`` picks a
            free one. SuperNode Runtime API ports are always picked free.
        timeout: Seconds to wait for readiness.
        python: Interpreter for the agents; its bin dir holds the Flower console
            scripts and goes first on the children's PATH.
        agent_command: ``(partition id, socket path) -> argv`` of an agent, for
            tests; default ``[python, -m, botorch_fed.flower.party, ...]``.
        agent_flags: Extra flags of every default agent, passed as given: its policy
            (``--allow-plaintext``, ``--allow-masking``, ``--allow-crypto-seed``,
            ``--allow-objective M:F@lo,hi;...``, ``--share-results``, ...;
            :func:`~botorch_fed.flower.policy.policy_flags` makes them from ``flower
            up``'s flags; :class:`~botorch_fed.flower.policy.PartyPolicy`).

    Returns:
        The federation description (what ``federation.json`` holds): ``state_dir``,
        ``address``, ``clients``, ``ports``/``sockets``/``pids``/``start_times``/
        ``logs``/``argv`` by process name, ``flwr_home``, ``flower_config``,
        ``app_dir``, ``key_dir``, ``import_dir``, ``connection``, ``ready``,
        ``startup_s``.

    Raises:
        ValueError: If ``clients``, ``timeout`` or ``port`` is malformed.
        FlowerLaunchError: If ``port`` is taken or the state folder already has a
            live federation (:class:`FederationRunningError`; nothing started then),
            or a process died during start-up or ``timeout`` passed (everything
            started is stopped then; the message names the process and its log tail).
    """
    t0 = time.monotonic()
    _check_args(clients, timeout, python)
    if port is not None:
        _check_port_free(port)
    state = _state(state_dir, create=True)
    _refuse_live(state)
    superlink_bin = _console_script(python, "flower-superlink")
    supernode_bin = _console_script(python, "flower-supernode")

    free = _free_ports(clients + (port is None))
    link_port = free.pop() if port is None else port
    sock_dir, sock_tmp = _socket_dir(state)
    for sub in ("logs", "keys", "parties", "runs", RESULTS_DIR, "flwr_home"):
        (state / sub).mkdir(exist_ok=True)
    sock_dir.mkdir(exist_ok=True)
    fed: dict[str, Any] = {
        "state_dir": str(state),
        "address": f"{HOST}:{link_port}",
        "connection": CONNECTION,
        "clients": clients,
        "python": python,
        "flwr_home": str(state / "flwr_home"),
        "flower_config": str(_write_flower_config(state / "flwr_home", link_port)),
        "app_dir": str(_write_app(state / "app").parent),
        "key_dir": str(state / "keys"),
        "import_dir": _import_dir(),
        "socket_dir": str(sock_dir),
        "socket_dir_temporary": sock_tmp,
        "ports": {"superlink": link_port},
        "sockets": {},
        "pids": {},
        "start_times": {},
        "logs": {},
        "argv": {},
        "ready": False,
    }
    for i in range(clients):
        fed["ports"][f"supernode-{i}"] = free[i]
        fed["sockets"][f"agent-{i}"] = str(sock_dir / f"agent-{i}.sock")
        Path(fed["sockets"][f"agent-{i}"]).unlink(missing_ok=True)  # stale
    _write_federation(state, fed)

    agent = agent_command or _default_agent_command(python, state, clients, tuple(agent_flags))
    env = _child_env(state, python, fed["import_dir"])
    try:
        _spawn(fed, state, "superlink", [
            superlink_bin, "--insecure", "--disable-runtime-dependency-installation",
            "--host", HOST, "--port", str(link_port),
        ], {**env, SERVER_DIR_ENV: str(state)})  # fmt: skip
        for i in range(clients):
            sock = Path(fed["sockets"][f"agent-{i}"])
            _spawn(fed, state, f"agent-{i}", [str(a) for a in agent(i, sock)], env)
        for i in range(clients):
            node_config = (
                f"partition-id={i} num-partitions={clients} "
                f"agent={_toml_string(fed['sockets'][f'agent-{i}'])}"
            )
            _spawn(fed, state, f"supernode-{i}", [
                supernode_bin, "--insecure", "--superlink", fed["address"],
                "--node-config", node_config,
                "--host", HOST, "--port", str(fed["ports"][f"supernode-{i}"]),
            ], env)  # fmt: skip
        _wait_ready(fed, timeout)
    except BaseException:
        _stop(state, fed)
        raise
    fed["ready"] = True
    fed["startup_s"] = round(time.monotonic() - t0, 3)
    _write_federation(state, fed)
    return fed


# ----------------------------------------------------------------------- down


_STOP_ORDER = ("supernode-", "agent-", "superlink")


def _stop(state: Path, fed: dict[str, Any]) -> list[str]:
    r"""Stop the recorded processes of ``fed`` and their descendants; return the
    names of the recorded ones that were running."""
    table = process_table()
    starts = fed.get("start_times", {})
    live = {n: pid for n, pid in fed.get("pids", {}).items() if alive(pid, starts.get(n))}
    roots = list(live.values())
    # Flower's own processes (flower-superexec, flwr-serverapp, flwr-clientapp), some
    # in sessions of their own, found before any parent dies and re-parents them.
    extra = (descendants(roots, table) | _marked(state, table)) - set(roots)
    extra.discard(os.getpid())
    stopped: list[str] = []
    for prefix in _STOP_ORDER:
        batch = {n: pid for n, pid in live.items() if n.startswith(prefix)}
        if prefix == "superlink":  # last: with whatever else is left
            batch_procs = {pid: starts.get(n) for n, pid in batch.items()}
            batch_procs |= {pid: table[pid][1] for pid in extra if pid in table}
        else:
            batch_procs = {pid: starts.get(n) for n, pid in batch.items()}
            below = descendants(list(batch.values()), table) & extra
            batch_procs |= {pid: table[pid][1] for pid in below}
            extra -= below
        terminate(batch_procs)
        stopped += sorted(batch)
    others = sorted(set(live) - set(stopped))  # names outside the known prefixes
    terminate({live[n]: starts.get(n) for n in others})
    stopped += others
    for path in fed.get("sockets", {}).values():
        Path(path).unlink(missing_ok=True)
    if fed.get("socket_dir_temporary"):
        shutil.rmtree(fed["socket_dir"], ignore_errors=True)
    return stopped


def down(state_dir: str | os.PathLike[str]) -> list[str]:
    r"""Stop the federation recorded in ``<state_dir>/federation.json``.

    SuperNodes first, then agents, then the SuperLink: each recorded process group
    gets SIGTERM, then SIGKILL after 3 s. Flower's own subprocesses (SuperExecs,
    ServerApp/ClientApp processes) are stopped with their parents. Only processes
    whose start time still matches the record are signalled (no pid reuse). Logs
    and ``federation.json`` are kept; agent sockets are removed.

    Args:
        state_dir: The federation's folder.

    Returns:
        Names of the recorded processes that were running and are now stopped;
        ``[]`` when nothing ran (or there is no federation there).
    """
    state = _state(state_dir)
    fed = _read_federation(state)
    if fed is None:
        return []
    return _stop(state, fed)


def status(state_dir: str | os.PathLike[str]) -> dict[str, Any]:
    r"""Whether each recorded process of the federation in ``state_dir`` runs.

    Args:
        state_dir: The federation's folder.

    Returns:
        ``{"state_dir", "address", "clients", "running": bool (any process alive),
        "processes": {name: {"pid", "alive", "argv"}}}`` (``argv``: the command it
        was started with); ``processes`` is empty and ``address`` and ``clients``
        ``None`` when there is no ``federation.json``.
    """
    state = _state(state_dir)
    fed = _read_federation(state) or {}
    starts, argv = fed.get("start_times", {}), fed.get("argv", {})
    procs = {
        name: {"pid": pid, "alive": alive(pid, starts.get(name)), "argv": argv.get(name, [])}
        for name, pid in fed.get("pids", {}).items()
    }
    return {
        "state_dir": str(state),
        "address": fed.get("address"),
        "clients": fed.get("clients"),
        "running": any(p["alive"] for p in procs.values()),
        "processes": procs,
    }


# --------------------------------------------------------------------- submit


def _check_run_config(run_config: dict[str, Any], declared: dict[str, Any]) -> None:
    r"""Raise naming the key if ``run_config`` has a key the App does not declare
    (``flwr run`` would fail with "Invalid run configuration") or a value whose type
    differs from the declared default's (an int is fine for a float); flwr itself
    does not check types."""
    unknown = sorted(set(run_config) - set(declared))
    if unknown:
        raise FlowerLaunchError(
            f"run_config keys {unknown} are not declared in the Flower App "
            f"([tool.flwr.app.config] keys: {sorted(declared)}); flwr rejects them"
        )
    for key, value in run_config.items():
        want = type(declared[key])
        ok = type(value) is want or (want is float and type(value) is int)
        if not ok:
            raise TypeError(
                f"run_config[{key!r}] must be a {want.__name__} (as its default "
                f"{declared[key]!r}), got {type(value).__name__} {value!r:.60}"
            )


#: the line of ``flwr run`` that names the run it started
_STARTED = re.compile(r"Successfully started run (\d+)")


class RunInterrupted(KeyboardInterrupt):
    r""":func:`submit` was interrupted (Ctrl-C, SIGTERM, SIGHUP); the run it started,
    if any, was stopped at the SuperLink (the message says whether that worked).

    Attributes:
        run_id: Flower's id of the run (``None``: interrupted before it started).
        signum: The signal that interrupted it (``signal.SIGINT`` for Ctrl-C).
    """

    def __init__(self, run_id: int | None, message: str, signum: int = signal.SIGINT) -> None:
        self.run_id = run_id
        self.signum = int(signum)
        super().__init__(message)


class _Signalled(KeyboardInterrupt):
    r"""SIGTERM or SIGHUP while :func:`submit` waits (handled as Ctrl-C is)."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        super().__init__(signal.Signals(signum).name)


def _stop_run(flwr: str, run_id: int, env: dict[str, str]) -> bool:
    r"""``flwr stop <run_id>`` on this federation's SuperLink, in its own session (a
    second Ctrl-C on the terminal does not reach it); whether it succeeded."""
    try:
        done = subprocess.run(
            [flwr, "stop", str(run_id), CONNECTION],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=30,
            check=False,
            start_new_session=True,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


@contextlib.contextmanager
def _signals(handler: Any, *signums: int) -> Iterator[None]:
    r"""``handler`` for ``signums`` inside the block, the previous handlers after it
    (a no-op outside the main thread, where Python cannot set handlers)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    saved = {s: signal.getsignal(s) for s in signums}
    for s in signums:
        signal.signal(s, handler)
    try:
        yield
    finally:
        for s, previous in saved.items():
            signal.signal(s, signal.SIG_DFL if previous is None else previous)


def _interrupt(signum: int, frame: Any) -> None:
    raise _Signalled(signum)


def _give_up(
    proc: subprocess.Popen[str] | None,
    lines: Queue[str | None],
    run_id: int | None,
    flwr: str,
    env: dict[str, str],
) -> tuple[int | None, str]:
    r"""Stop ``flwr run`` and the run it started; ``(run id, what became of it)``.

    The run's id is read from ``flwr run``'s output, including lines it printed but
    ``submit`` had not read yet when it gave up.
    """
    if proc is None:
        return None, "it had not started"
    if proc.poll() is None:
        terminate({proc.pid: start_time(proc.pid)}, grace=1.0)
    proc.wait()
    end = time.monotonic() + 5.0  # the reader thread ends once flwr run's pipe closes
    while run_id is None:
        try:
            line = lines.get(timeout=max(end - time.monotonic(), 0))
        except Empty:
            break
        if line is None:
            break
        if started := _STARTED.search(line):
            run_id = int(started.group(1))
    if run_id is None:
        return None, (
            "flwr run had not named a run when it was stopped; if it had submitted one, "
            f"`flwr ls {CONNECTION}` lists it and `flwr stop <id> {CONNECTION}` stops it"
        )
    if _stop_run(flwr, run_id, env):
        return run_id, f"run {run_id} is stopped at the SuperLink (`flwr stop {run_id}`)"
    return run_id, (
        f"stopping run {run_id} at the SuperLink failed, so it may still be running: "
        f"`flwr stop {run_id} {CONNECTION}` stops it"
    )


def _pump(proc: subprocess.Popen[str], lines: Queue[str | None]) -> None:
    r"""Copy ``proc``'s output lines into ``lines``, then ``None``."""
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.put(line.rstrip("\n"))
    lines.put(None)


def submit(
    state_dir: str | os.PathLike[str],
    run_config: dict[str, Any],
    *,
    timeout: float | None = None,
    stream: Callable[[str], Any] | None = None,
) -> int:
    r"""Run the Flower App of a live federation: ``flwr run <app> local-deployment
    --stream --run-config <state>/runs/<id>.toml``.

    Args:
        state_dir: The federation's folder (started by :func:`up`).
        run_config: Overrides of the App's run config (keys of :data:`APP_CONFIG`,
            each value of its default's type; an int for a float is fine).
        timeout: Seconds before ``flwr run`` is killed and the run it started is
            stopped at the SuperLink (``flwr stop``); ``None`` waits.
        stream: Called with each output line of ``flwr run`` (default ``print``).

    Returns:
        The exit code of ``flwr run``. Note: with ``--stream`` it is 0 once the run
        was submitted and its logs streamed to the end, even when the ServerApp
        failed; read the ServerApp's own result files for success.

    Raises:
        FlowerLaunchError: If ``state_dir`` has no live federation
            (:class:`NoFederationError`), ``run_config`` has undeclared keys, or
            ``timeout`` passed.
        TypeError: If a ``run_config`` value's type differs from its default's.
        RunInterrupted: On Ctrl-C (a ``KeyboardInterrupt``), or SIGTERM or SIGHUP in
            the main thread (unless the caller ignores them), once ``flwr run`` and the
            run it started are stopped; its message says whether stopping the run at
            the SuperLink succeeded.
    """
    import tomli_w

    state = _state(state_dir)
    fed = _read_federation(state)
    if fed is None or "superlink" not in _live_names(fed):
        raise NoFederationError(state)
    app_dir = Path(fed["app_dir"])
    with (app_dir / "pyproject.toml").open("rb") as f:
        declared = tomllib.load(f)["tool"]["flwr"]["app"].get("config", {})
    _check_run_config(run_config, declared)
    runs = state / "runs"
    runs.mkdir(exist_ok=True)
    run_file = runs / f"{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:8]}.toml"
    run_file.write_text(tomli_w.dumps(dict(run_config)))

    python = fed["python"]
    flwr = str(Path(python).parent / "flwr")
    argv = [flwr, "run", str(app_dir), CONNECTION, "--stream", "--run-config",
            str(run_file)]  # fmt: skip
    env = _child_env(state, python, fed.get("import_dir"))
    del env[STATE_ENV]  # not part of the federation: down leaves it alone
    out = print if stream is None else stream
    lines: Queue[str | None] = Queue()
    deadline = None if timeout is None else time.monotonic() + timeout
    proc: subprocess.Popen[str] | None = None
    run_id = None
    failure: BaseException | None = None
    stops = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    # SIGTERM and SIGHUP (a closed terminal) stop the run as Ctrl-C does, unless the
    # caller ignores them (`nohup botorch-fed flower run ...` must outlive its terminal)
    caught = [s for s in stops[1:] if signal.getsignal(s) is not signal.SIG_IGN]
    with _signals(_interrupt, *caught):
        try:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                errors="replace",
                env=env,
                start_new_session=True,
            )
            threading.Thread(target=_pump, args=(proc, lines), daemon=True).start()
            while True:
                wait = None if deadline is None else max(deadline - time.monotonic(), 0)
                try:
                    line = lines.get(timeout=wait)
                except Empty:
                    break
                if line is None:
                    return proc.wait()
                if run_id is None and (started := _STARTED.search(line)):
                    run_id = int(started.group(1))
                out(line)
        except BaseException as exc:  # Ctrl-C, SIGTERM/SIGHUP, or the caller's stream
            failure = exc
    # timed out, interrupted or failed: stop flwr run and the run; a second Ctrl-C must
    # not cut this (one in the instant before the handlers change still can)
    with _signals(signal.SIG_IGN, *stops):
        run_id, what = _give_up(proc, lines, run_id, flwr, env)
    if isinstance(failure, KeyboardInterrupt):
        signum = getattr(failure, "signum", signal.SIGINT)
        raise RunInterrupted(run_id, what, signum) from None
    if failure is not None:
        raise failure
    raise FlowerLaunchError(
        f"flwr run did not finish within timeout={timeout} s (run config {run_file}); {what}"
    )
