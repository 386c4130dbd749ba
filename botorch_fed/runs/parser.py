r"""The parser of ``run <algorithm>`` (the command line's and a Flower run's): one sub-parser
per registered algorithm with the black box, federation, settings and run options."""

from __future__ import annotations

import argparse
import textwrap

from botorch_fed.runs.black_box import DEFAULT_PROBLEM
from botorch_fed.runs.options import HelpFormatter, Option, add_option, add_settings

INTRO = textwrap.fill(
    "M clients jointly optimise a black box: a built-in test function (--problem) or your own "
    "Python function (--objective module:function --bounds ..., or one function per client in "
    "a --config file).",
    88,
)
CONFIG_HELP = """\
config file (--config FILE, TOML; flags given on the command line override it):
  problem = "hartmann"                  a built-in test function, or your own black box:
  objective = "mymod:loss"              one function shared by all `clients`, or
  [[objectives]]                        one table per client (heterogeneous federation):
  function = "mymod:make_loss"          called as function(X, **kwargs)
  kwargs = { client = 0 }               (optional; also `name` for result tables)
  bounds = [[0, 1], [0, 1], [-5, 5]]    one [lower, upper] pair per dimension, or "0,1;0,1;-5,5"
  minimize = true                       (or maximize = true)
  clients = 4                           every option above by its long name with
  seed = 0                              underscores: init_regions = true, fail_on_error, ...
  [settings]                            this algorithm's settings by field name:
  num_rounds = 20                       (num_rounds, not --rounds)
  [settings.fbo-fedgp]                  settings for one algorithm only (others skip it)
  support_size = 8
Python modules are imported from the current directory, then the config file's folder.
Algorithms without secure aggregation ignore `aggregator`; --resume and --config are
command-line only."""


