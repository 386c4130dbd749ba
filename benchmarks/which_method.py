r"""Which method pays? The pre-registered benchmark of issue 36
(``benchmarks/which_method_plan.md``: problems, levels, methods, metric, tests and decision
rules, fixed before the runs).

Each cell (problem, heterogeneity level, federation size ``M``, rounds ``T``) is one
:func:`~botorch_fed.runs.compare.compare_algorithms` comparison of the plan's methods on
seeds 0-9, stored under ``benchmarks/results/which_method/<cell>/`` (every run's record;
an interrupted stage continues where it stopped). The report applies the plan's tests.

Usage::

    python benchmarks/which_method.py --stage subset --jobs 2        # Stage 1 (2 cores)
    python benchmarks/which_method.py --stage full --jobs 32         # the full grid
    python benchmarks/which_method.py --stage subset --report        # the report only
    python benchmarks/which_method.py --smoke --out /tmp/wm          # ackley (design), 2 seeds
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
from run_records import cpu_model  # benchmarks/run_records.py (the script's folder)

ROOT = Path(__file__).resolve().parents[1]
RESULTS = Path(__file__).parent / "results"
STEM = "which_method"
DIM, INIT, NOISE_STD = 10, 30, 0.1
HELD_OUT = ("styblinskitang", "dixonprice", "powell")
DESIGN = ("ackley", "levy")
LEVELS = {"homogeneous": (0.0, 0.0), "mild": (0.05, 0.1), "severe": (0.3, 1.0)}
MAIN = ("default", "paper", "fts", "local", "central", "random")
SIZES = ("default", "local", "central")
SEEDS = 10
MARGIN = float(np.log10(1.25))  # every "not worse" claim: within 25% of the regret
FLOOR = 1e-12


def _methods(labels, rounds: int) -> dict:
    from botorch_fed.algorithms import CoKGSettings, FBOFedGPSettings
    from botorch_fed.protocol import BOSettings

    common = {"num_init": INIT, "num_rounds": rounds}
    table = {
        "default": lambda: ("fbo-fedgp", FBOFedGPSettings(**common)),
        "paper": lambda: ("fbo-fedgp", FBOFedGPSettings.paper(**common)),
        "fts": lambda: ("fts", BOSettings(**common)),
        "local": lambda: ("local", BOSettings(**common)),
        "central": lambda: ("central", BOSettings(**common)),
        "random": lambda: ("random", BOSettings(**common)),
        "co-kg": lambda: ("co-kg", CoKGSettings(**common)),
    }
    return {label: table[label]() for label in labels}


def cells(stage: str) -> list[dict]:
    r"""The plan's cells of ``stage`` (``subset``: Stage 1; ``full``: the full grid)."""
    out = []

    def add(problem, level, M, T, methods, part):
        name = f"{problem}-{level}-m{M}-t{T}"
        out.append(
            {
                "name": name,
                "problem": problem,
                "level": level,
                "clients": M,
                "rounds": T,
                "methods": tuple(methods),
                "part": part,
            }
        )

    if stage == "subset":
        for p in HELD_OUT:
            for level in LEVELS:
                add(p, level, 10, 20, MAIN, "main")
        for p in ("styblinskitang", "powell"):
            add(p, "mild", 3, 20, (*SIZES, "co-kg"), "sizes")
            add(p, "mild", 30, 20, SIZES, "sizes")
    elif stage == "full":
        for p in (*HELD_OUT, *DESIGN):
            for level in LEVELS:
                for M in (3, 10, 30):
                    methods = (*MAIN, "co-kg") if M == 3 else MAIN
                    part = "main" if M == 10 and p in HELD_OUT else "sizes"
                    add(p, level, M, 50, methods, part if p in HELD_OUT else "design")
    else:
        raise ValueError(f"unknown stage {stage!r}")
    return out


def _setup(cell: dict):
    from botorch_fed.protocol import FederationSetup

    shift, rotation = LEVELS[cell["level"]]
    return FederationSetup(
        problem=cell["problem"],
        dim=DIM,
        num_clients=cell["clients"],
        seed=0,
        noise_std=NOISE_STD,
        shift=shift,
        rotation=rotation,
    )


