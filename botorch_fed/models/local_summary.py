r"""A client's dPITC summary, computed from its private data.

Each client ``i`` holds private data ``(X_i, y_i)``; all parties share a support
set ``S`` (``m`` points) and the GP hyperparameters. The client summarises its data
on ``S`` (eq. 6-7 of [FBO-FedGP], App. A) as

    Lambda_i = K_ii - Q_ii + sigma^2 I,         Q_ii = K_iS K_SS^-1 K_Si,
    b_i      = K_Si Lambda_i^-1 (y_i - mu_i),
    A_i      = K_Si Lambda_i^-1 K_iS,

and sends them *whitened* with ``L = chol(K_SS)`` (computable by every party), as a
:class:`~botorch_fed.models.sparse_summary.SparseSummary`: ``b~_i = L^-1 b_i``,
``A~_i = L^-1 A_i L^-T`` and the scalars ``y_i' Lambda_i^-1 y_i``, ``log|Lambda_i|`` and
``n_i``. :func:`compute_local_summary` validates its inputs; :func:`local_summary` is
the same maths for callers that validated them already.

References:

.. [FBO-FedGP] Secure federated Bayesian optimisation with distributed sparse GPs,
   Sec. 2 and App. A (paper 000 in ``shared/papers``).
.. [Chen2012] J. Chen et al. Decentralized data fusion and active sensing with
   mobile sensors for modeling and predicting spatiotemporal traffic phenomena.
   UAI 2012.
"""

from __future__ import annotations

import torch
from botorch.exceptions.errors import (
    BotorchTensorDimensionError,
    InputDataError,
    UnsupportedError,
)
from botorch.models.transforms.input import InputTransform
from gpytorch.kernels import Kernel
from gpytorch.likelihoods import GaussianLikelihood, Likelihood
from gpytorch.means import Mean
from torch import Tensor

from botorch_fed.models.float64 import _to64, evaluate64, noise64
from botorch_fed.models.sparse_summary import SparseSummary
from botorch_fed.models.support_set import (
    _check_finite,
    check_input_transform,
    support_factor,
    transform_support_inputs,
    validate_support,
)


def _noise_from_likelihood(likelihood: Likelihood) -> Tensor:
    if not isinstance(likelihood, GaussianLikelihood):
        raise UnsupportedLikelihoodError(likelihood)
    noise = likelihood.noise
    if not torch.isfinite(noise).all() or (noise <= 0).any():
        raise InputDataError(
            f"`likelihood.noise` must be positive and finite, got {noise.detach().tolist()}."
        )
    return noise


class UnsupportedLikelihoodError(TypeError):
    r"""Raised for likelihoods other than a homoskedastic ``GaussianLikelihood``."""

    def __init__(self, likelihood: object) -> None:
        super().__init__(
            "`likelihood` must be a gpytorch GaussianLikelihood (homoskedastic "
            f"noise), got {type(likelihood).__name__}. Pass known per-point noise via "
            "`train_Yvar` instead."
        )


