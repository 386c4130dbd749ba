r"""Baselines without collaboration: independent local BO and random search.

Both run on the same protocol as FBO-FedGP (the server only paces the rounds), so
their ledgers and wall times are comparable.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from botorch_fed.federation.bo_client import BOClient, BOSettings
from botorch_fed.federation.roles import FederatedServer


class LocalBOClient(BOClient):
    r"""Independent BO: every step on the client's own GP (no collaboration)."""

    def on_round(self, payload: dict) -> dict:
        t = int(payload["t"])
        self.evaluate(self.acquire(self.local_model(), t), t, "local")
        return {}


class RandomSearchClient(BOClient):
    r"""Random search: uniform points in the unit cube from the client's generator."""

    def on_round(self, payload: dict) -> dict:
        t = int(payload["t"])
        x = torch.rand(1, self.dim, generator=self.rng, dtype=torch.float64)
        self.evaluate(x, t, "random")
        return {}


class PacingServer(FederatedServer):
    r"""Initialise the clients, then send ``round`` messages for ``T`` rounds."""

    def __init__(self, transport, settings: BOSettings) -> None:
        super().__init__(transport)
        self.settings = settings

    def run(self, on_round: Callable[[int], None] | None = None) -> None:
        r"""Run initialisation and all rounds (``on_round(t)`` after each)."""
        self.ledger.round = 0
        self.broadcast("init")
        if on_round is not None:
            on_round(0)
        for t in range(1, self.settings.num_rounds + 1):
            self.ledger.round = t
            self.broadcast("round", {"t": t})
            if on_round is not None:
                on_round(t)
