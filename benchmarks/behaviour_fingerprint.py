r"""A fingerprint of what every algorithm does: fixed-seed runs, their results as JSON.

For a change that must not change behaviour (a refactor of the protocol layer, say),
run this before and after on the same machine and compare::

    python benchmarks/behaviour_fingerprint.py --out before.json     # on the old code
    python benchmarks/behaviour_fingerprint.py --out after.json      # on the new code
    python benchmarks/behaviour_fingerprint.py --compare before.json after.json

Every registered algorithm runs a small federation (3 clients, 2 rounds, every seed
fixed: ``--seed``, ``--crypto-seed``), and FBO-FedGP once per installed secure-sum
backend and once per preset and hyperparameter mode. A run's fingerprint is its result
JSON without what differs between equal runs (wall and stage times, versions); the
evaluations, decisions, privacy ledgers, bytes and message counts stay. Results differ
in the last bits between CPUs (MKL's kernels), so compare runs of one machine only.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROUNDS = 2
CLIENTS = 3


def cases() -> dict[str, list[str]]:
    r"""``{case name: argv of botorch-fed run}``: every registered algorithm, and
    FBO-FedGP per backend, preset and hyperparameter mode."""
    import botorch_fed.algorithms  # noqa: F401 - registers the algorithms
    from botorch_fed.protocol.registry import available_algorithms, get_algorithm
    from botorch_fed.secure import available_backends

    out = {}
    for name in available_algorithms():
        out[name] = _argv(name)
        if get_algorithm(name).secure_aggregation and name == "fbo-fedgp":
            for backend in available_backends():
                out[f"{name}/{backend}"] = _argv(name, "--aggregator", backend)
            out[f"{name}/paper"] = _argv(name, "--preset", "paper")
            out[f"{name}/average"] = _argv(name, "--hyperparameters", "average")
    return out


def _argv(name: str, *extra: str) -> list[str]:
    from botorch_fed.algorithms import FedZeroSettings, LDPBOSettings
    from botorch_fed.protocol.registry import get_algorithm

    settings = get_algorithm(name).settings_class
    argv = [name, "--clients", str(CLIENTS), "--num-rounds", str(ROUNDS), "--seed", "2"]
    argv += ["--crypto-seed", "5"]
    if settings is LDPBOSettings:
        argv += ["--problem", "ldp-synthetic"]
        return argv + (["--plays-per-epoch", "1"] if name.endswith("moma") else [])
    if settings is FedZeroSettings:
        return argv + ["--problem", "branin", "--eta", "0.05", "--h", "0.05"]
    argv += ["--problem", "branin", "--num-init", "3", "--num-restarts", "2"]
    argv += ["--raw-samples", "16", "--maxiter", "15"]
    if name in ("co-kg", "co-ei", "co-es", "barycenter-qkg"):
        argv += ["--points-per-dim", "4"]
        if name in ("co-kg", "barycenter-qkg"):
            argv += ["--num-fantasies", "4"]
    return argv + list(extra)


def fingerprint(argv: list[str]) -> dict:
    r"""The run of ``argv`` as JSON, without wall and stage times and versions."""
    from botorch_fed.flower.run_options import prepare
    from botorch_fed.protocol.runner import run_federated

    run = prepare(argv)
    out = run_federated(run.algorithm, run.setup, run.settings).to_dict()
    for key in ("time_s", "versions"):
        out.pop(key, None)
    ledger = out.pop("ledger")
    out["bytes"] = (ledger["bytes_per_client"], ledger["messages"])
    return json.loads(json.dumps(out))


def compare(a: dict, b: dict) -> list[str]:
    r"""The cases whose fingerprints differ (or that only one file has), with the
    first differing key of each."""
    problems = []
    for case in sorted(set(a) | set(b)):
        if case not in a or case not in b:
            problems.append(f"{case}: only in {'the first' if case in a else 'the second'}")
            continue
        keys = sorted(set(a[case]) | set(b[case]))
        diff = [k for k in keys if a[case].get(k) != b[case].get(k)]
        if diff:
            problems.append(f"{case}: differs in {diff}")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--out", type=Path, help="write the fingerprints here (JSON)")
    group.add_argument("--compare", type=Path, nargs=2, metavar=("BEFORE", "AFTER"))
    parser.add_argument("--only", nargs="*", default=None, help="case names to run")
    args = parser.parse_args(argv)
    if args.compare:
        before, after = (json.loads(p.read_text()) for p in args.compare)
        problems = compare(before["runs"], after["runs"])
        for line in problems:
            print(line)
        print(f"{len(before['runs'])} cases; {len(problems)} differ")
        return 1 if problems else 0
    from run_records import cpu_model  # benchmarks/run_records.py (the script's folder)

    runs = {}
    for case, run_argv in cases().items():
        if args.only is not None and case not in args.only:
            continue
        t0 = time.perf_counter()
        runs[case] = fingerprint(run_argv)
        print(f"{case}: {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    args.out.write_text(json.dumps({"cpu": cpu_model(), "runs": runs}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
