r"""How much faster is a Table-1 FBO-FedGP run than with a baseline revision? (issue 13)

The Table-1 setting of the FBO-FedGP paper (CEC-2005, 10-D, M = 10 clients, 4 initial
points each, T = 50 rounds, |S| = 16, GP-UCB), for the paper preset and for the
library default, run by this checkout and by a baseline revision of the repository
(a ``git worktree`` of ``--baseline``, default: the revision before the speed work),
each run in a fresh process with one torch thread. The two codes alternate run by run,
so both see the same machine load.

Reported per preset: the median run time of each code and their ratio, each pair's
ratio, and the decisions: the final best values side by side (the speed work changes
no formula, only the order of floating-point operations, so a trajectory may drift
from the baseline's after many rounds; "equal decision quality" is judged on the
final values with a paired Wilcoxon signed-rank test where there are enough pairs).

Usage::

    python benchmarks/fbo_fedgp_speed.py --smoke --out /tmp/speed    # ~2 minutes
    python benchmarks/fbo_fedgp_speed.py --functions 1 9 --seeds 3
    python benchmarks/fbo_fedgp_speed.py --report
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path

from run_records import cpu_model  # benchmarks/run_records.py (the script's folder)

RESULTS = Path(__file__).parent / "results"
STEM = "fbo_fedgp_speed"
REPO = Path(__file__).resolve().parent.parent
BASELINE = "c623940"  # main before the speed work of issue 13

# one run in a fresh interpreter; the code under test comes first on sys.path
_RUN = r"""
import json, sys, time, warnings
import torch
warnings.simplefilter("ignore")
torch.set_num_threads(1)
from botorch_fed.federation import FBOFedGPConfig, FederationSetup, run_federated
job = json.loads(sys.argv[1])
setup = FederationSetup(problem=f"cec2005-f{job['function']}", dim=job["dim"],
                        num_clients=job["clients"], seed=job["seed"],
                        aggregator=job["aggregator"])
common = dict(num_init=job["init"], num_rounds=job["rounds"])
settings = (FBOFedGPConfig.paper(**common) if job["preset"] == "paper"
            else FBOFedGPConfig(**common))
t0 = time.perf_counter()
result = run_federated("fbo-fedgp", setup, settings)
print(json.dumps({"time_s": time.perf_counter() - t0, "best_value": result.best_value,
                  "stage_s": result.ledger["stage_s"], "steps": result.steps}))
