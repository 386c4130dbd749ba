r"""How much faster is a Table-1 FBO-FedGP run than with a baseline revision? (issue 13)

The Table-1 setting of the FBO-FedGP paper (CEC-2005, 10-D, M = 10 clients, 4 initial
points each, T = 50 rounds, |S| = 16, GP-UCB), for the paper preset and for the
library default, run by this repository's ``HEAD`` and by a baseline revision
(``--baseline``, default: the revision before the speed work), each checked out as a
``git worktree`` and each run in a fresh process with one torch thread. The codes
alternate run by run, so they see the same machine load. For the paper preset a third
arm runs ``HEAD`` with the in-process memo of the shared global search switched off:
what each client computes in a deployment, where every client is its own process.

Reported per preset: the median run time of each arm and its ratio to the baseline's,
each pair's ratio, and the decisions: every evaluated point of a run compared with the
baseline's, in order, and the runs' final best values paired with the baseline's (the
cached-factor acquisitions compute the posterior moments in another order, so the
searches can part at rounding level and the decisions differ; the quality must not).

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

import numpy as np
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
from botorch_fed import FBOFedGPSettings, FederationSetup, run_federated
job = json.loads(sys.argv[1])
if not job.get("memo", True):  # what each client of a deployment computes itself
    from botorch_fed.protocol.shared_search import SharedSearchMemo
    SharedSearchMemo.supports = staticmethod(lambda acqf: False)
setup = FederationSetup(problem=f"cec2005-f{job['function']}", dim=job["dim"],
                        num_clients=job["clients"], seed=job["seed"],
                        aggregator=job["aggregator"])
common = dict(num_init=job["init"], num_rounds=job["rounds"])
settings = (FBOFedGPSettings.paper(**common) if job["preset"] == "paper"
            else FBOFedGPSettings(**common))
t0 = time.perf_counter()
result = run_federated("fbo-fedgp", setup, settings)
print(json.dumps({"time_s": time.perf_counter() - t0, "best_value": result.best_value,
                  "stage_s": result.ledger["stage_s"], "steps": result.steps,
                  "points": [[e["round"], e["client"], *e["x"]] for e in result.evaluations]}))
"""


def _worktree(rev: str, root: Path) -> Path:
    path = root / f"tree-{rev}"
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
    note = " (uncommitted changes of the working tree are not measured)" if dirty else ""
    return out.stdout.strip() + note


def compare_points(a: dict, b: dict) -> dict:
    r"""Two runs' evaluations compared point by point, in the run's order: how many are
    equal to 1e-9 of the domain's scale, the first round that differs, and whether all
    are bit-identical. (Stored instead of the points, which would make the JSON large.)"""
    pa, pb = np.asarray(a["points"]), np.asarray(b["points"])
    if pa.shape != pb.shape:
        return {"equal": 0, "total": max(len(pa), len(pb)), "first": 0, "exact": False}
    scale = max(float(np.abs(pa[:, 2:]).max()), 1.0)
    same = np.all(np.abs(pa - pb) <= 1e-9 * scale, axis=1)
    return {
        "equal": int(same.sum()),
        "total": len(same),
        "first": None if same.all() else int(pa[~same, 0].min()),
        "exact": bool(np.array_equal(pa, pb)),
    }


def _compare_arms(rec: dict) -> None:
    r"""Replace each arm's points by its comparison with the baseline's (in place)."""
    arms = [a for a in ("current", "nomemo") if a in rec]
    rec["same"] = {a: compare_points(rec["baseline"], rec[a]) for a in arms}
    for a in ("baseline", *arms):
        rec[a].pop("points", None)


def _fmt(v: float) -> str:
    return f"{v:.4g}" if abs(v) < 1e5 else f"{v:.3e}"


def _quality(pairs: list[dict]) -> str:
    r"""The decisions' quality, paired by run: the final best values (CEC-2005 is
    minimised: lower is better) of this code against the baseline's."""
    diff = [r["current"]["best_value"] - r["baseline"]["best_value"] for r in pairs]
    better = sum(d < 0 for d in diff)
    same = sum(d == 0 for d in diff)
    text = (
        f"Quality (final best value, lower is better): this code is lower in {better}, "
        f"equal in {same} and higher in {len(diff) - better - same} of {len(diff)} runs; "
        f"median difference {_fmt(statistics.median(diff))}."
    )
    if any(diff):
        from scipy.stats import wilcoxon

        p = wilcoxon(diff).pvalue
        text += (
            f" Two-sided Wilcoxon signed-rank p = {p:.2g} over the {len(diff)} pairs"
            + (" (with fewer than 6 pairs no p below 0.05 is possible)" if len(diff) < 6 else "")
            + "."
        )
    return text


