r"""BarycenterGP (Co-KG's central model) against independent computations.

The references: the barycenter of ``bures_wasserstein_barycenter`` (itself checked
against closed forms and POT), dense Gaussian conditioning written out with
``torch.linalg.solve``, and BoTorch's own ``SingleTaskGP``: when an agent's data lie on
the support, its discretised posterior conditioned off the support *is* its GP
posterior everywhere (the data are independent of ``f(X)`` given ``f_S``). The last
section also checks BoTorch's Model contracts (fantasies of fantasies, observation
noise, posterior transforms, qKG and its gradients, BoTorch's acquisitions) and float32
inputs.
"""

from __future__ import annotations

import warnings

import gpytorch
import pytest
import torch
from botorch.acquisition import (
    PosteriorMean,
    UpperConfidenceBound,
    qKnowledgeGradient,
    qLogNoisyExpectedImprovement,
    qLowerBoundMaxValueEntropy,
    qMaxValueEntropy,
)
from botorch.acquisition.objective import ScalarizedPosteriorTransform
from botorch.exceptions.errors import BotorchTensorDimensionError, InputDataError
from botorch.models import SingleTaskGP
from botorch.optim import optimize_acqf
from botorch.sampling import SobolQMCNormalSampler
from gpytorch.kernels import MaternKernel, RBFKernel, ScaleKernel

from botorch_fed.models import BarycenterGP, agent_weights, bures_wasserstein_barycenter
from tests.helpers.tolerances import assert_close, assert_within, eps, reordering_factor

F64 = torch.float64
NOISE = 1e-3


def grid(side: int) -> torch.Tensor:
    g = torch.linspace(0, 1, side, dtype=F64)
    return torch.cartesian_prod(g, g)


def kernel(lengthscale: float = 0.3, outputscale: float = 1.5) -> ScaleKernel:
    k = ScaleKernel(MaternKernel(nu=2.5)).to(F64)
    k.base_kernel.lengthscale = lengthscale
    k.outputscale = outputscale
    return k


def agent_gp(X: torch.Tensor, k: ScaleKernel, mean: float = 0.2) -> SingleTaskGP:
    Y = torch.sin(5 * X[:, :1]) + X[:, 1:] ** 2
    gp = SingleTaskGP(X, Y, covar_module=k, outcome_transform=None)
    gp.likelihood.noise = NOISE
    gp.mean_module.constant.data.fill_(mean)
    return gp.eval()


def agents(S: torch.Tensor, k: ScaleKernel, N: int, n: int, seed: int = 0, on_support=False):
    g = torch.Generator().manual_seed(seed)
    gps, means, covs = [], [], []
    for _ in range(N):
        if on_support:
            X = S[torch.randperm(S.shape[0], generator=g)[:n]]
        else:
            X = torch.rand(n, S.shape[-1], generator=g, dtype=F64)
        gp = agent_gp(X, k)
        with torch.no_grad():
            post = gp.posterior(S)
        gps.append(gp)
        means.append(post.mean.squeeze(-1))
        covs.append(post.covariance_matrix)
    return gps, torch.stack(means), torch.stack(covs)


def dense_reference(model: BarycenterGP, X: torch.Tensor, mean_c, cov_c, mu0: float):
    r"""Gaussian conditioning on the support values, by dense solves (no jitter)."""
    k = model.covar_module
    S = model.support
    with torch.no_grad():
        KSS = k(S).to_dense()
        KXS = k(X, S).to_dense()
        KXX = k(X).to_dense()
    A = torch.linalg.solve(KSS, KXS.T).T
    mean = mu0 + A @ (mean_c - mu0)
    cov = KXX - A @ KXS.T + A @ cov_c @ A.T
    return mean, cov


def term_scales(model: BarycenterGP, X: torch.Tensor) -> tuple[float, float]:
    r"""The magnitudes of the terms the base moments at ``X`` are summed from:
    ``|mu_0| + |k_xS| |a|`` (the mean) and ``k(x, x) + |F_x| |lam| |F_x'|`` (the
    covariance), ``F_x = k_xS G`` (``a, G, lam`` the model's cached parts). Rounding
    errors of sums in other orders are relative to these, not to the (cancelled)
    results."""
    a, G, lam = model._prior_parts()
    with torch.no_grad():
        K = model.covar_module(X, model.support).to_dense()
        F = (K @ G).abs()
        mean = float((K.abs() @ a.abs()).max()) + abs(float(model.mean_constant))
        prior = float(model.covar_module(X, X, diag=True).max())
        cov = prior + float(((F * lam.abs()) @ F.mT).max())
    return mean, cov


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_posterior_on_support_is_the_barycenter(dtype):
    S = grid(6)
    k = kernel()
    _, means, covs = agents(S, k, N=3, n=6)
    w = torch.tensor([0.5, 0.3, 0.2], dtype=F64)
    model = BarycenterGP(S, means, covs, k, weights=w, noise=NOISE)
    m_ref, C_ref = bures_wasserstein_barycenter(means, covs, weights=w)
    torch.testing.assert_close(model.barycenter_mean, (w[:, None] * means).sum(0))
    # the model iterates to a relative change of 1e-7 (its default tol)
    tol_bary = 10 * 1e-7 * float(C_ref.abs().max())
    torch.testing.assert_close(model.barycenter_covariance, C_ref, atol=tol_bary, rtol=0)
    post = model.posterior(S.to(dtype).unsqueeze(0))
    assert post.mean.dtype == dtype and post.mean.shape == (1, 36, 1)
    scale = float(C_ref.diagonal().max())
    # jitter 1e-8 (relative) bounds the float64 error; float32 adds its rounding
    tol = 1e-6 * scale + tol_bary
    if dtype != F64:
        tol += 50 * torch.finfo(dtype).eps
    mean_scale = float(means.abs().max())
    torch.testing.assert_close(
        post.mean.squeeze(0).squeeze(-1).to(F64), m_ref, atol=1e-5 * mean_scale, rtol=0
    )
    torch.testing.assert_close(post.covariance_matrix.squeeze(0).to(F64), C_ref, atol=tol, rtol=0)


