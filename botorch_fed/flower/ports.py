r"""Ports of a loopback Flower federation (:mod:`.launcher`): free ones chosen by the OS,
whether one is taken, a SuperLink's health, and whether a dead process's recorded port
can be used again."""

from __future__ import annotations

import socket
import time
import urllib.error
import urllib.request
from pathlib import Path

from botorch_fed.flower.launch_errors import FlowerLaunchError
from botorch_fed.flower.state_folder import HOST

POLL = 0.1
PORT_GRACE = 5.0  # seconds a restart waits for a dead process's port to close


def free_ports(count: int) -> list[int]:
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


def check_port_value(port: int) -> None:
    r"""Raise ValueError unless ``port`` is an int in 1..65535."""
    if not isinstance(port, int) or isinstance(port, bool) or not 0 < port < 65536:
        raise ValueError(f"port must be an int in 1..65535, got {port!r}")


def port_taken(port: int) -> str | None:
    r"""Why ``port`` cannot be bound on :data:`HOST` (``None``: it is free)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # as uvicorn does, so a TIME_WAIT leftover does not count as taken
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((HOST, port))
        except OSError as err:
            return err.strerror or str(err)
    return None


def check_port_free(port: int) -> None:
    r"""Raise :class:`FlowerLaunchError` naming ``port`` if it cannot be bound."""
    check_port_value(port)
    if (why := port_taken(port)) is not None:
        raise FlowerLaunchError(
            f"port {port} on {HOST} is taken ({why}); pick another "
            "port or leave port=None for a free one"
        )


def health(port: int) -> bool:
    r"""Whether ``GET http://127.0.0.1:<port>/health`` answers 200."""
    try:
        with urllib.request.urlopen(f"http://{HOST}:{port}/health", timeout=0.5) as r:
            return r.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


def check_recorded_port(state: Path, name: str, port: int) -> None:
    r"""Raise :class:`FlowerLaunchError` naming ``port`` if ``name`` cannot restart on it.

    A port whose process just died stays taken for a moment (its connections close
    with data in flight: FIN-WAIT-1), so it is tried for :data:`PORT_GRACE` seconds.
    """
    deadline = time.monotonic() + PORT_GRACE
    while (why := port_taken(port)) is not None and time.monotonic() < deadline:
        time.sleep(POLL)
    if why is None:
        return
    if name == "superlink":
        keep = (
            "its SuperNodes and the Flower configuration (flwr_home/config.toml) name "
            "that port, so it restarts there or not at all"
        )
    else:
        keep = "its recorded command line names that port"
    raise FlowerLaunchError(
        f"cannot restart {name} of the federation in {state}: its port {port} on {HOST} "
        f"is taken ({why}); {keep}. Free the port, or down({str(state)!r}) and up() "
        "again to start afresh on free ports"
    )
