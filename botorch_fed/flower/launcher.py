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
the Flower App (``app/pyproject.toml``) that :func:`~.submission.submit` runs with
``flwr run``. :func:`down` stops what :func:`up` recorded in ``federation.json``;
:func:`status` reports it. The state folder's layout and files are
:mod:`.state_folder`'s, the launcher's errors :mod:`.launch_errors`'.

The module imports neither torch nor flwr: it only starts processes.
"""

from __future__ import annotations

import functools
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from botorch_fed.flower.launch_errors import FederationRunningError, FlowerLaunchError
from botorch_fed.flower.processes import (
    alive,
    descendants,
    exit_code,
    process_table,
    start_time,
    terminate,
    track,
)
from botorch_fed.flower.run_options import RESULTS_DIR, SERVER_DIR_ENV
from botorch_fed.flower.state_folder import (
    CONNECTION,
    HOST,
    STATE_ENV,
    _live_names,
    _log_tail,
    _read_federation,
    _state,
    _write_app,
    _write_federation,
    _write_flower_config,
)

__all__ = ["down", "status", "up"]

_POLL = 0.1
_SOCKET_PATH_MAX = 100  # sun_path holds 108 bytes; keep a margin

AgentCommand = Callable[[int, Path], list[str]]


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


# ------------------------------------------------------------------- node config


def _toml_string(value: str) -> str:
    r"""A TOML basic string of ``value`` (for ``--node-config``; no escapes needed)."""
    if any(c in value for c in "\"\\'\n\r\t"):
        raise FlowerLaunchError(
            f"path {value!r} cannot be passed in --node-config: it holds a quote, "
            "a backslash or a control character"
        )
    return f'"{value}"'


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
        name: functools.partial(_health, port) for name, port in ports.items()
    }
    for name, path in fed["sockets"].items():
        pending[name] = Path(path).exists
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
