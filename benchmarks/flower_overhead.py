r"""What Flower costs per round: the same runs in process and on a loopback Flower federation.

One invocation starts a Flower federation of 3 parties on 127.0.0.1 (``botorch-fed
flower up``), runs each case once in process (``run_federated``) and once on Flower
(``flwr run``), one after the other on the same machine, and reports per round: the
wall time in process, on Flower, their difference, the protocol's message round trips
(exchanges: one ``send`` to the clients and their replies) and Flower's overhead per
exchange. Both runs of a case have the same seeds and end with the same results (the
script checks it); the rounds' wall times come from the ServerApp's progress lines and
from ``run_federated``'s round hook.

Usage::

    python benchmarks/flower_overhead.py --rounds 3
    python benchmarks/flower_overhead.py --smoke   # 1 round of `local` only

Writes ``benchmarks/results/flower_overhead.{json,md}`` (``--smoke``: ``*_smoke.*``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.run_records import cpu_model  # noqa: E402
from botorch_fed.algorithms import get_algorithm  # noqa: E402
from botorch_fed.flower import launcher, submission  # noqa: E402
from botorch_fed.flower.keys import write_keyset  # noqa: E402
from botorch_fed.flower.run_options import prepare  # noqa: E402
from botorch_fed.protocol.results import library_versions  # noqa: E402
from botorch_fed.protocol.runner import run_federated  # noqa: E402
from botorch_fed.protocol.transport import InProcessTransport  # noqa: E402

RESULTS = Path(__file__).parent / "results"
CLIENTS = 3
COMMON = ["--clients", str(CLIENTS), "--seed", "0", "--crypto-seed", "1"]
_FBO_CKKS = ["fbo-fedgp", "--problem", "branin", "--num-init", "3", "--aggregator", "ckks"]
CASES = {
    "local": ["local", "--problem", "branin", "--num-init", "3"],
    "co-kg": ["co-kg", "--problem", "branin", "--num-init", "3", "--points-per-dim", "6"],
    "fbo-fedgp-ckks": [*_FBO_CKKS, "--hyperparameters", "average"],
    # the default: a federated hyperparameter fit in round 1 (then every 5 rounds)
    "fbo-fedgp-ckks-default": _FBO_CKKS,
}
ROUND_LINE = re.compile(r"round (\d+)/\d+ done \((\d+(?:\.\d+)?) s\)")


def _in_process(argv: list[str]) -> tuple[dict, list[float], list[int]]:
    r"""The run in process: its JSON, each round's wall time (round 0 first) and each
    round's exchanges."""
    run = prepare(argv)
    stamps = [time.perf_counter()]
    exchanges: dict[int, int] = {}
    send = InProcessTransport.send

    def counting(self, messages):  # one exchange per send, by the ledger's round
        exchanges[self.ledger.round] = exchanges.get(self.ledger.round, 0) + 1
        return send(self, messages)

    InProcessTransport.send = counting
    try:
        result = run_federated(
            run.algorithm,
            run.setup,
            run.settings,
            on_round=lambda t, best: stamps.append(time.perf_counter()),
        )
    finally:
        InProcessTransport.send = send
    times = [b - a for a, b in zip(stamps, stamps[1:], strict=False)]
    return result.to_dict(), times, [exchanges.get(t, 0) for t in range(len(times))]


def _on_flower(state: Path, argv: list[str], out: Path) -> tuple[dict, list[float], float]:
    r"""The run on Flower: its JSON, each round's wall time and the whole ``flwr run``."""
    run = prepare(argv)
    keyset = ""
    if get_algorithm(run.algorithm).secure_aggregation:
        keyset, _ = write_keyset(run.setup, list(range(CLIENTS)), state / "keys")
    lines: list[str] = []
    t0 = time.perf_counter()
    submission.submit(
        state,
        {
            "argv": json.dumps(argv),
            "out": out.name,
            "clients": CLIENTS,
            "timeout": 300.0,
            "on-dropout": "fail",
            "server-key": keyset,
            "keyset": keyset,
        },
        stream=lines.append,
        timeout=3600,
    )
    total = time.perf_counter() - t0
    out = state / "results" / out.name  # the ServerApp writes into its results folder
    if not out.exists():
        error = Path(f"{out}.error")
        raise RuntimeError(error.read_text() if error.exists() else "\n".join(lines[-30:]))
    done = [float(m.group(2)) for line in lines if (m := ROUND_LINE.search(line))]
    times = [b - a for a, b in zip([0.0, *done], done, strict=False)]
    return json.loads(out.read_text()), times, total


