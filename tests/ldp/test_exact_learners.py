r"""GPUCB and (LDP-)TGP-UCB against the dense GP posterior of all their plays.

References ([LDP-BO], ``shared/papers/002``): eqs. (2)-(3) ``mu_t = k_t(x)' (K_t + lam I)^-1 y``,
``sigma_t^2 = k(x, x) - k_t(x)' (K_t + lam I)^-1 k_t(x)`` over all ``t`` plays (a repeated
point is a repeated row); ``gamma_t = 0.5 ln det(I + K_t / lam)`` of the plays; Alg. 2
(``b_t = B + R + L ln t``, ``y 1{|y| <= b_t}``, ``beta_t`` of line 5 with ``b_{t-1}`` and
``gamma_{t-1}``). The reference is :mod:`tests.helpers.ldp_dense` (``torch.linalg.solve`` and
``slogdet`` on the SE kernel of explicit differences).

Tolerances: as in ``tests/models/test_feature_gp.py``, ``10 n (cond(K_D) + cond(K_t + lam I))``
times ``eps(float64)``: the learner's Nystrom features amplify rounding by ``cond(K_D)``
(``K_D`` the distinct plays, ``~6e4`` on :data:`~tests.helpers.ldp_learners.DOMAIN`), the solves by
the condition number of the regularised Gram matrix, with ``n``-term sums.
"""

from __future__ import annotations

import math

import torch

from botorch_fed.ldp import GPUCB, TGPUCB, RewardModel
from tests.helpers import ldp_dense as dense
from tests.helpers.ldp_learners import DOMAIN, make, play, rewards
from tests.helpers.tolerances import assert_close, eps, sqrt_error

F64 = torch.float64
EPS = eps(F64)
#: roundings in one side's closed form for ``beta`` (a log, a sqrt, a handful of products
#: and sums of positive terms), each at most ``eps / 2`` relative to ``beta``
BETA_ROUNDINGS = 12


def _test_points() -> torch.Tensor:
    off_grid = torch.rand(15, 1, generator=torch.Generator().manual_seed(7), dtype=F64)
    return torch.cat([DOMAIN, off_grid])


def _factor(learner, lam: float) -> float:
    distinct = torch.unique(learner.X, dim=0)
    cond_D = float(torch.linalg.cond(dense.se(distinct, distinct)))
    cond_A = float(
        torch.linalg.cond(dense.se(learner.X, learner.X) + lam * torch.eye(learner.t, dtype=F64))
    )
    return 10 * learner.t * (cond_D + cond_A)


def _beta_tolerance(learner, lam: float, expected: float, d_beta_d_gamma: float) -> float:
    r"""``|beta - expected|`` allowed when ``beta`` takes the learner's ``gamma`` (the chain
    rule through its Nystrom posterior) and ``expected`` the dense ``slogdet``: the two
    ``gamma`` differ by at most ``_factor * eps * max(gamma, 1)`` (what
    ``test_gpucb_gamma_is_the_information_gain_of_the_plays`` allows), which moves ``beta`` by
    ``d beta / d gamma`` times that; each side's formula adds ``BETA_ROUNDINGS * eps / 2``
    relative."""
    gamma_err = _factor(learner, lam) * EPS * max(learner.gamma, 1.0)
    return d_beta_d_gamma * gamma_err + BETA_ROUNDINGS * EPS * abs(expected)


def _assert_model_is_dense_gp(learner, targets: torch.Tensor, lam: float) -> None:
    Xs = _test_points()
    mean, var, _ = dense.gp_posterior(learner.X, targets, Xs, lam)
    f = _factor(learner, lam)
    m, v = learner.model.mean_and_variance(Xs)
    scale = max(1.0, float(targets.abs().max()))
    assert_close(m, mean, dtype=F64, factor=f, scale=scale, msg="posterior mean")
    assert_close(v, var, dtype=F64, factor=f, scale=1.0, msg="posterior variance")
    # the same through BoTorch's posterior (what optimize_acqf sees)
    post = learner.model.posterior(Xs.unsqueeze(0))
    assert_close(post.mean.reshape(-1), mean, dtype=F64, factor=f, scale=scale, msg="posterior()")
    assert_close(post.variance.reshape(-1), var, dtype=F64, factor=f, scale=1.0)


def test_gpucb_model_is_the_exact_gp_posterior_of_all_plays():
    lam = 0.3
    learner = make(GPUCB, rewards=RewardModel(B=1.0, R=0.5), lam=lam, beta=0.5)
    ys = rewards(24, seed=1)
    play(learner, ys[:8], points=[3, 7, 3, 3, 0, 9, 7, 5])  # repeated points
    play(learner, ys[8:])  # then its own proposals
    # the history: every play in order, every reward as received
    assert learner.t == 24 and learner.X.shape == (24, 1)
    assert torch.equal(learner.X[:8], DOMAIN[[3, 7, 3, 3, 0, 9, 7, 5]])
    assert torch.equal(learner.y, ys)
    assert len(torch.unique(learner.X, dim=0)) < 24
    _assert_model_is_dense_gp(learner, ys, lam)


