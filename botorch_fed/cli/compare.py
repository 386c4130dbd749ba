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
import contextlib
import importlib.util
import io
import os
import textwrap

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from botorch_fed.cli.errors import print_error

# run options every algorithm must take: the initial designs and the budget
_SHARED = {"settings.num_init", "settings.num_rounds"}
# run options a comparison writes or continues itself
_REFUSED = {
    "--plot": "compare draws its own plot into --out DIR",
    "--checkpoint": "compare keeps every finished run in --out DIR (rerun to continue)",
    "--resume": "compare continues from the runs in --out DIR (rerun the same command)",
}


def add_compare_parser(sub: argparse._SubParsersAction) -> None:
    r"""The ``compare`` sub-command's parser (its run options are parsed per algorithm)."""
    from botorch_fed.algorithms import available_algorithms
    from botorch_fed.experiments import GRID_ALGORITHMS

    p = sub.add_parser(
        "compare",
        allow_abbrev=False,  # --seed is a run option (the first seed), not --seeds
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
    _add_batched(p)
    g = sub.add_parser(
        "grid",
        allow_abbrev=False,
        help="run many seeds of one algorithm as one batched program (CPU or GPU)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=textwrap.fill(
            "Run R seeds of ALG as one batched tensor program (every seed's every client one "
            "member of a batched GP and a batched search; botorch_fed.experiments) and write "
            "the per-seed records `compare` reads (`compare ... --batched --out DIR` reuses "
            "them), with the same table. Batched: local, central, random, fbo-fedgp "
            "(default), the LDP-BO algorithms (finite domains).",
            88,
        ),
        epilog="run options: those of `botorch-fed run ALG`.",
    )
    g.add_argument(
        "algorithms",
        nargs=1,
        choices=GRID_ALGORITHMS,
        metavar="ALG",
        help=f"one of {', '.join(GRID_ALGORITHMS)}",
    )
    g.add_argument("--seeds", type=int, default=5, help="seeds (default: 5)")
    g.add_argument("--out", required=True, metavar="DIR", help="folder of runs and summary")
    g.add_argument("--device", default=None, help="cpu (default) or cuda")
    g.set_defaults(jobs=1, batched=True)


def _add_batched(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--batched",
        action="store_true",
        help="run each algorithm's seeds as one batched program (local, central, random, "
        "fbo-fedgp)",
    )
    p.add_argument("--device", default=None, help="the batched runner's device: cpu or cuda")


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
            raise ValueError(
                f"{flag} is not an option of `run` for {', '.join(parsers)} (`botorch-fed run "
                "ALG --help` lists each one's)."
            )
        takes_value = actions[flag].nargs != 0 and "=" not in token
        if takes_value and i + 1 >= len(rest):
            raise ValueError(f"{flag} expects a value.")
        tokens = rest[i : i + (2 if takes_value else 1)]
        out.append((flag, tokens))
        i += len(tokens)
    return out


def _dest(parsers: dict, flag: str) -> str | None:
    r"""The ``dest`` of ``flag`` in whichever of the run ``parsers`` knows it."""
    for parser, _ in parsers.values():
        action = parser._option_string_actions.get(flag)
        if action is not None:
            return action.dest
    return None


def _prepare(parser, algorithm: str, argv: list[str]):
    r"""The :class:`~botorch_fed.runs.prepare.PreparedRun` of ``run <algorithm> argv``."""
    from botorch_fed.cli import _parse, _parse_with_config
    from botorch_fed.runs.prepare import prepare_run

    full = ["run", algorithm, *argv]
    errors = io.StringIO()  # argparse's usage of `run ALG` would drown its one-line error
    with contextlib.redirect_stderr(errors):
        args = _parse(parser, full)
        sources: dict[str, str] = {}
        config = None
        if isinstance(args, argparse.Namespace) and args.config:
            args, sources, config = _parse_with_config(parser, full, args)
    if not isinstance(args, argparse.Namespace):
        said = [line for line in errors.getvalue().splitlines() if ": error: " in line]
        raise ValueError(said[-1].split(": error: ", 1)[1] if said else "invalid run options.")
    for dest, flag in (("out", "--out"), ("plot", "--plot"), ("checkpoint", "--checkpoint"),
                       ("resume", "--resume")):  # fmt: skip
        if getattr(args, dest, None):  # only a --config file can set them here
            label = sources.get(dest, flag)
            raise ValueError(f"{label}: compare writes its own files into --out DIR.")
    return prepare_run(args, parser.run_parsers[algorithm][1], sources, config)


