r"""Scaling of the federated dPITC model against an exact GP on pooled data.

For total data sizes up to 20,000 points spread over M = 10..100 heterogeneous
clients and support sets |S| in {16, 32, 64, 128}, measures:

- the time to build the global model (all clients' summaries, their sum, the
  model's caches) and to predict 1,000 test points (mean and marginal variance),
- the test RMSE,

for the federated dPITC model, an exact ``SingleTaskGP`` on the pooled data (up to
``--exact-max-n``; Cholesky, no CG), and each client's own GP (mean RMSE). All
models share the same hyperparameters (fitted once on a pooled subset), so the
comparison isolates the approximation and its cost. The support set comes from
federated k-means (Alg. 1); its time is reported separately.

Usage::

    python benchmarks/dpitc_scaling.py            # full grid (~15 min on 2 cores)
    python benchmarks/dpitc_scaling.py --smoke    # seconds

Writes ``dpitc_scaling.json``, ``dpitc_scaling.md`` and ``dpitc_scaling.png`` into
``--out`` (default ``benchmarks/results``).
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
from datetime import UTC, datetime
from pathlib import Path

import gpytorch
import numpy as np
import torch
from botorch.exceptions.warnings import InputDataWarning
from botorch.models import SingleTaskGP
from botorch.models.utils.gpytorch_modules import (
    get_covar_module_with_dim_scaled_prior,
    get_gaussian_likelihood_with_lognormal_prior,
)

from botorch_fed.inducing import global_support, local_centers
from botorch_fed.models import (
    FederatedPITCGP,
    SparseSummary,
    compute_local_summary,
    fit_exact_gp,
)
from botorch_fed.models.support_set import support_cholesky
from botorch_fed.regression_demo import RegressionDemoConfig, simulate_clients

FUNCTION, DIM = "hartmann", 3
KEY_POINT = {"n": 10_000, "M": 50, "S": 64}


def _grid(smoke: bool) -> list[dict]:
    if smoke:
        return [{"n": 400, "M": 10, "S": 16}, {"n": 800, "M": 20, "S": 32}]
    points = []
    for n in (1_000, 2_000, 5_000, 10_000, 20_000):  # vary n
        points.append({"n": n, "M": 50, "S": 64})
    for S in (16, 32, 128):  # vary |S| at the key point
        points.append({"n": 10_000, "M": 50, "S": S})
    for M in (10, 100):  # vary M at the key point
        points.append({"n": 10_000, "M": M, "S": 64})
    # the exact GP at n = 20,000 is measured once above (M = 50); a second one runs out
    # of the 24 GB of this machine next to the 100 client GPs
    points.append({"n": 20_000, "M": 100, "S": 128, "exact": False})
    return points


def _rmse(model, X_test, y_test) -> tuple[float, float]:
    t0 = time.perf_counter()
    with torch.no_grad():
        post = model.posterior(X_test.unsqueeze(-2))
        mean = post.mean.reshape(-1)
        _ = post.variance  # marginal variances are part of "predict"
    elapsed = time.perf_counter() - t0
    return (mean - y_test).pow(2).mean().sqrt().item(), elapsed


def shared_hyperparameters(clients, seed: int):
    r"""Fit kernel + noise once by exact MLL on a pooled subset of <= 1,000 points."""
    X = torch.cat([c[0] for c in clients])
    Y = torch.cat([c[1] for c in clients])
    idx = torch.randperm(len(X), generator=torch.Generator().manual_seed(seed))[:1000]
    d = X.shape[-1]
    k = get_covar_module_with_dim_scaled_prior(d).double()
    lik = get_gaussian_likelihood_with_lognormal_prior().double()
    gp = fit_exact_gp(
        X[idx], Y[idx], seed=seed, covar_module=k, likelihood=lik, outcome_transform=None
    )
    return k, lik, gp.mean_module


def run_point(n: int, M: int, S: int, seed: int, exact_max_n: int, exact: bool = True) -> dict:
    config = RegressionDemoConfig(
        function=FUNCTION,
        dim=DIM,
        num_clients=M,
        points_per_client=max(2, n // M),
        support_size=S,
        noise_std=0.05,
        region_width=0.5,
        num_test=1000,
        seed=seed,
    )
    clients, X_test, y_test, _ = simulate_clients(config)
    # standardise outcomes (federated moments give exactly these numbers)
    Y_all = torch.cat([c[1] for c in clients])
    mu, sd = Y_all.mean(), Y_all.std()
    clients = [(X, (Y - mu) / sd) for X, Y in clients]
    y_test = (y_test - mu) / sd
    n_total = len(Y_all)
    k, lik, mean = shared_hyperparameters(clients, seed)
    rec = {"n": n_total, "M": M, "S": S}

    t0 = time.perf_counter()
    k_local = max(1, math.ceil(2 * S / M))
    centers = [
        local_centers(X, k=min(k_local, len(X)), seed=seed + i, min_cluster_size=1)
        for i, (X, _) in enumerate(clients)
    ]
    support = global_support(centers, S, seed=seed)
    rec["support_s"] = time.perf_counter() - t0
    rec["support_size"] = len(support)

    with torch.no_grad():
        t0 = time.perf_counter()
        L = support_cholesky(support, k)
        client_times, packed = [], []
        for X, Y in clients:
            tc = time.perf_counter()
            packed.append(
                compute_local_summary(X, Y, support, k, lik, mean, support_chol=L).to_numpy()
            )
            client_times.append(time.perf_counter() - tc)
        total = SparseSummary.from_numpy(np.sum(packed, axis=0), len(support))
        fed = FederatedPITCGP(support, total, k, lik, mean)
        rec["fed_build_s"] = time.perf_counter() - t0
        rec["fed_client_max_s"] = max(client_times)
        rec["fed_rmse"], rec["fed_predict_s"] = _rmse(fed, X_test, y_test)
        rec["fed_total_s"] = rec["fed_build_s"] + rec["fed_predict_s"]

        shared = {"covar_module": k, "likelihood": lik, "mean_module": mean}
        shared["outcome_transform"] = None
        local = []
        for X, Y in clients:
            gp = SingleTaskGP(
                X, Y, covar_module=k, likelihood=lik, mean_module=mean, outcome_transform=None
            )
            local.append(_rmse(gp, X_test, y_test)[0])
        rec["local_rmse_mean"] = float(np.mean(local))
        rec["local_rmse_best"] = float(np.min(local))

        if exact and n_total <= exact_max_n:
            X_all = torch.cat([c[0] for c in clients])
            Y_all = torch.cat([c[1] for c in clients])
            with gpytorch.settings.max_cholesky_size(10**9):
                t0 = time.perf_counter()
                gp = SingleTaskGP(
                    X_all,
                    Y_all,
                    covar_module=k,
                    likelihood=lik,
                    mean_module=mean,
                    outcome_transform=None,
                ).eval()
                rec["exact_build_s"] = time.perf_counter() - t0
                rec["exact_rmse"], rec["exact_predict_s"] = _rmse(gp, X_test, y_test)
            rec["exact_total_s"] = rec["exact_build_s"] + rec["exact_predict_s"]
            rec["speedup"] = rec["exact_total_s"] / rec["fed_total_s"]
            rec["rmse_ratio"] = rec["fed_rmse"] / rec["exact_rmse"]
    return rec


def _versions() -> dict:
    import botorch
    import sklearn

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "botorch": botorch.__version__,
        "gpytorch": gpytorch.__version__,
        "numpy": np.__version__,
        "scikit-learn": sklearn.__version__,
    }


def _fmt(v, spec):
    return "-" if v is None else format(v, spec)


def write_results(records: list[dict], out: Path, command: str, smoke: bool) -> None:
    out.mkdir(parents=True, exist_ok=True)
    stem = "dpitc_scaling_smoke" if smoke else "dpitc_scaling"
    meta = {
        "command": command,
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": (
            f"{platform.platform()}, {os.cpu_count()} CPUs, torch threads {torch.get_num_threads()}"
        ),
        "versions": _versions(),
        "function": f"{FUNCTION} ({DIM}-D), clients in boxes of side 0.5, noise 5% of std",
    }
    (out / f"{stem}.json").write_text(json.dumps({"meta": meta, "records": records}, indent=2))
    lines = [
        "# dPITC scaling: federated sparse GP vs exact GP on pooled data",
        "",
        f"- command: `{command}`",
        f"- date: {meta['date']}",
        f"- machine: {meta['machine']}",
        f"- versions: {', '.join(f'{k} {v}' for k, v in meta['versions'].items())}",
        f"- data: {meta['function']}; 1,000 test points; shared hyperparameters",
        "- time = build (all client summaries sequentially + sum + model caches) + predict "
        "1,000 points (mean + marginal variance); exact GP uses Cholesky",
        "",
        "| n | M | S | fed build+predict [s] | exact build+predict [s] | speed-up | "
        "fed RMSE | exact RMSE | RMSE ratio | local-GP RMSE (mean / best) | support [s] |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in records:
        lines.append(
            f"| {r['n']} | {r['M']} | {r['S']} | {r['fed_total_s']:.3f} | "
            f"{_fmt(r.get('exact_total_s'), '.2f')} | {_fmt(r.get('speedup'), '.1f')} | "
            f"{r['fed_rmse']:.4f} | {_fmt(r.get('exact_rmse'), '.4f')} | "
            f"{_fmt(r.get('rmse_ratio'), '.3f')} | {r['local_rmse_mean']:.3f} / "
            f"{r['local_rmse_best']:.3f} | {r['support_s']:.2f} |"
        )
    key = [
        r
        for r in records
        if (r["M"], r["S"]) == (KEY_POINT["M"], KEY_POINT["S"])
        and abs(r["n"] - KEY_POINT["n"]) < 0.2 * KEY_POINT["n"]
    ]
    if key and "speedup" in key[0]:
        r = key[0]
        lines += [
            "",
            f"**Key point** (n = {r['n']}, M = {r['M']}, |S| = {r['S']}): federated model "
            f"{r['speedup']:.1f}x faster than the exact GP (target >= 10x); RMSE ratio "
            f"fed/exact = {r['rmse_ratio']:.3f}.",
        ]
    (out / f"{stem}.md").write_text("\n".join(lines) + "\n")
    _plot(records, out / f"{stem}.png")


def _plot(records: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    vary_n = sorted(
        (r for r in records if (r["M"], r["S"]) == (50, 64)), key=lambda r: r["n"]
    ) or sorted(records, key=lambda r: r["n"])
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    ns = [r["n"] for r in vary_n]
    axes[0].loglog(ns, [r["fed_total_s"] for r in vary_n], "o-", label="federated dPITC")
    ex = [r for r in vary_n if "exact_total_s" in r]
    axes[0].loglog([r["n"] for r in ex], [r["exact_total_s"] for r in ex], "s-", label="exact GP")
    axes[0].set_xlabel("total n")
    axes[0].set_ylabel("build + predict 1,000 points [s]")
    axes[0].legend()
    axes[1].semilogx(ns, [r["fed_rmse"] for r in vary_n], "o-", label="federated dPITC")
    axes[1].semilogx([r["n"] for r in ex], [r["exact_rmse"] for r in ex], "s-", label="exact GP")
    axes[1].semilogx(
        ns, [r["local_rmse_mean"] for r in vary_n], "^-", label="client's own GP (mean)"
    )
    axes[1].set_xlabel("total n")
    axes[1].set_ylabel("test RMSE (standardised)")
    axes[1].legend()
    title = ", ".join(f"{k}={v}" for k, v in {"M": vary_n[0]["M"], "|S|": vary_n[0]["S"]}.items())
    fig.suptitle(f"dPITC vs exact GP ({title})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="tiny grid, seconds")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--exact-max-n", type=int, default=20_000, help="largest n for the exact GP"
    )
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args(argv)
    warnings.simplefilter("ignore", InputDataWarning)
    command = "python benchmarks/dpitc_scaling.py " + " ".join(
        argv if argv is not None else sys.argv[1:]
    )
    records = []
    for point in _grid(args.smoke):
        rec = run_point(
            point["n"],
            point["M"],
            point["S"],
            args.seed,
            args.exact_max_n,
            exact=point.get("exact", True),
        )
        records.append(rec)
        write_results(records, args.out, command.strip(), args.smoke)  # survive a crash
        print(
            f"n={rec['n']:6d} M={rec['M']:3d} S={rec['S']:3d}  fed {rec['fed_total_s']:.3f}s "
            f"rmse {rec['fed_rmse']:.4f} | exact {rec.get('exact_total_s', float('nan')):.2f}s "
            f"rmse {rec.get('exact_rmse', float('nan')):.4f} | local {rec['local_rmse_mean']:.3f}",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
