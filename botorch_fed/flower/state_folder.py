r"""The state folder of a loopback Flower federation (:func:`~.launcher.up`): its
layout, the description ``federation.json`` it records -- with the command line and
environment of each process, and how a later request to ``up`` compares with them --,
and the Flower configuration and Flower App written into it.

Layout of a state directory::

    federation.json      the description returned by up: ports, sockets, logs, and each
                         process's pid, start time, command line and environment
                         (written 0600: an environment may hold secrets)
    flwr_home/           FLWR_HOME of every child (config.toml, Flower's own state)
    app/pyproject.toml   the Flower App (components live in the installed botorch_fed)
    logs/<name>.log      stdout + stderr of each child (kept by down; a restarted process
                         appends to its log)
    keys/                the parties' key folder (``--key-dir``)
    parties/party-<i>.json  each agent's --state-file (the LDP epsilon spent; the runs
                         it began in party-<i>.json.runs)
    parties/party-<i>-ask   the ask/tell folder of party ``i`` (:func:`ask_folder`) when
                         up started it with ``ask_tell``
    sockets/             the agents' Unix sockets (a short temporary folder instead
                         when the state path is too long for a socket address)
    runs/<id>.toml       run configs written by submit
    results/<out>        a run's results JSON (or <out>.error), written by the
                         ServerApp under the name its run config's ``out`` gives

``federation.json``'s ``ready`` is true once up has started every process, and false
again after down: up restarts the dead processes of a ready federation and starts
afresh otherwise.
"""

from __future__ import annotations

import difflib
import json
import os
import shlex
from collections.abc import Callable
from pathlib import Path
from typing import Any

from botorch_fed.flower.launch_errors import FlowerLaunchError
from botorch_fed.flower.processes import alive
from botorch_fed.flower.run_options import RUN_CONFIG_DEFAULTS, SERVER_DIR_ENV

__all__ = [
    "APP_CONFIG",
    "ask_folder",
    "CONNECTION",
    "FEDERATION_FILE",
    "HOST",
    "STATE_ENV",
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

_LOG_TAIL = 20

#: ``(partition id, socket path) -> argv`` of a party's agent
AgentCommand = Callable[[int, Path], list[str]]


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


def _private_dir(path: Path, what: str) -> Path:
    r"""``path`` as a folder of ours that others cannot enter: created ``0700`` when
    missing (its parent must exist), else checked.

    Args:
        path: The folder.
        what: What it is, for the error message.

    Raises:
        FlowerLaunchError: ``path`` is not a folder, belongs to another user, or others
            can write into it or read it.
    """
    try:
        path.mkdir(mode=0o700)
    except FileExistsError:
        pass
    info = path.lstat()
    if not path.is_dir() or path.is_symlink():
        raise FlowerLaunchError(f"{what} {path} is not a folder")
    if info.st_uid != os.getuid():
        raise FlowerLaunchError(
            f"{what} {path} belongs to another user (uid {info.st_uid}); remove it or "
            "start the federation afresh (down, then up)"
        )
    if info.st_mode & 0o077:
        raise FlowerLaunchError(
            f"{what} {path} is open to other users (mode {oct(info.st_mode & 0o777)}): "
            f"`chmod 700 {path}`, or start the federation afresh (down, then up)"
        )
    return path


def _ask_folder(state: Path, index: int) -> Path:
    r"""``<state>/parties/party-<index>-ask`` (no checks: :func:`ask_folder` checks)."""
    return state / "parties" / f"party-{index}-ask"


def ask_folder(state_dir: str | os.PathLike[str], index: int) -> Path:
    r"""The ask/tell folder of party ``index`` of the federation in ``state_dir``.

    :func:`~.launcher.up` passes it to the agent of each party in its ``ask_tell`` as
    ``--ask-tell <folder>``; the agent keeps the party's pending points there, and the
    operator's ``botorch-fed party ... --party I --state-dir D`` finds them there.
    Nothing is created.

    Args:
        state_dir: The federation's folder (it must be private to this user if it
            exists).
        index: The party's partition id, ``>= 0``.

    Returns:
        ``<state_dir>/parties/party-<index>-ask``, with ``state_dir`` resolved.

    Raises:
        ValueError: If ``index`` is not an int ``>= 0``.
        FlowerLaunchError: If ``state_dir`` belongs to another user or is open to others.
    """
    if not isinstance(index, int) or isinstance(index, bool) or index < 0:
        raise ValueError(f"index must be a party index (an int >= 0), got {index!r}")
    return _ask_folder(_state(state_dir), index)


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
    r"""Write ``fed`` to ``<state>/federation.json`` atomically: a private (``0600``)
    temporary file, flushed to disk, renamed over the old one."""
    tmp = state / f".{FEDERATION_FILE}.tmp"
    data = (json.dumps(fed, indent=2, sort_keys=True) + "\n").encode()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)  # a leftover temporary file keeps its old mode otherwise
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    tmp.replace(state / FEDERATION_FILE)


def _live_names(fed: dict[str, Any]) -> list[str]:
    r"""Names of the recorded processes of ``fed`` that still run."""
    starts = fed.get("start_times", {})
    return [n for n, pid in fed.get("pids", {}).items() if alive(pid, starts.get(n))]


