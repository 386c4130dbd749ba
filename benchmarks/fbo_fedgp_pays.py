r"""Does federating pay? FBO-FedGP against local BO (the floor) and central BO (the limit).

Issue 13. Every run is one federation on the in-process protocol (plaintext
aggregation: the secure backends change the bytes, not the decisions), GP-UCB with
``beta_t = 0.2 d log 2t``, 4 initial points per client. Algorithms:

- ``default``: FBO-FedGP with the library's default settings;
- ``paper``: FBO-FedGP with ``preset="paper"`` (Alg. 2 of the paper);
- ``local``: independent BO, every client on its own GP (no collaboration);
- ``central``: central BO on the pooled raw data (the non-private oracle);
- ``fts``: federated Thompson sampling with shared random Fourier features;
- ``variant:<name>``: FBO-FedGP with the options of :data:`VARIANTS` (the ablations).

Problems (:data:`SUITE`): homogeneous federations (every client the same function),
and heterogeneous ones (each client a shifted copy, ``shift``, with its initial design
in its own sub-box, ``init_regions``).

Metrics per run: the federation's simple regret ``f* - max over all evaluations``
(homogeneous), and every client's own simple regret on its own function (the mean
over clients is the heterogeneous suite's metric: does every party gain?).

Report (``fbo_fedgp_pays.md``): mean and standard error per problem and algorithm;
the gap closed ``(R_local - R_fed) / (R_local - R_central)`` of the means; paired
one-sided Wilcoxon signed-rank tests over seeds of each FBO-FedGP configuration
against local BO per problem, Holm-adjusted over the problems of a suite.

Usage::

    python benchmarks/fbo_fedgp_pays.py --smoke --out /tmp/pays     # ~1 minute
    python benchmarks/fbo_fedgp_pays.py --jobs 2                    # the suite
    python benchmarks/fbo_fedgp_pays.py --algorithms variant:pic-global --problems hartmann6
    python benchmarks/fbo_fedgp_pays.py --report
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
import warnings
from collections import defaultdict
from concurrent.futures import ProcessPoolExecutor
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
from run_records import cpu_model, load_runs  # benchmarks/run_records.py (the script's folder)

RESULTS = Path(__file__).parent / "results"
STEM = "fbo_fedgp_pays"
# name -> (problem, dim, clients, init, rounds, heterogeneous options)
SUITE = {
    "branin2": ("branin", 2, 5, 4, 20, {}),
    "levy4": ("levy", 4, 5, 4, 20, {}),
    "ackley5": ("ackley", 5, 5, 4, 20, {}),
    "hartmann6": ("hartmann", 6, 5, 4, 20, {}),
    "levy6": ("levy", 6, 5, 4, 20, {}),
    "cec2005-f1-10d": ("cec2005-f1", 10, 10, 4, 20, {}),
    "cec2005-f9-10d": ("cec2005-f9", 10, 10, 4, 20, {}),
    "hartmann6-shift": ("hartmann", 6, 5, 4, 20, {"shift": 0.1, "init_regions": True}),
    "levy4-shift": ("levy", 4, 5, 4, 20, {"shift": 0.1, "init_regions": True}),
}
BASELINES = ("local", "central", "fts")
_AVERAGE = {"hyperparameters": "average", "hyper_every": 10}  # the paper's
VARIANTS = {
    "pitc-global": {"mixing": "global", "global_model": "pitc", **_AVERAGE},
    "pitc-global-batch": {"mixing": "global", "global_batch": "batch", **_AVERAGE},
    "pic-sample": {"mixing": "sample", "global_model": "pic", **_AVERAGE},
    "pic-global": {"mixing": "global", "global_model": "pic", **_AVERAGE},
    "pic-global-average-every-round": {
        "mixing": "global",
        "global_model": "pic",
        "hyperparameters": "average",
        "hyper_every": 1,
    },
    "paper-federated": {
        "preset": "paper",
        "hyperparameters": "federated",
        "hyper_every": 5,
    },
}
DEFAULT_ALGORITHMS = ("default", "paper", "local", "central", "fts")


def run_key(problem: str, seed: int, algorithm: str) -> str:
    return f"{problem}/seed{seed}/{algorithm}"


def _settings(algorithm: str, common: dict):
    from botorch_fed.algorithms import FBOFedGPSettings
    from botorch_fed.protocol import BOSettings

    if algorithm == "default":
        return "fbo-fedgp", FBOFedGPSettings(**common)
    if algorithm == "paper":
        return "fbo-fedgp", FBOFedGPSettings.paper(**common)
    if algorithm.startswith("variant:"):
        return "fbo-fedgp", FBOFedGPSettings(**common, **VARIANTS[algorithm.split(":", 1)[1]])
    return algorithm, BOSettings(**common)


def _one_run(job: dict) -> dict:
    r"""One federation in this (worker) process; a JSON record. Optional job keys (for
    other drivers, e.g. ``fbo_fedgp_support_privacy.py``): ``setup`` (more
    ``FederationSetup`` arguments) and ``options`` (more settings arguments)."""
    import torch

    from botorch_fed.algorithms import run_federated
    from botorch_fed.protocol import FederationSetup

    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    problem, dim, clients, init, rounds, hetero = SUITE[job["problem"]]
    setup = FederationSetup(
        problem=problem,
        dim=dim,
        num_clients=clients,
        seed=job["seed"],
        aggregator="plaintext",
        **hetero,
        **job.get("setup", {}),
    )
    common = {"num_init": init, "num_rounds": rounds, **job.get("options", {})}
    name, settings = _settings(job["algorithm"], common)
    t0 = time.perf_counter()
    result = run_federated(name, setup, settings)
    opt = result.optimal_value
    if opt is None:  # shifted clients: the optimum stays inside the box for SUITE's shifts
        from botorch_fed.test_functions import get_test_function

        opt = float(get_test_function(problem, dim=dim).optimal_value)
    return {
        "key": job["key"],
        "problem": job["problem"],
        "seed": job["seed"],
        "algorithm": job["algorithm"],
        "regret": abs(result.best_value - opt),
        "client_regret": {str(c): abs(v - opt) for c, v in result.best_per_client.items()},
        "regret_per_round": result.regret_per_round,
        "steps": result.steps,
        "time_s": time.perf_counter() - t0,
        "stage_s": result.ledger["stage_s"],
        "settings": result.config,
    }


# --- statistics ---------------------------------------------------------------------------
def _holm(pvalues: list[float]) -> list[float]:
    from statsmodels.stats.multitest import multipletests

    return list(multipletests(pvalues, method="holm")[1]) if pvalues else []


def _paired_p(fed: dict[int, float], local: dict[int, float]) -> tuple[float, int]:
    r"""One-sided Wilcoxon signed-rank p (fed < local) over the shared seeds."""
    from scipy.stats import wilcoxon

    seeds = sorted(set(fed) & set(local))
    if len(seeds) < 5:
        return float("nan"), len(seeds)
    a = np.array([fed[s] for s in seeds])
    b = np.array([local[s] for s in seeds])
    if np.allclose(a, b):
        return 1.0, len(seeds)
    return float(wilcoxon(a, b, alternative="less").pvalue), len(seeds)


def _over_problems(log_ratios: list[float]) -> float:
    r"""One-sided Wilcoxon signed-rank p that the per-problem log regret ratios are
    below 0 (nan with fewer than 3 problems)."""
    from scipy.stats import wilcoxon

    if len(log_ratios) < 3:
        return float("nan")
    return float(wilcoxon(log_ratios, alternative="less").pvalue)


def _metric(rec: dict) -> float:
    hetero = bool(SUITE[rec["problem"]][5])
    return float(np.mean(list(rec["client_regret"].values()))) if hetero else rec["regret"]


# --- report ------------------------------------------------------------------------------
def report(runs: dict[str, dict], out: Path, meta: dict) -> str:
    by = defaultdict(dict)  # (problem, algorithm) -> {seed: metric}
    client = defaultdict(dict)  # (problem, algorithm) -> {seed: mean client regret}
    worst = defaultdict(dict)  # (problem, algorithm) -> {seed: worst client regret}
    times = defaultdict(list)
    for r in runs.values():
        if r["problem"] not in SUITE:
            continue
        k = (r["problem"], r["algorithm"])
        by[k][r["seed"]] = _metric(r)
        vals = list(r["client_regret"].values())
        client[k][r["seed"]] = float(np.mean(vals))
        worst[k][r["seed"]] = float(np.max(vals))
        times[k].append(r["time_s"])
    problems = [p for p in SUITE if any(k[0] == p for k in by)]
    algorithms = sorted({k[1] for k in by}, key=_algo_order)
    feds = [a for a in algorithms if a not in BASELINES]
    lines = [
        "# Does federating pay? FBO-FedGP against local and central BO (issue 13)",
        "",
        f"- commands: {'; '.join(f'`{c}`' for c in meta['commands'])}",
        f"- machine: {meta['machine']}; versions: {meta['versions']}",
        f"- report written {meta['date']}; every run in `{STEM}_runs.jsonl`",
        "- every run: in-process protocol, plaintext aggregation, GP-UCB (beta_t = 0.2 d log "
        "2t), 4 initial points per client; regret = f* - best value (lower is better)",
        "- homogeneous problems: the federation's simple regret (best over all clients); "
        "heterogeneous (`-shift`: each client a copy shifted by up to 0.1 per coordinate, "
        "initial design in its own sub-box): the mean over clients of each client's own "
        "simple regret on its own function",
        "",
        "## Simple regret (mean +- standard error over seeds)",
        "",
        "| problem | d | M | T | " + " | ".join(algorithms) + " |",
        "|---|---:|---:|---:|" + "---:|" * len(algorithms),
    ]
    for p in problems:
        _, dim, M, _, T, _ = SUITE[p]
        cells = []
        for a in algorithms:
            v = list(by.get((p, a), {}).values())
            cells.append(
                f"{np.mean(v):.4g} +- {np.std(v) / np.sqrt(len(v)):.2g} ({len(v)})" if v else "-"
            )
        lines.append(f"| {p} | {dim} | {M} | {T} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "## Every party's own regret (mean over clients / worst client, mean over seeds)",
        "",
        "| problem | " + " | ".join(algorithms) + " |",
        "|---|" + "---:|" * len(algorithms),
    ]
    for p in problems:
        cells = []
        for a in algorithms:
            c, w = list(client.get((p, a), {}).values()), list(worst.get((p, a), {}).values())
            cells.append(f"{np.mean(c):.3g} / {np.mean(w):.3g}" if c else "-")
        lines.append(f"| {p} | " + " | ".join(cells) + " |")
    summary = {"problems": {}, "suites": {}}
    for suite, hetero in (("homogeneous", False), ("heterogeneous", True)):
        ps = [p for p in problems if bool(SUITE[p][5]) == hetero]
        if not ps:
            continue
        lines += [
            "",
            f"## {suite.capitalize()} suite: FBO-FedGP against local BO",
            "",
            "p: one-sided Wilcoxon signed-rank over seeds (FBO-FedGP's regret below local "
            "BO's), Holm-adjusted over this suite's problems per configuration. Gap closed: "
            "(R_local - R_fed) / (R_local - R_central) of the means (1 = central BO's regret, "
            "0 = local BO's, < 0 worse than local; nan where central BO is not better than "
            "local BO). The suite's mean gap is over the problems where it is defined; "
            "'over problems': one-sided Wilcoxon signed-rank over the problems of "
            "log(R_fed / R_local) < 0 (with n problems its smallest possible p is 2^-n).",
            "",
            "| configuration | problem | R_fed | R_local | R_central | gap closed | p | p (Holm) |",
            "|---|---|---:|---:|---:|---:|---:|---:|",
        ]
        for a in feds:
            rows = []
            for p in ps:
                fed, loc, cen = by.get((p, a)), by.get((p, "local")), by.get((p, "central"))
                if not fed or not loc or len(fed) < 5:  # an unfinished configuration
                    continue
                pv, n = _paired_p(fed, loc)
                r_f, r_l = np.mean(list(fed.values())), np.mean(list(loc.values()))
                r_c = np.mean(list(cen.values())) if cen else float("nan")
                # undefined where central BO is not better than local BO (no gap to close)
                gap = (r_l - r_f) / (r_l - r_c) if cen and r_c < r_l else float("nan")
                rows.append([p, r_f, r_l, r_c, gap, pv, n])
            adj = _holm([r[5] for r in rows if np.isfinite(r[5])])
            it = iter(adj)
            for r in rows:
                r.append(next(it) if np.isfinite(r[5]) else float("nan"))
                lines.append(
                    f"| {a} | {r[0]} | {r[1]:.4g} | {r[2]:.4g} | {r[3]:.4g} | {r[4]:.2f} | "
                    f"{r[5]:.3g} (n={r[6]}) | {r[7]:.3g} |"
                )
                summary["problems"][f"{suite}/{a}/{r[0]}"] = {
                    "R_fed": r[1], "R_local": r[2], "R_central": r[3], "gap_closed": r[4],
                    "p": r[5], "p_holm": r[7], "seeds": r[6],
                }  # fmt: skip
            if rows:
                gaps = [r[4] for r in rows if np.isfinite(r[4])]
                sig = sum(1 for r in rows if r[7] < 0.05)
                # over the problems: one-sided Wilcoxon of log(R_fed / R_local) < 0
                p_over = _over_problems([np.log(r[1] / r[2]) for r in rows])
                summary["suites"][f"{suite}/{a}"] = {
                    "mean_gap_closed": float(np.mean(gaps)) if gaps else None,
                    "problems_significant": sig,
                    "problems": len(rows),
                    "p_over_problems": p_over,
                }
                mean_gap = f"{np.mean(gaps):.2f}" if gaps else "-"
                lines.append(
                    f"| **{a}** | **all {len(rows)}** | | | | **{mean_gap}** | "
                    f"**over problems {p_over:.3g}** | **{sig} of {len(rows)} < 0.05** |"
                )
    lines += [
        "",
        "## Wall time per run (s, mean)",
        "",
        "| problem | " + " | ".join(algorithms) + " |",
    ]
    lines += ["|---|" + "---:|" * len(algorithms)]
    for p in problems:
        cells = [f"{np.mean(times[(p, a)]):.1f}" if times.get((p, a)) else "-" for a in algorithms]
        lines.append(f"| {p} | " + " | ".join(cells) + " |")
    text = "\n".join(lines) + "\n"
    (out / f"{STEM}.md").write_text(text)
    (out / f"{STEM}.json").write_text(json.dumps(summary, indent=1, default=float) + "\n")
    return text


def _algo_order(a: str) -> tuple:
    order = {"default": 0, "paper": 1, "local": 3, "central": 4, "fts": 5}
    return (order.get(a, 2), a)


def _meta(commands: list[str]) -> dict:
    import botorch
    import torch

    return {
        "commands": commands,
        "machine": f"{cpu_model()}, {platform.platform()}",
        "versions": f"python {platform.python_version()}, torch {torch.__version__}, "
        f"botorch {botorch.__version__}",
        "date": f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC",
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="2 problems, 2 seeds, 5 rounds")
    parser.add_argument("--problems", nargs="+", default=list(SUITE), choices=list(SUITE))
    parser.add_argument("--algorithms", nargs="+", default=list(DEFAULT_ALGORITHMS))
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--report", action="store_true", help="only rebuild the report")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    for a in args.algorithms:
        known = a in DEFAULT_ALGORITHMS or (a.startswith("variant:") and a[8:] in VARIANTS)
        if not known:
            parser.error(f"--algorithms: unknown {a!r} (variants: {sorted(VARIANTS)})")
    if args.smoke:
        if args.out.resolve() == RESULTS.resolve():
            raise SystemExit("--smoke writes to --out DIR (not over the committed results)")
        for name in ("branin2", "hartmann6-shift"):
            problem, dim, M, init, _, hetero = SUITE[name]
            SUITE[name] = (problem, dim, M, init, 5, hetero)
        args.problems, args.seeds = ["branin2", "hartmann6-shift"], 5
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    store = out / f"{STEM}_runs.jsonl"
    runs = load_runs(store)
    command = "python benchmarks/fbo_fedgp_pays.py " + " ".join(
        sys.argv[1:] if argv is None else argv
    )
    commands_file = out / f"{STEM}_commands.txt"
    if not args.report:
        jobs = [
            {"key": run_key(p, s, a), "problem": p, "seed": s, "algorithm": a}
            for p in args.problems
            for s in range(args.seeds)
            for a in args.algorithms
            if run_key(p, s, a) not in runs
        ]
        print(f"{len(jobs)} runs to do ({len(runs)} stored)", flush=True)
        with commands_file.open("a") as fh:
            fh.write(f"{command.strip()}  # started {datetime.now(UTC):%Y-%m-%d %H:%M} UTC\n")
        t0 = time.perf_counter()
        with ProcessPoolExecutor(args.jobs) as pool, store.open("a") as fh:
            for rec in pool.map(_one_run, jobs):
                fh.write(json.dumps(rec) + "\n")
                fh.flush()
                runs[rec["key"]] = rec
                print(
                    f"{rec['key']}: regret {rec['regret']:.4g} ({rec['time_s']:.1f} s)", flush=True
                )
        with commands_file.open("a") as fh:
            fh.write(
                f"# {time.perf_counter() - t0:.0f} s for {len(jobs)} runs, --jobs {args.jobs}\n"
            )
    commands = [
        line.split("  #")[0]
        for line in commands_file.read_text().splitlines()
        if line and not line.startswith("#")
    ] if commands_file.exists() else [command]  # fmt: skip
    text = report(runs, out, _meta(sorted(set(commands))))
    if args.smoke:
        print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
