r"""Do batched grids give the protocol runner's results? The plan:
``benchmarks/batched_grid_equivalence_plan.md`` (issue 37, item 3).

Each experiment runs seeds 0-63 with ``compare_algorithms`` on both runners (records
under ``--out``/<experiment>-{protocol,batched}, reused when run again) and tests the
paired log10 final scores as the plan says.

Usage::

    python benchmarks/batched_grid_equivalence.py --jobs 2
    python benchmarks/batched_grid_equivalence.py --smoke --out /tmp/bge
"""

from __future__ import annotations

import argparse
import json
import platform
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
from run_records import command_line, cpu_model, write_report  # the script's folder

RESULTS = Path(__file__).parent / "results"
STEM = "batched_grid_equivalence"
MARGIN = 0.2
# name -> (algorithm, heterogeneity)
EXPERIMENTS = {
    "hartmann6": ("local", {}),
    "hartmann6-mild": ("local", {"shift": 0.05, "rotation": 0.1}),
    "hartmann6-central": ("central", {}),
    "hartmann6-fbo-fedgp": ("fbo-fedgp", {}),  # the plan's second amendment
}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=64)
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--out", type=Path, default=RESULTS / STEM)
    args = parser.parse_args(argv)
    from scipy import stats

    from botorch_fed.algorithms import get_algorithm
    from botorch_fed.protocol import FederationSetup
    from botorch_fed.runs.compare import compare_algorithms

    rounds, init = (2, 3) if args.smoke else (20, 4)
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for name, (algorithm, hetero) in EXPERIMENTS.items():
        setup = FederationSetup(problem="hartmann", dim=6, num_clients=5, seed=0, **hetero)
        # each algorithm's default settings (FBO-FedGP: its default preset)
        settings = get_algorithm(algorithm).settings_class(num_init=init, num_rounds=rounds)
        runs, paths = {}, {}
        for runner in ("protocol", "batched"):
            c = compare_algorithms({algorithm: settings}, setup, seeds=args.seeds, jobs=args.jobs,
                                   out=args.out / f"{name}-{runner}",
                                   batched=runner == "batched")  # fmt: skip
            runs[runner] = {s: r["score"] for s, r in c.records[algorithm].items()}
            paths[runner] = {s: r["score_per_round"] for s, r in c.records[algorithm].items()}
        seeds = sorted(runs["protocol"])
        d = np.array([np.log10(runs["batched"][s]) - np.log10(runs["protocol"][s]) for s in seeds])
        n = len(d)
        half = stats.t.ppf(0.95, n - 1) * d.std(ddof=1) / np.sqrt(n)
        lo, hi = d.mean() - half, d.mean() + half
        p = stats.wilcoxon(d).pvalue if np.any(d != 0) else 1.0
        rows.append({
            "experiment": name, "seeds": n, "mean_d": float(d.mean()), "ci90": [lo, hi],
            "algorithm": algorithm,
            "equivalent": bool(-MARGIN < lo and hi < MARGIN and p >= 0.05),
            "wilcoxon_p": float(p),
            "protocol_median": float(np.median(list(runs["protocol"].values()))),
            "batched_median": float(np.median(list(runs["batched"].values()))),
            # None where the records hold no federation score per round (heterogeneous)
            "parting_rounds": [_parting(paths["protocol"][s], paths["batched"][s]) for s in seeds]
            if all(paths[k][s] is not None for k in paths for s in seeds) else None,
        })  # fmt: skip
        print(json.dumps(rows[-1]), flush=True)
    command = command_line("batched_grid_equivalence.py", argv)
    lines = [
        "# Batched grids against the protocol runner: equivalence (issue 37, item 3)",
        "",
        f"Plan: `benchmarks/batched_grid_equivalence_plan.md`. Command: `{command}` "
        f"({datetime.now(UTC):%Y-%m-%d %H:%M} UTC); machine: {cpu_model()}, "
        f"{platform.platform()}. Hartmann 6-D, 5 clients, {init} initial points, "
        f"{rounds} rounds; d = log10 R_batched - log10 R_protocol paired by seed; equivalent "
        f"if the 90% t-interval of mean d lies inside (-{MARGIN}, {MARGIN}) and the two-sided "
        "Wilcoxon p of d is at least 0.05 (the plan's amendment).",
        "",
        "| experiment | algorithm | seeds | median regret, protocol | median regret, batched | "
        "mean d | 90% interval | equivalent | Wilcoxon p | paths part: median round |",
        "|---|---|---:|---:|---:|---:|---:|---|---:|---:|",
    ]
    for r in rows:
        if r["parting_rounds"] is None:
            part = "n/a (clients' own regrets)"
        else:
            parted = [t for t in r["parting_rounds"] if t is not None]
            median = f"{np.median(parted):g}" if parted else "never"
            part = f"{median} ({len(parted)} of {r['seeds']} part)"
        lines.append(
            f"| {r['experiment']} | {r['algorithm']} | {r['seeds']} | {r['protocol_median']:.4g} | "
            f"{r['batched_median']:.4g} | {r['mean_d']:+.3f} | [{r['ci90'][0]:+.3f}, "
            f"{r['ci90'][1]:+.3f}] | {'yes' if r['equivalent'] else 'no'} | "
            f"{r['wilcoxon_p']:.3g} | {part} |"
        )
    lines += [
        "",
        "Paths part: the first round whose regret differs between the runners by more than "
        "1e-6 relative (the seeds' runs take the same decisions until then). The batched "
        "models equal the protocol's to float64 rounding at equal data (tests/experiments); "
        "such differences grow where an optimiser's stop amplifies them -- a GP fit's "
        "L-BFGS-B, FBO-FedGP's federated fit (refits in rounds 1, 6, 11, 16) or a search's "
        "-- and BO's later decisions depend on every earlier one.",
    ]
    text = "\n".join(lines) + "\n"
    target = RESULTS if args.out.resolve() == (RESULTS / STEM).resolve() else args.out
    write_report(target, STEM, text, rows)
    return 0


def _parting(protocol: list, batched: list) -> int | None:
    r"""The first round (0: the initial designs) whose score differs by more than 1e-6
    relative between the runners (``None``: none)."""
    for t, (a, b) in enumerate(zip(protocol, batched, strict=True)):
        if abs(a - b) > 1e-6 * max(abs(a), 1e-12):
            return t
    return None


if __name__ == "__main__":
    raise SystemExit(main())