def report(data: dict) -> str:
    meta, runs = data["meta"], data["runs"]
    lines = [
        "# FBO-FedGP: a Table-1 run against the code before the speed work (issue 13)",
        "",
        f"- command: `{meta['command']}`",
        f"- this code: {meta['current']}; baseline: {meta['baseline']} (both as git "
        "worktrees of those revisions)",
        f"- machine: {meta['machine']}",
        f"- versions: {meta['versions']}",
        f"- date: {meta['date']}",
        f"- setting: CEC-2005, {meta['setting']}, {meta['aggregator']} aggregation; every "
        "run in a fresh process with 1 torch thread; the codes alternate run by run",
        "- `no memo`: this code with the in-process memo of the shared global search off. "
        "In a deployment every client runs in its own process and computes that search "
        "itself (in parallel with the others), so this arm is what each client computes; "
        "the memo only removes the in-process simulation's repeats of it.",
        *([f"- note: {meta['note']}"] if meta.get("note") else []),
        "",
    ]
    for preset in meta["presets"]:
        pairs = [r for r in runs if r["preset"] == preset]
        if not pairs:
            continue
        arms = [a for a in ("current", "nomemo") if all(a in r for r in pairs)]
        t_old = [r["baseline"]["time_s"] for r in pairs]
        lines += [f"## `{preset}` preset", ""]
        for arm in arms:
            t_new = [r[arm]["time_s"] for r in pairs]
            ratios = [a / b for a, b in zip(t_old, t_new, strict=True)]
            label = "this code" if arm == "current" else "this code, no memo"
            lines.append(
                f"- {label}: median run time {statistics.median(t_new):.1f} s against the "
                f"baseline's {statistics.median(t_old):.1f} s: "
                f"**{statistics.median(t_old) / statistics.median(t_new):.2f}x faster** "
                f"(per pair {min(ratios):.2f}-{max(ratios):.2f}x)."
            )
        header = "| F | seed | baseline s | " + " | ".join(
            "this code s" if a == "current" else "no memo s" for a in arms
        )
        lines += [
            "",
            header + " | same evaluations | acquisition s (baseline / this) | best value "
            "(baseline / this) |",
            "|---|---:|---:|" + "---:|" * len(arms) + ":---:|---:|---:|",
        ]
        identical_runs = 0
        for r in pairs:
            b, c = r["baseline"], r["current"]
            cmp = r["same"]["current"]
            identical_runs += all(r["same"][a]["equal"] == r["same"][a]["total"] for a in arms)
            same = (
                ("all, bit-identical" if cmp["exact"] else "all")
                if cmp["equal"] == cmp["total"]
                else f"{cmp['equal']}/{cmp['total']} (from round {cmp['first']})"
            )
            lines.append(
                f"| F{r['function']} | {r['seed']} | {b['time_s']:.1f} | "
                + " | ".join(f"{r[a]['time_s']:.1f}" for a in arms)
                + f" | {same} | {b['stage_s'].get('acquisition', 0):.1f} / "
                f"{c['stage_s'].get('acquisition', 0):.1f} | {_fmt(b['best_value'])} / "
                f"{_fmt(c['best_value'])} |"
            )
        lines += [
            "",
            f"Decisions: {identical_runs} of {len(pairs)} runs evaluate the same points as "
            "the baseline, in the same order (every coordinate equal to 1e-9 of the "
            "domain's scale), in every arm.",
            "",
            _quality(pairs),
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
                "current": _revision(REPO),  # measured: HEAD, as committed
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
            # this code as committed (edits to the working tree during the run do not
            # leak into it; uncommitted changes are not measured)
            cur = _worktree("HEAD", Path(tmp))
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
                            order = [("baseline", old, True), ("current", cur, True)]
                            if preset == "paper":  # the only preset the memo serves
                                order.append(("nomemo", cur, False))
                            if seed % 2:
                                order.reverse()
                            rec = dict(job)
                            for name, code, memo in order:
                                rec[name] = _run(code, {**job, "memo": memo})
                            _compare_arms(rec)
                            data["runs"].append(rec)
                            print(
                                f"{preset} F{f} seed {seed}: {rec['baseline']['time_s']:.1f} s "
                                f"-> {rec['current']['time_s']:.1f} s",
                                flush=True,
                            )
                            path.write_text(json.dumps(data, indent=1))
            finally:
                for tree in (old, cur):
                    subprocess.run(
                        ["git", "-C", str(REPO), "worktree", "remove", "--force", str(tree)],
                        capture_output=True,
                    )
    text = report(data)
    (args.out / f"{stem}.md").write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