def _code_commit(out: Path, allow_change: bool) -> str:
    r"""The commit the stage started on; refuse code that differs from it."""
    head = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.strip()
    marker = out / "commit.txt"
    if not marker.exists():
        marker.write_text(head + "\n")
        return head
    started = marker.read_text().strip()
    same = subprocess.run(["git", "diff", "--quiet", started, "--", "botorch_fed"], cwd=ROOT)
    dirty = subprocess.run(["git", "diff", "--quiet", "HEAD", "--", "botorch_fed"], cwd=ROOT)
    if (same.returncode or dirty.returncode) and not allow_change:
        raise SystemExit(
            f"botorch_fed/ differs from commit {started[:12]}, where this stage started: the "
            "plan runs every cell on one code version (--allow-code-change to override)."
        )
    return started


def run_stage(stage: str, out: Path, jobs: int, seeds: int, only: list[str] | None) -> None:
    from botorch_fed.runs.compare import compare_algorithms

    for cell in cells(stage):
        if only and cell["name"] not in only:
            continue
        t0 = time.perf_counter()
        methods = _methods(cell["methods"], cell["rounds"])

        def on_run(rec, n, total, name=cell["name"]):
            score = "none" if rec["score"] is None else f"{rec['score']:.4g}"
            print(
                f"{name} {n}/{total} {rec['algorithm']} seed {rec['seed']}: {score} "
                f"({rec['time_s']:.0f} s)",
                flush=True,
            )

        compare_algorithms(
            methods, _setup(cell), seeds=seeds, jobs=jobs, out=out / cell["name"], on_run=on_run
        )
        print(f"{cell['name']}: {time.perf_counter() - t0:.0f} s", flush=True)


# --- the plan's statistics ---------------------------------------------------------------
def _log(v: float) -> float:
    return float(np.log10(max(v, FLOOR)))


def _load(out: Path, cell: dict, seeds: int) -> dict[str, dict[int, dict]]:
    recs: dict[str, dict[int, dict]] = {}
    for m in cell["methods"]:
        for s in range(seeds):
            path = out / cell["name"] / "runs" / m / f"seed-{s}.json"
            if path.exists():
                recs.setdefault(m, {})[s] = json.loads(path.read_text())
    return recs


def _wilcoxon(d: np.ndarray, alternative: str = "two-sided") -> float:
    from scipy.stats import wilcoxon

    if len(d) == 0:
        return float("nan")
    if np.all(d == 0):
        return 1.0
    return float(wilcoxon(d, alternative=alternative).pvalue)


def _bootstrap_upper(d: np.ndarray, reps: int = 10_000) -> float:
    r"""95% percentile-bootstrap upper bound of the mean of ``d`` (generator seed 0)."""
    rng = np.random.default_rng(0)
    idx = rng.integers(0, len(d), size=(reps, len(d)))
    return float(np.percentile(d[idx].mean(axis=1), 97.5))


def _holm(p: list[float]) -> list[float]:
    from statsmodels.stats.multitest import multipletests

    return list(multipletests(p, method="holm")[1]) if p else []


