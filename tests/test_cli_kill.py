r"""A run killed with SIGKILL (no clean-up, no exception handlers) after round k resumes
from its checkpoint in a new process to exactly the uninterrupted result."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from botorch_fed.protocol.checkpoint import MANIFEST

ARGS = [
    "run", "local", "--problem", "branin", "--clients", "3", "--init", "3", "--rounds", "6",
    "--seed", "5", "--noise-std", "0.5", "--raw-samples", "16", "--num-restarts", "2",
]  # fmt: skip
KILL_AT = 3


def _cli(*extra: str, **kwargs) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "botorch_fed.cli", *ARGS, *extra]
    return subprocess.Popen(
        command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, **kwargs
    )


def _comparable(path) -> dict:
    out = json.loads(path.read_text())
    for key in ("time_s", "versions"):
        out.pop(key)
    ledger = out.pop("ledger")
    out["bytes"] = (ledger["bytes_per_client"], ledger["messages"])
    return out


def _manifest_round(folder) -> int:
    try:
        return json.loads((folder / MANIFEST).read_text())["round"]
    except (OSError, ValueError, KeyError):
        return -1


@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs SIGKILL")
def test_sigkill_after_round_k_then_resume_is_bit_for_bit(tmp_path):
    full = _cli("--out", str(tmp_path / "full.json"))
    ckpt = tmp_path / "ckpt"
    victim = _cli("--checkpoint", str(ckpt))
    deadline = time.monotonic() + 120
    while _manifest_round(ckpt) < KILL_AT and victim.poll() is None:
        assert time.monotonic() < deadline, "the run never reached the kill round"
        time.sleep(0.02)
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    assert victim.returncode == -signal.SIGKILL, "the run finished before it was killed"
    killed_at = _manifest_round(ckpt)
    assert KILL_AT <= killed_at < 6
    resumed = _cli("--resume", str(ckpt), "--out", str(tmp_path / "resumed.json"))
    for p in (full, resumed):
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err.decode()
    assert _comparable(tmp_path / "resumed.json") == _comparable(tmp_path / "full.json")
