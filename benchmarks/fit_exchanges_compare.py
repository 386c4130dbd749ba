r"""Is FBO-FedGP's cheap federated fit as good as the old one? The comparison planned in
``benchmarks/results/fit_exchanges_plan.md`` (issue 35, item 3), stated before the run.

New runs: ``fbo_fedgp_pays.py --algorithms default --seeds 10 --out DIR`` on the new code;
baseline: the ``default`` runs of the same problems and seeds in
``results/fbo_fedgp_pays_runs.jsonl`` (the old fit). Per (problem, seed) pair the ratio
``r = R_new / R_old`` of the pays suite's metric (the federation's simple regret; for
``-shift`` problems the mean over clients of each client's own), regrets floored at 1e-9.
"Not worse by more than 10%": median of ``r`` <= 1.1 and the upper end of its 95%
distribution-free interval <= 1.25; with a one-sided Wilcoxon signed-rank test of
``log r < log 1.1`` (non-inferiority at that margin).

With ``--same-code DIR`` (the old fit's runs on the code just before the new fit, made
after the plan: a check of the baseline's code drift, not the pre-registered test) the
same table and statistics follow against that baseline.

Usage::

    python benchmarks/fit_exchanges_compare.py --new /tmp/pays35 --same-code /tmp/pays35old
"""

from __future__ import annotations

import argparse
import math
import sys
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
from run_records import cpu_model, load_runs  # benchmarks/run_records.py
from scipy import stats

RESULTS = Path(__file__).parent / "results"
PROBLEMS = ("branin2", "levy4", "ackley5", "hartmann6", "levy6", "hartmann6-shift", "levy4-shift")
FLOOR, MARGIN, UPPER = 1e-9, 1.1, 1.25


def metric(run: dict) -> float:
    r"""The pays suite's metric of one run, floored."""
    if run["problem"].endswith("-shift"):
        value = float(np.mean(list(run["client_regret"].values())))
    else:
        value = float(run["regret"])
    return max(value, FLOOR)


def median_interval(values: np.ndarray, level: float = 0.95) -> tuple[float, float, float]:
    r"""The median and its distribution-free interval (binomial order statistics)."""
    x = np.sort(values)
    n = len(x)
    k = int(stats.binom.ppf((1 - level) / 2, n, 0.5))  # x[k-1]..x[n-k]: >= level
    while k > 0 and stats.binom.cdf(k - 1, n, 0.5) * 2 > 1 - level:
        k -= 1
    lo, hi = x[max(k - 1, 0)], x[min(n - k, n - 1)]
    return float(np.median(x)), float(lo), float(hi)


def compare(old: dict, new: dict, seeds: int) -> tuple[list[str], list[str]]:
    r"""The per-problem table rows and the summary lines of ``new`` against ``old``."""
    rows, logs = [], []
    for problem in PROBLEMS:
        pairs = []
        for seed in range(seeds):
            key = f"{problem}/seed{seed}/default"
            if key in old and key in new:
                pairs.append((metric(old[key]), metric(new[key])))
        if not pairs:
            continue
        ratios = np.array([n / o for o, n in pairs])
        logs.extend(np.log(ratios))
        rows.append(
            f"| {problem} | {len(pairs)} | {np.mean([o for o, _ in pairs]):.4g} | "
            f"{np.mean([n for _, n in pairs]):.4g} | {math.exp(np.mean(np.log(ratios))):.3f} | "
            f"{np.median(ratios):.3f} | {int((ratios < 1).sum())} |"
        )
    log_r = np.array(logs)
    med, lo, hi = (math.exp(v) for v in median_interval(log_r))
    test = stats.wilcoxon(log_r - math.log(MARGIN), alternative="less")
    verdict = "met" if med <= MARGIN and hi <= UPPER else "NOT met"
    summary = [
        f"Over all {len(log_r)} pairs: median r = {med:.3f}, 95% interval [{lo:.3f}, "
        f"{hi:.3f}] (binomial order statistics); geometric mean r = "
        f"{math.exp(log_r.mean()):.3f}; one-sided Wilcoxon signed-rank of log r < log "
        f"{MARGIN}: p = {test.pvalue:.3g}.",
        "",
        f"Decision rule (median <= {MARGIN} and the interval's upper end <= {UPPER}): "
        f"**{verdict}**.",
    ]
    header = [
        "| problem | pairs | mean R_old | mean R_new | geo. mean r | median r | new better |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    return header + rows, summary


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--new", type=Path, required=True, help="folder of the new runs")
    p.add_argument("--same-code", type=Path, default=None, help="folder of the old fit's runs")
    p.add_argument("--seeds", type=int, default=10)
    p.add_argument("--out", type=Path, default=RESULTS)
    a = p.parse_args()
    new = load_runs(a.new / "fbo_fedgp_pays_runs.jsonl")
    table, summary = compare(load_runs(RESULTS / "fbo_fedgp_pays_runs.jsonl"), new, a.seeds)
    lines = [
        "# The cheap federated fit against the old one (issue 35, item 3)",
        "",
        f"Plan: `benchmarks/results/fit_exchanges_plan.md` (written before the run). Command: "
        f"`python {' '.join(sys.argv)}`; new runs: `python benchmarks/fbo_fedgp_pays.py "
        f"--problems {' '.join(PROBLEMS)} --algorithms default --seeds {a.seeds} --jobs 2 "
        f"--out {a.new}`. Machine: {cpu_model()}, 2 cores; "
        f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC.",
        "",
        "Per (problem, seed) pair `r = R_new / R_old` of the pays suite's metric (regret; "
        "`-shift`: mean client regret), floored at 1e-9. New: the trust region on the "
        "linearised summary (at most 4 evaluations of one sum each).",
        "",
        "## Pre-registered: against the stored runs of the old default",
        "",
        "Old: the `default` runs in `fbo_fedgp_pays_runs.jsonl` (L-BFGS-B fit, up to 60 "
        "evaluations of two sums each; code of 2026-11-23, before the k-means centre noise "
        "and the private randomness from the seed).",
        "",
        *table,
        "",
        *summary,
        "",
    ]
    if a.same_code is not None:
        table, summary = compare(load_runs(a.same_code / "fbo_fedgp_pays_runs.jsonl"), new, a.seeds)
        lines += [
            "## Check, after the plan: against the old fit on the same code",
            "",
            f"Old: the same command on the commit before the new fit (the old L-BFGS-B fit, "
            f"everything else as the new runs), `--out {a.same_code}`. Not pre-registered: it "
            "removes the code drift the stored baseline carries.",
            "",
            *table,
            "",
            *summary,
            "",
        ]
    text = "\n".join(lines)
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "fit_exchanges.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