def compare_main(parser, args: argparse.Namespace, rest: list[str], console: Console) -> int:
    r"""``botorch-fed compare``; returns the exit code (module docstring)."""
    from botorch_fed.runs.black_box import import_path
    from botorch_fed.runs.compare import ComparisonRunError, compare_algorithms, plan_comparison
    from botorch_fed.runs.prepare import library_warnings_ignored

    algorithms = list(args.algorithms)
    try:
        twice = sorted({a for a in algorithms if algorithms.count(a) > 1})
        if twice:
            raise ValueError(f"{', '.join(twice)} given more than once.")
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
            shared = [f for f in ignored[a] if _dest(run_parsers, f) in _SHARED]
            if shared:
                raise ValueError(
                    f"{a} does not take {', '.join(shared)}: its runs would not have the same "
                    "initial designs and budget as the others'; compare it separately."
                )
            try:
                prepared[a] = _prepare(parser, a, kept)
            except (ValueError, ImportError) as exc:
                raise ValueError(f"{a}: {exc}") from None
        if args.device is not None and not args.batched:
            raise ValueError("--device applies to the batched runner (--batched).")
        plan = plan_comparison(
            {a: p.settings for a, p in prepared.items()},
            {a: p.setup for a, p in prepared.items()},
            seeds=args.seeds,
            out=args.out,
            batched=args.batched,
            device=args.device,
        )
    except (ValueError, ImportError) as exc:
        print_error(console, rename_out(str(exc)).replace("`batched`", "--batched"))
        return 2
    for a, flags in ignored.items():
        if flags:
            console.print(f"{a} does not take {', '.join(flags)} (ignored for it)", style="dim")
    folders = list(dict.fromkeys(f for p in prepared.values() for f in p.folders))
    reused = _stored_runs(plan)
    if reused:
        console.print(f"{reused} runs of this comparison are stored in {escape(args.out)}: reused")
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
                comparison = compare_algorithms(plan, jobs=args.jobs, on_run=on_run)
        except KeyboardInterrupt:
            print_error(
                console,
                f"the finished runs are kept in {args.out}: the same command continues.",
                "interrupted:",
            )
            return 130
        except ComparisonRunError as exc:  # its black box, a bug: the finished runs stay
            print_error(console, f"{exc}; the finished runs are kept in {args.out}.")
            return 1
        except (ValueError, OSError) as exc:  # e.g. --out not writable, mixed metrics
            print_error(
                console, rename_out(f"{type(exc).__name__}: {exc}"), "the comparison failed:"
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


def _stored_runs(plan) -> int:
    r"""How many of the plan's runs ``out`` holds already (what will not run again)."""
    from botorch_fed.runs.compare import stored_runs

    return sum(len(v) for v in stored_runs(plan).values())


def rename_out(message: str) -> str:
    return message.replace("`out`", "--out")


def print_summary(summary: dict, console: Console) -> None:
    r"""The comparison's table (``summary.md``'s rows) and one line per comparison."""
    from botorch_fed.runs.comparison_statistics import min_two_sided_p

    ref = summary["reference"]
    metric = summary["metric"] if isinstance(summary["metric"], str) else "score"
    table = Table(title=f"final {metric} over {len(summary['seeds'])} seeds (lower is better)")
    for col in ("algorithm", "mean", "s.e.", "median", "worst client", "W/L/T", "p (Holm)"):
        table.add_column(col, justify="left" if col == "algorithm" else "right")

    def num(v, digits=4):
        return "-" if v is None else f"{v:.{digits}g}"

    lines = []
    for a, st in summary["algorithms"].items():
        wins = "-" if a == ref else f"{st['wins']}/{st['losses']}/{st['ties']}"
        se = "-" if st["se"] is None else f"{st['se']:#.2g}"
        row = (num(st["mean"]), se, num(st["median"]), num(st["worst_client_mean"]))
        table.add_row(a, *row, wins, num(st.get("p_holm"), 3))
        if st["scored"] < st["runs"]:
            lines.append(
                f"{a}: {st['runs'] - st['scored']} of {st['runs']} runs have no score (a client "
                "never evaluated successfully); they count as losses and are left out of the "
                "mean, median and test"
            )
        if a != ref:
            ran = st["wins"] + st["losses"] + st["ties"]
            lines.append(
                f"{a} against {ref}: lower on {st['wins']} of {ran} seeds, higher on "
                f"{st['losses']} (paired two-sided Wilcoxon over {st['paired']} seeds: p = "
                f"{num(st['p'], 3)}, Holm {num(st.get('p_holm'), 3)})"
            )
    console.print(table)
    if len(summary["algorithms"]) > 1:
        console.print(f"W/L/T: seeds where each did better/worse than/as well as {ref}")
    own = "regret" if "regret" in metric else "best value"
    console.print(f"worst client: the mean over seeds of the worst client's own final {own}")
    pairs = max((st.get("paired", 0) for st in summary["algorithms"].values()), default=0)
    if pairs and min_two_sided_p(pairs) >= 0.05:
        console.print(
            f"with {pairs} paired seeds a two-sided Wilcoxon test cannot reach p < 0.05 "
            f"(its smallest p is {min_two_sided_p(pairs):.3g}): use 6 seeds or more",
            style="yellow",
        )
    for line in lines:
        console.print(line, soft_wrap=True)
