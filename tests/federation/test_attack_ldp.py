r"""Attacks on LDP-BO (``botorch_fed/federation/ldp_bo.py``) by a malicious server.

Each test asserts the *safe* behaviour and is marked ``xfail(strict=True)``: it fails
now (the attack works) and will pass once the weakness is fixed.
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
    build_federation,
    run_federated,
)
from botorch_fed.federation.ldp_bo import LDPServer

pytestmark = pytest.mark.usefixtures("quiet_single_thread")


# ----------------------------------------------------------------------------------
# MT19937 as torch's CPU generator uses it: a brute force over its 32-bit seed space
# ----------------------------------------------------------------------------------
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


def _laplace_stream(seeds: np.ndarray, k: int, scale: float) -> np.ndarray:
    r"""The first ``k`` Laplace draws of ``botorch_fed.privacy.laplace._laplace_noise``
    (one ``random64`` per draw, 53-bit uniform, inverse CDF) for each seed: ``k x n``."""
    o = _mt_outputs(seeds, 2 * k)
    res = []
    for j in range(k):
        u53 = ((o[2 * j] & np.uint64(0x1FFFFF)) << np.uint64(32)) | o[2 * j + 1]
        u = u53.astype(np.float64) * 2.0**-53 - 0.5
        res.append(-scale * np.sign(u) * np.log1p(-2.0 * np.abs(u)))
    return np.stack(res)


@pytest.mark.xfail(
    strict=True,
    reason="The users' Laplace generator has only 32 bits of entropy (torch's mt19937 keeps "
    "the low 32 bits of the seed, also of g.seed()'s OS seed): a server brute-forces the "
    "seed from the privatised replies and subtracts the noise exactly",
)
def test_the_mechanism_noise_cannot_be_recovered_by_brute_forcing_the_seed():
    grid = torch.linspace(0, 1, 21, dtype=torch.float64).unsqueeze(-1)

    def f(X):
        return torch.sin(6.0 * X[..., 0])  # |f| <= 1

    obj = CallableObjective(
        f, bounds=[[0.0], [1.0]], candidates=grid, reward_bound=1.0, noise_bound=0.0
    )
    # crypto_seed=None: the production setting, OS randomness
    _, clients, _ = build_federation(
        "ldp-tgp",
        FederationSetup(objectives=obj, num_clients=1, seed=0, crypto_seed=None),
        LDPBOSettings(num_rounds=24, epsilon=1.0),
    )
    user = clients[0]
    k = 24
    xs = [grid[(5 * t) % 21] for t in range(k)]
    wire = np.array(
        [
            user.handle(Message("query", {"x": x.numpy(), "t": t + 1})).payload["y"]
            for t, x in enumerate(xs)
        ]
    )
    bound, scale = 1.0, 2.0 * 1.0 / 1.0  # public: B + R and 2 (B + R) / epsilon

    # Full attack: sweep all 2^32 seeds (about an hour of single-core numpy at ~0.8 s
    # per 2^20 seeds; seconds on a GPU). Here, to keep the test short, the attacker
    # sweeps a 2^16 window of the 32-bit space; the window's placement is the only
    # thing the test takes from the user (the full sweep needs no knowledge at all).
    low32 = user.mechanism.generator.initial_seed() & 0xFFFFFFFF
    start = max(0, low32 - int(np.random.default_rng().integers(0, 2**16)))
    seeds = np.arange(start, min(start + 2**16, 2**32), dtype=np.uint64)
    noise = _laplace_stream(seeds, k, scale)  # k x n
    ok = (np.abs(wire[:, None] - noise) <= bound + 1e-9).all(0)  # consistent with |y|<=B+R
    raw = np.array([float(f(x)) for x in xs]) * -1.0  # maximisation convention
    if ok.sum() == 1:  # the attack pins down the user's seed ...
        recovered = wire - noise[:, ok][:, 0]
        # ... and from it every raw reward, to float precision
        assert not np.allclose(recovered, raw, rtol=0, atol=1e-9)


@pytest.mark.xfail(
    strict=True,
    reason="A torch.Generator seeded with s and s + 2**32 gives the same stream: the "
    "private seed (crypto_seed-derived, % 2**62) and the OS seed carry 32 bits",
)
def test_the_private_seed_space_is_larger_than_32_bits():
    from botorch_fed.privacy import LaplaceMechanism

    user = LaplaceMechanism(1.0, 1.0, 0.0)  # OS-seeded, as in production
    replay = LaplaceMechanism(1.0, 1.0, 0.0, seed=user.generator.initial_seed() & 0xFFFFFFFF)
    assert not torch.equal(user(torch.zeros(8)), replay(torch.zeros(8)))


# ----------------------------------------------------------------------------------
# Crash-and-resume: the user's generator and ledger roll back past a release
# ----------------------------------------------------------------------------------
class _ServerCrash(RuntimeError):
    pass


@pytest.mark.xfail(
    strict=True,
    reason="Crash/resume rollback: a server that aborts a round after the user replied, "
    "then resumes from the last checkpoint, gets a second answer with the SAME Laplace "
    "noise at a point of its choice (exact reward differences), unrecorded in the ledger "
    "and beyond user_budget",
)
def test_a_resumed_user_never_reuses_noise_or_forgets_a_release(tmp_path, monkeypatch):
    grid = torch.linspace(0, 1, 11, dtype=torch.float64).unsqueeze(-1)

    def f(X):
        return 0.8 * X[..., 0] ** 2  # |f| <= 1

    obj = CallableObjective(
        f, bounds=[[0.0], [1.0]], candidates=grid, reward_bound=1.0, noise_bound=0.0
    )
    setup = FederationSetup(objectives=obj, num_clients=1, seed=0, crypto_seed=None)
    settings = LDPBOSettings(num_rounds=3, epsilon=1.0, user_budget=3.0, beta_scale=0.05)
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
        run_federated("ldp-tgp", setup, settings, checkpoint=tmp_path / "ckpt")
    target["x"] = x_b  # the resumed round asks somewhere else
    with pytest.raises(_ServerCrash):
        run_federated("ldp-tgp", setup, settings, resume=tmp_path / "ckpt")
    y_a, y_b = seen
    # rewards in the maximisation convention (CallableObjective minimises)
    exact = -float(f(x_a)) + float(f(x_b))
    # the server learns r(x_a) - r(x_b) exactly: the two answers share one noise draw
    assert abs((y_a - y_b) - exact) > 1e-9


@pytest.mark.xfail(
    strict=True,
    reason="The rollback on resume also erases releases from the ledger: a user that "
    "answered 4 queries with user_budget=3 epsilon reports 3",
)
def test_resume_does_not_erase_releases_from_the_ledger():
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
    )
    user = clients[0]
    for t in (1, 2):
        user.handle(Message("query", {"x": grid[t].numpy(), "t": t}))
    checkpoint = user.state_dict()  # what run_federated saves after round 2
    answered = 2
    for _ in range(2):  # crash after round 3's reply, resume, round 3 again
        user.load_state_dict(checkpoint)
        user.handle(Message("query", {"x": grid[3].numpy(), "t": 3}))
        answered += 1
    assert answered == 4  # the budget (3 epsilon) was exceeded ...
    assert user.privacy_ledger.spent(0)[0] >= answered * 1.0  # ... and is it recorded?


# ----------------------------------------------------------------------------------
# Privacy settings silently ignored by the non-private variants
# ----------------------------------------------------------------------------------
@pytest.mark.xfail(
    strict=True,
    reason="A non-private variant (gp-ucb, tgp, ata, moma) silently ignores user_budget "
    "and epsilon and sends raw rewards: a run the user meant to cap is not refused",
)
@pytest.mark.parametrize("algorithm", ["gp-ucb"])
def test_a_privacy_budget_on_a_non_private_variant_is_refused(algorithm):
    with pytest.raises(ValueError, match="user_budget"):
        run_federated(
            algorithm,
            FederationSetup(problem="ldp-synthetic", num_clients=2, seed=1),
            LDPBOSettings(num_rounds=4, user_budget=1.0, epsilon=0.5),
        )
