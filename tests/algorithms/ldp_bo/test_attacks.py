r"""Attacks on LDP-BO (``botorch_fed/algorithms/ldp_bo/``, ``botorch_fed/privacy``) by a
malicious server.

Threat model: a malicious server that knows the public seed and settings, deviates
from the protocol, and runs the in-process harness (it picks ``checkpoint=`` and
``resume=``, may crash runs and resume them) but cannot read or write a user's own files
or memory. Each test asserts the *safe* behaviour: a user's noise comes from a 256-bit
key, not a 32-bit seed the server could search; a crash-and-resume (into the same
folder, a fresh one, or two forks of one checkpoint) neither replays a user's noise nor
forgets one of its releases, whose log is the user's own (bound to its key, named in its
state, locked around every release) and survives a torn write; privacy settings a
non-private variant would ignore are refused; the key stream's uniforms lie in the open
unit interval and its reads cross the 32-bit block counter.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from botorch_fed.algorithms import LDPBOSettings, build_federation, run_federated
from botorch_fed.algorithms.ldp_bo import LDPServer
from botorch_fed.privacy import LaplaceMechanism
from botorch_fed.privacy.stream import KeyStream
from botorch_fed.problems.objectives import CallableObjective
from botorch_fed.protocol import FederationSetup, Message, ProtocolViolation
from botorch_fed.protocol.checkpoint import CheckpointError

pytestmark = pytest.mark.usefixtures("quiet_single_thread")


# ----------------------------------------------------------------------------------
# MT19937 as torch's CPU generator uses it: a brute force over its 32-bit seed space
# ----------------------------------------------------------------------------------
# the users' noise from the OS, as in a deployment
OS = {"private_randomness": "os"}


def _mt_outputs(seeds: np.ndarray, n_out: int) -> list[np.ndarray]:
    r"""First ``n_out`` (< 227) tempered MT19937 outputs for each 32-bit seed,
    vectorised over seeds (``init_genrand`` + first twist, only the words needed)."""
    p = np.asarray(seeds, dtype=np.uint64).astype(np.uint32)
    keep = {0: p.copy()}
    c = np.uint32(1812433253)
    for i in range(1, 397 + n_out + 1):
        p = c * (p ^ (p >> np.uint32(30))) + np.uint32(i)
        if i <= n_out or i >= 397:
            keep[i] = p
    outs = []
    for k in range(n_out):
        y = (keep[k] & np.uint32(0x80000000)) | (keep[k + 1] & np.uint32(0x7FFFFFFF))
        mag = np.where(y & np.uint32(1), np.uint32(0x9908B0DF), np.uint32(0))
        v = keep[k + 397] ^ (y >> np.uint32(1)) ^ mag
        v ^= v >> np.uint32(11)
        v ^= (v << np.uint32(7)) & np.uint32(0x9D2C5680)
        v ^= (v << np.uint32(15)) & np.uint32(0xEFC60000)
        v ^= v >> np.uint32(18)
        outs.append(v.astype(np.uint64))
    return outs


def test_the_mechanism_noise_comes_from_a_256_bit_key_not_a_32_bit_seed():
    r"""The attack that noise from a seeded torch.Generator admits (search the 2^32
    seeds its Mersenne Twister keeps, subtract the noise) has nothing to search: an
    OS-seeded user's noise is a ChaCha20 stream under 32 fresh random bytes."""
    from botorch_fed.privacy import KeyStream

    _, clients, _ = build_federation(
        "ldp-tgp",
        FederationSetup(problem="ldp-synthetic", num_clients=3, seed=0, crypto_seed=None),
        LDPBOSettings(num_rounds=3),
        **OS,
    )
    streams = [c.mechanism.generator for c in clients.values()]
    assert all(isinstance(g, KeyStream) for g in streams)
    keys = {bytes(g.state()[:32].tolist()) for g in streams}
    assert len(keys) == 3 and all(len(k) == 32 for k in keys)


def test_the_private_seed_space_is_larger_than_32_bits():
    from botorch_fed.privacy import LaplaceMechanism

    seed = 123_456
    user = LaplaceMechanism(1.0, 1.0, 0.0, seed=seed + 2**32)
    replay = LaplaceMechanism(1.0, 1.0, 0.0, seed=seed)  # the same low 32 bits
    assert not torch.equal(user(torch.zeros(8)), replay(torch.zeros(8)))


# ----------------------------------------------------------------------------------
# Crash-and-resume: the user's generator and ledger roll back past a release
# ----------------------------------------------------------------------------------
class _ServerCrash(RuntimeError):
    pass


