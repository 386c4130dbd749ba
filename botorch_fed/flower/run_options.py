r"""A Flower run's options: those of ``botorch-fed run <algorithm>``, in the run config.

``botorch-fed flower run <algorithm> ...`` takes the options of ``botorch-fed run``.
They travel in the Flower run config as ``argv`` (a JSON list of the arguments after
``run``); the ServerApp and every party read them with the parser the command line
uses (:mod:`botorch_fed.runs.parser`), so a run means the same on Flower as in
process. The other run-config keys are the deployment's own (:data:`RUN_CONFIG_DEFAULTS`).
"""

from __future__ import annotations

import contextlib
import io
import json
import re

RUN_CONFIG_DEFAULTS = {
    "argv": "[]",
    "out": "",
    "clients": 0,
    "timeout": 120.0,
    "on-dropout": "fail",
    "server-key": "",
    "keyset": "",
}
r"""The run-config keys of the botorch-fed Flower app and their defaults: ``argv`` (the
options, JSON), ``out`` (absolute path of the results JSON on the server's machine),
``clients`` (how many parties must join), ``timeout`` (seconds a party may take to
answer one message), ``on-dropout`` (``fail``: stop the run naming the party;
``continue``: go on without it where the algorithm and backend allow), ``server-key``
(path of the server's public key material on the server's machine) and ``keyset``
(the name of the key set every party reads its own material from)."""

ON_DROPOUT = ("fail", "continue")
#: how the ServerApp's log line naming its results file starts
RESULTS_WRITTEN = "results written to "

NOT_ON_FLOWER = {
    "config": "--config: give the options on the command line",
    "checkpoint": "--checkpoint: checkpoints are not written on Flower yet",
    "resume": "--resume: checkpoints are not written on Flower yet",
}


def check_argv(argv: list[str]) -> list[str]:
    r"""``argv`` if it is a non-empty list of str (``ValueError`` otherwise)."""
    if not isinstance(argv, list) or not all(isinstance(a, str) for a in argv) or not argv:
        raise ValueError(f"`argv` must be a non-empty list of str, got {argv!r:.80}.")
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
    try:
        argv = json.loads(run_config["argv"])
    except (KeyError, TypeError, ValueError):
        raise ValueError(
            f"The run config's `argv` must be a JSON list of str, got "
            f"{run_config.get('argv')!r:.80}."
        ) from None
    return check_argv(argv)
