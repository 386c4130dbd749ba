r"""Attacks on LDP-BO (``botorch_fed/federation/ldp_bo.py``) by a malicious server.

Each test asserts the *safe* behaviour; each failed before its fix (the attack worked):
a 32-bit noise seed the server could search, a crash-and-resume that replayed a user's
noise and erased its releases, privacy settings a non-private variant ignored.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from botorch_fed.federation import (
    CallableObjective,
    FederationSetup,
    LDPBOSettings,
    Message,
    ProtocolViolation,
    build_federation,
    run_federated,
)
from botorch_fed.federation.ldp_bo import LDPServer

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
    r"""The attack that worked against a torch.Generator (search the 2^32 seeds its
    Mersenne Twister keeps, subtract the noise) has nothing to search: an OS-seeded
    user's noise is a ChaCha20 stream under 32 fresh random bytes."""
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