def test_a_resumed_user_never_reuses_noise_or_forgets_a_release(tmp_path, monkeypatch):
    grid = torch.linspace(0, 1, 11, dtype=torch.float64).unsqueeze(-1)

    def f(X):
        return 0.8 * X[..., 0] ** 2  # |f| <= 1

    obj = CallableObjective(
        f, bounds=[[0.0], [1.0]], candidates=grid, reward_bound=1.0, noise_bound=0.0
    )
    setup = FederationSetup(objectives=obj, num_clients=1, seed=0, crypto_seed=None)
    settings = LDPBOSettings(num_rounds=3, epsilon=1.0, beta_scale=0.05)
    x_a, x_b = grid[2], grid[9]
    honest = LDPServer.run_round
    target = {"x": x_a}
    seen = []

    def malicious_round(self, t):
        if t < 3:
            return honest(self, t)
        reply = self.send({0: Message("query", {"x": target["x"].numpy(), "t": t})})[0]
        seen.append(reply.payload["y"])
        raise _ServerCrash  # "crash" after the reply, before the round's checkpoint

    monkeypatch.setattr(LDPServer, "run_round", malicious_round)
    with pytest.raises(_ServerCrash):
        run_federated("ldp-tgp", setup, settings, checkpoint=tmp_path / "ckpt", **OS)
    target["x"] = x_b  # the resumed round asks somewhere else
    with pytest.raises(_ServerCrash):
        run_federated("ldp-tgp", setup, settings, resume=tmp_path / "ckpt", **OS)
    y_a, y_b = seen
    # rewards in the maximisation convention (CallableObjective minimises)
    exact = -float(f(x_a)) + float(f(x_b))
    # the two answers carry independent noise: no exact difference r(x_a) - r(x_b)
    assert abs((y_a - y_b) - exact) > 1e-9
    # and the user counts both: its log survives the rollback (3 + 1 releases)
    log = (tmp_path / "ckpt" / "client-0.releases.jsonl").read_text().splitlines()
    assert len(log) == 1 + 4  # the key's header and 4 releases
    # with a budget of 3 answers, the replayed round is refused outright
    budget = LDPBOSettings(num_rounds=3, epsilon=1.0, beta_scale=0.05, user_budget=3.0)
    with pytest.raises(_ServerCrash):
        run_federated("ldp-tgp", setup, budget, checkpoint=tmp_path / "b", **OS)
    with pytest.raises(ProtocolViolation, match="budget"):
        run_federated("ldp-tgp", setup, budget, resume=tmp_path / "b", **OS)


def test_resume_does_not_erase_releases_from_the_ledger(tmp_path):
    grid = torch.linspace(0, 1, 11, dtype=torch.float64).unsqueeze(-1)
    obj = CallableObjective(
        lambda X: 0.5 * X[..., 0],
        bounds=[[0.0], [1.0]],
        candidates=grid,
        reward_bound=1.0,
        noise_bound=0.0,
    )
    _, clients, _ = build_federation(
        "ldp-tgp",
        FederationSetup(objectives=obj, num_clients=1, seed=0, crypto_seed=None),
        LDPBOSettings(num_rounds=3, epsilon=1.0, user_budget=3.0),
        **OS,
    )
    user, log = clients[0], tmp_path / "client-0.releases.jsonl"
    user.attach_release_log(log)  # as run_federated does with a checkpoint folder
    for t in (1, 2):
        user.handle(Message("query", {"x": grid[t].numpy(), "t": t}))
    checkpoint = user.state_dict()  # what run_federated saves after round 2
    first = user.handle(Message("query", {"x": grid[3].numpy(), "t": 3})).payload["y"]
    # crash after round 3's reply; resume from round 2's checkpoint
    user.load_state_dict(checkpoint)
    user.attach_release_log(log)
    assert user.privacy_ledger.spent(0)[0] == pytest.approx(3.0)  # the release is known
    with pytest.raises(ProtocolViolation, match="budget"):  # and the budget holds
        user.handle(Message("query", {"x": grid[3].numpy(), "t": 3}))
    assert isinstance(first, float)


# ----------------------------------------------------------------------------------
# Privacy settings silently ignored by the non-private variants
# ----------------------------------------------------------------------------------
@pytest.mark.parametrize("algorithm", ["gp-ucb"])
def test_a_privacy_budget_on_a_non_private_variant_is_refused(algorithm):
    with pytest.raises(ValueError, match="user_budget"):
        run_federated(
            algorithm,
            FederationSetup(problem="ldp-synthetic", num_clients=2, seed=1),
            LDPBOSettings(num_rounds=4, user_budget=1.0, epsilon=0.5),
        )


# ----------------------------------------------------------------------------------
# Crash-and-resume into other folders: one user on an 11-point grid
# ----------------------------------------------------------------------------------
GRID = torch.linspace(0, 1, 11, dtype=torch.float64).unsqueeze(-1)


def _f(X):
    return 0.8 * X[..., 0] ** 2  # |f| <= 1: never clipped with B = 1, R = 0


def _setup():
    obj = CallableObjective(
        _f, bounds=[[0.0], [1.0]], candidates=GRID, reward_bound=1.0, noise_bound=0.0
    )
    # OS-entropy keys: the noise is private, nothing for the server to search
    return FederationSetup(objectives=obj, num_clients=1, seed=0, crypto_seed=None)


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
# The release log lives in the user's state, not in the folder the server names
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
# A torn last line of the release log does not swallow the next record
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
# The key stream behind the users' noise
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
