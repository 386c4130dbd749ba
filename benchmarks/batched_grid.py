r"""Throughput of the batched grid runner against the protocol runner (issue 37).

For each ``R``, the same ``R`` replications (seeds 0 .. R-1) of one experiment run
(a) one after another on the protocol runner (``run_federated``, one torch thread, as
``botorch-fed compare --jobs 1`` runs them) and (b) as one batched program
(``botorch_fed.experiments.run_grid``); throughput = replications per second, and the
ratio (b) / (a) is measured in the same process, one after the other. The protocol
runner's time per replication does not depend on ``R``, so it is measured on
``min(R, --protocol-reps)`` replications and extrapolated (said in the table).

Usage::

    python benchmarks/batched_grid.py --algorithms local fbo-fedgp --reps 1 8 32 128
    python benchmarks/batched_grid.py --algorithms local fbo-fedgp --reps 1 8 32 128 --device cuda
    python benchmarks/batched_grid.py --algorithms ldp-tgp ldp-ata ldp-moma --reps 1 8 32 128 \
        --stem batched_grid_ldp
    python benchmarks/batched_grid.py --smoke --out /tmp/bg
"""

from __future__ import annotations

import argparse
import json
import platform
import time
import warnings
from datetime import UTC, datetime
from pathlib import Path

from run_records import command_line, cpu_model, write_report  # the script's folder

RESULTS = Path(__file__).parent / "results"
STEM = "batched_grid"


def measure(algorithm: str, reps: list[int], device: str, protocol_reps: int, args) -> list[dict]:
    import torch

    from botorch_fed.algorithms import get_algorithm, run_federated
    from botorch_fed.experiments import run_grid
    from botorch_fed.experiments.batched_ldp import LDP_ALGORITHMS
    from botorch_fed.protocol import FederationSetup

    torch.set_num_threads(args.threads)
    ldp = algorithm in LDP_ALGORITHMS
    spec = get_algorithm(algorithm)
    if ldp:  # LDP-BO on its finite-domain problem; MoMA's epochs of --plays-per-epoch plays
        moma = {"plays_per_epoch": args.plays_per_epoch} if "moma" in algorithm else {}
        settings = spec.settings_class(num_rounds=args.ldp_rounds, **moma)
    else:  # each algorithm's defaults (FBO-FedGP: the default preset)
        settings = spec.settings_class(num_init=args.init, num_rounds=args.rounds)

    def setup(seed: int) -> FederationSetup:
        if ldp:
            return FederationSetup(problem=args.ldp_problem, num_clients=args.clients,
                                   seed=seed, threads=args.threads)  # fmt: skip
        # the protocol runner's secure sums in plaintext, as the batched runner simulates them
        return FederationSetup(problem=args.problem, dim=args.dim, num_clients=args.clients,
                               seed=seed, threads=args.threads, aggregator="plaintext")  # fmt: skip

    # untimed warm-up of both (imports, first-call costs)
    run_federated(algorithm, setup(10_000), settings)
    run_grid(algorithm, setup(10_000), settings, seeds=1, device=device)
    rows = []
    per_rep_protocol = None
    for R in reps:
        n_protocol = min(R, protocol_reps)
        if per_rep_protocol is None or n_protocol > per_rep_protocol[1]:
            t0 = time.perf_counter()
            for s in range(n_protocol):
                run_federated(algorithm, setup(s), settings)
            per_rep_protocol = ((time.perf_counter() - t0) / n_protocol, n_protocol)
        t0 = time.perf_counter()
        run_grid(algorithm, setup(0), settings, seeds=R, device=device)
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        batched = time.perf_counter() - t0
        protocol = per_rep_protocol[0] * R
        rows.append({
            "algorithm": algorithm, "R": R, "device": device,
            "protocol_s": protocol, "protocol_measured_reps": per_rep_protocol[1],
            "batched_s": batched, "protocol_reps_per_s": R / protocol,
            "batched_reps_per_s": R / batched, "ratio": protocol / batched,
        })  # fmt: skip
        print(json.dumps(rows[-1]), flush=True)
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", nargs="+", type=int, default=[1, 8, 32])
    parser.add_argument("--algorithms", nargs="+", default=["local"])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--problem", default="ackley")
    parser.add_argument("--dim", type=int, default=10)
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--init", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--threads", type=int, default=1, help="torch threads of both runners")
    parser.add_argument("--ldp-problem", default="ldp-synthetic", help="LDP-BO's problem")
    parser.add_argument("--ldp-rounds", type=int, default=200, help="LDP-BO's rounds")
    parser.add_argument("--plays-per-epoch", type=int, default=10, help="MoMA's k")
    parser.add_argument("--stem", default=STEM, help="the results' file name")
    parser.add_argument("--protocol-reps", type=int, default=4)
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    if args.smoke:
        args.reps, args.dim, args.clients, args.rounds, args.init = [1, 2], 2, 2, 2, 4
        args.problem = "branin"
    warnings.simplefilter("ignore")
    import botorch
    import torch

    rows = [r for a in args.algorithms for r in measure(a, args.reps, args.device,
                                                        args.protocol_reps, args)]  # fmt: skip
    command = command_line("batched_grid.py", argv)
    gpu = torch.cuda.get_device_name(0) if args.device.startswith("cuda") else "none used"
    lines = [
        "# Batched grids against the protocol runner (issue 37)",
        "",
        f"Command: `{command}` ({datetime.now(UTC):%Y-%m-%d %H:%M} UTC). Machine: {cpu_model()}, "
        f"{platform.platform()}; GPU: {gpu}. Versions: python {platform.python_version()}, "
        f"torch {torch.__version__}, botorch {botorch.__version__}.",
        "",
        f"Experiment: `{args.problem}` {args.dim}-D, {args.clients} clients, {args.init} initial "
        f"points each, {args.rounds} rounds (LDP-BO: `{args.ldp_problem}`, {args.clients} "
        f"users, {args.ldp_rounds} rounds, MoMA's k = {args.plays_per_epoch}); "
        f"{args.threads} torch thread(s) for both runners; "
        "the protocol runner's time per replication measured on the replications said and "
        "multiplied by R. Each algorithm at its default settings (FBO-FedGP: the default "
        "preset); both runners sum in plaintext (the protocol runner with "
        '`aggregator="plaintext"`, the batched runner simulates every secure sum so).',
        "",
        "| algorithm | device | R | protocol (s) | measured on | batched (s) | protocol reps/s | "
        "batched reps/s | ratio |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['algorithm']} | {r['device']} | {r['R']} | {r['protocol_s']:.1f} | "
            f"{r['protocol_measured_reps']} | {r['batched_s']:.1f} | "
            f"{r['protocol_reps_per_s']:.3f} | {r['batched_reps_per_s']:.3f} | {r['ratio']:.1f}x |"
        )
    text = "\n".join(lines) + "\n"
    suffix = "" if args.device == "cpu" else f"_{args.device.replace(':', '')}"
    write_report(args.out, f"{args.stem}{suffix}", text, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
