r"""(LDP-)ATA-GP-UCB (Alg. 1) against a brute-force reimplementation.

References ([LDP-BO], ``shared/papers/002``): Alg. 1 lines 6-13 (a fresh Nystrom
embedding of the plays every round, the rows ``u_i'`` of ``V^{-1/2} Phi'``, the
feature-adaptive truncation ``r_i = sum_tau u_{i,tau} y_tau 1{|u_{i,tau} y_tau| <= b}``,
``theta = V^{-1/2} r``, ``mu = phi' theta``, ``sigma^2 = k - phi' phi + lam phi' V^-1 phi``);
Alg. 4 (each play enters the dictionary with probability ``min(q sigma~^2_{t-1}(x_i), 1)``);
Thm. 2 (``b = sqrt(v / ln(4 m_t T / delta))``, ``beta_{t+1}``). The learner truncates every
past payoff at the current round's ``b`` (its ``m_t``; see its docstring) and the
brute force does the same. The reference features are
:func:`tests.helpers.ldp_dense.nystrom_features` on the learner's own dictionary (read
from ``learner.model.embedding.dictionary``); the truncation loop is
:func:`tests.helpers.ldp_dense.tofu`.
"""

from __future__ import annotations

import math

import torch

from botorch_fed.ldp import ATAGPUCB, RewardModel
from botorch_fed.ldp import parameters as P
from botorch_fed.models import ata_estimate
from tests.helpers import ldp_dense as dense
from tests.helpers.ldp_learners import DOMAIN, kernel, make, play, rewards
from tests.helpers.tolerances import assert_close, eps, reordering_factor

F64 = torch.float64
EPS = eps(F64)
PRIVATE = RewardModel(B=1.0, R=0.5, epsilon=2.0)
V_PRIVATE = 1.0 + 0.25 + 8 * 1.5**2 / 4.0  # Thm. 2's v = B^2 + R^2 + 8 (B + R)^2 / eps^2


def _rows(X: torch.Tensor) -> set:
    return {tuple(r) for r in X.tolist()}


def test_full_dictionary_without_truncation_is_the_exact_gp():
    lam = 0.5
    learner = make(ATAGPUCB, lam=lam, beta=1.0, q=1e12, truncation_scale=1e12)
    ys = rewards(22, seed=21, scale=2.0)
    play(learner, ys[:7], points=[4, 4, 0, 9, 4, 0, 2])
    play(learner, ys[7:])
    # q sigma^2 >= 1 at every play: the dictionary is every distinct point played
    D = learner.model.embedding.dictionary
    assert len(D) == len(_rows(D)) and _rows(D) == _rows(learner.X)
    assert learner.truncated == 0
    Xs = torch.cat(
        [DOMAIN, torch.rand(12, 1, generator=torch.Generator().manual_seed(3), dtype=F64)]
    )
    mean, var, cond_A = dense.gp_posterior(learner.X, ys, Xs, lam)
    f = 10 * learner.t * (float(torch.linalg.cond(dense.se(D, D))) + cond_A)
    m, v = learner.model.mean_and_variance(Xs)
    assert_close(m, mean, dtype=F64, factor=f, scale=float(ys.abs().max()), msg="ATA mean")
    assert_close(v, var, dtype=F64, factor=f, scale=1.0, msg="ATA variance")


