r"""Why FBO-FedGP's global steps did not pay: how good is each model a client can use?

Issue 13, part 1. A federation of ``M`` clients with ``n_i`` uniform points each on a
test function. Every model predicts at held-out points -- uniform in the domain, and
near client 0's own data (its points plus N(0, 0.05^2) noise, clipped) -- and we report
RMSE and the mean negative log predictive density (NLL, observation noise included) of
the standardised outcomes, mean over seeds:

- ``exact``: the exact GP on the pooled data (what central BO uses; the limit);
- ``local``: client 0's own GP on its own data (what local BO and Alg. 2's local
  steps use);
- ``dPITC |S|=k``: the federated PITC model (Alg. 2's global model) on a support of
  ``k`` points chosen as FBO-FedGP does (each client's k-means centres of clusters
  with >= 2 points, then k-means over all centres);
- ``dPIC |S|=k``: client 0's distributed PIC model -- the same summaries plus its own
  block treated exactly (``FederatedPICGP``, ``global_model="pic"``).

Both sparse models are computed densely here (``K~_*f (Q_ff + Lambda)^-1 y``), with two
sources of hyperparameters: ``pooled`` (fitted on the pooled data: isolates the
approximation) and ``average`` (the size-weighted average of the clients' own fits:
FBO-FedGP's ``hyperparameters="average"``). The paper's schedule ``p_t = 1 - t^-c``
gives the expected fraction of global steps, reported too.

Usage::

    python benchmarks/fbo_fedgp_diagnose.py            # ~3 minutes on 2 cores
    python benchmarks/fbo_fedgp_diagnose.py --smoke --out /tmp/diag
"""

from __future__ import annotations

import argparse
import math
import platform
import sys
import warnings
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import torch
from run_records import cpu_model  # benchmarks/run_records.py (the script's folder)

RESULTS = Path(__file__).parent / "results"
STEM = "fbo_fedgp_diagnosis"
PROBLEMS = {"hartmann6": ("Hartmann", 6), "levy4": ("Levy", 4), "ackley5": ("Ackley", 5)}
FEDERATIONS = ((5, 10), (5, 24), (10, 24))  # (M, n_i)
SEEDS = 3


def _fit(X: torch.Tensor, Y: torch.Tensor):
    from botorch.fit import fit_gpytorch_mll
    from botorch.models import SingleTaskGP
    from gpytorch.mlls import ExactMarginalLogLikelihood

    gp = SingleTaskGP(X, Y)
    fit_gpytorch_mll(ExactMarginalLogLikelihood(gp.likelihood, gp))
    return gp.eval()


def _hyper(gp) -> tuple[torch.Tensor, float, float]:
    return (
        gp.covar_module.lengthscale.detach().squeeze(0).clone(),
        float(gp.likelihood.noise.item()),
        float(gp.mean_module.constant.item()),
    )


def _kernel(ls: torch.Tensor):
    from botorch.models.utils.gpytorch_modules import get_covar_module_with_dim_scaled_prior

    k = get_covar_module_with_dim_scaled_prior(len(ls)).to(torch.float64)
    k.lengthscale = ls.unsqueeze(0)
    return lambda A, B: k(A, B).to_dense().detach()


def _sparse(K, X, blocks, S, noise, mean, r, Xt, own: int | None):
    r"""Dense PITC (``own=None``) or PIC with block ``own`` exact: mean and variance."""
    Kss = K(S, S) + 1e-8 * torch.eye(len(S), dtype=torch.float64)
    Ksf = K(S, X)
    Q = Ksf.T @ torch.linalg.solve(Kss, Ksf)
    Kff = K(X, X)
    A = Q + noise * torch.eye(len(X), dtype=torch.float64)
    for sl in blocks:
        A[sl, sl] += Kff[sl, sl] - Q[sl, sl]
    Ktf = K(Xt, S) @ torch.linalg.solve(Kss, Ksf)
    if own is not None:
        Ktf[:, blocks[own]] = K(Xt, X[blocks[own]])
    sol = torch.linalg.solve(A, torch.cat([r, Ktf.T], 1))
    m = mean + (Ktf @ sol[:, :1]).squeeze(-1)
    v = K(Xt, Xt).diagonal() - (Ktf * sol[:, 1:].T).sum(1)
    return m, v.clamp_min(1e-12)


def _scores(m, v, noise, y) -> tuple[float, float]:
    var = v + noise
    rmse = float(((m - y) ** 2).mean().sqrt())
    nll = float((0.5 * torch.log(2 * math.pi * var) + 0.5 * (y - m) ** 2 / var).mean())
    return rmse, nll


