r"""Second review of LDP-BO (``botorch_fed/federation/ldp_bo.py``, ``botorch_fed/privacy``):
attacks on the fixes of the first review (``test_attack_ldp.py``).

Threat model: a malicious server that knows the public seed and settings, deviates
from the protocol, and runs the in-process harness (it picks ``checkpoint=`` and
``resume=``, may crash runs and resume them) but cannot read or write a user's own files
or memory. Each test asserts the *safe* behaviour; each failed (the attack worked)
before the release log became the user's own (bound to its key, named in its state,
locked around every release) and before the key stream's fixes.
"""

from __future__ import annotations

import pytest
import torch

from botorch_fed.federation import (
    CallableObjective,
    FederationSetup,
    LDPBOSettings,
    Message,
    ProtocolViolation,
    run_federated,
)
from botorch_fed.federation.checkpoint import CheckpointError
from botorch_fed.federation.ldp_bo import LDPServer
from botorch_fed.privacy import LaplaceMechanism
from botorch_fed.privacy.stream import KeyStream

pytestmark = pytest.mark.usefixtures("quiet_single_thread")

GRID = torch.linspace(0, 1, 11, dtype=torch.float64).unsqueeze(-1)


def _f(X):
    return 0.8 * X[..., 0] ** 2  # |f| <= 1: never clipped with B = 1, R = 0


# OS-entropy keys, as in a deployment
OS = {"private_randomness": "os"}


def _setup():
    obj = CallableObjective(
        _f, bounds=[[0.0], [1.0]], candidates=GRID, reward_bound=1.0, noise_bound=0.0
    )
    # OS-entropy keys: the noise is private, nothing for the server to search
    return FederationSetup(objectives=obj, num_clients=1, seed=0, crypto_seed=None)


class _ServerCrash(RuntimeError):
    pass


def _malicious_round(seen, target, crash_before_send=False):
    r"""Round ``t``: ask user 0 at ``target["x"]``, keep the answer, crash before the
    round's checkpoint (so the folder's checkpoint stays one round behind)."""
    honest = LDPServer.run_round

    def run_round(self, t):
        if t < target["round"]:
            return honest(self, t)
        if crash_before_send:
            raise _ServerCrash
        reply = self.send({0: Message("query", {"x": target["x"].numpy(), "t": t})})[0]
        seen.append(reply.payload["y"])
        raise _ServerCrash

    return run_round


def _exact(x_a, x_b):
    # rewards in the maximisation convention (CallableObjective minimises)
    return -float(_f(x_a)) + float(_f(x_b))


# ----------------------------------------------------------------------------------
# 1. The write-ahead log lives in the folder the *server* names: resume into a new one
# ----------------------------------------------------------------------------------
def test_resuming_into_a_fresh_folder_does_not_replay_noise(tmp_path, monkeypatch):
    settings = LDPBOSettings(num_rounds=2, epsilon=1.0, beta_scale=0.05)
    seen, target = [], {"round": 1, "x": GRID[2]}
    monkeypatch.setattr(LDPServer, "run_round", _malicious_round(seen, target))
    # round 1: the user answers at x_a (and logs it in A); the server crashes before
    # round 1's checkpoint: A's checkpoint is round 0, where the user had no release
    with pytest.raises(_ServerCrash):
        run_federated("ldp-tgp", _setup(), settings, **OS, checkpoint=tmp_path / "A")
    assert (tmp_path / "A" / "client-0.releases.jsonl").exists()
    target["x"] = GRID[9]
    # the documented `checkpoint=` "names another folder" -- nothing else is needed
    with pytest.raises(_ServerCrash):
        run_federated(
            "ldp-tgp", _setup(), settings, resume=tmp_path / "A", checkpoint=tmp_path / "B", **OS
        )
    y_a, y_b = seen
    assert abs((y_a - y_b) - _exact(GRID[2], GRID[9])) > 1e-9


