r"""FeatureSpaceGP ([LDP-BO] Alg. 1 l. 12-13, Alg. 3 l. 13-14) against dense GP algebra.

References: the exact GP posterior of the paper's eqs. (2)-(3) written out with
``torch.linalg.solve`` on the kernel of explicit differences (with the dictionary
spanning the training inputs the surrogate *is* that posterior), the dense Nystrom GP
``Q_sX (Q_XX + lam I)^-1`` with ``Q = K_.D K_D^-1 K_D.`` for a sub-sampled dictionary,
finite differences (``gradcheck``) for the gradients, and BoTorch's acquisition
machinery for compatibility.
"""

from __future__ import annotations

import math

import pytest
import torch
from botorch.acquisition import UpperConfidenceBound
from botorch.acquisition.objective import ScalarizedPosteriorTransform
from botorch.exceptions.errors import UnsupportedError
from botorch.optim import optimize_acqf
from gpytorch.kernels import RBFKernel, ScaleKernel

from botorch_fed.models import FeatureSpaceGP, NystromEmbedding
from tests.helpers.tolerances import assert_close, eps, reordering_factor
from tests.helpers.toy_models import kernel_rounding

F64 = torch.float64
DTYPES = [torch.float32, torch.float64]
LAM = 0.5
OUTPUTSCALE = 1.5


def kernel() -> ScaleKernel:
    k = ScaleKernel(RBFKernel()).to(F64)
    k.base_kernel.lengthscale = torch.tensor(0.2, dtype=F64)
    k.outputscale = torch.tensor(OUTPUTSCALE, dtype=F64)
    return k


