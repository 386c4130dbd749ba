r"""The search space of a tuning task: one coordinate per hyperparameter.

A :class:`Hyperparameter` maps its search-space coordinate ``v`` to the model's keyword
(linearly, as ``10**v`` or as ``2**v``, rounded half-up for integers);
:func:`search_space_bounds` and :func:`decode_hyperparameters` turn a list of them into
the objectives' ``2 x d`` bounds and a point into the model's keywords.

:data:`HYPERPARAMETERS`, the search space of
:class:`~botorch_fed.tasks.federated_hpo.FederatedHPOTask`
(``sklearn.ensemble.HistGradientBoostingClassifier``; ``d = 5``, the user's domain, what
the callables receive):

===================  ====================  ==========================================
coordinate           bounds                hyperparameter
===================  ====================  ==========================================
0 learning rate      ``[-2.5, 0]``         ``learning_rate = 10**v`` (0.0032 - 1)
1 max leaf nodes     ``[1, 6]``            ``max_leaf_nodes = round(2**v)`` (2 - 64)
2 min samples leaf   ``[1, 32]``           ``min_samples_leaf = round(v)``
3 l2 regularisation  ``[-4, 1]``           ``l2_regularization = 10**v``
4 max features       ``[0.1, 1]``          ``max_features = v`` (fraction per split)
===================  ====================  ==========================================

``round`` is round-half-up (``floor(v + 0.5)``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

SCALES = ("linear", "log10", "log2")


@dataclass(frozen=True)
class Hyperparameter:
    r"""One coordinate of the search space.

    Attributes:
        name: The ``HistGradientBoostingClassifier`` keyword.
        low: Lower bound in the search space (e.g. of ``log10`` of the value).
        high: Upper bound in the search space.
        scale: ``"linear"`` (the value itself), ``"log10"`` (value = ``10**v``) or
            ``"log2"`` (value = ``2**v``).
        integer: Round the value half-up to an integer (after the scale).
    """

    name: str
    low: float
    high: float
    scale: str = "linear"
    integer: bool = False

    def decode(self, v: float) -> float | int:
        r"""The hyperparameter's value at search-space coordinate ``v``."""
        if self.scale == "log10":
            value = 10.0**v
        elif self.scale == "log2":
            value = 2.0**v
        else:
            value = float(v)
        return int(math.floor(value + 0.5)) if self.integer else value


HYPERPARAMETERS: tuple[Hyperparameter, ...] = (
    Hyperparameter("learning_rate", -2.5, 0.0, "log10"),
    Hyperparameter("max_leaf_nodes", 1.0, 6.0, "log2", integer=True),
    Hyperparameter("min_samples_leaf", 1.0, 32.0, "linear", integer=True),
    Hyperparameter("l2_regularization", -4.0, 1.0, "log10"),
    Hyperparameter("max_features", 0.1, 1.0, "linear"),
)


def search_space_bounds(
    dtype: torch.dtype = torch.float64,
    hyperparameters: Sequence[Hyperparameter] = HYPERPARAMETERS,
) -> Tensor:
    r"""The search space's ``2 x d`` bounds (the user's domain of the objectives)."""
    return torch.tensor(
        [[h.low for h in hyperparameters], [h.high for h in hyperparameters]], dtype=dtype
    )


def decode_hyperparameters(
    x, hyperparameters: Sequence[Hyperparameter] = HYPERPARAMETERS
) -> dict[str, float | int]:
    r"""The model's keywords at a search-space point (by default the
    ``HistGradientBoostingClassifier`` ones of :data:`HYPERPARAMETERS`).

    Args:
        x: ``d`` numbers (a tensor, an array or a list) within the bounds of
            :func:`search_space_bounds` (up to a tolerance of ``1e-9``; values within
            it are clipped to the bounds).
        hyperparameters: The search space.

    Returns:
        ``{name: value}`` for every entry of ``hyperparameters`` (integers rounded
        half-up).
    """
    if isinstance(x, Tensor):
        x = x.detach().cpu().to(torch.float64).numpy()
    try:
        v = np.asarray(x, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"`x` must be {len(hyperparameters)} numbers, got {x!r}.") from exc
    d = len(hyperparameters)
    if v.shape != (d,):
        raise ValueError(f"`x` must have shape ({d},) (one search-space point), got {v.shape}.")
    if not np.isfinite(v).all():
        raise ValueError(f"`x` must be finite, got {v.tolist()}.")
    out = {}
    for h, vi in zip(hyperparameters, v.tolist(), strict=True):
        if not h.low - 1e-9 <= vi <= h.high + 1e-9:
            raise ValueError(
                f"`x`: coordinate {h.name!r} = {vi} is outside its bounds [{h.low}, {h.high}]."
            )
        out[h.name] = h.decode(min(max(vi, h.low), h.high))
    return out
