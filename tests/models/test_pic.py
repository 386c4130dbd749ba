r"""FederatedPICGP against dense PIC / exact GP computations, and its BoTorch contract."""

from __future__ import annotations

import math

import pytest
import torch
from botorch.acquisition import UpperConfidenceBound, qUpperConfidenceBound
from botorch.exceptions.errors import (
    BotorchTensorDimensionError,
    InputDataError,
    UnsupportedError,
)
from botorch.models import SingleTaskGP
from botorch.models.transforms.outcome import Standardize
from botorch.optim import optimize_acqf
from botorch.sampling import SobolQMCNormalSampler
from gpytorch import settings as gpytorch_settings

from botorch_fed.models import (
    FederatedPICGP,
    FederatedPITCGP,
    HyperparametersChangedError,
    SparseSummary,
    compute_local_summary,
    default_jitter,
)
from tests.helpers.dense_pitc import (
    dense_pitc_covariance,
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
)
from tests.helpers.toy_models import kernel_rounding

DTYPES = [torch.float32, torch.float64]
pytestmark = pytest.mark.usefixtures("quiet_seeded")


def _factor(dtype: torch.dtype, f64: float) -> float:
    r"""Conditioning factor of a comparison with a float64 reference on the same inputs.

    The model computes in float64 whatever the input dtype, so a float32 model differs
    from the reference by the final rounding of its outputs (<= eps32 / 2 relative to
    the scale, factor 2 with slack); in float64 both sides carry rounding errors
    amplified by the conditioning of ``Q_ff + Lam`` and of the jittered ``K_SS``
    (``f64``, stated at each use).
    """
    return 2.0 if dtype == torch.float32 else f64


def _q_errors(support, k, jitter, *points):
    r"""``(x, e_Q)``: per point ``z`` of ``points`` the factor ``|x(z)|`` and the bound
    ``e_Q |x_i| |x_j|`` on the rounding of an entry ``Q_ij = k_S(z_i)' K_SS^-1 k_S(z_j)``.

    Through a solve with ``K_SS`` (``m`` support points, backward error ``m eps
    |K_SS|``) the entry errs by ``m eps |K_SS| |K_SS^-1 k_S(z_i)| |K_SS^-1 k_S(z_j)|``;
    through its Cholesky factor (``W = L^-1 k_S``, the model's route) by ``2 m eps
    cond(L) |W_i| |W_j|`` with ``|W_i|^2 = Q_ii``. ``x`` combines both (their sum).
    """
    e = eps(torch.float64)
    K_SS = jittered_kss(support, k, jitter)
    m = len(support)
    norm_K, cond_L = torch.linalg.matrix_norm(K_SS, ord=2), torch.linalg.cond(K_SS).sqrt()
    out = []
    for Z in points:
        K_SZ = k(support, Z).to_dense()
        x = torch.linalg.solve(K_SS, K_SZ)
        q = (K_SZ * x).sum(0).clamp_min(0)
        out.append((norm_K * x.norm(dim=0).square() + 2 * cond_L * q).sqrt())
    return out, m * e


def _pic_error_bounds(clients, own, support, k, lik, mean, X_test, jitter, dtype):
    r"""Elementwise bounds on ``|model - dense_pic_posterior|`` (mean ``q``, covariance
    ``q x q``), inputs in float64 holding the model's (rounded) values.

    Both sides compute ``mu_* + K~ A^-1 r`` and ``K** - K~ A^-1 K~'`` (``A = Q_ff +
    Lam``) in float64; each errs by at most :func:`_gp_error_bounds` (the model's
    summary route taken as a backward-stable evaluation of the same posterior): two
    sides, factor 2. Kernel entries are formed to ``kappa eps`` relative
    (``tests.helpers.toy_models.kernel_rounding``), entries through ``Q`` also carry
    :func:`_q_errors`. A float32 model adds the rounding of its outputs (``eps32 / 2``
    relative, 1 with slack).
    """
    e = eps(torch.float64)
    with torch.no_grad():
        X = torch.cat([c[0] for c in clients])
        y = torch.cat([c[1] for c in clients]).squeeze(-1)
        A = dense_pitc_covariance(clients, support, k, lik.noise, jitter)
        (x_f, x_t), e_Q = _q_errors(support, k, jitter, X, X_test)
        kappa = kernel_rounding(
            torch.cat([X, support, X_test]), float(k.base_kernel.lengthscale.max())
        )
        ref_mean, ref_cov = dense_pic_posterior(clients, own, support, k, lik, mean, X_test, jitter)
        K_SS = jittered_kss(support, k, jitter)
        K_tf = k(X_test, support).to_dense() @ torch.linalg.solve(K_SS, k(support, X).to_dense())
        start = sum(len(c[0]) for c in clients[:own])
        stop = start + len(clients[own][0])
        K_tf[:, start:stop] = k(X_test, clients[own][0]).to_dense()
        E_s = kappa * e * K_tf.abs() + e_Q * x_t[:, None] * x_f[None, :]
        E_s[:, start:stop] = kappa * e * K_tf[:, start:stop].abs()
        E_A = kappa * e * A.abs() + e_Q * x_f[:, None] * x_f[None, :]
        K_ss = k(X_test).to_dense()
        mu, mu_t = mean(X), mean(X_test)
        bound_mean, bound_cov = gp_form_error_bounds(
            A, E_A, K_tf, E_s, K_ss, kappa * e * K_ss.abs(), y - mu, e * (y.abs() + mu.abs())
        )
    bound_mean = bound_mean + e * mu_t.abs()  # mu_* + ...
    out32 = eps(dtype) if dtype != torch.float64 else 0.0
    return 2 * bound_mean + out32 * ref_mean.abs(), 2 * bound_cov + out32 * ref_cov.abs()


