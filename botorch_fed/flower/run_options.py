r"""A Flower run's options: those of ``botorch-fed run <algorithm>``, in the run config.

``botorch-fed flower run <algorithm> ...`` takes the options of ``botorch-fed run``.
They travel in the Flower run config as ``argv`` (a JSON list of the arguments after
``run``); the ServerApp and every party read them with the parser the command line
uses (:mod:`botorch_fed.runs.parser`), so a run means the same on Flower as in
process. The other run-config keys are the deployment's own (:data:`RUN_CONFIG_DEFAULTS`).

Whoever submits a run chooses its run config, but not where the ServerApp reads and
writes: the ServerApp's operator gives it a folder, the environment variable
:data:`SERVER_DIR_ENV` of the SuperLink (which the ServerApp process inherits;
``botorch-fed flower up`` sets it to its state folder), and the run config only names
files inside it: ``out`` a results file under ``<folder>/results/``
(:func:`results_files`), ``server-key`` a key set under ``<folder>/keys/``
(:func:`server_key_file`). Neither reaches outside the folder: no absolute paths, no
``..``, no path separators, no links on the way.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
from pathlib import Path

RUN_CONFIG_DEFAULTS: dict[str, str | int | float | bool] = {
    "argv": "[]",
    "out": "",
    "clients": 0,
    "timeout": 120.0,
    "on-dropout": "fail",
    "server-key": "",
    "keyset": "",
}
r"""The run-config keys of the botorch-fed Flower app and their defaults: ``argv`` (the
options, JSON), ``out`` (the name of the results file: ``<server folder>/results/<out>``
on the server's machine), ``clients`` (how many parties must join), ``timeout``
(seconds a party may take to answer one message), ``on-dropout`` (``fail``: stop the
run naming the party; ``continue``: go on without it where the algorithm and backend
allow), ``server-key`` (the name of the key set whose public material the server reads:
``<server folder>/keys/<server-key>/server.key``) and ``keyset`` (the name of the key
set every party reads its own material from)."""

SERVER_DIR_ENV = "BOTORCH_FED_SERVER_DIR"
r"""The environment variable naming the ServerApp's folder (an absolute path): where it
writes results (``results/``) and reads the server's key material (``keys/``). Its
operator sets it on the SuperLink; Flower's SuperExec and ServerApp processes inherit
it (``flwr`` 1.41 starts both with the parent's environment)."""
RESULTS_DIR = "results"
KEYS_DIR = "keys"
SERVER_KEY = "server.key"
#: a file or key-set name in the server's folder: no separators, no "..", no leading dot
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")

ON_DROPOUT = ("fail", "continue")
#: how the ServerApp's log line naming its results file starts
RESULTS_WRITTEN = "results written to "

NOT_ON_FLOWER = {
    "config": "--config: give the options on the command line",
    "checkpoint": "--checkpoint: checkpoints are not written on Flower yet",
    "resume": "--resume: checkpoints are not written on Flower yet",
}


MAX_ARGV_CHARS = 65_536
r"""The longest run-config ``argv`` (JSON characters) a party reads: argparse slows down
quadratically in a repeated option (100,000 repeats of ``--seed 1`` kept an agent
busy for six minutes before its refusal)."""
MAX_ARGV_ENTRIES = 512
r"""The most arguments a run's ``argv`` may hold (every option of every algorithm, with
values, is well below it)."""


def check_argv(argv: list[str]) -> list[str]:
    r"""``argv`` if it is a non-empty list of at most :data:`MAX_ARGV_ENTRIES` str
    (``ValueError`` otherwise)."""
    if not isinstance(argv, list) or not all(isinstance(a, str) for a in argv) or not argv:
        raise ValueError(f"`argv` must be a non-empty list of str, got {argv!r:.80}.")
    if len(argv) > MAX_ARGV_ENTRIES:
        raise ValueError(
            f"`argv` has {len(argv)} arguments, more than the {MAX_ARGV_ENTRIES} a run may have."
        )
    return argv


OUTPUTS = ("out", "plot")


def prepare(argv: list[str], check=None, outputs: bool = False):
    r"""The checked run (:class:`~botorch_fed.runs.prepare.PreparedRun`) of ``argv``.

    Args:
        argv: ``[algorithm, *options]`` as after ``botorch-fed run``.
        check: Called with the parsed options (an ``argparse.Namespace``) before
            anything they name is imported or built (a party's policy).
        outputs: Whether ``--out`` / ``--plot`` may be given (the command line, on the
            submitter's machine). A run's options never carry them: their checks would
            tell the run's submitter which files exist on a party's machine.

    Raises:
        ValueError: An invalid option (argparse's message, or the command line's check
            naming the flag), or one a Flower run does not take.
    """
    from botorch_fed.runs.parser import build_run_parser
    from botorch_fed.runs.prepare import prepare_run

    check_argv(argv)
    parser = build_run_parser()
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            args = parser.parse_args(["run", *argv])
    except SystemExit:
        lines = [line for line in err.getvalue().splitlines() if line.strip()]
        message = lines[-1] if lines else f"invalid options {argv}"
        # argparse's "<prog>: error: <message>": callers print their own "error:"
        raise ValueError(re.sub(r"^[^:]*: error: ", "", message, count=1)) from None
    for dest, why in NOT_ON_FLOWER.items():
        if getattr(args, dest, None):
            flag, reason = why.split(": ", 1)
            raise ValueError(f"{flag} is not available on Flower: {reason}.")
    for dest in OUTPUTS if not outputs else ():
        if getattr(args, dest, None) is not None:
            raise ValueError(
                f"--{dest} cannot be among a Flower run's options (the run config's `out` "
                "names the results file on the server's machine)."
            )
    if check is not None:
        check(args)
    options = parser.run_parsers[args.algorithm][1]
    return prepare_run(args, options, {}, None)


def decode_argv(run_config) -> list[str]:
    r"""The ``argv`` of a run config (``ValueError`` naming it when it is not a JSON
    list of str)."""
    raw = run_config.get("argv") if hasattr(run_config, "get") else None
    if isinstance(raw, str) and len(raw) > MAX_ARGV_CHARS:
        raise ValueError(
            f"The run config's `argv` has {len(raw)} characters, more than the "
            f"{MAX_ARGV_CHARS} a run may have."
        )
    try:
        argv = json.loads(run_config["argv"])
    except (KeyError, TypeError, ValueError):
        raise ValueError(
            f"The run config's `argv` must be a JSON list of str, got "
            f"{run_config.get('argv')!r:.80}."
        ) from None
    return check_argv(argv)


def server_dir(environ=None) -> Path:
    r"""The ServerApp's folder, from its operator (:data:`SERVER_DIR_ENV`), links resolved.

    Raises:
        ValueError: The variable is not set, not an absolute path, or not a folder.
    """
    value = (os.environ if environ is None else environ).get(SERVER_DIR_ENV, "")
    how = (
        f"start the SuperLink with {SERVER_DIR_ENV}=<folder> in its environment, the folder "
        "where the ServerApp writes results and reads the server's key material "
        "(`botorch-fed flower up` gives it its state folder)"
    )
    if not value:
        raise ValueError(f"The ServerApp has no folder of its own: {how}.")
    if not os.path.isabs(value) or not os.path.isdir(value):
        raise ValueError(f"{SERVER_DIR_ENV}={value!r} is not an absolute path of a folder: {how}.")
    return Path(os.path.realpath(value))


def _name(value, key: str, what: str) -> str:
    r"""``value`` if it is a plain name (``ValueError`` naming the run-config ``key``)."""
    if not isinstance(value, str) or not _NAME.fullmatch(value) or ".." in value:
        raise ValueError(
            f"The run config's `{key}` must name {what}: 1-128 letters, digits, '_', '.' or "
            f"'-', no path (no '/', no '..'), got {value!r:.80}."
        )
    return value


def _inside(folder: Path, parts: tuple[str, ...], key: str) -> Path:
    r"""``folder/parts...``, refused when a link on the way (one that exists) leads
    elsewhere: the path must be the one it resolves to."""
    root = Path(os.path.realpath(folder))
    path = root.joinpath(*parts)
    if Path(os.path.realpath(path)) != path:
        raise ValueError(
            f"The run config's `{key}` leads out of the server's folder: "
            f"{'/'.join(parts)} there is, or passes through, a link."
        )
    return path


def results_files(folder: str | os.PathLike, out) -> tuple[Path, Path]:
    r"""``(results file, error file)`` of the run config's ``out`` in the server's
    ``folder``: ``<folder>/results/<out>`` and ``<folder>/results/<out>.error``.

    Raises:
        ValueError: ``out`` is not a plain file name, or a link on the way leads out of
            the folder.
    """
    name = _name(out, "out", "a results file in the server's folder (results/<out>)")
    folder = Path(folder)
    return (
        _inside(folder, (RESULTS_DIR, name), "out"),
        _inside(folder, (RESULTS_DIR, f"{name}.error"), "out"),
    )


def server_key_file(folder: str | os.PathLike, keyset) -> Path:
    r"""The server's key material of the run config's ``server-key``:
    ``<folder>/keys/<server-key>/server.key``.

    Raises:
        ValueError: ``server-key`` is not a plain key-set name, or a link on the way
            leads out of the folder.
    """
    what = "a key set in the server's folder (keys/<server-key>/server.key)"
    name = _name(keyset, "server-key", what)
    return _inside(Path(folder), (KEYS_DIR, name, SERVER_KEY), "server-key")
