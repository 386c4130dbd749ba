r"""Federated hyperparameter tuning: every algorithm on a real task, with held-out losses.

Task (:mod:`botorch_fed.tasks.federated_hpo`): M clients tune five hyperparameters of
scikit-learn's ``HistGradientBoostingClassifier`` (log10 learning rate, log2 max leaf
nodes, min samples leaf, log10 l2 regularisation, max features) on their slices of
``breast_cancer``: quantity skew Dirichlet(10) as in Sec. 5.1 of the FBO-FedGP paper,
Dirichlet(``--label-alpha``) label skew, a stratified train/validation split per
client, a shared held-out test set. Each client's black box is its validation
log-loss (a ``CallableObjective``). One partition (``--data-seed``) for every run, so
"client i" is the same client across seeds and algorithms.

Algorithms, all through ``run_federated`` with the same seeds: FBO-FedGP's paper preset
with each aggregator (plaintext, ckks, masking: the secure sums are exact, so the three must
take the same decisions -- checked on every seed by a digest of every evaluated
point), FBO-FedGP's library default (``fbo-fedgp-default``, plaintext), independent local
BO, centralised BO on pooled evaluations (the non-private oracle), FTS-style federated
Thompson sampling, random search.

Scores of a run (log-loss, lower is better; ``FederatedHPOTask`` defines the losses):

- **client test loss**: each client deploys its own incumbent (its lowest validation
  loss among its own evaluations), trained on its own training split; scored on the
  shared test set weighted to the client's class frequencies. "client mean" is the
  mean over clients;
- **federation test loss**: the federation's best configuration (``RunResult.
  best_point``: the lowest validation loss any client evaluated) deployed by every
  client on its own data; the clients' test losses weighted by their data sizes;
- **best validation loss** per round: each client's own best so far (mean over
  clients) and the federation's (minimum over clients) -- the convergence plot.

Every run is appended to ``federated_hpo_runs.jsonl`` and skipped when asked for
again; the report (markdown + JSON summary + PNG) is rebuilt from all stored runs.

Usage::

    python benchmarks/federated_hpo.py --smoke        # seconds
    nice env OMP_NUM_THREADS=1 python benchmarks/federated_hpo.py --seeds 10 --rounds 20
    python benchmarks/federated_hpo.py --report
"""

from __future__ import annotations

import argparse
import hashlib
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
VARIANTS = (
    ("fbo-fedgp", "plaintext"),
    ("fbo-fedgp-default", "plaintext"),  # the library's default preset (the real task's plan)
    ("fbo-fedgp", "ckks"),
    ("fbo-fedgp", "masking"),
    ("local", None),
    ("central", None),
    ("fts", None),
    ("random", None),
)
AGGREGATORS = ("plaintext", "ckks", "masking")
PLOT_FBO = "fbo-fedgp/ckks"  # the three aggregators' curves coincide when decisions agree


def label(algorithm: str, aggregator: str | None) -> str:
    return f"{algorithm}/{aggregator}" if aggregator else algorithm


def run_key(seed: int, variant: str) -> str:
    return f"seed{seed}/{variant}"


@lru_cache(maxsize=4)
def _task(task_args: tuple):
    from botorch_fed.tasks import make_federated_hpo_task

    return make_federated_hpo_task(**dict(task_args))


class Recorder:
    r"""Wraps a client's black box and keeps what it was asked and answered (the
    user's side of the API: a callable may log whatever it likes)."""

    def __init__(self, fn) -> None:
        self.fn = fn
        self.X: list[list[float]] = []
        self.y: list[float] = []

    def __call__(self, X):
        out = self.fn(X)
        self.X.extend(X.tolist())
        self.y.extend(out.reshape(-1).tolist())
        return out