def _exactgp_form_error_bounds(X, y, support, k, lik, mean, X_test, jitter, dtype, noise=False):
    r"""As :func:`_pic_error_bounds` for one block holding all the data: the model's
    ``Q`` terms cancel in exact arithmetic (PIC is the exact GP for any support), not
    in its rounding, so every entry carries :func:`_q_errors` (the references, dense or
    BoTorch's, do not: their own bound is smaller, factor 2 covers both)."""
    e = eps(torch.float64)
    with torch.no_grad():
        A = k(X).to_dense() + lik.noise * torch.eye(len(X), dtype=X.dtype)
        K_s, K_ss = k(X_test, X).to_dense(), k(X_test).to_dense()
        (x_f, x_t), e_Q = _q_errors(support, k, jitter, X, X_test)
        kappa = kernel_rounding(
            torch.cat([X, support, X_test]), float(k.base_kernel.lengthscale.max())
        )
        mu, mu_t = mean(X), mean(X_test)
        y = y.squeeze(-1)
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
        ref_mean, ref_cov = exact_gp_posterior(X, y.unsqueeze(-1), k, lik, mean, X_test)
    bound_mean = bound_mean + e * mu_t.abs()
    if noise:  # + sigma^2 on the diagonal: one rounding
        ref_cov = ref_cov + lik.noise * torch.eye(len(X_test), dtype=X.dtype)
        bound_cov = bound_cov + e * ref_cov.abs()
    out32 = eps(dtype) if dtype != torch.float64 else 0.0
    return 2 * bound_mean + out32 * ref_mean.abs(), 2 * bound_cov + out32 * ref_cov.abs()


def _to64_modules(d, k, lik, mean):
    r"""float64 copies of the modules holding the same (rounded) values."""
    k64, lik64, mean64 = (m.to(torch.float64) for m in make_modules(d, torch.float64, 1.0))
    for m64, m in ((k64, k), (lik64, lik), (mean64, mean)):
        m64.load_state_dict(m.state_dict())
    return k64, lik64, mean64


def _setting(seed: int, dtype: torch.dtype, num_clients: int = 4, d: int = 2, m: int = 6):
    sizes = [5, 7, 3, 6, 4, 8][:num_clients]
    clients, support = random_federation(seed, dtype, num_clients, d, m, sizes=sizes)
    k, lik, mean = make_modules(d, dtype, lengthscale=0.3 * math.sqrt(d))
    return clients, support, k, lik, mean


def _summed(clients, support, k, lik, mean, jitter=None, tf=None):
    with torch.no_grad():
        return SparseSummary.sum(
            compute_local_summary(
                X, Y if tf is None else tf(Y)[0], support, k, lik, mean, jitter=jitter
            )
            for X, Y in clients
        )


def _pic(clients, own, support, k, lik, mean, jitter=None, **kwargs):
    summary = _summed(clients, support, k, lik, mean, jitter)
    X_B, Y_B = clients[own]
    return FederatedPICGP(
        support, summary, k, lik, mean, jitter=jitter, block_X=X_B, block_Y=Y_B, **kwargs
    )


