r"""(LDP-)MoMA-GP-UCB (Alg. 3) against a brute-force median of means.

References ([LDP-BO], ``shared/papers/002``): Alg. 3 lines 3-14 (epochs of ``k`` plays of
one point, ``N = floor(T / k)`` epochs; at the end of epoch ``n`` the Nystrom embedding of
the ``n`` epoch points, ``V_n = Phi_n' Phi_n + lam I`` with one row per *epoch*,
``theta_{n,j} = V_n^-1 sum_i y_{i,j} phi(x_i)``, ``r_j = median_{s != j} ||theta_{n,j} -
theta_{n,s}||_{V_n}``, ``k* = argmin r_j``, ``mu = phi' theta_{n,k*}``, ``sigma^2 = k - phi' phi
+ lam phi' V_n^-1 phi``); Thm. 4 / Cor. 1 (``beta_{n+1}`` with ``m_n`` and ``c``). The brute
force (:func:`tests.helpers.ldp_dense.median_of_means`) takes the ``V``-norms as
``sqrt(z' V z)`` and the statistical median; the tests use ``k = 4`` (three distances:
the median is the middle one, no convention involved).
"""

from __future__ import annotations

import math
import warnings

import pytest
import torch

from botorch_fed.ldp import MoMAGPUCB, RewardModel
from tests.helpers import ldp_dense as dense
from tests.helpers.ldp_learners import DOMAIN, PRIVATE, kernel, make, rewards
from tests.helpers.tolerances import assert_close

F64 = torch.float64
K = 4


def _run_epochs(learner, ys: torch.Tensor, check=None) -> None:
    r"""Play ``ys`` through propose/observe; ``check(learner)`` after every epoch."""
    for y in ys:
        learner.observe(learner.propose(), y)
        if check is not None and learner.t % learner.k == 0:
            check(learner)


def _check_median_of_means(learner, lam: float, corrupted: int | None = None) -> None:
    n, k = learner.epochs, learner.k
    X = learner.X[: n * k].reshape(n, k, -1)
    assert bool((X == X[:, :1]).all())  # one point per epoch
    points, Y = X[:, 0], learner.y[: n * k].reshape(n, k)
    D = learner.model.embedding.dictionary
    Phi = dense.nystrom_features(D, points)  # one row per epoch
    theta, k_star, r = dense.median_of_means(Phi, Y, lam)
    # a well-defined argmin: values near the minimum are exact ties (with k = 4 the two
    # ends of a pair that are each other's middle distance share r_a = r_c = d(a, c)),
    # which go to the first index (documented; the brute force's min() does the same)
    near = [j for j in range(k) if r[j] - r[k_star] <= 1e-8 * max(1.0, r[k_star])]
    assert all(r[j] == r[k_star] for j in near) and k_star == near[0]
    assert learner.chosen[-1] == k_star
    if corrupted is not None:
        assert k_star != corrupted
    V = Phi.mT @ Phi + lam * torch.eye(len(D), dtype=F64)
    cond_D = float(torch.linalg.cond(dense.se(D, D)))
    f = 10 * n * k * (cond_D + float(torch.linalg.cond(V)))
    scale = max(1.0, float(theta.abs().max()))
    assert_close(learner.model.theta, theta, dtype=F64, factor=f, scale=scale, msg="theta_{n,k*}")
    Xs = torch.cat(
        [DOMAIN, torch.rand(7, 1, generator=torch.Generator().manual_seed(8), dtype=F64)]
    )
    phi = dense.nystrom_features(D, Xs)
    var = 1.0 - (phi**2).sum(-1) + lam * (phi * torch.linalg.solve(V, phi.mT).mT).sum(-1)
    mu, sigma2 = learner.model.mean_and_variance(Xs)
    assert_close(mu, phi @ theta, dtype=F64, factor=f, scale=scale, msg="mu~_n")
    assert_close(sigma2, var, dtype=F64, factor=f, scale=1.0, msg="sigma~_n^2")


