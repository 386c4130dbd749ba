r"""What FedZero's server sends a worker: the round's point and perturbation radius.

A worker evaluates its black box at ``x +- h z`` with ``||z||_inf <= 1``: it accepts a
point of its dimension and a finite ``h > 0`` only when every such query lies within its
objective's bounds. Whether ``t`` is the round that comes next is its state
(:meth:`~botorch_fed.protocol.round_budget.RoundBudget.accept_round`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated

import numpy as np
import torch

from botorch_fed.protocol.declarations import (
    Array,
    Declared,
    FieldError,
    Real,
    Refused,
    declare,
)
from botorch_fed.protocol.round_budget import RoundNumber


@dataclass(frozen=True)
class Point(Array):
    r"""``x``: ``dim`` finite values."""

    shape: tuple = ("dim",)

    def check(self, value: object, party: object) -> np.ndarray:
        try:
            return super().check(value, party)
        except FieldError as exc:
            dim = party.dim  # type: ignore[attr-defined]
            raise FieldError(f"must be a point of dimension {dim}: it {exc}") from None


@dataclass(frozen=True)
class Radius(Real):
    r"""``h``: a finite real ``> 0``."""

    def check(self, value: object, party: object) -> float:
        h = super().check(value, party)
        if not h > 0:
            raise FieldError("must be finite and > 0")
        return h


@declare("round")
class Round(Declared):
    r"""Round ``t``: estimate the gradient at ``x`` from the values at ``x +- h z``."""

    t: Annotated[int, RoundNumber()]
    x: Annotated[np.ndarray, Point()]
    h: Annotated[float, Radius()]

    @classmethod
    def decode(cls, payload: Mapping[str, object], party: object) -> Round:
        message = super().decode(payload, party)
        lower, upper = party.objective.bounds  # type: ignore[attr-defined]
        x, h = torch.as_tensor(message.x), message.h
        # a few ulps of slack: the server's shrunk box is lower + h, rounded
        slack = 8 * torch.finfo(torch.float64).eps * (1 + torch.maximum(lower.abs(), upper.abs()))
        if ((x - h) < lower - slack).any() or ((x + h) > upper + slack).any():
            raise Refused("x", f"+- h z would leave the bounds (h={h:g})", payload["x"])
        return message
