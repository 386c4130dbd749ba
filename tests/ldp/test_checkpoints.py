r"""Checkpoints: ``state_dict`` / ``load_state_dict`` resume a learner exactly.

A learner plays ~40 rounds, is saved, a fresh learner (same arguments) loads the state,
and both continue for 20 rounds on identical rewards: the proposals must be identical
and the surrogates agree (the rebuilt surrogate is computed from the restored plays,
rewards, dictionary and ``k*``: GP-UCB, TGP and ATA replay the same operations; MoMA
solves the same ``V theta = Phi' y`` with one ridge Cholesky solve instead of the
median-of-means pass's triangular solves with ``k`` right-hand sides, so ``theta`` agrees
to reordering, ``reordering_factor(t, cond(V))`` eps). MoMA is also saved
in the middle of an epoch; ATA's and MoMA's dictionaries must come back. A loaded
state that contradicts itself (a ``gamma`` that is not the plays') and a
``FeatureSpaceGP``'s ``state_dict`` either round-trip or are refused.
"""

from __future__ import annotations

import copy

import pytest
import torch
from botorch.exceptions.errors import UnsupportedError

from botorch_fed.ldp import ATAGPUCB, GPUCB, TGPUCB, MoMAGPUCB
from botorch_fed.models import FeatureSpaceGP, NystromEmbedding
from tests.helpers.ldp_learners import DOMAIN, kernel, make, rewards
from tests.helpers.tolerances import assert_close, reordering_factor

F64 = torch.float64

CASES = [
    pytest.param(GPUCB, {}, 40, id="gp-ucb"),
    pytest.param(TGPUCB, {}, 40, id="tgp"),
    pytest.param(ATAGPUCB, {"q": 3.0}, 40, id="ata"),
    pytest.param(MoMAGPUCB, {"q": 3.0}, 40, id="moma-epoch-end"),
    pytest.param(MoMAGPUCB, {"q": 3.0}, 42, id="moma-mid-epoch"),
]


@pytest.mark.parametrize("cls, kwargs, saved_at", CASES)
def test_resume_from_a_checkpoint_is_exact(cls, kwargs, saved_at):
    args = dict(horizon=100, lam=0.5, beta_scale=0.05, seed=3, **kwargs)
    ys = rewards(saved_at + 20, seed=41, scale=2.0)
    learner = make(cls, **args)
    for y in ys[:saved_at]:
        learner.observe(learner.propose(), y)
    state = learner.state_dict()
    if cls is TGPUCB:
        assert learner.truncated > 0  # the truncation is replayed too
    resumed = make(cls, **args)
    resumed.load_state_dict(state)
    assert resumed.t == learner.t == saved_at
    assert torch.equal(resumed.X, learner.X) and torch.equal(resumed.y, learner.y)
    assert resumed.gamma == learner.gamma
    if cls in (ATAGPUCB, MoMAGPUCB):
        assert torch.equal(resumed.model.embedding.dictionary, learner.model.embedding.dictionary)
    if cls is MoMAGPUCB:
        assert resumed.chosen == learner.chosen and resumed.epochs == learner.epochs
    if cls is TGPUCB:
        assert resumed.truncated == learner.truncated
    for y in ys[saved_at:]:
        x, x_resumed = learner.propose(), resumed.propose()
        assert torch.equal(x, x_resumed)
        learner.observe(x, y)
        resumed.observe(x_resumed, y)
        mean, var = learner.model.mean_and_variance(DOMAIN)
        mean_resumed, var_resumed = resumed.model.mean_and_variance(DOMAIN)
        # both surrogates hold the same features and gram (same dictionary, same plays), so
        # only theta can differ: two solves of V theta = Phi' y, sums of at most t terms,
        # amplified by cond(V); mu = phi' theta with ||phi|| <= 1 (a Nystrom projection of
        # k(x, .), k(x, x) = 1), so |d mu| <= ||d theta|| <= 2 t cond(V) eps ||theta||.
        # The variance depends on the gram only: the same bound with scale k(x, x) = 1
        m = learner.model.embedding.dim
        V = learner.model.gram + args["lam"] * torch.eye(m, dtype=F64)
        f = reordering_factor(learner.t, torch.linalg.cond(V) if m else 1.0)
        theta_norm = float(learner.model.theta.norm())
        assert_close(mean_resumed, mean, dtype=F64, factor=f, scale=theta_norm, msg="mean")
        assert_close(var_resumed, var, dtype=F64, factor=f, scale=1.0, msg="variance")
    assert torch.equal(resumed.X, learner.X)


def test_state_dict_is_a_snapshot_and_rejects_foreign_states():
    learner = make(GPUCB, lam=0.5, beta=1.0)
    learner.observe(DOMAIN[[3]], 0.5)
    state = learner.state_dict()
    learner.observe(DOMAIN[[4]], 0.2)
    assert state["X"].shape == (1, 1) and state["y"].tolist() == [0.5]
    fresh = make(GPUCB, lam=0.5, beta=1.0)
    with pytest.raises(ValueError, match="keys"):
        fresh.load_state_dict({**state, "extra": 1})
    bad = dict(state)
    bad["y"] = torch.zeros(3, dtype=F64)
    with pytest.raises(ValueError, match="`y`"):
        fresh.load_state_dict(bad)


def test_feature_space_gp_state_dict_round_trips_or_refuses():
    g = torch.Generator().manual_seed(0)
    X = torch.rand(12, 1, generator=g, dtype=F64)
    y = torch.sin(6 * X).squeeze(-1)
    emb = NystromEmbedding(kernel(), X[:6])
    source = FeatureSpaceGP.ridge(emb, X, y, 0.1)
    target = FeatureSpaceGP.ridge(emb, X, -y, 0.1)
    try:
        target.load_state_dict(source.state_dict())
    except (RuntimeError, NotImplementedError, ValueError, UnsupportedError):
        return
    assert torch.allclose(target.posterior(X).mean, source.posterior(X).mean)


def test_loaded_gamma_agrees_with_the_plays_or_raises():
    learner = make(GPUCB)
    for y in torch.linspace(-1, 1, 6, dtype=F64):
        learner.observe(learner.propose(), y)
    state = copy.deepcopy(learner.state_dict())
    state["gamma"] = learner.gamma + 100.0
    fresh = make(GPUCB)
    try:
        fresh.load_state_dict(state)
    except ValueError:
        return
    assert fresh.gamma == pytest.approx(learner.gamma, rel=1e-9)
