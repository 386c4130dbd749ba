r"""How FBO-FedGP's default scales with the federation's size (issue 36: ``--clients`` up
to 32 at practical speed).

One run per federation size and secure backend (``run_federated``, one process, one torch
thread as ``botorch-fed run``), Ackley 10-D, 4 initial points per client and 5 rounds (the
federated hyperparameter fit in round 1, a support re-selection in none): wall time in all,
per round after the initial design, and the bytes each direction carried.

Usage::

    python benchmarks/federation_size.py                 # M = 8, 16, 32; ckks and masking
    python benchmarks/federation_size.py --smoke --out /tmp/fs
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from datetime import UTC, datetime
from pathlib import Path

from run_records import command_line, cpu_model, write_report  # the script's folder

RESULTS = Path(__file__).parent / "results"
STEM = "federation_size"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, nargs="+", default=[8, 16, 32])
    parser.add_argument("--aggregators", nargs="+", default=["ckks", "masking"])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    if args.smoke:
        args.clients, args.rounds = [3], 2
    import botorch
    import torch

    from botorch_fed import FBOFedGPSettings, FederationSetup, run_federated

    rows = []
    for aggregator in args.aggregators:
        for M in args.clients:
            setup = FederationSetup(problem="ackley", dim=10, num_clients=M, seed=0,
                                    aggregator=aggregator, threads=1)  # fmt: skip
            settings = FBOFedGPSettings(num_init=4, num_rounds=args.rounds)
            t0 = time.perf_counter()
            result = run_federated("fbo-fedgp", setup, settings)
            total = time.perf_counter() - t0
            ledger = result.ledger
            rows.append({
                "aggregator": aggregator, "clients": M, "rounds": args.rounds,
                "total_s": total, "per_round_s": total / args.rounds,
                "bytes_to_clients": ledger.get("total_bytes_down"),
                "bytes_from_clients": ledger.get("total_bytes_up"),
                "exchanges_per_round": result.exchanges_per_round,
            })  # fmt: skip
            print(json.dumps(rows[-1]), flush=True)
    command = command_line("federation_size.py", argv)
    lines = [
        "# FBO-FedGP's default against the federation's size",
        "",
        f"Command: `{command}` ({datetime.now(UTC):%Y-%m-%d %H:%M} UTC). Machine: {cpu_model()}, "
        f"{platform.platform()}. Versions: python {platform.python_version()}, torch "
        f"{torch.__version__}, botorch {botorch.__version__}.",
        "",
        f"Ackley 10-D, 4 initial points per client, {args.rounds} rounds (the federated "
        "hyperparameter fit in round 1), every party in one process on one torch thread; "
        "per round = the whole run (initial design included) / rounds.",
        "",
        "| aggregator | clients | whole run (s) | per round (s) | MB to clients | "
        "MB from clients |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        to, back = (r[k] or 0 for k in ("bytes_to_clients", "bytes_from_clients"))
        lines.append(
            f"| {r['aggregator']} | {r['clients']} | {r['total_s']:.1f} | "
            f"{r['per_round_s']:.1f} | {to / 1e6:.1f} | {back / 1e6:.1f} |"
        )
    text = "\n".join(lines) + "\n"
    write_report(args.out, STEM, text, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
