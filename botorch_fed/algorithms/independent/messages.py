r"""The messages of the baselines without collaboration: round ``t`` is all a server sends."""

from __future__ import annotations

from typing import Annotated

from botorch_fed.protocol.declarations import Declared, declare
from botorch_fed.protocol.round_budget import RoundNumber


@declare("round")
class Round(Declared):
    r"""Round ``t``: take one step (a round of the client's own budget, once, in turn)."""

    t: Annotated[int, RoundNumber()]