def test_a_checkpoint_forked_into_two_folders_does_not_double_the_budget(tmp_path, monkeypatch):
    # a budget of exactly one answer
    settings = LDPBOSettings(num_rounds=1, epsilon=1.0, beta_scale=0.05, user_budget=1.0)
    seen, target = [], {"round": 1, "x": GRID[2]}
    # A: round 0's checkpoint, then a crash before any query is sent
    monkeypatch.setattr(LDPServer, "run_round", _malicious_round([], target, True))
    with pytest.raises(_ServerCrash):
        run_federated("ldp-tgp", _setup(), settings, **OS, checkpoint=tmp_path / "A")
    monkeypatch.setattr(LDPServer, "run_round", _malicious_round(seen, target))
    answers = 0
    for fork, x in (("B", GRID[2]), ("C", GRID[9])):
        target["x"] = x
        try:
            run_federated(
                "ldp-tgp",
                _setup(),
                settings,
                resume=tmp_path / "A",
                checkpoint=tmp_path / fork,
                **OS,
            )
        except _ServerCrash:
            answers += 1
        except (CheckpointError, ProtocolViolation):
            pass
    # the user's budget covers one answer, whatever the folders
    assert answers <= 1, f"the user answered {answers} times with a budget of 1; {seen}"


# ----------------------------------------------------------------------------------
# 2. A torn last line is skipped but not cut off: the next record is glued to it
# ----------------------------------------------------------------------------------
def test_a_release_logged_after_a_torn_write_is_not_forgotten(tmp_path, monkeypatch):
    settings = LDPBOSettings(num_rounds=3, epsilon=1.0, beta_scale=0.05)
    folder, seen = tmp_path / "A", []
    log = folder / "client-0.releases.jsonl"
    target = {"round": 2, "x": GRID[2]}
    honest = LDPServer.run_round

    def torn(self, t):
        if t < 2:
            return honest(self, t)
        # round 2: the process dies while the user writes its log record (the reply
        # never leaves): a prefix of the record is all that reaches the file
        with open(log, "a") as fh:
            fh.write('{"releases": 2, "posi')
        raise _ServerCrash

    monkeypatch.setattr(LDPServer, "run_round", torn)
    with pytest.raises(_ServerCrash):
        run_federated("ldp-tgp", _setup(), settings, **OS, checkpoint=folder)
    # resume (round 1's checkpoint): the torn line is skipped, as designed; round 2 is
    # answered at x_a and logged -- onto the torn line; the server crashes again
    monkeypatch.setattr(LDPServer, "run_round", _malicious_round(seen, target))
    with pytest.raises(_ServerCrash):
        run_federated("ldp-tgp", _setup(), settings, **OS, resume=folder)
    target["x"] = GRID[9]
    with pytest.raises(_ServerCrash):
        run_federated("ldp-tgp", _setup(), settings, **OS, resume=folder)
    y_a, y_b = seen
    assert abs((y_a - y_b) - _exact(GRID[2], GRID[9])) > 1e-9


# ----------------------------------------------------------------------------------
# 3. KeyStream correctness
# ----------------------------------------------------------------------------------
def test_keystream_uniforms_are_in_the_open_unit_interval(monkeypatch):
    stream = KeyStream(bytes(32))
    monkeypatch.setattr(stream, "_bytes", lambda n: b"\xff" * n)  # the all-ones word
    u = stream.uniform(1)
    assert float(u.max()) < 1.0
    mech = LaplaceMechanism(1.0, 1.0, 0.0, seed=0)
    monkeypatch.setattr(mech.generator, "_bytes", lambda n: b"\xff" * n)
    assert torch.isfinite(mech(torch.zeros(1))).all()


def test_keystream_reads_across_the_32_bit_block_counter():
    key = bytes(range(32))
    position = (2**32 - 1) * 64 + 32  # 32 bytes before block 2^32
    whole = KeyStream(key, position).uniform(8)
    parts = KeyStream(key, position)
    split = torch.cat([parts.uniform(4), parts.uniform(4)])
    assert torch.equal(whole, split)