def _one_run(job: dict) -> dict:
    r"""Run one (seed, algorithm) in this (worker) process; return a JSON record."""
    import torch

    from botorch_fed.algorithms import FBOFedGPSettings, run_federated
    from botorch_fed.problems.objectives import CallableObjective
    from botorch_fed.protocol import BOSettings, FederationSetup

    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    task = _task(tuple(sorted(job["task"].items())))
    recorders = [Recorder(o.fn) for o in task.objectives()]
    objectives = [
        CallableObjective(r, bounds=task.bounds, minimize=True, name=f"client{i}")
        for i, r in enumerate(recorders)
    ]
    setup = FederationSetup(
        objectives=objectives, seed=job["seed"], aggregator=job["aggregator"] or "plaintext"
    )
    common = dict(num_init=job["init"], num_rounds=job["rounds"])
    algorithm = job["algorithm"]
    if algorithm == "fbo-fedgp":
        # the stored runs are the paper's algorithm (issue 13 changed the library's default)
        settings = FBOFedGPSettings.paper(**common, support_size=job["support_size"])
    elif algorithm == "fbo-fedgp-default":  # the library's default, as a user gets it
        algorithm, settings = "fbo-fedgp", FBOFedGPSettings(**common)
    else:
        settings = BOSettings(**common)
    client_best: list[list[float | None]] = []

    def on_round(t: int, best) -> None:
        client_best.append([min(r.y) if r.y else None for r in recorders])

    t0 = time.perf_counter()
    result = run_federated(algorithm, setup, settings, on_round=on_round)
    time_s = time.perf_counter() - t0
    incumbents, client_val = [], []
    for i, r in enumerate(recorders):
        ok = [k for k, v in enumerate(r.y) if np.isfinite(v)]
        k = min(ok, key=lambda k: r.y[k])  # first of ties, as the library's own record
        incumbents.append(r.X[k])
        client_val.append(r.y[k])
        if client_val[-1] != result.best_per_client[i]:
            raise RuntimeError(f"client {i}: recorder {client_val[-1]} != library record")
    t1 = time.perf_counter()
    client_test = [task.test_loss(i, x) for i, x in enumerate(incumbents)]
    federation_test = task.federation_test_loss(result.best_point)
    points = np.array([x for r in recorders for x in r.X], dtype=np.float64)
    return {
        "key": job["key"],
        "seed": job["seed"],
        "algorithm": job["algorithm"],
        "aggregator": job["aggregator"],
        "variant": job["variant"],
        "best_value": result.best_value,
        "best_point": result.best_point,
        "best_per_round": result.best_per_round,
        "client_best_per_round": client_best,
        "client_val": client_val,
        "client_incumbent": incumbents,
        "client_test": client_test,
        "federation_test": federation_test,
        "client_evaluations": [r.y for r in recorders],
        "points_sha256": hashlib.sha256(points.tobytes()).hexdigest(),
        "num_evaluations": len(points),
        "failures": len(result.failures),
        "time_s": time_s,
        "test_time_s": time.perf_counter() - t1,
        "stage_s": result.ledger["stage_s"],
        "bytes_up": result.ledger["total_bytes_up"],
        "bytes_down": result.ledger["total_bytes_down"],
        "steps": result.steps,
        "settings": result.config["settings"],
        "versions": result.versions,
    }


def _jobs(args, task_args: dict) -> list[dict]:
    jobs = []
    for seed in range(args.seeds):
        for algorithm, aggregator in VARIANTS:
            if algorithm not in args.algorithms:
                continue
            if aggregator is not None and aggregator not in args.aggregators:
                continue
            variant = label(algorithm, aggregator)
            jobs.append(
                {
                    "key": run_key(seed, variant),
                    "seed": seed,
                    "algorithm": algorithm,
                    "aggregator": aggregator,
                    "variant": variant,
                    "init": args.init,
                    "rounds": args.rounds,
                    "support_size": args.support_size,
                    "task": task_args,
                }
            )
    return jobs


# --- statistics -------------------------------------------------------------------------
def mean_se(values) -> tuple[float, float]:
    v = np.asarray(values, dtype=np.float64)
    se = float(v.std(ddof=1) / np.sqrt(len(v))) if len(v) > 1 else float("nan")
    return float(v.mean()), se


def _fmt(m: float, se: float, digits: int = 3) -> str:
    return f"{m:.{digits}f} ± {se:.{digits}f}" if np.isfinite(se) else f"{m:.{digits}f}"


def paired(a: list[float], b: list[float]) -> dict:
    r"""Paired comparison of ``a`` against ``b`` over seeds: mean difference ``a - b``
    with its standard error, wins (``a < b``), losses and the two-sided Wilcoxon
    signed-rank p-value."""
    from scipy.stats import wilcoxon

    d = np.asarray(a) - np.asarray(b)
    m, se = mean_se(d)
    p = float("nan")
    if len(d) >= 2 and np.any(d != 0):
        p = float(wilcoxon(a, b, alternative="two-sided").pvalue)
    return {"diff": m, "se": se, "wins": int((d < 0).sum()), "losses": int((d > 0).sum()), "p": p}


