r"""Time of one Co-KG step against the support size and the number of agents.

One server step of Co-KG (Alg. 1 of the slides, lines 5-6): form the barycenter GP of
the ``N`` agents' posteriors on the support, build the ``N`` local models, maximise
Co-KG. The agents' posteriors come from exact GPs (Matern-5/2, the kernel of every
Co-KG run) fitted to ``n`` observations each of the slides' ``f_1`` on ``[0, 1]^2``;
the step is timed twice:

- **cold**: the barycenter iteration starts from the covariances' weighted mean (the
  first round);
- **warm**: every agent then adds one observation (as after a round), and the
  iteration starts from the previous barycenter (every later round).

Both Co-KG modes: **discrete** (the inner maxima exact over the support, the natural
mode on the slides' grids) and **one-shot** (inner maxima over the continuous domain,
optimised jointly with the batch: ``N + num_fantasies (N + 1)`` points per restart).

Stages timed apart: ``barycenter`` (``BarycenterGP``: the fixed point plus its
prediction cache), ``local models`` (``agent_models``), ``acquisition``
(``optimize_co_acquisition`` with the run settings below). Imported by
``benchmarks/co_kg.py`` (``--timing``); runs alone too::

    OMP_NUM_THREADS=2 python benchmarks/co_kg_step_time.py --sides 10 20 30 --agents 2 4 8
"""

from __future__ import annotations

import argparse
import json
import math
import time
import warnings

import torch

# the settings of the benchmark's Co-KG runs (benchmarks/co_kg.py)
NUM_FANTASIES = 16
NUM_RESTARTS = 2
RAW_SAMPLES = 64
MAXITER = 50


def _f1(X: torch.Tensor) -> torch.Tensor:
    Z = 2 * X - 1  # [0, 1]^2 -> the function's [-1, 1]^2
    return -(
        Z.square().sum(-1) + torch.sin(2 * math.pi * Z[..., 0]) + torch.cos(2 * math.pi * Z[..., 1])
    )


def _agent_posteriors(S, Xs, Ys, kernel, noise):
    from botorch.models import SingleTaskGP

    means, covs = [], []
    for X, Y in zip(Xs, Ys, strict=True):
        gp = SingleTaskGP(X, Y, covar_module=kernel, outcome_transform=None)
        gp.likelihood.noise = noise
        gp.eval()
        with torch.no_grad():
            post = gp.posterior(S)
        means.append(post.mean.squeeze(-1))
        covs.append(post.covariance_matrix)
    return torch.stack(means), torch.stack(covs)


def time_step(
    side: int, num_agents: int, num_data: int = 10, seed: int = 0, discrete: bool = False
) -> dict:
    r"""Time one cold and one warm Co-KG step (see the module docstring).

    Args:
        side: Grid points per dimension (support ``side x side``).
        num_agents: ``N``.
        num_data: Observations per agent before the cold step.
        seed: Seed of the agents' data and the acquisition.
        discrete: Co-KG's discrete mode (inner maxima exact over the support) instead
            of the one-shot mode (inner maxima over the continuous domain).

    Returns:
        ``{"side", "support_size", "agents", "cold": {stage: s}, "warm": {...}}``.
    """
    from gpytorch.kernels import MaternKernel, ScaleKernel

    from botorch_fed.acquisition import optimize_co_acquisition, qCoKnowledgeGradient
    from botorch_fed.inducing import grid_support
    from botorch_fed.models import BarycenterGP

    g = torch.Generator().manual_seed(seed)
    S = grid_support(2, side).to(torch.float64)
    kernel = ScaleKernel(MaternKernel(nu=2.5)).to(torch.float64)
    kernel.base_kernel.lengthscale = 0.2
    kernel.outputscale = 1.0
    noise = 1e-3
    Xs = [torch.rand(num_data, 2, generator=g, dtype=torch.float64) for _ in range(num_agents)]
    Ys = [_f1(X).unsqueeze(-1) for X in Xs]
    bounds = torch.tensor([[0.0, 0.0], [1.0, 1.0]], dtype=torch.float64)
    out = {
        "side": side,
        "support_size": side * side,
        "agents": num_agents,
        "mode": "discrete" if discrete else "one-shot",
    }
    init = None
    for phase in ("cold", "warm"):
        if phase == "warm":
            new = [torch.rand(1, 2, generator=g, dtype=torch.float64) for _ in Xs]
            Xs = [torch.cat([X, x]) for X, x in zip(Xs, new, strict=True)]
            Ys = [_f1(X).unsqueeze(-1) for X in Xs]
        means, covs = _agent_posteriors(S, Xs, Ys, kernel, noise)
        times = {}
        t0 = time.perf_counter()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            central = BarycenterGP(S, means, covs, kernel, noise=noise, barycenter_init=init)
            central.posterior(S[:1])  # builds the prediction cache
        times["barycenter"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        local = central.agent_models()
        for m in local:
            m.posterior(S[:1])
        times["local models"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        acqf = qCoKnowledgeGradient(
            central,
            local,
            beta=0.5,
            num_fantasies=NUM_FANTASIES,
            seed=seed,
            discrete_support=S if discrete else None,
        )
        optimize_co_acquisition(
            acqf,
            bounds,
            num_restarts=NUM_RESTARTS,
            raw_samples=RAW_SAMPLES,
            seed=seed,
            options={"maxiter": MAXITER},
        )
        times["acquisition"] = time.perf_counter() - t0
        times["total"] = sum(times.values())
        times["warnings"] = sorted({str(w.message)[:80] for w in caught})
        out[phase] = times
        init = central.barycenter_covariance
    return out


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sides", type=int, nargs="+", default=[10, 20, 30])
    parser.add_argument("--agents", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--num-data", type=int, default=10)
    parser.add_argument("--modes", nargs="+", default=["discrete", "one-shot"])
    args = parser.parse_args(argv)
    rows = []
    for mode in args.modes:
        for side in args.sides:
            for N in args.agents:
                row = time_step(side, N, num_data=args.num_data, discrete=mode == "discrete")
                rows.append(row)
                print(
                    json.dumps(
                        {k: v for k, v in row.items()},
                        default=lambda x: round(x, 3) if isinstance(x, float) else x,
                    ),
                    flush=True,
                )
    return rows


if __name__ == "__main__":
    main()
