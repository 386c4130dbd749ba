r"""What LDP-BO's learner sends a user: one query per round.

The point must be one the user may be asked about (the unit cube of its dimension, and
a point of its finite domain where it has one) and the round one of its settings'
``1 .. num_rounds``; whether the round is this user's turn, and whether its budget
covers an answer, is its state (checked by
:meth:`~botorch_fed.algorithms.ldp_bo.client.LDPUserClient.on_query`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

import numpy as np
import torch

from botorch_fed.protocol.declarations import Array, Bound, Declared, FieldError, declare
from botorch_fed.protocol.round_budget import RoundNumber


@dataclass(frozen=True)
class QueryPoint(Array):
    r"""A point of the user's domain: ``dim`` finite values in the unit cube and, where
    the objective's domain is finite (``candidates``), one of its points."""

    shape: tuple = ("objective.dim",)
    low: Bound = 0.0
    high: Bound = 1.0

    def check(self, value: object, party: object) -> np.ndarray:
        objective = party.objective  # type: ignore[attr-defined]
        try:
            x = super().check(value, party)
        except FieldError as exc:
            raise FieldError(
                f"must be one point of dimension {objective.dim} in the unit cube: it {exc}"
            ) from None
        candidates = getattr(objective, "candidates", None)
        if candidates is not None and not (candidates == torch.as_tensor(x)).all(-1).any():
            raise FieldError("is not a point of the finite domain")
        return x


@declare("query")
class Query(Declared):
    r"""Round ``t``: evaluate ``x`` and answer with the reward (privatised by the private
    variants)."""

    x: Annotated[np.ndarray, QueryPoint()]
    t: Annotated[int, RoundNumber()]
