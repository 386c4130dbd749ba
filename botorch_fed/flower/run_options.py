r"""A Flower run's options: those of ``botorch-fed run <algorithm>``, in the run config.

``botorch-fed flower run <algorithm> ...`` takes the options of ``botorch-fed run``.
They travel in the Flower run config as ``argv`` (a JSON list of the arguments after
``run``); the ServerApp and every party read them with the parser the command line
uses (:mod:`botorch_fed.runs.parser`), so a run means the same on Flower as in
process. A ``--config`` file travels as its text, not its path, in the run config's
``config`` (:func:`split_config` on the submitter's machine, :func:`decode_config` on
the server's and each party's), and is read there with the reader of the command line
(:func:`botorch_fed.runs.config.load_config_text`); nothing it says may name a file
(``out``, ``plot``, ``checkpoint``). Each party imports only its own objective and
the server none (:func:`prepare`'s ``imports``). The other run-config keys are the
deployment's own (:data:`RUN_CONFIG_DEFAULTS`).

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
    "config": "",
    "campaign": "",
    "resume": False,
    "hold": 60.0,
}
r"""The run-config keys of the botorch-fed Flower app and their defaults: ``argv`` (the
options, JSON), ``config`` (the text of the run's ``--config`` TOML file, ``""``:
none; :func:`decode_config`), ``out`` (the name of the results file:
``<server folder>/results/<out>``
on the server's machine), ``clients`` (how many parties must join), ``timeout``
(seconds a party may take to answer one message), ``on-dropout`` (``fail``: stop the
run naming the party; ``continue``: go on without it where the algorithm and backend
allow), ``server-key`` (the name of the key set whose public material the server reads:
``<server folder>/keys/<server-key>/server.key``) and ``keyset`` (the name of the key
set every party reads its own material from), ``campaign`` (a plain name: a run that
survives restarts; the server checkpoints it after every round in
``<server folder>/campaigns/<campaign>/`` and each party journals its answers,
:mod:`.campaign`; ``""``: an ordinary run), ``resume`` (continue the campaign from its
last checkpoint) and ``hold`` (seconds a party keeps a message whose answer waits for
its operator before it answers "pending" and the server asks again)."""

#: the largest ``hold`` a run config may ask (a day: a message's time to live is longer)
MAX_HOLD = 86_400.0


def run_hold(run_config) -> float:
    r"""The run config's ``hold`` in seconds (default :data:`RUN_CONFIG_DEFAULTS`'s).

    Raises:
        ValueError: If it is not a number in ``(0, MAX_HOLD]``.
    """
    value = run_config.get("hold", RUN_CONFIG_DEFAULTS["hold"])
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= MAX_HOLD:
        raise ValueError(
            f"The run config's `hold` must be in (0, {MAX_HOLD:g}] s, got {value!r:.40}."
        )
    return float(value)


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
    "config": "--config: a run's options name no file on the parties' machines; its text "
    "travels in the run config's `config` (`botorch-fed flower run --config FILE` puts it "
    "there)",
    "checkpoint": "--checkpoint: checkpoints are not written on Flower yet",
    "resume": "--resume: checkpoints are not written on Flower yet",
}
CONFIG_LABEL = "the run's config"
r"""How messages on the server's and the parties' side name the run's config file (its
text without its path): ``"`bounds` in the run's config ..."``."""
#: config-file keys that name files or folders: never in a Flower run's config
CONFIG_FILE_KEYS = {
    "out": "give --out to `botorch-fed flower run`",
    "plot": "give --plot to `botorch-fed flower run`",
    "checkpoint": "checkpoints are not written on Flower yet",
}


MAX_ARGV_CHARS = 65_536
r"""The longest run-config ``argv`` (JSON characters) a party reads: argparse slows down
quadratically in a repeated option (100,000 repeats of ``--seed 1`` kept an agent
busy for six minutes before its refusal)."""
MAX_ARGV_ENTRIES = 512
r"""The most arguments a run's ``argv`` may hold (every option of every algorithm, with
values, is well below it)."""
MAX_CONFIG_CHARS = 262_144
r"""The longest config text (characters; the file's bytes on the submitter's machine) a
run may carry: it travels with every message to every party and each one parses it
(256 KiB hold thousands of ``[[objectives]]`` tables; tomllib reads it in well under a
second)."""


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


def check_config_text(text) -> str:
    r"""``text`` if it is a run's config text: a ``str`` of at most
    :data:`MAX_CONFIG_CHARS` characters (``ValueError`` naming the run config's
    ``config`` otherwise)."""
    if not isinstance(text, str):
        raise ValueError(
            f"The run config's `config` must be the text of a TOML file (a str), got "
            f"{type(text).__name__} {text!r:.80}."
        )
    if len(text) > MAX_CONFIG_CHARS:
        raise ValueError(
            f"The run config's `config` has {len(text)} characters, more than the "
            f"{MAX_CONFIG_CHARS} a run's config may have."
        )
    return text


def _parse(parser, argv: list[str]):
    r"""``parser.parse_args(["run", *argv])``; argparse's error as a ``ValueError``."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            return parser.parse_args(["run", *argv])
    except SystemExit:
        lines = [line for line in err.getvalue().splitlines() if line.strip()]
        message = lines[-1] if lines else f"invalid options {argv}"
        # argparse's "<prog>: error: <message>": callers print their own "error:"
        raise ValueError(re.sub(r"^[^:]*: error: ", "", message, count=1)) from None


