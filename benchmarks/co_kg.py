r"""Co-KG benchmark: the experiments of the Co-KG slides, plus a 6-D problem and timings.

Paper 001 (slides, "Experimental Setup" to "Scalability") compares, on its functions
``f_1`` (sin/cos bowl) and ``f_2`` (Rosenbrock) in 2-D and on a neural network tuned
on ``breast_cancer``:

- **acquisitions**: Co-KG vs Co-EI vs Co-ES;
- **baselines**: Co-KG vs barycenter-qKG (beta = 0), "data sharing" (central BO on
  pooled data with q-KG: ``central --acquisition kg``, the non-private oracle) and "no
  collaboration" (each agent alone with KG: ``local --acquisition kg``);
- **grid**: the support grid 10x10 vs 30x30;
- **agents**: N in {2, 4, 8}.

Here every experiment runs through ``run_federated`` with the registered algorithms,
N = 4 agents on a 10x10 grid unless the experiment varies it, the same seeds for every
method. Beyond the slides: **nn** tunes an ``MLPClassifier``'s l2 penalty and learning
rate on ``breast_cancer`` split across the agents
(:class:`~botorch_fed.tasks.FederatedMLPTask`, 2-D); **weights** starts every agent's
warm-up in its own sub-box (30% of the domain per side; ``cokg-f1@regions``) and
compares uniform barycenter weights (the paper) with weights by posterior precision (the
slides' "adaptive agent weighting"); **highdim** runs Hartmann-6 on a 64-point Sobol
support.

Metrics (test functions are minimised, as every built-in one; regret = value - optimum):

- **regret of the best evaluation** per round (the federation's best noise-free value
  so far: every method has one);
- **regret of x^** at the end: Co-KG's recommendation (Alg. 1 line 10: the best of the
  agents' local optima on the support), for the Co-* methods;
- for **nn**: the validation log-loss of the best evaluation per round, and the
  held-out test loss of the federation's best configuration deployed by every agent.

Every run is appended to ``co_kg_runs.jsonl`` and skipped when asked for again; the
report (markdown, JSON summary, PNG) is rebuilt from all stored runs. ``--timing``
adds the time of one server step against the support size and N
(:mod:`co_kg_step_time`: barycenter, local models and acquisition timed apart).

Usage::

    python benchmarks/co_kg.py --smoke                      # a minute
    OMP_NUM_THREADS=1 python benchmarks/co_kg.py --seeds 10 --jobs 2
    OMP_NUM_THREADS=2 python benchmarks/co_kg.py --timing-only
    python benchmarks/co_kg.py --report
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
import warnings
from collections import defaultdict
from concurrent.futures import ProcessPoolExecutor
from datetime import UTC, datetime
from functools import lru_cache
from pathlib import Path

import numpy as np
from run_records import cpu_model, load_runs  # benchmarks/run_records.py (the script's folder)

RESULTS = Path(__file__).parent / "results"

# method label -> (algorithm, settings overrides)
METHODS = {
    "co-kg": ("co-kg", {}),
    "co-kg, precision weights": ("co-kg", {"weights": "precision"}),
    "co-ei": ("co-ei", {}),
    "co-es": ("co-es", {}),
    "barycenter-qkg": ("barycenter-qkg", {}),
    "data sharing (central, q-KG)": ("central", {"acquisition": "kg"}),
    "no collaboration (local, KG)": ("local", {"acquisition": "kg"}),
}
NOISE = {"cokg-f1": 0.05, "cokg-f2": 1.0, "hartmann": 0.02}

# experiment -> list of (problem, method, agents, grid side or support size)
EXPERIMENTS = {
    "acquisitions": [
        (p, m, 4, 10) for p in ("cokg-f1", "cokg-f2") for m in ("co-kg", "co-ei", "co-es")
    ],
    "baselines": [
        (p, m, 4, 10)
        for p in ("cokg-f1", "cokg-f2")
        for m in (
            "co-kg",
            "barycenter-qkg",
            "data sharing (central, q-KG)",
            "no collaboration (local, KG)",
        )
    ],
    "grid": [("cokg-f1", "co-kg", 4, side) for side in (10, 30)],
    "agents": [("cokg-f1", "co-kg", n, 10) for n in (2, 4, 8)],
    "nn": [
        ("mlp", m, 4, 10)
        for m in (
            "co-kg",
            "barycenter-qkg",
            "data sharing (central, q-KG)",
            "no collaboration (local, KG)",
        )
    ],
    # agents start in different sub-boxes (poor initialisations for most of them): the
    # slides' "adaptive agent weighting" future work, by posterior precision
    "weights": [("cokg-f1@regions", m, 4, 10) for m in ("co-kg", "co-kg, precision weights")],
    "highdim": [
        ("hartmann", m, 4, 64)
        for m in ("co-kg", "data sharing (central, q-KG)", "no collaboration (local, KG)")
    ],
}


def run_key(seed: int, problem: str, method: str, agents: int, support: int) -> str:
    return f"seed{seed}/{problem}/{method}/N{agents}/S{support}"


@lru_cache(maxsize=2)
def _mlp_task(num_clients: int):
    from botorch_fed.tasks import make_federated_mlp_task

    return make_federated_mlp_task(num_clients=num_clients, seed=0)


def _settings(job: dict):
    from botorch_fed.algorithms import get_algorithm

    algorithm, overrides = METHODS[job["method"]]
    cls = get_algorithm(algorithm).settings_class
    fields = set(cls.__dataclass_fields__)
    values = {
        "num_init": job["init"],
        "num_rounds": job["rounds"],
        "raw_samples": job["raw_samples"],
        "maxiter": job["maxiter"],
        **overrides,
    }
    if "points_per_dim" in fields:
        if job["problem"] == "hartmann":
            values.update(support="sobol", support_size=job["support"])
        else:
            values.update(support="grid", points_per_dim=job["support"])
    return algorithm, cls(**values)


def _one_run(job: dict) -> dict:
    r"""Run one configuration in this (worker) process; return a JSON record."""
    import torch

    from botorch_fed.algorithms import run_federated
    from botorch_fed.protocol import FederationSetup

    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    algorithm, settings = _settings(job)
    if job["problem"] == "mlp":
        task = _mlp_task(job["agents"])
        setup = FederationSetup(objectives=task.objectives(), seed=job["seed"])
    else:
        problem, _, variant = job["problem"].partition("@")
        dim = 6 if problem == "hartmann" else 2
        setup = FederationSetup(
            problem=problem,
            dim=dim,
            num_clients=job["agents"],
            seed=job["seed"],
            noise_std=NOISE[problem],
            init_regions=variant == "regions",
            region_width=0.3,
        )
    t0 = time.perf_counter()
    result = run_federated(algorithm, setup, settings)
    time_s = time.perf_counter() - t0
    record = {
        **job,
        "algorithm": algorithm,
        "best_per_round": result.best_per_round,
        "regret_per_round": result.regret_per_round,
        "best_point": result.best_point,
        "recommendation": result.recommendation,
        "time_s": time_s,
        "stage_s": result.ledger["stage_s"],
        "bytes_up": result.ledger["total_bytes_up"],
        "steps": result.steps,
        "failures": len(result.failures),
        "settings": result.config["settings"],
        "versions": result.versions,
    }
    rec = result.recommendation
    if job["problem"] == "mlp":
        task = _mlp_task(job["agents"])
        record["test_loss_best"] = task.federation_test_loss(result.best_point)
        record["test_loss_recommendation"] = (
            None if rec is None else task.federation_test_loss(rec["x"])
        )
    elif rec is not None:
        objective = setup.make_objectives()[0]
        x = torch.tensor([rec["x_unit"]], dtype=torch.float64)
        value = float(objective.value(x).reshape(-1)[0])
        record["recommendation_regret"] = value - result.optimal_value
    return record


def _jobs(args) -> list[dict]:
    jobs, seen = [], set()
    for name in args.experiments:
        for problem, method, agents, support in EXPERIMENTS[name]:
            for seed in range(args.seeds):
                key = run_key(seed, problem, method, agents, support)
                if key in seen:
                    continue
                seen.add(key)
                jobs.append(
                    {
                        "key": key,
                        "seed": seed,
                        "problem": problem,
                        "method": method,
                        "agents": agents,
                        "support": support,
                        "init": args.init,
                        "rounds": args.rounds,
                        "raw_samples": args.raw_samples,
                        "maxiter": args.maxiter,
                    }
                )
    return jobs


# --- the report -----------------------------------------------------------------------
def _mean_se(values) -> tuple[float, float, int]:
    v = np.asarray([x for x in values if x is not None], dtype=np.float64)
    if v.size == 0:
        return float("nan"), float("nan"), 0
    se = float(v.std(ddof=1) / np.sqrt(v.size)) if v.size > 1 else float("nan")
    return float(v.mean()), se, int(v.size)


def _curve(r: dict) -> list[float]:
    if r["problem"] == "mlp":
        return r["best_per_round"]
    return r["regret_per_round"]


def _welch(a, b) -> float:
    from scipy import stats

    a = np.asarray([x for x in a if x is not None], dtype=np.float64)
    b = np.asarray([x for x in b if x is not None], dtype=np.float64)
    if a.size < 2 or b.size < 2:
        return float("nan")
    return float(stats.ttest_ind(a, b, equal_var=False).pvalue)


def report(runs: dict[str, dict], out: Path, stem: str, meta: dict, timing: list[dict]) -> str:
    groups = defaultdict(list)
    for r in runs.values():
        groups[(r["problem"], r["method"], r["agents"], r["support"])].append(r)
    summary = {}
    lines = [
        "# Co-KG benchmark",
        "",
        f"Generated {meta['date']} by `{meta['command']}` on {meta['machine']}.",
        f"Versions: {meta['versions']}. Wall time: {meta['wall']}.",
        "",
        "Each cell: mean +- standard error over seeds (n). Regret = noise-free value of the "
        "federation's best evaluation - optimum (minimised); x^ = Co-KG's recommendation "
        "(best of the agents' local optima on the support). p: Welch's t-test of the final "
        "regret against Co-KG in the same setting.",
        "",
    ]
    conclusions = out / f"{stem}_conclusions.md"
    if conclusions.exists():  # written by hand from the tables below
        lines += [conclusions.read_text().strip(), ""]
    for name, configs in EXPERIMENTS.items():
        rows = [c for c in configs if c in groups]
        if not rows:
            continue
        lines += [f"## {name}", ""]
        nn = rows[0][0] == "mlp"
        head = (
            "| problem | method | N | support | final best val. loss | test loss of best | "
            "time/run (s) |"
            if nn
            else "| problem | method | N | support | final regret (best eval.) | p vs co-kg | "
            "regret of x^ | time/run (s) |"
        )
        lines += [head, "|" + "---|" * (head.count("|") - 1)]
        for problem, method, agents, support in rows:
            rs = groups[(problem, method, agents, support)]
            final = [_curve(r)[-1] for r in rs]
            m, se, n = _mean_se(final)
            t, _, _ = _mean_se([r["time_s"] for r in rs])
            key = f"{name}/{problem}/{method}/N{agents}/S{support}"
            summary[key] = {"final_mean": m, "final_se": se, "n": n, "time_s": t}
            if nn:
                tm, tse, _ = _mean_se([r["test_loss_best"] for r in rs])
                summary[key]["test_loss_best"] = [tm, tse]
                lines.append(
                    f"| {problem} | {method} | {agents} | {support} | {m:.4f} +- {se:.4f} ({n}) "
                    f"| {tm:.4f} +- {tse:.4f} | {t:.0f} |"
                )
            else:
                ref = groups.get((problem, "co-kg", agents, support))
                p = (
                    _welch(final, [_curve(r)[-1] for r in ref])
                    if ref and method != "co-kg"
                    else float("nan")
                )
                xm, xse, xn = _mean_se([r.get("recommendation_regret") for r in rs])
                x_cell = f"{xm:.4g} +- {xse:.2g} ({xn})" if xn else "-"
                summary[key].update({"p_vs_cokg": p, "x_hat_regret": [xm, xse, xn]})
                lines.append(
                    f"| {problem} | {method} | {agents} | {support} | {m:.4g} +- {se:.2g} ({n}) "
                    f"| {'-' if np.isnan(p) else f'{p:.3f}'} | {x_cell} | {t:.0f} |"
                )
        lines.append("")
    if timing:
        lines += [
            "## Time of one Co-KG server step",
            "",
            f"`{meta.get('timing_command', '')}`: barycenter (fixed point + prediction "
            "cache), the N local models and the acquisition (optimize_co_acquisition, "
            "settings in co_kg_step_time.py) timed apart; cold = first round, warm = the "
            "next round warm-started from the previous barycenter.",
            "",
            "| mode | support | N | cold: barycenter / local / acquisition / total (s) | "
            "warm: barycenter / local / acquisition / total (s) |",
            "|---|---|---|---|---|",
        ]
        for row in timing:
            cells = []
            for phase in ("cold", "warm"):
                p = row[phase]
                cells.append(
                    f"{p['barycenter']:.2f} / {p['local models']:.2f} / "
                    f"{p['acquisition']:.2f} / **{p['total']:.2f}**"
                )
            lines.append(
                f"| {row.get('mode', 'one-shot')} | {row['side']}x{row['side']} | "
                f"{row['agents']} | " + " | ".join(cells) + " |"
            )
        lines.append("")
    text = "\n".join(lines)
    (out / f"{stem}.md").write_text(text + "\n")
    (out / f"{stem}.json").write_text(
        json.dumps({"meta": meta, "summary": summary, "timing": timing}, indent=1) + "\n"
    )
    _plot(groups, out / f"{stem}.png")
    return text


def _plot(groups, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [n for n, cs in EXPERIMENTS.items() if any(c in groups for c in cs)]
    if not names:
        return
    fig, axes = plt.subplots(1, len(names) + 1, figsize=(4.2 * (len(names) + 1), 3.6))
    panels = []
    for name in names:
        problems = sorted({c[0] for c in EXPERIMENTS[name] if c in groups})
        panels.append((name, problems[0]))
    if "baselines" in names:
        panels.append(("baselines", "cokg-f2"))
    for ax, (name, problem) in zip(np.atleast_1d(axes), panels, strict=False):
        for config in EXPERIMENTS[name]:
            if config not in groups or config[0] != problem:
                continue
            curves = np.array([_curve(r) for r in groups[config]], dtype=np.float64)
            m = curves.mean(0)
            se = curves.std(0, ddof=1) / np.sqrt(len(curves)) if len(curves) > 1 else 0 * m
            x = np.arange(len(m))
            lab = f"{config[1]} N={config[2]} S={config[3]}"
            ax.plot(x, m, label=lab)
            ax.fill_between(x, m - se, m + se, alpha=0.2)
        ax.set_title(f"{name}: {problem}", fontsize=9)
        ax.set_xlabel("round")
        ax.set_ylabel("best validation loss" if problem == "mlp" else "regret (best evaluation)")
        if problem != "mlp":
            ax.set_yscale("log")
        ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _meta(command: str, wall: str, timing_command: str = "") -> dict:
    import botorch
    import torch

    return {
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "command": command,
        "timing_command": timing_command,
        "machine": f"{cpu_model()}, {os.cpu_count()} cores, {platform.platform()}",
        "versions": f"torch {torch.__version__}, botorch {botorch.__version__}, "
        f"python {platform.python_version()}",
        "wall": wall,
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="tiny: 2 seeds, 2 rounds")
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--init", type=int, default=3, help="initial points per agent")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--raw-samples", type=int, default=32, help="optimize_acqf raw samples")
    parser.add_argument("--maxiter", type=int, default=30, help="optimize_acqf L-BFGS-B iterations")
    parser.add_argument("--experiments", nargs="+", default=list(EXPERIMENTS))
    parser.add_argument("--jobs", type=int, default=1, help="runs in parallel (1 thread each)")
    parser.add_argument("--timing", action="store_true", help="also time one server step")
    parser.add_argument("--timing-only", action="store_true")
    parser.add_argument("--report", action="store_true", help="only rebuild the report")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    argv_used = sys.argv[1:] if argv is None else list(argv)
    prefix = ""
    if "OMP_NUM_THREADS" in os.environ:
        prefix = f"env OMP_NUM_THREADS={os.environ['OMP_NUM_THREADS']} "
    command = prefix + "python benchmarks/co_kg.py " + " ".join(argv_used)
    if args.smoke:
        args.seeds, args.rounds, args.init = 2, 2, 3
        args.experiments = ["baselines"]
        stem = "co_kg_smoke"
    else:
        stem = "co_kg"
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    store = out / f"{stem}_runs.jsonl"
    timing_store = out / f"{stem}_timing.json"
    runs = load_runs(store)
    budget = {
        "init": args.init,
        "rounds": args.rounds,
        "raw_samples": args.raw_samples,
        "maxiter": args.maxiter,
    }
    stale = [k for k, r in runs.items() if {k2: r[k2] for k2 in budget} != budget]
    if stale and not args.report:
        raise SystemExit(f"{store} holds runs of another budget ({stale[:3]}...): use --out")
    wall = "-"
    if not (args.report or args.timing_only):
        jobs = [j for j in _jobs(args) if j["key"] not in runs]
        print(f"{len(jobs)} runs to do ({len(runs)} stored)", flush=True)
        t0 = time.perf_counter()
        with store.open("a") as fh, ProcessPoolExecutor(max_workers=args.jobs) as pool:
            for rec in pool.map(_one_run, jobs):
                fh.write(json.dumps(rec) + "\n")
                fh.flush()
                runs[rec["key"]] = rec
                final = _curve(rec)[-1]
                print(f"{rec['key']}: final {final:.4g} ({rec['time_s']:.1f} s)", flush=True)
        wall = f"{time.perf_counter() - t0:.0f} s for {len(jobs)} runs with --jobs {args.jobs}"
        with (out / f"{stem}_commands.txt").open("a") as fh:
            fh.write(f"{command.strip()}\n# {wall}\n")
    timing = json.loads(timing_store.read_text()) if timing_store.exists() else {}
    if args.timing or args.timing_only:
        from co_kg_step_time import time_step

        rows = []
        # support size at N = 8, then N at the 30 x 30 grid
        configs = [(10, 8), (20, 8), (30, 2), (30, 4), (30, 8)] if not args.smoke else [(6, 2)]
        # the one-shot mode optimises N + num_fantasies (N + 1) points per restart; in
        # development one step at 30 x 30, N = 8 (64 fantasies, 10 restarts) did not
        # finish in 15 minutes: it is timed up to 20 x 20 and at 30 x 30 with N = 2
        one_shot = [c for c in configs if c[0] * c[0] * c[1] <= 900 * 2 or c[0] <= 20]
        for mode, cases in (("discrete", configs), ("one-shot", one_shot)):
            for side, N in cases:
                row = time_step(side, N, discrete=mode == "discrete")
                print(json.dumps(row), flush=True)
                rows.append(row)
        timing = {"command": command.strip(), "rows": rows}
        timing_store.write_text(json.dumps(timing, indent=1) + "\n")
    meta = _meta(command.strip(), wall, timing.get("command", ""))
    text = report(runs, out, stem, meta, timing.get("rows", []))
    if args.smoke:
        print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
