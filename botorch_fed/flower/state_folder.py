r"""The state folder of a loopback Flower federation (:func:`~.launcher.up`): its
layout, the description ``federation.json`` it records, and the Flower configuration
and Flower App written into it.

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
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from botorch_fed.flower.launch_errors import FlowerLaunchError
from botorch_fed.flower.processes import alive
from botorch_fed.flower.run_options import RUN_CONFIG_DEFAULTS

__all__ = [
    "APP_CONFIG",
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
