r"""Centralised BO on pooled data: the non-private oracle baseline.

Clients upload their raw observations to the server (this baseline is *not*
private, by design); the server fits one ``SingleTaskGP`` on the pooled data and
assigns each client one point of a jointly optimised batch (sequential greedy
``q``-UCB / ``q``-log-EI, one-shot ``q``-KG -- the "data sharing" baseline of Co-KG --
or batch Thompson sampling: ``q`` pathwise posterior samples, each maximised), which
the client evaluates. The GP is fitted by
:class:`~botorch_fed.models.ExactGPRefitter` and the batch is found by the seeded
search of :func:`~botorch_fed.acquisition.maximize_step_acquisition`.
"""

from __future__ import annotations

from botorch_fed.algorithms.central.client import CentralClient
from botorch_fed.algorithms.central.server import CentralServer
from botorch_fed.protocol.bo_client import BOSettings
from botorch_fed.protocol.registry import AlgorithmSpec, register_algorithm

__all__ = ["CentralClient", "CentralServer"]


register_algorithm(
    AlgorithmSpec(
        name="central",
        summary=(
            "central BO on pooled data: clients upload raw data, one GP picks a batch "
            "(non-private oracle baseline)"
        ),
        settings_class=BOSettings,
        make_client=lambda ctx, cid: CentralClient(**ctx.client_arguments(cid)),
        make_server=lambda ctx, transport: CentralServer(
            transport, ctx.settings, ctx.dim, seed=ctx.setup.seed
        ),
    )
)