def dense_pic_posterior(clients, own, support, k, lik, mean, X_test, jitter: float):
    r"""PIC predictive mean and covariance with dense solves over the pooled data.

    ``A = Q_ff + Lam`` (block-diagonal ``Lam``); ``K~_*f = Q_*f`` except on the own
    block's columns, where it is ``K_*B`` exactly.
    """
    X = torch.cat([c[0] for c in clients])
    y = torch.cat([c[1] for c in clients]).squeeze(-1)
    A = dense_pitc_covariance(clients, support, k, lik.noise, jitter)
    K_SS = jittered_kss(support, k, jitter)
    K_tf = k(X_test, support).to_dense() @ torch.linalg.solve(K_SS, k(support, X).to_dense())
    start = sum(len(c[0]) for c in clients[:own])
    stop = start + len(clients[own][0])
    K_tf[:, start:stop] = k(X_test, clients[own][0]).to_dense()
    post_mean = mean(X_test) + K_tf @ torch.linalg.solve(A, y - mean(X))
    post_cov = k(X_test).to_dense() - K_tf @ torch.linalg.solve(A, K_tf.mT)
    return post_mean, post_cov


# --- the predictive distribution ---------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("seed", range(3))
def test_posterior_matches_dense_pic(seed, dtype):
    clients, support, k, lik, mean = _setting(seed, dtype)
    d = support.shape[-1]
    g = torch.Generator().manual_seed(seed)
    own = seed % len(clients)
    # test points near the own block (where PIC differs from PITC) and anywhere
    near = clients[own][0][:3].double() + 0.05 * torch.randn(3, d, generator=g, dtype=torch.float64)
    X_test = torch.cat([near, torch.rand(2, d, generator=g, dtype=torch.float64)]).to(dtype)
    with torch.no_grad():
        model = _pic(clients, own, support, k, lik, mean)
        post = model.posterior(X_test)
        to64 = lambda t: t.to(torch.float64)  # noqa: E731
        clients64 = [(to64(X), to64(Y)) for X, Y in clients]
        k64, lik64, mean64 = _to64_modules(d, k, lik, mean)
        ref_mean, ref_cov = dense_pic_posterior(
            clients64, own, to64(support), k64, lik64, mean64, to64(X_test), default_jitter()
        )
        pitc = FederatedPITCGP(support, model.summary, k, lik, mean).posterior(X_test)
        bound_mean, bound_cov = _pic_error_bounds(
            clients64, own, to64(support), k64, lik64, mean64, to64(X_test), default_jitter(), dtype
        )
    assert post.mean.shape == (5, 1) and post.mean.dtype == dtype
    cov = post.distribution.covariance_matrix
    assert cov.shape == (5, 5)
    # first-order rounding of both float64 computations (and float32's output rounding)
    assert_within(post.mean.squeeze(-1), ref_mean, bound_mean, msg="mean")
    assert_within(cov, ref_cov, bound_cov, msg="covariance")
    # not vacuous: PIC differs from PITC near the own block by far more than the tolerance
    assert (pitc.mean - post.mean).abs().max() > 1e-3


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m", [1, 4, 12])
def test_one_block_holding_all_data_is_the_exact_gp(dtype, m):
    clients, _, k, lik, mean = _setting(5, dtype, num_clients=1)
    X, Y = clients[0]
    d = X.shape[-1]
    g = torch.Generator().manual_seed(m)
    support = torch.rand(m, d, generator=g, dtype=torch.float64).to(dtype)  # any support
    X_test = torch.rand(4, d, generator=g, dtype=torch.float64).to(dtype)
    to64 = lambda t: t.to(torch.float64)  # noqa: E731
    with torch.no_grad():
        model = _pic(clients, 0, support, k, lik, mean)
        k64, lik64, mean64 = _to64_modules(d, k, lik, mean)
        stgp = SingleTaskGP(
            to64(X),
            to64(Y),
            covar_module=k64,
            likelihood=lik64,
            mean_module=mean64,
            outcome_transform=None,
        ).eval()
        ref_mean, ref_cov = exact_gp_posterior(to64(X), to64(Y), k64, lik64, mean64, to64(X_test))
        for noise in (False, True):
            post = model.posterior(X_test, observation_noise=noise)
            ref = stgp.posterior(to64(X_test), observation_noise=noise)
            bound_mean, bound_cov = _exactgp_form_error_bounds(
                to64(X), to64(Y), to64(support), k64, lik64, mean64, to64(X_test),
                default_jitter(), dtype, noise,
            )  # fmt: skip
            assert_within(post.mean.squeeze(-1), ref.mean.squeeze(-1), bound_mean, msg=f"{noise}")
            assert_within(
                post.distribution.covariance_matrix,
                ref.distribution.covariance_matrix,
                bound_cov,
                msg=f"covariance {noise}",
            )
        post = model.posterior(X_test)
        bound_mean, _ = _exactgp_form_error_bounds(
            to64(X), to64(Y), to64(support), k64, lik64, mean64, to64(X_test),
            default_jitter(), dtype,
        )  # fmt: skip
        assert_within(post.mean.squeeze(-1), ref_mean, bound_mean)


