r"""Exchanges per round of every algorithm: how many round trips to the clients a round
needs (each costs about 5 s on Flower 1.41, `benchmarks/results/flower_overhead.md`).

Every algorithm runs in process with its command-line defaults (acquisition budgets made
small: they change the time, not the exchanges) on Branin with ``--clients`` clients; the
result JSON's ``exchanges_per_round`` is summarised as round 0 (initialisation), then the
median, mean and maximum over the rounds. On Flower the counts are the same (the tests
compare whole result JSONs, this field included).

    python benchmarks/exchanges.py --rounds 20 --clients 5 \
        --out benchmarks/results/exchanges.md
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from pathlib import Path

from botorch_fed.algorithms import available_algorithms, get_algorithm
from botorch_fed.flower.run_options import prepare
from botorch_fed.protocol.results import library_versions
from botorch_fed.protocol.runner import run_federated

CHEAP = ["--num-restarts", "2", "--raw-samples", "16", "--maxiter", "15"]
#: the LDP-BO learners and FedZero take many cheap rounds; their exchanges per round
#: do not depend on how many
LONG = {"fedzero": 50, "ldp": 50}


def _runs(rounds: int, clients: int) -> list[tuple[str, list[str]]]:
    out = []
    for name in available_algorithms():
        spec = get_algorithm(name)
        base = [name, "--clients", str(clients), "--seed", "0", "--crypto-seed", "1"]
        settings = spec.settings_class.__name__
        if settings == "LDPBOSettings":
            argv = [*base, "--problem", "ldp-synthetic", "--num-rounds", str(LONG["ldp"])]
            argv += ["--plays-per-epoch", "2"] if name.endswith("moma") else []
            out.append((name, argv))
            continue
        if settings == "FedZeroSettings":
            argv = [*base, "--problem", "branin", "--num-rounds", str(LONG["fedzero"])]
            out.append((name, [*argv, "--eta", "0.05", "--h", "0.05"]))
            continue
        argv = [*base, "--problem", "branin", "--num-rounds", str(rounds), *CHEAP]
        if name in ("co-kg", "barycenter-qkg"):
            argv += ["--num-fantasies", "4", "--points-per-dim", "4"]
        elif name in ("co-ei", "co-es"):
            argv += ["--points-per-dim", "4"]
        if spec.secure_aggregation:
            for aggregator in ("ckks", "masking", "plaintext"):
                out.append((f"{name} ({aggregator})", [*argv, "--aggregator", aggregator]))
        else:
            out.append((name, argv))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=20, help="rounds of the BO algorithms")
    p.add_argument("--clients", type=int, default=5)
    p.add_argument("--only", default=None, help="run the labels containing this text only")
    p.add_argument("--out", default=None, help="markdown file to write")
    a = p.parse_args()
    rows = []
    for label, argv in _runs(a.rounds, a.clients):
        if a.only and a.only not in label:
            continue
        run = prepare(argv)
        t0 = time.perf_counter()
        result = run_federated(run.algorithm, run.setup, run.settings)
        counts = result.exchanges_per_round
        rounds = counts[1:]
        row = (
            f"| {label} | {len(rounds)} | {counts[0]} | {statistics.median(rounds):g} | "
            f"{statistics.fmean(rounds):.2f} | {max(rounds)} | {sum(counts)} |"
        )
        print(row, f"({time.perf_counter() - t0:.0f} s)", flush=True)
        rows.append(row)
    versions = library_versions()
    text = "\n".join(
        [
            "# Exchanges per round",
            "",
            f"Command: `python {' '.join(sys.argv)}`. Machine: "
            f"{platform.processor() or platform.machine()}; torch {versions['torch']}, "
            f"botorch {versions['botorch']}.",
            "",
            "An exchange is one send of the server's: a message to each addressed client and "
            "their replies (a round trip; ~5 s on Flower 1.41). Round 0 is the initialisation.",
            "",
            "| algorithm | rounds | round 0 | median | mean | max | total |",
            "|---|---|---|---|---|---|---|",
            *rows,
            "",
        ]
    )
    if a.out:
        Path(a.out).write_text(text)
    print(text)


if __name__ == "__main__":
    main()