def _check_alg1(learner, horizon: int, delta: float, lam: float, scale: float) -> int:
    r"""Alg. 1 lines 8-13 by brute force on the learner's dictionary; returns the number
    of truncated terms."""
    D = learner.model.embedding.dictionary
    m = len(D)
    assert m >= 1
    Phi = dense.nystrom_features(D, learner.X)  # t x m, one row per play
    b = scale * math.sqrt(V_PRIVATE / math.log(4 * m * horizon / delta))
    theta, dropped = dense.tofu(Phi, learner.y, lam, torch.full((learner.t,), b, dtype=F64))
    # no term within rounding of the threshold (the comparison is then well defined)
    V = Phi.mT @ Phi + lam * torch.eye(m, dtype=F64)
    s, Q = torch.linalg.eigh(V)
    terms = ((Q @ torch.diag(s**-0.5) @ Q.mT) @ Phi.mT) * learner.y
    assert float(((terms.abs() - b).abs()).min()) > 1e-8 * b
    cond_D = float(torch.linalg.cond(dense.se(D, D)))
    f = 10 * learner.t * (cond_D + float(torch.linalg.cond(V)))
    scale_theta = max(1.0, float(theta.abs().max()))
    assert_close(learner.model.theta, theta, dtype=F64, factor=f, scale=scale_theta, msg="theta")
    assert learner.truncated == dropped
    # lines 12-13 at points on and off the domain
    Xs = torch.cat(
        [DOMAIN, torch.rand(9, 1, generator=torch.Generator().manual_seed(5), dtype=F64)]
    )
    phi = dense.nystrom_features(D, Xs)
    mean = phi @ theta
    var = 1.0 - (phi**2).sum(-1) + lam * (phi * torch.linalg.solve(V, phi.mT).mT).sum(-1)
    mu, sigma2 = learner.model.mean_and_variance(Xs)
    assert_close(mu, mean, dtype=F64, factor=f, scale=scale_theta, msg="mu~")
    assert_close(sigma2, var, dtype=F64, factor=f, scale=1.0, msg="sigma~^2")
    return dropped


def test_theta_is_alg1_truncation_on_the_learners_dictionary():
    horizon, delta, lam = 200, 0.1, 0.5
    # q = 2: a strict sub-dictionary (Nystrom approximation), q = 1e12: all points
    for q, seed in [(2.0, 22), (1e12, 23)]:
        learner = make(ATAGPUCB, horizon=horizon, delta=delta, lam=lam, beta=1.5, q=q, seed=seed)
        ys = rewards(40, seed=seed, scale=3.0)
        dropped = []
        for t, y in enumerate(ys, start=1):
            learner.observe(learner.propose(), y)
            if t in (10, 25, 40):
                dropped.append(_check_alg1(learner, horizon, delta, lam, 1.0))
        assert max(dropped) > 0  # the truncation was exercised
        D = learner.model.embedding.dictionary
        if q == 2.0:
            assert len(D) < len(_rows(learner.X))
        else:
            assert _rows(D) == _rows(learner.X)
    # truncation_scale multiplies b
    learner = make(
        ATAGPUCB, horizon=horizon, delta=delta, lam=lam, beta=1.5, q=3.0, truncation_scale=0.3
    )
    play(learner, rewards(15, seed=24, scale=3.0))
    _check_alg1(learner, horizon, delta, lam, 0.3)


def test_dictionary_is_resampled_every_round_with_probability_min_q_sigma2_1():
    r"""Two plays of one point with ``q = 1``, ``lam = 1/4``: round 1 samples it with
    probability ``min(q k(x, x), 1) = 1``; round 2 resamples *both* plays, each with
    ``min(q sigma~_1^2(x), 1) = lam / (1 + lam) = 0.2``, so the point is in the dictionary
    with probability ``1 - 0.8^2 = 0.36``. Alternatives: the round-1 dictionary kept: 1;
    the standard deviation for the variance: ``1 - (1 - 0.447)^2 = 0.69``; one draw for
    the point instead of one per play: 0.2."""
    x, k = DOMAIN[3:4], kernel()
    n, hits = 200, 0
    for seed in range(n):
        learner = ATAGPUCB(
            k, 1, 100, PRIVATE, lam=0.25, q=1.0, beta=1.0, seed=seed, candidates=DOMAIN
        )
        learner.observe(x, 0.5)
        assert learner.model.embedding.dim == 1
        learner.observe(x, -0.2)
        hits += learner.model.embedding.dim
    sd = math.sqrt(0.36 * 0.64 / n)  # 0.034
    assert abs(hits / n - 0.36) < 4 * sd, hits / n