def se(A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
    r"""The kernel above from explicit differences (float64)."""
    A, B = A.to(F64), B.to(F64)
    d2 = ((A.unsqueeze(-2) - B.unsqueeze(-3)) ** 2).sum(-1)
    return OUTPUTSCALE * torch.exp(-0.5 * d2 / 0.2**2)


def data(dtype: torch.dtype, repeats: bool = True):
    r"""8 distinct inputs spread over [0, 1] (plus 3 repeated plays), rewards."""
    g = torch.Generator().manual_seed(0)
    base = torch.linspace(0.02, 0.98, 8, dtype=F64) + 0.03 * torch.rand(8, generator=g, dtype=F64)
    X = base.unsqueeze(-1)
    if repeats:
        X = torch.cat([X, X[[1, 4, 4]]])
    y = torch.sin(6 * X.squeeze(-1)) + 0.1 * torch.randn(X.shape[0], generator=g, dtype=F64)
    return X.to(dtype), y.to(dtype)


def exact_posterior(X, y, Xs):
    r"""Mean, covariance, ``cond(K + lam I)`` and the magnitude ``max |k_s| |alpha|`` of
    the terms the mean is summed from (``alpha = (K + lam I)^-1 y``)."""
    K, Ks, Kss = se(X, X), se(Xs, X), se(Xs, Xs)
    A = K + LAM * torch.eye(K.shape[0], dtype=F64)
    alpha = torch.linalg.solve(A, y.to(F64))
    mean = Ks @ alpha
    cov = Kss - Ks @ torch.linalg.solve(A, Ks.mT)
    scale_m = float(Ks.norm(dim=-1).max() * alpha.norm())
    return mean, cov, float(torch.linalg.cond(A)), scale_m


def kappa(*points: torch.Tensor) -> float:
    r"""Relative rounding (units of eps) of the kernel entries among ``points``, summed
    over the two sides of a comparison: GPyTorch's (``kernel_rounding``: the
    ``|x|^2 + |x'|^2 - 2 x'x'`` distances) and the explicit differences of :func:`se`
    (the exponent ``z`` to ``z eps``, exp and the outputscale a few eps)."""
    pts = torch.cat([p.to(F64) for p in points])
    z = float(torch.cdist(pts, pts).max() ** 2 / (2 * 0.2**2))
    return kernel_rounding(pts, 0.2) + z + 4


def factor(dtype: torch.dtype, f64: float) -> float:
    r"""``f64`` (the float64 computation's conditioning factor) plus the final rounding
    of the output to ``dtype``, in units of ``eps(float64)``."""
    return f64 + (2 * eps(dtype) / eps(F64) if dtype != F64 else 0.0)


@pytest.fixture
def model64():
    X, y = data(F64)
    emb = NystromEmbedding(kernel(), X[:8])
    return FeatureSpaceGP.ridge(emb, X, y, LAM), X, y


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("repeats", [False, True])
def test_ridge_is_the_exact_gp_posterior(dtype, repeats):
    X, y = data(dtype, repeats)
    emb = NystromEmbedding(kernel(), X[:8])  # all distinct training inputs
    model = FeatureSpaceGP.ridge(emb, X, y, LAM)
    Xs = torch.rand(20, 1, generator=torch.Generator().manual_seed(1), dtype=dtype)
    Xs = torch.cat([Xs, X[:3]])  # at training inputs too (smallest variances)
    mean, cov, cond_A, scale_m = exact_posterior(X, y, Xs)
    cond_D = float(torch.linalg.cond(se(X[:8], X[:8])))
    n = X.shape[0]
    # Nystrom features: rounding amplified by cond(K_D); ridge solve and the dense
    # reference: by cond(V) <= cond(K + lam I)-like and cond(K + lam I); n-term sums
    # and kernel entries formed to kappa eps on each side: 2 (n + kappa) (cond_D + cond_A)
    f64 = reordering_factor(n + kappa(X, Xs), cond_D + cond_A)
    f = factor(dtype, f64)
    post = model.posterior(Xs)
    assert post.mean.dtype == dtype and post.mean.shape == (23, 1)
    assert post.covariance_matrix.shape == (23, 23)
    # the mean is summed from terms k_s alpha: errors relative to max |k_s| |alpha|
    assert_close(post.mean.squeeze(-1), mean, dtype=F64, factor=f, scale=scale_m, msg="mean")
    # the variance cancels k(x, x) = OUTPUTSCALE: errors relative to it
    assert_close(post.covariance_matrix, cov, dtype=F64, factor=f, scale=OUTPUTSCALE, msg="cov")
    m, v = model.mean_and_variance(Xs)
    assert m.dtype == F64 and v.dtype == F64 and m.shape == v.shape == (23,)
    assert_close(m, mean, dtype=F64, factor=f64, scale=scale_m, msg="mean_and_variance mean")
    assert_close(v, cov.diagonal(), dtype=F64, factor=f64, scale=OUTPUTSCALE, msg="variance")
    assert bool((v >= 0).all())
    # the diagonal of the posterior is mean_and_variance's (computed apart: the q x q
    # products vs sums of squares; then cast to dtype)
    assert_close(post.variance.squeeze(-1), v, dtype=F64, factor=f, scale=OUTPUTSCALE)
    # PSD covariance (a 23 x 23 posterior covariance with near-duplicates: eigenvalues
    # down to 0, computed to ~ q * eps * scale)
    lo = float(torch.linalg.eigvalsh(post.covariance_matrix.to(F64)).min())
    assert lo >= -f * eps(F64) * OUTPUTSCALE * 23


def test_subsampled_dictionary_is_the_dense_nystrom_gp():
    X, y = data(F64, repeats=True)
    D = X[[0, 3, 6]]
    emb = NystromEmbedding(kernel(), D)
    model = FeatureSpaceGP.ridge(emb, X, y, LAM)
    Xs = torch.rand(15, 1, generator=torch.Generator().manual_seed(2), dtype=F64)
    KD = se(D, D)

    def Q(A, B):
        return se(A, D) @ torch.linalg.solve(KD, se(D, B))

    A = Q(X, X) + LAM * torch.eye(X.shape[0], dtype=F64)
    alpha = torch.linalg.solve(A, y)
    mean = Q(Xs, X) @ alpha
    cov = se(Xs, Xs) - Q(Xs, X) @ torch.linalg.solve(A, Q(X, Xs))
    # as test_ridge_is_the_exact_gp_posterior: 2 (n + kappa) (cond(K_D) + cond(A)), the
    # mean relative to the terms it is summed from
    cond = float(torch.linalg.cond(KD)) + float(torch.linalg.cond(A))
    f = reordering_factor(X.shape[0] + kappa(X, Xs), cond)
    scale_m = float(Q(Xs, X).norm(dim=-1).max() * alpha.norm())
    post = model.posterior(Xs)
    assert_close(
        post.mean.squeeze(-1), mean, dtype=F64, factor=f, scale=scale_m, msg="Nystrom mean"
    )
    assert_close(post.covariance_matrix, cov, dtype=F64, factor=f, scale=OUTPUTSCALE)


def test_empty_dictionary_is_the_prior():
    X, y = data(F64)
    emb = NystromEmbedding(kernel(), X[:0])
    model = FeatureSpaceGP.ridge(emb, X, y, LAM)
    Xs = torch.rand(2, 4, 1, generator=torch.Generator().manual_seed(3), dtype=F64)
    post = model.posterior(Xs)
    assert torch.equal(post.mean, torch.zeros(2, 4, 1, dtype=F64))
    # GPyTorch's kernel against explicit differences: kappa (both sides' kernel rounding)
    f = kappa(Xs.reshape(-1, 1))
    assert_close(post.covariance_matrix, se(Xs, Xs), dtype=F64, factor=f, scale=OUTPUTSCALE)
    m, v = model.mean_and_variance(Xs[0])
    assert torch.equal(m, torch.zeros(4, dtype=F64))
    # the prior variance exp(0) * outputscale: the outputscale through GPyTorch's
    # softplus constraint and back (log(expm1) then log1p(exp), each a few roundings of
    # condition < 1 here): 4
    assert_close(v, torch.full((4,), OUTPUTSCALE, dtype=F64), dtype=F64, factor=4)


def test_observation_noise_batches_and_transform(model64):
    model, _, _ = model64
    Xs = torch.rand(3, 5, 1, generator=torch.Generator().manual_seed(4), dtype=F64)
    post = model.posterior(Xs)
    assert post.mean.shape == (3, 5, 1) and post.covariance_matrix.shape == (3, 5, 5)
    # The same float64 formulas batched or not (sums in other orders). Each side's
    # features phi(x) = k_D(x) W err by eps (m + kappa) P, P = max |k_D(x)| |W| (kernel
    # values formed to kappa eps; |W| = 1 / sqrt(the smallest eigenvalue of K_D kept),
    # as in test_nystrom); the mean phi theta adds a length-m sum: 2 m + kappa, relative to
    # P |theta|. The covariance K - phi phi' + lam A'A (A = L^-1 phi', L = chol(V)) has
    # three terms, each <= OUTPUTSCALE (Nystrom <= kernel, lam V^-1 <= I), each rounded
    # to (m + kappa) eps (sqrt(OUTPUTSCALE) P + OUTPUTSCALE), amplified by cond(L)
    # through the solve: 3 reordering_factor(m + kappa, cond(L)).
    emb = model.embedding
    m = emb.dim
    kap = kernel_rounding(torch.cat([Xs.reshape(-1, 1), emb.dictionary]), 0.2)
    kept = torch.linalg.eigvalsh(emb.kernel_matrix(emb.dictionary))[-emb.rank :]
    P = float(emb.kernel_matrix(Xs, emb.dictionary).norm(dim=-1).max() * kept.min().rsqrt())
    cond_L = float(torch.linalg.cond(model.gram + LAM * torch.eye(m, dtype=F64)).sqrt())
    f_mean = reordering_factor(2 * m + kap)
    f_cov = 3 * reordering_factor(m + kap, cond_L)
    scale_cov = OUTPUTSCALE + math.sqrt(OUTPUTSCALE) * P
    for b in range(3):
        single = model.posterior(Xs[b])
        scale_mean = P * float(model.theta.norm())
        assert_close(post.mean[b], single.mean, dtype=F64, factor=f_mean, scale=scale_mean)
        assert_close(
            post.covariance_matrix[b],
            single.covariance_matrix,
            dtype=F64,
            factor=f_cov,
            scale=scale_cov,
        )
    noisy = model.posterior(Xs, observation_noise=True)
    # the same covariance plus lam on the diagonal, rounded once on each side
    assert_close(
        noisy.covariance_matrix,
        post.covariance_matrix + LAM * torch.eye(5, dtype=F64),
        dtype=F64,
        factor=2,
    )
    assert torch.equal(noisy.mean, post.mean)
    with pytest.raises(UnsupportedError, match="observation_noise"):
        model.posterior(Xs, observation_noise=torch.ones(3, 5, 1, dtype=F64))
    tf = ScalarizedPosteriorTransform(weights=torch.tensor([2.0], dtype=F64), offset=1.0)
    scaled = model.posterior(Xs, posterior_transform=tf)
    # the same moments scaled by powers of 2 (exact) and offset by 1 (one rounding of
    # 2 m + 1 on each side)
    assert_close(scaled.mean, 2 * post.mean + 1, dtype=F64, factor=2)
    assert_close(scaled.variance, 4 * post.variance, dtype=F64, factor=2)
    assert model.num_outputs == 1 and model.batch_shape == torch.Size([])
    with pytest.raises(UnsupportedError, match="output_indices"):
        model.posterior(Xs, output_indices=[1])


def test_gradients_match_finite_differences(model64):
    model, _, _ = model64
    Xs = torch.tensor([[0.13], [0.41], [0.77]], dtype=F64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda Z: model.mean_and_variance(Z), (Xs,))
    assert torch.autograd.gradcheck(
        lambda Z: model.posterior(Z.unsqueeze(0)).covariance_matrix, (Xs,)
    )
    assert torch.autograd.gradcheck(lambda Z: model.posterior(Z).mean, (Xs,))


@pytest.mark.usefixtures("quiet_seeded")
@pytest.mark.parametrize("dtype", DTYPES)
def test_optimize_acqf_with_ucb(model64, dtype):
    model, _, _ = model64
    ucb = UpperConfidenceBound(model, beta=4.0)
    bounds = torch.tensor([[0.0], [1.0]], dtype=dtype)
    x, value = optimize_acqf(ucb, bounds=bounds, q=1, num_restarts=4, raw_samples=64)
    assert x.shape == (1, 1) and x.dtype == dtype
    assert bool(torch.isfinite(x).all()) and bool(torch.isfinite(value).all())
    assert 0.0 <= float(x) <= 1.0
    # a grid never beats the optimiser by more than the grid's resolution allows
    grid = torch.linspace(0, 1, 401, dtype=F64).unsqueeze(-1)
    m, v = model.mean_and_variance(grid)
    best = float((m + 2 * v.sqrt()).max())
    assert float(value) >= best - 1e-2 * max(1.0, abs(best))
    # .to() (which acquisition functions call) leaves the float64 maths alone
    model.to(torch.float32)
    assert model.mean_and_variance(grid)[1].dtype == F64


def test_immutable_state(model64):
    model, X, y = model64
    Xs = torch.rand(6, 1, generator=torch.Generator().manual_seed(5), dtype=F64)
    before = model.mean_and_variance(Xs)
    model.theta.add_(100.0)  # copies
    model.gram.mul_(0.0)
    theta = torch.zeros(model.embedding.dim, dtype=F64)
    gram = torch.eye(model.embedding.dim, dtype=F64)
    other = FeatureSpaceGP(model.embedding, theta, gram, LAM)
    theta.add_(5.0)
    gram.add_(5.0)
    after = model.mean_and_variance(Xs)
    assert torch.equal(before[0], after[0]) and torch.equal(before[1], after[1])
    assert torch.equal(other.theta, torch.zeros_like(theta))
    assert torch.equal(other.gram, torch.eye(theta.shape[0], dtype=F64))
    # ridge accepts n x 1 rewards
    again = FeatureSpaceGP.ridge(model.embedding, X, y.unsqueeze(-1), LAM)
    assert torch.equal(again.theta, model.theta)


def test_negative_variance_beyond_round_off_raises(model64):
    model, X, _ = model64
    emb = NystromEmbedding(kernel(), X[:8])
    bad = FeatureSpaceGP(emb, model.theta, model.gram, LAM)
    true_diag, true_matrix = emb.kernel_diag, emb.kernel_matrix
    # an inconsistent prior: half the kernel the features were built with
    emb.kernel_diag = lambda Z: 0.5 * true_diag(Z)
    emb.kernel_matrix = lambda A, B=None: 0.5 * true_matrix(A, B)
    with pytest.raises(RuntimeError, match="negative variance"):
        bad.mean_and_variance(X[:8])
    with pytest.raises(RuntimeError, match="negative variance"):
        bad.posterior(X[:8])


def test_bad_inputs(model64):
    model, X, y = model64
    emb, m = model.embedding, model.embedding.dim
    theta, gram = model.theta, model.gram
    for lam in (0.0, -1.0, math.nan, math.inf):
        with pytest.raises(ValueError, match="`lam`"):
            FeatureSpaceGP(emb, theta, gram, lam)
    with pytest.raises(ValueError, match="`theta`.*m=8"):
        FeatureSpaceGP(emb, theta[:-1], gram, LAM)
    with pytest.raises(ValueError, match="`theta`.*NaN"):
        FeatureSpaceGP(emb, torch.full((m,), math.nan, dtype=F64), gram, LAM)
    with pytest.raises(ValueError, match="`gram`.*m x m"):
        FeatureSpaceGP(emb, theta, gram[:-1], LAM)
    with pytest.raises(ValueError, match="`gram`.*symmetric"):
        FeatureSpaceGP(emb, theta, gram + torch.triu(torch.ones(m, m, dtype=F64), 1), LAM)
    with pytest.raises(ValueError, match="`gram`.*positive definite"):
        FeatureSpaceGP(emb, theta, -10 * torch.eye(m, dtype=F64), LAM)
    with pytest.raises(ValueError, match="`embedding`"):
        FeatureSpaceGP(kernel(), theta, gram, LAM)
    with pytest.raises(ValueError, match="`y`"):
        FeatureSpaceGP.ridge(emb, X, torch.full_like(y, math.nan), LAM)
    with pytest.raises(ValueError, match="`y`"):
        FeatureSpaceGP.ridge(emb, X, y[:-1], LAM)
    with pytest.raises(ValueError, match="`X`"):
        FeatureSpaceGP.ridge(emb, X.squeeze(-1), y, LAM)
    with pytest.raises(ValueError, match="`X`.*d=1"):
        model.posterior(torch.rand(2, 3, 2, dtype=F64))
    with pytest.raises(ValueError, match="`X`"):
        model.posterior(torch.rand(3, dtype=F64))
    with pytest.raises(ValueError, match="`X`"):
        model.mean_and_variance(torch.rand(2, 3, 1, dtype=F64))
