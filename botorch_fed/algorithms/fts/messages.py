r"""What FTS's server sends a client: ``init`` and rounds with another client's sample."""

from __future__ import annotations

from typing import Annotated

import numpy as np

from botorch_fed.protocol.bo_client import Init
from botorch_fed.protocol.declarations import Array, Declared, declare
from botorch_fed.protocol.round_budget import RoundNumber

__all__ = ["Init", "Round"]


@declare("round")
class Round(Declared):
    r"""Round ``t``: one step, federated on ``omega`` -- another client's weight sample,
    one finite value per shared feature -- when the server sends one."""

    t: Annotated[int, RoundNumber()]
    omega: Annotated[
        np.ndarray | None, Array((lambda client: len(client.features.b),), optional=True)
    ]
