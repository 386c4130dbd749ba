r"""Submitting a run to a live loopback Flower federation (``flwr run``): :func:`submit`,
which streams the run's output and, when it times out or is interrupted (Ctrl-C,
SIGTERM, SIGHUP), stops ``flwr run`` and the run it started at the SuperLink
(:class:`RunInterrupted`).

The module imports neither torch nor flwr: it only starts processes.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import threading
import time
import tomllib
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from queue import Empty, Queue
from typing import Any

from botorch_fed.flower.launch_errors import FlowerLaunchError, NoFederationError
from botorch_fed.flower.launcher import _child_env
from botorch_fed.flower.processes import start_time, terminate
from botorch_fed.flower.state_folder import (
    CONNECTION,
    STATE_ENV,
    _live_names,
    _read_federation,
    _state,
)

__all__ = ["STARTED", "RunInterrupted", "stop_run", "submit"]


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
STARTED = re.compile(r"Successfully started run (\d+)")


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
        if started := STARTED.search(line):
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


def stop_run(state_dir: str | os.PathLike[str], run_id: int) -> bool:
    r"""``flwr stop <run_id>`` on the live federation in ``state_dir``; whether it
    succeeded (a run that ended already cannot be stopped)."""
    state = _state(state_dir)
    fed = _read_federation(state)
    if fed is None or "superlink" not in _live_names(fed):
        raise NoFederationError(state)
    env = _child_env(state, fed["python"], fed.get("import_dir"))
    del env[STATE_ENV]
    return _stop_run(str(Path(fed["python"]).parent / "flwr"), int(run_id), env)


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
                if run_id is None and (started := STARTED.search(line)):
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