def analyse(out: Path, stage: str, seeds: int) -> dict:
    r"""Per cell: mean/median log10 regret per method, worst client, P1 against local,
    C3's bootstrap bound; then C1, C2 and C4 over the held-out main-grid cells."""
    table = {}
    for cell in cells(stage):
        recs = _load(out, cell, seeds)
        if "local" not in recs:
            continue
        entry = {"cell": cell, "methods": {}}
        local = recs["local"]
        for m, by_seed in recs.items():
            logs = {s: _log(r["score"]) for s, r in by_seed.items() if r["score"] is not None}
            worst = {s: r["worst_client"] for s, r in by_seed.items()}
            st = {
                "runs": len(by_seed),
                "mean_log10": float(np.mean(list(logs.values()))) if logs else None,
                "median_log10": float(np.median(list(logs.values()))) if logs else None,
                "worst_client_log10": float(
                    np.mean([_log(w) for w in worst.values() if w is not None])
                )
                if worst
                else None,
            }
            if m != "local":
                both = sorted(s for s in logs if s in local and local[s]["score"] is not None)
                d = np.array([logs[s] - _log(local[s]["score"]) for s in both])
                st.update(
                    paired=len(both), mean_d=float(d.mean()) if len(d) else None, p=_wilcoxon(d)
                )
                if cell["level"] != "homogeneous":
                    wb = sorted(
                        s for s in worst if s in local and worst[s] and local[s]["worst_client"]
                    )
                    dw = np.array([_log(worst[s]) - _log(local[s]["worst_client"]) for s in wb])
                    st["worst_mean_d"] = float(dw.mean()) if len(dw) else None
                    st["worst_upper"] = _bootstrap_upper(dw) if len(dw) else None
                    st["c3_not_worse"] = bool(len(dw) == seeds and st["worst_upper"] < MARGIN)
                    pairs = [
                        (by_seed[s]["client_score"][c], local[s]["client_score"][c])
                        for s in wb
                        for c in by_seed[s]["client_score"]
                    ]
                    worse = [a > 1.25 * b for a, b in pairs if a is not None and b is not None]
                    st["share_clients_worse_1_25"] = float(np.mean(worse)) if worse else None
            entry["methods"][m] = st
        table[cell["name"]] = entry
    # P1's Holm family: every (method, held-out main cell) pair
    family = [
        (c, m)
        for c, e in table.items()
        if e["cell"]["part"] == "main"
        for m, st in e["methods"].items()
        if m != "local" and np.isfinite(st.get("p", np.nan))
    ]
    for (c, m), adj in zip(
        family, _holm([table[c]["methods"][m]["p"] for c, m in family]), strict=True
    ):
        table[c]["methods"][m]["p_holm"] = adj
    sizes = [
        (c, m)
        for c, e in table.items()
        if e["cell"]["part"] == "sizes"
        for m, st in e["methods"].items()
        if m != "local" and np.isfinite(st.get("p", np.nan))
    ]
    for (c, m), adj in zip(
        sizes, _holm([table[c]["methods"][m]["p"] for c, m in sizes]), strict=True
    ):
        table[c]["methods"][m]["p_holm"] = adj
    main = {c: e for c, e in table.items() if e["cell"]["part"] == "main"}
    claims: dict = {"C1": {}, "C2": {}, "C3": {}, "C4": {}}
    for m in ("default", "paper", "fts"):
        ds = [e["methods"][m]["mean_d"] for e in main.values() if m in e["methods"]]
        ds = [d for d in ds if d is not None]
        p = _wilcoxon(np.array(ds), "less") if ds else float("nan")
        per_level = {}
        for level in LEVELS:
            dl = [
                e["methods"][m]["mean_d"]
                for e in main.values()
                if e["cell"]["level"] == level and m in e["methods"]
            ]
            per_level[level] = {
                "cells": len(dl),
                "median_d": float(np.median(dl)) if dl else None,
                "p": _wilcoxon(np.array(dl), "less") if dl else None,
            }
        claims["C1"][m] = {
            "cells": len(ds),
            "median_d": float(np.median(ds)) if ds else None,
            "p": p,
            "holds": bool(len(ds) == 9 and p < 0.05 and np.median(ds) < 0),
            "per_level": per_level,
        }
    gaps, undefined = [], 0
    for e in main.values():
        ms = e["methods"]
        if not all(
            k in ms and ms[k]["mean_log10"] is not None for k in ("default", "local", "central")
        ):
            continue
        lo, fe, ce = (
            ms["local"]["mean_log10"],
            ms["default"]["mean_log10"],
            ms["central"]["mean_log10"],
        )
        if lo - ce > 0.05:
            gaps.append((lo - fe) / (lo - ce))
        else:
            undefined += 1
    claims["C2"] = {
        "gaps": gaps,
        "undefined": undefined,
        "median": float(np.median(gaps)) if gaps else None,
        "holds": bool(gaps and np.median(gaps) >= 0.5),
    }
    for m in ("default", "paper", "fts", "random"):
        cells_ = [
            e for e in main.values() if e["cell"]["level"] != "homogeneous" and m in e["methods"]
        ]
        flags = [e["methods"][m].get("c3_not_worse") for e in cells_]
        claims["C3"][m] = {
            "cells": len(flags),
            "not_worse": sum(bool(f) for f in flags),
            "holds": bool(len(flags) == 6 and all(flags)),
        }
    for level in LEVELS:
        ranked = []
        for m in ("default", "paper", "fts"):
            es = [e for e in main.values() if e["cell"]["level"] == level and m in e["methods"]]
            better = sum(
                1
                for e in es
                if e["methods"][m].get("p_holm", 1) < 0.05 and e["methods"][m]["mean_d"] < 0
            )
            worse = sum(
                1
                for e in es
                if e["methods"][m].get("p_holm", 1) < 0.05 and e["methods"][m]["mean_d"] > 0
            )
            mean = float(np.mean([e["methods"][m]["mean_log10"] for e in es])) if es else None
            ranked.append(
                {
                    "method": m,
                    "cells": len(es),
                    "better": better,
                    "worse": worse,
                    "mean_log10": mean,
                    "qualifies": better >= 2 and worse == 0,
                }
            )
        qualified = sorted((r for r in ranked if r["qualifies"]), key=lambda r: r["mean_log10"])
        claims["C4"][level] = {
            "candidates": ranked,
            "recommended": [r["method"] for r in qualified] or ["local"],
        }
    return {"cells": table, "claims": claims}


