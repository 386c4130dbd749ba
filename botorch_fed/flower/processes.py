r"""The processes of a loopback Flower federation: their state, start time, command
line and descendants from ``/proc``, signals to their process groups, and the exit codes
of the children this process started (:func:`track`).

Linux only (``/proc``); imports neither torch nor flwr.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path

STOP_GRACE = 3.0  # seconds between SIGTERM and SIGKILL
# Popen objects of our children, kept so they are neither garbage collected while
# running (ResourceWarning) nor left as zombies (poll reaps them).
_CHILDREN: dict[int, subprocess.Popen[bytes]] = {}
_EXIT_CODES: dict[int, int] = {}  # of reaped children, for error messages


def track(proc: subprocess.Popen[bytes]) -> None:
    r"""Keep ``proc``, a child just started, until it is reaped (its exit code then)."""
    _CHILDREN[proc.pid] = proc
    _EXIT_CODES.pop(proc.pid, None)  # a reused pid


def proc_stat(pid: int) -> tuple[str, int, int, int] | None:
    r"""(state, ppid, pgrp, start time) of ``pid`` from ``/proc/<pid>/stat``.

    Args:
        pid: The process id.

    Returns:
        The state letter, parent pid, process group and start time (field 22, clock
        ticks since boot), or ``None`` when there is no such process.
    """
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # comm (field 2) may hold spaces and parentheses: split after the last ')'
    fields = raw[raw.rfind(")") + 2 :].split()
    return fields[0], int(fields[1]), int(fields[2]), int(fields[19])


def start_time(pid: int) -> int | None:
    r"""Start time (field 22 of ``/proc/<pid>/stat``) of ``pid``, ``None`` if gone."""
    stat = proc_stat(pid)
    return None if stat is None else stat[3]


def reap(pid: int) -> None:
    r"""Collect ``pid``'s exit status if it is a child of this process (no zombie)."""
    proc = _CHILDREN.get(pid)
    if proc is not None:
        if proc.poll() is not None:
            _EXIT_CODES[pid] = proc.returncode
            del _CHILDREN[pid]
        return
    try:
        done, wait_status = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:  # not our child: its parent (or init) reaps it
        return
    if done == pid:
        _EXIT_CODES[pid] = os.waitstatus_to_exitcode(wait_status)


def alive(pid: int, start_time: int | None) -> bool:
    r"""Whether the process ``pid`` that started at ``start_time`` still runs.

    A zombie (state ``Z``, not reaped because PID 1 of this sandbox does not reap)
    counts as dead, and so does a pid now held by another process (pid reuse).

    Args:
        pid: The process id.
        start_time: Its recorded start time; ``None`` skips the reuse check.
    """
    reap(pid)
    stat = proc_stat(pid)
    if stat is None or stat[0] in "ZXx":
        return False
    return start_time is None or stat[3] == start_time


def exit_code(pid: int) -> int | None:
    r"""Exit code of our child ``pid`` once reaped (negative: killed by that
    signal), else ``None``."""
    reap(pid)
    return _EXIT_CODES.get(pid)


def process_table() -> dict[int, tuple[int, int]]:
    r"""``{pid: (ppid, start time)}`` of every live process in ``/proc``."""
    table = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            stat = proc_stat(int(entry.name))
            if stat is not None and stat[0] not in "ZXx":
                table[int(entry.name)] = (stat[1], stat[3])
    return table


