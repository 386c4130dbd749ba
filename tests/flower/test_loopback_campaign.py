r"""A campaign on a real loopback federation (``botorch-fed flower up --ask-tell 2``):
party 2's operator reports its measurements (:class:`Party`); midway, while party 2 waits
for its operator, the ServerApp and party 0's agent are killed with SIGKILL; ``flower up``
restarts the agent, ``flower resume`` continues the campaign, and the finished run equals
the in-process run of the same options, with no point asked twice.

Local BO (one message a round) keeps it short: each message costs every party a
``flwr-clientapp`` process of about 2 CPU seconds (tests/flower/test_campaigns.py runs
FBO-FedGP under CKKS on the in-memory grid; benchmarks/flower_campaign.py runs it with
three ask/tell parties on Flower)."""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import pytest
import torch

pytest.importorskip("flwr")

from botorch_fed.cli import main  # noqa: E402
from botorch_fed.flower import launcher  # noqa: E402
from botorch_fed.flower.processes import descendants, process_table  # noqa: E402
from botorch_fed.flower.run_options import prepare  # noqa: E402
from botorch_fed.flower.state_folder import STATE_ENV  # noqa: E402
from botorch_fed.problems.ask_tell import Party  # noqa: E402
from botorch_fed.protocol.runner import run_federated  # noqa: E402
from tests.helpers.flower_runs import comparable, short_argv  # noqa: E402

pytestmark = [pytest.mark.flower, pytest.mark.usefixtures("quiet_single_thread")]

FLAGS = ["--allow-plaintext", "--allow-crypto-seed", "--share-results", "--allow-algorithm=all"]


def _pids(pattern: str, state=None, root: int | None = None) -> list[int]:
    r"""Live processes whose command line holds ``pattern`` and that belong to the
    federation in ``state`` (its marker in their environment) or descend from ``root``:
    never another test's processes."""
    table = process_table()
    below = descendants([root], table) if root is not None else set()
    marker = f"{STATE_ENV}={state}".encode() if state is not None else None
    found = []
    for pid in table:
        try:
            cmdline = open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode()
            environ = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
        except OSError:
            continue
        ours = pid in below or (marker is not None and marker in environ)
        if pattern in cmdline and ours:
            found.append(pid)
    return found


def test_a_campaign_survives_its_serverapp_and_a_party_agent_killed_midway(tmp_path):
    state, run_dir = tmp_path / "fed", tmp_path / "campaign"
    argv = short_argv("local", rounds=2) + ["--out", str(tmp_path / "out.json")]
    run = prepare(argv, outputs=True)
    objective = run.setup.make_objectives()[2]
    fed = launcher.up(3, state, agent_flags=FLAGS, ask_tell=(2,), timeout=120)
    killed, stop, asked = threading.Event(), threading.Event(), []

    def operator() -> None:  # party 2's lab: the first point of round 2 waits for the kill
        party = Party(launcher.ask_folder(state, 2))
        while not stop.is_set():
            for ask in party.pending() if party.folder.exists() else []:
                if len(asked) == 4 and not killed.is_set():
                    break  # 3 initial points and round 1's were reported
                x = torch.tensor([ask["x"]], dtype=torch.float64)
                party.report(ask["id"], float(objective.function.evaluate_true(x).item()))
                asked.append(ask["id"])
            time.sleep(0.1)

    lab = threading.Thread(target=operator)
    lab.start()
    codes: list[int] = []
    first = threading.Thread(
        target=lambda: codes.append(
            main(
                [
                    "flower",
                    "run",
                    *argv,
                    "--state-dir",
                    str(state),
                    "--run-dir",
                    str(run_dir),
                    "--hold",
                    "5",
                ]
            )  # fmt: skip
        )
    )
    try:
        first.start()
        deadline = time.monotonic() + 240
        while len(asked) < 4 or not _waiting(launcher.ask_folder(state, 2)):
            assert time.monotonic() < deadline and first.is_alive(), asked
            time.sleep(0.2)
        campaign = json.loads((run_dir / "campaign.json").read_text())["config"]["campaign"]
        assert (state / "campaigns" / campaign / "checkpoint.json").exists()
        (serverapp,) = _pids("flwr-serverapp", state=state.resolve())
        os.kill(serverapp, signal.SIGKILL)  # party 2 waits for its operator meanwhile
        os.killpg(fed["pids"]["agent-0"], signal.SIGKILL)
        for pid in _pids(
            "flwr run ", root=os.getpid()
        ):  # the submitter's `flwr run --stream` waits on
            os.kill(pid, signal.SIGKILL)
        first.join(60)
        assert codes == [1]  # the first submission ended without results
        restarted = launcher.up(3, state, agent_flags=FLAGS, ask_tell=(2,), timeout=120)
        assert restarted["restarted"] == ["agent-0"]
        killed.set()  # the operator reports the waiting point now
        assert main(["flower", "resume", str(run_dir)]) == 0
    finally:
        stop.set()
        lab.join()
        launcher.down(state)
    result = json.loads((tmp_path / "out.json").read_text())
    local = run_federated(run.algorithm, run.setup, run.settings)
    ours = {k: v for k, v in result.items() if k not in ("time_s", "versions", "ledger")}
    theirs = comparable(local)
    theirs.pop("rounds")
    assert ours == theirs
    assert len(asked) == len(set(asked)) == 3 + 2  # none lost, none asked twice


def _waiting(folder) -> bool:
    return folder.exists() and bool(Party(folder).pending())
