r"""Independent dense reference computations for the dPITC tests.

Everything here forms the full ``n x n`` matrices of the PITC model over the
pooled data (block-diagonal ``Lambda`` with one block per client) and uses dense
solves, in the way a textbook states the model (Quinonero-Candela & Rasmussen,
2005) -- no summaries, no whitening, no Cholesky updates.
"""

from __future__ import annotations

import math

import torch
from gpytorch.kernels import RBFKernel, ScaleKernel
from gpytorch.likelihoods import GaussianLikelihood
from gpytorch.means import ConstantMean
from torch import Tensor

from botorch_fed.inducing import global_support, local_centers


def make_modules(d: int, dtype: torch.dtype, lengthscale: float, noise: float = 1e-2):
    r"""A scaled RBF kernel, Gaussian likelihood and constant mean with set values."""
    k = ScaleKernel(RBFKernel(ard_num_dims=d)).to(dtype)
    k.base_kernel.lengthscale = torch.full((1, d), lengthscale, dtype=dtype)
    k.outputscale = torch.tensor(1.3, dtype=dtype)
    lik = GaussianLikelihood().to(dtype)
    lik.noise = torch.tensor([noise], dtype=dtype)
    mean = ConstantMean().to(dtype)
    mean.constant.data.fill_(0.3)
    return k, lik, mean


def jittered_kss(support: Tensor, k, jitter: float) -> Tensor:
    K = k(support).to_dense()
    return K + jitter * K.diagonal().mean() * torch.eye(K.shape[-1], dtype=K.dtype)


def dense_pitc_covariance(clients, support, k, noise: Tensor, jitter: float) -> Tensor:
    r"""``Q_ff + Lambda`` over the pooled data (block-diagonal ``Lambda``)."""
    X = torch.cat([c[0] for c in clients])
    K_SS = jittered_kss(support, k, jitter)
    K_fS = k(X, support).to_dense()
    Q = K_fS @ torch.linalg.solve(K_SS, K_fS.mT)
    K = k(X).to_dense()
    blocks = torch.block_diag(*[torch.ones(len(c[0]), len(c[0])) for c in clients]).bool()
    Lam = torch.where(blocks, K - Q, torch.zeros_like(K)) + noise * torch.eye(len(X), dtype=K.dtype)
    return Q + Lam


def dense_pitc_posterior(clients, support, k, lik, mean, X_test, jitter: float):
    r"""PITC predictive mean (``q``) and covariance (``q x q``) with dense solves."""
    X = torch.cat([c[0] for c in clients])
    y = torch.cat([c[1] for c in clients]).squeeze(-1)
    C = dense_pitc_covariance(clients, support, k, lik.noise, jitter)
    K_SS = jittered_kss(support, k, jitter)
    Q_uf = k(X_test, support).to_dense() @ torch.linalg.solve(K_SS, k(support, X).to_dense())
    mu_u = mean(X_test) if mean is not None else torch.zeros(len(X_test), dtype=X.dtype)
    mu_f = mean(X) if mean is not None else torch.zeros(len(X), dtype=X.dtype)
    post_mean = mu_u + Q_uf @ torch.linalg.solve(C, y - mu_f)
    post_cov = k(X_test).to_dense() - Q_uf @ torch.linalg.solve(C, Q_uf.mT)
    return post_mean, post_cov


def dense_pitc_log_likelihood(clients, support, k, lik, mean, jitter: float) -> Tensor:
    r"""``log N(y; mu, Q_ff + Lambda)`` via a dense Cholesky."""
    X = torch.cat([c[0] for c in clients])
    y = torch.cat([c[1] for c in clients]).squeeze(-1)
    C = dense_pitc_covariance(clients, support, k, lik.noise, jitter)
    r = y - (mean(X) if mean is not None else 0.0)
    L = torch.linalg.cholesky(C)
    alpha = torch.cholesky_solve(r.unsqueeze(-1), L).squeeze(-1)
    n = len(y)
    return -0.5 * (r @ alpha + 2 * L.diagonal().log().sum() + n * math.log(2 * math.pi))


def exact_gp_posterior(X, y, k, lik, mean, X_test):
    r"""Exact GP predictive mean and covariance with dense solves."""
    K = k(X).to_dense() + lik.noise * torch.eye(len(X), dtype=X.dtype)
    K_uf = k(X_test, X).to_dense()
    r = y.squeeze(-1) - mean(X)
    post_mean = mean(X_test) + K_uf @ torch.linalg.solve(K, r)
    post_cov = k(X_test).to_dense() - K_uf @ torch.linalg.solve(K, K_uf.mT)
    return post_mean, post_cov


def random_federation(seed: int, dtype: torch.dtype, num_clients: int, d: int, m: int, sizes=None):
    r"""Clients with unequal sizes in different regions of ``[0, 1]^d``, and a support."""
    g = torch.Generator().manual_seed(seed)
    if sizes is None:
        sizes = torch.randint(1, 12, (num_clients,), generator=g).tolist()
    clients = []
    for n in sizes:
        center = torch.rand(d, generator=g, dtype=torch.float64)
        X = (center + 0.25 * torch.rand(n, d, generator=g, dtype=torch.float64)).clamp(0, 1)
        y = torch.sin(6 * X).sum(-1, keepdim=True) + 0.1 * torch.randn(
            n, 1, generator=g, dtype=torch.float64
        )
        clients.append((X.to(dtype), y.to(dtype)))
    support = torch.rand(m, d, generator=g, dtype=torch.float64).to(dtype)
    return clients, support


def overlapping_federation(scale: float = 1.0):
    r"""Three clients of 20 points in overlapping boxes of [0, 1]^2 and Alg. 1's support
    of 16 points (ill-conditioned at lengthscale 1: cond(K_SS) ~ 1e9)."""
    g = torch.Generator().manual_seed(0)
    clients = []
    for c in (0.0, 0.25, 0.5):
        X = torch.rand(20, 2, generator=g, dtype=torch.float64) * 0.5 + c
        clients.append((X, scale * torch.sin(6 * X).sum(-1, keepdim=True)))
    centers = [local_centers(X, k=8, seed=i) for i, (X, _) in enumerate(clients)]
    return clients, global_support(centers, 16)