def test_off_support_is_dense_gaussian_conditioning():
    S = grid(4)  # coarse: K_SS is well conditioned, the dense solve is exact
    k = kernel(lengthscale=0.25)
    _, means, covs = agents(S, k, N=2, n=5)
    model = BarycenterGP(S, means, covs, k, noise=NOISE, mean_constant=0.2)
    X = torch.rand(7, 2, dtype=F64, generator=torch.Generator().manual_seed(3))
    mean_ref, cov_ref = dense_reference(
        model, X, model.barycenter_mean, model.barycenter_covariance, 0.2
    )
    post = model.posterior(X)
    torch.testing.assert_close(post.mean.squeeze(-1), mean_ref, atol=1e-6, rtol=0)
    torch.testing.assert_close(post.covariance_matrix, cov_ref, atol=1e-7, rtol=0)
    noisy = model.posterior(X, observation_noise=True)
    torch.testing.assert_close(
        noisy.covariance_matrix, cov_ref + NOISE * torch.eye(7, dtype=F64), atol=1e-7, rtol=0
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_one_agent_with_data_on_support_is_its_gp_everywhere(dtype):
    S = grid(7)
    k = kernel()
    gps, means, covs = agents(S, k, N=1, n=10, on_support=True)
    model = BarycenterGP(S, means, covs, k, noise=NOISE, mean_constant=0.2)
    X = torch.rand(2, 5, 2, dtype=F64, generator=torch.Generator().manual_seed(1))
    ours = model.posterior(X.to(dtype))
    with torch.no_grad():
        ref = gps[0].posterior(X)
    atol = 2e-5 if dtype == F64 else 2e-5 + 100 * torch.finfo(dtype).eps
    torch.testing.assert_close(ours.mean.to(F64), ref.mean, atol=atol, rtol=0)
    torch.testing.assert_close(
        ours.covariance_matrix.to(F64), ref.covariance_matrix, atol=atol, rtol=0
    )


def test_continuous_as_a_point_approaches_the_support():
    S = grid(6)
    k = kernel()
    _, means, covs = agents(S, k, N=3, n=6)
    model = BarycenterGP(S, means, covs, k, noise=NOISE)
    i = 14
    with torch.no_grad():
        target_mean = model.posterior(S[i : i + 1]).mean.squeeze()
        target_var = model.posterior(S[i : i + 1]).variance.squeeze()
    errors = []
    for h in (1e-1, 1e-2, 1e-3, 1e-4):
        x = (S[i : i + 1] + h * torch.tensor([[0.6, -0.8]], dtype=F64)).clamp(0, 1)
        with torch.no_grad():
            post = model.posterior(x)
        gap = (post.mean.squeeze() - target_mean).abs()
        errors.append(float(gap + (post.variance.squeeze() - target_var).abs()))
    assert all(b < a for a, b in zip(errors, errors[1:], strict=False)), errors
    assert errors[-1] < 1e-3 * errors[0]


def test_condition_on_observations_is_exact_gp_conditioning():
    S = grid(6)
    k = kernel()
    _, means, covs = agents(S, k, N=2, n=6)
    model = BarycenterGP(S, means, covs, k, noise=NOISE)
    g = torch.Generator().manual_seed(5)
    Xn = torch.rand(3, 2, dtype=F64, generator=g)
    Yn = torch.randn(4, 3, 1, dtype=F64, generator=g)  # 4 fantasies sharing Xn
    Xt = torch.rand(5, 2, dtype=F64, generator=g)
    cond = model.condition_on_observations(Xn, Yn)
    assert cond.batch_shape == torch.Size([4])
    post = cond.posterior(Xt)
    joint = model.posterior(torch.cat([Xn, Xt]))
    mu, C = joint.mean.squeeze(-1), joint.covariance_matrix
    Coo = C[:3, :3] + NOISE * torch.eye(3, dtype=F64)
    gain = torch.linalg.solve(Coo, C[:3, 3:]).T  # 5 x 3
    mean_ref = mu[3:] + (gain @ (Yn.squeeze(-1) - mu[:3]).unsqueeze(-1)).squeeze(-1)
    cov_ref = C[3:, 3:] - gain @ C[:3, 3:]
    # the same conditioning two ways (the model's Cholesky of its own base moments, a
    # dense solve of the joint's): the base moments in other shapes (length-s sums over
    # the support, relative to their terms, term_scales) and the solve with C_oo +
    # noise: 2 (s + 3) cond(C_oo + noise), relative to the terms of mu + gain (Y - mu)
    # and C - gain C
    f = reordering_factor(len(S) + 3, torch.linalg.cond(Coo))
    sm, sc = term_scales(model, torch.cat([Xn, Xt]))
    scale_mean = sm + float((gain.abs() @ (Yn.abs().amax(0).squeeze(-1) + sm)).max())
    scale_cov = sc + float((gain.abs() @ C[:3, 3:].abs()).max())
    assert_close(
        post.mean.squeeze(-1), mean_ref.expand(4, 5), dtype=F64, factor=f, scale=scale_mean
    )
    assert_close(
        post.covariance_matrix, cov_ref.expand(4, 5, 5), dtype=F64, factor=f, scale=scale_cov
    )
    # conditioning twice = conditioning once on both sets: as above over the five
    X2 = torch.rand(2, 2, dtype=F64, generator=g)
    Y2 = torch.randn(4, 2, 1, dtype=F64, generator=g)
    twice = cond.condition_on_observations(X2, Y2).posterior(Xt)
    once = model.condition_on_observations(torch.cat([Xn, X2]), torch.cat([Yn, Y2], -2))
    joint5 = model.posterior(torch.cat([Xn, X2, Xt]))
    C5 = joint5.covariance_matrix.detach()
    C_oo = C5[:5, :5] + NOISE * torch.eye(5, dtype=F64)
    gain5 = torch.linalg.solve(C_oo, C5[:5, 5:]).T
    f = reordering_factor(len(S) + 5, torch.linalg.cond(C_oo))
    sm, _ = term_scales(model, torch.cat([Xn, X2, Xt]))
    Y5 = torch.cat([Yn, Y2], -2).abs().amax(0).squeeze(-1)
    scale_mean = sm + float((gain5.abs() @ (Y5 + sm)).max())
    assert_close(twice.mean, once.posterior(Xt).mean, dtype=F64, factor=f, scale=scale_mean)


def test_one_agent_conditioning_matches_singletaskgp():
    S = grid(7)
    k = kernel()
    gps, means, covs = agents(S, k, N=1, n=8, on_support=True)
    model = BarycenterGP(S, means, covs, k, noise=NOISE, mean_constant=0.2)
    Xn = S[[3, 30]]  # new data on the support too
    Yn = torch.tensor([[0.4], [-0.1]], dtype=F64)
    Xt = torch.rand(4, 2, dtype=F64, generator=torch.Generator().manual_seed(2))
    ours = model.condition_on_observations(Xn, Yn).posterior(Xt)
    ref = gps[0].condition_on_observations(Xn, Yn).posterior(Xt)
    torch.testing.assert_close(ours.mean, ref.mean.detach(), atol=2e-5, rtol=0)
    torch.testing.assert_close(
        ours.covariance_matrix, ref.covariance_matrix.detach(), atol=2e-5, rtol=0
    )


def test_fantasize_and_knowledge_gradient():
    S = grid(5)
    k = kernel()
    _, means, covs = agents(S, k, N=2, n=5)
    model = BarycenterGP(S, means, covs, k, noise=NOISE)
    sampler = SobolQMCNormalSampler(torch.Size([3]), seed=0)
    X = torch.rand(2, 2, 2, dtype=F64)
    fm = model.fantasize(X, sampler)
    assert fm.batch_shape == torch.Size([3, 2])
    assert fm.posterior(torch.rand(3, 2, 1, 2, dtype=F64)).mean.shape == (3, 2, 1, 1)
    kg = qKnowledgeGradient(model, num_fantasies=4)
    bounds = torch.tensor([[0.0, 0.0], [1.0, 1.0]], dtype=F64)
    cand, value = optimize_acqf(
        kg, bounds=bounds, q=2, num_restarts=2, raw_samples=16, options={"maxiter": 20}
    )
    assert cand.shape == (2, 2) and torch.isfinite(value)
    assert ((cand >= 0) & (cand <= 1)).all()


def test_gradients_with_respect_to_inputs():
    S = grid(5)
    k = kernel()
    _, means, covs = agents(S, k, N=2, n=5)
    model = BarycenterGP(S, means, covs, k, noise=NOISE)
    X = torch.rand(1, 2, 2, dtype=F64, requires_grad=True)

    def f(X):
        post = model.posterior(X)
        return post.mean.sum() + post.covariance_matrix.sum()

    assert torch.autograd.gradcheck(f, (X,))


def test_cache_follows_the_kernel():
    S = grid(5)
    k = kernel()
    _, means, covs = agents(S, k, N=2, n=5)
    model = BarycenterGP(S, means, covs, k, noise=NOISE)
    X = torch.rand(4, 2, dtype=F64)
    before = model.posterior(X).mean
    k.base_kernel.lengthscale = 0.1  # a gpytorch setter writes through .data
    after = model.posterior(X).mean
    fresh = BarycenterGP(S, means, covs, k, noise=NOISE).posterior(X).mean
    torch.testing.assert_close(after, fresh)
    assert not torch.allclose(before, after)
    k.base_kernel.nu = 1.5  # a setting, not a tensor
    torch.testing.assert_close(
        model.posterior(X).mean, BarycenterGP(S, means, covs, k, noise=NOISE).posterior(X).mean
    )
    assert not torch.allclose(model.posterior(X).mean, after)


def test_agent_weights():
    S = grid(4)
    k = kernel()
    _, means, covs = agents(S, k, N=3, n=4)
    torch.testing.assert_close(agent_weights("uniform", covs), torch.full((3,), 1 / 3, dtype=F64))
    torch.testing.assert_close(
        agent_weights("data", num_data=[1, 3, 4]), torch.tensor([0.125, 0.375, 0.5], dtype=F64)
    )
    prec = agent_weights("precision", covs)
    inv_mean_var = 1 / covs.diagonal(dim1=-2, dim2=-1).mean(-1)
    torch.testing.assert_close(prec, inv_mean_var / inv_mean_var.sum())
    covs2 = covs.clone()
    covs2[0] = 4 * covs2[0]  # a less certain agent weighs less
    assert agent_weights("precision", covs2)[0] < prec[0]
    for args, kwargs, match in [
        (("nope",), {}, "scheme"),
        (("data",), {}, "num_data"),
        (("data",), {"num_data": [0, 0]}, "at least one"),
        (("data",), {"num_data": [-1, 2]}, "non-negative"),
        (("precision",), {}, "covariances"),
        (("uniform",), {}, "covariances"),
    ]:
        with pytest.raises(ValueError, match=match):
            agent_weights(*args, **kwargs)


def test_agent_models_are_the_local_posteriors():
    S = grid(5)
    k = kernel()
    _, means, covs = agents(S, k, N=3, n=5)
    model = BarycenterGP(S, means, covs, k, noise=NOISE)
    locals_ = model.agent_models()
    assert len(locals_) == 3
    for n, local in enumerate(locals_):
        assert local.num_agents == 1
        torch.testing.assert_close(local.barycenter_covariance, covs[n])
        torch.testing.assert_close(local.barycenter_mean, means[n])


def test_bad_inputs():
    S = grid(4)
    k = kernel()
    _, means, covs = agents(S, k, N=2, n=4)
    with pytest.raises(BotorchTensorDimensionError, match="support"):
        BarycenterGP(grid(5), means, covs, k)  # mismatched supports
    with pytest.raises(ValueError, match="N = 0"):
        BarycenterGP(S, means[:0], covs[:0], k)
    bad = covs.clone()
    bad[1] = bad[1] - 2 * torch.eye(16, dtype=F64)
    with pytest.raises(ValueError, match="positive semi-definite"):
        BarycenterGP(S, means, bad, k)
    with pytest.raises(ValueError, match="sum to one"):
        BarycenterGP(S, means, covs, k, weights=torch.tensor([0.5, 0.6], dtype=F64))
    with pytest.raises(ValueError, match="shape"):
        BarycenterGP(S, means, covs[:, :3, :3], k)
    with pytest.raises(ValueError, match="noise"):
        BarycenterGP(S, means, covs, k, noise=0.0)
    with pytest.raises(TypeError, match="covar_module"):
        BarycenterGP(S, means, covs, "rbf")
    with pytest.raises(InputDataError, match="support"):
        BarycenterGP(S * float("nan"), means, covs, k)
    model = BarycenterGP(S, means, covs, k)
    with pytest.raises(BotorchTensorDimensionError, match="d=2"):
        model.posterior(torch.rand(3, 3, dtype=F64))
    with pytest.raises(InputDataError, match="NaN"):
        model.posterior(torch.full((1, 2), float("nan"), dtype=F64))
    with pytest.raises(BotorchTensorDimensionError, match="Y"):
        model.condition_on_observations(torch.rand(2, 2, dtype=F64), torch.rand(3, 1, dtype=F64))
    with pytest.raises(InputDataError, match="noise"):
        model.condition_on_observations(
            torch.rand(2, 2, dtype=F64), torch.rand(2, 1, dtype=F64), noise=-torch.ones(2, 1)
        )


def test_support_mean_and_cross_covariance_is_the_joint_posterior_block():
    S = grid(5)
    k = kernel()
    _, means, covs = agents(S, k, N=2, n=5)
    model = BarycenterGP(S, means, covs, k, noise=NOISE)
    X = torch.rand(3, 2, 2, dtype=F64, generator=torch.Generator().manual_seed(4))
    mean, cross = model.support_mean_and_cross_covariance(S, X)
    # the same formulas (mu_0 + k_xS a, k_xS' - F_x lam F_S') in other shapes: sums of
    # length s (the support) and r (the kept rank) in other orders, no solve:
    # reordering_factor(s + r), relative to the magnitudes of the terms summed
    f = reordering_factor(len(S) + len(model._prior_parts()[2]))
    for b in range(3):
        joint = model.posterior(torch.cat([S, X[b]]))
        scale_mean, scale_cross = term_scales(model, torch.cat([S, X[b]]))
        assert_close(mean, joint.mean[:25, 0], dtype=F64, factor=f, scale=scale_mean)
        assert_close(
            cross[b], joint.covariance_matrix[25:, :25], dtype=F64, factor=f, scale=scale_cross
        )
    fantasy = model.condition_on_observations(X[0], torch.zeros(2, 1, dtype=F64))
    assert fantasy.support_mean_and_cross_covariance(S, X) is NotImplemented


def test_warns_when_posteriors_and_kernel_are_in_different_units():
    from botorch.exceptions.warnings import InputDataWarning

    S = grid(4)
    k = kernel()
    _, means, covs = agents(S, k, N=2, n=4)
    with pytest.warns(InputDataWarning, match="same outcome units"):
        BarycenterGP(S, 500 * means, 1e5 * covs, k)


def test_to_keeps_the_prediction_cache():
    r"""BoTorch's acquisitions call ``.to(X)`` on every evaluation: that must not
    rebuild the ``K_SS`` factorisation (it did, making a Co-KG round ~15x slower)."""
    S = grid(4)
    k = kernel()
    _, means, covs = agents(S, k, N=2, n=4)
    model = BarycenterGP(S, means, covs, k)
    model.posterior(S[:2])
    parts = model._cache["parts"]
    model.to(torch.float32)
    model.posterior(S[:2].float())
    assert model._cache["parts"] is parts


# ----------------------------------------------------------------------------------
# Agents observing the same design: exact references on an ill-conditioned grid
# ----------------------------------------------------------------------------------
# Agents that observe the *same* inputs (on the support) have identical posterior
# covariances, so their barycenter covariance is that covariance and the barycenter mean
# -- linear in the outcomes -- is the posterior mean of the GP on the averaged outcomes.
# Off the support, conditioning on ``f_S`` is exact because the data lie on ``S``. This
# gives an exact reference (BoTorch's ``SingleTaskGP``) on an ill-conditioned 30 x 30
# grid.

MU0 = 0.2
OUTPUTSCALE = 1.5
JITTER = 1e-8  # BarycenterGP's default relative jitter


@pytest.fixture
def _one_thread_user_warnings_ignored():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            yield
    finally:
        torch.set_num_threads(n)


def matern_or_rbf_kernel(lengthscale: float = 0.3, rbf: bool = False) -> ScaleKernel:
    k = ScaleKernel(RBFKernel() if rbf else MaternKernel(nu=2.5)).to(F64)
    k.base_kernel.lengthscale = lengthscale
    k.outputscale = OUTPUTSCALE
    return k


def fixed_gp(X: torch.Tensor, Y: torch.Tensor, k: ScaleKernel, noise: float) -> SingleTaskGP:
    model = SingleTaskGP(X, Y, covar_module=k, outcome_transform=None)
    model.likelihood.noise = noise
    model.mean_module.constant.data.fill_(MU0)
    return model.eval()


def same_design_agents(S: torch.Tensor, k, N: int, n: int, noise: float, seed: int = 0):
    r"""``N`` agents observing the same ``n`` support points with different outcomes,
    their posteriors on ``S`` and the GP on the averaged outcomes (the reference)."""
    g = torch.Generator().manual_seed(seed)
    X = S[torch.randperm(S.shape[0], generator=g)[:n]]
    base = torch.sin(5 * X[:, :1]) + X[:, 1:] ** 2
    Ys = [base + 0.3 * torch.randn(n, 1, generator=g, dtype=F64) for _ in range(N)]
    means, covs = [], []
    for Y in Ys:
        with torch.no_grad():
            post = fixed_gp(X, Y, k, noise).posterior(S)
        means.append(post.mean[:, 0])
        covs.append(post.covariance_matrix)
    reference = fixed_gp(X, sum(Ys) / N, k, noise)
    return torch.stack(means), torch.stack(covs), reference, X


def small_model(N: int = 3, noise: float = 1e-3, k=None) -> BarycenterGP:
    S = grid(6)
    k = matern_or_rbf_kernel() if k is None else k
    g = torch.Generator().manual_seed(1)
    means, covs = [], []
    for _ in range(N):
        X = torch.rand(6, 2, generator=g, dtype=F64)
        with torch.no_grad():
            post = fixed_gp(X, torch.sin(5 * X[:, :1]) + X[:, 1:] ** 2, k, noise).posterior(S)
        means.append(post.mean[:, 0])
        covs.append(post.covariance_matrix)
    return BarycenterGP(S, torch.stack(means), torch.stack(covs), k, noise=noise)


# ----------------------------------------------------------------------------------
# Accuracy against exact references (the jitter / rank truncation)
# ----------------------------------------------------------------------------------


@pytest.mark.usefixtures("_one_thread_user_warnings_ignored")
@pytest.mark.parametrize("rbf", [False, True])
def test_30x30_grid_same_design_agents_equal_the_gp_on_averaged_data(rbf: bool) -> None:
    r"""Ill-conditioned ``K_SS`` (30 x 30 grid, lengthscale 0.3): on and off the
    support the barycenter GP equals the exact GP. The error budget is the relative
    jitter: ``K_SS + jitter * max(K) I`` perturbs mean and covariance by
    ``O(jitter * outputscale)`` (observed ~3e-8); allowed 20x that."""
    S = grid(30)
    k = matern_or_rbf_kernel(0.3, rbf)
    means, covs, ref, _ = same_design_agents(S, k, N=3, n=20, noise=1e-3)
    model = BarycenterGP(S, means, covs, k, noise=1e-3, mean_constant=MU0)
    g = torch.Generator().manual_seed(5)
    budget = 20 * JITTER * OUTPUTSCALE
    for X in (S[::37], torch.rand(60, 2, generator=g, dtype=F64)):
        with torch.no_grad():
            ours, theirs = model.posterior(X), ref.posterior(X)
        assert (ours.mean - theirs.mean).abs().max() < budget
        assert (ours.covariance_matrix - theirs.covariance_matrix).abs().max() < budget


@pytest.mark.usefixtures("_one_thread_user_warnings_ignored")
def test_one_agent_on_support_is_its_gp_to_jitter_level() -> None:
    r"""N = 1, data on a 12 x 12 grid: the model *is* the agent's GP to the jitter
    budget (test_one_agent_with_data_on_support_is_its_gp_everywhere allows 2e-5, ~1000x
    the actual error)."""
    S = grid(12)
    k = matern_or_rbf_kernel(0.25)
    means, covs, ref, Xd = same_design_agents(S, k, N=1, n=15, noise=1e-3)
    model = BarycenterGP(S, means, covs, k, noise=1e-3, mean_constant=MU0)
    X = torch.cat([Xd, torch.rand(20, 2, generator=torch.Generator().manual_seed(2), dtype=F64)])
    with torch.no_grad():
        ours, theirs = model.posterior(X), ref.posterior(X)
    budget = 20 * JITTER * OUTPUTSCALE
    assert (ours.mean - theirs.mean).abs().max() < budget
    assert (ours.covariance_matrix - theirs.covariance_matrix).abs().max() < budget


# ----------------------------------------------------------------------------------
# BoTorch Model contracts
# ----------------------------------------------------------------------------------


@pytest.mark.usefixtures("_one_thread_user_warnings_ignored")
def test_fantasies_of_fantasies_are_joint_conditioning() -> None:
    r"""Two rounds of ``fantasize`` (batch ``5 x 4 x 3``) = one dense conditioning of
    the base model's joint posterior on both sets of fantasy outcomes."""
    model = small_model()
    g = torch.Generator().manual_seed(0)
    X1 = torch.rand(3, 2, 2, generator=g, dtype=F64)
    X2 = torch.rand(3, 1, 2, generator=g, dtype=F64)
    Xt = torch.rand(3, 4, 2, generator=g, dtype=F64)
    fm = model.fantasize(X1, SobolQMCNormalSampler(torch.Size([4]), seed=0))
    ffm = fm.fantasize(X2, SobolQMCNormalSampler(torch.Size([5]), seed=1))
    assert fm.batch_shape == (4, 3) and ffm.batch_shape == (5, 4, 3)
    Y = ffm._observations[1]  # 5 x 4 x 3 x 3: the outcomes conditioned on
    post = ffm.posterior(Xt)
    assert post.mean.shape == (5, 4, 3, 4, 1)
    # X broadcasting against the model batch: no batch, and an extra leading batch
    assert ffm.posterior(Xt[0]).mean.shape == (5, 4, 3, 4, 1)
    assert ffm.posterior(Xt.expand(2, 5, 4, 3, 4, 2)).mean.shape == (2, 5, 4, 3, 4, 1)
    noise = float(model.noise)
    s = len(model.support)
    for b in range(3):
        joint = model.posterior(torch.cat([X1[b], X2[b], Xt[b]]))
        mu, C = joint.mean[:, 0], joint.covariance_matrix
        C_oo = C[:3, :3] + noise * torch.eye(3, dtype=F64)
        gain = torch.linalg.solve(C_oo, C[:3, 3:])
        cov_ref = C[3:, 3:] - C[3:, :3] @ gain
        mean_ref = mu[3:] + (Y[:, :, b] - mu[:3]) @ gain  # 5 x 4 x 4
        # as test_condition_on_observations_is_exact_gp_conditioning: base moments in
        # other shapes (length-s sums), the solve with the 3 observations' covariance
        f = reordering_factor(s + 3, torch.linalg.cond(C_oo.detach()))
        sm, sc = term_scales(model, torch.cat([X1[b], X2[b], Xt[b]]))
        g = gain.detach().abs().mT
        scale_mean = sm + float((g @ (Y[:, :, b].abs().amax((0, 1)) + sm)).max())
        scale_cov = sc + float((g @ C[:3, 3:].detach().abs()).max())
        assert_close(post.mean[:, :, b, :, 0], mean_ref, dtype=F64, factor=f, scale=scale_mean)
        assert_close(
            post.covariance_matrix[:, :, b],
            cov_ref.expand(5, 4, 4, 4),
            dtype=F64,
            factor=f,
            scale=scale_cov,
        )


@pytest.mark.usefixtures("_one_thread_user_warnings_ignored")
def test_observation_noise_tensor_and_scalarized_transform() -> None:
    model = small_model()
    X = torch.rand(3, 4, 2, generator=torch.Generator().manual_seed(3), dtype=F64)
    base = model.posterior(X)
    for noise in (torch.tensor(0.1, dtype=F64), torch.full((3, 4, 1), 0.1, dtype=F64)):
        noisy = model.posterior(X, observation_noise=noise)
        # the same covariance c plus 0.1 on the diagonal (one rounding, <= eps / 2 of
        # c + 0.1), minus c (one more): relative to max |c| + 0.1
        cov = base.covariance_matrix
        assert_close(
            noisy.covariance_matrix - cov,
            0.1 * torch.eye(4, dtype=F64).expand(3, 4, 4),
            dtype=F64,
            factor=1,
            scale=cov.abs().max() + 0.1,
        )
    pt = ScalarizedPosteriorTransform(weights=torch.tensor([2.0], dtype=F64), offset=1.0)
    post = model.posterior(X, posterior_transform=pt)
    # the same moments scaled by powers of 2 (exact) and offset by 1 (one rounding of
    # 2 m + 1 on each side)
    assert_close(post.mean, 2 * base.mean + 1, dtype=F64, factor=2)
    assert_close(post.variance, 4 * base.variance, dtype=F64, factor=2)


@pytest.mark.usefixtures("_one_thread_user_warnings_ignored")
def test_qkg_values_and_gradients_equal_singletaskgp_qkg() -> None:
    r"""N = 1, data on the support: BoTorch's qKG on the barycenter GP (fantasies,
    gradients through the fantasy model w.r.t. every row of X) = qKG on the agent's
    SingleTaskGP with the same base samples."""
    S = grid(7)
    k = matern_or_rbf_kernel()
    means, covs, ref, _ = same_design_agents(S, k, N=1, n=10, noise=1e-3)
    model = BarycenterGP(S, means, covs, k, noise=1e-3, mean_constant=MU0)
    nf = 8
    X = torch.rand(4, 2 + nf, 2, generator=torch.Generator().manual_seed(0), dtype=F64)
    values, grads = [], []
    for m in (model, ref):
        kg = qKnowledgeGradient(
            m, num_fantasies=None, sampler=SobolQMCNormalSampler(torch.Size([nf]), seed=0)
        )
        Xg = X.clone().requires_grad_(True)
        v = kg(Xg)
        (g,) = torch.autograd.grad(v.sum(), Xg)
        values.append(v.detach())
        grads.append(g)
    assert grads[1].abs().max() > 0.1
    # the models agree to the jitter level (~3e-8); observed differences 8e-9 in the
    # values and 2e-7 (relative) in the gradients, allowed ~1000x that
    assert (values[0] - values[1]).abs().max() < 1e-5
    assert (grads[0] - grads[1]).abs().max() < 1e-4 * grads[1].abs().max()


@pytest.mark.usefixtures("_one_thread_user_warnings_ignored")
def test_botorch_acquisitions_and_optimize_acqf_run_finite() -> None:
    model = small_model()
    S = model.support
    bounds = torch.tensor([[0.0, 0.0], [1.0, 1.0]], dtype=F64)
    for acqf, q in [
        (UpperConfidenceBound(model, beta=2.0), 1),
        (qLogNoisyExpectedImprovement(model, X_baseline=S), 2),
        (qMaxValueEntropy(model, candidate_set=S), 1),
        (qLowerBoundMaxValueEntropy(model, candidate_set=S), 1),
    ]:
        x, v = optimize_acqf(
            acqf, bounds, q=q, num_restarts=2, raw_samples=16, options={"maxiter": 10}
        )
        assert x.shape == (q, 2) and torch.isfinite(v).all(), type(acqf).__name__


@pytest.mark.usefixtures("_one_thread_user_warnings_ignored")
def test_cache_follows_optimizer_steps_and_load_state_dict() -> None:
    k = matern_or_rbf_kernel()
    model = small_model(k=k)
    X = torch.rand(5, 2, generator=torch.Generator().manual_seed(4), dtype=F64)
    before = model.posterior(X).mean.detach()
    opt = torch.optim.SGD(list(k.parameters()), lr=0.1)
    model.posterior(X).variance.sum().backward()
    opt.step()  # in-place parameter update
    after = model.posterior(X).mean.detach()
    fresh = (
        BarycenterGP(model.support, model.means, model.covariances, k, noise=1e-3)
        .posterior(X)
        .mean.detach()
    )
    assert (after - before).abs().max() > 1e-4
    assert torch.equal(after, fresh)
    other = small_model(N=3, k=matern_or_rbf_kernel(0.5))  # other kernel values, same shapes
    other.posterior(X)  # fill its cache
    other.load_state_dict(model.state_dict())
    assert torch.equal(other.posterior(X).mean, model.posterior(X).mean)


# ----------------------------------------------------------------------------------
# float32 inputs, gradients w.r.t. hyperparameters, in-place edits
# ----------------------------------------------------------------------------------


@pytest.mark.usefixtures("_one_thread_user_warnings_ignored")
@pytest.mark.parametrize("acqf_cls", ["ucb", "posterior_mean"])
def test_analytic_acquisition_with_float32_inputs(acqf_cls: str) -> None:
    model = small_model()
    make = {
        "ucb": lambda m: UpperConfidenceBound(m, beta=2.0),
        "posterior_mean": lambda m: PosteriorMean(m),
    }[acqf_cls]
    X = torch.rand(4, 1, 2, generator=torch.Generator().manual_seed(0), dtype=F64)
    Xg = X.clone().requires_grad_(True)
    expected = make(small_model())(Xg)
    (grad,) = torch.autograd.grad(expected.sum(), Xg)
    expected = expected.detach()
    value = make(model)(X.float())
    assert value.dtype == torch.float32
    # float64 maths on the float32-rounded inputs (each coordinate moved by <= eps32 / 2
    # of itself: first order |d acq / dx| |x| eps32 / 2), then the value rounded to
    # float32 (eps32 / 2 relative); slack 2
    e = eps(torch.float32)
    bound = e * ((grad.abs() * X.abs()).sum((-2, -1)) + expected.abs())
    assert_within(value, expected, bound)


@pytest.mark.usefixtures("_one_thread_user_warnings_ignored")
def test_float32_call_leaves_the_model_and_shared_kernel_in_float64() -> None:
    k = matern_or_rbf_kernel()
    model = small_model(k=k)
    try:
        PosteriorMean(model)(torch.rand(3, 1, 2))
    except RuntimeError:
        pass  # whether the call succeeds: test_analytic_acquisition_with_float32_inputs
    assert model.barycenter_covariance.dtype == F64
    assert k.base_kernel.raw_lengthscale.dtype == F64  # e.g. the agents' GPs' kernel


@pytest.mark.usefixtures("_one_thread_user_warnings_ignored")
def test_gradient_with_respect_to_kernel_hyperparameters() -> None:
    k = matern_or_rbf_kernel()
    model = small_model(k=k)
    X = torch.rand(4, 2, generator=torch.Generator().manual_seed(1), dtype=F64)
    raw = k.base_kernel.raw_lengthscale

    def f() -> torch.Tensor:
        # as gpytorch's models: caches are detached unless detach_test_caches is off
        with gpytorch.settings.detach_test_caches(False):
            return model.posterior(X).mean.sum()

    (autograd,) = torch.autograd.grad(f(), raw)
    h = 1e-5
    with torch.no_grad():
        raw.add_(h)
        up = f().item()
        raw.sub_(2 * h)
        down = f().item()
        raw.add_(h)
    fd = (up - down) / (2 * h)
    assert abs(autograd.item() - fd) < 1e-4 * max(1.0, abs(fd))


@pytest.mark.usefixtures("_one_thread_user_warnings_ignored")
def test_in_place_data_edit_of_mean_constant_is_seen() -> None:
    model = small_model()
    X = torch.rand(4, 2, generator=torch.Generator().manual_seed(2), dtype=F64)
    model.posterior(X)  # fill the cache
    model.mean_constant.data.fill_(1.0)
    fresh = BarycenterGP(
        model.support,
        model.means,
        model.covariances,
        model.covar_module,
        noise=1e-3,
        mean_constant=1.0,
    )
    # exact: the edit changes the cache key, so the model recomputes its parts by the ops
    # the fresh model runs on the same buffers (the same barycenter, the same kernel)
    assert torch.equal(model.posterior(X).mean, fresh.posterior(X).mean)