def test_one_point_k_times_per_epoch_and_the_surrogate_changes_only_at_epoch_ends():
    learner = make(MoMAGPUCB, k=K, lam=0.5, beta=1.0)
    ys = rewards(5 * K, seed=31, scale=2.0)
    epoch_points = []
    for i, y in enumerate(ys):
        x = learner.propose()
        if i % K == 0:
            epoch_points.append(x)
        else:
            assert torch.equal(x, epoch_points[-1])  # the epoch's point again
        before = learner.model
        mean_before = before.mean_and_variance(DOMAIN)[0]
        learner.observe(x, y)
        if learner.t % K:
            assert learner.model is before  # no update inside an epoch
        else:
            assert learner.model is not before
            assert not torch.equal(learner.model.mean_and_variance(DOMAIN)[0], mean_before)
    assert learner.epochs == 5 and len(learner.chosen) == 5
    assert torch.equal(learner.X[::K], torch.cat(epoch_points))


def test_theta_is_the_median_of_means_choice_on_the_learners_dictionary():
    lam = 0.5
    for q, seed in [(50.0, 32), (1.5, 33)]:  # full and (eventually) partial dictionaries
        learner = make(MoMAGPUCB, k=K, q=q, lam=lam, beta=1.0, seed=seed)
        _run_epochs(
            learner,
            rewards(8 * K, seed=seed, scale=2.0),
            lambda lr: _check_median_of_means(lr, lam),
        )
        assert learner.epochs == 8
    # the pick varies with the data (the test is not trivially k* = 0)
    assert len(set(learner.chosen)) > 1


def test_a_corrupted_column_is_never_chosen():
    lam, bad = 0.5, 2
    ys = rewards(10 * K, seed=34, scale=1.0)
    ys[bad::K] += 1000.0  # the bad-th play of every epoch is an outlier
    learner = make(MoMAGPUCB, k=K, lam=lam, beta=1.0)
    _run_epochs(learner, ys, lambda lr: _check_median_of_means(lr, lam, corrupted=bad))
    assert len(learner.chosen) == 10 and bad not in learner.chosen
    # the outliers did not reach the surrogate
    assert float(learner.model.mean_and_variance(DOMAIN)[0].abs().max()) < 10.0


def test_leftover_plays_do_not_change_the_surrogate():
    learner = make(MoMAGPUCB, horizon=10, k=K, lam=0.5, beta=1.0)  # N = floor(10 / 4) = 2
    ys = rewards(10, seed=35, scale=2.0)
    _run_epochs(learner, ys[:8])
    model = learner.model
    mean, var = model.mean_and_variance(DOMAIN)
    point = learner.propose()
    for y in ys[8:]:
        x = learner.propose()
        assert torch.equal(x, point)
        learner.observe(x, y)
    assert learner.t == 10 and learner.epochs == 2 and len(learner.chosen) == 2
    assert learner.model is model
    m2, v2 = learner.model.mean_and_variance(DOMAIN)
    assert torch.equal(m2, mean) and torch.equal(v2, var)


def test_one_play_per_epoch_is_the_exact_gp():
    r"""``k = 1``: one estimate, the ridge estimate on the epoch points; with every point in
    the dictionary, the exact GP posterior of the plays (eqs. (2)-(3))."""
    lam = 0.5
    learner = make(MoMAGPUCB, k=1, q=1e12, lam=lam, beta=1.0)
    _run_epochs(learner, rewards(9, seed=38, scale=2.0))
    assert learner.chosen == [0] * 9
    mean, var, cond_A = dense.gp_posterior(learner.X, learner.y, DOMAIN, lam)
    D = learner.model.embedding.dictionary
    f = 10 * learner.t * (float(torch.linalg.cond(dense.se(D, D))) + cond_A)
    m, v = learner.model.mean_and_variance(DOMAIN)
    assert_close(m, mean, dtype=F64, factor=f, scale=float(learner.y.abs().max()))
    assert_close(v, var, dtype=F64, factor=f, scale=1.0)


