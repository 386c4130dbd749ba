r"""Client-side summaries of the distributed PITC (dPITC) sparse GP.

Each client ``i`` holds private data ``(X_i, y_i)``; all parties share a support
set ``S`` (``m`` points) and the GP hyperparameters. The client summarises its data
on ``S`` (eq. 6-7 of [FBO-FedGP], App. A) as

    Lambda_i = K_ii - Q_ii + sigma^2 I,         Q_ii = K_iS K_SS^-1 K_Si,
    b_i      = K_Si Lambda_i^-1 (y_i - mu_i),
    A_i      = K_Si Lambda_i^-1 K_iS,

and sends them *whitened* with ``L = chol(K_SS)`` (computable by every party):
``b~_i = L^-1 b_i`` and ``A~_i = L^-1 A_i L^-T``. Whitened summaries are O(1)-scaled
and well conditioned, so noise added by secure aggregation (CKKS) is not amplified
in the posterior. Alongside, the client sends the scalars the marginal likelihood
needs: ``y_i' Lambda_i^-1 y_i``, ``log|Lambda_i|`` and ``n_i``.

The server only ever adds summaries (:class:`SparseSummary` supports ``+``), so the
sum can be formed under secure aggregation from the flat float64 vectors produced
by :meth:`SparseSummary.to_numpy`.

References:

.. [FBO-FedGP] Secure federated Bayesian optimisation with distributed sparse GPs,
   Sec. 2 and App. A (paper 000 in ``shared/papers``).
.. [Chen2012] J. Chen et al. Decentralized data fusion and active sensing with
   mobile sensors for modeling and predicting spatiotemporal traffic phenomena.
   UAI 2012.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, fields

import numpy as np
import torch
from botorch.exceptions.errors import (
    BotorchTensorDimensionError,
    InputDataError,
    UnsupportedError,
)
from botorch.models.transforms.input import InputTransform
from gpytorch import settings as gpytorch_settings
from gpytorch.kernels import Kernel
from gpytorch.likelihoods import GaussianLikelihood, Likelihood
from gpytorch.means import Mean
from torch import Tensor
from torch.func import functional_call

DEFAULT_JITTER = 1e-8


def default_jitter(dtype: torch.dtype | None = None) -> float:
    r"""The relative jitter added to ``K_SS`` before its Cholesky factorisation.

    Every party must use the same jitter so that their whitening factors ``L``
    agree; this is the value all functions of this package default to. The
    factorisations run in float64 whatever the input dtype (see
    :func:`support_cholesky`), so the default does not depend on the dtype: a larger
    jitter for float32 would change the *model* (the Nystrom term
    ``K_xS (K_SS + jitter I)^-1 K_Sx``) far more than float32 rounding does when the
    support is ill-conditioned.

    Args:
        dtype: Ignored; kept so that callers may state the dtype of their data.

    Returns:
        ``1e-8``: ``K_SS + 1e-8 * mean(diag(K_SS)) * I`` is factorised.
    """
    return DEFAULT_JITTER


@dataclass
class SparseSummary:
    r"""Whitened dPITC summary of one client, of several stacked clients, or a sum.

    All fields share a (broadcastable) batch shape; a summary computed for one
    client has an empty batch shape. Summaries add elementwise (``s1 + s2``), which
    is the server's only operation.

    Attributes:
        b: ``batch_shape x m`` whitened projection ``L^-1 K_S Lambda^-1 (y - mu)``.
        A: ``batch_shape x m x m`` whitened precision ``L^-1 K_S Lambda^-1 K_S' L^-T``
            (symmetric positive semi-definite).
        quad: ``batch_shape`` quadratic form ``(y - mu)' Lambda^-1 (y - mu)``.
        logdet: ``batch_shape`` log-determinant ``log|Lambda|``.
        num_data: ``batch_shape`` number of observations (as a float tensor).
    """

    b: Tensor
    A: Tensor
    quad: Tensor
    logdet: Tensor
    num_data: Tensor

    @property
    def num_support(self) -> int:
        r"""The number ``m`` of support points the summary lives on."""
        return self.b.shape[-1]

    @property
    def batch_shape(self) -> torch.Size:
        r"""The broadcast batch shape of all fields."""
        return torch.broadcast_shapes(
            self.b.shape[:-1],
            self.A.shape[:-2],
            self.quad.shape,
            self.logdet.shape,
            self.num_data.shape,
        )

    def __add__(self, other: SparseSummary) -> SparseSummary:
        if not isinstance(other, SparseSummary):
            return NotImplemented
        if other.num_support != self.num_support:
            raise ValueError(
                "Cannot add summaries on different support sets: "
                f"{self.num_support} vs {other.num_support} support points."
            )
        return SparseSummary(
            *(getattr(self, f.name) + getattr(other, f.name) for f in fields(self))
        )

    def __radd__(self, other: SparseSummary | int) -> SparseSummary:
        # Lets the builtin ``sum`` start from 0.
        if isinstance(other, int) and other == 0:
            return self
        return self.__add__(other)

    @staticmethod
    def sum(summaries: Iterable[SparseSummary]) -> SparseSummary:
        r"""Add a non-empty collection of summaries (in the given order).

        Args:
            summaries: The summaries to add.

        Returns:
            The summed summary.
        """
        summaries = list(summaries)
        if len(summaries) == 0:
            raise ValueError("`summaries` is empty: nothing to sum.")
        total = summaries[0]
        for s in summaries[1:]:
            total = total + s
        return total

    def unbind(self, dim: int = 0) -> list[SparseSummary]:
        r"""Split a summary of stacked clients along a batch dimension.

        Args:
            dim: The (non-negative) batch dimension to split along.

        Returns:
            A list of summaries, one per entry of that batch dimension.
        """
        batch_shape = self.batch_shape
        if not 0 <= dim < len(batch_shape):
            raise ValueError(f"`dim`={dim} is not a batch dimension of {batch_shape}.")
        m = self.num_support
        b = self.b.expand(*batch_shape, m)
        A = self.A.expand(*batch_shape, m, m)
        scalars = [t.expand(batch_shape) for t in (self.quad, self.logdet, self.num_data)]
        parts = zip(b.unbind(dim), A.unbind(dim), *(s.unbind(dim) for s in scalars), strict=True)
        return [SparseSummary(*p) for p in parts]

    def to(self, *args, **kwargs) -> SparseSummary:
        r"""Move/cast all fields, with the arguments of :meth:`torch.Tensor.to`."""
        return SparseSummary(*(getattr(self, f.name).to(*args, **kwargs) for f in fields(self)))

    @staticmethod
    def packed_length(num_support: int) -> int:
        r"""Length of the packed vector for ``num_support`` support points.

        Args:
            num_support: The number ``m`` of support points.

        Returns:
            ``m + m (m + 1) / 2 + 3`` (``b``, the upper triangle of ``A``, and the
            three scalars).
        """
        return num_support + num_support * (num_support + 1) // 2 + 3

    def pack(self) -> Tensor:
        r"""Pack into one flat tensor (differentiable).

        Returns:
            A ``batch_shape x P`` tensor with ``P = packed_length(m)``: ``b``, the
            row-major upper triangle of ``A`` (diagonal included), ``quad``,
            ``logdet`` and ``num_data``.
        """
        m = self.num_support
        batch_shape = self.batch_shape
        rows, cols = torch.triu_indices(m, m, device=self.A.device)
        parts = [
            self.b.expand(*batch_shape, m),
            self.A.expand(*batch_shape, m, m)[..., rows, cols],
            *(t.expand(batch_shape).unsqueeze(-1) for t in (self.quad, self.logdet, self.num_data)),
        ]
        dtype = torch.promote_types(self.b.dtype, self.A.dtype)
        return torch.cat([p.to(dtype) for p in parts], dim=-1)

    @classmethod
    def unpack(cls, packed: Tensor, num_support: int) -> SparseSummary:
        r"""Inverse of :meth:`pack` (differentiable).

        Args:
            packed: A ``batch_shape x P`` tensor with ``P = packed_length(m)``.
            num_support: The number ``m`` of support points.

        Returns:
            The summary; ``A`` is rebuilt symmetric from its upper triangle.
        """
        m = int(num_support)
        if m < 1:
            raise ValueError(f"`num_support` must be a positive integer, got {num_support}.")
        length = cls.packed_length(m)
        if packed.ndim < 1 or packed.shape[-1] != length:
            raise ValueError(
                f"A packed summary on {m} support points has length {length}, but the "
                f"vector has shape {tuple(packed.shape)}."
            )
        if not torch.isfinite(packed).all():
            raise InputDataError("The packed summary contains NaN or infinite values.")
        b = packed[..., :m]
        triu = packed[..., m : length - 3]
        rows, cols = torch.triu_indices(m, m, device=packed.device)
        upper = packed.new_zeros(*packed.shape[:-1], m, m)
        upper[..., rows, cols] = triu
        A = upper + upper.mT - torch.diag_embed(upper.diagonal(dim1=-2, dim2=-1))
        quad, logdet, num_data = packed[..., -3], packed[..., -2], packed[..., -1]
        return cls(b=b, A=A, quad=quad, logdet=logdet, num_data=num_data)

    def to_numpy(self) -> np.ndarray:
        r"""Pack into a flat float64 numpy vector for secure aggregation.

        Returns:
            A ``batch_shape x P`` float64 array (``P = packed_length(m)``), see
            :meth:`pack` for the layout.
        """
        return self.pack().detach().to(device="cpu", dtype=torch.float64).numpy()

    @classmethod
    def from_numpy(
        cls,
        vector: np.ndarray,
        num_support: int,
        dtype: torch.dtype = torch.float64,
        device: torch.device | str | None = None,
    ) -> SparseSummary:
        r"""Rebuild a summary from :meth:`to_numpy` output (or a sum of such vectors).

        Args:
            vector: A ``batch_shape x P`` array.
            num_support: The number ``m`` of support points.
            dtype: The dtype of the returned tensors.
            device: The device of the returned tensors.

        Returns:
            The summary.
        """
        array = np.asarray(vector, dtype=np.float64)
        return cls.unpack(torch.as_tensor(array, dtype=dtype, device=device), num_support)


def _check_finite(name: str, value: Tensor) -> None:
    if not torch.isfinite(value).all():
        raise InputDataError(f"`{name}` contains NaN or infinite values.")


def validate_support(support: Tensor) -> None:
    r"""Check that the support set is an ``m x d`` finite tensor without duplicates.

    Args:
        support: The support set.

    Raises:
        BotorchTensorDimensionError: If ``support`` is not ``m x d`` with ``m >= 1``.
        InputDataError: If it has NaN/inf entries or duplicate rows.
    """
    if not isinstance(support, Tensor):
        raise TypeError(f"`support` must be a Tensor, got {type(support).__name__}.")
    if support.ndim != 2 or support.shape[0] < 1 or support.shape[1] < 1:
        raise BotorchTensorDimensionError(
            f"`support` must be an `m x d` tensor with m, d >= 1, got shape {tuple(support.shape)}."
        )
    if not support.is_floating_point():
        raise InputDataError(f"`support` must be floating point, got {support.dtype}.")
    _check_finite("support", support)
    m = support.shape[0]
    if m > 1:
        same = (support.unsqueeze(0) == support.unsqueeze(1)).all(dim=-1)
        same = same.triu(diagonal=1)
        if same.any():
            i, j = (int(k) for k in same.nonzero()[0])
            raise InputDataError(
                f"`support` has duplicate points (rows {i} and {j}); K(S, S) would be "
                "singular. Remove duplicates from the support set."
            )


def check_input_transform(input_transform: InputTransform | None) -> None:
    r"""Check that an input transform can be shared by the parties of a federation.

    The support set, every client's inputs and the test inputs must be mapped by the
    same function. A transform that learns its coefficients from the data it sees
    (``Normalize(d)`` without bounds, ``InputStandardize``) would normalise each
    client by its own data; it must have fixed coefficients, e.g.
    ``Normalize(d, bounds=bounds)`` with the problem's public bounds.

    Args:
        input_transform: The transform, or ``None``.

    Raises:
        TypeError: If it is not a BoTorch ``InputTransform``.
        ValueError: If it learns its coefficients from data.
    """
    if input_transform is None:
        return
    if not isinstance(input_transform, InputTransform):
        raise TypeError(
            "`input_transform` must be a BoTorch InputTransform, got "
            f"{type(input_transform).__name__}."
        )
    if any(getattr(m, "learn_coefficients", False) for m in input_transform.modules()):
        raise ValueError(
            f"`input_transform` ({type(input_transform).__name__}) learns its coefficients "
            "from the data it transforms, so every party would normalise differently. Give "
            "it fixed coefficients shared by all parties, e.g. Normalize(d, bounds=bounds) "
            "with the problem's bounds (FederatedPITCGP.from_client_data learns them from "
            "the pooled inputs when all data are in one process)."
        )


def transform_support_inputs(X: Tensor, input_transform: InputTransform | None) -> Tensor:
    r"""Apply a shared input transform to training-side inputs (support, client data).

    Uses ``preprocess_transform`` as BoTorch does for training inputs.

    Args:
        X: ``batch_shape x n x d`` inputs.
        input_transform: The shared transform or ``None``.

    Returns:
        The transformed inputs.
    """
    if input_transform is None:
        return X
    return input_transform.preprocess_transform(X)


def _to64(t: Tensor) -> Tensor:
    return t.to(torch.float64)


class _Call(torch.nn.Module):
    r"""Wraps ``fn(module, *inputs)`` as a module, for ``functional_call``."""

    def __init__(self, module: torch.nn.Module, fn: Callable) -> None:
        super().__init__()
        self.module = module
        self.fn = fn

    def forward(self, *inputs: Tensor) -> Tensor:
        return self.fn(self.module, *inputs)


def _dense(out: Tensor) -> Tensor:
    return _to64(out.to_dense() if hasattr(out, "to_dense") else out)


def call64(module: torch.nn.Module, fn: Callable, *inputs: Tensor) -> Tensor:
    r"""``fn(module, *inputs)`` computed with float64 values of ``module``'s state.

    A module whose floating parameters and buffers are all float64 is used as it is;
    otherwise ``fn`` runs on float64 copies of them (``torch.func.functional_call``,
    differentiable in the originals). So a float32 model evaluates its kernel, mean and
    noise (e.g. a softplus of a raw parameter plus a bound) exactly as a float64 model
    with the same (rounded) values would, and modules that do not promote dtypes
    (``LinearMean``, ``PolynomialKernel``) work on float64 inputs.

    Args:
        module: A gpytorch module.
        fn: ``fn(module, *inputs) -> Tensor`` (may return a linear operator).
        *inputs: Tensor inputs, cast to float64.

    Returns:
        The dense float64 result.
    """
    inputs = tuple(_to64(x) for x in inputs)
    named = [*module.named_parameters(), *module.named_buffers()]
    if all(t.dtype == torch.float64 or not t.is_floating_point() for _, t in named):
        with gpytorch_settings.lazily_evaluate_kernels(False):  # dense anyway: no lazy wrapper
            return _dense(fn(module, *inputs))
    state = {f"module.{n}": _to64(t) if t.is_floating_point() else t for n, t in named}
    with gpytorch_settings.lazily_evaluate_kernels(False):
        # evaluated inside the call, while the float64 values are in place
        return functional_call(
            _Call(module, lambda m, *x: _dense(fn(m, *x))), state, inputs, strict=False
        )


def evaluate64(module: torch.nn.Module, *inputs: Tensor) -> Tensor:
    r"""Evaluate a kernel or mean module in float64, densely (see :func:`call64`).

    Args:
        module: A gpytorch kernel or mean.
        *inputs: Its inputs (``batch_shape x n x d`` tensors).

    Returns:
        The dense float64 output (``batch_shape x n x n'`` or ``batch_shape x n``).
    """
    return call64(module, lambda m, *x: m(*x), *inputs)


def prior_variance64(kernel: torch.nn.Module, X: Tensor) -> Tensor:
    r"""The prior variances ``k(x, x)`` (``batch_shape x n``) of a kernel in float64,
    by gpytorch's ``diag=True`` path (see :func:`call64`)."""
    return call64(kernel, lambda m, x: m(x, x, diag=True), X)


def noise64(likelihood: GaussianLikelihood) -> Tensor:
    r"""The likelihood's noise variance computed in float64 (see :func:`call64`)."""
    return call64(likelihood, lambda m: m.noise)


def support_factor(
    support: Tensor,
    covar_module: Kernel,
    jitter: float | None = None,
    input_transform: InputTransform | None = None,
) -> tuple[Tensor, Tensor]:
    r"""The transformed float64 support and its Cholesky factor ``L`` (every party
    computes the same pair from the shared support, kernel, jitter and transform).

    Args:
        support: ``m x d`` support set (original input space).
        covar_module: The shared kernel.
        jitter: Relative jitter (:func:`support_cholesky`).
        input_transform: The shared input transform or ``None``.

    Returns:
        ``(S, L)``: the ``m x d'`` transformed support (float64) and ``chol`` of its
        jittered kernel matrix.
    """
    S = transform_support_inputs(_to64(support), input_transform)
    return S, support_cholesky(S, covar_module, jitter)


def support_cholesky(support: Tensor, covar_module: Kernel, jitter: float | None = None) -> Tensor:
    r"""Cholesky factor ``L`` of ``K_SS + jitter * mean(diag K_SS) * I``, in float64.

    Every party computes the same ``L`` from the shared support set and kernel; it
    whitens the summaries. The kernel is evaluated on float64 copies of the inputs
    and the factorisation runs in float64 whatever the dtype of ``support`` and of
    the kernel's hyperparameters: with a support that is ill-conditioned at the
    current lengthscales (``cond(K_SS)`` of ``1e9`` is common) float32 cannot factorise
    ``K_SS`` without a jitter that changes the model.

    Args:
        support: ``m x d`` support set (already input-transformed).
        covar_module: The shared kernel.
        jitter: Relative jitter; ``None`` uses :func:`default_jitter` (``1e-8``).

    Returns:
        The ``m x m`` float64 lower Cholesky factor (batched if the kernel is batched).
    """
    jitter = DEFAULT_JITTER if jitter is None else float(jitter)
    if not jitter >= 0:
        raise ValueError(f"`jitter` must be non-negative, got {jitter}.")
    return _jittered_cholesky(evaluate64(covar_module, support), jitter)


def _jittered_cholesky(K: Tensor, jitter: float) -> Tensor:
    diag = K.diagonal(dim1=-2, dim2=-1)
    scale = diag.mean(dim=-1, keepdim=True).clamp_min(torch.finfo(K.dtype).tiny)
    K = K + torch.diag_embed((jitter * scale).expand_as(diag))
    L, info = torch.linalg.cholesky_ex(K)
    if (info != 0).any():
        raise InputDataError(
            "K(support, support) is not positive definite even with relative jitter "
            f"{jitter:g}: the support set has (near-)duplicate points for the current "
            "lengthscales. Use fewer/more spread-out support points or a larger `jitter`."
        )
    return L


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
        S: ``m x d`` transformed support.
        L: ``m x m`` float64 Cholesky factor of the jittered ``K_SS``.
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
    S64 = S64.expand(*X64.shape[:-2], *S64.shape)
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


def summary_factor(summary: SparseSummary, check: bool = True) -> tuple[Tensor, Tensor]:
    r"""``L_B = chol(I + A~)`` and ``v = L_B^-1 b~`` of a summed summary (float64).

    The one place both the predictive distribution (eq. 9-10) and the marginal
    likelihood factorise ``B = I + sum_i A~_i``.

    Args:
        summary: The sum of all clients' summaries.
        check: Raise if the factorisation fails (reads a flag: a host synchronisation
            on an accelerator). Skip only for summaries known to be valid.

    Returns:
        ``(L_B, v)`` with shapes ``batch_shape x m x m`` and ``batch_shape x m``.

    Raises:
        InputDataError: If ``I + A~`` is not positive definite (not a sum of valid
            client summaries).
    """
    A, b = _to64(summary.A), _to64(summary.b)
    eye = torch.eye(A.shape[-1], dtype=A.dtype, device=A.device)
    L_B, info = torch.linalg.cholesky_ex(eye + A)
    if check and (info != 0).any():
        raise InputDataError(
            "I + summary.A is not positive definite: the summary is not a sum of "
            "valid client summaries (corrupted or wrongly aggregated)."
        )
    v = torch.linalg.solve_triangular(L_B, b.unsqueeze(-1), upper=False).squeeze(-1)
    return L_B, v


def pitc_log_marginal_likelihood(summary: SparseSummary) -> Tensor:
    r"""Exact log marginal likelihood of the PITC model from the *summed* summary.

    With ``B = I + sum_i A~_i`` and ``b~ = sum_i b~_i`` (DESIGN.md):

        y'(Q + Lambda)^-1 y = sum_i y_i' Lambda_i^-1 y_i - b~' B^-1 b~,
        log|Q + Lambda|     = log|B| + sum_i log|Lambda_i|,

    so the likelihood needs only aggregated quantities.

    Args:
        summary: The sum of all clients' summaries.

    Returns:
        A ``batch_shape`` float64 tensor: ``log p(y)`` (not normalised by ``n``).
    """
    L_B, v = summary_factor(summary)
    logdet_B = 2 * L_B.diagonal(dim1=-2, dim2=-1).log().sum(dim=-1)
    n = _to64(summary.num_data)
    return -0.5 * (
        _to64(summary.quad)
        - v.pow(2).sum(dim=-1)
        + logdet_B
        + _to64(summary.logdet)
        + n * math.log(2 * math.pi)
    )
