r"""Nystrom dictionary sampling and feature map ([LDP-BO] Alg. 4) against independent maths.

References: the squared-exponential kernel written out with explicit differences (no
``|a|^2 + |b|^2 - 2 a'b`` cancellation), dense solves with ``torch.linalg``, Bernoulli
frequencies with binomial error bars, and Definition 2 / its Nystrom consequence as
generalised eigenvalue problems on all ``n`` points.
"""

from __future__ import annotations

import math

import pytest
import torch
from gpytorch.kernels import MaternKernel, RBFKernel, ScaleKernel

from botorch_fed.models import NystromEmbedding, nystrom_embedding, sample_dictionary
from tests.helpers.tolerances import assert_close, eps, reordering_factor
from tests.helpers.toy_models import kernel_rounding

F64 = torch.float64
DTYPES = [torch.float32, torch.float64]


def se_kernel(lengthscale: float = 0.2, outputscale: float | None = None):
    base = RBFKernel().to(F64)
    base.lengthscale = torch.tensor(lengthscale, dtype=F64)
    if outputscale is None:
        return base
    k = ScaleKernel(base).to(F64)
    k.outputscale = torch.tensor(outputscale, dtype=F64)
    return k


def se_dense(A: torch.Tensor, B: torch.Tensor, emb: NystromEmbedding) -> torch.Tensor:
    r"""The SE kernel of ``emb`` (lengthscale/outputscale read from its float64 copy),
    from explicit differences."""
    k = emb.kernel
    scale = 1.0
    if isinstance(k, ScaleKernel):
        scale, k = float(k.outputscale), k.base_kernel
    ls = float(k.lengthscale)
    A, B = A.to(F64), B.to(F64)
    d2 = ((A.unsqueeze(-2) - B.unsqueeze(-3)) ** 2).sum(-1)
    return scale * torch.exp(-0.5 * d2 / ls**2)


def kappa(points: torch.Tensor, lengthscale: float) -> float:
    r"""Relative rounding (units of eps) of the kernel entries among ``points``, both
    sides of a comparison: GPyTorch's (``kernel_rounding``: the ``|x|^2 + |x'|^2 -
    2 x'x'`` distances) and :func:`se_dense`'s (the exponent ``z`` to ``z eps``, exp and
    the outputscale a few eps)."""
    pts = points.to(F64)
    z = float(torch.cdist(pts, pts).max() ** 2 / (2 * lengthscale**2))
    return kernel_rounding(pts, lengthscale) + z + 4


def spread(n: int, dtype: torch.dtype) -> torch.Tensor:
    return torch.linspace(0, 1, n, dtype=dtype).unsqueeze(-1)


# --- NystromEmbedding -------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("outputscale", [None, 1.7])
def test_features_reproduce_kernel_on_dictionary(dtype, outputscale):
    D = spread(10, dtype)
    emb = NystromEmbedding(se_kernel(0.2, outputscale), D)
    assert emb.dim == 10 and emb.rank == 10
    Phi = emb(D)
    assert Phi.dtype == F64 and Phi.shape == (10, 10)
    K = se_dense(D, D, emb)
    cond = float(torch.linalg.cond(K))  # ~6e4
    # Phi Phi' = K W W K: a perturbation of K_D of eps ||K_D|| is amplified by at most
    # cond(K_D) through W W = K_D^-1, plus m-term dot products: 2 m cond(K_D); it
    # reproduces GPyTorch's K_D, which differs from the explicit one by the kernels'
    # rounding (kappa, both sides)
    f = reordering_factor(10, cond) + kappa(D, 0.2)
    assert_close(Phi @ Phi.mT, K, dtype=F64, factor=f, msg="phi(D) phi(D)'")