def _log_tail(path: Path, lines: int = _LOG_TAIL, start: int = 0) -> str:
    r"""The last ``lines`` lines of the log ``path`` after byte ``start`` (where the
    latest process's output begins; a note if there is none or no log)."""
    try:
        with path.open("rb") as f:
            f.seek(start)
            text = f.read().decode(errors="replace")
    except FileNotFoundError:
        return f"(no log at {path})"
    tail = text.splitlines()[-lines:]
    if not tail:
        return f"({path} is empty)" if start == 0 else f"(nothing in {path} since it started)"
    return "\n".join(tail)


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


# ------------------------------------------------- the processes it records


def _toml_string(value: str) -> str:
    r"""A TOML basic string of ``value`` (for ``--node-config``; no escapes needed)."""
    if any(c in value for c in "\"\\'\n\r\t"):
        raise FlowerLaunchError(
            f"path {value!r} cannot be passed in --node-config: it holds a quote, "
            "a backslash or a control character"
        )
    return f'"{value}"'


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


def _env_of(fed: dict[str, Any], name: str) -> dict[str, str]:
    r"""The recorded environment of process ``name`` (a record of an older ``up``
    without one: what that ``up`` gave it, in today's environment)."""
    state = fed["state_dir"]
    env = fed.get("env")
    if env is None:
        env = _child_env(Path(state), fed["python"], fed.get("import_dir"))
    overrides = fed.get("env_overrides", {"superlink": {SERVER_DIR_ENV: state}})
    return {**env, **overrides.get(name, {})}


def _console_script(python: str, name: str) -> str:
    r"""Path of the console script ``name`` next to ``python`` (error if missing)."""
    path = Path(python).parent / name
    if not os.access(path, os.X_OK):
        raise FlowerLaunchError(
            f"{name} not found next to python={python!r} (looked for {path}); "
            "install the extra: pip install 'botorch-fed[flower]'"
        )
    return str(path)


def _names(clients: int) -> list[str]:
    r"""The process names of a federation of ``clients`` parties, in start order."""
    return [
        "superlink",
        *(f"agent-{i}" for i in range(clients)),
        *(f"supernode-{i}" for i in range(clients)),
    ]


def _command_lines(
    fed: dict[str, Any], python: str, agent: AgentCommand, ask: tuple[int, ...]
) -> dict[str, list[str]]:
    r"""The command line of each process of the federation ``fed`` describes (its
    clients, ports and sockets), as :func:`~.launcher.up` starts it with these
    arguments; agent ``i`` of ``ask`` gets ``--ask-tell <its ask folder>`` last."""
    superlink_bin = _console_script(python, "flower-superlink")
    supernode_bin = _console_script(python, "flower-supernode")
    clients, ports, sockets = fed["clients"], fed["ports"], fed["sockets"]
    argv = {
        "superlink": [
            superlink_bin, "--insecure", "--disable-runtime-dependency-installation",
            "--host", HOST, "--port", str(ports["superlink"]),
        ]
    }  # fmt: skip
    for i in range(clients):
        ask_flag = ["--ask-tell", str(_ask_folder(Path(fed["state_dir"]), i))] if i in ask else []
        argv[f"agent-{i}"] = [*(str(a) for a in agent(i, Path(sockets[f"agent-{i}"]))), *ask_flag]
    for i in range(clients):
        node_config = (
            f"partition-id={i} num-partitions={clients} agent={_toml_string(sockets[f'agent-{i}'])}"
        )
        argv[f"supernode-{i}"] = [
            supernode_bin, "--insecure", "--superlink", fed["address"],
            "--node-config", node_config,
            "--host", HOST, "--port", str(ports[f"supernode-{i}"]),
        ]  # fmt: skip
    return argv


def _argv_change(name: str, had: list[str] | None, wanted: list[str]) -> str:
    r"""How ``wanted``, the command line a request gives process ``name``, differs from
    ``had``, the one it was started with (a phrase)."""
    if had is None:
        return f"{name} has no recorded command line"
    parts = []
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(a=had, b=wanted).get_opcodes():
        old, new = shlex.join(had[i1:i2]), shlex.join(wanted[j1:j2])
        if tag == "replace":
            flag = f"{had[i1 - 1]} " if i1 and had[i1 - 1].startswith("--") else ""
            parts.append(f"{flag}{new} instead of {flag}{old}")
        elif tag == "insert":
            parts.append(f"with {new}")
        elif tag == "delete":
            parts.append(f"without {old}")
    return f"{name} would start {', '.join(parts)}"


def _changes(
    fed: dict[str, Any],
    state: Path,
    clients: int,
    port: int | None,
    python: str,
    agent: AgentCommand,
    ask: tuple[int, ...],
) -> list[str]:
    r"""How a request to :func:`~.launcher.up` (``clients``, ``port``, ``python``, the
    agent command and the ask/tell parties) differs from what the federation ``fed``
    was started with: one phrase per difference, ``[]`` when it asks for the same one."""
    if fed.get("state_dir") != str(state):
        return [f"its federation.json was written for the folder {fed.get('state_dir')}"]
    if clients != fed.get("clients"):
        return [f"clients={clients}, but it has {fed.get('clients')} parties"]
    changes = []
    link_port = fed["ports"]["superlink"]
    if port is not None and port != link_port:
        changes.append(f"port={port}, but its SuperLink listens on port {link_port}")
    alike: dict[str, list[str]] = {}  # one phrase for the processes that differ alike
    for name, wanted in _command_lines(fed, python, agent, ask).items():
        had = fed.get("argv", {}).get(name)
        if had != wanted:
            change = _argv_change(name, had, wanted)
            alike.setdefault(change.removeprefix(name), []).append(name)
    changes += [f"{', '.join(names)}{change}" for change, names in alike.items()]
    return changes