def test_observing_another_point_inside_an_epoch_raises():
    learner = make(MoMAGPUCB, k=K, beta=1.0)
    x = learner.propose()
    learner.observe(x, 0.3)
    other = DOMAIN[[0]] if not torch.equal(x, DOMAIN[[0]]) else DOMAIN[[1]]
    with pytest.raises(ValueError, match="`x`"):
        learner.observe(other, 0.1)
    assert learner.t == 1  # nothing recorded
    learner.observe(x, 0.1)


def test_the_first_play_of_an_epoch_fixes_the_epochs_point():
    learner = make(MoMAGPUCB, k=K, beta=1.0)
    x = learner.propose()
    other = DOMAIN[[0]] if not torch.equal(x, DOMAIN[[0]]) else DOMAIN[[1]]
    try:
        learner.observe(other, 0.2)
    except ValueError:  # rejecting a point other than the proposal is fine
        return
    # accepting it makes it the epoch's point: the epoch goes on there
    assert torch.equal(learner.propose(), other)
    learner.observe(other, 0.1)
    with pytest.raises(ValueError, match="`x`"):
        learner.observe(x, 0.1)


def test_observe_without_propose_still_keeps_one_point_per_epoch():
    learner = make(MoMAGPUCB, k=K, beta=1.0)
    learner.observe(DOMAIN[[2]], 0.5)
    with pytest.raises(ValueError, match="`x`"):
        learner.observe(DOMAIN[[7]], 0.5)


def test_moma_beta_is_thm4_and_defaults_are_the_papers():
    B, R, eps, lam, acc = 1.0, 0.5, 2.0, 2.0, 0.3
    learner = make(
        MoMAGPUCB,
        k=K,
        lam=lam,
        accuracy=acc,
        beta_scale=0.1,
        rewards=RewardModel(B=B, R=R, epsilon=eps),
    )
    c = R**2 + 8 * (B + R) ** 2 / eps**2  # Cor. 1
    _run_epochs(learner, rewards(3 * K, seed=36))
    m = learner.model.embedding.dim
    assert m >= 1
    expected = B * (1 + 1 / math.sqrt(1 - acc)) + 3 * math.sqrt(9 * m * c) / math.sqrt(lam)
    assert math.isclose(learner.beta(), 0.1 * expected, rel_tol=1e-12)
    # non-private: c = E[eta^2]
    heavy = make(MoMAGPUCB, k=K, lam=lam, accuracy=acc, rewards=RewardModel(B=B, noise_moment=3.0))
    _run_epochs(heavy, rewards(2 * K, seed=37))
    m = heavy.model.embedding.dim
    expected = B * (1 + 1 / math.sqrt(1 - acc)) + 3 * math.sqrt(9 * m * 3.0) / math.sqrt(lam)
    assert math.isclose(heavy.beta(), expected, rel_tol=1e-12)
    # defaults: k = ceil(24 ln(4 e T / delta)), q = 6 rho ln(4 T / delta) / acc^2
    plain = MoMAGPUCB(learner.kernel, 1, 500, RewardModel(B=B, R=R), delta=0.05, accuracy=acc)
    assert plain.k == math.ceil(24 * math.log(4 * math.e * 500 / 0.05))
    rho = (1 + acc) / (1 - acc)
    assert math.isclose(plain.q, 6 * rho * math.log(4 * 500 / 0.05) / acc**2, rel_tol=1e-12)


def test_moma_epoch_plays_one_point_or_raises():
    learner = make(MoMAGPUCB, k=4)
    proposed = learner.propose()
    other = DOMAIN[0:1] if not torch.equal(proposed, DOMAIN[0:1]) else DOMAIN[1:2]
    try:
        learner.observe(other, 1.0)
        for _ in range(3):
            learner.observe(learner.propose(), 1.0)
    except ValueError:
        return
    assert bool((learner.X == learner.X[0]).all()), learner.X.flatten().tolist()


def test_moma_with_k_above_the_horizon_warns_or_raises():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            MoMAGPUCB(kernel(), 1, 100, PRIVATE, candidates=DOMAIN)
        except ValueError:
            return
    assert any("epoch" in str(w.message) or "horizon" in str(w.message) for w in caught)