def prepare(
    argv: list[str],
    check=None,
    outputs: bool = False,
    config_text: str | None = None,
    config_file: str | None = None,
    imports="all",
):
    r"""The checked run (:class:`~botorch_fed.runs.prepare.PreparedRun`) of ``argv``
    and its config file's text.

    Args:
        argv: ``[algorithm, *options]`` as after ``botorch-fed run`` (no ``--config``).
        check: Called with the parsed options (an ``argparse.Namespace``, the config
            file's values in it) before anything they name is imported or built (a
            party's policy, :meth:`~.policy.PartyPolicy.check_options`). With a config
            file, ``args.objective_tables`` holds its objective tables
            (:class:`~botorch_fed.runs.black_box.ObjectiveTables`, or ``None``) and
            ``args.imports`` is ``imports``; ``args.clients`` is the number of
            ``[[objectives]]`` tables when no ``clients`` is given.
        outputs: Whether ``--out`` / ``--plot`` may be given (the command line, on the
            submitter's machine). A run's options never carry them: their checks would
            tell the run's submitter which files exist on a party's machine. A config
            file never names a file (:data:`CONFIG_FILE_KEYS`).
        config_text: The run's ``--config`` TOML text (``None`` or ``""``: none;
            :func:`decode_config`), read as ``botorch-fed run --config`` reads its file.
        config_file: The file ``config_text`` was read from (the submitter's, named in
            messages; never read or imported from); ``None``: :data:`CONFIG_LABEL`.
        imports: Whose of the user's functions are imported: ``"all"``, a client id (a
            party's agent: its own), or ``None`` (the server and the submitter: none);
            the others are :class:`~botorch_fed.runs.black_box.RemoteObjective`.

    Raises:
        ValueError: An invalid option or config file (argparse's message, or the
            command line's check naming the flag or the key), or one a Flower run
            does not take.
    """
    from botorch_fed.runs.black_box import check_imports, objective_tables
    from botorch_fed.runs.config import config_sources, load_config_text
    from botorch_fed.runs.parser import build_run_parser
    from botorch_fed.runs.prepare import prepare_run

    check_argv(argv)
    check_imports(imports)
    if config_text is not None:
        check_config_text(config_text)
    parser = build_run_parser()
    args = _parse(parser, argv)
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
    algorithm_parser, options = parser.run_parsers[args.algorithm]
    sources: dict[str, str] = {}
    config, counted = None, False
    if config_text:
        path = CONFIG_LABEL if config_file is None else config_file
        defaults, config = load_config_text(config_text, args.algorithm, options, path)
        for dest, why in CONFIG_FILE_KEYS.items():
            if dest in defaults:
                raise ValueError(
                    f"{defaults[dest].label}: a Flower run's config names no file on the "
                    f"server's or the parties' machines ({why})."
                )
        algorithm_parser.set_defaults(**defaults)
        args = _parse(parser, argv)
        sources = config_sources(args)
        tables = objective_tables(args, sources, config)
        if tables is not None and not tables.shared and args.clients is None:
            args.clients = len(tables.tables)  # for the check: one per [[objectives]] table
            counted = True
        for name, value in config.settings_extra.items():  # settings without a flag
            setattr(args, f"settings.{name}", value)
        args.objective_tables, args.imports = tables, imports
    if check is not None:
        check(args)
    if counted:  # built as the command line builds it
        args.clients = None
    return prepare_run(args, options, sources, config, imports)


def decode_config(run_config) -> str | None:
    r"""The ``--config`` text of a run config (``None``: the run has none).

    Raises:
        ValueError: Naming the run config's ``config``: not a str, or longer than
            :data:`MAX_CONFIG_CHARS`.
    """
    raw = run_config.get("config", "") if hasattr(run_config, "get") else ""
    return check_config_text(raw) or None


def split_config(argv: list[str]) -> tuple[list[str], str | None, str | None]:
    r"""``(argv without --config, the config file's path, its text)`` of the options
    of ``botorch-fed flower run`` (``(argv, None, None)`` without ``--config``): the
    text travels in the run config's ``config``, the options without the path.

    Raises:
        ValueError: Invalid options (argparse's message), or a config file that is
            missing, unreadable, not UTF-8 or larger than :data:`MAX_CONFIG_CHARS` bytes.
    """
    from botorch_fed.runs.config import read_config
    from botorch_fed.runs.parser import build_run_parser

    check_argv(argv)
    args = _parse(build_run_parser(), argv)
    if args.config is None:
        return list(argv), None, None
    rest, skip = [], False
    for arg in argv:  # every spelling argparse took for --config: --config F, --conf=F
        name = arg.split("=", 1)[0]
        if skip:
            skip = False
        elif len(name) > 3 and "--config".startswith(name):  # --co...: --config only
            skip = "=" not in arg
        else:
            rest.append(arg)
    # (a spelling missed here stays in the options, which prepare() refuses)
    return rest, args.config, read_config(args.config, max_bytes=MAX_CONFIG_CHARS)


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