def _algorithm_parser(
    sub: argparse._SubParsersAction, spec
) -> tuple[argparse.ArgumentParser, list[Option]]:
    r"""The sub-parser of ``run <spec.name>`` and its options."""
    from botorch_fed.protocol.setup import DEFAULT_NUM_CLIENTS, FederationSetup
    from botorch_fed.secure.registry import BACKENDS

    fed = FederationSetup()
    p = sub.add_parser(
        spec.name,
        help=spec.summary,
        formatter_class=HelpFormatter,
        description=textwrap.fill(f"{spec.name}: {spec.summary}.", 88) + "\n\n" + INTRO,
        epilog=CONFIG_HELP,
    )
    options: list[Option] = []

    def add(group, dest, kind, default, help, metavar=None, **kw):
        option = Option(dest, ("--" + dest.replace("_", "-"),), kind, **kw)
        add_option(group, options, option, default, help, metavar)

    # fmt: off
    g = p.add_argument_group("black box (one of --problem, --objective, a --config file)")
    add(g, "problem", str, None, "built-in test function: cec2005-f1 ... cec2005-f20, cokg-f1, "
        "cokg-f2, ldp-synthetic, ldp-synthetic-matern, l1-regression or a BoTorch synthetic "
        f"function by name (hartmann, levy, ...); default {DEFAULT_PROBLEM} when no --objective "
        "is given", metavar="NAME")
    add(g, "dim", int, None, "dimension of --problem (default: the function's own)",
        nullable=True, metavar="D")
    add(g, "noise_std", float, None, "additive observation noise of --problem: the standard "
        "deviation of Gaussian noise or the scale of --noise", nullable=True)
    add(g, "noise", str, None, "kind of observation noise of --problem: none, gaussian, uniform "
        "(U[-s, s], bounded: R = s), student-t (3 degrees of freedom), pareto; default: the "
        "problem's own (ldp-synthetic: uniform, s = 1; others: gaussian --noise-std)",
        nullable=True, metavar="KIND")
    add(g, "shift", float, fed.shift,
        "per-client shift of --problem: up to this fraction of the domain per coordinate (0: "
        "one shared function)")
    add(g, "rotation", float, fed.rotation, "per-client rotation of --problem about the domain's "
        "centre: expm(A), A antisymmetric with entries this times standard normals (0: none; "
        "the literature's mild heterogeneity: --shift 0.05 --rotation 0.1, severe: 0.3 and 1)")
    add(g, "objective", str, None, "your own black box, shared by all clients: a function of an "
        "n x d tensor returning n values, imported from package.module (the current directory "
        "is on the path)", metavar="MODULE:FUNCTION")
    add(g, "bounds", str, None, 'the domain of --objective: "lower,upper" per dimension, '
        'separated by ";", e.g. "0,1;0,1;-5,5"', metavar="BOUNDS")
    add(g, "maximize", bool, False,
        "larger values of --objective are better (default: it is minimised)")
    add(g, "fail_on_error", bool, False, "stop the run when an evaluation raises or returns "
        "NaN/inf (default: record it in the results and carry on)")
    g = p.add_argument_group("federation")
    add(g, "clients", int, None, f"number of clients M (default: {DEFAULT_NUM_CLIENTS}, or one "
        "per [[objectives]] table)", metavar="M")
    add(g, "seed", int, fed.seed, "seed of the run: problem, initial designs, every random "
        "choice; 'run' (a simulation, every party in one process) also derives each party's "
        "private randomness from it, so a run repeats exactly; on Flower each party draws its "
        "own from the OS")
    add(g, "crypto_seed", int, None, "seed of the parties' private randomness (key material, "
        "masks, nonces, centre noise, LDP users' noise, redraws after failed evaluations), "
        "instead of the default: derived from --seed by 'run', the OS's on Flower, where it is "
        "for reproducible experiments only -- whoever knows it can undo the protection",
        nullable=True)
    add(g, "init_regions", bool, False, "initial designs from a different sub-box per client")
    add(g, "region_width", float, fed.region_width,
        "side of those sub-boxes (fraction of the domain)")
    if spec.secure_aggregation:
        add(g, "aggregator", str, fed.aggregator, "secure-aggregation backend",
            choices=tuple(BACKENDS))
    g = p.add_argument_group(f"{spec.name} settings ({spec.settings_class.__name__})")
    add_settings(g, options, spec.settings_class)
    g = p.add_argument_group("run")
    add(g, "config", str, None, "TOML file with the black box, federation options and "
        "[settings] (see below)", metavar="FILE")
    add(g, "checkpoint", str, None, "write the complete state into this folder after every "
        "round", metavar="DIR")
    add(g, "resume", str, None, "continue the run checkpointed in this folder (give the same "
        "options)", metavar="DIR")
    add(g, "threads", int, 1, "torch threads (BO works on small matrices, where threading costs)")
    add(g, "out", str, None, "write the results as JSON to this file", metavar="FILE")
    add(g, "plot", str, None, "draw the convergence curve (regret or best value) into this PNG "
        "file", metavar="FILE")
    # fmt: on
    return p, options


RunParsers = dict[str, tuple[argparse.ArgumentParser, list[Option]]]


class CommandParser(argparse.ArgumentParser):
    r"""``botorch-fed``'s parser: ``run_parsers[algorithm]`` is ``(sub-parser, options)``."""

    run_parsers: RunParsers


def add_run_parser(sub: argparse._SubParsersAction) -> RunParsers:
    r"""The ``run`` sub-command: one sub-parser per registered algorithm."""
    from botorch_fed.algorithms import available_algorithms, get_algorithm

    p = sub.add_parser(
        "run",
        help="run a federated optimisation (FBO-FedGP, Co-KG and its family, or a baseline)",
        description="Run M clients jointly optimising a black box with one of the registered "
        "algorithms. `botorch-fed run <algorithm> --help` lists its options.",
    )
    algorithms = p.add_subparsers(dest="algorithm", required=True, metavar="ALGORITHM")
    return {n: _algorithm_parser(algorithms, get_algorithm(n)) for n in available_algorithms()}


def build_run_parser() -> CommandParser:
    r"""A ``botorch-fed`` parser with the ``run`` command only (a Flower run's options)."""
    parser = CommandParser(prog="botorch-fed")
    sub = parser.add_subparsers(dest="command", required=True)
    parser.run_parsers = add_run_parser(sub)
    return parser