@pytest.mark.parametrize("dtype", DTYPES)
def test_features_are_the_nystrom_approximation_elsewhere(dtype):
    g = torch.Generator().manual_seed(3)
    D = torch.rand(8, 2, generator=g, dtype=dtype)
    X = torch.rand(5, 2, generator=g, dtype=dtype)
    k = ScaleKernel(MaternKernel(nu=2.5)).to(F64)
    k.base_kernel.lengthscale = torch.tensor(0.4, dtype=F64)
    k.outputscale = torch.tensor(2.0, dtype=F64)
    emb = NystromEmbedding(k, D)
    # the reference uses gpytorch's kernel values (Matern) but a dense solve for K_D^+
    KD = emb.kernel_matrix(D).detach()
    KXD = emb.kernel_matrix(X, D).detach()
    expected = KXD @ torch.linalg.solve(KD, KXD.mT)
    cond = float(torch.linalg.cond(KD))
    PX = emb(X)
    # the same kernel values on both sides; the pseudo-inverse square root (eigh) and
    # the dense solve with K_D each amplify rounding by cond(K_D), length-m sums:
    # 2 m cond(K_D) (m = 8), relative to the outputscale the entries are bounded by
    f = reordering_factor(8, cond)
    scale = float(k.outputscale)
    assert_close(PX @ PX.mT, expected, dtype=F64, factor=f, scale=scale, msg="Nystrom k~")
    # exact whenever one argument is in the dictionary
    assert_close(PX @ emb(D).mT, KXD, dtype=F64, factor=f, scale=scale, msg="k~(x, d_i)")
    # and never above the kernel: k(x, x) - |phi(x)|^2 >= 0 (up to that rounding)
    gap = emb.kernel_diag(X) - PX.square().sum(-1)
    assert bool((gap > -f * eps(F64) * scale).all())


def test_batches_gradients_and_empty_dictionary():
    D = spread(6, F64)
    emb = NystromEmbedding(se_kernel(0.3), D)
    X = torch.rand(3, 4, 1, generator=torch.Generator().manual_seed(0), dtype=F64)
    out = emb(X)
    assert out.shape == (3, 4, 6)
    # the same phi = k_D(x) W batched or not: each side's rounding is at most
    # eps (m + kappa) |k_D(x)| |W| (a length-m product of kernel values formed to
    # kappa eps, kappa = 4 (1 + z) for exp(-z), z the largest scaled squared distance),
    # with |W| = 1 / sqrt(the smallest eigenvalue of K_D kept)
    kept = torch.linalg.eigvalsh(emb.kernel_matrix(D))[-emb.rank :]
    z = float(torch.cdist(X, D.expand(3, -1, -1)).max() ** 2 / (2 * 0.3**2))
    factor = reordering_factor(6 + math.ceil(4 * (1 + z)))
    for b in range(3):
        scale = emb.kernel_matrix(X[b], D).norm(dim=-1).max() * kept.min().rsqrt()
        assert_close(out[b], emb(X[b]), dtype=F64, factor=factor, scale=scale)
    # autograd w.r.t. X (finite differences)
    Xg = X[0].clone().requires_grad_(True)
    assert torch.autograd.gradcheck(lambda Z: emb(Z), (Xg,))
    empty = NystromEmbedding(se_kernel(0.3), torch.zeros(0, 1))
    assert empty.dim == 0 and empty.rank == 0
    assert empty(X).shape == (3, 4, 0) and empty(X).dtype == F64


def test_caller_kernel_untouched_and_embedding_immutable():
    k = ScaleKernel(RBFKernel())  # float32, trainable
    k.base_kernel.lengthscale = 0.25
    before = [p.detach().clone() for p in k.parameters()]
    D = spread(5, torch.float32)
    emb = NystromEmbedding(k, D)
    assert all(p.dtype == torch.float32 and p.requires_grad for p in k.parameters())
    assert all(torch.equal(a, b) for a, b in zip(before, k.parameters(), strict=True))
    assert all(not p.requires_grad and p.dtype == F64 for p in emb.kernel.parameters())
    phi0 = emb(D)
    D.add_(1.0)  # the caller's dictionary tensor changes; the embedding does not
    emb.dictionary.add_(1.0)  # a copy
    assert torch.equal(emb(spread(5, torch.float32)), phi0)


