r"""FederatedPITCGP against independent dense PITC / exact GP computations."""

from __future__ import annotations

import math
import random

import pytest
import torch
from botorch.acquisition import (
    LogExpectedImprovement,
    PosteriorMean,
    UpperConfidenceBound,
    qKnowledgeGradient,
    qUpperConfidenceBound,
)
from botorch.acquisition.objective import ScalarizedPosteriorTransform
from botorch.exceptions.errors import (
    BotorchTensorDimensionError,
    InputDataError,
    UnsupportedError,
)
from botorch.models import SingleTaskGP
from botorch.models.transforms.outcome import Standardize
from botorch.optim import optimize_acqf
from botorch.sampling import SobolQMCNormalSampler
from botorch.settings import propagate_grads
from gpytorch.constraints import Interval
from gpytorch.likelihoods import FixedNoiseGaussianLikelihood, GaussianLikelihood

from botorch_fed.models import (
    FederatedPITCGP,
    SparseSummary,
    compute_local_summary,
    default_jitter,
    support_cholesky,
)
from tests.helpers.dense_pitc import (
    dense_pitc_covariance,
    dense_pitc_posterior,
    exact_gp_posterior,
    jittered_kss,
    make_modules,
    random_federation,
)
from tests.helpers.tolerances import (
    assert_close,
    assert_within,
    eps,
    gp_form_error_bounds,
    reordering_factor,
    tol,
)
from tests.helpers.toy_models import kernel_rounding

DTYPES = [torch.float32, torch.float64]
F64 = torch.float64
# The model computes in float64 whatever the input dtype; float32 results differ from
# a float64 reference on the same (rounded) inputs by the final rounding of the
# outputs (<= eps32 / 2 relative to each entry).


def _tol(dtype, scale: float, f64_tol: float) -> float:
    r"""``f64_tol`` plus, for float32, the rounding of outputs of magnitude ``scale``."""
    return f64_tol + (tol(dtype, 2) * scale if dtype != torch.float64 else 0.0)


def _scale(*tensors) -> float:
    r"""The largest magnitude among the reference tensors (at least 1)."""
    return max([1.0, *(t.detach().abs().max().item() for t in tensors)])


def _factor(dtype: torch.dtype, f64: float) -> float:
    r"""Conditioning factor of a comparison of two evaluations of one model: in float64
    ``f64`` (stated at each use); a float32 model's outputs are float64 results rounded
    to float32 (<= eps32 / 2 relative on each side: 1, 2 with slack) -- the float64
    differences are below eps32 wherever ``f64 * eps64 << eps32``."""
    return 2.0 + f64 * eps(torch.float64) / eps(torch.float32) if dtype != torch.float64 else f64


def _cond_B(model) -> float:
    r"""``max cond(I + A~)`` over the batch: the system the posterior solves with its
    summed whitened summary."""
    A = model.summary.A.detach().double()
    B = A + torch.eye(A.shape[-1], dtype=A.dtype)
    return float(torch.linalg.cond(B).max())