def test_gpucb_gamma_is_the_information_gain_of_the_plays():
    lam = 0.5
    learner = make(GPUCB, rewards=RewardModel(B=1.0, R=0.5), lam=lam, beta=1.0)
    gammas = []
    for y in rewards(20, seed=3):
        learner.observe(learner.propose(), y)
        gammas.append(learner.gamma)
    play(learner, rewards(5, seed=4), points=[2, 2, 8, 2, 0])
    f = _factor(learner, lam)
    expected = dense.information_gain(learner.X, lam)
    assert_close(torch.tensor(learner.gamma), torch.tensor(expected), dtype=F64, factor=f)
    # and along the way (chain rule: gamma_t = gamma_{t-1} + 0.5 ln(1 + sigma_{t-1}^2(x_t) / lam))
    for t in [1, 5, 13, 20]:
        ref = dense.information_gain(learner.X[:t], lam)
        assert_close(torch.tensor(gammas[t - 1]), torch.tensor(ref), dtype=F64, factor=f)


def test_gpucb_beta_is_the_igp_ucb_formula():
    B, R, lam, delta = 1.2, 0.4, 0.5, 0.05
    learner = make(GPUCB, rewards=RewardModel(B=B, R=R), lam=lam, delta=delta, beta_scale=0.7)
    play(learner, rewards(12, seed=5))
    gamma = dense.information_gain(learner.X, lam)
    expected = 0.7 * (B + R / math.sqrt(lam) * math.sqrt(2 * (gamma + 1 + math.log(1 / delta))))
    slope = 0.7 * R / math.sqrt(2 * lam * (gamma + 1 + math.log(1 / delta)))  # d beta / d gamma
    assert abs(learner.beta() - expected) <= _beta_tolerance(learner, lam, expected, slope)
    # unbounded (heavy-tailed) noise: R -> sqrt(E eta^2)
    heavy = make(GPUCB, rewards=RewardModel(B=B, noise_moment=2.0), lam=lam, delta=delta)
    expected = B + math.sqrt(2.0 / lam) * math.sqrt(2 * (1 + math.log(1 / delta)))
    assert math.isclose(heavy.beta(), expected, rel_tol=1e-12)
    # a constant beta overrides the formula
    assert make(GPUCB, rewards=RewardModel(B=B, R=R), beta=0.25, beta_scale=9.0).beta() == 0.25


def _straddle(ys: torch.Tensor, b: torch.Tensor, margin: float) -> torch.Tensor:
    r"""``ys`` with rewards placed just inside ``b_t`` but outside ``b_{t-1}`` (t = 2, 4) and
    just outside ``b_t`` but inside ``b_{t+1}`` (t = 7, 10), so that the truncation
    point's play index matters (0-based entries 1, 3, 6, 9)."""
    ys = ys.clone()
    ys[1], ys[3] = b[1] - margin, -(b[3] - margin)
    ys[6], ys[9] = b[6] + margin, -(b[9] + margin)
    for i in (1, 3):
        assert b[i - 1] < ys[i].abs() <= b[i]
    for i in (6, 9):
        assert b[i] < ys[i].abs() <= b[i + 1]
    return ys


def test_private_tgp_truncates_at_b_t_of_the_play_index():
    B, R, eps, lam = 1.0, 0.5, 2.0, 0.5
    L = 2 * (B + R) / eps  # Curator 1's scale, 1.5
    learner = make(TGPUCB, rewards=RewardModel(B=B, R=R, epsilon=eps), lam=lam, beta=1.0)
    b = torch.tensor([B + R + L * math.log(t) for t in range(1, 31)], dtype=F64)  # Alg. 2
    ys = _straddle(rewards(30, seed=11, scale=2.5), b, margin=0.05)
    play(learner, ys[:6], points=[1, 1, 6, 1, 8, 6])
    play(learner, ys[6:])
    truncated = torch.where(ys.abs() <= b, ys, torch.zeros_like(ys))
    dropped = int((ys.abs() > b).sum())
    # the data exercise both sides: some rewards dropped, some kept only because b_t
    # grows with t (|y_t| > b_1 = B + R but <= b_t)
    assert dropped >= 3
    assert bool(((ys.abs() > B + R) & (ys.abs() <= b)).any())
    assert learner.truncated == dropped
    assert torch.equal(learner.y, ys)  # the history keeps the rewards as received
    _assert_model_is_dense_gp(learner, truncated, lam)


