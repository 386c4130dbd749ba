r"""What central BO's server sends a client: ``upload`` and ``evaluate``."""

from __future__ import annotations

from typing import Annotated

import numpy as np

from botorch_fed.protocol.declarations import Array, Declared, declare
from botorch_fed.protocol.round_budget import RoundNumber


@declare("upload")
class Upload(Declared):
    r"""Send the observations made since the last upload (no fields)."""


@declare("evaluate")
class Evaluate(Declared):
    r"""Round ``t``: evaluate ``x``, ``dim`` finite values in the unit cube."""

    x: Annotated[np.ndarray, Array(("dim",), 0.0, 1.0)]
    t: Annotated[int, RoundNumber()]
