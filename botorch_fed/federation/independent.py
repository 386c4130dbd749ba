r"""Baselines without collaboration: independent local BO and random search.

Both run on the same protocol as FBO-FedGP (the server only paces the rounds), so
their ledgers and wall times are comparable. A client takes one step per round
``{"t"}``, for the rounds ``1 .. num_rounds`` of its own settings, each once and in turn
(:meth:`~botorch_fed.federation.bo_client.RoundBudget.accept_round`): a server cannot
have it evaluate more than ``num_init + num_rounds`` points.
"""

from __future__ import annotations

import torch

from botorch_fed.federation.bo_client import BOClient, BOSettings
from botorch_fed.federation.registry import AlgorithmSpec, register_algorithm
from botorch_fed.federation.roles import FederatedServer


class LocalBOClient(BOClient):
    r"""Independent BO: every step on the client's own GP (no collaboration)."""

    def on_round(self, payload: dict) -> dict:
        r"""Round ``{"t"}``: one BO step on the local GP (``t`` checked first)."""
        t = self.accept_round(payload.get("t"), "round")
        self.evaluate(self.propose_local(t), t, "local")
        return {}


class RandomSearchClient(BOClient):
    r"""Random search: uniform points in the unit cube from the client's generator."""

    def on_round(self, payload: dict) -> dict:
        r"""Round ``{"t"}``: one uniform point (``t`` checked first)."""
        t = self.accept_round(payload.get("t"), "round")
        x = torch.rand(1, self.dim, generator=self.rng, dtype=torch.float64)
        self.evaluate(x, t, "random")
        return {}


class PacingServer(FederatedServer):
    r"""Initialise the clients, then send ``round`` messages for ``T`` rounds."""

    def __init__(self, transport, settings: BOSettings) -> None:
        super().__init__(transport)
        self.settings = settings

    def run_round(self, t: int) -> None:
        r"""Round ``t``: every client takes its own step."""
        self.broadcast("round", {"t": t})


register_algorithm(
    AlgorithmSpec(
        name="local",
        summary="independent BO: every client on its own GP, no collaboration (baseline)",
        settings_class=BOSettings,
        make_client=lambda ctx, cid: LocalBOClient(**ctx.client_arguments(cid)),
        make_server=lambda ctx, transport: PacingServer(transport, ctx.settings),
    )
)
register_algorithm(
    AlgorithmSpec(
        name="random",
        summary="random search: uniform points on every client (baseline)",
        settings_class=BOSettings,
        make_client=lambda ctx, cid: RandomSearchClient(**ctx.client_arguments(cid)),
        make_server=lambda ctx, transport: PacingServer(transport, ctx.settings),
    )
)
