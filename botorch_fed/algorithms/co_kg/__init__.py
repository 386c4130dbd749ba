r"""Co-KG and its family (Co-EI, Co-ES, barycenter-qKG) on the federation protocol.

Each round every agent sends its GP posterior on a shared support; the server's
Wasserstein-barycenter GP and acquisition assign agent ``n`` the point ``x_n``. The
posteriors give the agents' data away (docs/security.md, "Co-KG"). Paper: D. Zhan, H.
Zhang, R. Righter, Z. Zheng, J. Anderson, "Collaborative Bayesian optimization via
Wasserstein barycenters" (paper 001 in ``shared/papers``, IEEE CDC 2025), Alg. 1.
"""

import torch

from botorch_fed.algorithms.co_kg.client import CoKGClient
from botorch_fed.algorithms.co_kg.server import CoKGServer
from botorch_fed.algorithms.co_kg.settings import (
    BarycenterQKGSettings,
    CoEISettings,
    CoESSettings,
    CoKGSettings,
)
from botorch_fed.protocol.registry import AlgorithmSpec, register_algorithm

__all__ = [
    "BarycenterQKGSettings",
    "CoEISettings",
    "CoESSettings",
    "CoKGClient",
    "CoKGServer",
    "CoKGSettings",
]

_ALGORITHMS = {
    "co-kg": (
        CoKGSettings,
        "Co-KG: agents share GP posteriors on a support; the server's Wasserstein-barycenter "
        "GP and q-KG plus beta_t x the agents' own KG assign the points (paper 001)",
    ),
    "co-ei": (
        CoEISettings,
        "Co-EI: as co-kg with (log) expected improvement on the barycenter and the agents' "
        "GPs (paper 001's baseline)",
    ),
    "co-es": (
        CoESSettings,
        "Co-ES: as co-kg with max-value entropy search on the barycenter and the agents' "
        "GPs (paper 001's baseline)",
    ),
    "barycenter-qkg": (
        BarycenterQKGSettings,
        "barycenter-qKG: Co-KG with beta = 0, q-KG on the barycenter GP alone; the means "
        "can be securely aggregated (paper 001's baseline)",
    ),
}


def _check(ctx) -> None:
    aggregator = ctx.setup.aggregator
    if ctx.settings.hides_means() and aggregator != "masking":
        raise ValueError(
            f"`mean_aggregation`='secure' with `aggregator`={aggregator!r}: only masking "
            "hides the agents' inputs and gives the server their sum; use masking."
        )


def _make_client(ctx, cid: int) -> CoKGClient:
    return CoKGClient(
        secagg=ctx.secagg_clients.get(cid),
        support_seed=ctx.setup.seed,
        num_agents=len(ctx.client_ids),
        **ctx.client_arguments(cid),
    )


def _make_server(ctx, transport) -> CoKGServer:
    objective = ctx.objectives[0]
    return CoKGServer(
        transport,
        ctx.settings,
        ctx.dim,
        seed=ctx.setup.seed,
        secagg=ctx.secagg_server if ctx.settings.hides_means() else None,
        bounds=objective.bounds.to(torch.float64),
        minimize=objective.minimize,
    )


for _name, (_settings_class, _summary) in _ALGORITHMS.items():
    register_algorithm(
        AlgorithmSpec(
            name=_name,
            summary=_summary,
            settings_class=_settings_class,
            make_client=_make_client,
            make_server=_make_server,
            secure_aggregation=_name == "barycenter-qkg",
            min_clients=2 if _name == "barycenter-qkg" else 1,
            check=_check,
        )
    )