def test_rank_deficient_dictionary():
    # duplicated rows: K_D singular, the pseudo-inverse drops the null space
    D = torch.cat([spread(5, F64), spread(5, F64)[:2]])
    emb = NystromEmbedding(se_kernel(0.3), D)
    assert emb.dim == 7 and emb.rank == 5
    K = se_dense(D, D, emb)
    cond = float(torch.linalg.cond(K[:5, :5]))
    Phi = emb(D)
    # as test_features_reproduce_kernel_on_dictionary on the 5 distinct points, sums of
    # length m = 7: 2 m cond + kappa
    f = reordering_factor(7, cond) + kappa(D, 0.3)
    assert_close(Phi @ Phi.mT, K, dtype=F64, factor=f)
    # a tightly packed dictionary: eigenvalues below rtol * max are dropped, the error on
    # the dictionary is at most rtol * ||K_D||, plus rounding: phi(x) = k_D(x) W errs by
    # m eps |k_D(x)| |W| with |k_D(x)| <= sqrt(m) (outputscale 1) and |W| <= (rtol
    # s_max)^-1/2, and |phi(x)| <= 1 (Nystrom <= kernel): an entry of Phi Phi' errs by
    # 2 m eps sqrt(m) (rtol s_max)^-1/2; GPyTorch's K_D, which it reproduces, differs
    # from the explicit one by the kernels' rounding (kappa)
    Dp = torch.linspace(0, 0.5, 40, dtype=F64).unsqueeze(-1)
    embp = NystromEmbedding(se_kernel(0.2), Dp, rtol=1e-10)
    assert embp.rank < 40
    Kp = se_dense(Dp, Dp, embp)
    s_max = float(torch.linalg.eigvalsh(Kp)[-1])
    err = float((embp(Dp) @ embp(Dp).mT - Kp).abs().max())
    rounding = reordering_factor(40) * math.sqrt(40 / (1e-10 * s_max)) + kappa(Dp, 0.2)
    assert err <= 1e-10 * s_max + rounding * eps(F64)


# --- sample_dictionary --------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
def test_inclusion_frequencies(dtype):
    X = torch.arange(6, dtype=dtype).unsqueeze(-1)
    variances = torch.tensor([0.0, 0.01, 0.05, 0.1, 0.3, 2.0], dtype=dtype)
    q = 3.0
    p = (q * variances.to(F64)).clamp_max(1.0)  # 0, .03, .15, .3, .9, 1
    g = torch.Generator().manual_seed(11)
    N = 4000
    counts = torch.zeros(6, dtype=F64)
    for _ in range(N):
        idx = sample_dictionary(X, variances, q, generator=g)
        assert idx.dtype == torch.long and bool((idx[1:] > idx[:-1]).all())
        counts[idx] += 1
    freq = counts / N
    assert freq[0] == 0 and freq[-1] == 1  # probability 0: never, 1: always
    sd = (p * (1 - p) / N).sqrt()
    assert bool(((freq - p).abs() <= 5 * sd).all()), (freq, p)


def test_draw_order_reproducibility_and_duplicates():
    g = torch.Generator().manual_seed(5)
    X = torch.rand(50, 2, generator=g, dtype=F64)
    v = torch.rand(50, generator=g, dtype=F64)
    idx = sample_dictionary(X, v, 1.3, generator=torch.Generator().manual_seed(7))
    again = sample_dictionary(X, v, 1.3, generator=torch.Generator().manual_seed(7))
    other = sample_dictionary(X, v, 1.3, generator=torch.Generator().manual_seed(8))
    assert torch.equal(idx, again) and not torch.equal(idx, other)
    # one uniform per row, in row order: row i in iff u_i < min(q v_i, 1)
    u = torch.rand(50, generator=torch.Generator().manual_seed(7), dtype=F64)
    assert torch.equal(idx, (u < (1.3 * v).clamp_max(1)).nonzero().squeeze(-1))
    # repeated rows enter once: the first selected copy stays
    Xr = torch.tensor([[0.1], [0.5], [0.1], [0.9], [0.5], [0.1]], dtype=F64)
    ones = torch.ones(6, dtype=F64)
    assert sample_dictionary(Xr, ones, 1.0).tolist() == [0, 1, 3]
    only_later = torch.tensor([0.0, 1.0, 1.0, 0.0, 1.0, 1.0], dtype=F64)
    assert sample_dictionary(Xr, only_later, 1.0).tolist() == [1, 2]
    # n = 0
    empty = sample_dictionary(torch.zeros(0, 3), torch.zeros(0), 2.0)
    assert empty.shape == (0,) and empty.dtype == torch.long
    # round-off negatives are clamped (p = 0)
    tiny = torch.tensor([-1e-15, 1.0], dtype=F64)
    assert sample_dictionary(spread(2, F64), tiny, 1.0).tolist() == [1]