def test_own_block_predictions_beat_pitc():
    # few support points at a short lengthscale: PITC loses most of the local structure
    dtype = torch.float64
    clients, support, k, lik, mean = _setting(1, dtype, num_clients=3, d=1, m=3)
    k.base_kernel.lengthscale = 0.08
    X, Y = torch.cat([c[0] for c in clients]), torch.cat([c[1] for c in clients])
    own = 1
    X_own = clients[own][0]
    with torch.no_grad():
        pic = _pic(clients, own, support, k, lik, mean)
        pitc = FederatedPITCGP(support, pic.summary, k, lik, mean)
        exact_mean, exact_cov = exact_gp_posterior(X, Y, k, lik, mean, X_own)
        p_pic, p_pitc = pic.posterior(X_own), pitc.posterior(X_own)
    err_pic = (p_pic.mean.squeeze(-1) - exact_mean).abs().max()
    err_pitc = (p_pitc.mean.squeeze(-1) - exact_mean).abs().max()
    var_pic = (p_pic.variance.squeeze(-1) - exact_cov.diagonal()).abs().max()
    var_pitc = (p_pitc.variance.squeeze(-1) - exact_cov.diagonal()).abs().max()
    assert err_pitc > 0.1  # PITC is poor here: the comparison is not vacuous
    assert err_pic < 0.25 * err_pitc
    assert var_pic < 0.25 * var_pitc


# --- construction ------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
def test_from_pitc_and_outcome_transform(dtype):
    clients, support, k, lik, mean = _setting(2, dtype)
    clients = [(X, 3 * Y + 10) for X, Y in clients]  # raw outcomes, not standardised
    d = support.shape[-1]
    X_test = torch.rand(2, 3, d, dtype=torch.float64).to(dtype)
    tf = Standardize(m=1)
    with torch.no_grad():
        pitc = FederatedPITCGP.from_client_data(
            clients, support, k, lik, mean, outcome_transform=tf
        )
        assert tf._is_trained and not tf.training
        X_own, Y_own = clients[2]
        model = FederatedPICGP.from_pitc(pitc, X_own, tf(Y_own)[0])  # transformed space
        # the same model in the transformed space, built from the constructor
        plain = FederatedPICGP(
            support, pitc.summary, k, lik, mean, block_X=X_own, block_Y=tf(Y_own)[0]
        )
        post, latent = model.posterior(X_test), plain.posterior(X_test)
    std, mu = tf.stdvs.squeeze(), tf.means.squeeze()
    assert post.mean.shape == (2, 3, 1)
    # the same latent posterior (one computation from the same summary, block and
    # modules, in ``dtype``'s output), untransformed by BoTorch (mu + std * m, then
    # D C D with D = diag(std)) and by hand (m * std + mu, C * std^2): at most two
    # roundings on each side, relative to |m| std + |mu| and to |C| std^2: factor 2
    scale = (latent.mean.abs() * std + mu.abs()).max()
    assert_close(post.mean, latent.mean * std + mu, dtype=dtype, factor=2, scale=scale)
    cov = latent.distribution.covariance_matrix
    assert_close(
        post.distribution.covariance_matrix,
        cov * std**2,
        dtype=dtype,
        factor=2,
        scale=(cov.abs() * std**2).max(),
    )
    assert model.support is not pitc.support and model.covar_module is pitc.covar_module
    assert model.block_X.dtype == model.block_Y.dtype == torch.float64
    k.base_kernel.lengthscale = 0.9  # the PITC model's summary is now stale
    with pytest.raises(HyperparametersChangedError):
        FederatedPICGP.from_pitc(pitc, X_own, tf(Y_own)[0])


