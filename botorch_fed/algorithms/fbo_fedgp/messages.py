r"""What the FBO-FedGP server may send a client, declared (Alg. 1 + Alg. 2 of
[FBO-FedGP]).

Each message is checked against its declaration before the client's handler runs
(:meth:`~botorch_fed.protocol.client.FederatedClient.handle`): rounds within the client's
own ``num_rounds``, ``k`` the run's ``centers_per_client``, the support within the
settings' largest and in the unit cube, every ``theta`` in the declared box
(:mod:`~botorch_fed.algorithms.fbo_fedgp.domain`), ranks and counts within the
federation. What depends on the client's state (the next round, the round it drew a
global step, a fit in progress, the coordinator's tag) its handler checks. ``init``
is :class:`~botorch_fed.protocol.bo_client.Init`; the secure sums are
:class:`~botorch_fed.protocol.secure_sum.SecureSumStep` with the arguments declared here.

The messages the server sends every client alike (``init``, ``round``, ``centers``,
``support``, ``apply_theta``) are relayed: bound into the next secure sum, so a server
that told clients different values gets no sum (docs/security.md, **Relayed values**).

References:

.. [FBO-FedGP] Secure federated Bayesian optimisation with distributed sparse GPs
   (paper 000 in ``shared/papers``).
"""

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
    r"""Round ``t`` (Alg. 2 line 12): draw the round's step; a local step is taken at
    once, a global one waits for :class:`GlobalStep`."""

    t: Annotated[int, RoundNumber()]


@declare("centers", relayed=True)
class Centers(Declared):
    r"""Alg. 1: the centres of a ``k``-means of the client's inputs (``k`` is the run's
    ``centers_per_client``)."""

    k: Annotated[int, Int(_CENTERS, _CENTERS)]


@declare("support", relayed=True)
class Support(Declared):
    r"""The support set of the global model (Alg. 1's global k-means, or random)."""

    support: Annotated[np.ndarray, SUPPORT]


@declare("apply_theta", relayed=True)
class ApplyTheta(Declared):
    r"""Adopt the result of the round's federated hyperparameter fit."""

    theta: Annotated[np.ndarray, THETA]


@declare("hyper_start")
class HyperStart(Declared):
    r"""To the coordinator: start the round's federated fit (replies with an iterate)."""


@declare("hyper_feed")
class HyperFeed(Declared):
    r"""To the coordinator: feed the summed product at the pending iterate to the
    optimiser (replies with the next iterate, or the result)."""


@declare("global_step")
class GlobalStep(Declared):
    r"""Round ``t``'s global step (Alg. 2 lines 22-27) as the ``rank``-th of ``count``
    global clients. No seed: the client derives the search's seed itself."""

    t: Annotated[int, RoundNumber()]
    rank: Annotated[int, Int(0, _last_rank)]
    count: Annotated[int, Int(1, "num_clients")]


@declare("pitc_summary")
class PITCSummaryArgs(Declared):
    r"""The arguments of a ``pitc_summary`` secure sum: the fit's iterate ``theta``,
    the coordinator's ``tag`` on it (empty or absent without a federation secret) and
    its ``index`` in the round's fit (at most the fit's budget of evaluations)."""

    theta: Annotated[np.ndarray, THETA]
    tag: Annotated[bytes | None, Blob(MAC_SIZE, optional=True)]
    index: Annotated[int | None, Int(1, "_fit_budget", optional=True)]
