r"""The shared support set of the dPITC sparse GP and its whitening factor.

All parties share a support set ``S`` (``m`` points), an input transform, the kernel
and a jitter, so every party computes the same ``L = chol(K_SS + jitter I)``
(:func:`support_factor`, :func:`support_cholesky`), with which the clients whiten their
summaries (eq. 6-7 of [FBO-FedGP], App. A). :func:`validate_support` and
:func:`check_input_transform` check that a support set and an input transform can be
shared; :func:`default_jitter` is the jitter every party defaults to.

References:

.. [FBO-FedGP] Secure federated Bayesian optimisation with distributed sparse GPs,
   Sec. 2 and App. A (paper 000 in ``shared/papers``).
"""

from __future__ import annotations

import torch
from botorch.exceptions.errors import BotorchTensorDimensionError, InputDataError
from botorch.models.transforms.input import InputTransform
from gpytorch.kernels import Kernel
from torch import Tensor

from botorch_fed.models.float64 import _to64, evaluate64

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
