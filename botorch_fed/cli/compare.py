r"""``botorch-fed compare ALG [ALG ...] --seeds N --jobs J --out DIR [run options]``:
several algorithms on the same federation and seeds, with a progress bar, a table and
paired statistics (:func:`~botorch_fed.runs.compare.compare_algorithms`).

The run options are ``run <algorithm>``'s, checked by each algorithm's own parser; an
option that only some of the algorithms take (``--aggregator``, ``--support``) goes to
those, and the others are listed as ignoring it. Exit codes: 0 done, 2 invalid
arguments, 1 a run failed, 130 interrupted (the finished runs are kept in ``--out``).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import textwrap

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from botorch_fed.cli.errors import print_error

# run options a comparison writes or continues itself
_REFUSED = {
    "--plot": "compare draws its own plot into --out DIR",
    "--checkpoint": "compare keeps every finished run in --out DIR (rerun to continue)",
    "--resume": "compare continues from the runs in --out DIR (rerun the same command)",
}


def add_compare_parser(sub: argparse._SubParsersAction) -> None:
    r"""The ``compare`` sub-command's parser (its run options are parsed per algorithm)."""
    from botorch_fed.algorithms import available_algorithms

    p = sub.add_parser(
        "compare",
        help="run several algorithms on the same federation and seeds, with statistics",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=textwrap.fill(
            "Run each algorithm on the same problem and seeds (processes in parallel), then "
            "print and write per algorithm the final simple regret's mean +- standard error "
            "and median, the worst client's regret, wins against the first algorithm and a "
            "paired Wilcoxon signed-rank test against it, Holm-corrected. Finished runs are "
            "kept in --out DIR and not run again.",
            88,
        ),
        epilog=textwrap.dedent(
            """\
            run options: those of `botorch-fed run ALG` (--problem, --dim, --clients, --shift,
            --rotation, --noise-std, --rounds, --seed (the first seed), --config, ...), each
            checked by every algorithm that takes it.

            example:
              botorch-fed compare fbo-fedgp local central --problem hartmann --dim 6 \\
                  --clients 5 --rounds 15 --seeds 6 --jobs 2 --out cmp"""
        ),
    )
    p.add_argument(
        "algorithms", nargs="+", choices=available_algorithms(), metavar="ALG",
        help="algorithms to compare (the first is the reference of the tests)",
    )  # fmt: skip
    p.add_argument("--seeds", type=int, default=5, help="seeds per algorithm (default: 5)")
    p.add_argument("--jobs", type=int, default=1, help="parallel processes (default: 1)")
    p.add_argument("--out", required=True, metavar="DIR", help="folder of runs and summary")


def _groups(rest: list[str], parsers: dict) -> list[tuple[str, list[str]]]:
    r"""``rest`` as ``(flag, tokens)`` groups, each flag known to at least one algorithm."""
    actions: dict[str, argparse.Action] = {}
    for parser, _ in parsers.values():
        actions.update(parser._option_string_actions)
    out, i = [], 0
    while i < len(rest):
        token = rest[i]
        flag = token.split("=", 1)[0]
        if not flag.startswith("--"):
            raise ValueError(f"unexpected argument {token!r} (algorithms come first).")
        if flag in _REFUSED:
            raise ValueError(f"{flag}: {_REFUSED[flag]}.")
        if flag in ("--help", "-h") or flag not in actions:
            raise ValueError(f"{flag} is not an option of `run` for any of the algorithms.")
        takes_value = actions[flag].nargs != 0 and "=" not in token
        if takes_value and i + 1 >= len(rest):
            raise ValueError(f"{flag} expects a value.")
        tokens = rest[i : i + (2 if takes_value else 1)]
        out.append((flag, tokens))
        i += len(tokens)
    return out


def _prepare(parser, algorithm: str, argv: list[str]):
    r"""The :class:`~botorch_fed.runs.prepare.PreparedRun` of ``run <algorithm> argv``."""
    from botorch_fed.cli import _parse, _parse_with_config
    from botorch_fed.runs.prepare import prepare_run

    full = ["run", algorithm, *argv]
    args = _parse(parser, full)
    if not isinstance(args, argparse.Namespace):
        raise ValueError(f"the run options of {algorithm} were refused (above).")
    sources: dict[str, str] = {}
    config = None
    if args.config:
        args, sources, config = _parse_with_config(parser, full, args)
        if not isinstance(args, argparse.Namespace):
            raise ValueError(f"the run options of {algorithm} were refused (above).")
    return prepare_run(args, parser.run_parsers[algorithm][1], sources, config)


