r"""Ridge, feature-adaptive truncation (TOFU) and median-of-means estimates ([LDP-BO]).

References: dense ``torch.linalg.solve``, a hand-computed truncation example, a
brute-force loop over Alg. 1 lines 9-11 with ``V^{-1/2}`` from an SVD, and a brute-force
loop over Alg. 3 lines 10-12.
"""

from __future__ import annotations

import math

import pytest
import torch

from botorch_fed.models import ata_estimate, median_of_means_estimate, ridge_estimate
from tests.helpers.tolerances import assert_close, reordering_factor

F64 = torch.float64
DTYPES = [torch.float32, torch.float64]
INF = math.inf


def problem(n: int, m: int, dtype: torch.dtype, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    Phi = torch.randn(n, m, generator=g, dtype=F64)
    y = Phi @ torch.randn(m, generator=g, dtype=F64) + torch.randn(n, generator=g, dtype=F64)
    return Phi.to(dtype), y.to(dtype)


def dense_ridge(Phi, y, lam):
    Phi, y = Phi.to(F64), y.to(F64)
    V = Phi.mT @ Phi + lam * torch.eye(Phi.shape[-1], dtype=F64)
    return torch.linalg.solve(V, Phi.mT @ y), float(torch.linalg.cond(V))


def ridge_tolerance(Phi, y, lam) -> tuple[float, float]:
    r"""``(factor, scale)`` of a comparison of two backward-stable evaluations of
    ``theta = V^-1 Phi' y``, ``V = Phi' Phi + lam I``: forming ``V`` and ``Phi' y`` rounds
    by ``n eps`` of their terms (length-``n`` sums), the solve (or ``V^-1/2`` from
    ``eigh``, applied twice) by ``m eps |V|``; amplified by ``V^-1``: ``|d theta| <=
    (n + m) eps (cond(V) |theta| + |V^-1| | |Phi|' |y| |)`` on each side, i.e.
    ``reordering_factor(n + m, cond(V))`` relative to ``|theta| + | |Phi|' |y| | / |V|``
    (2-norms)."""
    Phi, y = Phi.to(F64), y.to(F64)
    V = Phi.mT @ Phi + lam * torch.eye(Phi.shape[-1], dtype=F64)
    theta = torch.linalg.solve(V, Phi.mT @ y)
    terms = (Phi.abs().mT @ y.abs()).norm() / torch.linalg.matrix_norm(V, ord=2)
    factor = reordering_factor(Phi.shape[-2] + Phi.shape[-1], torch.linalg.cond(V))
    return factor, float(theta.norm() + terms)


@pytest.mark.parametrize("dtype", DTYPES)
def test_ridge_estimate(dtype):
    Phi, y = problem(30, 5, dtype)
    theta = ridge_estimate(Phi, y, 0.7)
    expected, _ = dense_ridge(Phi, y, 0.7)
    assert theta.dtype == F64 and theta.shape == (5,)
    # both solves are backward stable on V (Cholesky, LU): ridge_tolerance
    f, scale = ridge_tolerance(Phi, y, 0.7)
    assert_close(theta, expected, dtype=F64, factor=f, scale=scale)
    # batched: Phi b x n x m with y broadcast, and y b x n with one Phi
    Phis = torch.stack([Phi, 2 * Phi, Phi.flip(0)])
    thetas = ridge_estimate(Phis, y, 0.7)
    assert thetas.shape == (3, 5)
    for b in range(3):
        fb, scale_b = ridge_tolerance(Phis[b], y, 0.7)
        assert_close(
            thetas[b], dense_ridge(Phis[b], y, 0.7)[0], dtype=F64, factor=fb, scale=scale_b
        )
    ys = torch.stack([y, -y])
    assert_close(ridge_estimate(Phi, ys, 0.7)[1], -expected, dtype=F64, factor=f, scale=scale)
    # empty cases
    assert torch.equal(
        ridge_estimate(torch.zeros(0, 3), torch.zeros(0), 1.0), torch.zeros(3, dtype=F64)
    )
    assert ridge_estimate(torch.zeros(4, 0), torch.ones(4), 1.0).shape == (0,)


@pytest.mark.parametrize("dtype", DTYPES)
def test_ata_without_truncation_is_ridge(dtype):
    Phi, y = problem(25, 4, dtype, seed=1)
    theta, truncated = ata_estimate(Phi, y, 0.3, torch.full((25,), INF))
    expected, _ = dense_ridge(Phi, y, 0.3)
    assert truncated == 0 and theta.dtype == F64
    # V^-1/2 from eigh (backward error m eps |V|, amplified by cond(V)), applied twice,
    # and the length-n sums of U y: ridge_tolerance
    f, scale = ridge_tolerance(Phi, y, 0.3)
    assert_close(theta, expected, dtype=F64, factor=f, scale=scale)


def test_ata_hand_computed():
    # Phi' Phi = diag(2, 1), lam = 1: V = diag(3, 2), V^-1/2 = diag(3^-1/2, 2^-1/2)
    # U = V^-1/2 Phi' = [[1/sqrt3, 0, 1/sqrt3], [0, 1/sqrt2, 0]], y = (1, 4, -10)
    # terms u_{i,tau} y_tau: row 1 (0.577, 0, -5.774), row 2 (0, 2.828, 0)
    # thresholds (1, 3, 2): only (1, 3) with |-5.774| > 2 is cut
    # r = (1/sqrt3, 4/sqrt2), theta = V^-1/2 r = (1/3, 2); ridge would give (-3, 2)
    Phi = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0]], dtype=F64)
    y = torch.tensor([1.0, 4.0, -10.0], dtype=F64)
    theta, truncated = ata_estimate(Phi, y, 1.0, torch.tensor([1.0, 3.0, 2.0], dtype=F64))
    assert truncated == 1
    # exact values; the computed ones are V^-1/2 (eigh, m = 2, cond(V) = 1.5) applied
    # twice to sums of n = 3 terms u y (|u| <= 1/sqrt(2), V >= 2 I): errors <= (n + m)
    # eps cond(V) relative to the terms' magnitude |y| (a one-sided bound: factor 2 n
    # cond covers it with slack)
    f = reordering_factor(3 + 2, 1.5)
    scale = float(y.abs().max())
    assert_close(theta, torch.tensor([1 / 3, 2.0], dtype=F64), dtype=F64, factor=f, scale=scale)
    # thresholds (0.5, 2.5, inf): cuts (1, 1) 0.577 > 0.5 and (2, 2) 2.828 > 2.5
    theta, truncated = ata_estimate(Phi, y, 1.0, torch.tensor([0.5, 2.5, INF], dtype=F64))
    assert truncated == 2
    assert_close(theta, torch.tensor([-10 / 3, 0.0], dtype=F64), dtype=F64, factor=f, scale=scale)
    # tiny thresholds keep the three zero terms (also if eigh leaves ~1e-17 in them:
    # then theta is rounding-level, not 0) and cut the other three
    theta, truncated = ata_estimate(Phi, y, 1.0, torch.full((3,), 1e-12, dtype=F64))
    assert truncated == 3
    assert_close(theta, torch.zeros(2, dtype=F64), dtype=F64, factor=f, scale=scale)


