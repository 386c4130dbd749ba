r"""LDP-BO benchmark: the experiments of [LDP-BO] Sec. 5 (paper 002), plus 3-D and timings.

[LDP-BO] Sec. 5.1: a 100-point grid on [0, 1], ``f = sum_{i <= 100} a_i k(., x_i)``,
``a_i ~ U[-1, 1]``, SE (l = 0.2) and Matern (l = 0.2, nu = 2.5) kernels; LDP: noise
``U[-1, 1]`` (R = 1), ``B = max |f|``, rewards privatised by Curator 1 (Laplace);
non-private heavy tails: Student-t noise with 3 degrees of freedom; cumulative regret
over 10 trials. The paper's claim: MoMA-GP-UCB is empirically the best in both settings.

Parts (``--parts``):

- **pilot**: the parameter grid of the "tuned" regime, on pilot function seeds 98 and 99
  (never benchmark seeds 0-9), SE kernel, epsilon = 1;
- **a**: LDP synthetic, epsilon in {0.5, 1, 2}, SE and Matern, LDP-TGP / LDP-ATA /
  LDP-MoMA, regimes "theory" (the paper's formulas, the learners' defaults) and "tuned"
  (:data:`TUNED`), through :func:`~botorch_fed.ldp.run_learner`;
- **b**: non-private, Student-t(3) noise, TGP / ATA / MoMA / GP-UCB, SE kernel;
- **c**: 3-D Hartmann (box domain, ``optimize_acqf`` each round) through the federation
  protocol (``run_federated("ldp-*", FederationSetup(problem="hartmann", dim=3, ...))``),
  epsilon = 1, uniform noise U[-1, 1];
- **d**: wall time of 10^4 rounds of LDP-MoMA-GP-UCB (theory defaults), with
  ``run_learner`` and with ``run_federated`` (10 clients).

Trial ``s`` uses ``function_seed = s``, noise seed ``10000 + s``, mechanism seed
``20000 + s`` and learner seed ``s``: every algorithm sees the same function and the
same noise / Laplace streams (paired comparisons: Wilcoxon signed-rank on R_T).

Every run is appended to ``ldp_bo_runs.jsonl`` as it finishes and skipped when asked
for again; ``--report`` rebuilds ``ldp_bo.md``, ``ldp_bo.json`` and the PNGs from it.

Usage::

    python benchmarks/ldp_bo.py --smoke --out /tmp/ldp_smoke     # ~30 s
    OMP_NUM_THREADS=1 python benchmarks/ldp_bo.py --parts pilot --jobs 2
    OMP_NUM_THREADS=1 python benchmarks/ldp_bo.py --parts a b c --jobs 2
    OMP_NUM_THREADS=1 python benchmarks/ldp_bo.py --parts d --jobs 1   # on a quiet machine
    python benchmarks/ldp_bo.py --report
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
import warnings
from collections import defaultdict
from concurrent.futures import ProcessPoolExecutor, as_completed
from datetime import UTC, datetime
from functools import lru_cache
from pathlib import Path

import numpy as np
from run_records import cpu_model, load_runs  # benchmarks/run_records.py (the script's folder)

RESULTS = Path(__file__).parent / "results"
STEM = "ldp_bo"

# The "tuned" regime: ONE fixed choice per algorithm for every setting, picked on the
# pilot seeds (part "pilot": the grid below, lowest mean R_T over seeds 98, 99, SE kernel,
# epsilon = 1); see the report's pilot table. GP-UCB (part b reference) takes TGP's beta_scale.
TUNED = {
    "tgp": {"beta_scale": 0.01},
    "ata": {"beta_scale": 0.01},  # q: the formula (q = 10 was worse on the pilot)
    "moma": {"beta_scale": 0.001, "k": 10},  # both at the edge of the pilot grid
    "gp-ucb": {"beta_scale": 0.01},
}
PILOT_GRID = {
    "tgp": [{"beta_scale": b} for b in (1.0, 0.3, 0.1, 0.03, 0.01, 0.003, 0.001)],
    "ata": [{"beta_scale": b, "q": q} for b in (1.0, 0.1, 0.01) for q in (None, 10.0)]
    + [{"beta_scale": 0.001, "q": None}],
    "moma": [{"beta_scale": b, "k": k} for b in (1.0, 0.1, 0.01) for k in (None, 30, 10)]
    + [{"beta_scale": 0.1, "k": 10, "q": 10.0}]
    + [{"beta_scale": 0.001, "k": k} for k in (30, 10)],
}
PILOT_SEEDS = (98, 99)
PILOT_T = {"tgp": 2000, "ata": 1000, "moma": 2000}
EPSILONS = (0.5, 1.0, 2.0)
KERNELS = ("se", "matern")
ALGOS_A = ("tgp", "ata", "moma")
ALGOS_B = ("gp-ucb", "tgp", "ata", "moma")
CHECKPOINTS = (100, 300, 1000, 2000, 3000, 10000)
LABEL = {"tgp": "TGP-UCB", "ata": "ATA-GP-UCB", "moma": "MoMA-GP-UCB", "gp-ucb": "GP-UCB"}


def _learner(algo: str, kernel, horizon: int, rewards, candidates, seed: int, params: dict):
    from botorch_fed.ldp import ATAGPUCB, GPUCB, TGPUCB, MoMAGPUCB

    cls = {"tgp": TGPUCB, "ata": ATAGPUCB, "moma": MoMAGPUCB, "gp-ucb": GPUCB}[algo]
    kw = {k: v for k, v in params.items() if v is not None}
    return cls(kernel, 1, horizon, rewards, candidates=candidates, seed=seed, **kw)


def _curve_points(T: int) -> list[int]:
    pts = np.unique(np.round(np.logspace(0, math.log10(T), 120)).astype(int))
    pts = sorted(set(pts.tolist()) | {c for c in CHECKPOINTS if c <= T} | {T})
    return pts


def _one_run(job: dict) -> dict:
    r"""One run in this (worker) process; returns its JSON record."""
    import torch

    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    if job["part"] == "c":
        return _federated_run(job)
    if job["part"] == "d":
        return _timing_run(job)
    from botorch_fed.ldp import RewardModel, make_kernel, run_learner
    from botorch_fed.privacy import LaplaceMechanism
    from botorch_fed.test_functions.ldp_synthetic import LDPSynthetic
    from botorch_fed.test_functions.noise import ObservationNoise

    s, T = job["seed"], job["T"]
    fn = LDPSynthetic(kernel=job["kernel"], lengthscale=0.2, nu=2.5, function_seed=s)
    B = float(fn.reward_bound)
    optimum = -float(fn.optimal_value)  # max_D f (fn returns -f)

    def f(x):
        return -fn.evaluate_true(x)

    like = torch.zeros((), dtype=torch.float64)
    if job["noise"] == "uniform":
        noise = ObservationNoise("uniform", 1.0, seed=10_000 + s)
    else:
        noise = ObservationNoise("student-t", 1.0, seed=10_000 + s, df=3.0)

    def reward(x):
        # shape [1], not []: ObservationNoise("student-t") fails on 0-d draws (scipy's
        # stdtrit returns a numpy scalar, torch.from_numpy rejects it)
        return f(x).reshape(()) + noise.sample(torch.Size([1]), like=like).reshape(())

    if job["epsilon"] is not None:
        rewards = RewardModel(B=B, R=1.0, epsilon=job["epsilon"])
        privatise = LaplaceMechanism(job["epsilon"], B, 1.0, seed=20_000 + s)
    else:
        rewards = RewardModel(B=B, R=None, noise_moment=noise.moment(2))
        privatise = None
    kernel = make_kernel(job["kernel"], 0.2, 2.5)
    learner = _learner(job["algo"], kernel, T, rewards, fn.candidates, s, job["params"])
    t0 = time.perf_counter()
    trace = run_learner(learner, reward, T, privatise=privatise, f=f, optimum=optimum)
    wall = time.perf_counter() - t0
    R = trace.cumulative_regret.numpy()
    rt = np.asarray(trace.round_times)
    # mean seconds per round over rounds (t/2, t] (MoMA's epoch work included)
    windows = {str(c): float(rt[c // 2 : c].mean()) for c in CHECKPOINTS if c <= T}
    pts = _curve_points(T)
    return {
        **job,
        "B": B,
        "optimum": optimum,
        "beta_t1": None,
        "R": {str(c): float(R[c - 1]) for c in (*CHECKPOINTS, T) if c <= T},
        "R_T": float(R[-1]),
        "curve": [[t, float(R[t - 1])] for t in pts],
        "time_s": wall,
        "round_time_windows": windows,
        "learner_k": getattr(learner, "k", None),
        "learner_q": float(learner.q) if hasattr(learner, "q") else None,
        "learner_beta_end": float(learner.beta()),
        "load": os.getloadavg()[0],
        "versions": _versions(),
    }


def _federated_run(job: dict) -> dict:
    r"""Part c: 3-D Hartmann through the federation protocol (box domain, optimize_acqf)."""
    from botorch_fed.algorithms import run_federated
    from botorch_fed.algorithms.ldp_bo import LDPBOSettings
    from botorch_fed.protocol import FederationSetup

    setup = FederationSetup(
        problem="hartmann", dim=3, num_clients=10, seed=job["seed"], noise="uniform", noise_std=1.0
    )
    settings = LDPBOSettings(
        num_rounds=job["T"],
        epsilon=1.0,
        reward_bound=3.87,  # max |Hartmann-3| = 3.86278
        noise_bound=1.0,
        kernel="se",
        lengthscale=0.2,
        num_restarts=job["num_restarts"],
        raw_samples=job["raw_samples"],
        maxiter=job["maxiter"],
        **{k: v for k, v in job["params"].items() if v is not None and k != "k"},
        **({"plays_per_epoch": job["params"]["k"]} if job["params"].get("k") else {}),
    )
    t0 = time.perf_counter()
    result = run_federated(job["algo_name"], setup, settings)
    wall = time.perf_counter() - t0
    cum = result.cumulative_regret_per_round
    T = len(cum)
    pts = _curve_points(T)
    return {
        **job,
        "R": {str(c): float(cum[c - 1]) for c in (*CHECKPOINTS, T) if c <= T},
        "R_T": float(cum[-1]),
        "curve": [[t, float(cum[t - 1])] for t in pts],
        "final_simple_regret": result.regret_per_round[-1],
        "time_s": wall,
        "load": os.getloadavg()[0],
        "versions": result.versions,
    }


def _timing_run(job: dict) -> dict:
    r"""Part d: wall time of ``T`` rounds of LDP-MoMA (theory defaults) both ways."""
    load_before = os.getloadavg()
    if job["how"] == "run_learner":
        rec = _one_run({**job, "part": "a"})
        rec["part"] = "d"
    else:
        from botorch_fed.algorithms import run_federated
        from botorch_fed.algorithms.ldp_bo import LDPBOSettings
        from botorch_fed.protocol import FederationSetup

        t0 = time.perf_counter()
        result = run_federated(
            "ldp-moma",
            FederationSetup(problem="ldp-synthetic", num_clients=10, seed=job["seed"]),
            LDPBOSettings(num_rounds=job["T"]),
        )
        rec = {
            **job,
            "time_s": time.perf_counter() - t0,
            "R_T": float(result.cumulative_regret_per_round[-1]),
            "versions": result.versions,
        }
    rec["load_before"] = list(load_before)
    rec["load_after"] = list(os.getloadavg())
    return rec


def _versions() -> dict:
    import botorch
    import torch

    return {"torch": torch.__version__, "botorch": botorch.__version__}


# --- jobs --------------------------------------------------------------------------------
def _params(algo: str, regime: str) -> dict:
    return {} if regime == "theory" else dict(TUNED[algo])


def _pkey(params: dict) -> str:
    return ",".join(f"{k}={params[k]}" for k in sorted(params)) or "defaults"


def _jobs(args) -> list[dict]:
    jobs = []
    seeds = range(args.trials)

    def add(**job):
        jobs.append(job)

    if "pilot" in args.parts:
        for algo, grid in PILOT_GRID.items():
            for params in grid:
                for s in PILOT_SEEDS[: args.pilot_seeds]:
                    T = min(PILOT_T[algo], args.T)
                    add(
                        key=f"pilot/{algo}/{_pkey(params)}/seed{s}/T{T}",
                        part="pilot",
                        kernel="se",
                        epsilon=1.0,
                        noise="uniform",
                        algo=algo,
                        regime="pilot",
                        params=params,
                        seed=s,
                        T=T,
                    )
    if "d" in args.parts:  # timing first: it wants the machine as quiet as possible
        for how in ("run_learner", "run_federated"):
            add(
                key=f"d/moma/{how}/seed0/T{args.T_long}"
                + (f"/rep{args.d_rep}" if args.d_rep else ""),
                part="d",
                how=how,
                kernel="se",
                epsilon=1.0,
                noise="uniform",
                algo="moma",
                regime="theory",
                params={},
                seed=0,
                T=args.T_long,
            )
    # priority order (the machine is shared; the queue runs in this order and whatever
    # finished is reported): part a MoMA (both regimes, all settings), TGP at epsilon = 1,
    # b (GP-UCB, TGP, MoMA), c (MoMA, TGP), tuned ATA at epsilon = 1 (O(t) rounds:
    # horizon T_ata), tuned TGP at the other epsilons, b ATA, tuned a10k (the paper's
    # horizon T = 10^4, SE, epsilon = 1), then the theory regime of the rest, c ATA and
    # ATA at the other epsilons
    all_a = [(k, e) for k in KERNELS for e in EPSILONS]
    eps1 = [(k, e) for k, e in all_a if e == 1.0]
    other = [(k, e) for k, e in all_a if e != 1.0]
    plan = []
    if "a" in args.parts:
        plan += [("a", "moma", regime, all_a) for regime in ("tuned", "theory")]
        plan += [("a", "tgp", regime, eps1) for regime in ("tuned", "theory")]
    if "b" in args.parts:
        plan += [("b", algo, "tuned", [("se", None)]) for algo in ("gp-ucb", "tgp", "moma")]
    if "c" in args.parts:
        plan += [("c", algo, "tuned", None) for algo in ("moma", "tgp")]
    if "a" in args.parts:
        plan += [("a", "ata", "tuned", [ke]) for ke in eps1]
        plan += [("a", "tgp", "tuned", other)]
    if "b" in args.parts:
        plan += [("b", "ata", "tuned", [("se", None)])]
    if "a10k" in args.parts:
        plan += [("a10k", algo, "tuned", [("se", 1.0)]) for algo in ("moma", "tgp")]
    if "a" in args.parts:
        plan += [("a", "tgp", "theory", other)]
        plan += [("a", "ata", "theory", [ke]) for ke in eps1]
    if "a10k" in args.parts:
        plan += [("a10k", algo, "theory", [("se", 1.0)]) for algo in ("moma", "tgp")]
    if "c" in args.parts:
        plan += [("c", "ata", "tuned", None)]
    if "a" in args.parts:
        plan += [("a", "ata", regime, [ke]) for ke in other for regime in ("tuned", "theory")]
    for part, algo, regime, settings in plan:
        if part == "c":
            for s in range(args.trials_c):
                add(
                    key=f"c/hartmann3/{algo}/{regime}/seed{s}/T{args.T_c}",
                    part="c",
                    algo=algo,
                    algo_name=f"ldp-{algo}",
                    regime=regime,
                    params=_params(algo, regime),
                    seed=s,
                    T=args.T_c,
                    num_restarts=args.num_restarts,
                    raw_samples=args.raw_samples,
                    maxiter=args.maxiter,
                )
            continue
        T = min(args.T_ata, args.T) if algo == "ata" else args.T
        if part == "a10k":
            T = args.T_long
        part = "a" if part == "a10k" else part
        for s in seeds:
            for kernel, eps in settings:
                add(
                    key=f"{part}/{kernel}/eps{eps}/{algo}/{regime}/seed{s}/T{T}",
                    part=part,
                    kernel=kernel,
                    epsilon=eps,
                    noise="uniform" if part == "a" else "student-t",
                    algo=algo,
                    regime=regime,
                    params=_params(algo, regime),
                    seed=s,
                    T=T,
                )
    return jobs


# --- the report --------------------------------------------------------------------------
def _mean_se(values) -> tuple[float, float, int]:
    v = np.asarray([x for x in values if x is not None], dtype=np.float64)
    if v.size == 0:
        return float("nan"), float("nan"), 0
    se = float(v.std(ddof=1) / np.sqrt(v.size)) if v.size > 1 else float("nan")
    return float(v.mean()), se, int(v.size)


def _fmt(m, se, n) -> str:
    if n == 0:
        return "-"
    return f"{m:.4g} +- {se:.2g} ({n})" if n > 1 else f"{m:.4g} (1)"


def _wilcoxon(a: dict, b: dict) -> tuple[float, int, int]:
    r"""Paired two-sided Wilcoxon on common seeds: p, #seeds where a < b, #pairs."""
    from scipy import stats

    common = sorted(set(a) & set(b))
    if len(common) < 2:
        return float("nan"), 0, len(common)
    x = np.array([a[s] for s in common])
    y = np.array([b[s] for s in common])
    wins = int((x < y).sum())
    if np.all(x == y):
        return 1.0, wins, len(common)
    return float(stats.wilcoxon(x, y).pvalue), wins, len(common)