def test_bad_inputs_raise_clear_errors():
    clients, support, k, lik, mean = _setting(0, torch.float64)
    summary = _summed(clients, support, k, lik, mean)
    X_B, Y_B = clients[0]

    def build(block_X, block_Y):
        return FederatedPICGP(support, summary, k, lik, mean, block_X=block_X, block_Y=block_Y)

    with pytest.raises(ValueError, match="`block_X` is empty"):
        build(X_B[:0], Y_B[:0])
    with pytest.raises(BotorchTensorDimensionError, match="`block_X`"):
        build(X_B.unsqueeze(0), Y_B.unsqueeze(0))  # no batch dimension
    with pytest.raises(BotorchTensorDimensionError, match="`block_X`"):
        build(X_B[:, :1], Y_B)  # wrong d
    with pytest.raises(BotorchTensorDimensionError, match="`block_Y`"):
        build(X_B, Y_B[:-1])
    with pytest.raises(BotorchTensorDimensionError, match="`block_Y`"):
        build(X_B, Y_B.squeeze(-1))
    with pytest.raises(InputDataError, match="`block_X`"):
        build(torch.where(X_B == X_B[0, 0], math.nan, X_B), Y_B)
    with pytest.raises(InputDataError, match="`block_Y`"):
        build(X_B, Y_B + math.inf)
    with pytest.raises(TypeError, match="`block_X`"):
        build(X_B.tolist(), Y_B)
    with pytest.raises(InputDataError, match="`block_Y`"):
        build(X_B, Y_B.long())
    with pytest.raises(TypeError, match="`model`"):
        FederatedPICGP.from_pitc("model", X_B, Y_B)


def test_conditioning_is_unsupported():
    clients, support, k, lik, mean = _setting(0, torch.float64)
    model = _pic(clients, 0, support, k, lik, mean)
    X = torch.rand(2, support.shape[-1], dtype=torch.float64)
    with pytest.raises(UnsupportedError, match="re-summarised"):
        model.condition_on_observations(X, torch.zeros(2, 1, dtype=torch.float64))
    with pytest.raises(UnsupportedError, match="re-summarised"):
        model.fantasize(X, SobolQMCNormalSampler(torch.Size([2])))


# --- BoTorch ------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
def test_optimize_acqf_and_batched_posteriors(dtype):
    clients, support, k, lik, mean = _setting(4, dtype)
    d = support.shape[-1]
    model = _pic(clients, 1, support, k, lik, mean)
    bounds = torch.stack([torch.zeros(d), torch.ones(d)]).to(dtype)
    for acqf, q in (
        (UpperConfidenceBound(model, beta=2.0), 1),
        (
            qUpperConfidenceBound(model, beta=2.0, sampler=SobolQMCNormalSampler(torch.Size([64]))),
            2,
        ),
    ):
        cand, value = optimize_acqf(acqf, bounds, q=q, num_restarts=2, raw_samples=16)
        assert cand.shape == (q, d) and cand.dtype == dtype
        assert torch.isfinite(value).all() and ((cand >= 0) & (cand <= 1)).all()
    X = torch.rand(2, 3, 2, d, dtype=torch.float64).to(dtype)  # b x q x d, q = 2
    with torch.no_grad():
        post = model.posterior(X)
        cov = post.distribution.covariance_matrix
        assert post.mean.shape == (2, 3, 2, 1) and cov.shape == (2, 3, 2, 2)
        one = model.posterior(X[1, 2])
    # the same float64 computation, batched or not: GEMMs of other shapes sum in other
    # orders, amplified at most by the conditioning of the pooled PIC system Q_ff + Lam
    A = dense_pitc_covariance(clients, support, k, lik.noise, default_jitter())
    A = A.detach().double()
    f = _factor(dtype, reordering_factor(A.shape[-1], torch.linalg.cond(A)))
    assert_close(post.mean[1, 2], one.mean, dtype=dtype, factor=f)
    assert_close(cov[1, 2], one.distribution.covariance_matrix, dtype=dtype, factor=f)
    assert (cov.diagonal(dim1=-2, dim2=-1) > 0).all()
    # gradients to the test inputs (what optimize_acqf uses)
    Xg = X[0].clone().requires_grad_(True)
    model.posterior(Xg).mean.sum().backward()
    assert Xg.grad is not None and torch.isfinite(Xg.grad).all()


# --- no stale state ----------------------------------------------------------------------
def test_hyperparameter_changes_are_detected():
    clients, support, k, lik, mean = _setting(0, torch.float64)
    model = _pic(clients, 0, support, k, lik, mean)
    X = torch.rand(3, support.shape[-1], dtype=torch.float64)
    model.posterior(X)  # caches at the initial values
    k.base_kernel.lengthscale = 0.9
    with pytest.raises(HyperparametersChangedError):
        model.posterior(X)