def _same(a: dict, b: dict) -> bool:
    keys = ("best_value", "best_per_round", "evaluations", "best_point", "recommendation")
    return all(a.get(k) == b.get(k) for k in keys)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--smoke", action="store_true", help="1 round of `local` only")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    cases = {"local": CASES["local"]} if args.smoke else CASES
    rounds = 1 if args.smoke else args.rounds
    rows = []
    with tempfile.TemporaryDirectory(prefix="bf-flower-") as tmp:
        state = Path(tmp) / "federation"
        t0 = time.perf_counter()
        launcher.up(
            CLIENTS,
            state,
            agent_flags=["--allow-crypto-seed", "--share-results", "--allow-algorithm=all"],
            timeout=120,
        )
        up_s = time.perf_counter() - t0
        try:
            for name, base in cases.items():
                options = base + COMMON + ["--num-rounds", str(rounds)]
                local, local_times, exchanges = _in_process(options)
                flower, flower_times, total = _on_flower(state, options, Path(tmp) / f"{name}.json")
                per_round = [
                    {
                        "round": t,
                        "in_process_s": local_times[t],
                        "flower_s": flower_times[t],
                        "exchanges": exchanges[t],
                        "overhead_per_exchange_s": (flower_times[t] - local_times[t])
                        / max(exchanges[t], 1),
                    }
                    for t in range(len(local_times))
                ]
                rows.append(
                    {
                        "case": name,
                        "options": options,
                        "same_results": _same(local, flower),
                        "flwr_run_s": total,
                        "rounds": per_round,
                    }
                )
                print(json.dumps(rows[-1]), flush=True)
        finally:
            launcher.down(state)
    meta = {
        "command": "python benchmarks/flower_overhead.py"
        + (" --smoke" if args.smoke else f" --rounds {rounds}"),
        "machine": f"{cpu_model()}, {os.cpu_count()} cores, {platform.platform()}",
        "versions": {**library_versions(), "flwr": _flwr_version()},
        "up_s": up_s,
        "date": time.strftime("%Y-%m-%d"),
    }
    stem = "flower_overhead_smoke" if args.smoke else "flower_overhead"
    (RESULTS / f"{stem}.json").write_text(json.dumps({"meta": meta, "cases": rows}, indent=1))
    (RESULTS / f"{stem}.md").write_text(_report(meta, rows))
    print((RESULTS / f"{stem}.md").read_text())


def _flwr_version() -> str:
    from importlib.metadata import version

    return version("flwr")


def _report(meta: dict, rows: list[dict]) -> str:
    lines = [
        "# Flower's overhead per round against in-process",
        "",
        f"Command: `{meta['command']}` ({meta['date']}). Machine: {meta['machine']}. "
        f"Versions: {', '.join(f'{k} {v}' for k, v in meta['versions'].items())}.",
        "",
        f"A loopback federation of {CLIENTS} parties (SuperLink, SuperNodes and party agents "
        f"on 127.0.0.1; `flower up` took {meta['up_s']:.1f} s). Each case ran once in process "
        "and once on Flower, one after the other, with the same seeds; `same results` checks "
        "the best value, its point, every evaluation and the recommendation. An exchange is "
        "one message to the addressed clients and their replies; the overhead per exchange "
        "is (Flower - in process) / exchanges.",
        "",
        "| case | round | exchanges | in process (s) | Flower (s) | overhead per exchange (s) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        for r in row["rounds"]:
            lines.append(
                f"| {row['case']} | {r['round']} | {r['exchanges']} | {r['in_process_s']:.2f} "
                f"| {r['flower_s']:.2f} | {r['overhead_per_exchange_s']:.2f} |"
            )
    lines += [
        "",
        "| case | same results | `flwr run` in all (s) | median overhead per exchange (s) |",
    ]
    lines.append("|---|---|---:|---:|")
    for row in rows:
        later = [r["overhead_per_exchange_s"] for r in row["rounds"] if r["round"] >= 1]
        median = statistics.median(later) if later else float("nan")
        lines.append(
            f"| {row['case']} | {'yes' if row['same_results'] else 'NO'} "
            f"| {row['flwr_run_s']:.1f} | {median:.2f} |"
        )
    lines += [
        "",
        "Where the time goes: a SuperNode that finds no message sleeps 3 s before it asks "
        "again (hard-coded in Flower 1.41), and every message starts a new `flwr-clientapp` "
        "process (importing Flower: about 1.5 CPU seconds, 3 at once on 2 cores); the "
        "`ServerApp` polls for replies and SuperExec for tasks every 0.25 s (the launcher "
        "sets `FLWR_SUPEREXEC_TASK_POLL_INTERVAL`). "
        "The party's own work is the same as in process. Round 0 includes building the "
        "clients (on Flower at each party's first message; the parties' discovery before "
        "it is not counted).",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