def _by_seed(runs: list[dict], t: int) -> dict:
    return {r["seed"]: r["R"][str(t)] for r in runs if str(t) in r["R"]}


def _verdict(best_algo: str, tests: dict) -> str:
    r"""Is MoMA best: lowest mean and significantly (p < 0.05) below every other?"""
    if not tests:
        return "-"
    if best_algo != "moma":
        sig = [a for a, (p, w, n) in tests.items() if a == best_algo and p < 0.05]
        return f"**no**: {LABEL[best_algo]} lower" + (" (p < 0.05)" if sig else " (n.s.)")
    if all(p < 0.05 for p, _, _ in tests.values()):
        return "yes (p < 0.05 vs all)"
    return "lowest mean, not significant vs all"


@lru_cache(maxsize=256)
def _random_gap(kernel: str, seed: int) -> float:
    r"""max_D f - mean_D f: the expected regret per round of uniform random play."""
    from botorch_fed.test_functions.ldp_synthetic import LDPSynthetic

    fn = LDPSynthetic(kernel=kernel, lengthscale=0.2, nu=2.5, function_seed=seed)
    f = -fn.evaluate_true(fn.candidates)
    return float(f.max() - f.mean())


def _claim_table(lines, groups, settings, algos, regimes, part, planned, summary):
    for regime in regimes:
        lines += [f"### regime: {regime}", ""]
        head = (
            "| kernel | epsilon | horizon T | t | "
            + " | ".join(LABEL[a] for a in algos)
            + " | random play (expected) | MoMA vs others: p (MoMA lower on k/n) | MoMA best? |"
        )
        lines += [head, "|" + "---|" * (head.count("|") - 1)]
        for kernel, eps in settings:
            horizons = sorted(
                {k[5] for k in groups if k[:3] == (part, kernel, eps) and k[4] == regime}
            )
            # rows: every horizon H but the shortest (ATA's); t = 1000 and H
            rows = [(H, t) for H in horizons[1:] or horizons for t in sorted({1000, H})]
            for H, t in rows:
                cells, means, seeded = [], {}, {}
                for a in algos:
                    rs = groups.get((part, kernel, eps, a, regime, H), [])
                    mark = ""
                    if not rs:  # a shorter-horizon run (ATA) that reached t
                        alt = [h for h in horizons if t <= h < H]
                        rs = groups.get((part, kernel, eps, a, regime, alt[-1]), []) if alt else []
                        mark = f" [T={alt[-1]}]" if rs else ""
                    vals = [r["R"].get(str(t)) for r in rs]
                    m, se, n = _mean_se(vals)
                    cells.append(_fmt(m, se, n) + (mark if n else ""))
                    if n:
                        means[a] = m
                        seeded[a] = _by_seed(rs, t)
                    summary[f"{part}/{kernel}/eps{eps}/{a}/{regime}/T{H}/R{t}"] = [m, se, n]
                if not means:
                    continue
                tests = {}
                if "moma" in seeded:
                    for a in seeded:
                        if a != "moma":
                            tests[a] = _wilcoxon(seeded["moma"], seeded[a])
                pcell = (
                    "; ".join(
                        f"{LABEL[a].split('-')[0]}: {p:.3g} ({w}/{n})"
                        for a, (p, w, n) in tests.items()
                    )
                    or "-"
                )
                best = min(means, key=means.get)
                verdict = _verdict(best, tests) if "moma" in means and len(means) > 1 else "-"
                missing = [LABEL[a] for a in algos if a not in means]
                if missing:
                    verdict += f" (no {', '.join(missing)} at this t)"
                summary[f"{part}/{kernel}/eps{eps}/{regime}/T{H}/R{t}/verdict"] = verdict
                gap = np.mean([_random_gap(kernel, s) for s in sorted(seeded.get("moma", {0: 0}))])
                lines.append(
                    f"| {kernel} | {eps if eps is not None else 'non-private'} | {H} | {t} | "
                    + " | ".join(cells)
                    + f" | {t * gap:.4g} | {pcell} | {verdict} |"
                )
        lines.append("")


