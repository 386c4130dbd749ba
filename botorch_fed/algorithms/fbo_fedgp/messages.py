r"""What the FBO-FedGP server may send a client, declared (Alg. 1 + Alg. 2 of paper 000):
checked before the handler runs, which checks only what depends on its state. Messages every
client gets alike are relayed (docs/security.md, **Relayed values**)."""

from __future__ import annotations

from typing import Annotated

import numpy as np

from botorch_fed.algorithms.fbo_fedgp.domain import SUPPORT, THETA
from botorch_fed.protocol.declarations import Blob, Declared, Int, declare
from botorch_fed.protocol.round_budget import RoundNumber
from botorch_fed.secure.crypto import MAC_SIZE

_CENTERS = "config.centers_per_client"


def _last_rank(client) -> int | None:
    return None if client.num_clients is None else client.num_clients - 1


@declare("round", relayed=True)
class Round(Declared):
    r"""Round ``t`` (Alg. 2 line 12): draw the round's step."""

    t: Annotated[int, RoundNumber()]


@declare("centers", relayed=True)
class Centers(Declared):
    r"""Alg. 1: the centres of a ``k``-means of the client's inputs (``k``: the run's)."""

    k: Annotated[int, Int(_CENTERS, _CENTERS)]


@declare("support", relayed=True)
class Support(Declared):
    r"""The support set of the global model (Alg. 1's global k-means, or random)."""

    support: Annotated[np.ndarray, SUPPORT]


@declare("apply_theta", relayed=True)
class ApplyTheta(Declared):
    r"""Adopt the result of the round's federated hyperparameter fit."""

    theta: Annotated[np.ndarray, THETA]


@declare("hyper_feed")
class HyperFeed(Declared):
    r"""To the coordinator: feed the summed summary and Jacobian at the pending iterate
    (replies with the next iterate, tagged, or ``done`` and the fit's result)."""


@declare("global_step")
class GlobalStep(Declared):
    r"""Round ``t``'s global step (Alg. 2 lines 22-27), the ``rank``-th of ``count``."""

    t: Annotated[int, RoundNumber()]
    rank: Annotated[int, Int(0, _last_rank)]
    count: Annotated[int, Int(1, "num_clients")]


@declare("pitc_summary")
class PITCSummaryArgs(Declared):
    r"""Of a ``pitc_summary`` sum: the fit's iterate, the coordinator's tag and index (0:
    the fit's untagged start, the current hyperparameters)."""

    theta: Annotated[np.ndarray, THETA]
    tag: Annotated[bytes | None, Blob(MAC_SIZE, optional=True)]
    index: Annotated[int | None, Int(0, "_fit_budget", optional=True)]
