r"""FBO-FedGP's support set: what does hiding the clients' cluster centres cost in regret?

Issue 14 (finding 7, Build: "a safe default for the support set (noised centres or
random support -- choose by measured regret, report it)"). Exact k-means centres let a
server that knows some of a cluster's points recover the rest (docs/security.md,
"Cluster centres"). Arms, from the most to the least revealing:

- ``clustered``: Alg. 1, exact centres (``support="clustered"``, ``center_noise=0``);
- ``noise0.05``, ``noise0.1``: Alg. 1 with Gaussian noise of that standard deviation
  (unit-cube units) on every centre, drawn from the client's private generator;
- ``random``: a uniform support drawn by the server (App. D.3), no client data used.

Every run is one federation of ``benchmarks/fbo_fedgp_pays.py`` (its problems, sizes,
plaintext aggregation and run records; :func:`fbo_fedgp_pays._one_run`), with the
preset's settings (``--preset``) and only the support selection changed; runs are
paired by seed (same initial designs, same public seeds). ``crypto_seed = 1000 + seed``
makes the clients' private noise reproducible.

Decision rule (:data:`RULE`, fixed before any run): see the report.

Usage::

    python benchmarks/fbo_fedgp_support_privacy.py --smoke --out /tmp/support   # ~1 min
    python benchmarks/fbo_fedgp_support_privacy.py --seeds 8                      # default preset
    python benchmarks/fbo_fedgp_support_privacy.py --report
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
from collections import defaultdict
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
from fbo_fedgp_pays import SUITE, _meta, _one_run  # the pays benchmark's runs
from run_records import load_runs

RESULTS = Path(__file__).parent / "results"
STEM = "fbo_fedgp_support_privacy"
# from the most to the least revealing
ARMS = {
    "clustered": {"support": "clustered", "center_noise": 0.0},
    "noise0.05": {"support": "clustered", "center_noise": 0.05},
    "noise0.1": {"support": "clustered", "center_noise": 0.1},
    "random": {"support": "random"},
}
BASE = "clustered"
LEAST_REVEALING_FIRST = ("random", "noise0.1", "noise0.05")
PROBLEMS = ("branin2", "levy4", "ackley5", "hartmann6")
ALPHA = 0.05
FLOOR = 1e-12  # regrets are floored here before taking logs
RULE = (
    "Pre-registered decision rule (fixed in the script before any run). For each arm A "
    f"other than `{BASE}`, pool the pairs (problem, seed) of the default preset and take "
    f"d = log10(R_A) - log10(R_{BASE}) (R: final simple regret, floored at {FLOOR:g}; the "
    "log makes problems of different regret scales comparable). One-sided Wilcoxon "
    "signed-rank test (scipy.stats.wilcoxon, alternative='greater': A's regret is higher). "
    f"A is *not significantly worse* iff p >= {ALPHA}. The default becomes the least "
    "revealing arm that is not significantly worse, in the order random < noise0.1 < "
    f"noise0.05 < {BASE}; `{BASE}` if none is. The paper preset keeps Alg. 1's exact "
    "centres whatever the result (its rows are reported only)."
)


def run_key(preset: str, problem: str, seed: int, arm: str) -> str:
    return f"{preset}/{problem}/seed{seed}/{arm}"


def job(preset: str, problem: str, seed: int, arm: str) -> dict:
    return {
        "key": run_key(preset, problem, seed, arm),
        "problem": problem,
        "seed": seed,
        "algorithm": preset,  # fbo_fedgp_pays: "default" or "paper" FBO-FedGP
        "options": ARMS[arm],
        "setup": {"crypto_seed": 1000 + seed},
    }


def run_one(j: dict) -> dict:
    rec = _one_run(j)
    preset, _, _, arm = j["key"].split("/")
    rec.update(preset=preset, arm=arm)
    return rec


# --- statistics ----------------------------------------------------------------------
def _log(r: float) -> float:
    return math.log10(max(r, FLOOR))


def _wilcoxon(d: np.ndarray, alternative: str) -> float:
    from scipy.stats import wilcoxon

    if len(d) < 5:
        return float("nan")
    if np.all(d == 0):
        return 1.0
    return float(wilcoxon(d, alternative=alternative).pvalue)


def compare(arm: dict[tuple, float], base: dict[tuple, float]) -> dict:
    r"""Paired comparison of ``arm`` with ``base`` over their shared (problem, seed)."""
    keys = sorted(set(arm) & set(base))
    a = np.array([arm[k] for k in keys])
    b = np.array([base[k] for k in keys])
    d = np.array([_log(x) - _log(y) for x, y in zip(a, b, strict=True)])
    return {
        "pairs": len(keys),
        "median_arm": float(np.median(a)) if len(a) else float("nan"),
        "median_base": float(np.median(b)) if len(b) else float("nan"),
        "median_log10_ratio": float(np.median(d)) if len(d) else float("nan"),
        "median_difference": float(np.median(a - b)) if len(a) else float("nan"),
        "worse": int((d > 0).sum()),
        "better": int((d < 0).sum()),
        "p_worse": _wilcoxon(d, "greater"),
        "p_two_sided": _wilcoxon(d, "two-sided"),
    }


def decide(pooled: dict[str, dict]) -> tuple[str, list[str]]:
    r"""The rule of :data:`RULE` on the pooled comparisons; the decision and its reasons."""
    reasons = []
    for arm in LEAST_REVEALING_FIRST:
        c = pooled.get(arm)
        if c is None or not np.isfinite(c["p_worse"]):
            reasons.append(f"{arm}: not measured")
            continue
        ok = c["p_worse"] >= ALPHA
        reasons.append(
            f"{arm}: p = {c['p_worse']:.3g} {'>=' if ok else '<'} {ALPHA} "
            f"({'not ' if ok else ''}significantly worse)"
        )
        if ok:
            return arm, reasons
    return BASE, reasons


# --- report --------------------------------------------------------------------------
def report(runs: dict[str, dict], out: Path, meta: dict) -> tuple[str, dict]:
    regret = defaultdict(dict)  # (preset, arm) -> {(problem, seed): regret}
    times = defaultdict(list)  # (preset, arm) -> [s]
    for r in runs.values():
        regret[(r["preset"], r["arm"])][(r["problem"], r["seed"])] = r["regret"]
        times[(r["preset"], r["arm"])].append(r["time_s"])
    presets = [p for p in ("default", "paper") if any(k[0] == p for k in regret)]
    arms = [a for a in ARMS if any(k[1] == a for k in regret)]
    lines = [
        "# FBO-FedGP's support set: the regret cost of hiding cluster centres (issue 14)",
        "",
        f"- commands: {'; '.join(f'`{c}`' for c in meta['commands'])}",
        f"- machine: {meta['machine']}; versions: {meta['versions']}; git commit {meta['commit']}",
        f"- report written {meta['date']}; every run in `{STEM}_runs.jsonl`",
        "- every run: a federation of `benchmarks/fbo_fedgp_pays.py` (in-process, plaintext "
        "aggregation, GP-UCB, 4 initial points per client; M clients, T rounds as in its "
        "SUITE) with the preset's settings and only `support` / `center_noise` changed; "
        "paired by seed; regret = |f* - best value| of the federation (lower is better)",
        "- arms: `clustered` = Alg. 1, exact k-means centres; `noise0.05` / `noise0.1` = "
        "the same with Gaussian noise of that std (unit cube) on every centre, from each "
        "client's private generator, clamped into the cube; `random` = uniform support "
        "drawn by the server (no client data)",
        "",
        "## Decision rule",
        "",
        RULE,
        "",
    ]
    summary: dict = {"rule": RULE, "meta": meta, "presets": {}}
    for preset in presets:
        problems = [p for p in PROBLEMS if any(k[0] == p for k in regret[(preset, BASE)])]
        lines += [
            f"## Preset `{preset}`: final simple regret, median (mean) over seeds",
            "",
            "| problem | d | M | T | seeds | " + " | ".join(arms) + " |",
            "|---|---:|---:|---:|---:|" + "---:|" * len(arms),
        ]
        for p in problems:
            _, dim, M, _, T, _ = SUITE[p]
            cells = []
            for a in arms:
                v = [r for (q, _), r in regret[(preset, a)].items() if q == p]
                cells.append(f"{np.median(v):.3g} ({np.mean(v):.3g})" if v else "-")
            n = len([1 for (q, _) in regret[(preset, BASE)] if q == p])
            lines.append(f"| {p} | {dim} | {M} | {T} | {n} | " + " | ".join(cells) + " |")
        lines += [
            "",
            f"Paired against `{BASE}` (d = log10 R_arm - log10 R_{BASE}; worse/better: "
            "pairs with d > 0 / d < 0; p (worse): one-sided Wilcoxon signed-rank, arm's "
            "regret higher; per problem for information, the rule uses the pooled row):",
            "",
            "| arm | problem | pairs | median R_arm | median R_clustered | median d | "
            "median R_arm - R_clustered | worse / better | p (worse) | p (two-sided) |",
            "|---|---|---:|---:|---:|---:|---:|---|---:|---:|",
        ]
        pooled = {}
        per_problem = {}
        for a in arms:
            if a == BASE:
                continue
            for p in [*problems, "pooled"]:
                sel = (lambda k, p=p: True) if p == "pooled" else (lambda k, p=p: k[0] == p)
                arm_r = {k: v for k, v in regret[(preset, a)].items() if sel(k)}
                base_r = {k: v for k, v in regret[(preset, BASE)].items() if sel(k)}
                c = compare(arm_r, base_r)
                if p == "pooled":
                    pooled[a] = c
                else:
                    per_problem[f"{a}/{p}"] = c
                bold = "**" if p == "pooled" else ""
                lines.append(
                    f"| {bold}{a}{bold} | {bold}{p}{bold} | {c['pairs']} | {c['median_arm']:.3g} "
                    f"| {c['median_base']:.3g} | {c['median_log10_ratio']:+.3f} | "
                    f"{c['median_difference']:+.3g} | {c['worse']} / {c['better']} | "
                    f"{bold}{c['p_worse']:.3g}{bold} | {c['p_two_sided']:.3g} |"
                )
        lines += [
            "",
            "Wall time per run (s, mean): "
            + ", ".join(
                f"{a} {np.mean(times[(preset, a)]):.1f}" for a in arms if times[(preset, a)]
            ),
            "",
        ]
        entry = {"pooled": pooled, "per_problem": per_problem}
        if preset == "default":
            decision, reasons = decide(pooled)
            entry.update(decision=decision, reasons=reasons)
            lines += [
                "### Decision (default preset)",
                "",
                *[f"- {r}" for r in reasons],
                f"- **default support selection: `{decision}`** ({ARMS[decision]})",
                "",
            ]
        summary["presets"][preset] = entry
    text = "\n".join(lines)
    (out / f"{STEM}.md").write_text(text)
    (out / f"{STEM}.json").write_text(json.dumps(summary, indent=1, default=float) + "\n")
    return text, summary


def _commit() -> str:
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "botorch_fed", "benchmarks/*.py"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + (" (with uncommitted changes)" if dirty else "")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="2 problems, 2 seeds, 3 rounds")
    parser.add_argument("--problems", nargs="+", default=list(PROBLEMS), choices=list(PROBLEMS))
    parser.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    parser.add_argument("--presets", nargs="+", default=["default"], choices=["default", "paper"])
    parser.add_argument("--seeds", type=int, default=8)
    parser.add_argument("--report", action="store_true", help="only rebuild the report")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    if BASE not in args.arms:
        parser.error(f"--arms must include {BASE!r} (every arm is paired with it)")
    if args.smoke:
        if args.out.resolve() == RESULTS.resolve():
            raise SystemExit("--smoke writes to --out DIR (not over the committed results)")
        for name in ("branin2", "levy4"):
            problem, dim, M, init, _, hetero = SUITE[name]
            SUITE[name] = (problem, dim, 3, init, 3, hetero)
        args.problems, args.seeds = ["branin2", "levy4"], 5
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    store = out / f"{STEM}_runs.jsonl"
    runs = load_runs(store)
    command = "python benchmarks/fbo_fedgp_support_privacy.py " + " ".join(
        sys.argv[1:] if argv is None else argv
    )
    commands_file = out / f"{STEM}_commands.txt"
    if not args.report:
        # seed by seed: a run stopped early leaves every problem and arm with the
        # same seeds (complete pairs)
        todo = [
            job(pr, p, s, a)
            for pr in args.presets
            for s in range(args.seeds)
            for p in args.problems
            for a in args.arms
            if run_key(pr, p, s, a) not in runs
        ]
        print(f"{len(todo)} runs to do ({len(runs)} stored)", flush=True)
        with commands_file.open("a") as fh:
            fh.write(f"{command.strip()}  # started {datetime.now(UTC):%Y-%m-%d %H:%M} UTC\n")
        t0 = time.perf_counter()
        with store.open("a") as fh:  # one process: the runs are single-threaded
            for j in todo:
                rec = run_one(j)
                fh.write(json.dumps(rec) + "\n")
                fh.flush()
                runs[rec["key"]] = rec
                print(
                    f"{rec['key']}: regret {rec['regret']:.4g} ({rec['time_s']:.1f} s)", flush=True
                )
        with commands_file.open("a") as fh:
            fh.write(f"# {time.perf_counter() - t0:.0f} s for {len(todo)} runs, one process\n")
    commands = sorted(
        {
            line.split("  #")[0]
            for line in commands_file.read_text().splitlines()
            if line and not line.startswith("#")
        }
    ) if commands_file.exists() else [command]  # fmt: skip
    meta = _meta(commands)
    meta["commit"] = _commit()
    text, _ = report(runs, out, meta)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
