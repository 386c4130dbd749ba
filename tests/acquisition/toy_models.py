r"""Small fixed-hyperparameter models and dense reference posteriors for the tests.

No fitting (fast and deterministic): kernels, noise and means are set by hand, and
:func:`dense_gp_posterior` computes the exact GP posterior with dense solves, the way
a textbook states it, independently of GPyTorch's prediction strategy.
"""

from __future__ import annotations

import math

import torch
from botorch.models import SingleTaskGP
from gpytorch.kernels import RBFKernel, ScaleKernel
from gpytorch.likelihoods import GaussianLikelihood
from gpytorch.means import ConstantMean
from torch import Tensor

from botorch_fed.models import FederatedPITCGP

NOISE = 1e-3
OUTPUTSCALE = 1.3
CONSTANT = 0.2


def objective(X: Tensor) -> Tensor:
    r"""A smooth toy function ``n x d -> n x 1``."""
    return (torch.sin(3.0 * X) + 0.5 * torch.cos(5.0 * X)).sum(-1, keepdim=True)


def toy_data(seed: int, n: int, d: int, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    g = torch.Generator().manual_seed(seed)
    X = torch.rand(n, d, generator=g, dtype=torch.float64).to(dtype)
    return X, objective(X)


def make_kernel(d: int, dtype: torch.dtype, lengthscale: float = 0.3) -> ScaleKernel:
    k = ScaleKernel(RBFKernel(ard_num_dims=d)).to(dtype)
    k.base_kernel.lengthscale = torch.full((1, d), lengthscale, dtype=dtype)
    k.outputscale = torch.tensor(OUTPUTSCALE, dtype=dtype)
    return k


def make_likelihood(dtype: torch.dtype) -> GaussianLikelihood:
    lik = GaussianLikelihood().to(dtype)
    lik.noise = torch.tensor([NOISE], dtype=dtype)
    return lik


def make_stgp(
    X: Tensor, Y: Tensor, lengthscale: float = 0.3, standardize: bool = False
) -> SingleTaskGP:
    r"""A ``SingleTaskGP`` with set hyperparameters (no outcome transform by default)."""
    d, dtype = X.shape[-1], X.dtype
    kwargs = {} if standardize else {"outcome_transform": None}
    model = SingleTaskGP(
        X,
        Y,
        covar_module=make_kernel(d, dtype, lengthscale),
        likelihood=make_likelihood(dtype),
        mean_module=ConstantMean().to(dtype),
        **kwargs,
    )
    model.mean_module.constant.data.fill_(CONSTANT)
    return model.eval()


def make_pitc(
    clients: list[tuple[Tensor, Tensor]], support: Tensor, lengthscale: float = 0.3
) -> FederatedPITCGP:
    d, dtype = support.shape[-1], support.dtype
    return FederatedPITCGP.from_client_data(
        clients, support, make_kernel(d, dtype, lengthscale), make_likelihood(dtype)
    )


def rbf(X1: Tensor, X2: Tensor, lengthscale: float) -> Tensor:
    r"""``OUTPUTSCALE * exp(-|x - x'|^2 / (2 l^2))`` written out."""
    sq = ((X1.unsqueeze(-2) - X2.unsqueeze(-3)) / lengthscale).pow(2).sum(-1)
    return OUTPUTSCALE * torch.exp(-0.5 * sq)


def dense_gp_posterior(
    X: Tensor, Y: Tensor, X_test: Tensor, lengthscale: float = 0.3
) -> tuple[Tensor, Tensor]:
    r"""Exact GP posterior mean (``n*``) and covariance (``n* x n*``) in float64."""
    X, Y, X_test = (t.to(torch.float64) for t in (X, Y, X_test))
    K = rbf(X, X, lengthscale) + NOISE * torch.eye(len(X), dtype=torch.float64)
    K_s = rbf(X_test, X, lengthscale)
    resid = Y.squeeze(-1) - CONSTANT
    mean = CONSTANT + K_s @ torch.linalg.solve(K, resid)
    cov = rbf(X_test, X_test, lengthscale) - K_s @ torch.linalg.solve(K, K_s.mT)
    return mean, cov


def normal_cdf(x: float) -> float:
    return 0.5 * (1.0 + math.erf(x / math.sqrt(2.0)))