def _pitc_error_bounds(clients, support, k, lik, mean, X_test, jitter, dtype):
    r"""Elementwise bounds on ``|model - dense_pitc_posterior|`` at ``X_test`` (``q x
    d``), inputs in float64 holding the model's (rounded) values.

    Both sides compute ``mu_* + Q_*f A^-1 r`` and ``K** - Q_*f A^-1 Q_f*`` (``A = Q_ff +
    Lam``) in float64; each errs by at most :func:`_gp_error_bounds` (the model's
    summary route taken as a backward-stable evaluation of the same posterior): two
    sides, factor 2. Kernel entries are formed to ``kappa eps`` relative
    (``tests.helpers.toy_models.kernel_rounding``); an entry ``Q_ij = k_S(z_i)' x_j``
    (``x_j = K_SS^-1 k_S(z_j)``) also errs by ``m eps |K_SS| |x_i| |x_j|`` through a
    solve with ``K_SS`` (its backward error, ``m`` support points) or by ``2 m eps
    cond(L) |W_i| |W_j|`` through its Cholesky factor (``W = L^-1 k_S``, ``|W_i|^2 =
    Q_ii``, the model's route): both are added. A float32 model adds the rounding of
    its outputs (``eps32 / 2`` relative, 1 with slack).
    """
    e = eps(torch.float64)
    with torch.no_grad():
        X = torch.cat([c[0] for c in clients])
        y = torch.cat([c[1] for c in clients]).squeeze(-1)
        A = dense_pitc_covariance(clients, support, k, lik.noise, jitter)
        K_SS = jittered_kss(support, k, jitter)
        norm_K, cond_L = torch.linalg.matrix_norm(K_SS, ord=2), torch.linalg.cond(K_SS).sqrt()
        x_norms = []
        for Z in (X, X_test):
            K_SZ = k(support, Z).to_dense()
            x = torch.linalg.solve(K_SS, K_SZ)
            q = (K_SZ * x).sum(0).clamp_min(0)
            x_norms.append((norm_K * x.norm(dim=0).square() + 2 * cond_L * q).sqrt())
        x_f, x_t = x_norms
        e_Q = len(support) * e
        kappa = kernel_rounding(
            torch.cat([X, support, X_test]), float(k.base_kernel.lengthscale.max())
        )
        K_s = k(X_test, support).to_dense() @ torch.linalg.solve(K_SS, k(support, X).to_dense())
        K_ss = k(X_test).to_dense()
        mu, mu_t = mean(X), mean(X_test)
        bound_mean, bound_cov = gp_form_error_bounds(
            A,
            kappa * e * A.abs() + e_Q * x_f[:, None] * x_f[None, :],
            K_s,
            kappa * e * K_s.abs() + e_Q * x_t[:, None] * x_f[None, :],
            K_ss,
            kappa * e * K_ss.abs() + e_Q * x_t[:, None] * x_t[None, :],
            y - mu,
            e * (y.abs() + mu.abs()),
        )
        ref_mean, ref_cov = dense_pitc_posterior(clients, support, k, lik, mean, X_test, jitter)
    bound_mean = bound_mean + e * mu_t.abs()  # mu_* + ...
    out32 = eps(dtype) if dtype != torch.float64 else 0.0
    return 2 * bound_mean + out32 * ref_mean.abs(), 2 * bound_cov + out32 * ref_cov.abs()


pytestmark = pytest.mark.usefixtures("quiet_seeded")


def _random_setting(seed: int, dtype: torch.dtype):
    rng = random.Random(seed)
    M, d = rng.randint(1, 8), rng.randint(1, 6)
    m = rng.randint(2, 3 + 2 * d)
    clients, support = random_federation(seed, dtype, M, d, m)
    k, lik, mean = make_modules(d, dtype, lengthscale=0.3 * math.sqrt(d))
    return clients, support, k, lik, mean


def _build(clients, support, k, lik, mean, **kwargs):
    return FederatedPITCGP.from_client_data(clients, support, k, lik, mean, **kwargs)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("seed", range(8))
def test_posterior_matches_dense_pitc(seed, dtype):
    clients, support, k, lik, mean = _random_setting(seed, dtype)
    d = support.shape[-1]
    g = torch.Generator().manual_seed(seed)
    X_test = torch.rand(2, 3, 5, d, generator=g, dtype=torch.float64).to(dtype)
    with torch.no_grad():
        model = _build(clients, support, k, lik, mean)
        post = model.posterior(X_test)
        # the reference in float64 from the same (rounded) inputs
        to64 = lambda t: t.to(torch.float64)  # noqa: E731
        clients64 = [(to64(X), to64(Y)) for X, Y in clients]
        k64, lik64, mean64 = (m.to(torch.float64) for m in make_modules(d, dtype, 1.0))
        k64.load_state_dict(k.state_dict())
        lik64.load_state_dict(lik.state_dict())
        mean64.load_state_dict(mean.state_dict())
        ref_mean, ref_cov = dense_pitc_posterior(
            clients64, to64(support), k64, lik64, mean64, to64(X_test), default_jitter(dtype)
        )
        args = (clients64, to64(support), k64, lik64, mean64)
        bounds = [
            _pitc_error_bounds(*args, to64(X_test[i, j]), default_jitter(dtype), dtype)
            for i in range(2)
            for j in range(3)
        ]
    assert post.mean.shape == (2, 3, 5, 1)
    assert post.distribution.covariance_matrix.shape == (2, 3, 5, 5)
    assert post.mean.dtype == dtype
    # first-order rounding of both float64 computations (and float32's output rounding)
    bound_mean = torch.stack([b[0] for b in bounds]).reshape(2, 3, 5)
    bound_cov = torch.stack([b[1] for b in bounds]).reshape(2, 3, 5, 5)
    assert_within(post.mean.squeeze(-1), ref_mean, bound_mean, msg="mean")
    assert_within(post.distribution.covariance_matrix, ref_cov, bound_cov, msg="covariance")