def test_block_is_read_only_and_caches_follow_it():
    clients, support, k, lik, mean = _setting(0, torch.float64)
    model = _pic(clients, 0, support, k, lik, mean)
    X = torch.rand(4, support.shape[-1], dtype=torch.float64)
    before = model.posterior(X).mean
    with pytest.raises(AttributeError):
        model.block_Y = torch.zeros(5, 1, dtype=torch.float64)
    with pytest.raises(AttributeError, match="constructor"):
        model._block_Y = torch.zeros(5, 1, dtype=torch.float64)
    model.block_Y.add_(1.0)  # a copy: the model is unchanged
    torch.testing.assert_close(model.posterior(X).mean, before, atol=0, rtol=0)
    # a write that bypasses the version counter still rebuilds the block factor
    model._block_Y.data.add_(1.0)
    fresh = FederatedPICGP(
        support, model.summary, k, lik, mean, block_X=clients[0][0], block_Y=clients[0][1] + 1
    )
    torch.testing.assert_close(model.posterior(X).mean, fresh.posterior(X).mean, atol=1e-12, rtol=0)


def test_dtype_moves_and_load_state_dict():
    clients, support, k, lik, mean = _setting(0, torch.float64)
    X = torch.rand(4, support.shape[-1], dtype=torch.float64)
    target = _pic(clients, 0, support, k, lik, mean)
    ref = target.posterior(X)
    target.float()  # modules to float32, summary / support / block stay float64
    assert target._block_X.dtype == target._block_Y.dtype == torch.float64
    target.double()
    again = target.posterior(X)
    # the float32 round trip moved each raw hyperparameter by <= eps32 / 2 of itself;
    # the mean moves by the first-order sum of those moves (eps32 |d mean / d raw| |raw|,
    # slack 2), plus both float64 evaluations' reordering (cond(Q_ff + Lam), 2 n cond)
    params = list(target.parameters())
    with gpytorch_settings.detach_test_caches(False):
        m = target.posterior(X).mean.squeeze(-1)
        grads = [torch.autograd.grad(m[i], params, retain_graph=True) for i in range(len(m))]
    moved = torch.stack(
        [sum((g.abs() * p.detach().abs()).sum() for g, p in zip(gi, params, strict=True))
         for gi in grads]
    )  # fmt: skip
    A = dense_pitc_covariance(clients, support, k, lik.noise, default_jitter()).detach()
    f64 = reordering_factor(A.shape[-1], torch.linalg.cond(A)) * eps(torch.float64)
    bound = eps(torch.float32) * moved + f64 * ref.mean.detach().abs().squeeze(-1).clamp_min(1)
    assert_within(again.mean.squeeze(-1), ref.mean.squeeze(-1), bound)
    # another client's PIC model (other block, other hyperparameters) loads completely
    k2, lik2, mean2 = make_modules(support.shape[-1], torch.float64, lengthscale=0.8, noise=0.05)
    source = _pic(clients, 2, support, k2, lik2, mean2)
    target.load_state_dict(source.state_dict())
    with torch.no_grad():
        p, q = target.posterior(X), source.posterior(X)
    torch.testing.assert_close(p.mean, q.mean, atol=1e-12, rtol=0)
    torch.testing.assert_close(
        p.distribution.covariance_matrix, q.distribution.covariance_matrix, atol=1e-12, rtol=0
    )


def test_a_summary_without_the_own_block_is_refused():
    # the summary sums every client's block, the own one included: a summary with fewer
    # points than the block cannot be the federation's
    torch.manual_seed(0)
    X = torch.rand(6, 2, dtype=torch.float64)
    Y = torch.sin(3 * X).sum(-1, keepdim=True)
    support = torch.rand(4, 2, dtype=torch.float64)
    from botorch.models.utils.gpytorch_modules import (
        get_covar_module_with_dim_scaled_prior,
        get_gaussian_likelihood_with_lognormal_prior,
    )

    covar = get_covar_module_with_dim_scaled_prior(2).double()
    lik = get_gaussian_likelihood_with_lognormal_prior().double()
    with torch.no_grad():
        other = compute_local_summary(X[:3], Y[:3], support, covar, lik)
    with pytest.raises(ValueError, match="cannot include the client's own block"):
        FederatedPICGP(support, other, covar, lik, block_X=X, block_Y=Y)
