r"""The ``botorch-fed`` command line.

Subcommands:

- ``botorch-fed run <algorithm>``: a federated optimisation with any registered
  algorithm (:func:`~botorch_fed.protocol.registry.available_algorithms`: ``fbo-fedgp`` and
  the baselines ``local``, ``central``, ``fts``, ``random``) on a built-in test
  function (``--problem``) or the user's own black box (``--objective
  module:function --bounds ...``, or per-client functions in a ``--config`` TOML
  file), with a progress bar per round, a result table, ``--out`` JSON, ``--plot``
  convergence curve and ``--checkpoint`` / ``--resume``. Each algorithm has its own
  sub-parser whose options are generated from its settings dataclass (flag names
  from the field names, help from the ``Attributes:`` section of its docstring,
  choices from the fields' ``Choice`` domains), so ``botorch-fed run local
  --help`` lists only what ``local`` takes.
- ``botorch-fed compare ALG [ALG ...] --seeds N --jobs J --out DIR [run options]``:
  several algorithms on the same federation and seeds, with a table and paired
  statistics (:mod:`~botorch_fed.cli.compare`).
- ``botorch-fed grid ALG --seeds R [--device cpu|cuda] --out DIR [run options]``: many
  seeds as one batched program (:mod:`botorch_fed.experiments`), records as ``compare``'s.
- ``botorch-fed list``: the registered algorithms, one line each.
- ``botorch-fed flower up | run | down | status``: the same runs on a Flower
  federation of real processes (:mod:`~botorch_fed.cli.flower`).
- ``botorch-fed party status | suggest | report``: an ask/tell party's operator
  (:mod:`~botorch_fed.cli.party`); parsed on its own, so it loads neither torch nor the
  algorithms.
- ``botorch-fed demo``: federated sparse-GP regression on simulated clients; prints
  a table of test RMSE / NLL and timings for each client's own GP, the federated
  dPITC model and an exact GP on pooled data.

Exit codes: 0 success; 2 invalid arguments (argparse's own errors included), with a
message naming the flag or the config file's key, before anything runs; 1 a run
stopped by its black box (``--fail-on-error``, a wrong return shape) or failing, or
results that could not be written; 130 an interrupted run.

Modules: :mod:`~botorch_fed.cli.parser` (the parser), :mod:`~botorch_fed.cli.run` (a
run with its progress bar), :mod:`~botorch_fed.cli.report` (tables, plot),
:mod:`~botorch_fed.cli.demo`, :mod:`~botorch_fed.cli.flower` (with
:mod:`~botorch_fed.cli.campaign_record`), :mod:`~botorch_fed.cli.party`,
:mod:`~botorch_fed.cli.errors`. A run's options, checks
and output files are described one layer down, in :mod:`botorch_fed.runs` (the Flower
apps parse them too).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from rich.console import Console

from botorch_fed.cli.errors import print_error

if TYPE_CHECKING:
    from botorch_fed.runs.parser import CommandParser

__all__ = ["build_parser", "main"]


def build_parser() -> CommandParser:
    r"""The whole command line's parser (:func:`botorch_fed.cli.parser.build_parser`)."""
    from botorch_fed.cli.parser import build_parser as build

    return build()


