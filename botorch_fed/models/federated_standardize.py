r"""Outcome standardisation with federation-wide moments.

BoTorch models standardise outcomes with the mean and standard deviation of the
training data. In a federation nobody holds all outcomes, but the moments are sums
over clients: each client sends ``[n_i, sum y_i, sum y_i^2]`` (through secure
aggregation when required) and every party builds the same trained
``Standardize`` transform from the total.
"""

from __future__ import annotations

import numpy as np
import torch
from botorch.exceptions.errors import BotorchTensorDimensionError, InputDataError
from botorch.models.transforms.outcome import Standardize
from torch import Tensor


def outcome_moments(train_Y: Tensor) -> np.ndarray:
    r"""A client's outcome moments ``[n, sum y, sum y^2]`` (float64).

    Args:
        train_Y: ``n x 1`` local outcomes.

    Returns:
        A length-3 float64 array to be summed across clients.
    """
    if train_Y.ndim != 2 or train_Y.shape[-1] != 1:
        raise BotorchTensorDimensionError(
            f"`train_Y` must be `n x 1`, got shape {tuple(train_Y.shape)}."
        )
    if not torch.isfinite(train_Y).all():
        raise InputDataError("`train_Y` contains NaN or infinite values.")
    y = train_Y.detach().to(device="cpu", dtype=torch.float64).reshape(-1)
    return np.array([y.numel(), y.sum().item(), y.pow(2).sum().item()])


def standardize_from_moments(
    moments: np.ndarray,
    dtype: torch.dtype = torch.float64,
    device: torch.device | str | None = None,
    min_stdv: float = 1e-8,
) -> Standardize:
    r"""A trained, eval-mode ``Standardize(m=1)`` from summed outcome moments.

    Args:
        moments: The sum over clients of :func:`outcome_moments`.
        dtype: dtype of the transform's buffers.
        device: device of the transform's buffers.
        min_stdv: Standard deviations below this are replaced by 1 (as BoTorch).

    Returns:
        The transform; apply it with ``Y_tf, _ = transform(Y)``.
    """
    moments = np.asarray(moments, dtype=np.float64)
    if moments.shape != (3,) or not np.isfinite(moments).all():
        raise ValueError(
            f"`moments` must be 3 finite numbers [n, sum, sum of squares], got {moments}."
        )
    n, s1, s2 = moments
    if n < 1:
        raise ValueError(f"`moments` reports n={n} observations; need at least 1.")
    mean = s1 / n
    # Unbiased variance as torch.std (BoTorch's Standardize); one point -> std 1.
    var = max(s2 - n * mean**2, 0.0) / (n - 1) if n > 1 else 1.0
    std = float(np.sqrt(var))
    if std < min_stdv:
        std = 1.0
    tf = Standardize(m=1, min_stdv=min_stdv)
    tf.means = torch.full((1, 1), mean, dtype=dtype, device=device)
    tf.stdvs = torch.full((1, 1), std, dtype=dtype, device=device)
    tf._stdvs_sq = tf.stdvs.pow(2)
    tf._is_trained = torch.tensor(True)
    return tf.eval()