def compute_local_summary(
    train_X: Tensor,
    train_Y: Tensor,
    support: Tensor,
    covar_module: Kernel,
    likelihood: Likelihood,
    mean_module: Mean | None = None,
    train_Yvar: Tensor | None = None,
    jitter: float | None = None,
    support_chol: Tensor | None = None,
    input_transform: InputTransform | None = None,
) -> SparseSummary:
    r"""The whitened dPITC summary of one client (or of clients stacked in a batch).

    Implements eq. 6-7 of [FBO-FedGP] (App. A) followed by whitening with
    ``L = chol(K_SS)``. Fully differentiable in the data and in the hyperparameters
    of ``covar_module``, ``likelihood``, ``mean_module`` and ``input_transform``. All
    linear algebra runs in float64 (see :func:`support_cholesky`); the summary is
    float64 whatever the input dtype (it travels as float64 anyway).

    Args:
        train_X: ``batch_shape x n x d`` inputs of the client(s); ``n >= 1``.
        train_Y: ``batch_shape' x n x 1`` outcomes (outcome-transformed if the
            federation transforms outcomes); ``batch_shape'`` must broadcast with
            ``batch_shape`` (e.g. fantasies ``num_fantasies x batch_shape``).
        support: ``m x d`` shared support set (in the original input space).
        covar_module: The shared kernel (including any output scale).
        likelihood: A ``GaussianLikelihood``; its noise is ``sigma^2``.
        mean_module: The shared prior mean; ``None`` means a zero mean.
        train_Yvar: Optional ``batch_shape x n x 1`` known observation noise
            variances, used instead of the likelihood's noise.
        jitter: Relative jitter for ``K_SS`` (:func:`support_cholesky`).
        support_chol: Optional precomputed ``support_cholesky`` of the (transformed)
            support.
        input_transform: The transform every party applies to its inputs (support
            and data alike), with fixed coefficients (:func:`check_input_transform`).

    Returns:
        The client's float64 :class:`SparseSummary` with batch shape
        ``broadcast(batch_shape, batch_shape')``.
    """
    _validate_local_data(train_X, train_Y, support, train_Yvar)
    check_input_transform(input_transform)
    if train_Yvar is None:
        _noise_from_likelihood(likelihood)
    X = transform_support_inputs(_to64(train_X), input_transform)
    if support_chol is None:
        S, L = support_factor(support, covar_module, jitter, input_transform)
    else:
        S, L = transform_support_inputs(_to64(support), input_transform), support_chol
    return local_summary(X, train_Y, S, L, covar_module, likelihood, mean_module, train_Yvar)


def local_summary(
    X: Tensor,
    Y: Tensor,
    S: Tensor,
    L: Tensor,
    covar_module: Kernel,
    likelihood: GaussianLikelihood,
    mean_module: Mean | None = None,
    train_Yvar: Tensor | None = None,
) -> SparseSummary:
    r"""The summary maths of :func:`compute_local_summary`, without any validation.

    For callers that validated their inputs already (the model conditioning on
    fantasies, the marginal likelihood): inputs are in the transformed input space,
    ``L`` is ``support_cholesky(S, ...)``.

    Args:
        X: ``batch_shape x n x d`` transformed inputs.
        Y: ``batch_shape' x n x 1`` outcomes.
        S: ``m x d`` transformed support (or ``batch_shape x m x d``, one per member).
        L: ``(batch_shape x) m x m`` float64 Cholesky factor of the jittered ``K_SS``.
        covar_module: The shared kernel.
        likelihood: The ``GaussianLikelihood``.
        mean_module: The prior mean (``None``: zero).
        train_Yvar: Optional known noise variances (``batch_shape x n x 1``).

    Returns:
        The float64 summary.
    """
    X64, S64 = _to64(X), _to64(S)
    if train_Yvar is None:
        noise = noise64(likelihood)  # ... x 1
    else:
        noise = _to64(train_Yvar).squeeze(-1)  # ... x n
    S64 = S64.expand(*X64.shape[:-2], *S64.shape[-2:])  # S may be batched like X
    K_Sx = evaluate64(covar_module, S64, X64)  # batch x m x n
    K_xx = evaluate64(covar_module, X64, X64)  # batch x n x n
    V = torch.linalg.solve_triangular(L, K_Sx, upper=False)  # batch x m x n
    noise_diag = noise * torch.ones_like(K_xx[..., 0])  # ... x n
    Lambda = K_xx - V.mT @ V + torch.diag_embed(noise_diag)
    L_Lambda, info = torch.linalg.cholesky_ex(Lambda)
    if (info != 0).any():
        if (noise <= 0).any():
            raise InputDataError(
                "The noise variance must be positive, got a minimum of "
                f"{noise.min().item():.3g} (e.g. an optimiser step left the likelihood's "
                "raw noise outside its constraint)."
            )
        raise InputDataError(
            "The block covariance Lambda = K_xx - Q_xx + noise is not positive definite: "
            "the noise variance is too small for float64 arithmetic at these "
            "hyperparameters. Use a larger noise lower bound."
        )
    mean = torch.zeros_like(X64[..., 0]) if mean_module is None else evaluate64(mean_module, X64)
    resid = _to64(Y).squeeze(-1) - mean  # batch' x n
    Z = torch.linalg.solve_triangular(L_Lambda, V.mT, upper=False)  # batch x n x m
    z = torch.linalg.solve_triangular(L_Lambda, resid.unsqueeze(-1), upper=False).squeeze(-1)
    b = (Z.mT @ z.unsqueeze(-1)).squeeze(-1)
    A = Z.mT @ Z
    A = 0.5 * (A + A.mT)  # exactly symmetric, so packing its upper triangle is lossless
    quad = z.pow(2).sum(dim=-1)
    logdet = 2 * L_Lambda.diagonal(dim1=-2, dim2=-1).log().sum(dim=-1)
    num_data = torch.full_like(logdet, X.shape[-2])
    return SparseSummary(b=b, A=A, quad=quad, logdet=logdet, num_data=num_data)


