r"""What FedZero's server sends a worker: the round's point and perturbation radius. A
worker accepts them only when every query ``x +- h z`` (``||z||_inf <= 1``) lies within
its objective's bounds."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated

import numpy as np
import torch

from botorch_fed.protocol.declarations import Array, Declared, Real, Refused, declare
from botorch_fed.protocol.round_budget import RoundNumber


@declare("round")
class Round(Declared):
    r"""Round ``t``: estimate the gradient at ``x`` from the values at ``x +- h z``."""

    t: Annotated[int, RoundNumber()]
    x: Annotated[np.ndarray, Array(("dim",), note=lambda w: f"a point of dimension {w.dim}")]
    h: Annotated[float, Real(0, open=True)]

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
