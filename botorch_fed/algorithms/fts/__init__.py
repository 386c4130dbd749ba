r"""Federated Thompson sampling with shared random Fourier features (FTS-style baseline).

After Dai, Low and Jaillet, "Federated Bayesian Optimization via Thompson Sampling",
NeurIPS 2020. All clients share ``M`` random Fourier features of an RBF kernel
(drawn from a shared seed); each client keeps the Bayesian linear-regression
posterior of the feature weights ``omega`` given its own (standardised) data and,
every round, sends one posterior sample ``omega_i`` to the server. In round ``t`` a
client does, with probability ``p_t``, ordinary Thompson sampling on its own GP
(BoTorch's pathwise sampling, through :meth:`BOClient.acquire`); otherwise it
maximises the sampled function ``phi(x)' omega_j`` of another client ``j`` that the
server picked at random. The schedule is ``p_t = 1 - 1/t^2`` (the
paper's choice; ``p_1 = 0``).

What is shared: weight samples of the other clients' surrogate functions, never raw
data. The client's side is :mod:`.client`, the server's :mod:`.server`, the messages
:mod:`.messages`.
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
    # every client draws the same features from the run's seed (no exchange needed)
    features = RandomFourierFeatures(
        ctx.dim, FTS_NUM_FEATURES, prior_mode_lengthscale(ctx.dim), seed=ctx.setup.seed + 31
    )
    return FTSClient(**ctx.client_arguments(cid), features=features)


register_algorithm(
    AlgorithmSpec(
        name="fts",
        summary=(
            "federated Thompson sampling with shared random Fourier features "
            "(FTS-style baseline, Dai et al. 2020)"
        ),
        settings_class=BOSettings,
        make_client=_make_fts_client,
        make_server=lambda ctx, transport: FTSServer(transport, ctx.settings, seed=ctx.setup.seed),
    )
)