def test_non_private_tgp_truncates_at_sqrt_v_t_to_the_quarter():
    B, c, lam, scale = 1.0, 2.0, 1.0, 0.8
    learner = make(
        TGPUCB, rewards=RewardModel(B=B, noise_moment=c), lam=lam, beta=1.0, truncation_scale=scale
    )
    v = B**2 + c  # the rewards' second moment
    b = torch.tensor([scale * math.sqrt(v) * t**0.25 for t in range(1, 26)], dtype=F64)
    ys = _straddle(rewards(25, seed=12, scale=1.6), b, margin=0.01)
    play(learner, ys)
    truncated = torch.where(ys.abs() <= b, ys, torch.zeros_like(ys))
    dropped = int((ys.abs() > b).sum())
    assert dropped >= 2 and bool(((ys.abs() > b[0]) & (ys.abs() <= b)).any())
    assert learner.truncated == dropped
    _assert_model_is_dense_gp(learner, truncated, lam)


def test_tgp_beta_is_alg2_line5_with_b_and_gamma_of_the_previous_round():
    B, R, eps, lam, delta = 1.0, 0.5, 2.0, 2.0, 0.1
    L = 2 * (B + R) / eps
    K = B**2 + R**2 + 2 * L**2  # Alg. 2 line 2
    learner = make(
        TGPUCB, rewards=RewardModel(B=B, R=R, epsilon=eps), lam=lam, delta=delta, beta_scale=0.3
    )
    play(learner, rewards(9, seed=13))
    t = learner.t + 1  # the next play
    b_prev = B + R + L * math.log(t - 1)  # Alg. 2 line 4
    gamma = dense.information_gain(learner.X, lam)  # gamma_{t-1}
    beta_t = (
        B
        + 2 * math.sqrt(2) / math.sqrt(lam) * b_prev * math.sqrt(gamma + math.log(1 / delta))
        + math.sqrt(K * (math.log(t - 1) + 1)) / math.sqrt(lam)
    )
    slope = 0.3 * math.sqrt(2) * b_prev / math.sqrt(lam * (gamma + math.log(1 / delta)))
    assert abs(learner.beta() - 0.3 * beta_t) <= _beta_tolerance(learner, lam, 0.3 * beta_t, slope)
    # non-private: the truncation-bias term sqrt(sum_{tau < t} (v / b_tau)^2) / sqrt(lam)
    v = B**2 + 0.7
    heavy = make(TGPUCB, rewards=RewardModel(B=B, noise_moment=0.7), lam=lam, delta=delta)
    play(heavy, rewards(6, seed=14))
    b = [math.sqrt(v) * tau**0.25 for tau in range(1, 7)]
    bias = math.sqrt(sum((v / b_tau) ** 2 for b_tau in b))
    gamma = dense.information_gain(heavy.X, lam)
    expected = (
        B
        + 2 * math.sqrt(2) / math.sqrt(lam) * b[-1] * math.sqrt(gamma + math.log(1 / delta))
        + bias / math.sqrt(lam)
    )
    slope = math.sqrt(2) * b[-1] / math.sqrt(lam * (gamma + math.log(1 / delta)))
    assert abs(heavy.beta() - expected) <= _beta_tolerance(heavy, lam, expected, slope)


def test_ucb_step_on_the_finite_domain_is_the_argmax_of_mu_plus_beta_sigma():
    lam, beta = 0.5, 2.0
    learner = make(GPUCB, rewards=RewardModel(B=1.0, R=0.5), lam=lam, beta=beta)
    ys = rewards(15, seed=15)
    for y in ys:
        mean, var, _ = dense.gp_posterior(learner.X, learner.y, DOMAIN, lam)
        ucb = mean + beta * var.clamp_min(0).sqrt()
        x = learner.propose()
        assert x.shape == (1, 1) and x.dtype == F64
        top = ucb.max()
        # the proposal is a maximiser of the dense UCB up to rounding: the learner's UCB is
        # within e = err(mean) + beta err(sigma) of the dense one at every point (mean: the
        # _factor bound; sigma: the variance's bound through the square root), so its pick
        # is within 2 e of the dense maximum, plus the learner's tie tolerance (1e-12 of
        # max |ucb|, learners.py)
        tie = 1e-12 * max(1.0, float(ucb.abs().max()))
        bound = tie
        if learner.t:
            f = _factor(learner, lam)
            scale = max(1.0, float(learner.y.abs().max()))
            e = f * EPS * scale + beta * sqrt_error(var.clamp_min(0), f * EPS)
            bound += 2 * float(e.max())
        i = int((DOMAIN == x).all(-1).nonzero()[0])
        assert float(top - ucb[i]) <= bound
        learner.observe(x, y)
