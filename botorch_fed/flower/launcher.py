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
:func:`status` reports it. Called again on a federation some of whose processes died,
:func:`up` restarts exactly those, as they were started (a campaign outlives a crash
of any of them). :func:`ask_folder` names a party's ask/tell folder. The state folder's
layout and files are :mod:`.state_folder`'s, the launcher's errors :mod:`.launch_errors`'.

The module imports neither torch nor flwr: it only starts processes.
"""

from __future__ import annotations

import functools
import operator
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from botorch_fed.flower.launch_errors import (
    FederationChangedError,
    FederationRunningError,
    FlowerLaunchError,
)
from botorch_fed.flower.ports import (
    check_port_free,
    check_port_value,
    check_recorded_port,
    free_ports,
    health,
)
from botorch_fed.flower.processes import (
    alive,
    descendants,
    exit_code,
    left_behind,
    process_table,
    start_time,
    terminate,
    track,
    with_environment,
)
from botorch_fed.flower.run_options import RESULTS_DIR, SERVER_DIR_ENV
from botorch_fed.flower.state_folder import (
    CONNECTION,
    HOST,
    STATE_ENV,
    AgentCommand,
    _changes,
    _child_env,
    _command_lines,
    _console_script,
    _env_of,
    _live_names,
    _log_tail,
    _names,
    _private_dir,
    _read_federation,
    _state,
    _write_app,
    _write_federation,
    _write_flower_config,
    ask_folder,
)

__all__ = ["ask_folder", "down", "status", "up"]

_POLL = 0.1
_SOCKET_PATH_MAX = 100  # sun_path holds 108 bytes; keep a margin


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


def _socket_dir(state: Path) -> tuple[Path, bool]:
    r"""Folder of the agents' sockets and whether it is a temporary one (the state
    path is too long for a Unix socket address)."""
    sockets = state / "sockets"
    if len(str(sockets / "agent-999.sock")) <= _SOCKET_PATH_MAX:
        return sockets, False
    return Path(tempfile.mkdtemp(prefix="bfed-")), True


def _spawn(
    fed: dict[str, Any],
    state: Path,
    name: str,
    env: dict[str, str],
    offsets: dict[str, int],
) -> int:
    r"""Start ``fed["argv"][name]`` as ``name`` (own session, no stdin, output appended
    to its log, where ``offsets[name]`` marks its start) and record its pid and start
    time in ``fed`` and ``federation.json`` at once."""
    argv = fed["argv"][name]
    log = state / "logs" / f"{name}.log"
    with log.open("ab") as out:
        if out.tell():
            stamp = time.strftime("%Y-%m-%d %H:%M:%S %z")
            out.write(f"\n==> {stamp}: botorch-fed up starts {name} again <==\n".encode())
            out.flush()
        offsets[name] = out.tell()
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
    _write_federation(state, fed)
    return proc.pid


def _died(fed: dict[str, Any], names: list[str], offsets: dict[str, int]) -> str | None:
    r"""Error text for the first process of ``names`` that is no longer running."""
    for name in names:
        pid = fed["pids"][name]
        if not alive(pid, fed["start_times"].get(name)):
            code = exit_code(pid)
            how = "exited" if code is None else f"exited with code {code}"
            log = Path(fed["logs"][name])
            tail = _log_tail(log, start=offsets.get(name, 0))
            return f"{name} (pid {pid}) {how} during start-up; last lines of {log}:\n{tail}"
    return None


def _wait_ready(
    fed: dict[str, Any], names: list[str], deadline: float, offsets: dict[str, int]
) -> None:
    r"""Poll until the processes ``names`` are ready -- the SuperLink and SuperNodes
    answer ``/health``, each agent's socket exists -- and raise
    :class:`FlowerLaunchError` when one of them dies or at ``deadline``."""
    pending: dict[str, Callable[[], bool]] = {}
    for name in names:
        if name in fed["ports"]:
            pending[name] = functools.partial(health, fed["ports"][name])
        elif name in fed["sockets"]:
            pending[name] = Path(fed["sockets"][name]).exists
    while True:
        if (err := _died(fed, names, offsets)) is not None:
            raise FlowerLaunchError(err)
        pending = {name: ready for name, ready in pending.items() if not ready()}
        if not pending:
            return
        if time.monotonic() > deadline:
            waiting = ", ".join(f"{n} (log {fed['logs'][n]})" for n in sorted(pending))
            raise FlowerLaunchError(
                f"federation in {fed['state_dir']} not ready after timeout={fed['timeout']} s;"
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


def _check_ask_tell(ask_tell: Iterable[int], clients: int) -> tuple[int, ...]:
    r"""The party indices of ``ask_tell``, sorted; ValueError unless each is an int in
    ``0..clients-1`` and none repeats."""
    if isinstance(ask_tell, str | bytes) or not isinstance(ask_tell, Iterable):
        raise ValueError(
            f"ask_tell must be a sequence of party indices (ints in 0..{clients - 1}), "
            f"got {ask_tell!r}"
        )
    indices: list[int] = []
    for item in ask_tell:
        try:
            if isinstance(item, bool):
                raise TypeError
            index = operator.index(item)
        except TypeError:
            raise ValueError(
                f"ask_tell must hold party indices (ints), got {item!r} in {ask_tell!r}"
            ) from None
        if not 0 <= index < clients:
            raise ValueError(
                f"ask_tell names party {index}, but clients={clients} has parties 0..{clients - 1}"
            )
        if index in indices:
            raise ValueError(f"ask_tell names party {index} twice")
        indices.append(index)
    return tuple(sorted(indices))


def _terminate_named(fed: dict[str, Any], names: list[str]) -> None:
    r"""Stop the recorded processes ``names`` of ``fed`` with their descendants."""
    table = process_table()
    starts = fed["start_times"]
    procs = {fed["pids"][n]: starts.get(n) for n in names if n in fed["pids"]}
    below = descendants(list(procs), table)
    terminate(procs | {pid: table[pid][1] for pid in below})


def _leftovers(state: Path, fed: dict[str, Any], live: list[str]) -> dict[int, int]:
    r"""Processes of this federation that its dead processes left behind (a SuperExec
    of a SIGKILLed SuperLink, the ClientApp it ran, ...): :func:`.processes.left_behind`."""
    pids = fed.get("pids", {})
    table = process_table()
    dead = {pid for name, pid in pids.items() if name not in live}
    return left_behind(
        with_environment(f"{STATE_ENV}={state}", table), [pids[n] for n in live], dead, table
    )


def _restart(
    state: Path, fed: dict[str, Any], live: list[str], timeout: float, t0: float
) -> dict[str, Any]:
    r"""Restart the dead processes of the ready federation ``fed`` (``live``: its
    processes that run), as :func:`up` describes; returns the updated ``fed``."""
    dead = [n for n in _names(fed["clients"]) if n not in live]
    missing = [n for n in dead if n not in fed.get("argv", {}) or n not in fed["logs"]]
    if missing:
        raise FlowerLaunchError(
            f"{state / 'federation.json'} records no command line for {', '.join(missing)}; "
            f"down({str(state)!r}) and up() again to start afresh"
        )
    link = "superlink" in dead
    agents = [n for n in dead if n.startswith("agent-")]
    # a SuperLink restarted with Flower's in-memory state knows none of the old nodes:
    # each SuperNode exits at its next heartbeat, so every SuperNode restarts with it
    nodes = [
        n for n in _names(fed["clients"]) if n.startswith("supernode-") and (link or n in dead)
    ]
    stopping = [n for n in nodes if n in live]
    terminate(_leftovers(state, fed, live))  # they might hold a port
    for name in [n for n in ["superlink", *nodes] if n in dead]:
        check_recorded_port(state, name, fed["ports"][name])
    if agents and fed.get("socket_dir_temporary"):  # gone after a reboot: made again
        _private_dir(Path(fed["socket_dir"]), "the agents' socket folder")
    (state / "logs").mkdir(exist_ok=True)
    if stopping:
        _terminate_named(fed, stopping)
        for name in stopping:
            check_recorded_port(state, name, fed["ports"][name])
    for name in agents:  # a SIGKILLed agent leaves its socket file behind
        Path(fed["sockets"][name]).unlink(missing_ok=True)
    fed["timeout"] = timeout
    deadline = time.monotonic() + timeout
    offsets: dict[str, int] = {}
    started: list[str] = []
    try:
        for stage in (["superlink"] if link else [], agents, nodes):
            for name in stage:
                _spawn(fed, state, name, _env_of(fed, name), offsets)
                started.append(name)
            _wait_ready(fed, stage, deadline, offsets)
    except BaseException:
        _terminate_named(fed, started)
        raise
    fed["restarted"] = started
    fed["startup_s"] = round(time.monotonic() - t0, 3)
    _write_federation(state, fed)
    return fed


def _start(
    state: Path,
    clients: int,
    port: int | None,
    timeout: float,
    python: str,
    agent: AgentCommand,
    ask: tuple[int, ...],
    t0: float,
) -> dict[str, Any]:
    r"""Start a new federation in ``state`` as :func:`up` describes; returns its ``fed``."""
    free = free_ports(clients + (port is None))
    link_port = free.pop() if port is None else port
    sock_dir, sock_tmp = _socket_dir(state)
    for sub in ("logs", "keys", "parties", "runs", RESULTS_DIR, "flwr_home"):
        (state / sub).mkdir(exist_ok=True)
    sock_dir.mkdir(exist_ok=True)
    import_dir = _import_dir()
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
        "import_dir": import_dir,
        "socket_dir": str(sock_dir),
        "socket_dir_temporary": sock_tmp,
        "ports": {"superlink": link_port},
        "sockets": {},
        "pids": {},
        "start_times": {},
        "logs": {},
        "argv": {},
        "env": _child_env(state, python, import_dir),
        "env_overrides": {"superlink": {SERVER_DIR_ENV: str(state)}},
        "timeout": timeout,
        "ready": False,
        "restarted": [],
    }
    for i in range(clients):
        fed["ports"][f"supernode-{i}"] = free[i]
        fed["sockets"][f"agent-{i}"] = str(sock_dir / f"agent-{i}.sock")
        Path(fed["sockets"][f"agent-{i}"]).unlink(missing_ok=True)  # stale
    fed["argv"] = _command_lines(fed, python, agent, ask)
    _write_federation(state, fed)
    offsets: dict[str, int] = {}
    try:
        for name in _names(clients):
            _spawn(fed, state, name, _env_of(fed, name), offsets)
        _wait_ready(fed, _names(clients), time.monotonic() + timeout, offsets)
    except BaseException:
        _stop(state, fed)
        raise
    fed["ready"] = True
    fed["startup_s"] = round(time.monotonic() - t0, 3)
    _write_federation(state, fed)
    return fed


def up(
    clients: int,
    state_dir: str | os.PathLike[str],
    *,
    port: int | None = None,
    timeout: float = 60.0,
    python: str = sys.executable,
    agent_command: AgentCommand | None = None,
    agent_flags: Sequence[str] = (),
    ask_tell: Iterable[int] = (),
) -> dict[str, Any]:
    r"""Start a loopback Flower federation of ``clients`` parties, or restart the dead
    processes of the one in ``state_dir``, and wait until it is ready.

    **A new federation.** Starts the SuperLink, ``clients`` party agents and
    ``clients`` SuperNodes, each in its own process group with its output appended to
    ``<state_dir>/logs/<name>.log`` (names ``superlink``, ``agent-<i>``,
    ``supernode-<i>``), recording each with its command line and environment in
    ``<state_dir>/federation.json`` as it starts. The children run in ``state_dir``;
    the folder ``up`` is called from goes first on their PYTHONPATH (``import_dir``
    in the description), so a run's ``--objective mymod:f`` written there is found
    by the agents and the ServerApp. Ready means: the SuperLink and every SuperNode
    answer ``GET /health`` with 200 and every agent has created its socket. Whether
    the SuperNodes registered at the SuperLink is left to the ServerApp. The SuperLink
    alone gets :data:`~.run_options.SERVER_DIR_ENV` = ``state_dir`` (its SuperExec
    and ServerApp processes inherit it): a run's results go to ``<state_dir>/results/``
    and its server key is read from ``<state_dir>/keys/``, whatever the run config says.

    **A restart.** When ``state_dir`` holds a federation that came up (and was not
    stopped with :func:`down` since) some or all of whose processes died, ``up``
    restarts exactly the dead ones, with the command line, environment, ports and
    sockets recorded for them, keeping the live ones: the SuperLink first, then the
    agents, then the SuperNodes, each stage ready before the next starts; each
    restarted process appends to its log and ``federation.json`` gets its pid and
    start time (written atomically). A restarted SuperLink starts on its recorded
    port (its SuperNodes and ``flwr_home/config.toml`` name it) or not at all (the
    error names the port). A restarted SuperLink also restarts every SuperNode, the
    live ones included: Flower 1.41's SuperLink keeps its nodes in memory, and a
    SuperNode whose SuperLink restarted is refused at its next heartbeat and exits
    (it does not register again); restarted SuperNodes register afresh (with new node
    ids). A restarted agent, by contrast, needs no new SuperNode: the ClientApp finds
    its socket per message. Processes that dead ones left behind (a SuperExec whose
    parent was SIGKILLed, the ServerApp or ClientApp it ran) are stopped first. The
    agents' state files and folders (``parties/``) are never touched. The request must
    ask for the federation that was started: the same ``clients`` and ``port`` (or
    ``None``), and the same command line for every process (``python``,
    ``agent_command``, ``agent_flags`` -- the parties' policies -- and ``ask_tell``);
    otherwise ``up`` refuses while a process lives (:class:`FederationChangedError`)
    and starts a new federation when none does. The caller's environment plays no
    part in a restart.

    Args:
        clients: Number of parties (SuperNodes and agents), at least 1.
        state_dir: Folder of the federation (created if missing).
        port: SuperLink HTTP port (Fleet, Control and Runtime APIs); ``None`` picks a
            free one (a restart: the recorded one). SuperNode Runtime API ports are
            always picked free.
        timeout: Seconds to wait for readiness (of all stages of a restart together).
        python: Interpreter for the agents; its bin dir holds the Flower console
            scripts and goes first on the children's PATH.
        agent_command: ``(partition id, socket path) -> argv`` of an agent, for
            tests; default ``[python, -m, botorch_fed.flower.party, ...]``.
        agent_flags: Extra flags of every default agent, passed as given: its policy
            (``--allow-plaintext``, ``--allow-masking``, ``--allow-crypto-seed``,
            ``--allow-objective M:F@lo,hi;...``, ``--share-results``, ...;
            :func:`~botorch_fed.flower.policy_flags.policy_flags` makes them from ``flower
            up``'s flags; :class:`~botorch_fed.flower.policy.PartyPolicy`).
        ask_tell: Indices of the parties whose agents run in ask/tell mode: agent ``i``
            gets ``--ask-tell <state_dir>/parties/party-<i>-ask`` (:func:`ask_folder`)
            after its other arguments. Each index in ``0..clients-1``, none twice.

    Returns:
        The federation description (what ``federation.json`` holds): ``state_dir``,
        ``address``, ``clients``, ``ports``/``sockets``/``pids``/``start_times``/
        ``logs``/``argv`` by process name, ``env`` (the children's environment) and
        ``env_overrides`` (by process name), ``flwr_home``, ``flower_config``,
        ``app_dir``, ``key_dir``, ``import_dir``, ``connection``, ``ready``,
        ``startup_s``, ``timeout``, and ``restarted``: the names this call restarted
        (``[]`` for a new federation).

    Raises:
        ValueError: If ``clients``, ``timeout``, ``port`` or ``ask_tell`` is malformed.
        FlowerLaunchError: If ``port`` (or a port a restart needs) is taken, the state
            folder's federation runs entirely (:class:`FederationRunningError`) or
            partly, with other arguments (:class:`FederationChangedError`) -- nothing
            started or stopped then --, or a process died during start-up or
            ``timeout`` passed (everything this call started is stopped then; the
            message names the process and its log tail).
    """
    t0 = time.monotonic()
    _check_args(clients, timeout, python)
    ask = _check_ask_tell(ask_tell, clients)
    for script in ("flower-superlink", "flower-supernode"):
        _console_script(python, script)
    if port is not None:
        check_port_value(port)
    state = _state(state_dir, create=True)
    agent = agent_command or _default_agent_command(python, state, clients, tuple(agent_flags))
    fed = _read_federation(state)
    live = [] if fed is None else _live_names(fed)
    if fed is not None and fed.get("ready"):
        if set(live) >= set(_names(fed["clients"])):
            raise FederationRunningError(state, live)
        changes = _changes(fed, state, clients, port, python, agent, ask)
        if not changes:
            return _restart(state, fed, live, timeout, t0)
        if live:
            raise FederationChangedError(state, live, changes)
    if live:
        raise FederationRunningError(state, live)
    if port is not None:
        check_port_free(port)
    if fed is not None:
        terminate(_leftovers(state, fed, []))
    return _start(state, clients, port, timeout, python, agent, ask, t0)


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
    extra = (descendants(roots, table) | with_environment(f"{STATE_ENV}={state}", table)) - set(
        roots
    )
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
    and ``federation.json`` are kept (marked not ``ready``: the next :func:`up` starts
    a new federation rather than restarting this one); agent sockets are removed.

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
    stopped = _stop(state, fed)
    if fed.get("ready"):  # the next up starts afresh
        fed["ready"] = False
        _write_federation(state, fed)
    return stopped


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
