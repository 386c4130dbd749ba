r"""The clients of the baselines without collaboration: local BO and random search."""

from __future__ import annotations

import torch

from botorch_fed.algorithms.independent.messages import Round
from botorch_fed.protocol.bo_client import BOClient
from botorch_fed.protocol.declarations import handles


class LocalBOClient(BOClient):
    r"""Independent BO: every step on the client's own GP (no collaboration)."""

    @handles(Round)
    def on_round(self, message: Round) -> dict:
        r"""Round ``t``: one BO step on the local GP (``t`` checked first)."""
        t = self.accept_round(message.t, "round")
        self.evaluate(self.propose_local(t), t, "local")
        return {}


class RandomSearchClient(BOClient):
    r"""Random search: uniform points in the unit cube from the client's generator."""

    @handles(Round)
    def on_round(self, message: Round) -> dict:
        r"""Round ``t``: one uniform point (``t`` checked first)."""
        t = self.accept_round(message.t, "round")
        x = torch.rand(1, self.dim, generator=self.rng, dtype=torch.float64)
        self.evaluate(x, t, "random")
        return {}
