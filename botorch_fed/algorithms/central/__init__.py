r"""Centralised BO on pooled data, the non-private oracle baseline: clients upload their raw
observations; the server fits one GP and assigns each client one point of a jointly optimised
batch (greedy ``q``-UCB / ``q``-log-EI, one-shot ``q``-KG -- Co-KG's "data sharing" baseline
-- or ``q`` pathwise Thompson samples)."""

from __future__ import annotations

from botorch_fed.algorithms.central.client import CentralClient
from botorch_fed.algorithms.central.server import CentralServer
from botorch_fed.protocol.bo_client import BOSettings
from botorch_fed.protocol.registry import AlgorithmSpec, register_algorithm

__all__ = ["CentralClient", "CentralServer"]


register_algorithm(
    AlgorithmSpec(
        name="central",
        summary="central BO on pooled data: clients upload raw data, one GP picks a batch "
        "(non-private oracle baseline)",
        settings_class=BOSettings,
        make_client=lambda ctx, cid: CentralClient(**ctx.client_arguments(cid)),
        make_server=lambda ctx, transport: CentralServer(
            transport, ctx.settings, ctx.dim, seed=ctx.setup.seed
        ),
    )
)
