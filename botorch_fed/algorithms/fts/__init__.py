r"""Federated Thompson sampling (FTS) [FTS]: clients share posterior samples ``omega`` of
their weights over shared random Fourier features, never raw data. In round ``t`` a
client takes a Thompson step on its own GP with probability ``p_t = 1 - 1/t^2``, else
maximises ``phi(x)' omega_j`` of a random other client ``j``; then sends a fresh sample.

.. [FTS] Z. Dai, B. K. H. Low, P. Jaillet. Federated Bayesian optimization via Thompson
   sampling. NeurIPS 2020.
"""

from __future__ import annotations

from botorch_fed.algorithms.fts.client import (
    FTS_NUM_FEATURES,
    FTSClient,
    RandomFourierFeatures,
    prior_mode_lengthscale,
)
from botorch_fed.algorithms.fts.server import FTSServer
from botorch_fed.protocol.bo_client import BOSettings
from botorch_fed.protocol.registry import AlgorithmSpec, register_algorithm

__all__ = ["FTSClient", "FTSServer"]


def _make_fts_client(ctx, cid: int) -> FTSClient:
    r"""Every client draws the same features from the run's seed (no exchange needed)."""
    ell = prior_mode_lengthscale(ctx.dim)
    features = RandomFourierFeatures(ctx.dim, FTS_NUM_FEATURES, ell, seed=ctx.setup.seed + 31)
    return FTSClient(**ctx.client_arguments(cid), features=features)


register_algorithm(
    AlgorithmSpec(
        name="fts",
        summary="federated Thompson sampling with shared random Fourier features "
        "(FTS-style baseline, Dai et al. 2020)",
        settings_class=BOSettings,
        make_client=_make_fts_client,
        make_server=lambda ctx, transport: FTSServer(transport, ctx.settings, seed=ctx.setup.seed),
    )
)
