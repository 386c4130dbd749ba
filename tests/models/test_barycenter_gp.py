r"""BarycenterGP (Co-KG's central model) against independent computations.

The references: the barycenter of ``bures_wasserstein_barycenter`` (itself checked
against closed forms and POT), dense Gaussian conditioning written out with
``torch.linalg.solve``, and BoTorch's own ``SingleTaskGP``: when an agent's data lie on
the support, its discretised posterior conditioned off the support *is* its GP
posterior everywhere (the data are independent of ``f(X)`` given ``f_S``).
"""

from __future__ import annotations

import pytest
import torch
from botorch.acquisition import qKnowledgeGradient
from botorch.exceptions.errors import BotorchTensorDimensionError, InputDataError
from botorch.models import SingleTaskGP
from botorch.optim import optimize_acqf
from botorch.sampling import SobolQMCNormalSampler
from gpytorch.kernels import MaternKernel, ScaleKernel

from botorch_fed.models import BarycenterGP, agent_weights, bures_wasserstein_barycenter

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
    torch.testing.assert_close(post.mean.squeeze(-1), mean_ref, atol=1e-9, rtol=1e-9)
    torch.testing.assert_close(
        post.covariance_matrix, cov_ref.expand(4, 5, 5), atol=1e-9, rtol=1e-9
    )
    # conditioning twice = conditioning once on both sets
    X2 = torch.rand(2, 2, dtype=F64, generator=g)
    Y2 = torch.randn(4, 2, 1, dtype=F64, generator=g)
    twice = cond.condition_on_observations(X2, Y2).posterior(Xt)
    once = model.condition_on_observations(torch.cat([Xn, X2]), torch.cat([Yn, Y2], -2))
    torch.testing.assert_close(twice.mean, once.posterior(Xt).mean, atol=1e-9, rtol=1e-9)


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
    for b in range(3):
        joint = model.posterior(torch.cat([S, X[b]]))
        torch.testing.assert_close(mean, joint.mean[:25, 0], atol=1e-12, rtol=0)
        torch.testing.assert_close(cross[b], joint.covariance_matrix[25:, :25], atol=1e-12, rtol=0)
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