@pytest.mark.parametrize("dtype", DTYPES)
def test_equals_exact_gp_when_support_holds_all_inputs(dtype):
    clients, _, k, lik, mean = _random_setting(3, dtype)
    X = torch.cat([c[0] for c in clients])
    y = torch.cat([c[1] for c in clients])
    d = X.shape[-1]
    X_test = torch.rand(7, d, dtype=dtype)
    to64 = lambda t: t.to(torch.float64)  # noqa: E731
    with torch.no_grad():
        # A tiny jitter on K_SS keeps Q_ff = K_ff up to ~1e-12 (float64 maths inside).
        model = _build(clients, X, k, lik, mean, jitter=1e-12)
        post = model.posterior(X_test)
        k64, lik64, mean64 = (m.to(torch.float64) for m in make_modules(d, dtype, 1.0))
        for m64, m in ((k64, k), (lik64, lik), (mean64, mean)):
            m64.load_state_dict(m.state_dict())
        ref_mean, ref_cov = exact_gp_posterior(to64(X), to64(y), k64, lik64, mean64, to64(X_test))
        # BoTorch's own exact GP (float64, same values) as a second reference
        stgp = SingleTaskGP(
            to64(X),
            to64(y),
            covar_module=k64,
            likelihood=lik64,
            mean_module=mean64,
            outcome_transform=None,
        ).eval()
        post_stgp = stgp.posterior(to64(X_test))
    # The jitter on K_SS is the only difference (<= 1e-8 here), plus float32 rounding.
    atol = _tol(dtype, _scale(ref_mean, ref_cov), f64_tol=1e-8)
    torch.testing.assert_close(post.mean.squeeze(-1).double(), ref_mean, atol=atol, rtol=0)
    torch.testing.assert_close(
        post.distribution.covariance_matrix.double(), ref_cov, atol=atol, rtol=0
    )
    torch.testing.assert_close(post.mean.double(), post_stgp.mean, atol=atol, rtol=0)


def test_summation_order_and_grouping_do_not_matter():
    clients, support, k, lik, mean = _random_setting(5, torch.float64)
    X_test = torch.rand(6, support.shape[-1], dtype=torch.float64)
    with torch.no_grad():
        parts = [compute_local_summary(X, Y, support, k, lik, mean) for X, Y in clients]
        rng = random.Random(0)
        orders = [parts, list(reversed(parts)), rng.sample(parts, len(parts))]
        models = [FederatedPITCGP(support, SparseSummary.sum(p), k, lik, mean) for p in orders]
        half = len(parts) // 2 or 1
        grouped = SparseSummary.sum(parts[:half])
        if parts[half:]:
            grouped = grouped + SparseSummary.sum(parts[half:])
        models.append(FederatedPITCGP(support, grouped, k, lik, mean))
        models.append(FederatedPITCGP(support, sum(parts), k, lik, mean))
        posts = [mdl.posterior(X_test) for mdl in models]
    # The same posterior from summaries summed in other orders: each entry of the sum
    # of M summaries rounds by <= M eps of its terms, the prediction solves with
    # B = I + A~ (m x m, m support points) and rounds by <= m eps cond(B) on each side:
    # 2 (M + m) cond(B) (B's terms are PSD: their sum does not cancel on the diagonal),
    # the covariance relative to the prior variance it is formed from by cancellation
    f = reordering_factor(len(parts) + len(support), _cond_B(models[0]))
    prior = float(k.outputscale)
    for p in posts[1:]:
        assert_close(p.mean, posts[0].mean, dtype=torch.float64, factor=f)
        assert_close(
            p.distribution.covariance_matrix,
            posts[0].distribution.covariance_matrix,
            dtype=torch.float64,
            factor=f,
            scale=max(prior, 1.0),
        )