def _parse(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace | int:
    r"""``parser.parse_args(argv)``, or the exit code argparse asked for (``--help``,
    ``--version``: 0; invalid arguments: 2, with its message on stderr)."""
    try:
        return parser.parse_args(argv)
    except SystemExit as exc:
        code = exc.code
        return code if isinstance(code, int) else (0 if code is None else 2)


def _parse_with_config(parser: CommandParser, argv: list[str], args: argparse.Namespace):
    r"""Parse again with the ``--config`` file's values as defaults; returns
    ``(args, sources, config)`` where ``sources`` maps each ``dest`` whose value came
    from the file to its key (``args`` is argparse's exit code if it refused)."""
    from botorch_fed.runs.config import FromConfig, load_config

    algorithm_parser, options = parser.run_parsers[args.algorithm]
    defaults, config = load_config(args.config, args.algorithm, options)
    algorithm_parser.set_defaults(**defaults)
    parsed = _parse(parser, argv)
    sources: dict[str, str] = {}
    if isinstance(parsed, argparse.Namespace):
        for dest, value in vars(parsed).items():
            if isinstance(value, FromConfig):
                setattr(parsed, dest, value.value)
                sources[dest] = value.label
    return parsed, sources, config


def _list(console: Console) -> int:
    r"""``botorch-fed list``: one line per registered algorithm."""
    from botorch_fed.algorithms import available_algorithms, get_algorithm

    specs = [get_algorithm(n) for n in available_algorithms()]
    secure = {s.name: "yes (--aggregator)" if s.secure_aggregation else "no" for s in specs}
    width = max(len(n) for n in (*secure, "algorithm"))
    swidth = max(len(s) for s in (*secure.values(), "secure aggregation"))

    def line(text: str) -> None:
        console.print(text, markup=False, highlight=False, soft_wrap=True)

    line(f"{'algorithm':<{width}}  {'secure aggregation':<{swidth}}  summary")
    for spec in specs:
        line(f"{spec.name:<{width}}  {secure[spec.name]:<{swidth}}  {spec.summary}")
    line("`botorch-fed run <algorithm> --help` lists an algorithm's options.")
    return 0


def _demo(args: argparse.Namespace, console: Console) -> int:
    r"""``botorch-fed demo``."""
    from botorch_fed.cli.demo import demo_config, run_demo
    from botorch_fed.runs.outputs import check_output_paths, write_json

    try:
        check_output_paths({"out": ("--out", args.out)})
        config = demo_config(args)
    except (ValueError, ImportError) as e:
        print_error(console, str(e))
        return 2
    try:
        results = run_demo(config, console)
    except (ValueError, ImportError, OSError) as exc:
        print_error(console, f"{type(exc).__name__}: {exc}", "the demo failed:")
        return 1
    if args.out:
        try:
            write_json(results, args.out)
        except (OSError, TypeError, ValueError) as exc:
            print_error(console, f"--out {args.out}: the results could not be written ({exc}).")
            return 1
        console.print(f"results written to {args.out}", markup=False, soft_wrap=True)
    return 0


def _run(parser, argv: list[str], args: argparse.Namespace, console: Console) -> int:
    r"""``botorch-fed run <algorithm>``."""
    from botorch_fed.cli.run import execute_run
    from botorch_fed.runs.prepare import prepare_run

    sources: dict[str, str] = {}
    config = None
    try:
        if args.config:
            args, sources, config = _parse_with_config(parser, argv, args)
            if not isinstance(args, argparse.Namespace):
                return args
        options = parser.run_parsers[args.algorithm][1]
        prepared = prepare_run(args, options, sources, config)
    except (ValueError, ImportError) as e:
        print_error(console, str(e))
        return 2
    return execute_run(prepared, console)


def _join_negative_values(argv: list[str]) -> list[str]:
    r"""``--bounds -2,3;0,1`` as ``--bounds=-2,3;0,1``: argparse reads a value starting
    with ``-`` (a negative lower bound) as an option otherwise."""
    out: list[str] = []
    i = 0
    while i < len(argv):
        if argv[i] == "--bounds" and i + 1 < len(argv) and argv[i + 1][:1] == "-":
            nxt = argv[i + 1]
            if len(nxt) > 1 and (nxt[1].isdigit() or nxt[1] == "."):
                out.append(f"--bounds={nxt}")
                i += 2
                continue
        out.append(argv[i])
        i += 1
    return out


def _party(argv: list[str]) -> int:
    r"""``botorch-fed party ...`` with a parser of that command only (the same as
    :func:`build_parser`'s), so that it starts without torch or the algorithms."""
    from botorch_fed import __version__
    from botorch_fed.cli.party import add_party_parser, party_main

    parser = argparse.ArgumentParser(prog="botorch-fed")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    add_party_parser(parser.add_subparsers(dest="command", required=True))
    joined: list[str] = []  # `--value -1e3`, `--failed -broken`: values, not options
    for token in argv:
        if joined[-1:] in (["--value"], ["--failed"]) and token.startswith("-"):
            joined[-1] = f"{joined[-1]}={token}"
        else:
            joined.append(token)
    args = _parse(parser, joined)
    if not isinstance(args, argparse.Namespace):
        return args
    return party_main(args, Console())


def main(argv: Sequence[str] | None = None) -> int:
    r"""Entry point of the ``botorch-fed`` console script.

    Args:
        argv: Arguments (default: ``sys.argv[1:]``).

    Returns:
        The exit code: 0 success, 1 a run stopped by its black box or failing (or
        results that could not be written), 2 invalid arguments (argparse's own errors
        included), 130 an interrupted run.
    """
    argv = _join_negative_values(list(sys.argv[1:] if argv is None else argv))
    if argv[:1] == ["party"]:  # an operator's command: no algorithm is loaded
        return _party(argv)
    parser = build_parser()
    if argv[:1] in (["compare"], ["grid"]):  # their run options are parsed per algorithm
        from botorch_fed.cli.compare import compare_main

        try:
            known, rest = parser.parse_known_args(argv)
        except SystemExit as exc:
            return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
        return compare_main(parser, known, rest, Console())
    args = _parse(parser, argv)
    if not isinstance(args, argparse.Namespace):
        return args
    console = Console()
    if args.command == "list":
        return _list(console)
    if args.command == "demo":
        return _demo(args, console)
    if args.command == "flower":
        from botorch_fed.cli.flower import flower_main

        return flower_main(args, console)
    if args.command == "party":
        from botorch_fed.cli.party import party_main

        return party_main(args, console)
    return _run(parser, argv, args, console)
