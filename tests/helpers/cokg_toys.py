r"""Toy GPs for the Co-KG acquisition tests: RBF GPs with fixed hyperparameters, as
BoTorch ``SingleTaskGP`` s and as a dense float64 reference posterior built from the same
numbers, and the agents' BarycenterGPs on a grid."""

from __future__ import annotations

import torch
from botorch.models import SingleTaskGP
from botorch.models.transforms.outcome import Standardize
from gpytorch.kernels import RBFKernel, ScaleKernel
from gpytorch.likelihoods import GaussianLikelihood
from torch import Tensor

from botorch_fed.models import BarycenterGP

LENGTHSCALE = 0.25
OUTPUTSCALE = 1.5
NOISE = 0.01
CONSTANT = 0.3


class ToyGP:
    r"""Training data and fixed hyperparameters of an RBF GP: a ``SingleTaskGP`` and
    a dense float64 reference posterior built from the same numbers."""

    def __init__(self, X: Tensor, Y: Tensor, noise: float = NOISE) -> None:
        self.X, self.Y, self.noise = X, Y, noise

    def model(self, dtype: torch.dtype = torch.float64, standardize: bool = False) -> SingleTaskGP:
        d = self.X.shape[-1]
        kernel = ScaleKernel(RBFKernel(ard_num_dims=d)).to(dtype)
        kernel.base_kernel.lengthscale = torch.full((1, d), LENGTHSCALE, dtype=dtype)
        kernel.outputscale = torch.tensor(OUTPUTSCALE, dtype=dtype)
        likelihood = GaussianLikelihood().to(dtype)
        likelihood.noise = torch.tensor([self.noise], dtype=dtype)
        model = SingleTaskGP(
            self.X.to(dtype),
            self.Y.to(dtype),
            covar_module=kernel,
            likelihood=likelihood,
            outcome_transform=Standardize(1) if standardize else None,
        )
        if not standardize:
            model.mean_module.constant.data.fill_(CONSTANT)
        return model.eval()

    def posterior(self, P: Tensor) -> tuple[Tensor, Tensor]:
        r"""Dense posterior mean ``p`` and covariance ``p x p`` of ``f`` at ``P``."""
        X, y, P = self.X.double(), self.Y.double()[:, 0], P.double()
        K = rbf(X, X) + self.noise * torch.eye(len(X), dtype=torch.float64)
        Kp = rbf(P, X)
        mean = CONSTANT + Kp @ torch.linalg.solve(K, y - CONSTANT)
        cov = rbf(P, P) - Kp @ torch.linalg.solve(K, Kp.T)
        return mean, cov


def rbf(A: Tensor, B: Tensor) -> Tensor:
    return OUTPUTSCALE * torch.exp(-0.5 * torch.cdist(A, B).pow(2) / LENGTHSCALE**2)


def toy(seed: int, n: int, d: int = 2, noise: float = NOISE) -> ToyGP:
    g = torch.Generator().manual_seed(seed)
    X = torch.rand(n, d, generator=g, dtype=torch.float64)
    Y = torch.sin(4.0 * X).sum(-1, keepdim=True) + 0.1 * torch.randn(
        n, 1, generator=g, dtype=torch.float64
    )
    return ToyGP(X, Y, noise)


def grid(k: int, dtype: torch.dtype = torch.float64) -> Tensor:
    t = torch.linspace(0.0, 1.0, k, dtype=dtype)
    return torch.cartesian_prod(t, t)


def cond_factor(toy_gp: ToyGP, n_points: int) -> float:
    r"""Rounding amplification of the dense posterior: ``cond(K + noise I)`` times the
    number of points involved (a generous polynomial factor)."""
    X = toy_gp.X.double()
    K = rbf(X, X) + toy_gp.noise * torch.eye(len(X), dtype=torch.float64)
    return float(torch.linalg.cond(K)) * (len(X) + n_points)


def barycenter_models(N: int) -> tuple[BarycenterGP, list[BarycenterGP], Tensor]:
    r"""Central and local BarycenterGPs of ``N`` agents' SingleTaskGPs on a 6 x 6 grid."""
    support = grid(6)
    posteriors = [toy(20 + n, 4 + n).model().posterior(support) for n in range(N)]
    means = torch.stack([p.mean[:, 0] for p in posteriors]).detach()
    covs = torch.stack([p.distribution.covariance_matrix for p in posteriors]).detach()
    kernel = toy(0, 1).model().covar_module  # the agents' shared prior kernel
    central = BarycenterGP(support, means, covs, kernel, noise=NOISE, mean_constant=CONSTANT)
    return central, central.agent_models(), support
