r"""The ``botorch-fed`` command line.

Subcommands:

- ``botorch-fed demo``: federated sparse-GP regression on simulated clients; prints
  a table of test RMSE / NLL and timings for each client's own GP, the federated
  dPITC model and an exact GP on pooled data.

Invalid arguments print a message naming the argument and exit with code 2.
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from collections.abc import Sequence

from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
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


def build_parser() -> argparse.ArgumentParser:
    r"""The argument parser of ``botorch-fed``."""
    parser = argparse.ArgumentParser(
        prog="botorch-fed",
        description="Federated and privacy-preserving Bayesian optimisation for BoTorch.",
    )
    parser.add_argument("--version", action="version", version=f"botorch-fed {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    _demo_parser(sub)
    return parser


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
        if args.command == "demo":
            return _run_demo(args, console)
    except (ValueError, ImportError) as e:
        console.print(f"[bold red]error:[/] {e}")
        return 2
    parser.error(f"unknown command {args.command!r}")
    return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