def test_nystrom_embedding_uses_sampled_rows():
    X = torch.rand(30, 1, generator=torch.Generator().manual_seed(2), dtype=F64)
    v = torch.full((30,), 0.2, dtype=F64)
    emb = nystrom_embedding(se_kernel(0.2), X, v, 2.0, generator=torch.Generator().manual_seed(3))
    idx = sample_dictionary(X, v, 2.0, generator=torch.Generator().manual_seed(3))
    assert torch.equal(emb.indices, idx) and torch.equal(emb.dictionary, X[idx])


# --- Lemma 8 / Definition 2 ------------------------------------------------------------------
def _accuracy(n: int, lam: float, q: float | None, seeds: range):
    r"""For each seed: ``(m, Nystrom spectrum, Definition 2 deviation)``.

    Variances are the exact posterior variances ``sigma_{n-1}^2(x_i)`` (noise ``lam``,
    the paper's eq. (3)). The Nystrom check is the generalised spectrum of
    ``(K~ + lam I, K + lam I)``, ``K~ = Phi Phi'`` (all eigenvalues in ``[1-eps, 1+eps]``).
    Definition 2 itself, ``(1-eps) V <= Phi' S^2 Phi + lam I <= (1+eps) V``, is in finite
    form ``|| P^{1/2} (S^2 - I) P^{1/2} ||_2 <= eps`` with ``P = K (K + lam I)^-1`` (the
    non-zero spectrum of ``V^{-1/2} Phi' (S^2 - I) Phi V^{-1/2}``).
    """
    X = torch.rand(n, 1, generator=torch.Generator().manual_seed(12345), dtype=F64)
    kern = se_kernel(0.2)
    K = kern(X, X).to_dense().detach()
    eye = torch.eye(n, dtype=F64)
    Kx = K[:, : n - 1]
    var = 1 - (Kx * torch.linalg.solve(K[: n - 1, : n - 1] + lam * eye[:-1, :-1], Kx.mT).mT).sum(-1)
    if q is None:  # Lemma 8 with eps = 0.5, delta = 0.1, T = n
        e, delta = 0.5, 0.1
        q = 6 * ((1 + e) / (1 - e)) * math.log(2 * n / delta) / e**2
    w, Q = torch.linalg.eigh(K + lam * eye)
    inv_half = (Q * w.rsqrt()) @ Q.mT
    P = K @ torch.linalg.inv(K + lam * eye)
    w2, Q2 = torch.linalg.eigh(0.5 * (P + P.mT))
    P_half = (Q2 * w2.clamp_min(0).sqrt()) @ Q2.mT
    p = (q * var).clamp_max(1.0)
    out = []
    for seed in seeds:
        emb = nystrom_embedding(kern, X, var, q, generator=torch.Generator().manual_seed(seed))
        Phi = emb(X)
        spec = torch.linalg.eigvalsh(inv_half @ (Phi @ Phi.mT + lam * eye) @ inv_half)
        s2 = torch.zeros(n, dtype=F64)
        s2[emb.indices] = 1 / p[emb.indices]
        dev = torch.linalg.eigvalsh(P_half @ torch.diag(s2 - 1) @ P_half).abs().max()
        out.append((emb.dim, spec, float(dev), _spectrum_rounding(emb, X, K, lam)))
    return q, p, out


def _spectrum_rounding(emb: NystromEmbedding, X: torch.Tensor, K: torch.Tensor, lam: float):
    r"""Bound on the rounding of the whitened spectrum of ``K~ + lam I`` against
    ``K + lam I`` (``K~ = Phi Phi' = A K_D A'``, ``A = K_XD K_D^+ = Phi W``).

    To first order, rounding is a perturbation of ``K_D`` and ``K_XD`` by ``(kappa + m)
    eps`` of their norms (the kernel entries as formed; ``eigh``'s and the length-``m``
    products' backward errors), which moves ``K~`` by ``A dK_D A' + dK_XD A' + A
    dK_DX``: ``<= (kappa + m) eps (|A|^2 |K_D| + 2 |A| |K_XD|)``; ``K`` itself moves by
    ``kappa eps |K|``, and the whitening (``eigh`` of ``K + lam I``) by ``n eps
    cond(K + lam I)``. Whitened by ``(K + lam I)^-1/2``: divided by ``lam``.
    """
    n, m = K.shape[-1], emb.dim
    e, kap = eps(F64), kernel_rounding(X, 0.2)
    with torch.no_grad():
        norm = lambda M: float(torch.linalg.matrix_norm(M, ord=2))  # noqa: E731
        A = emb(X) @ emb.projection
        K_D, K_XD = emb.kernel_matrix(emb.dictionary), emb.kernel_matrix(X, emb.dictionary)
        d_nystrom = (kap + m) * e * (norm(A) ** 2 * norm(K_D) + 2 * norm(A) * norm(K_XD))
        whitening = n * e * (norm(K) + lam)
    return (d_nystrom + kap * e * norm(K) + whitening) / lam


