r"""A real Flower federation on 127.0.0.1: a SuperLink, 3 SuperNodes and 3 party agents
(``botorch-fed flower up``); FBO-FedGP with CKKS through ``botorch-fed flower run``, and
LDP-MoMA-GP-UCB submitted as it submits them (``flwr run``), each JSON compared with the
in-process run of the same options (every registered algorithm with
``BOTORCH_FED_FLOWER_ALL=1``); then a SuperNode is killed mid-run and the run stops naming
it. Every process is stopped at the end (``down``), and the test checks
that none outlives it.

Flower takes seconds per message (its SuperNode sleeps 3 s when it finds no message,
handles one message at a time and starts a ``flwr-clientapp`` process for each, about
2 CPU seconds of imports: this module is the suite's largest CPU cost), so the runs are
short and few, and they are submitted at once. Every registered algorithm runs through
the same app code, with every message and reply crossing Flower's wire encoding, in
``test_same_as_in_process.py``; what only separate processes show is checked here: secure
sums whose key material and ciphertexts live in three agent processes and whose
payloads are the largest (CKKS), messages to one party of three (LDP-BO's queries), the
command line, and a party that disappears."""

from __future__ import annotations

import json
import os
import shutil
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

pytest.importorskip("flwr")

from botorch_fed.algorithms import available_algorithms, get_algorithm  # noqa: E402
from botorch_fed.cli import main  # noqa: E402
from botorch_fed.flower import launcher, submission  # noqa: E402
from botorch_fed.flower.keys import write_keyset  # noqa: E402
from botorch_fed.flower.run_options import prepare  # noqa: E402
from botorch_fed.protocol.runner import run_federated  # noqa: E402
from botorch_fed.secure import available_backends  # noqa: E402
from tests.helpers.flower_runs import comparable, short_argv  # noqa: E402

pytestmark = [pytest.mark.flower, pytest.mark.usefixtures("quiet_single_thread")]

CLIENTS = 3
FLAGS = ["--allow-plaintext", "--allow-crypto-seed", "--share-results", "--allow-algorithm=all"]
# FBO-FedGP's default fits its hyperparameters by federated maximum likelihood: dozens
# of secure sums a round, minutes on Flower; `average` takes one
FBO = ["--hyperparameters", "average"]


# besides FBO-FedGP: messages to one party of three (module docstring; local BO runs in
# the killed-SuperNode test). Every message costs each party a process of about 2 CPU
# seconds: all algorithms (BOTORCH_FED_FLOWER_ALL=1) take several minutes
REPRESENTATIVES = ("ldp-moma",)
CONCURRENT = 6


def _cases() -> list[tuple[str, list[str]]]:
    every = os.environ.get("BOTORCH_FED_FLOWER_ALL") == "1"
    # FBO-FedGP under ckks (its largest payloads); with plaintext sums where TenSEAL is
    # missing, or as well with every algorithm (plaintext's messages have the same kinds
    # and cross Flower's wire encoding in test_same_as_in_process.py)
    cases = []
    if every or "ckks" not in available_backends():
        cases.append(("fbo-fedgp-plaintext", short_argv("fbo-fedgp", "plaintext") + FBO))
    if "ckks" in available_backends():
        cases.append(("fbo-fedgp-ckks", short_argv("fbo-fedgp", "ckks") + FBO))
    names = [n for n in available_algorithms() if n != "fbo-fedgp"]
    cases += [(n, short_argv(n)) for n in names if every or n in REPRESENTATIVES]
    return cases


@pytest.fixture(scope="module")
def federation(tmp_path_factory):
    state = tmp_path_factory.mktemp("flower")
    fed = launcher.up(CLIENTS, state, agent_flags=FLAGS, timeout=120)
    try:
        yield state, fed
    finally:
        launcher.down(state)
        _assert_all_stopped(fed)


def _assert_all_stopped(fed: dict) -> None:
    for name, pid in fed["pids"].items():
        try:
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            continue
        assert state in ("Z", "X"), f"{name} (pid {pid}) outlived the test: state {state}"