def one(problem: str, M: int, n_i: int, seed: int) -> dict:
    import botorch.test_functions as tf

    from botorch_fed.inducing import global_support, local_centers

    cls, d = PROBLEMS[problem]
    fn = getattr(tf, cls)(dim=d) if cls != "Hartmann" else tf.Hartmann(dim=d)
    g = torch.Generator().manual_seed(seed)
    lo, hi = fn.bounds[0].double(), fn.bounds[1].double()

    def f(U):
        return -fn(lo + U * (hi - lo)).unsqueeze(-1)

    Xs = [torch.rand(n_i, d, generator=g, dtype=torch.float64) for _ in range(M)]
    X = torch.cat(Xs)
    Y = f(X)
    mu, sd = Y.mean(), Y.std()
    Yn = (Y - mu) / sd
    blocks = [slice(i * n_i, (i + 1) * n_i) for i in range(M)]
    tests = {
        "uniform": torch.rand(300, d, generator=g, dtype=torch.float64),
        "near own data": (
            Xs[0][torch.randint(0, n_i, (300,), generator=g)]
            + 0.05 * torch.randn(300, d, generator=g, dtype=torch.float64)
        ).clamp(0, 1),
    }
    exact = _fit(X, Yn)
    local = _fit(Xs[0], Yn[blocks[0]])
    fits = [_fit(Xi, Yn[b]) for Xi, b in zip(Xs, blocks, strict=True)]
    hypers = {"pooled": _hyper(exact)}
    ls = torch.stack([_hyper(h)[0] for h in fits]).mean(0)
    hypers["average"] = (
        ls,
        float(np.mean([_hyper(h)[1] for h in fits])),
        float(np.mean([_hyper(h)[2] for h in fits])),
    )
    hypers["log-average"] = (
        torch.stack([_hyper(h)[0] for h in fits]).log().mean(0).exp(),
        float(np.exp(np.mean([math.log(_hyper(h)[1]) for h in fits]))),
        hypers["average"][2],
    )
    out = {}
    sizes = sorted({16, 32, M * n_i // 4, M * n_i // 2})
    for tname, Xt in tests.items():
        y = ((f(Xt) - mu) / sd).squeeze(-1)
        with torch.no_grad():
            for name, gp in (("exact", exact), ("local", local)):
                p = gp.posterior(Xt)
                out[(tname, name, "")] = _scores(
                    p.mean.squeeze(-1), p.variance.squeeze(-1), _hyper(gp)[1], y
                )
            for hname, (lsh, noise, mean) in hypers.items():
                K = _kernel(lsh)
                for k in sizes:
                    per = max(1, min(n_i // 2, math.ceil(k / M)))
                    centres = [local_centers(Xi, k=per, seed=seed, min_cluster_size=2) for Xi in Xs]
                    S = global_support([c for c in centres if len(c)], k, seed=seed)
                    r = Yn - mean
                    for model, own in (("dPITC", None), ("dPIC", 0)):
                        m, v = _sparse(K, X, blocks, S, noise, mean, r, Xt, own)
                        out[(tname, f"{model} |S|={len(S)}", hname)] = _scores(m, v, noise, y)
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    warnings.simplefilter("ignore")
    torch.set_num_threads(2)
    problems, federations, seeds = PROBLEMS, FEDERATIONS, SEEDS
    if args.smoke:
        if args.out.resolve() == RESULTS.resolve():
            raise SystemExit("--smoke writes to --out DIR (not over the committed results)")
        problems, federations, seeds = {"levy4": PROBLEMS["levy4"]}, ((5, 10),), 1
    import botorch

    command = "python benchmarks/fbo_fedgp_diagnose.py " + " ".join(
        sys.argv[1:] if argv is None else argv
    )
    lines = [
        "# Diagnosis: the models a client can use in FBO-FedGP (issue 13, part 1)",
        "",
        f"- command: `{command.strip()}`; {datetime.now(UTC):%Y-%m-%d %H:%M} UTC",
        f"- machine: {cpu_model()}, {platform.platform()}; torch {torch.__version__}, "
        f"botorch {botorch.__version__}",
        f"- {seeds} seeds per cell; RMSE / NLL of standardised outcomes at 300 held-out "
        "points (lower is better); client 0's view for `local` and `dPIC`",
        "",
        "Expected fraction of global steps under the paper's schedule p_t = 1 - t^-c "
        "(c = 0.5): "
        + ", ".join(f"T = {T}: {sum(t**-0.5 for t in range(1, T + 1)) / T:.0%}" for T in (20, 50))
        + " (the first round is always global; afterwards local steps dominate).",
        "",
    ]
    for problem in problems:
        for M, n_i in federations:
            res = [one(problem, M, n_i, s) for s in range(seeds)]
            keys = list(res[0])
            lines += [
                f"## {problem}, M = {M} clients x n_i = {n_i} points (n = {M * n_i})",
                "",
                "| model | hyperparameters | RMSE uniform | NLL uniform | RMSE near own data | "
                "NLL near own data |",
                "|---|---|---:|---:|---:|---:|",
            ]
            rows = sorted({(k[1], k[2]) for k in keys}, key=lambda r: (r[1], r[0]))
            for name, hname in rows:
                cells = []
                for tname in ("uniform", "near own data"):
                    vals = np.array(
                        [r[(tname, name, hname)] for r in res if (tname, name, hname) in r]
                    )
                    cells += [f"{vals[:, 0].mean():.3f}", f"{vals[:, 1].mean():.3f}"]
                lines.append(f"| {name} | {hname or 'own fit'} | " + " | ".join(cells) + " |")
            lines.append("")
            print(f"{problem} M={M} n_i={n_i} done", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{STEM}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