def command_line(pid: int) -> list[str] | None:
    r"""The arguments ``pid`` was started with (``/proc/<pid>/cmdline``), ``None`` if gone."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    return [arg.decode(errors="replace") for arg in raw.split(b"\0")[:-1]]


def watched_parent(pid: int) -> int | None:
    r"""The pid a Flower subprocess of ``pid`` watches: its ``--parent-pid`` argument.

    Flower 1.41 starts its SuperExecs (``flower-superexec``) and their app processes
    (``flwr-serverapp``, ``flwr-clientapp``) with ``--parent-pid P`` and has them exit
    once ``P`` is gone -- but a ``P`` that stays a zombie (nobody reaps it) counts as
    running for them.

    Args:
        pid: The process id.

    Returns:
        The watched pid, or ``None`` when ``pid`` has no (integer) ``--parent-pid`` or
        is gone.
    """
    argv = command_line(pid) or []
    for k, arg in enumerate(argv):
        if arg == "--parent-pid" and k + 1 < len(argv):
            value = argv[k + 1]
        elif arg.startswith("--parent-pid="):
            value = arg.split("=", 1)[1]
        else:
            continue
        try:
            return int(value)
        except ValueError:
            return None
    return None


def descendants(roots: list[int], table: dict[int, tuple[int, int]]) -> set[int]:
    r"""Pids below ``roots`` in the process tree ``table`` (roots excluded)."""
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    found: set[int] = set()
    todo = list(roots)
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found - set(roots)


def with_environment(entry: str, table: dict[int, tuple[int, int]]) -> set[int]:
    r"""Live pids of ``table`` (other than this process) whose environment holds
    ``entry`` (``"NAME=value"``), e.g. every process of one federation."""
    wanted = entry.encode()
    found = set()
    for pid in table:
        if pid == os.getpid():
            continue
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            continue
        if wanted in environ.split(b"\0"):
            found.add(pid)
    return found


def left_behind(
    candidates: set[int],
    live: list[int],
    dead: set[int],
    table: dict[int, tuple[int, int]],
) -> dict[int, int]:
    r"""The processes of ``candidates`` that dead processes left behind, with their
    descendants: ``{pid: start time}``.

    A candidate is left behind when it is no descendant of a ``live`` process and its
    parent is one of ``dead`` (a zombie nobody reaped), or the process it watches
    (:func:`watched_parent`) is one of ``dead`` or no longer runs (gone, or a zombie:
    Flower's own check takes a zombie for a running process, so such a SuperExec
    would live on).

    Args:
        candidates: Pids to look at (those of one federation).
        live: Pids of its recorded processes that still run (kept, with their
            descendants).
        dead: Pids of its recorded processes that died.
        table: :func:`process_table`.
    """
    keep = set(live) | descendants(list(live), table)
    found = set()
    for pid in candidates - keep:
        if pid not in table:
            continue
        watched = watched_parent(pid)
        if table[pid][0] in dead or (
            watched is not None and (watched in dead or not alive(watched, None))
        ):
            found.add(pid)
    found |= descendants(list(found), table) - keep
    return {pid: table[pid][1] for pid in found if pid in table}


def signal_process(pid: int, sig: int) -> None:
    r"""Send ``sig`` to ``pid``'s process group if it leads one, else to ``pid``."""
    stat = proc_stat(pid)
    try:
        if stat is not None and stat[2] == pid:
            os.killpg(pid, sig)
        else:
            os.kill(pid, sig)
    except ProcessLookupError:
        pass


def terminate(procs: Mapping[int, int | None], grace: float = STOP_GRACE) -> None:
    r"""SIGTERM ``{pid: start time}``, wait up to ``grace`` s, then SIGKILL the rest.

    Args:
        procs: The processes, each with its start time (checked against pid reuse).
        grace: Seconds to wait for them to exit after SIGTERM.
    """
    live = {pid: t for pid, t in procs.items() if alive(pid, t)}
    for pid in live:
        signal_process(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while live and time.monotonic() < deadline:
        time.sleep(0.05)
        live = {pid: t for pid, t in live.items() if alive(pid, t)}
    for pid in live:
        signal_process(pid, signal.SIGKILL)
    deadline = time.monotonic() + 1.0
    while live and time.monotonic() < deadline:
        time.sleep(0.02)
        live = {pid: t for pid, t in live.items() if alive(pid, t)}
