r"""Checks and preparation of the inputs of :class:`~botorch_fed.models.pitc.FederatedPITCGP`.

The outcome transform (trained, one output: :func:`check_outcome_transform`), the
clients' data when they are all in one process (``from_client_data``, the marginal
likelihood: :func:`_check_client_data`, :func:`transform_outcomes`), a summary against
the support set, output indices, and an ``observation_noise`` tensor as the
posterior's noise diagonal.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from botorch.exceptions.errors import (
    BotorchTensorDimensionError,
    InputDataError,
    UnsupportedError,
)
from botorch.models.transforms.input import InputTransform
from botorch.models.transforms.outcome import ChainedOutcomeTransform, OutcomeTransform
from torch import Tensor

from botorch_fed.models.sparse_summary import _SUMMARY_FIELDS, SparseSummary


def check_outcome_transform(outcome_transform: OutcomeTransform | None) -> None:
    r"""Check that an outcome transform is trained and for a single output.

    Args:
        outcome_transform: The transform, or ``None``.

    Raises:
        TypeError: If it is not a BoTorch ``OutcomeTransform``.
        UnsupportedError: If it transforms more than one output.
        ValueError: If it (or a part of a chained transform) is untrained.
    """
    if outcome_transform is None:
        return
    if not isinstance(outcome_transform, OutcomeTransform):
        raise TypeError(
            "`outcome_transform` must be a BoTorch OutcomeTransform, got "
            f"{type(outcome_transform).__name__}."
        )
    parts = (
        list(outcome_transform.values())
        if isinstance(outcome_transform, ChainedOutcomeTransform)
        else [outcome_transform]
    )
    for part in parts:
        name = type(part).__name__
        m = getattr(part, "_m", None)
        if m is not None and m != 1:
            raise UnsupportedError(
                f"`outcome_transform` ({name}) transforms m={m} outputs, but "
                "FederatedPITCGP models a single output."
            )
        trained = getattr(part, "_is_trained", None)
        if trained is not None and not bool(trained):
            raise ValueError(
                f"`outcome_transform` ({name}) is untrained: the model never sees the "
                "outcomes, so it cannot learn its statistics. Build it from the "
                "federation's outcome moments (standardize_from_moments), or pass raw "
                "outcomes and the untrained transform to FederatedPITCGP.from_client_data, "
                "which trains it on the pooled outcomes."
            )


def _learns(input_transform: InputTransform) -> bool:
    return any(getattr(m, "learn_coefficients", False) for m in input_transform.modules())


def _untrained(outcome_transform: OutcomeTransform) -> bool:
    parts = (
        list(outcome_transform.values())
        if isinstance(outcome_transform, ChainedOutcomeTransform)
        else [outcome_transform]
    )
    return any(
        getattr(p, "_is_trained", None) is not None and not bool(p._is_trained) for p in parts
    )


def transform_outcomes(
    client_data: Sequence[tuple[Tensor, Tensor]], outcome_transform: OutcomeTransform | None
) -> list[tuple[Tensor, Tensor]]:
    r"""Apply a trained outcome transform (in eval mode) to every client's outcomes.

    Args:
        client_data: ``(train_X, train_Y)`` pairs.
        outcome_transform: The shared transform or ``None``.

    Returns:
        The pairs with transformed outcomes.
    """
    if outcome_transform is None:
        return list(client_data)
    was_training = outcome_transform.training
    outcome_transform.eval()  # never re-learn statistics from one client's outcomes
    try:
        return [(X, outcome_transform(Y, X=X)[0]) for X, Y in client_data]
    finally:
        outcome_transform.train(was_training)


def _check_client_data(client_data: Sequence[tuple[Tensor, Tensor]]) -> list:
    if isinstance(client_data, (Tensor, str, bytes)) or not isinstance(client_data, Sequence):
        raise TypeError(
            "`client_data` must be a sequence of (train_X, train_Y) pairs, got "
            f"{type(client_data).__name__}."
        )
    if len(client_data) == 0:
        raise ValueError("`client_data` is empty: a federation needs clients.")
    pairs: list[tuple[Tensor, Tensor]] = []
    for i, pair in enumerate(client_data):
        if not (isinstance(pair, (tuple, list)) and len(pair) == 2):
            raise TypeError(f"`client_data[{i}]` must be a (train_X, train_Y) pair.")
        X, Y = pair
        if not isinstance(X, Tensor) or not isinstance(Y, Tensor) or X.ndim != 2 or Y.ndim != 2:
            raise BotorchTensorDimensionError(
                f"`client_data[{i}]` must hold an `n x d` train_X and an `n x 1` train_Y."
            )
        if Y.shape[-1] != 1:
            raise UnsupportedError(
                f"`client_data[{i}]` has {Y.shape[-1]} outputs: FederatedPITCGP models a "
                "single output (one model per outcome, e.g. in a ModelListGP)."
            )
        if pairs and X.dtype != pairs[0][0].dtype:
            raise InputDataError(
                f"`client_data[{i}]` has dtype {X.dtype} but client 0 has {pairs[0][0].dtype}."
            )
        pairs.append((X, Y))
    return pairs


def _check_summary(summary: SparseSummary, num_support: int) -> None:
    if summary.num_support != num_support:
        raise BotorchTensorDimensionError(
            f"`summary` lives on {summary.num_support} support points but `support` "
            f"has {num_support}."
        )
    for name in _SUMMARY_FIELDS:
        value = getattr(summary, name)
        if not value.is_floating_point():
            raise InputDataError(f"`summary.{name}` must be floating point, got {value.dtype}.")
        if not torch.isfinite(value).all():
            raise InputDataError(f"`summary.{name}` contains NaN or infinite values.")


def _check_output_indices(output_indices: list[int] | None) -> None:
    if output_indices is not None and list(output_indices) != [0]:
        raise UnsupportedError(
            f"`output_indices`={list(output_indices)}: FederatedPITCGP models a single "
            "output (index 0). Model several outcomes with one model each (ModelListGP)."
        )


def _noise_diagonal(observation_noise: Tensor, mean: Tensor) -> Tensor:
    r"""The ``batch x q`` noise variances of a 0-dim or ``batch x q x 1`` tensor."""
    noise = observation_noise.to(device=mean.device, dtype=torch.float64)
    if noise.ndim > 0:
        if noise.shape[-1] != 1:
            raise BotorchTensorDimensionError(
                "`observation_noise` must be a 0-dim tensor or `batch_shape x q x 1`, got "
                f"shape {tuple(observation_noise.shape)}."
            )
        noise = noise.squeeze(-1)
    try:
        return noise.expand(torch.broadcast_shapes(noise.shape, mean.shape))
    except RuntimeError as e:
        raise BotorchTensorDimensionError(
            f"`observation_noise` of shape {tuple(observation_noise.shape)} does not "
            f"broadcast with the posterior's `batch_shape x q` = {tuple(mean.shape)}."
        ) from e