def test_tiny_rate_leaves_the_dictionary_empty_and_the_model_the_prior():
    learner = make(ATAGPUCB, q=1e-12, beta=1.0)
    play(learner, rewards(8, seed=25))
    assert learner.model.embedding.dim == 0
    mean, var = learner.model.mean_and_variance(DOMAIN)
    # exact: no features (empty sums are 0) and k(x, x) = exp(-0) = 1
    assert torch.equal(mean, torch.zeros(10, dtype=F64))
    assert torch.equal(var, torch.ones(10, dtype=F64))


def test_ata_beta_is_thm2_with_the_current_dictionary_size():
    B, R, eps, lam, delta, horizon, acc = 1.0, 0.5, 2.0, 0.5, 0.05, 300, 0.4
    learner = make(
        ATAGPUCB, horizon=horizon, lam=lam, delta=delta, accuracy=acc, q=5.0, beta_scale=0.2,
        rewards=RewardModel(B=B, R=R, epsilon=eps),
    )  # fmt: skip
    v = B**2 + R**2 + 8 * (B + R) ** 2 / eps**2
    # no dictionary yet: m = 0
    assert math.isclose(learner.beta(), 0.2 * B * (1 + 1 / math.sqrt(1 - acc)), rel_tol=1e-12)
    play(learner, rewards(12, seed=26))
    m = learner.model.embedding.dim
    assert m >= 2
    log = math.log(4 * m * horizon / delta)
    expected = B * (1 + 1 / math.sqrt(1 - acc)) + 4 * math.sqrt(log * v * m / lam)
    assert math.isclose(learner.beta(), 0.2 * expected, rel_tol=1e-12)
    # the default rate is Thm. 2's q
    rho = (1 + acc) / (1 - acc)
    assert math.isclose(
        make(ATAGPUCB, horizon=horizon, delta=delta, accuracy=acc).q,
        6 * rho * math.log(4 * horizon / delta) / acc**2,
        rel_tol=1e-12,
    )


def test_ata_truncates_every_payoff_at_the_current_b_t():
    r"""TOFU truncates all payoffs at round t's threshold b_t (m_t); Alg. 1 line 10's
    ``b_tau`` differs only through ``m_tau`` (documented in ATAGPUCB)."""
    rw = PRIVATE
    learner = make(ATAGPUCB, q=3.0, seed=4)
    g = torch.Generator().manual_seed(4)
    dims = []
    for _ in range(20):
        learner.observe(learner.propose(), float(2 * torch.randn(1, generator=g, dtype=F64)))
        dims.append(learner.model.embedding.dim)
    Phi = learner.model.embedding(learner.X)
    m = dims[-1]
    b = torch.full_like(
        learner.y, P.ata_truncation(rw.reward_second_moment, m, learner.horizon, learner.delta)
    )
    expected, _ = ata_estimate(Phi, learner.y, learner.lam, b)
    # the learner's features are those of its distinct points indexed by play, here they
    # are computed for all t plays at once: the same features in another GEMM, which differ
    # by reordering of m-term sums times ||W|| = ||K_D^{-1/2}|| <= sqrt(cond(K_D)) (k <= 1);
    # the estimate's solve with V amplifies that by cond(V)
    D = learner.model.embedding.dictionary
    V = Phi.mT @ Phi + learner.lam * torch.eye(m, dtype=F64)
    amplification = float(torch.linalg.cond(V)) * float(torch.linalg.cond(dense.se(D, D))) ** 0.5
    f = reordering_factor(learner.t, amplification)
    # no term within rounding of b, so the truncation is the same decision on both sides
    s, Q = torch.linalg.eigh(V)
    terms = ((Q @ torch.diag(s**-0.5) @ Q.mT) @ Phi.mT) * learner.y
    margin = float((terms.abs() - b).abs().min())
    assert margin > f * EPS * float(terms.abs().max())
    assert_close(learner.model.theta, expected, dtype=F64, factor=f, msg="theta")
