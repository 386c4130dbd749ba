r"""``botorch-fed demo``: federated sparse-GP regression on simulated clients.

Prints a table of test RMSE / NLL and timings for each client's own GP, the federated
dPITC model and an exact GP on pooled data
(:func:`~botorch_fed.regression_demo.run_regression_demo`).
"""

from __future__ import annotations

import argparse

from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from botorch_fed.runs.options import rename_to_flags
from botorch_fed.runs.prepare import library_warnings_ignored

# RegressionDemoConfig field -> (argparse dest, flag)
DEMO_FLAGS = {
    "function": ("function", "--function"),
    "dim": ("dim", "--dim"),
    "num_clients": ("clients", "--clients"),
    "points_per_client": ("points", "--points"),
    "support_size": ("support", "--support"),
    "noise_std": ("noise", "--noise"),
    "fit": ("fit", "--fit"),
    "num_test": ("test_points", "--test-points"),
    "seed": ("seed", "--seed"),
}


def add_demo_parser(sub: argparse._SubParsersAction) -> None:
    r"""The ``demo`` sub-command's parser."""
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


def demo_config(args: argparse.Namespace):
    r"""The :class:`RegressionDemoConfig` of the parsed arguments, validated (the test
    function built once); errors name the flags."""
    from botorch_fed.regression_demo import RegressionDemoConfig
    from botorch_fed.test_functions import get_test_function

    config = RegressionDemoConfig(**{f: getattr(args, dest) for f, (dest, _) in DEMO_FLAGS.items()})
    flags = {f: f"`{flag}`" for f, (_, flag) in DEMO_FLAGS.items()}
    try:
        config.validate()
    except ValueError as exc:
        raise ValueError(rename_to_flags(str(exc), flags)[0]) from None
    try:
        get_test_function(config.function, dim=config.dim)
    except ValueError as exc:
        where = f"`--function` {config.function}"
        if config.dim is not None:
            where += f", `--dim` {config.dim}"
        raise ValueError(f"{where}: {exc}") from None
    return config


def run_demo(config, console: Console) -> dict:
    r"""Run the demo with a progress spinner and print its table; returns the results."""
    from botorch_fed.regression_demo import run_regression_demo

    with Progress(
        SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), console=console
    ) as progress:
        task = progress.add_task("starting", total=None)
        with library_warnings_ignored():  # BoTorch's input-scaling advice on tiny clients
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
    return results