@pytest.mark.parametrize("dtype", DTYPES)
def test_stacked_clients_equal_separate_summaries(dtype):
    clients, support, k, lik, mean = _random_setting(2, dtype)
    d = support.shape[-1]
    g = torch.Generator().manual_seed(1)
    X = torch.rand(4, 6, d, generator=g, dtype=torch.float64).to(dtype)
    Y = torch.randn(4, 6, 1, generator=g, dtype=torch.float64).to(dtype)
    with torch.no_grad():
        stacked = compute_local_summary(X, Y, support, k, lik, mean)
        separate = [compute_local_summary(X[i], Y[i], support, k, lik, mean) for i in range(4)]
        # Conditioning of the computation: the summary goes through triangular solves
        # with L = chol(K_SS) and L_Lambda = chol(Lambda) (in float64 whatever the
        # input dtype); batched and per-client BLAS calls round differently, each
        # solve amplifying by at most its condition number times the size.
        L = support_cholesky(support, k)
        cond_L = torch.linalg.cond(L).item()
        K_SX = k(support.double(), X.double()).to_dense()
        V = torch.linalg.solve_triangular(L, K_SX, upper=False)
        Lam = k(X.double()).to_dense() - V.mT @ V + lik.noise.double() * torch.eye(6).double()
        cond_Lam = torch.linalg.cond(torch.linalg.cholesky(Lam)).max().item()
    assert stacked.batch_shape == torch.Size([4])
    assert stacked.b.dtype == torch.float64  # float64 maths for every input dtype
    factor = 4 * (len(support) + 6) * cond_L * cond_Lam**2
    for a, b in zip(stacked.unbind(0), separate, strict=True):
        assert_close(a.pack(), b.pack(), dtype=torch.float64, factor=factor)