"""


def _worktree(rev: str, root: Path) -> Path:
    path = root / f"baseline-{rev}"
    subprocess.run(
        ["git", "-C", str(REPO), "worktree", "add", "--detach", "--force", str(path), rev],
        check=True,
        capture_output=True,
    )
    return path


def _run(code: Path, job: dict) -> dict:
    env = {**os.environ, "PYTHONPATH": str(code), "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    out = subprocess.run(
        [sys.executable, "-c", _RUN, json.dumps(job)],
        cwd=code,
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def _revision(code: Path) -> str:
    out = subprocess.run(
        ["git", "-C", str(code), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    )
    dirty = subprocess.run(
        ["git", "-C", str(code), "status", "--porcelain", "--untracked-files=no"],
        capture_output=True,
        text=True,
    ).stdout.strip()
    return out.stdout.strip() + ("+uncommitted" if dirty else "")


def _fmt(v: float) -> str:
    return f"{v:.4g}" if abs(v) < 1e5 else f"{v:.3e}"


def report(data: dict) -> str:
    meta, runs = data["meta"], data["runs"]
    lines = [
        "# FBO-FedGP: a Table-1 run against the code before the speed work (issue 13)",
        "",
        f"- command: `{meta['command']}`",
        f"- this code: {meta['current']}; baseline: {meta['baseline']} (a git worktree)",
        f"- machine: {meta['machine']}",
        f"- versions: {meta['versions']}",
        f"- date: {meta['date']}",
        f"- setting: CEC-2005, {meta['setting']}, {meta['aggregator']} aggregation; every "
        "run in a fresh process with 1 torch thread; the two codes alternate run by run",
        "",
    ]
    from scipy.stats import wilcoxon

    for preset in meta["presets"]:
        pairs = [r for r in runs if r["preset"] == preset]
        if not pairs:
            continue
        t_old = [r["baseline"]["time_s"] for r in pairs]
        t_new = [r["current"]["time_s"] for r in pairs]
        ratio = statistics.median(t_old) / statistics.median(t_new)
        lines += [
            f"## `{preset}` preset",
            "",
            f"Median run time: baseline {statistics.median(t_old):.1f} s, this code "
            f"{statistics.median(t_new):.1f} s: **{ratio:.2f}x faster** "
            f"(pairwise ratios {min(a / b for a, b in zip(t_old, t_new, strict=True)):.2f}-"
            f"{max(a / b for a, b in zip(t_old, t_new, strict=True)):.2f}).",
            "",
            "| F | seed | baseline s | this code s | ratio | baseline best | this code best "
            "| same best (1e-9) | acquisition s (baseline / this) |",
            "|---|---:|---:|---:|---:|---:|---:|:---:|---:|",
        ]
        same = 0
        for r in pairs:
            b, c = r["baseline"], r["current"]
            # equal up to rounding: the codes differ in the order of float operations
            identical = abs(b["best_value"] - c["best_value"]) <= 1e-9 * max(
                abs(b["best_value"]), 1.0
            )
            same += identical
            lines.append(
                f"| F{r['function']} | {r['seed']} | {b['time_s']:.1f} | {c['time_s']:.1f} | "
                f"{b['time_s'] / c['time_s']:.2f} | {_fmt(b['best_value'])} | "
                f"{_fmt(c['best_value'])} | {'yes' if identical else 'no'} | "
                f"{b['stage_s'].get('acquisition', 0):.1f} / "
                f"{c['stage_s'].get('acquisition', 0):.1f} |"
            )
        diffs = [r["current"]["best_value"] - r["baseline"]["best_value"] for r in pairs]
        nonzero = [d for d in diffs if d != 0]
        if len(nonzero) >= 6:
            p = float(wilcoxon(diffs, zero_method="zsplit").pvalue)
            verdict = f"paired Wilcoxon p = {p:.3f} (two-sided) over {len(diffs)} pairs"
        else:
            verdict = f"{len(nonzero)} of {len(diffs)} pairs differ: too few for a test"
        lines += [
            "",
            f"Decisions: {same} of {len(pairs)} runs end at the same best value (to 1e-9 "
            "relative); "
            f"{verdict}; mean difference (this code - baseline, lower is better) "
            f"{_fmt(statistics.mean(diffs))}.",
            "",
        ]
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="tiny: F1, 1 seed, 3 rounds, 2-D")
    parser.add_argument("--baseline", default=BASELINE, help="baseline git revision")
    parser.add_argument("--functions", nargs="+", type=int, default=[1])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--presets", nargs="+", default=["paper", "default"])
    parser.add_argument("--aggregator", default="plaintext")
    parser.add_argument("--dim", type=int, default=10)
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--init", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=50)
    parser.add_argument("--report", action="store_true", help="only rebuild the report")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    command = "python benchmarks/fbo_fedgp_speed.py " + " ".join(
        sys.argv[1:] if argv is None else argv
    )
    if args.smoke:
        args.functions, args.seeds, args.rounds, args.clients, args.dim = [1], 1, 3, 3, 2
    stem = f"{STEM}_smoke" if args.smoke else STEM
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"{stem}.json"
    if args.report:
        data = json.loads(path.read_text())
    else:
        import botorch
        import torch

        data = {
            "meta": {
                "command": command.strip(),
                "current": _revision(REPO),
                "baseline": args.baseline,
                "machine": f"{cpu_model()}, {os.cpu_count()} CPUs, {platform.platform()}",
                "versions": f"python {platform.python_version()}, torch {torch.__version__}, "
                f"botorch {botorch.__version__}",
                "date": datetime.now(UTC).isoformat(timespec="seconds"),
                "setting": f"{args.dim}-D, M = {args.clients}, {args.init} initial points "
                f"each, T = {args.rounds}",
                "aggregator": args.aggregator,
                "presets": args.presets,
            },
            "runs": [],
        }
        with tempfile.TemporaryDirectory() as tmp:
            old = _worktree(args.baseline, Path(tmp))
            try:
                for preset in args.presets:
                    for f in args.functions:
                        for seed in range(args.seeds):
                            job = {
                                "function": f,
                                "seed": seed,
                                "preset": preset,
                                "dim": args.dim,
                                "clients": args.clients,
                                "init": args.init,
                                "rounds": args.rounds,
                                "aggregator": args.aggregator,
                            }
                            # alternate which code goes first, so drifts in load cancel
                            order = [("baseline", old), ("current", REPO)]
                            if seed % 2:
                                order.reverse()
                            rec = dict(job)
                            for name, code in order:
                                rec[name] = _run(code, job)
                            data["runs"].append(rec)
                            print(
                                f"{preset} F{f} seed {seed}: {rec['baseline']['time_s']:.1f} s "
                                f"-> {rec['current']['time_s']:.1f} s",
                                flush=True,
                            )
                            path.write_text(json.dumps(data, indent=1))
            finally:
                subprocess.run(
                    ["git", "-C", str(REPO), "worktree", "remove", "--force", str(old)],
                    capture_output=True,
                )
    text = report(data)
    (args.out / f"{stem}.md").write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