def test_ata_against_brute_force_loop():
    Phi, y = problem(40, 6, F64, seed=2)
    y[7] = 50.0  # a heavy tail
    b = torch.linspace(0.2, 1.5, 40, dtype=F64)
    lam = 0.5
    V = Phi.mT @ Phi + lam * torch.eye(6, dtype=F64)
    U_svd, S, _ = torch.linalg.svd(V)
    Vmh = U_svd @ torch.diag(S.rsqrt()) @ U_svd.mT
    U = Vmh @ Phi.mT
    r = torch.zeros(6, dtype=F64)
    count = 0
    for i in range(6):
        for tau in range(40):
            term = U[i, tau] * y[tau]
            if abs(term) <= b[tau]:
                r[i] += term
            else:
                count += 1
    theta, truncated = ata_estimate(Phi, y, lam, b)
    assert truncated == count and 0 < count < 240
    # V^-1/2 (eigh vs SVD: backward errors m eps |V|, amplified by cond(V)) applied twice
    # to sums of up to n = 40 kept terms: 2 (n + m) cond(V), relative to the terms'
    # magnitude |V^-1/2| |y| (|u_i| <= 1 as U U' <= I)
    cond = float(torch.linalg.cond(V))
    scale = float(y.norm() / torch.linalg.eigvalsh(V)[0].sqrt())
    assert_close(theta, Vmh @ r, dtype=F64, factor=reordering_factor(40 + 6, cond), scale=scale)