def _fmt(v, digits=3) -> str:
    return "-" if v is None or (isinstance(v, float) and not np.isfinite(v)) else f"{v:.{digits}g}"


def report(out: Path, stage: str, seeds: int, meta: dict) -> str:
    res = analyse(out, stage, seeds)
    lines = [
        "# Which method pays? (issue 36, pre-registered: `benchmarks/which_method_plan.md`)",
        "",
        f"- stage: `{stage}`; commands: {'; '.join(f'`{c}`' for c in meta['commands'])}",
        f"- code: commit {meta['commit'][:12]} for every run; machine: {meta['machine']}; "
        f"versions: {meta['versions']}; report written {meta['date']}",
        f"- {DIM}-D problems, {INIT} initial points per client, Gaussian noise {NOISE_STD}; "
        "score: final simple regret (federation's at the homogeneous level, mean of the "
        "clients' own at mild/severe), log10; d = log10 R_method - log10 R_local paired by "
        "seed (negative: better than every client alone)",
        "",
        "## Per cell",
        "",
        "mean log10 regret per method; for the others: mean d, P1's two-sided Wilcoxon p "
        "(Holm-adjusted over the main grid's family, or the sizes' family); worst client: mean "
        "log10 of the worst client's regret.",
        "",
        "| cell | method | runs | mean log10 R | median | worst client | mean d | p | p (Holm) | "
        "C3: worst-client d, 95% upper | clients > 1.25x alone |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, e in res["cells"].items():
        for m, st in e["methods"].items():
            c3 = (
                f"{_fmt(st.get('worst_mean_d'))}, {_fmt(st.get('worst_upper'))}"
                if "worst_upper" in st
                else "-"
            )
            lines.append(
                f"| {name} | {m} | {st['runs']} | {_fmt(st['mean_log10'])} | "
                f"{_fmt(st['median_log10'])} | {_fmt(st['worst_client_log10'])} | "
                f"{_fmt(st.get('mean_d'))} | {_fmt(st.get('p'))} | {_fmt(st.get('p_holm'))} | "
                f"{c3} | {_fmt(st.get('share_clients_worse_1_25'))} |"
            )
    cl = res["claims"]
    lines += ["", "## Claims (the plan's rules)", ""]
    for m, c in cl["C1"].items():
        lines.append(
            f"- C1 {m} beats local BO over the held-out main cells: {c['holds']} (cells "
            f"{c['cells']}, median d {_fmt(c['median_d'])}, one-sided Wilcoxon p {_fmt(c['p'])}); "
            "per level: "
            + ", ".join(
                f"{lv} median d {_fmt(v['median_d'])} (p {_fmt(v['p'])})"
                for lv, v in c["per_level"].items()
            )
        )
    c2 = cl["C2"]
    lines.append(
        f"- C2 default closes at least half the gap to central: {c2['holds']} (median "
        f"{_fmt(c2['median'])} over {len(c2['gaps'])} cells; undefined in {c2['undefined']})"
    )
    for m, c in cl["C3"].items():
        lines.append(
            f"- C3 {m}: no client worse off than alone in {c['not_worse']} of "
            f"{c['cells']} heterogeneous held-out cells; holds: {c['holds']}"
        )
    for level, c in cl["C4"].items():
        cand = "; ".join(
            f"{r['method']}: better in {r['better']}, worse in {r['worse']} of "
            f"{r['cells']}, mean log10 R {_fmt(r['mean_log10'])}"
            for r in c["candidates"]
        )
        lines.append(f"- C4 {level}: recommended {', '.join(c['recommended'])} ({cand})")
    text = "\n".join(lines) + "\n"
    target = RESULTS if out.resolve() == (RESULTS / STEM).resolve() else out
    _plot(res, target / f"{STEM}.png")
    (target / f"{STEM}.md").write_text(text)
    (target / f"{STEM}.json").write_text(json.dumps(res, indent=1, default=float) + "\n")
    return text


def _plot(res: dict, path: Path) -> None:
    r"""One panel per level: each method's mean log10 regret per main-grid cell (one
    line per problem), local BO's as the reference."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    main_cells = [e for e in res["cells"].values() if e["cell"]["part"] == "main"]
    if not main_cells:
        return
    fig, axes = plt.subplots(1, len(LEVELS), figsize=(5 * len(LEVELS), 4), sharey=False)
    for ax, level in zip(axes, LEVELS, strict=True):
        for e in (e for e in main_cells if e["cell"]["level"] == level):
            ms = [
                m for m in MAIN if m in e["methods"] and e["methods"][m]["mean_log10"] is not None
            ]
            ax.plot(ms, [e["methods"][m]["mean_log10"] for m in ms], marker="o",
                    label=e["cell"]["problem"])  # fmt: skip
        ax.set_title(f"{level} (shift, rotation) = {LEVELS[level]}")
        ax.set_ylabel("mean log10 final regret (lower is better)")
        ax.tick_params(axis="x", rotation=30)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _meta(out: Path, commands: list[str]) -> dict:
    import botorch
    import torch

    commit = (out / "commit.txt").read_text().strip() if (out / "commit.txt").exists() else "?"
    return {
        "commands": commands,
        "commit": commit,
        "machine": f"{cpu_model()}, {platform.platform()}",
        "versions": f"python {platform.python_version()}, torch {torch.__version__}, "
        f"botorch {botorch.__version__}",
        "date": f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC",
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stage", choices=("subset", "full"), default="subset")
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--cells", nargs="+", help="only these cells (names as in the report)")
    parser.add_argument("--report", action="store_true", help="only the report")
    parser.add_argument("--smoke", action="store_true", help="2 cells, 2 seeds, 2 rounds, M=3")
    parser.add_argument("--allow-code-change", action="store_true")
    parser.add_argument("--out", type=Path, default=RESULTS / STEM)
    args = parser.parse_args(argv)
    seeds = SEEDS
    if args.smoke:
        if args.out.resolve() == (RESULTS / STEM).resolve():
            raise SystemExit("--smoke writes to --out DIR (not over the committed results)")
        global cells, INIT  # noqa: PLW0603 - a smaller grid for the smoke run
        INIT, seeds = 4, 2
        smoke = [
            {
                "name": f"ackley-{lv}-m3-t2",
                "problem": "ackley",
                "level": lv,
                "clients": 3,
                "rounds": 2,
                "methods": ("default", "local", "central"),
                "part": "main",
            }
            for lv in ("homogeneous", "mild")
        ]
        cells = lambda stage: smoke  # noqa: E731
    args.out.mkdir(parents=True, exist_ok=True)
    command = "python benchmarks/which_method.py " + " ".join(
        sys.argv[1:] if argv is None else argv
    )
    log = args.out / "commands.txt"
    if not args.report:
        _code_commit(args.out, args.allow_code_change or args.smoke)
        with log.open("a") as fh:
            fh.write(f"{command.strip()}  # started {datetime.now(UTC):%Y-%m-%d %H:%M} UTC\n")
        run_stage(args.stage, args.out, args.jobs, seeds, args.cells)
    commands = (
        sorted(
            {
                line.split("  #")[0]
                for line in log.read_text().splitlines()
                if line and not line.startswith("#")
            }
        )
        if log.exists()
        else [command]
    )
    print(report(args.out, args.stage, seeds, _meta(args.out, commands)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