def report(runs: dict[str, dict], out: Path, meta: dict, planned: dict) -> str:
    groups = defaultdict(list)
    for r in runs.values():
        if r["part"] in ("a", "b"):
            groups[(r["part"], r["kernel"], r["epsilon"], r["algo"], r["regime"], r["T"])].append(r)
    summary: dict = {}
    lines = [
        "# LDP-BO benchmark ([LDP-BO] Sec. 5, paper 002)",
        "",
        f"Generated {meta['date']} by `{meta['command']}` on {meta['machine']}.",
        f"Versions: {meta['versions']}.",
        "",
        "Commands that produced the runs: `ldp_bo_commands.txt`. Every run: "
        "`ldp_bo_runs.jsonl`. Cumulative regret R_t = sum_{s<=t} (max_D f - f(x_s)) "
        "(maximisation, noise-free f). Cells: mean +- standard error over trials (n). "
        "p: two-sided Wilcoxon signed-rank test of MoMA's R_t against the other algorithm "
        "on the same trials (same function, noise and Laplace seeds); k/n: trials on "
        "which MoMA's R_t is lower. 'MoMA best?': yes only if MoMA has the lowest mean "
        "and p < 0.05 against every other algorithm.",
        "",
    ]
    conclusions = out / f"{STEM}_conclusions.md"
    if conclusions.exists():
        lines += [conclusions.read_text().strip(), ""]

    # completeness
    lines += ["## Completeness", "", "| part | group | runs stored | planned |"]
    lines += ["|---|---|---|---|"]
    for (part, group), n_planned in sorted(planned.items()):
        n = sum(1 for r in runs.values() if r["part"] == part and _group(r) == group)
        lines.append(f"| {part} | {group} | {n} | {n_planned} |")
    lines.append("")

    # pilot
    pilot = [r for r in runs.values() if r["part"] == "pilot"]
    if pilot:
        lines += [
            "## Pilot (choice of the tuned regime)",
            "",
            f"Function seeds {', '.join(map(str, PILOT_SEEDS))} (not benchmark seeds), SE "
            "kernel, epsilon = 1, U[-1, 1] noise; T per algorithm: "
            + ", ".join(f"{LABEL[a]} {t}" for a, t in PILOT_T.items())
            + ". 'defaults' / None = the paper's formula. Chosen: the lowest mean R_T "
            f"(marked *). TUNED in the script: `{json.dumps(TUNED)}`.",
            "",
            "| algorithm | parameters | T | R_T per pilot seed | mean R_T |",
            "|---|---|---|---|---|",
        ]
        pg = defaultdict(list)
        for r in pilot:
            pg[(r["algo"], _pkey(r["params"]), r["T"])].append(r)
        for algo in PILOT_GRID:
            keys = [k for k in pg if k[0] == algo]
            if not keys:
                continue
            best = min(keys, key=lambda k: np.mean([r["R_T"] for r in pg[k]]))
            for k in sorted(keys, key=lambda k: np.mean([r["R_T"] for r in pg[k]])):
                rs = sorted(pg[k], key=lambda r: r["seed"])
                per = ", ".join(f"{r['seed']}: {r['R_T']:.0f}" for r in rs)
                star = " *" if k == best else ""
                lines.append(
                    f"| {LABEL[algo]} | {k[1]}{star} | {k[2]} | {per} | "
                    f"{np.mean([r['R_T'] for r in rs]):.0f} |"
                )
        lines.append("")

    # part a
    if any(k[0] == "a" for k in groups):
        lines += [
            "## (a) LDP synthetic: private TGP / ATA / MoMA",
            "",
            "100-point grid on [0, 1], U[-1, 1] noise, R = 1, B = max_D |f|, rewards "
            "privatised by LaplaceMechanism(epsilon, B, R = 1) (Curator 1) before the learner "
            "sees them; run_learner on the candidate grid; kernel of the learner = the "
            "generating kernel (l = 0.2). ATA is run to a shorter horizon (see "
            "Completeness and the T column of the JSONL): '-' = not run to that t.",
            "",
        ]
        settings = [(k, e) for k in KERNELS for e in EPSILONS]
        _claim_table(lines, groups, settings, ALGOS_A, ("theory", "tuned"), "a", planned, summary)
    if any(k[0] == "b" for k in groups):
        lines += [
            "## (b) Non-private, Student-t (3 dof) noise",
            "",
            "SE kernel, same grid and functions, rewards not privatised, noise_moment = "
            "E[eta^2] = 3; tuned regime only (TUNED; GP-UCB takes TGP's beta_scale).",
            "",
        ]
        _claim_table(lines, groups, [("se", None)], ALGOS_B, ("tuned",), "b", planned, summary)

    # part c
    cr = [r for r in runs.values() if r["part"] == "c"]
    if cr:
        r0 = cr[0]
        lines += [
            "## (c) Beyond the paper: Hartmann-3 on [0, 1]^3 through the federation protocol",
            "",
            f"`run_federated('ldp-<algo>', FederationSetup(problem='hartmann', dim=3, "
            f"num_clients=10, seed=s, noise='uniform', noise_std=1.0), LDPBOSettings("
            f"num_rounds={r0['T']}, epsilon=1, reward_bound=3.87, noise_bound=1, kernel='se', "
            f"lengthscale=0.2, num_restarts={r0['num_restarts']}, raw_samples="
            f"{r0['raw_samples']}, maxiter={r0['maxiter']}, <TUNED>))`: box domain, "
            "optimize_acqf every UCB step, each client privatises its rewards. R_T = the "
            "protocol's cumulative regret (minimisation: sum of value - optimum).",
            "",
            "| algorithm | R_T | p vs MoMA (MoMA lower k/n) | regret of the best evaluation at T | "
            "time/run (s) |",
            "|---|---|---|---|---|",
        ]
        cg = defaultdict(list)
        for r in cr:
            cg[r["algo"]].append(r)
        mom = {r["seed"]: r["R_T"] for r in cg.get("moma", [])}
        for algo in ("moma", "tgp", "ata"):
            rs = cg.get(algo, [])
            if not rs:
                continue
            m, se, n = _mean_se([r["R_T"] for r in rs])
            sm, sse, _ = _mean_se([r["final_simple_regret"] for r in rs])
            tm, _, _ = _mean_se([r["time_s"] for r in rs])
            p = "-"
            if algo != "moma" and mom:
                pv, w, nn = _wilcoxon(mom, {r["seed"]: r["R_T"] for r in rs})
                p = f"{pv:.3g} ({w}/{nn})"
            summary[f"c/{algo}"] = {"R_T": [m, se, n], "time_s": tm}
            lines.append(
                f"| {LABEL[algo]} | {_fmt(m, se, n)} | {p} | {sm:.3g} +- {sse:.2g} | {tm:.1f} |"
            )
        lines.append("")

    # part d
    lines += _timing_section(runs, summary)
    text = "\n".join(lines)
    (out / f"{STEM}.md").write_text(text + "\n")
    (out / f"{STEM}.json").write_text(
        json.dumps({"meta": meta, "summary": summary}, indent=1, default=str) + "\n"
    )
    _plots(groups, cr, runs, out)
    return text


