r"""Baselines without collaboration: local BO (``local``) and random search (``random``);
the server only paces the rounds, so their ledgers and wall times compare."""

from __future__ import annotations

from botorch_fed.algorithms.independent.client import LocalBOClient, RandomSearchClient
from botorch_fed.algorithms.independent.messages import Round
from botorch_fed.protocol.bo_client import BOSettings
from botorch_fed.protocol.registry import AlgorithmSpec, register_algorithm
from botorch_fed.protocol.server import FederatedServer

__all__ = ["LocalBOClient", "PacingServer", "RandomSearchClient"]


class PacingServer(FederatedServer):
    r"""Initialise the clients, then send ``round`` messages for ``T`` rounds."""

    def __init__(self, transport, settings: BOSettings) -> None:
        super().__init__(transport)
        self.settings = settings

    def run_round(self, t: int) -> None:
        r"""Round ``t``: every client takes its own step."""
        self.broadcast(Round(t=t))


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