def default_reference(task) -> dict:
    r"""Test losses of scikit-learn's default hyperparameters (``learning_rate=0.1``,
    ``max_leaf_nodes=31``, ``min_samples_leaf=20``, ``l2_regularization=0``,
    all features), same ``max_iter`` and ``random_state`` as the task."""
    from sklearn.ensemble import HistGradientBoostingClassifier

    losses = []
    for i, c in enumerate(task.clients):
        model = HistGradientBoostingClassifier(
            max_iter=task.max_iter, early_stopping=False, random_state=task.random_state
        )
        with task._threads():
            model.fit(c.X_train, c.y_train)
        losses.append(task.score_test(i, model))
    sizes = np.asarray(task.client_sizes, dtype=np.float64)
    return {
        "client_test": losses,
        "client_mean": float(np.mean(losses)),
        "federation": float((sizes * np.asarray(losses)).sum() / sizes.sum()),
    }


# --- report ---------------------------------------------------------------------------
def report(runs: dict[str, dict], out: Path, stem: str, meta: dict, task) -> str:
    by = defaultdict(list)
    for r in runs.values():
        by[r["variant"]].append(r)
    for recs in by.values():
        recs.sort(key=lambda r: r["seed"])
    variants = [label(a, g) for a, g in VARIANTS if label(a, g) in by]
    M = task.num_clients
    ref = default_reference(task)
    local = {r["seed"]: r for r in by.get("local", [])}
    summary: dict = {"meta": meta, "task": task.describe(), "default_hyperparameters": ref}
    rows = {}
    for v in variants:
        recs = by[v]
        cm = [float(np.mean(r["client_test"])) for r in recs]
        fed = [r["federation_test"] for r in recs]
        val = [float(np.mean(r["client_val"])) for r in recs]
        row = {
            "runs": len(recs),
            "seeds": [r["seed"] for r in recs],
            "client_mean_test": mean_se(cm),
            "federation_test": mean_se(fed),
            "federation_test_median": float(np.median(fed)),
            "incumbent_mean": np.mean(
                [x for r in recs for x in r["client_incumbent"]], axis=0
            ).tolist(),
            "incumbent_high_lr": float(
                np.mean([x[0] >= -0.5 for r in recs for x in r["client_incumbent"]])
            ),
            "client_mean_best_val": mean_se(val),
            "per_client_test": [mean_se([r["client_test"][i] for r in recs]) for i in range(M)],
            "time_s": mean_se([r["time_s"] for r in recs]),
            "bytes_up": float(np.mean([r["bytes_up"] for r in recs])),
            "failures": int(sum(r["failures"] for r in recs)),
        }
        if v != "local" and local:
            common = [r for r in recs if r["seed"] in local]
            if common:
                row["vs_local_client_mean"] = paired(
                    [float(np.mean(r["client_test"])) for r in common],
                    [float(np.mean(local[r["seed"]]["client_test"])) for r in common],
                )
                row["vs_local_federation"] = paired(
                    [r["federation_test"] for r in common],
                    [local[r["seed"]]["federation_test"] for r in common],
                )
        rows[v] = row
    summary["rows"] = rows
    # the three aggregators must take the same decisions
    equal = {}
    fbo = {g: {r["seed"]: r for r in by.get(f"fbo-fedgp/{g}", [])} for g in AGGREGATORS}
    seeds_all = sorted(set.intersection(*(set(d) for d in fbo.values()))) if fbo else []
    for s in seeds_all:
        recs = [fbo[g][s] for g in AGGREGATORS]
        equal[s] = {
            "points": len({r["points_sha256"] for r in recs}) == 1,
            "values": all(r["client_evaluations"] == recs[0]["client_evaluations"] for r in recs),
        }
    summary["aggregators_equal"] = {str(s): e for s, e in equal.items()}
    n_equal = sum(e["points"] and e["values"] for e in equal.values())

    t = task.describe()
    sizes = [list(p) for p in zip(t["client_train_sizes"], t["client_val_sizes"], strict=True)]
    lines = [
        f"# Federated hyperparameter tuning (HistGradientBoostingClassifier, {t['dataset']})",
        "",
        f"- commands: {'; '.join(f'`{c}`' for c in meta['commands'])}"
        + (
            f"; report rebuilt with `{meta['report_command']}`"
            if meta.get("report_command")
            else ""
        ),
        f"- machine: {meta['machine']}",
        f"- versions: {meta['versions']}",
        f"- report written: {meta['date']}; runs stored in `{stem}_runs.jsonl`; "
        f"benchmark wall time: {meta['wall']}",
        f"- task: `{t['dataset']}`, M = {M} clients, quantity skew "
        f"Dirichlet({t['quantity_alpha']}), label skew Dirichlet({t['label_alpha']}), data "
        f"seed {t['seed']} (one partition for every run); train/validation sizes {sizes}, "
        f"class counts {t['client_class_counts']}; shared test set {t['test_size']} samples; "
        f"HGB max_iter = {t['max_iter']}, 1 OpenMP thread per evaluation"
        + (
            f"; each client's black box: the {t['cv_folds']}-fold cross-validated log-loss on "
            "its whole slice (its 'validation loss' below), incumbents trained on the whole slice"
            if t.get("cv_folds")
            else ""
        ),
        "- search space (d = 5): "
        + ", ".join(
            f"{h['name']} {'' if h['scale'] == 'linear' else h['scale'] + ' '}"
            f"[{h['low']:g}, {h['high']:g}]{' (integer)' if h['integer'] else ''}"
            for h in t["search_space"]
        ),
        f"- budget: {meta['setting']}; GP-UCB (beta_t = 0.2 d log 2t) for every BO "
        "algorithm; `fbo-fedgp/*`: the paper's preset (`FBOFedGPSettings.paper`: c = 0.5, "
        "clustered support re-selected every 5 rounds, averaged local hyperparameters); "
        "`fbo-fedgp-default/*`: the library's default (`FBOFedGPSettings()`)",
        "- losses: log-loss (lower is better), mean ± standard error over seeds. *client "
        "mean*: each client deploys its own incumbent (lowest validation loss among its own "
        "evaluations), trained on its own training split, scored on the shared test set "
        "weighted to its class frequencies; mean over clients. *federation*: the run's best "
        "point (lowest validation loss any client evaluated) deployed by every client on its "
        "own data, test losses weighted by client size. *paired vs local*: mean difference "
        "(negative: better than local BO) ± s.e., wins/losses over seeds, two-sided Wilcoxon "
        "signed-rank p.",
        "",
        "## Held-out test loss",
        "",
        "| algorithm | runs | client mean | paired vs local | federation | median | "
        "paired vs local | best val. (client mean) | s / run |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]

    def _pair(p: dict | None) -> str:
        if p is None:
            return "-"
        return f"{p['diff']:+.3f} ± {p['se']:.3f} ({p['wins']}/{p['losses']}, p={p['p']:.2g})"

    for v in variants:
        r = rows[v]
        lines.append(
            f"| {v} | {r['runs']} | {_fmt(*r['client_mean_test'])} | "
            f"{_pair(r.get('vs_local_client_mean'))} | {_fmt(*r['federation_test'])} | "
            f"{r['federation_test_median']:.3f} | {_pair(r.get('vs_local_federation'))} | "
            f"{_fmt(*r['client_mean_best_val'], 4)} | "
            f"{r['time_s'][0]:.1f} |"
        )
    lines.append(
        f"| sklearn defaults (no tuning) | - | {ref['client_mean']:.3f} | - | "
        f"{ref['federation']:.3f} | - | - | - | - |"
    )
    owners = defaultdict(int)
    for v in variants:
        for r in by[v]:
            owners[min(range(M), key=lambda i: r["client_val"][i])] += 1
    summary["best_point_owner"] = {str(k): n for k, n in sorted(owners.items())}
    lines += [
        "",
        "Whose validation set the run's best point (the *federation* column) comes from: "
        + ", ".join(
            f"client {k} in {n} runs" for k, n in sorted(owners.items(), key=lambda kv: -kv[1])
        )
        + f" (of {sum(owners.values())}).",
    ]
    lines += [
        "",
        "## Test loss per client (own incumbent)",
        "",
        "| algorithm | "
        + " | ".join(f"client {i} (n={s})" for i, s in enumerate(task.client_sizes))
        + " |",
        "|---|" + "---:|" * M,
    ]
    for v in variants:
        lines.append(
            f"| {v} | " + " | ".join(_fmt(*ms) for ms in rows[v]["per_client_test"]) + " |"
        )
    lines.append(
        "| sklearn defaults | " + " | ".join(f"{x:.3f}" for x in ref["client_test"]) + " |"
    )
    names = [h["name"] for h in t["search_space"]]
    lines += [
        "",
        "## Where the client incumbents lie",
        "",
        "Search-space coordinates (learning rate and l2 as log10, leaves as log2), mean over "
        "clients and seeds.",
        "",
        "| algorithm | " + " | ".join(names) + " | share with learning_rate >= 10^-0.5 |",
        "|---|" + "---:|" * (len(names) + 1),
    ]
    for v in variants:
        lines.append(
            f"| {v} | "
            + " | ".join(f"{c:.2f}" for c in rows[v]["incumbent_mean"])
            + f" | {rows[v]['incumbent_high_lr']:.2f} |"
        )
    lines += [
        "",
        "## FBO-FedGP: the aggregators take the same decisions",
        "",
        f"Seeds where plaintext, ckks and masking evaluated bit-identical points (SHA-256 of "
        f"every client's evaluated points) with identical validation losses: "
        f"**{n_equal}/{len(equal)}**"
        + (
            f" (differ: {[s for s, e in equal.items() if not (e['points'] and e['values'])]})"
            if n_equal < len(equal)
            else ""
        )
        + ".",
    ]
    fbo_time = {
        g: rows[f"fbo-fedgp/{g}"]["time_s"][0] for g in AGGREGATORS if f"fbo-fedgp/{g}" in rows
    }
    if fbo_time:
        lines.append(
            "Mean wall time per run: "
            + ", ".join(f"{g} {s:.1f} s" for g, s in fbo_time.items())
            + "; mean bytes up per run: "
            + ", ".join(f"{g} {rows[f'fbo-fedgp/{g}']['bytes_up']:.3g}" for g in fbo_time)
            + "."
        )
    lines += ["", "## Conclusions", "", meta.get("conclusions") or "(not written for this run)"]
    lines += ["", f"Convergence plot: `{stem}.png`."]
    text = "\n".join(lines) + "\n"
    (out / f"{stem}.md").write_text(text)
    (out / f"{stem}.json").write_text(json.dumps(summary, indent=2))
    _plot(by, variants, out / f"{stem}.png", meta)
    return text


def _plot(by, variants, path: Path, meta: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    shown = [v for v in variants if not v.startswith("fbo-fedgp/") or v == PLOT_FBO]
    if PLOT_FBO not in by:
        shown = variants
    for v in shown:
        recs = by[v]
        own = np.array([[np.mean(b) for b in r["client_best_per_round"]] for r in recs])
        fed = np.array([r["best_per_round"] for r in recs], dtype=np.float64)
        for ax, curves in zip(axes, (own, fed), strict=True):
            m = curves.mean(axis=0)
            se = curves.std(axis=0, ddof=1) / np.sqrt(len(curves)) if len(curves) > 1 else 0 * m
            x = np.arange(len(m))
            name = "fbo-fedgp (any aggregator)" if v == PLOT_FBO else v
            (line,) = ax.plot(x, m, label=name)
            ax.fill_between(x, m - se, m + se, color=line.get_color(), alpha=0.2)
    axes[0].set_title("each client's own best (mean over clients)")
    axes[1].set_title("federation's best (minimum over clients)")
    for ax in axes:
        ax.set_xlabel("round (0: initial design)")
        ax.set_yscale("log")
    axes[0].set_ylabel("best validation log-loss")
    axes[0].legend(fontsize=7)
    fig.suptitle(f"Federated HGB tuning, {meta['setting']} (mean ± s.e. over seeds)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _meta(commands: list[str], args, wall: str) -> dict:
    import sklearn

    from botorch_fed.protocol.results import library_versions

    libraries = {**library_versions(), "scikit-learn": sklearn.__version__}
    versions = ", ".join(f"{name} {version}" for name, version in libraries.items())
    return {
        "commands": commands,
        "machine": f"{cpu_model()}, {os.cpu_count()} cores, {platform.platform()}",
        "versions": versions,
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "setting": f"M = {args.clients}, {args.init} initial points per client, "
        f"T = {args.rounds} rounds, {args.seeds} seeds",
        "wall": wall,
        "conclusions": args.conclusions.read_text().strip() if args.conclusions else None,
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="CI-size: 3 clients, 2 seeds, tiny")
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--algorithms", nargs="+", default=sorted({a for a, _ in VARIANTS}))
    parser.add_argument("--clients", type=int, default=5)
    parser.add_argument("--init", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--support-size", type=int, default=16)
    parser.add_argument("--dataset", default="breast_cancer")
    parser.add_argument("--label-alpha", type=float, default=1.0)
    parser.add_argument("--quantity-alpha", type=float, default=10.0)
    parser.add_argument("--data-seed", type=int, default=0)
    parser.add_argument(
        "--cv-folds",
        type=int,
        help="each client's black box is its k-fold cross-validated loss on its whole slice "
        "(results under federated_hpo_cv_<dataset>.*); default: its validation split's loss",
    )
    parser.add_argument(
        "--aggregators", nargs="+", default=list(AGGREGATORS), choices=AGGREGATORS,
        help="FBO-FedGP's aggregators (the three take the same decisions)",
    )  # fmt: skip
    parser.add_argument("--jobs", type=int, default=1, help="runs in parallel (1 thread each)")
    parser.add_argument("--report", action="store_true", help="only rebuild the report")
    parser.add_argument("--conclusions", type=Path, help="markdown file for the Conclusions")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    argv_used = sys.argv[1:] if argv is None else list(argv)
    prefix = f"nice -n {os.nice(0)} " if os.nice(0) > 0 else ""
    if "OMP_NUM_THREADS" in os.environ:
        prefix += f"env OMP_NUM_THREADS={os.environ['OMP_NUM_THREADS']} "
    command = prefix + "python benchmarks/federated_hpo.py " + " ".join(argv_used)
    if args.smoke:
        args.seeds, args.clients, args.init, args.rounds, args.support_size = 2, 3, 3, 2, 8
        stem = "federated_hpo_smoke"
    else:
        stem = "federated_hpo" if args.cv_folds is None else f"federated_hpo_cv_{args.dataset}"
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    task_args = {
        "dataset": args.dataset,
        "num_clients": args.clients,
        "quantity_alpha": args.quantity_alpha,
        "label_alpha": args.label_alpha,
        "seed": args.data_seed,
    }
    if args.cv_folds is not None:  # absent from the validation-split runs' records
        task_args["cv_folds"] = args.cv_folds
    task = _task(tuple(sorted(task_args.items())))
    store = out / f"{stem}_runs.jsonl"
    log = out / f"{stem}_commands.txt"
    runs = load_runs(store)
    if args.report and runs:  # the stored runs' setting, whatever the flags say
        first = next(iter(runs.values()))
        args.init, args.rounds, args.support_size = (
            first["budget"][k] for k in ("init", "rounds", "support_size")
        )
        args.seeds = len({r["seed"] for r in runs.values()})
    budget = {"init": args.init, "rounds": args.rounds, "support_size": args.support_size}
    stale = [
        k
        for k, r in runs.items()
        if r.get("task", task_args) != task_args or r.get("budget", budget) != budget
    ]
    if stale:
        raise SystemExit(f"{store} holds runs of another setting ({stale[:3]}...): use --out")
    wall = "-"
    if not args.report:
        jobs = [j for j in _jobs(args, task_args) if j["key"] not in runs]
        print(f"{len(jobs)} runs to do ({len(runs)} stored)", flush=True)
        if jobs:
            with log.open("a") as fh:
                fh.write(command.strip() + "\n")
        t0 = time.perf_counter()
        with store.open("a") as fh, ProcessPoolExecutor(max_workers=args.jobs) as pool:
            for rec in pool.map(_one_run, jobs):
                rec["task"], rec["budget"] = task_args, budget
                fh.write(json.dumps(rec) + "\n")
                fh.flush()
                runs[rec["key"]] = rec
                print(
                    f"{rec['key']}: client-mean test {np.mean(rec['client_test']):.4f}, "
                    f"federation test {rec['federation_test']:.4f} ({rec['time_s']:.1f} s)",
                    flush=True,
                )
        wall = f"{time.perf_counter() - t0:.0f} s for {len(jobs)} runs with --jobs {args.jobs}"
        if jobs:
            with log.open("a") as fh:
                fh.write(f"# {wall}\n")
    commands = (
        [c for c in log.read_text().splitlines() if not c.startswith("#")]
        if log.exists()
        else [command.strip()]
    )
    walls = (
        [c[2:] for c in log.read_text().splitlines() if c.startswith("# ")] if log.exists() else []
    )
    meta = _meta(commands, args, "; ".join(walls) or wall)
    if args.report:
        meta["report_command"] = command.strip()
    text = report(runs, out, stem, meta, task)
    if args.smoke:
        print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