def _validate_local_data(
    train_X: Tensor, train_Y: Tensor, support: Tensor, train_Yvar: Tensor | None
) -> None:
    for name, value in (("train_X", train_X), ("train_Y", train_Y), ("support", support)):
        if not isinstance(value, Tensor):
            raise TypeError(f"`{name}` must be a torch Tensor, got {type(value).__name__}.")
    if train_X.ndim < 2:
        raise BotorchTensorDimensionError(
            f"`train_X` must be `batch_shape x n x d`, got shape {tuple(train_X.shape)}."
        )
    n, d = train_X.shape[-2:]
    if n == 0:
        raise InputDataError(
            "`train_X` has no observations (an empty client); a client must hold at "
            "least one data point to compute a summary."
        )
    if train_Y.ndim >= 2 and train_Y.shape[-2] == n and train_Y.shape[-1] > 1:
        raise UnsupportedError(
            f"`train_Y` has {train_Y.shape[-1]} outputs: the dPITC model has a single "
            "output. Model each outcome separately (e.g. one model per outcome in a "
            "ModelListGP)."
        )
    if train_Y.ndim < 2 or train_Y.shape[-1] != 1 or train_Y.shape[-2] != n:
        raise BotorchTensorDimensionError(
            f"`train_Y` must be `batch_shape x n x 1` with n={n} matching `train_X`, got "
            f"shape {tuple(train_Y.shape)}."
        )
    try:
        torch.broadcast_shapes(train_X.shape[:-2], train_Y.shape[:-2])
    except RuntimeError as e:
        raise BotorchTensorDimensionError(
            f"Batch shapes of `train_X` {tuple(train_X.shape[:-2])} and `train_Y` "
            f"{tuple(train_Y.shape[:-2])} do not broadcast."
        ) from e
    validate_support(support)
    if support.shape[-1] != d:
        raise BotorchTensorDimensionError(
            f"`support` has d={support.shape[-1]} columns but `train_X` has d={d}."
        )
    if train_X.dtype != support.dtype or train_Y.dtype != support.dtype:
        raise InputDataError(
            f"dtypes differ: train_X {train_X.dtype}, train_Y {train_Y.dtype}, "
            f"support {support.dtype}."
        )
    _check_finite("train_X", train_X)
    _check_finite("train_Y", train_Y)
    if train_Yvar is not None:
        if train_Yvar.shape[-2:] not in ((n, 1), (1, 1)):
            raise BotorchTensorDimensionError(
                f"`train_Yvar` must be `batch_shape x n x 1`, got {tuple(train_Yvar.shape)}."
            )
        _check_finite("train_Yvar", train_Yvar)
        if (train_Yvar <= 0).any():
            raise InputDataError("`train_Yvar` (noise variances) must be positive.")
