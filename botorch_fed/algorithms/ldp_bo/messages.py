r"""LDP-BO's query (one per round, to one user) and the user's reply. Whether the round
is the user's turn and whether its budget covers an answer is the user's state."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

import numpy as np
import torch

from botorch_fed.protocol.declarations import Array, Bound, Declared, FieldError, Real, declare
from botorch_fed.protocol.round_budget import RoundNumber


@dataclass(frozen=True)
class QueryPoint(Array):
    r"""``dim`` values in the unit cube; a point of ``candidates`` on a finite domain."""

    shape: tuple = ("objective.dim",)
    low: Bound = 0.0
    high: Bound = 1.0
    note: Bound = lambda user: f"one point of dimension {user.objective.dim} in the unit cube"

    def check(self, value: object, party: object) -> np.ndarray:
        x = super().check(value, party)
        candidates = getattr(party.objective, "candidates", None)  # type: ignore[attr-defined]
        if candidates is not None and not (candidates == torch.as_tensor(x)).all(-1).any():
            raise FieldError("is not a point of the finite domain")
        return x


@declare("query")
class Query(Declared):
    r"""Round ``t``: evaluate ``x`` and answer with the (privatised) reward."""

    x: Annotated[np.ndarray, QueryPoint()]
    t: Annotated[int, RoundNumber()]


@declare("query:reply")
class Reward(Declared):
    r"""A user's (privatised) reward (a failed evaluation answers ``{"failed": 1}``)."""

    y: Annotated[float, Real()]
