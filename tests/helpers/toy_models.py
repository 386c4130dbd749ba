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

from botorch_fed.models import FederatedPITCGP, default_jitter
from tests.helpers.tolerances import gp_posterior_error_factors, sqrt_error

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


def kernel_rounding(points: Tensor, lengthscale: float) -> float:
    r"""``kappa``: relative rounding error, in units of ``eps``, of an RBF entry as formed.

    GPyTorch forms ``|x - x'|^2 / l^2`` as ``|x|^2 + |x'|^2 - 2 x'x'`` on centred,
    scaled inputs: absolute error ``<= 4 eps R^2 / l^2`` (``R``: largest distance from
    the centroid); the lengthscale's own rounding (softplus) adds ``~2 eps`` relative,
    i.e. ``eps D^2 / l^2`` (``D``: largest distance); ``exp`` and the outputscale a few
    ``eps``. The exponent's absolute error is the entry's relative error.
    """
    pts = points.detach().to(torch.float64)
    R2 = (pts - pts.mean(0)).pow(2).sum(-1).max()
    D2 = torch.cdist(pts, pts).max() ** 2
    return float((4 * R2 + D2) / lengthscale**2 + 4)


def _ucb_bound(f_mean, f_var, var, beta, eps):
    sigma_err = sqrt_error(var, eps * f_var)
    return eps * f_mean + math.sqrt(beta) * (sigma_err + eps * var.sqrt())


def ucb_error_bound(
    X: Tensor,
    Y: Tensor,
    X_test: Tensor,
    beta: float,
    dtype: torch.dtype,
    lengthscale: float = 0.3,
    standardize: bool = False,
) -> Tensor:
    r"""Rounding-error bound of ``UCB = mean + sqrt(beta) sigma`` of :func:`make_stgp`'s
    model computed in ``dtype``, at each of the ``n*`` test points.

    :func:`~tests.helpers.tolerances.gp_posterior_error_factors` for the mean and variance;
    the variance error enters ``sigma`` through :func:`~tests.helpers.tolerances.sqrt_error`.
    With ``standardize`` the model works on ``(Y - mean) / std`` (BoTorch's
    ``Standardize``) and its moments are scaled back by ``std`` and ``std^2``.
    """
    X, Y, X_test = (t.detach().to(torch.float64) for t in (X, Y, X_test))
    y, shift, s = Y.squeeze(-1), 0.0, 1.0
    if standardize:
        shift, s = y.mean(), y.std()
        y = (y - shift) / s
    K = rbf(X, X, lengthscale) + NOISE * torch.eye(len(X), dtype=torch.float64)
    K_s = rbf(X_test, X, lengthscale)
    k_ss = torch.full((len(X_test),), OUTPUTSCALE, dtype=torch.float64)
    kappa = kernel_rounding(torch.cat([X, X_test]), lengthscale)
    f_mean, f_var = gp_posterior_error_factors(
        K, K_s, k_ss, y - CONSTANT, kappa, r_mag=y.abs() + CONSTANT
    )
    var = k_ss - (K_s * torch.linalg.solve(K, K_s.mT).mT).sum(-1)
    mean = CONSTANT + K_s @ torch.linalg.solve(K, y - CONSTANT)
    eps = torch.finfo(dtype).eps
    bound = s * _ucb_bound(f_mean, f_var, var.clamp_min(0), beta, eps)
    # standardisation: m = shift + s m_std, v = s^2 v_std, and their roundings
    return bound + 2 * eps * (abs(float(shift)) + s * mean.abs())


def pitc_ucb_error_bound(
    clients: list[tuple[Tensor, Tensor]],
    support: Tensor,
    X_test: Tensor,
    beta: float,
    dtype: torch.dtype,
    lengthscale: float = 0.3,
) -> Tensor:
    r"""As :func:`ucb_error_bound` for :func:`make_pitc`'s model.

    The PITC posterior is the GP posterior with covariance ``C = Q_ff + Lambda`` and
    cross-covariance ``Q_*f`` (``Q_ab = K_aS K_SS^-1 K_Sb``, block-diagonal ``Lambda``
    one block per client). Entries of ``Q`` go through ``K_SS^-1``: their relative
    rounding is ``kappa + m cond(K_SS)`` (``m`` support points).
    """
    to64 = lambda t: t.detach().to(torch.float64)  # noqa: E731
    X = to64(torch.cat([c[0] for c in clients]))
    y = to64(torch.cat([c[1] for c in clients])).squeeze(-1)
    S, X_test = to64(support), to64(X_test)
    K_SS = rbf(S, S, lengthscale)
    K_SS = K_SS + default_jitter(torch.float64) * K_SS.diagonal().mean() * torch.eye(len(S))
    Q = lambda A, B: rbf(A, S, lengthscale) @ torch.linalg.solve(K_SS, rbf(S, B, lengthscale))  # noqa: E731
    blocks = torch.block_diag(*[torch.ones(len(c[0]), len(c[0])) for c in clients]).bool()
    K = rbf(X, X, lengthscale)
    C = Q(X, X) + torch.where(blocks, K - Q(X, X), 0.0) + NOISE * torch.eye(len(X))
    K_s = Q(X_test, X)
    k_ss = torch.full((len(X_test),), OUTPUTSCALE, dtype=torch.float64)
    kappa = kernel_rounding(torch.cat([X, S, X_test]), lengthscale)
    kappa += len(S) * float(torch.linalg.cond(K_SS))
    f_mean, f_var = gp_posterior_error_factors(
        C, K_s, k_ss, y - CONSTANT, kappa, r_mag=y.abs() + CONSTANT
    )
    var = k_ss - (K_s * torch.linalg.solve(C, K_s.mT).mT).sum(-1)
    eps = torch.finfo(dtype).eps
    return _ucb_bound(f_mean, f_var, var.clamp_min(0), beta, eps) + 2 * eps