def _submit(state, argv: list[str], out: str, lines: list[str] | None = None) -> None:
    run = prepare(argv)
    spec = get_algorithm(run.algorithm)
    keyset = ""
    if spec.secure_aggregation:
        keyset, _ = write_keyset(run.setup, list(range(CLIENTS)), state / "keys")
    config = {
        "argv": json.dumps(argv),
        "out": os.path.basename(out),
        "clients": CLIENTS,
        "timeout": 120.0,
        "on-dropout": "fail",
        "server-key": keyset,
        "keyset": keyset,
    }
    sink = lines.append if lines is not None else (lambda line: None)
    try:
        submission.submit(state, config, stream=sink, timeout=900)
    finally:  # the ServerApp writes into the federation's results folder
        for suffix in ("", ".error"):
            written = state / "results" / f"{os.path.basename(out)}{suffix}"
            if written.exists():
                shutil.move(written, f"{out}{suffix}")


def _result(out: str) -> dict:
    if os.path.exists(f"{out}.error"):
        raise AssertionError(open(f"{out}.error").read())
    with open(out) as f:
        return json.load(f)


def test_every_algorithm_on_flower_equals_its_in_process_run(federation, tmp_path):
    state, _ = federation
    cases = _cases()
    outs = {name: str(tmp_path / f"{name}.json") for name, _ in cases}
    # FBO-FedGP with CKKS (plaintext without TenSEAL) through the command line, as
    # the documentation starts it; the others as the command line submits them
    cli = "fbo-fedgp-ckks" if "ckks" in available_backends() else "fbo-fedgp-plaintext"

    def start(name: str, argv: list[str]) -> None:
        if name != cli:
            return _submit(state, argv, outs[name])
        command = ["flower", "run", *argv, "--state-dir", str(state), "--out", outs[name]]
        assert main(command) == 0

    # at most CONCURRENT runs at once: each starts a ServerApp process that imports
    # torch and BoTorch, and on 2 busy cores Flower's SuperExec, whose task tokens then
    # expire, started ServerApp after ServerApp (about 190 in a local CI run under load,
    # with 9 at once)
    with ThreadPoolExecutor(CONCURRENT) as pool:
        jobs = [pool.submit(start, name, argv) for name, argv in cases]
        # the in-process runs meanwhile: Flower's runs mostly wait on its polls
        local = {}
        for name, argv in cases:
            run = prepare(argv)
            local[name] = comparable(run_federated(run.algorithm, run.setup, run.settings))
        for job in jobs:
            job.result()
    for name, _ in cases:
        flower = _result(outs[name])
        ledger = flower["ledger"]
        assert ledger["total_bytes_down"] > 0 and ledger["total_bytes_up"] > 0, name
        flower = {k: v for k, v in flower.items() if k not in ("time_s", "versions", "ledger")}
        flower["rounds"] = [[r["round"], sorted(r["stage_s"])] for r in ledger["rounds"]]
        assert flower.keys() == local[name].keys(), name
        for key in flower:
            assert flower[key] == local[name][key], (name, key)
        assert flower["evaluations"], name


def test_a_killed_supernode_stops_the_run_naming_it(federation, tmp_path):
    # runs last in this module: it takes party 2's SuperNode away
    state, fed = federation
    argv = short_argv("local", rounds=6)
    out = str(tmp_path / "killed.json")
    lines: list[str] = []
    job = threading.Thread(target=_submit, args=(state, argv, out, lines))
    job.start()
    deadline = time.monotonic() + 300
    while not any("round 1/6 done" in line for line in lines):
        assert time.monotonic() < deadline and job.is_alive(), "\n".join(lines[-20:])
        time.sleep(0.2)
    os.killpg(fed["pids"]["supernode-2"], signal.SIGTERM)
    job.join(300)
    assert not job.is_alive()
    error = open(f"{out}.error").read()
    assert "ClientUnavailable: client 2 (Flower node" in error, error
    assert not os.path.exists(out)