@pytest.mark.parametrize("dtype", DTYPES)
def test_pack_unpack_round_trip(dtype):
    clients, support, k, lik, mean = _random_setting(4, dtype)
    m = support.shape[0]
    with torch.no_grad():
        s = compute_local_summary(*clients[0], support, k, lik, mean)
    vec = s.to_numpy()
    assert vec.dtype.name == "float64"
    assert vec.shape == (SparseSummary.packed_length(m),) == (m + m * (m + 1) // 2 + 3,)
    assert s.b.dtype == torch.float64  # summaries are float64 for every input dtype
    back = SparseSummary.from_numpy(vec, m)
    for name in ("b", "A", "quad", "logdet", "num_data"):
        torch.testing.assert_close(getattr(back, name), getattr(s, name), atol=0, rtol=0)
    assert torch.equal(back.A, back.A.mT)
    assert back.num_data.item() == len(clients[0][0])
    # batched packing
    two = SparseSummary.unpack(torch.stack([s.pack(), 2 * s.pack()]), m)
    torch.testing.assert_close(two.unbind(0)[1].A, 2 * s.A)
    with pytest.raises(ValueError, match="length"):
        SparseSummary.from_numpy(vec[:-1], m)
    with pytest.raises(InputDataError, match="NaN"):
        SparseSummary.from_numpy(vec * float("nan"), m)
    with pytest.raises(ValueError, match="num_support"):
        SparseSummary.from_numpy(vec, 0)


def test_summaries_on_different_supports_do_not_add():
    clients, support, k, lik, mean = _random_setting(1, torch.float64)
    with torch.no_grad():
        a = compute_local_summary(*clients[0], support, k, lik, mean)
        b = compute_local_summary(*clients[0], support[:-1], k, lik, mean)
    with pytest.raises(ValueError, match="different support"):
        a + b
    with pytest.raises(ValueError, match="empty"):
        SparseSummary.sum([])


@pytest.mark.parametrize("dtype", DTYPES)
def test_condition_on_observations_matches_extra_client(dtype):
    clients, support, k, lik, mean = _random_setting(6, dtype)
    d = support.shape[-1]
    g = torch.Generator().manual_seed(2)
    X_new = torch.rand(3, d, generator=g, dtype=torch.float64).to(dtype)
    Y_new = torch.randn(3, 1, generator=g, dtype=torch.float64).to(dtype)
    X_test = torch.rand(4, d, dtype=dtype)
    with torch.no_grad():
        model = _build(clients, support, k, lik, mean)
        cond = model.condition_on_observations(X_new, Y_new)
        rebuilt = _build([*clients, (X_new, Y_new)], support, k, lik, mean)
        p1, p2 = cond.posterior(X_test), rebuilt.posterior(X_test)
    # two float64 computations of the same model: the new block's summary added to the
    # sum or summed with the others (M + 1 summaries, in another order), the prediction
    # solving with B = I + A~ (m x m): 2 (M + 1 + m) cond(B), the covariance relative to
    # the prior variance it is formed from; then (float32) output rounding
    f = _factor(dtype, reordering_factor(len(clients) + 1 + len(support), _cond_B(rebuilt)))
    prior = max(float(k.outputscale), 1.0)
    assert_close(p1.mean, p2.mean, dtype=dtype, factor=f)
    assert_close(
        p1.distribution.covariance_matrix,
        p2.distribution.covariance_matrix,
        dtype=dtype,
        factor=f,
        scale=max(prior, _scale(p2.distribution.covariance_matrix)),
    )


@pytest.mark.parametrize("dtype", DTYPES)
def test_fantasize_matches_rebuilding_per_fantasy(dtype):
    clients, support, k, lik, mean = _random_setting(7, dtype)
    d = support.shape[-1]
    X_f = torch.rand(2, 2, d, dtype=dtype)  # batch of 2, q=2
    X_test = torch.rand(2, 3, d, dtype=dtype)
    sampler = SobolQMCNormalSampler(sample_shape=torch.Size([4]), seed=0)
    with torch.no_grad():
        model = _build(clients, support, k, lik, mean)
        fmodel = model.fantasize(X_f, sampler)
        assert fmodel.batch_shape == torch.Size([4, 2])
        post = fmodel.posterior(X_test)  # 4 x 2 x 3 x 1
        # the fantasy Y's, regenerated with the same sampler
        Y_f = sampler(model.posterior(X_f, observation_noise=True))
        assert Y_f.shape == (4, 2, 2, 1)
        for j in range(4):
            for b in range(2):
                ref = _build([*clients, (X_f[b], Y_f[j, b])], support, k, lik, mean)
                rp = ref.posterior(X_test[b])
                # as test_condition_on_observations_matches_extra_client (the fantasy
                # block added as one more summary, batched over fantasies)
                n_sum = len(clients) + 1 + len(support)
                f = _factor(dtype, reordering_factor(n_sum, _cond_B(ref)))
                cov = rp.distribution.covariance_matrix
                assert_close(post.mean[j, b], rp.mean, dtype=dtype, factor=f)
                assert_close(
                    post.distribution.covariance_matrix[j, b],
                    cov,
                    dtype=dtype,
                    factor=f,
                    scale=max(float(k.outputscale), _scale(cov)),
                )


def test_gradients_flow_to_fantasy_inputs():
    clients, support, k, lik, mean = _random_setting(0, torch.float64)
    d = support.shape[-1]
    model = _build(clients, support, k, lik, mean)
    X_new = torch.rand(2, d, dtype=torch.float64, requires_grad=True)
    Y_new = torch.tensor([[0.5], [-0.2]], dtype=torch.float64)
    X_test = torch.rand(3, d, dtype=torch.float64)

    def value(x):
        # gradients flow to conditioned data under propagate_grads, as in BoTorch
        with propagate_grads(True):
            return model.condition_on_observations(x, Y_new).posterior(X_test).mean.sum()

    value(X_new).backward()
    grad = X_new.grad
    assert torch.isfinite(grad).all() and grad.abs().sum() > 0
    # central finite differences
    eps = 1e-6
    with torch.no_grad():
        for i in range(2):
            for j in range(d):
                e = torch.zeros_like(X_new)
                e[i, j] = eps
                fd = (value(X_new + e) - value(X_new - e)) / (2 * eps)
                assert abs(fd.item() - grad[i, j].item()) < 1e-6 * max(1.0, abs(fd.item()))
    # and through fantasize (Y sampled from the posterior at X)
    X_f = torch.rand(1, 1, d, dtype=torch.float64, requires_grad=True)
    sampler = SobolQMCNormalSampler(sample_shape=torch.Size([3]), seed=1)
    fantasy = model.fantasize(X_f, sampler)
    with propagate_grads(True):
        fantasy.posterior(X_test).mean.sum().backward()
    assert torch.isfinite(X_f.grad).all() and X_f.grad.abs().sum() > 0
    # without propagate_grads the caches are detached (BoTorch's default for
    # posteriors): no gradient reaches the fantasy inputs through them
    X_f.grad = None
    X_t = X_test.clone().requires_grad_(True)
    fantasy.posterior(X_t).mean.sum().backward()
    assert X_f.grad is None and X_t.grad.abs().sum() > 0


def test_observation_noise_outcome_and_posterior_transforms():
    clients, support, k, lik, mean = _random_setting(1, torch.float64)
    d = support.shape[-1]
    X_test = torch.rand(4, d, dtype=torch.float64)
    all_y = torch.cat([Y for _, Y in clients])
    # an untrained Standardize is trained on the pooled outcomes, as SingleTaskGP does
    tf = Standardize(m=1)
    with torch.no_grad():
        model = _build(clients, support, k, lik, mean, outcome_transform=tf)
    torch.testing.assert_close(tf.means.squeeze(), all_y.mean())
    if len(all_y) > 1:
        torch.testing.assert_close(tf.stdvs.squeeze(), all_y.std())
    mu, std = tf.means.squeeze(), tf.stdvs.squeeze()
    clients_tf = [(X, (Y - mu) / std) for X, Y in clients]
    with torch.no_grad():
        base = _build(clients_tf, support, k, lik, mean)
        p0, p = base.posterior(X_test), model.posterior(X_test)
        torch.testing.assert_close(p.mean, p0.mean * std + mu)
        torch.testing.assert_close(p.variance, p0.variance * std**2)
        pn = base.posterior(X_test, observation_noise=True)
        torch.testing.assert_close(pn.variance, p0.variance + lik.noise)
        noise = torch.full((4, 1), 0.5, dtype=torch.float64)
        pt = base.posterior(X_test, observation_noise=noise)
        torch.testing.assert_close(pt.variance, p0.variance + 0.5)
        # a 0-dim tensor is a noise level for every point
        ps = base.posterior(X_test, observation_noise=torch.tensor(0.5, dtype=torch.float64))
        torch.testing.assert_close(ps.variance, p0.variance + 0.5)
        # noise is in the outcome-transformed space: scaled by std^2 on untransform
        pm = model.posterior(X_test, observation_noise=torch.tensor(0.5, dtype=torch.float64))
        torch.testing.assert_close(pm.variance, (p0.variance + 0.5) * std**2)
        ptf = base.posterior(
            X_test,
            posterior_transform=ScalarizedPosteriorTransform(
                torch.tensor([2.0], dtype=torch.float64)
            ),
        )
        torch.testing.assert_close(ptf.mean, 2 * p0.mean)
        # conditioning applies the outcome transform to the new Y (and does not retrain it)
        X_new, Y_new = torch.rand(2, d, dtype=torch.float64), torch.randn(2, 1, dtype=torch.float64)
        c1 = model.condition_on_observations(X_new, Y_new).posterior(X_test)
        c0 = base.condition_on_observations(X_new, (Y_new - mu) / std).posterior(X_test)
        torch.testing.assert_close(c1.mean, c0.mean * std + mu)
        torch.testing.assert_close(tf.means.squeeze(), mu)


@pytest.mark.parametrize("dtype", DTYPES)
def test_optimize_acqf_with_ucb_logei_and_qkg(dtype):
    clients, support, k, lik, mean = _random_setting(2, dtype)
    d = support.shape[-1]
    bounds = torch.stack([torch.zeros(d), torch.ones(d)]).to(dtype)
    model = _build(clients, support, k, lik, mean)
    best_f = torch.cat([c[1] for c in clients]).max()
    acqfs = [
        UpperConfidenceBound(model, beta=2.0),
        LogExpectedImprovement(model, best_f=best_f),
        qUpperConfidenceBound(model, beta=2.0),
    ]
    for acqf in acqfs:
        q = 2 if isinstance(acqf, qUpperConfidenceBound) else 1
        cand, val = optimize_acqf(
            acqf, bounds, q=q, num_restarts=2, raw_samples=16, options={"maxiter": 20}
        )
        assert cand.shape == (q, d) and torch.isfinite(val).all()
        assert ((cand >= 0) & (cand <= 1)).all()
    qkg = qKnowledgeGradient(model, num_fantasies=4)
    cand, val = optimize_acqf(
        qkg, bounds, q=1, num_restarts=2, raw_samples=16, options={"maxiter": 10}
    )
    assert cand.shape == (1, d) and torch.isfinite(val).all() and val >= -1e-6
    # q-KG equals a brute-force Monte Carlo estimate for the same fantasy draws:
    # mean over fantasies of the max posterior mean on a fixed grid of X_fantasies.
    X_actual = torch.rand(1, d, dtype=dtype)
    X_fant = torch.rand(4, 1, d, dtype=dtype)
    X_full = torch.cat([X_actual, X_fant.squeeze(-2)]).unsqueeze(0)
    with torch.no_grad():
        kg = qKnowledgeGradient(
            model,
            num_fantasies=4,
            sampler=SobolQMCNormalSampler(sample_shape=torch.Size([4]), seed=3),
        )(X_full)
        sampler = SobolQMCNormalSampler(sample_shape=torch.Size([4]), seed=3)
        Y_f = sampler(model.posterior(X_actual.unsqueeze(0), observation_noise=True))
        brute = torch.stack(
            [
                _build([*clients, (X_actual, Y_f[j, 0])], support, k, lik, mean)
                .posterior(X_fant[j])
                .mean.squeeze()
                for j in range(4)
            ]
        ).mean()
    # both sides are float64 computations of the same fantasy models (the fantasy block
    # added to the sum, or summed with the others: 2 (M + 1 + m) cond(B), the largest
    # cond(B) of the four), rounded to dtype and averaged over the 4 fantasies there (a
    # length-4 mean in dtype on each side: reordering_factor(4), plus the roundings of
    # the four values, 1)
    cond = max(
        _cond_B(_build([*clients, (X_actual, Y_f[j, 0])], support, k, lik, mean)) for j in range(4)
    )
    f64 = reordering_factor(len(clients) + 1 + len(support), cond)
    f = f64 if dtype == torch.float64 else reordering_factor(4) + 1 + f64 * eps(F64) / eps(dtype)
    assert_close(kg.reshape(()), brute, dtype=dtype, factor=f)
    pm = PosteriorMean(model)
    assert torch.isfinite(pm(torch.rand(3, 1, d, dtype=dtype))).all()


def _one_client(dtype=torch.float64, d=2):
    clients, support, k, lik, mean = _random_setting(0, dtype)
    d = support.shape[-1]
    return clients[0][0], clients[0][1], support, k, lik, mean, d


def test_bad_inputs_raise_clear_errors():
    X, Y, S, k, lik, mean, d = _one_client()
    # mismatched dimension between client and support
    with pytest.raises(BotorchTensorDimensionError, match="support"):
        compute_local_summary(X, Y, torch.rand(4, d + 1, dtype=X.dtype), k, lik, mean)
    # NaN / inf in X or Y
    Xn = X.clone()
    Xn[0, 0] = float("nan")
    with pytest.raises(InputDataError, match="train_X"):
        compute_local_summary(Xn, Y, S, k, lik, mean)
    Yi = Y.clone()
    Yi[0, 0] = float("inf")
    with pytest.raises(InputDataError, match="train_Y"):
        compute_local_summary(X, Yi, S, k, lik, mean)
    # empty client
    with pytest.raises(InputDataError, match="empty client"):
        compute_local_summary(X[:0], Y[:0], S, k, lik, mean)
    # duplicate support points
    S_dup = torch.cat([S, S[:1]])
    with pytest.raises(InputDataError, match="duplicate"):
        compute_local_summary(X, Y, S_dup, k, lik, mean)
    with pytest.raises(InputDataError, match="duplicate"):
        FederatedPITCGP.from_client_data([(X, Y)], S_dup, k, lik, mean)
    # negative noise: known noise variances and a likelihood allowing negatives
    with pytest.raises(InputDataError, match="train_Yvar"):
        compute_local_summary(X, Y, S, k, lik, mean, train_Yvar=-torch.ones_like(Y))
    bad_lik = GaussianLikelihood(noise_constraint=Interval(-1.0, 1.0)).double()
    bad_lik.noise = torch.tensor([-0.5], dtype=torch.float64)
    with pytest.raises(InputDataError, match="likelihood.noise"):
        compute_local_summary(X, Y, S, k, bad_lik, mean)
    with pytest.raises(TypeError, match="GaussianLikelihood"):
        compute_local_summary(
            X, Y, S, k, FixedNoiseGaussianLikelihood(noise=torch.ones(len(X))), mean
        )
    # shapes
    with pytest.raises(BotorchTensorDimensionError, match="train_Y"):
        compute_local_summary(X, Y.squeeze(-1), S, k, lik, mean)
    with pytest.raises(BotorchTensorDimensionError, match="support"):
        compute_local_summary(X, Y, S[0], k, lik, mean)
    with pytest.raises(InputDataError, match="dtype"):
        compute_local_summary(X.float(), Y, S, k, lik, mean)
    with pytest.raises(ValueError, match="jitter"):
        compute_local_summary(X, Y, S, k, lik, mean, jitter=-1.0)


def test_bad_model_inputs_raise_clear_errors():
    X, Y, S, k, lik, mean, d = _one_client()
    with torch.no_grad():
        s = compute_local_summary(X, Y, S, k, lik, mean)
    with pytest.raises(BotorchTensorDimensionError, match="support points"):
        FederatedPITCGP(S[:-1], s, k, lik, mean)
    corrupt = SparseSummary(s.b, s.A * float("nan"), s.quad, s.logdet, s.num_data)
    with pytest.raises(InputDataError, match="summary.A"):
        FederatedPITCGP(S, corrupt, k, lik, mean)
    not_psd = SparseSummary(
        s.b, s.A - 10 * torch.eye(len(S), dtype=s.A.dtype), *(s.quad, s.logdet, s.num_data)
    )
    with pytest.raises(InputDataError, match="positive definite"):
        FederatedPITCGP(S, not_psd, k, lik, mean)
    with pytest.raises(TypeError, match="SparseSummary"):
        FederatedPITCGP(S, s.pack(), k, lik, mean)
    with pytest.raises(ValueError, match="empty"):
        FederatedPITCGP.from_client_data([], S, k, lik, mean)
    model = FederatedPITCGP(S, s, k, lik, mean)
    with pytest.raises(BotorchTensorDimensionError, match="X"):
        model.posterior(torch.rand(3, d + 1, dtype=torch.float64))
    with pytest.raises(InputDataError, match="NaN"):
        model.posterior(torch.full((2, d), float("nan"), dtype=torch.float64))
    with pytest.raises(UnsupportedError, match="output_indices"):
        model.posterior(torch.rand(3, d, dtype=torch.float64), output_indices=[1])
    with pytest.raises(BotorchTensorDimensionError, match="observation_noise"):
        model.posterior(torch.rand(3, d, dtype=torch.float64), observation_noise=torch.ones(3))
    # float32 inputs are accepted (float64 maths inside) and give float32 outputs
    m32 = FederatedPITCGP(S.float(), s, k.float(), lik.float(), mean.float())
    assert m32.posterior(torch.rand(3, d)).mean.dtype == torch.float32


def test_joint_posterior_at_repeated_points_is_usable():
    # K_UU is singular for repeated test points: the covariance must stay lazy and
    # sampling must still work (as with BoTorch's exact GPs).
    clients, support, k, lik, mean = _random_setting(3, torch.float64)
    X = torch.rand(5, support.shape[-1], dtype=torch.float64)
    with torch.no_grad():
        post = _build(clients, support, k, lik, mean).posterior(torch.cat([X, X, X]))
        samples = post.rsample(torch.Size([8]))
    assert samples.shape == (8, 15, 1) and torch.isfinite(samples).all()
    torch.testing.assert_close(samples[:, :5], samples[:, 5:10], atol=1e-3, rtol=0)
