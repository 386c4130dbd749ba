r"""bures_wasserstein_barycenter against closed forms, the characterising equation and POT
(an independent implementation), in float32 and float64, with the bad-input cases."""

from __future__ import annotations

import warnings

import pytest
import torch
from botorch.exceptions.warnings import OptimizationWarning

from botorch_fed.models import bures_wasserstein_barycenter
from tests.helpers.tolerances import assert_close, reordering_factor, tol

DTYPES = [torch.float32, torch.float64]
# the iteration stops at a relative change of 1e-10 (its default `tol`); with the
# contraction of the map and cond(S) <= ~100 here, iterates are within ~1e-8 of the
# fixed point, whatever the dtype's own rounding
ITERATION = 1e-8


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


def _spd(N: int, s: int, seed: int, ridge: float = 0.1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    A = torch.randn(N, s, s, generator=g, dtype=torch.float64)
    return A @ A.transpose(-1, -2) + ridge * torch.eye(s, dtype=torch.float64)


def _sqrtm(A: torch.Tensor) -> torch.Tensor:
    # an independent square root: scipy's general algorithm (Schur), not an eigh
    import scipy.linalg

    return torch.as_tensor(scipy.linalg.sqrtm(A.numpy()).real)


@pytest.mark.parametrize("dtype", DTYPES)
def test_commuting_covariances_have_the_closed_form(dtype):
    r"""Covariances sharing eigenvectors: S = (sum_i w_i C_i^1/2)^2."""
    g = torch.Generator().manual_seed(1)
    Q, _ = torch.linalg.qr(torch.randn(5, 5, generator=g, dtype=torch.float64))
    spectra = torch.rand(3, 5, generator=g, dtype=torch.float64) * 4 + 0.1
    C = Q @ torch.diag_embed(spectra) @ Q.T
    w = torch.tensor([0.2, 0.5, 0.3], dtype=torch.float64)
    m = torch.randn(3, 5, generator=g, dtype=torch.float64)
    expected = Q @ torch.diag((w[:, None] * spectra.sqrt()).sum(0) ** 2) @ Q.T
    mean, cov = bures_wasserstein_barycenter(m.to(dtype), C.to(dtype), w.to(dtype))
    assert mean.dtype == cov.dtype == dtype
    # the mean: a weighted sum of 3 inputs (weights summing to 1) in float64 on both
    # sides (length-3 sums: reordering_factor(3)); in float32 the inputs' and the
    # output's roundings (eps32 / 2 each, relative to max |m|) instead
    f = reordering_factor(3)
    assert_close(mean, (w[:, None] * m).sum(0), dtype=dtype, factor=f, scale=m.abs().max())
    # the covariance: the iteration's own error, plus the inputs' rounding (eps / 2,
    # relative) through the square roots (a relative perturbation of C is amplified by
    # <= sqrt(cond(C)) / 2 in C^1/2 and doubled in S = (sum_i w_i C_i^1/2)^2) and the
    # output's rounding (eps / 2): sqrt(max cond(C_i)) + 1 with slack 2
    cond = float(torch.linalg.cond(C).max())
    assert _rel(cov, expected) <= ITERATION + tol(dtype, cond**0.5 + 1)


def test_random_spd_satisfies_the_characterising_equation_and_matches_pot():
    C = _spd(4, 6, seed=2)
    m = torch.randn(4, 6, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    w = torch.tensor([0.1, 0.2, 0.3, 0.4], dtype=torch.float64)
    mean, S = bures_wasserstein_barycenter(m, C, w)
    root = _sqrtm(S)
    rhs = sum(w[i] * _sqrtm(root @ C[i] @ root) for i in range(4))
    assert ((rhs - S).norm() / S.norm()) < 1e-9
    ot = pytest.importorskip("ot")
    pot_mean, pot_S = ot.gaussian.bures_wasserstein_barycenter(m, C, w)
    # the same weighted sum of 4 inputs (weights summing to 1) on both sides
    assert_close(
        mean, pot_mean, dtype=torch.float64, factor=reordering_factor(4), scale=m.abs().max()
    )
    # POT stops at an absolute change of 1e-7: agreement to that order
    assert ((pot_S - S).norm() / S.norm()) < 1e-6


def test_one_distribution_is_its_own_barycenter_and_warm_start_converges_at_once():
    C = _spd(1, 4, seed=4)
    m = torch.randn(1, 4, dtype=torch.float64)
    mean, S = bures_wasserstein_barycenter(m, C)
    assert torch.equal(mean, m[0])
    assert _rel(S, C[0]) <= ITERATION
    C = _spd(3, 4, seed=5)
    m = torch.zeros(3, 4, dtype=torch.float64)
    _, S = bures_wasserstein_barycenter(m, C)
    with warnings.catch_warnings():
        warnings.simplefilter("error", OptimizationWarning)  # converged from the answer
        _, again = bures_wasserstein_barycenter(m, C, init=S, max_iter=2)
    assert _rel(again, S) <= ITERATION
    # a cold start with too few iterations says so
    with pytest.warns(OptimizationWarning, match="max_iter=1"):
        bures_wasserstein_barycenter(m, C, max_iter=1)


def test_batches_are_independent_problems():
    C = torch.stack([_spd(3, 4, seed=6), _spd(3, 4, seed=7)])  # 2 x N x s x s
    m = torch.randn(2, 3, 4, dtype=torch.float64)
    mean, S = bures_wasserstein_barycenter(m, C)
    assert mean.shape == (2, 4) and S.shape == (2, 4, 4)
    for b in range(2):
        mb, Sb = bures_wasserstein_barycenter(m[b], C[b])
        # the same weighted sum of 3 inputs, batched or not
        f = reordering_factor(3)
        assert_close(mean[b], mb, dtype=torch.float64, factor=f, scale=m[b].abs().max())
        assert _rel(S[b], Sb) <= ITERATION


def test_inputs_that_require_grad_are_accepted():
    C = _spd(2, 3, seed=8).requires_grad_(True)
    m = torch.zeros(2, 3, dtype=torch.float64, requires_grad=True)
    mean, S = bures_wasserstein_barycenter(m, C)
    assert not mean.requires_grad and not S.requires_grad


@pytest.mark.parametrize(
    "case, message",
    [
        ("no-distributions", "at least one distribution"),
        ("shape", "must have shape"),
        ("batched-means-only", "must have shape"),
        ("asymmetric", "symmetric"),
        ("indefinite", "positive semi-definite"),
        ("nan", "finite"),
        ("weights-sum", "sum to one"),
        ("weights-negative", "non-negative"),
        ("weights-length", r"shape \(2,\)"),
        ("init", "positive definite"),
        ("max_iter", "max_iter"),
    ],
)
def test_bad_inputs_are_refused(case, message):
    C = _spd(2, 3, seed=9)
    m = torch.zeros(2, 3, dtype=torch.float64)
    kwargs = {}
    if case == "no-distributions":
        m, C = m[:0], C[:0]
    elif case == "shape":
        C = C[:, :2, :2]
    elif case == "batched-means-only":
        m = m.expand(4, 2, 3)
    elif case == "asymmetric":
        C = C.clone()
        C[0, 0, 1] += 1.0
    elif case == "indefinite":
        C = C.clone()
        C[1] = -C[1]
    elif case == "nan":
        m = m.clone()
        m[0, 0] = float("nan")
    elif case == "weights-sum":
        kwargs["weights"] = torch.tensor([0.5, 0.6], dtype=torch.float64)
    elif case == "weights-negative":
        kwargs["weights"] = torch.tensor([1.5, -0.5], dtype=torch.float64)
    elif case == "weights-length":
        kwargs["weights"] = torch.tensor([1.0], dtype=torch.float64)
    elif case == "init":
        kwargs["init"] = -torch.eye(3, dtype=torch.float64)
    elif case == "max_iter":
        kwargs["max_iter"] = 0
    with pytest.raises(ValueError, match=message):
        bures_wasserstein_barycenter(m, C, **kwargs)


def test_rank_tol_restricts_to_the_numerical_range():
    g = torch.Generator().manual_seed(7)
    s, N = 12, 3
    # positive definite inputs: the restricted iteration agrees with the full one
    A = torch.randn(N, s, s, generator=g, dtype=torch.float64)
    C = A @ A.transpose(-1, -2) / s + 0.1 * torch.eye(s, dtype=torch.float64)
    m = torch.randn(N, s, generator=g, dtype=torch.float64)
    _, full = bures_wasserstein_barycenter(m, C)
    _, restricted = bures_wasserstein_barycenter(m, C, rank_tol=1e-12)
    torch.testing.assert_close(restricted, full, atol=1e-9, rtol=0)
    # singular inputs sharing a rank-5 range: the full iteration cannot invert them,
    # the restricted one solves the characterising equation on the range
    U = torch.linalg.qr(torch.randn(s, 5, generator=g, dtype=torch.float64))[0]
    B = torch.randn(N, 5, 5, generator=g, dtype=torch.float64)
    Cr = B @ B.transpose(-1, -2) + 0.2 * torch.eye(5, dtype=torch.float64)
    Cs = U @ Cr @ U.T
    with pytest.raises(ValueError, match="singular"):
        bures_wasserstein_barycenter(m, Cs)
    _, Sb = bures_wasserstein_barycenter(m, Cs, rank_tol=1e-10)
    _, Sr = bures_wasserstein_barycenter(m[:, :5], Cr)
    torch.testing.assert_close(Sb, U @ Sr @ U.T, atol=1e-9, rtol=0)
    with pytest.raises(ValueError, match="rank_tol"):
        bures_wasserstein_barycenter(m, C, rank_tol=1.5)


def test_rank_tol_warm_start_is_used():
    r"""A previous barycenter with eigenvalues below the cut-off on the covariances'
    range (the barycenter lies below their mean) still warm-starts the restricted
    iteration, rather than being replaced by the weighted mean."""
    g = torch.Generator().manual_seed(11)
    s, N = 6, 3
    Q = torch.linalg.qr(torch.randn(s, s, generator=g, dtype=torch.float64))[0]
    spectra = torch.tensor([1.0, 0.5, 0.3, 0.2, 0.1, 0.0], dtype=torch.float64).repeat(N, 1)
    spectra = spectra * (1 + 0.5 * torch.rand(N, s, generator=g, dtype=torch.float64))
    # the last direction: one agent at 9e-6, the others ~0 -> mean 3e-6 (kept by
    # rank_tol=1e-6), barycenter (sum_i w_i c_i^1/2)^2 = 1e-6 (below the cut-off)
    spectra[:, -1] = torch.tensor([9e-6, 1e-14, 1e-14], dtype=torch.float64)
    C = Q @ torch.diag_embed(spectra) @ Q.T
    m = torch.zeros(N, s, dtype=torch.float64)
    _, S = bures_wasserstein_barycenter(m, C, rank_tol=1e-6, tol=1e-12)
    closed = Q @ torch.diag((spectra.sqrt().mean(0)) ** 2) @ Q.T  # commuting closed form
    torch.testing.assert_close(S, closed, atol=1e-10, rtol=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error", OptimizationWarning)
        _, again = bures_wasserstein_barycenter(m, C, rank_tol=1e-6, init=S, max_iter=2, tol=1e-9)
    torch.testing.assert_close(again, S, atol=1e-10, rtol=0)
