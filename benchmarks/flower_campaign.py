r"""A campaign on a loopback Flower federation whose three parties all ask and tell.

FBO-FedGP (CKKS sums) with three ask/tell parties (``botorch-fed flower up --ask-tell
all``), driven by an operator script that uses only the command line (``botorch-fed party
suggest --party I --json`` / ``party report``). Midway -- after the second round's
checkpoint, while every party waits for its operator -- the script measures the CPU time
of every process of the federation (SuperLink, SuperNodes, SuperExecs, agents, the
ServerApp and the ClientApps holding messages) over ``--idle`` seconds, then kills the
ServerApp and party 0's agent with SIGKILL, restarts the agent (``flower up``), resumes
(``flower resume``) and lets the operators finish. The result must equal the in-process
run of the same options, and no point may be asked twice.

    python benchmarks/flower_campaign.py --rounds 3 --idle 120 \
        --out benchmarks/results/flower_campaign.json

Run it once with Flower's default SuperExec poll (this project's 0.25 s) and once with
``FLWR_SUPEREXEC_TASK_POLL_INTERVAL=5`` to see what the waiting costs.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch

from botorch_fed.flower import launcher
from botorch_fed.flower.processes import descendants, process_table, with_environment
from botorch_fed.flower.run_options import prepare
from botorch_fed.flower.state_folder import STATE_ENV
from botorch_fed.problems.ask_tell import Party
from botorch_fed.protocol.runner import run_federated

FLAGS = ["--allow-crypto-seed", "--share-results", "--allow-algorithm=all"]
CLI = [sys.executable, "-m", "botorch_fed.cli"]


def _cpu(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _federation_pids(fed: dict) -> set[int]:
    table = process_table()
    roots = list(fed["pids"].values())
    marked = with_environment(f"{STATE_ENV}={fed['state_dir']}", table)
    return set(roots) | descendants(roots, table) | marked


def _waiting_cpu(fed: dict, seconds: float, every: float = 0.5):
    r"""CPU seconds each process of the federation spends over ``seconds``, sampled every
    ``every`` s: a process already running counts from its first sample, one that starts
    in the window from zero (the ``flwr-clientapp`` of a message asked again), one that
    ends up to its last sample (it loses at most ``every`` s). Returns ``(spent, kinds,
    window)``: CPU seconds and kind per pid, and the window's length."""
    first: dict[int, float] = {}
    last: dict[int, float] = {}
    kinds: dict[int, str] = {}
    start = time.monotonic()
    while True:
        for pid in _federation_pids(fed):
            used = _cpu(pid)
            if pid not in first:
                first[pid] = used if time.monotonic() - start < every else 0.0
                kinds[pid] = _kind(pid)
            last[pid] = max(used, last.get(pid, 0.0))
        waited = time.monotonic() - start
        if waited >= seconds:
            return {pid: last[pid] - first[pid] for pid in first}, kinds, waited
        time.sleep(every)


def _pending(state: Path, i: int) -> bool:
    r"""Whether party ``i`` has a point waiting for its operator (read from its folder,
    not through the command line: the operators are away)."""
    return bool(Party(launcher.ask_folder(state, i)).pending())


