r"""Box domains (``candidates=None``: ``optimize_acqf`` on ``[0, 1]^d``) and float32 inputs.

References: the UCB step ``argmax_x mu(x) + beta sigma(x)`` of Alg. 1-3 line 4-6 (BoTorch's
``UpperConfidenceBound`` takes ``beta^2``); on a box the proposal is compared with a dense
21 x 21 grid search of the dense-GP UCB (:mod:`tests.helpers.ldp_dense`).
"""

from __future__ import annotations

import pytest
import torch

from botorch_fed.ldp import ATAGPUCB, GPUCB, TGPUCB, MoMAGPUCB, RewardModel
from tests.helpers import ldp_dense as dense
from tests.helpers.ldp_learners import DOMAIN, LEARNER_CLASSES, make, rewards

F64 = torch.float64
# the first UCB step on the prior is constant in x: BoTorch then picks its initial
# conditions at random and says so
pytestmark = pytest.mark.filterwarnings(
    "ignore:Unable to find non-zero acquisition function values"
)


def _box_run(cls, seed: int, rounds: int = 3) -> list[torch.Tensor]:
    extra = {"k": 2} if cls is MoMAGPUCB else {}
    learner = make(cls, candidates=None, dim=2, seed=seed, beta=1.0, **extra)
    proposals = []
    for y in rewards(rounds, seed=51):
        x = learner.propose()
        proposals.append(x)
        learner.observe(x, y)
    return proposals


@pytest.mark.parametrize("cls", LEARNER_CLASSES, ids=lambda c: c.name)
def test_box_proposals_are_reproducible_points_of_the_unit_square(cls):
    first, again = _box_run(cls, seed=5), _box_run(cls, seed=5)
    for x, x2 in zip(first, again, strict=True):
        assert x.shape == (1, 2) and x.dtype == F64
        assert bool(((x >= 0) & (x <= 1)).all())
        assert torch.equal(x, x2)
    if cls is MoMAGPUCB:  # k = 2: the second play repeats the epoch's point
        assert torch.equal(first[1], first[0])


def test_box_proposal_maximises_mu_plus_beta_sigma():
    lam, beta = 0.5, 3.0
    learner = make(
        GPUCB, candidates=None, dim=2, lam=lam, beta=beta, rewards=RewardModel(B=1.0, R=0.5),
        num_restarts=4, raw_samples=128, maxiter=60,
    )  # fmt: skip
    plays = torch.tensor([[0.2, 0.3], [0.8, 0.7], [0.25, 0.8], [0.6, 0.2]], dtype=F64)
    ys = torch.tensor([0.4, 1.0, -0.3, 0.2], dtype=F64)
    for x, y in zip(plays, ys, strict=True):
        learner.observe(x.unsqueeze(0), y)
    g = torch.linspace(0, 1, 21, dtype=F64)
    grid = torch.cartesian_prod(g, g)

    def ucb(X):
        mean, var, _ = dense.gp_posterior(plays, ys, X, lam)
        return mean + beta * var.clamp_min(0).sqrt()

    x = learner.propose()
    best_on_grid = float(ucb(grid).max())
    assert float(ucb(x)) >= best_on_grid - 1e-6
    # the check discriminates: maximising mu + sqrt(beta) sigma (passing beta where
    # BoTorch expects beta^2) lands where this UCB is clearly lower
    mean, var, _ = dense.gp_posterior(plays, ys, grid, lam)
    wrong = grid[int(torch.argmax(mean + beta**0.5 * var.clamp_min(0).sqrt()))].unsqueeze(0)
    assert float(ucb(wrong)) < best_on_grid - 0.05


@pytest.mark.parametrize("cls", LEARNER_CLASSES, ids=lambda c: c.name)
def test_float32_candidates_and_points_are_handled_in_float64(cls):
    C32 = DOMAIN.float()
    a = make(cls, candidates=C32, seed=2, beta_scale=0.1)
    b = make(cls, candidates=C32.double(), seed=2, beta_scale=0.1)  # the same values
    assert a.candidates.dtype == F64 and torch.equal(a.candidates, C32.double())
    for y in rewards(13, seed=52, scale=2.0):
        xa, xb = a.propose(), b.propose()
        assert xa.dtype == F64 and torch.equal(xa, xb)
        a.observe(xa.float(), y.float())  # a float32 point and reward
        b.observe(xb, y.float().double())
    assert a.X.dtype == F64 and a.y.dtype == F64
    assert torch.equal(a.X, b.X) and torch.equal(a.y, b.y)
    ma, va = a.model.mean_and_variance(C32)
    mb, vb = b.model.mean_and_variance(C32.double())
    assert ma.dtype == F64 and torch.equal(ma, mb) and torch.equal(va, vb)


def test_float32_points_on_a_box():
    learner = make(TGPUCB, candidates=None, dim=2, beta=1.0)
    x = learner.propose().float()
    learner.observe(x, torch.tensor(0.5, dtype=torch.float32))
    assert learner.X.dtype == F64 and torch.equal(learner.X, x.double())
    assert learner.propose().dtype == F64


def test_ata_on_a_box_keeps_played_points_in_its_dictionary():
    learner = make(ATAGPUCB, candidates=None, dim=2, beta=1.0, q=1e12)
    for y in rewards(3, seed=53):
        learner.observe(learner.propose(), y)
    D = learner.model.embedding.dictionary
    assert {tuple(r) for r in D.tolist()} == {tuple(r) for r in learner.X.tolist()}