def _group(r: dict) -> str:
    if r["part"] == "pilot":
        return r["algo"]
    if r["part"] == "d":
        return r["how"]
    if r["part"] == "c":
        return f"{r['algo']}/{r['regime']}/T{r['T']}"
    return f"{r['algo']}/{r['regime']}/T{r['T']}"


def _timing_section(runs, summary) -> list[str]:
    lines = []
    d = [r for r in runs.values() if r["part"] == "d"]
    if d:
        lines += [
            "## (d) 10^4 rounds of LDP-MoMA-GP-UCB (theory defaults): wall time",
            "",
            "Target: under 60 s on 2 cores. One process, OMP_NUM_THREADS=1 (torch 1 thread); "
            "load = 1-minute load average before / after the run (other engineers share "
            "the machine).",
            "",
            "| how | T | wall (s) | R_T | load before / after | run |",
            "|---|---|---|---|---|---|",
        ]
        for r in sorted(d, key=lambda r: r["key"]):
            call = (
                "run_learner(MoMAGPUCB, SE, epsilon = 1, seed 0)"
                if r["how"] == "run_learner"
                else "run_federated('ldp-moma', FederationSetup(problem='ldp-synthetic', "
                "num_clients=10, seed=0), LDPBOSettings(num_rounds=T))"
            )
            summary[f"d/{r['how']}"] = r["time_s"]
            lines.append(
                f"| {call} | {r['T']} | **{r['time_s']:.1f}** | {r['R_T']:.0f} | "
                f"{r['load_before'][0]:.2f} / {r['load_after'][0]:.2f} | {r['key']} |"
            )
        lines.append("")
    ab = [r for r in runs.values() if r["part"] in ("a", "b")]
    if ab:
        lines += [
            "## (d) Seconds per round against t",
            "",
            "From `round_times` of the part (a) / (b) runs (propose + reward + privatise + "
            "observe): mean over the rounds (t/2, t] of a run, then mean over runs "
            "(all kernels / epsilons / trials of that algorithm and regime). The runs went "
            "two at a time on the 2 cores, beside other users' jobs: indicative.",
            "",
            "| part | algorithm | regime | T | "
            + " | ".join(f"t = {c}" for c in CHECKPOINTS)
            + " | whole run (s, mean) |",
            "|---|---|---|---|" + "---|" * (len(CHECKPOINTS) + 1),
        ]
        tg = defaultdict(list)
        for r in ab:
            tg[(r["part"], r["algo"], r["regime"], r["T"])].append(r)
        for key in sorted(tg):
            rs = tg[key]
            cells = []
            for c in CHECKPOINTS:
                windows = [r["round_time_windows"] for r in rs]
                v = [w[str(c)] for w in windows if str(c) in w]
                cells.append(f"{1e3 * np.mean(v):.2f} ms" if v else "-")
            summary[f"time/{key[0]}/{key[1]}/{key[2]}/T{key[3]}"] = cells
            lines.append(
                f"| {key[0]} | {LABEL[key[1]]} | {key[2]} | {key[3]} | "
                + " | ".join(cells)
                + f" | {np.mean([r['time_s'] for r in rs]):.1f} ({len(rs)} runs) |"
            )
        lines.append("")
    return lines