def _kind(pid: int) -> str:
    r"""What a process of the federation is, from its command line."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
    except OSError:
        return "gone"
    line = " ".join(argv)
    for kind in ("flower-superlink", "flower-supernode", "flower-superexec", "flwr-serverapp"):
        if kind in line:
            return kind
    if "flwr-clientapp" in line:
        return "flwr-clientapp"
    if "botorch_fed.flower.party" in line:
        return "party agent"
    return Path(argv[0]).name or "other"


def _pids(pattern: str, state: Path | None = None, root: int | None = None) -> list[int]:
    r"""Processes whose command line holds ``pattern`` and that belong to the federation
    in ``state`` (its marker in their environment) or descend from ``root``."""
    table = process_table()
    below = descendants([root], table) if root is not None else set()
    marker = f"BOTORCH_FED_FLOWER_STATE={state}".encode() if state is not None else None
    out = []
    for pid in table:
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if pattern in cmdline and (pid in below or (marker is not None and marker in environ)):
            out.append(pid)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--idle", type=float, default=120.0, help="seconds of CPU measurement")
    p.add_argument("--hold", type=float, default=1800.0)
    p.add_argument("--out", default=None)
    a = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="campaign-"))
    state, run_dir = tmp / "fed", tmp / "run"
    argv = ["fbo-fedgp", "--problem", "branin", "--clients", "3", "--num-rounds", str(a.rounds)]
    argv += ["--seed", "2", "--crypto-seed", "5", "--aggregator", "ckks", "--num-init", "3"]
    argv += ["--hyperparameters", "average", "--out", str(tmp / "out.json")]
    run = prepare(argv, outputs=True)
    objectives = run.setup.make_objectives()
    fed = launcher.up(3, state, agent_flags=FLAGS, ask_tell=(0, 1, 2), timeout=120)
    paused, stop = threading.Event(), threading.Event()
    asked: dict[int, list[str]] = {0: [], 1: [], 2: []}
    if a.rounds < 2:
        p.error("--rounds must be >= 2 (the operators pause before the last round)")
    # the initial design and every round's point but the last's, then every party waits
    pause_at = 3 + a.rounds - 1

    def operator(i: int) -> None:
        where = ["--party", str(i), "--state-dir", str(state)]
        while not stop.is_set():
            if len(asked[i]) >= pause_at and not paused.is_set():
                time.sleep(1.0)  # this operator is away: nothing runs on its behalf
                continue
            out = subprocess.run(
                [*CLI, "party", "suggest", *where, "--json"], capture_output=True, text=True
            )
            pending = json.loads(out.stdout) if out.returncode == 0 and out.stdout else []
            for ask in pending:
                if len(asked[i]) >= pause_at and not paused.is_set():
                    break
                x = torch.tensor([ask["x"]], dtype=torch.float64)
                value = float(objectives[i].function.evaluate_true(x).item())
                done = subprocess.run(
                    [*CLI, "party", "report", *where, "--id", ask["id"], "--value", repr(value)],
                    capture_output=True,
                    text=True,
                )
                if "No run is active" in done.stderr:  # its agent restarted and has not
                    break  # rebuilt its run yet: the operator tries again later
                assert done.returncode == 0, done.stdout + done.stderr
                asked[i].append(ask["id"])
            time.sleep(1.0)

    labs = [threading.Thread(target=operator, args=(i,)) for i in range(3)]
    for t in labs:
        t.start()
    t0 = time.monotonic()
    command = [*CLI, "flower", "run", *argv, "--state-dir", str(state), "--run-dir", str(run_dir)]
    first = subprocess.Popen([*command, "--hold", str(a.hold)], stdout=subprocess.PIPE, text=True)
    try:
        while not all(len(asked[i]) >= pause_at for i in range(3)):
            assert first.poll() is None, first.stdout.read() if first.stdout else ""
            time.sleep(1.0)
        # every party's next point is asked: all wait for their operators from now on
        while not all(_pending(state, i) for i in range(3)):
            assert first.poll() is None, first.stdout.read() if first.stdout else ""
            time.sleep(1.0)
        time.sleep(10.0)
        spent, kinds, waited = _waiting_cpu(fed, a.idle)
        cpu = sum(spent.values())
        by_kind: dict[str, float] = {}
        for pid, seconds in spent.items():
            by_kind[kinds[pid]] = by_kind.get(kinds[pid], 0.0) + seconds
        idle_percent = 100.0 * cpu / waited
        print(f"waiting: {cpu:.2f} CPU s over {waited:.0f} s = {idle_percent:.2f}% of one core")
        (serverapp,) = _pids("flwr-serverapp", state=state.resolve())
        os.kill(serverapp, signal.SIGKILL)
        os.killpg(fed["pids"]["agent-0"], signal.SIGKILL)
        for pid in _pids("flwr run ", root=first.pid):
            os.kill(pid, signal.SIGKILL)
        first.kill()
        first.wait()
        again = launcher.up(3, state, agent_flags=FLAGS, ask_tell=(0, 1, 2), timeout=120)
        print("restarted", again["restarted"])
        paused.set()
        code = subprocess.run([*CLI, "flower", "resume", str(run_dir)]).returncode
        assert code == 0, code
        wall = time.monotonic() - t0
    finally:
        stop.set()
        for t in labs:
            t.join()
        launcher.down(state)
    result = json.loads((tmp / "out.json").read_text())
    local = run_federated(run.algorithm, run.setup, run.settings).to_dict()
    keys = [k for k in local if k not in ("time_s", "versions", "ledger")]
    same = all(result[k] == local[k] for k in keys)
    unique = all(len(v) == len(set(v)) for v in asked.values())
    record = {
        "command": " ".join(sys.argv),
        "poll_interval": os.environ.get("FLWR_SUPEREXEC_TASK_POLL_INTERVAL", "0.25"),
        "machine": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
        "versions": result["versions"],
        "argv": argv,
        "hold_s": a.hold,
        "waiting_cpu_percent_of_one_core": round(idle_percent, 2),
        "waiting_window_s": round(waited, 1),
        "waiting_cpu_s_by_process": {k: round(v, 2) for k, v in sorted(by_kind.items())},
        "wall_s": round(wall, 1),
        "equals_in_process": same,
        "points_asked": {str(i): len(v) for i, v in asked.items()},
        "none_asked_twice": unique,
        "best_value": result["best_value"],
    }
    print(json.dumps(record, indent=1))
    if a.out:
        Path(a.out).write_text(json.dumps(record, indent=1) + "\n")
    assert same and unique


if __name__ == "__main__":
    main()
