r"""The ``botorch-fed`` command line.

Subcommands:

- ``botorch-fed run <algorithm>``: a federated optimisation (``fbo-fedgp`` or a
  baseline: ``local``, ``central``, ``fts``, ``random``) with a progress bar per
  round, a result table, ``--out`` JSON and ``--plot`` regret curve.
- ``botorch-fed demo``: federated sparse-GP regression on simulated clients; prints
  a table of test RMSE / NLL and timings for each client's own GP, the federated
  dPITC model and an exact GP on pooled data.

Invalid arguments print a message naming the argument and exit with code 2.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import warnings
from collections.abc import Sequence

import torch
from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

from botorch_fed import __version__


def _demo_parser(sub: argparse._SubParsersAction) -> None:
    from botorch_fed.regression_demo import FIT_STRATEGIES, RegressionDemoConfig

    defaults = RegressionDemoConfig()
    p = sub.add_parser(
        "demo",
        help="federated sparse-GP regression on simulated clients",
        description=(
            "M simulated clients hold private noisy samples of a test function from "
            "different regions of the domain. Compares each client's own GP, the "
            "federated dPITC model and an exact GP on the pooled data."
        ),
    )
    p.add_argument("--function", default=defaults.function, help="test function name")
    p.add_argument("--dim", type=int, default=defaults.dim, help="input dimension")
    p.add_argument("--clients", type=int, default=defaults.num_clients, help="number of clients")
    p.add_argument(
        "--points", type=int, default=defaults.points_per_client, help="mean points per client"
    )
    p.add_argument("--support", type=int, default=defaults.support_size, help="support size |S|")
    p.add_argument(
        "--noise", type=float, default=defaults.noise_std, help="noise std (fraction of f's std)"
    )
    p.add_argument("--fit", choices=FIT_STRATEGIES, default=defaults.fit, help="hyperparameters")
    p.add_argument("--test-points", type=int, default=defaults.num_test, help="test-set size")
    p.add_argument("--seed", type=int, default=defaults.seed, help="random seed")
    p.add_argument("--out", help="write the results as JSON to this file")


def _run_demo(args: argparse.Namespace, console: Console) -> int:
    from botorch_fed.regression_demo import RegressionDemoConfig, run_regression_demo

    config = RegressionDemoConfig(
        function=args.function,
        dim=args.dim,
        num_clients=args.clients,
        points_per_client=args.points,
        support_size=args.support,
        noise_std=args.noise,
        fit=args.fit,
        num_test=args.test_points,
        seed=args.seed,
    )
    config.validate()
    with Progress(
        SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), console=console
    ) as progress:
        task = progress.add_task("starting", total=None)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # BoTorch's input-scaling advice on tiny clients
            results = run_regression_demo(
                config, on_stage=lambda s: progress.update(task, description=s)
            )
        progress.update(task, description="done")
    cfg = results["config"]
    table = Table(
        title=(
            f"Federated GP regression: {cfg['function']} ({cfg['dim']}-D), "
            f"{cfg['num_clients']} clients, seed {cfg['seed']}"
        )
    )
    for col in ("model", "n", "test RMSE", "test NLL", "fit (s)", "predict (s)"):
        table.add_column(col, justify="left" if col == "model" else "right")
    for r in results["rows"]:
        table.add_row(
            r["method"],
            str(r["num_data"]),
            f"{r['rmse']:.4f}",
            f"{r['nll']:.3f}",
            f"{r['fit_s']:.2f}",
            f"{r['predict_s']:.3f}",
        )
    console.print(table)
    fed = next(r for r in results["rows"] if r["method"].startswith("federated"))
    console.print(
        f"federated: {fed['extra']['aggregation_rounds']} aggregation rounds; the server saw "
        "only summed outcome moments, client centres and summed summaries/gradients."
    )
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(results, fh, indent=2)
        console.print(f"results written to {args.out}")
    return 0


def _run_parser(sub: argparse._SubParsersAction) -> None:
    from botorch_fed.federation import FederationSetup, available_algorithms
    from botorch_fed.federation.bo_client import ACQUISITIONS
    from botorch_fed.federation.fbo_fedgp import HYPERPARAMETERS, MIXINGS, SUPPORTS, FBOFedGPConfig

    fed, cfg = FederationSetup(), FBOFedGPConfig()
    p = sub.add_parser(
        "run",
        help="run a federated optimisation (FBO-FedGP or a baseline)",
        description=(
            "Run M clients jointly minimising a test function (CEC-2005 F1-F20 as "
            "'cec2005-fN', or any BoTorch synthetic function by name) and print the result."
        ),
    )
    p.add_argument("algorithm", choices=available_algorithms())
    p.add_argument("--problem", default="cec2005-f1", help="test function name")
    p.add_argument(
        "--dim", type=int, default=fed.dim, help="dimension (default: the function's own)"
    )
    p.add_argument("--clients", type=int, default=10, help="number of clients M")
    p.add_argument("--init", type=int, default=cfg.num_init, help="initial points per client")
    p.add_argument("--rounds", type=int, default=cfg.num_rounds, help="rounds T")
    p.add_argument("--seed", type=int, default=fed.seed, help="random seed")
    p.add_argument("--acquisition", choices=ACQUISITIONS, default=cfg.acquisition)
    p.add_argument("--beta", type=float, default=None, help="UCB beta (default 0.2 d log 2t)")
    p.add_argument("--noise-std", type=float, default=None, help="additive observation noise")
    p.add_argument(
        "--init-regions", action="store_true", help="initial designs from different regions"
    )
    p.add_argument(
        "--shift", type=float, default=0.0, help="per-client objective shift (domain fraction)"
    )
    g = p.add_argument_group("FBO-FedGP")
    g.add_argument("--support", type=int, default=cfg.support_size, help="support size |S|")
    g.add_argument("--support-selection", choices=SUPPORTS, default=cfg.support)
    g.add_argument(
        "--support-every",
        type=int,
        default=cfg.support_every,
        help="re-select |S| every K rounds (0: never)",
    )
    g.add_argument(
        "--support-growth", type=int, default=cfg.support_growth, help="grow |S| at re-selection"
    )
    g.add_argument("--aggregator", default=fed.aggregator, help="plaintext, ckks or masking")
    g.add_argument("--schedule", type=float, default=cfg.schedule, help="c of p_t = 1 - t^-c")
    g.add_argument("--mixing", choices=MIXINGS, default=cfg.mixing)
    g.add_argument("--hyperparameters", choices=HYPERPARAMETERS, default=cfg.hyperparameters)
    p.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads (default 1: BO works on small matrices, where threading costs)",
    )
    p.add_argument("--out", help="write the results as JSON to this file")
    p.add_argument("--plot", help="draw the regret curve into this PNG file")


def _run_run(args: argparse.Namespace, console: Console) -> int:
    from botorch_fed.federation.bo_client import BOSettings
    from botorch_fed.federation.fbo_fedgp import FBOFedGPConfig
    from botorch_fed.federation.runner import FederationSetup, run_federated

    setup = FederationSetup(
        problem=args.problem,
        dim=args.dim,
        num_clients=args.clients,
        seed=args.seed,
        aggregator=args.aggregator,
        noise_std=args.noise_std,
        init_regions=args.init_regions,
        shift=args.shift,
    )
    common = dict(
        num_init=args.init, num_rounds=args.rounds, acquisition=args.acquisition, beta=args.beta
    )
    if args.algorithm == "fbo-fedgp":
        settings = FBOFedGPConfig(
            **common,
            support_size=args.support,
            support=args.support_selection,
            support_every=args.support_every,
            support_growth=args.support_growth,
            schedule=args.schedule,
            mixing=args.mixing,
            hyperparameters=args.hyperparameters,
        )
    else:
        settings = BOSettings(**common)
    settings.validate()
    setup.validate(args.algorithm)
    if args.threads < 1:
        raise ValueError(f"`--threads` must be >= 1, got {args.threads}.")
    torch.set_num_threads(args.threads)
    with Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("best {task.fields[best]}"),
        TimeElapsedColumn(),
        console=console,
    ) as progress:
        task = progress.add_task(f"{args.algorithm} on {args.problem}", total=args.rounds, best="-")

        def on_round(t: int, best: float) -> None:
            progress.update(task, completed=t, best=f"{best:.6g}")

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # BoTorch's numerical advice on tiny data sets
            result = run_federated(args.algorithm, setup, settings, on_round=on_round)
    _print_run(result, console)
    data = result.to_dict()
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(data, fh, indent=2)
        console.print(f"results written to {args.out}")
    if args.plot:
        from botorch_fed.plotting import plot_convergence

        plot_convergence([data], args.plot)
        console.print(f"regret curve written to {args.plot}")
    return 0


def _print_run(result, console: Console) -> None:
    head = Table(
        title=(
            f"{result.algorithm} on {result.problem} ({result.dim}-D), "
            f"{len(result.best_per_client)} clients, {len(result.best_per_round) - 1} rounds"
        )
    )
    head.add_column("quantity")
    head.add_column("value", justify="right")
    head.add_row("best value (federation)", f"{result.best_value:.6g}")
    if result.optimal_value is not None:
        head.add_row("optimal value", f"{result.optimal_value:.6g}")
        head.add_row("simple regret", f"{result.best_value - result.optimal_value:.6g}")
    head.add_row("steps", ", ".join(f"{k} {v}" for k, v in sorted(result.steps.items())))
    head.add_row("wall time (s)", f"{result.time_s:.2f}")
    ledger = result.ledger
    head.add_row(
        "bytes to / from clients", f"{ledger['total_bytes_down']:,} / {ledger['total_bytes_up']:,}"
    )
    console.print(head)
    stages = Table(title="time per stage (s, summed over parties)")
    for name in ("stage", "seconds"):
        stages.add_column(name, justify="right" if name == "seconds" else "left")
    for stage, seconds in sorted(ledger["stage_s"].items(), key=lambda kv: -kv[1]):
        stages.add_row(stage, f"{seconds:.3f}")
    clients = Table(title="best value per client")
    clients.add_column("client", justify="right")
    clients.add_column("best value", justify="right")
    for cid, best in result.best_per_client.items():
        clients.add_row(str(cid), f"{best:.6g}")
    console.print(stages)
    console.print(clients)


def build_parser() -> argparse.ArgumentParser:
    r"""The argument parser of ``botorch-fed``."""
    parser = argparse.ArgumentParser(
        prog="botorch-fed",
        description="Federated and privacy-preserving Bayesian optimisation for BoTorch.",
    )
    parser.add_argument("--version", action="version", version=f"botorch-fed {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    _run_parser(sub)
    _demo_parser(sub)
    return parser


def _check_outputs(args: argparse.Namespace) -> None:
    r"""Refuse unwritable ``--out`` / ``--plot`` paths before a run, not after it."""
    for flag in ("out", "plot"):
        path = getattr(args, flag, None)
        if not path:
            continue
        folder = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(folder):
            raise ValueError(f"--{flag} {path}: the folder {folder} does not exist.")
        if not os.access(folder, os.W_OK):
            raise ValueError(f"--{flag} {path}: the folder {folder} is not writable.")
        if os.path.isdir(path):
            raise ValueError(f"--{flag} {path} is a folder; give a file name.")
    if getattr(args, "plot", None) and importlib.util.find_spec("matplotlib") is None:
        raise ImportError(
            "--plot needs matplotlib, which is not installed: pip install 'botorch-fed[plot]'."
        )


def main(argv: Sequence[str] | None = None) -> int:
    r"""Entry point of the ``botorch-fed`` console script.

    Args:
        argv: Arguments (default: ``sys.argv[1:]``).

    Returns:
        The exit code (0 success, 2 invalid arguments).
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    console = Console()
    try:
        _check_outputs(args)
        if args.command == "demo":
            return _run_demo(args, console)
        if args.command == "run":
            return _run_run(args, console)
    except (ValueError, ImportError) as e:
        # escape: messages hold brackets (``botorch-fed[secure]``) that are not markup
        console.print(f"[bold red]error:[/] {escape(str(e))}", soft_wrap=True)
        return 2
    parser.error(f"unknown command {args.command!r}")
    return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