def test_lemma8_rate_is_eps_accurate():
    eps_acc = 0.5
    q, p, out = _accuracy(300, 1.0, None, range(10))
    # Lemma 8's q = 6 rho ln(2T/delta) / eps^2 = 626 here, and every sigma^2 >= 0.015:
    # every point enters (p = 1). The dictionary is a strict subset only for
    # n >> q d_eff (d_eff ~ 6 here), i.e. thousands of plays.
    assert q > 600 and bool((p == 1).all())
    good = 0
    for m, spec, dev, _ in out:
        assert m == 300
        # rounding: ||(K + lam)^-1/2|| <= 1, so the spectrum is exact to ~n eps
        good += bool(spec.min() >= 1 - eps_acc and spec.max() <= 1 + eps_acc and dev <= eps_acc)
    assert good >= 9


@pytest.mark.parametrize("lam, q", [(0.01, None), (1.0, 10.0)])
def test_subsampled_dictionary_is_small_and_accurate(lam, q):
    r"""A strict subset: Lemma 8's ``q`` with the paper's (unscaled) variances at
    ``lam = 0.01``, and ``q = 10`` at ``lam = 1``: ``m`` is ~50 of 300 points and the
    Nystrom kernel is ``eps``-accurate in the Loewner sense on all 300 (the SE kernel's
    spectrum decays so fast that 50 points span it). Definition 2's reweighted operator
    is *not* checked here: at these rates its deviation is 0.3-0.8 (the theory's rate
    is the one of the test above)."""
    _, _, out = _accuracy(300, lam, q, range(10))
    good = 0
    for m, spec, _, rounding in out:
        assert 20 <= m <= 100
        # K~ <= K always (Nystrom is a projection): the upper side holds up to the
        # rounding of K~ and of the whitening (_spectrum_rounding)
        assert float(spec.max()) <= 1 + rounding
        good += bool(spec.min() >= 0.5)
    assert good >= 9


# --- bad inputs ----------------------------------------------------------------------------
def test_bad_inputs():
    X = spread(4, F64)
    v = torch.full((4,), 0.1, dtype=F64)
    for q in (0.0, -1.0, math.nan, math.inf, "1"):
        with pytest.raises(ValueError, match="`q`"):
            sample_dictionary(X, v, q)
    with pytest.raises(ValueError, match="`variances`.*>= 0"):
        sample_dictionary(X, torch.tensor([0.1, -1e-3, 0.1, 0.1], dtype=F64), 1.0)
    with pytest.raises(ValueError, match="`variances`.*finite"):
        sample_dictionary(X, torch.tensor([0.1, math.nan, 0.1, 0.1], dtype=F64), 1.0)
    with pytest.raises(ValueError, match="`variances`.*shape"):
        sample_dictionary(X, v[:3], 1.0)
    with pytest.raises(ValueError, match="`X`.*n x d"):
        sample_dictionary(X.squeeze(-1), v, 1.0)
    with pytest.raises(ValueError, match="`X`.*NaN"):
        sample_dictionary(torch.full((4, 1), math.nan), v, 1.0)
    with pytest.raises(ValueError, match="`kernel`"):
        NystromEmbedding(lambda a, b: a @ b.mT, X)
    with pytest.raises(ValueError, match="`dictionary`"):
        NystromEmbedding(se_kernel(), X.squeeze(-1))
    with pytest.raises(ValueError, match="`rtol`"):
        NystromEmbedding(se_kernel(), X, rtol=1.0)
    emb = NystromEmbedding(se_kernel(), X)
    with pytest.raises(ValueError, match="`X`.*d=1"):
        emb(torch.rand(3, 2, dtype=F64))
    with pytest.raises(ValueError, match="`X`"):
        emb(torch.rand(3, dtype=F64))