def brute_mom(Phi, Y, lam):
    Phi, Y = Phi.to(F64), Y.to(F64)
    V = Phi.mT @ Phi + lam * torch.eye(Phi.shape[-1], dtype=F64)
    k = Y.shape[1]
    thetas = [torch.linalg.solve(V, Phi.mT @ Y[:, j]) for j in range(k)]
    r = []
    for j in range(k):
        d = sorted(
            math.sqrt(float((thetas[j] - thetas[s]) @ V @ (thetas[j] - thetas[s])))
            for s in range(k)
            if s != j
        )
        r.append(d[(len(d) - 1) // 2])  # the lower median
    j_star = min(range(k), key=lambda j: (r[j], j))
    return thetas[j_star], j_star, float(torch.linalg.cond(V))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("k", [3, 4, 7, 10])
def test_median_of_means_against_brute_force(dtype, k):
    g = torch.Generator().manual_seed(k)
    n, m = 15, 4
    Phi = torch.randn(n, m, generator=g, dtype=F64)
    f = Phi @ torch.randn(m, generator=g, dtype=F64)
    Z = torch.randn(3, n, k, generator=g, dtype=F64)
    Y = f.unsqueeze(-1) + Z[0] / ((Z[1] ** 2 + Z[2] ** 2) / 2).sqrt()  # Student t, 2 dof
    Phi, Y = Phi.to(dtype), Y.to(dtype)
    theta, k_star = median_of_means_estimate(Phi, Y, 0.8)
    expected, j_star, _ = brute_mom(Phi, Y, 0.8)
    assert k_star == j_star and theta.dtype == F64
    f, scale = ridge_tolerance(Phi, Y[:, j_star], 0.8)
    assert_close(theta, expected, dtype=F64, factor=f, scale=scale)


def test_median_of_means_rejects_a_corrupted_column():
    g = torch.Generator().manual_seed(9)
    n, m, k = 20, 4, 5
    Phi = torch.randn(n, m, generator=g, dtype=F64)
    truth = torch.randn(m, generator=g, dtype=F64)
    Y = (Phi @ truth).unsqueeze(-1) + 0.1 * torch.randn(n, k, generator=g, dtype=F64)
    Y[6, 2] = 1e6
    theta, k_star = median_of_means_estimate(Phi, Y, 1.0)
    assert k_star != 2
    clean, _ = dense_ridge(Phi, Y[:, k_star], 1.0)
    f, scale = ridge_tolerance(Phi, Y[:, k_star], 1.0)
    assert_close(theta, clean, dtype=F64, factor=f, scale=scale)
    assert float((theta - truth).norm()) < 0.5
    corrupted, _ = dense_ridge(Phi, Y[:, 2], 1.0)
    assert float((corrupted - truth).norm()) > 1e3


def test_median_of_means_small_k():
    Phi, y = problem(10, 3, F64, seed=4)
    theta, k_star = median_of_means_estimate(Phi, y.unsqueeze(-1), 1.0)
    assert k_star == 0
    f, scale = ridge_tolerance(Phi, y, 1.0)
    assert_close(theta, dense_ridge(Phi, y, 1.0)[0], dtype=F64, factor=f, scale=scale)
    # k = 2: both distances are the same number, the first wins
    _, k_star = median_of_means_estimate(Phi, torch.stack([y, -y], -1), 1.0)
    assert k_star == 0


def test_bad_inputs():
    Phi, y = problem(6, 2, F64)
    Y = y.unsqueeze(-1).repeat(1, 3)
    b = torch.ones(6, dtype=F64)
    for lam in (0.0, -1.0, math.nan, INF, "1"):
        with pytest.raises(ValueError, match="`lam`"):
            ridge_estimate(Phi, y, lam)
        with pytest.raises(ValueError, match="`lam`"):
            ata_estimate(Phi, y, lam, b)
        with pytest.raises(ValueError, match="`lam`"):
            median_of_means_estimate(Phi, Y, lam)
    bad_y = y.clone()
    bad_y[2] = math.nan
    with pytest.raises(ValueError, match="`y`.*finite"):
        ridge_estimate(Phi, bad_y, 1.0)
    with pytest.raises(ValueError, match="`y`.*finite"):
        ata_estimate(Phi, bad_y, 1.0, b)
    bad_Y = Y.clone()
    bad_Y[1, 2] = math.inf
    with pytest.raises(ValueError, match="`Y`.*finite"):
        median_of_means_estimate(Phi, bad_Y, 1.0)
    with pytest.raises(ValueError, match="`y`.*n=6"):
        ridge_estimate(Phi, y[:5], 1.0)
    with pytest.raises(ValueError, match="`y`.*n=6"):
        ata_estimate(Phi, y[:5], 1.0, b)
    with pytest.raises(ValueError, match="`Y`.*n=6"):
        median_of_means_estimate(Phi, Y[:5], 1.0)
    with pytest.raises(ValueError, match="`Y`.*k >= 1"):
        median_of_means_estimate(Phi, Y[:, :0], 1.0)
    with pytest.raises(ValueError, match="`Y`.*2 dimensions"):
        median_of_means_estimate(Phi, y, 1.0)
    with pytest.raises(ValueError, match="`Phi`.*finite"):
        ridge_estimate(torch.full((6, 2), math.nan), y, 1.0)
    with pytest.raises(ValueError, match="`Phi`"):
        ata_estimate(Phi.unsqueeze(0), y, 1.0, b)
    with pytest.raises(ValueError, match="`thresholds`.*n=6"):
        ata_estimate(Phi, y, 1.0, b[:5])
    with pytest.raises(ValueError, match="`thresholds`.*>= 0"):
        ata_estimate(Phi, y, 1.0, torch.tensor([1.0, -1.0, 1, 1, 1, 1], dtype=F64))
    with pytest.raises(ValueError, match="`thresholds`.*>= 0"):
        ata_estimate(Phi, y, 1.0, torch.tensor([1.0, math.nan, 1, 1, 1, 1], dtype=F64))
    with pytest.raises(ValueError, match="`Phi`.*broadcast"):
        ridge_estimate(torch.stack([Phi, Phi]), torch.stack([y, y, y]), 1.0)