def _plots(groups, cr, runs, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {"tgp": "C0", "ata": "C1", "moma": "C2", "gp-ucb": "C3"}

    def draw(ax, rs, algo, style):
        T = min(r["T"] for r in rs)
        ts = [t for t, _ in rs[0]["curve"] if t <= T]
        curves = np.array([[dict((t, v) for t, v in r["curve"])[t] for t in ts] for r in rs])
        m = curves.mean(0)
        se = curves.std(0, ddof=1) / np.sqrt(len(rs)) if len(rs) > 1 else 0 * m
        ax.plot(ts, m, style, color=colors[algo], label=f"{LABEL[algo]} ({len(rs)})")
        ax.fill_between(ts, m - se, m + se, color=colors[algo], alpha=0.2)

    if any(k[0] == "a" for k in groups):
        fig, axes = plt.subplots(
            len(KERNELS),
            len(EPSILONS),
            squeeze=False,
            figsize=(4.4 * len(EPSILONS), 3.8 * len(KERNELS)),
        )
        for i, kernel in enumerate(KERNELS):
            for j, eps in enumerate(EPSILONS):
                ax = axes[i, j]
                for algo in ALGOS_A:
                    for regime, style in (("theory", "--"), ("tuned", "-")):
                        cell = ("a", kernel, eps, algo, regime)
                        for key in sorted(k for k in groups if k[:5] == cell):
                            draw(ax, groups[key], algo, style if key[5] <= 2000 else style[0] + ".")
                            line = ax.lines[-1]
                            line.set_label(f"{line.get_label()} {regime} T={key[5]}")
                ax.set_xscale("log")
                ax.set_title(f"(a) {kernel}, epsilon = {eps}", fontsize=9)
                ax.set_xlabel("t")
                ax.set_ylabel("cumulative regret R_t")
                ax.legend(fontsize=6)
        fig.suptitle("LDP synthetic: dashed = theory parameters, solid = tuned", fontsize=10)
        fig.tight_layout()
        fig.savefig(out / f"{STEM}_a.png", dpi=100)
        plt.close(fig)
    if any(k[0] == "b" for k in groups) or cr:
        fig, axes = plt.subplots(1, 2, figsize=(10, 4))
        for key in sorted(k for k in groups if k[0] == "b"):
            draw(axes[0], groups[key], key[3], "-")
        axes[0].set_title("(b) non-private, Student-t(3), SE, tuned", fontsize=9)
        cg = defaultdict(list)
        for r in cr:
            cg[r["algo"]].append(r)
        for algo, rs in cg.items():
            draw(axes[1], rs, algo, "-")
        axes[1].set_title("(c) Hartmann-3, epsilon = 1, federation protocol", fontsize=9)
        for ax in axes:
            ax.set_xlabel("t")
            ax.set_ylabel("cumulative regret R_t")
            ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(out / f"{STEM}_bc.png", dpi=100)
        plt.close(fig)
    ab = [r for r in runs.values() if r["part"] in ("a", "b")]
    if ab:
        fig, ax = plt.subplots(figsize=(6, 4))
        tg = defaultdict(list)
        for r in ab:
            tg[(r["algo"], r["regime"])].append(r)
        for (algo, regime), rs in sorted(tg.items()):
            cs = [c for c in CHECKPOINTS if all(str(c) in r["round_time_windows"] for r in rs)]
            if not cs:
                continue
            v = [1e3 * np.mean([r["round_time_windows"][str(c)] for r in rs]) for c in cs]
            ax.plot(
                cs,
                v,
                "o-" if regime == "tuned" else "s--",
                color=colors[algo],
                label=f"{LABEL[algo]} {regime}",
            )
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("t")
        ax.set_ylabel("ms per round (mean over (t/2, t])")
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(out / f"{STEM}_time.png", dpi=100)
        plt.close(fig)


def _meta(command: str) -> dict:
    import botorch
    import scipy
    import torch

    return {
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "command": command,
        "machine": f"{cpu_model()}, {os.cpu_count()} cores, {platform.platform()}",
        "versions": f"torch {torch.__version__}, botorch {botorch.__version__}, scipy "
        f"{scipy.__version__}, python {platform.python_version()}",
    }


def _planned(args) -> dict:
    planned = defaultdict(int)
    for j in _jobs(args):
        planned[(j["part"], _group(j))] += 1
    return planned


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="tiny T, 1 trial, all parts")
    parser.add_argument("--parts", nargs="+", default=["pilot", "d", "a", "b", "c", "a10k"])
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument("--T", type=int, default=2000, help="horizon of parts a, b (not ATA)")
    parser.add_argument("--T-long", type=int, default=10_000, help="horizon of part a10k")
    parser.add_argument("--T-ata", type=int, default=1000, help="ATA's horizon (O(t) rounds)")
    parser.add_argument("--trials-c", type=int, default=5)
    parser.add_argument("--T-c", type=int, default=300)
    parser.add_argument("--pilot-seeds", type=int, default=2)
    parser.add_argument("--d-rep", type=int, default=0, help="repeat part d under a new key")
    parser.add_argument("--num-restarts", type=int, default=2)
    parser.add_argument("--raw-samples", type=int, default=64)
    parser.add_argument("--maxiter", type=int, default=30)
    parser.add_argument("--jobs", type=int, default=1, help="runs in parallel (1 thread each)")
    parser.add_argument("--report", action="store_true", help="only rebuild the report")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    argv_used = sys.argv[1:] if argv is None else list(argv)
    prefix = ""
    if "OMP_NUM_THREADS" in os.environ:
        prefix = f"env OMP_NUM_THREADS={os.environ['OMP_NUM_THREADS']} "
    command = prefix + "python benchmarks/ldp_bo.py " + " ".join(argv_used)
    if args.smoke:
        if args.out == RESULTS:
            raise SystemExit("--smoke writes to --out (not over the committed results)")
        # T > MoMA's theory k (~250 at T = 300; the learner refuses k > T), T_c > tuned k
        args.trials, args.T, args.T_ata, args.trials_c, args.T_c = 1, 300, 30, 1, 12
        args.pilot_seeds, args.raw_samples, args.maxiter = 1, 16, 5
        args.parts = ["pilot", "a", "b", "c", "d", "a10k"]
        args.T_long = 300
        global PILOT_GRID, KERNELS, EPSILONS
        PILOT_GRID = {a: g[:1] for a, g in PILOT_GRID.items()}
        KERNELS, EPSILONS = ("se",), (1.0,)
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    store = out / f"{STEM}_runs.jsonl"
    runs = load_runs(store)
    if not args.report:
        jobs = [j for j in _jobs(args) if j["key"] not in runs]
        print(f"{len(jobs)} runs to do ({len(runs)} stored)", flush=True)
        with (out / f"{STEM}_commands.txt").open("a") as fh:
            fh.write(f"{command.strip()}  # started {datetime.now(UTC):%Y-%m-%d %H:%M} UTC\n")
        t0 = time.perf_counter()
        with store.open("a") as fh, ProcessPoolExecutor(max_workers=args.jobs) as pool:
            futures = [pool.submit(_one_run, j) for j in jobs]
            for fut in as_completed(futures):
                rec = fut.result()
                fh.write(json.dumps(rec) + "\n")
                fh.flush()
                runs[rec["key"]] = rec
                print(f"{rec['key']}: R_T {rec['R_T']:.4g} ({rec['time_s']:.1f} s)", flush=True)
        with (out / f"{STEM}_commands.txt").open("a") as fh:
            took = time.perf_counter() - t0
            fh.write(f"# {took:.0f} s for {len(jobs)} runs, --jobs {args.jobs}\n")
    # the planned runs of the full benchmark (defaults), for the completeness table
    full = parser.parse_args(["--trials", "10"]) if not args.smoke else args
    text = report(runs, out, _meta(command.strip()), _planned(full))
    if args.smoke:
        print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