def compare_main(parser, args: argparse.Namespace, rest: list[str], console: Console) -> int:
    r"""``botorch-fed compare``; returns the exit code (module docstring)."""
    from botorch_fed.runs.black_box import import_path
    from botorch_fed.runs.compare import compare_algorithms
    from botorch_fed.runs.prepare import library_warnings_ignored

    algorithms = list(dict.fromkeys(args.algorithms))
    try:
        if args.seeds < 1:
            raise ValueError(f"--seeds {args.seeds} must be >= 1.")
        if args.jobs < 1:
            raise ValueError(f"--jobs {args.jobs} must be >= 1.")
        run_parsers = {a: parser.run_parsers[a] for a in algorithms}
        groups = _groups(rest, run_parsers)
        prepared, ignored = {}, {}
        for a in algorithms:
            known = run_parsers[a][0]._option_string_actions
            kept = [t for flag, tokens in groups if flag in known for t in tokens]
            ignored[a] = [flag for flag, _ in groups if flag not in known]
            try:
                prepared[a] = _prepare(parser, a, kept)
            except (ValueError, ImportError) as exc:
                raise ValueError(f"{a}: {exc}") from None
    except (ValueError, ImportError) as exc:
        print_error(console, str(exc))
        return 2
    for a, flags in ignored.items():
        if flags:
            console.print(f"{a} does not take {', '.join(flags)} (ignored for it)", style="dim")
    folders = list(dict.fromkeys(f for p in prepared.values() for f in p.folders))
    total = len(algorithms) * args.seeds
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[last]}"),
        TimeElapsedColumn(),
        console=console,
    ) as progress:
        task = progress.add_task("runs", total=total, last="")

        def on_run(record: dict, done: int, total: int) -> None:
            score = record["score"]
            last = f"{record['algorithm']} seed {record['seed']}: " + (
                "no score" if score is None else f"{score:.4g}"
            )
            progress.update(task, completed=done, last=escape(last))

        try:
            with import_path(folders), library_warnings_ignored():
                comparison = compare_algorithms(
                    {a: p.settings for a, p in prepared.items()},
                    {a: p.setup for a, p in prepared.items()},
                    seeds=args.seeds,
                    jobs=args.jobs,
                    out=args.out,
                    on_run=on_run,
                )
        except KeyboardInterrupt:
            print_error(
                console,
                f"the finished runs are kept in {args.out}: the same command continues.",
                "interrupted:",
            )
            return 130
        except ValueError as exc:  # the --out folder of another comparison
            print_error(console, rename_out(str(exc)))
            return 2
        except Exception as exc:  # a run failed (its black box, a bug): the rest is kept
            print_error(
                console,
                f"{type(exc).__name__}: {exc}; the finished runs are kept in {args.out}.",
                "a run failed:",
            )
            return 1
    print_summary(comparison.summary, console)
    written = "summary.json, summary.md"
    if importlib.util.find_spec("matplotlib") is not None:  # an extra
        from botorch_fed.plotting import plot_comparison

        plot = os.path.join(args.out, "summary.png")
        try:
            plot_comparison(comparison.summary, comparison.records, plot)
            written += ", summary.png"
        except (OSError, ValueError) as exc:
            print_error(console, f"the plot could not be drawn ({exc}).")
    console.print(f"every run in {escape(args.out)}/runs; {written} there", soft_wrap=True)
    return 0


def rename_out(message: str) -> str:
    return message.replace("`out`", "--out")


def print_summary(summary: dict, console: Console) -> None:
    r"""The comparison's table (``summary.md``'s rows) and one line per comparison."""
    ref = summary["reference"]
    metric = summary["metric"] if isinstance(summary["metric"], str) else "score"
    table = Table(title=f"final {metric} over {len(summary['seeds'])} seeds (lower is better)")
    for col in ("algorithm", "mean", "s.e.", "median", "worst client", "wins/losses", "p (Holm)"):
        table.add_column(col, justify="left" if col == "algorithm" else "right")

    def num(v, digits=4):
        return "-" if v is None else f"{v:.{digits}g}"

    lines = []
    for a, st in summary["algorithms"].items():
        wins = "-" if a == ref else f"{st['wins']}/{st['losses']}"
        row = (num(st["mean"]), num(st["se"], 2), num(st["median"]), num(st["worst_client_mean"]))
        table.add_row(a, *row, wins, num(st.get("p_holm"), 3))
        if a != ref and st["paired"]:
            lines.append(
                f"{a} against {ref}: lower on {st['wins']} of {st['paired']} seeds, higher on "
                f"{st['losses']} (paired two-sided Wilcoxon p = {num(st['p'], 3)}, Holm "
                f"{num(st.get('p_holm'), 3)})"
            )
    console.print(table)
    console.print("worst client: the mean over seeds of the worst client's own final regret")
    for line in lines:
        console.print(line, soft_wrap=True)
