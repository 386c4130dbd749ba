r"""What the Co-KG server sends an agent, and what an agent accepts of it.

:class:`~botorch_fed.protocol.bo_client.Init` (the warm-up), :class:`Centers` (a k-means
support only), :class:`Support`, per round :class:`Posterior` and :class:`Evaluate`, and
:class:`Optimum` at the end; all but ``evaluate`` are the same for every agent
(relayed). :class:`WeightedMean` are the arguments of the secure mean's sums.
"""

from __future__ import annotations

from typing import Annotated

import numpy as np

from botorch_fed.algorithms.co_kg.settings import MAX_SUPPORT_SIZE
from botorch_fed.protocol.bo_client import Init
from botorch_fed.protocol.declarations import Array, Declared, Int, declare
from botorch_fed.protocol.round_budget import RoundNumber

__all__ = ["Centers", "Evaluate", "Init", "Optimum", "Posterior", "Support", "WeightedMean"]

WEIGHTED_MEAN = "weighted_mean"  # the secure sum of the agents' means
WEIGHT_RTOL = 1e-12  # relative tolerance of a secure mean's weights 1/M


def unit_points(rows: bool = False) -> Array:
    r"""Finite points of ``[0, 1]^dim`` (the agent's ``dim``): one of shape ``(dim,)``,
    or (``rows``) ``1..MAX_SUPPORT_SIZE`` rows."""
    if rows:
        return Array(
            (None, "dim"),
            0.0,
            1.0,
            rows=(1, MAX_SUPPORT_SIZE),
            note=lambda agent: (
                f"the support must be 1..{MAX_SUPPORT_SIZE} finite points of [0, 1]^{agent.dim}"
            ),
        )
    return Array(
        ("dim",),
        0.0,
        1.0,
        note=lambda agent: f"the point must be {agent.dim} finite values in [0, 1]",
    )


#: the ids ``0..M-1`` of all ``M`` agents (the agent's ``num_agents``), in any order
WHOLE_FEDERATION = Array(
    ("num_agents",),
    0,
    lambda agent: agent.num_agents - 1,
    kind="int",
    distinct=True,
    note=lambda agent: f"are not the whole federation 0..{agent.num_agents - 1}",
)
#: ``M`` weights of ``1/M`` each (relative tolerance :data:`WEIGHT_RTOL`)
UNIFORM_WEIGHTS = Array(
    ("num_agents",),
    lambda agent: (1 - WEIGHT_RTOL) / agent.num_agents,
    lambda agent: (1 + WEIGHT_RTOL) / agent.num_agents,
    note=lambda agent: f"the secure mean is uniform, 1/{agent.num_agents} per agent",
)


@declare("centers", relayed=True)
class Centers(Declared):
    r"""Send the k-means centres of your inputs (at most ``k``; a k-means support only)."""

    k: Annotated[int, Int(1, MAX_SUPPORT_SIZE)]


@declare("support", relayed=True)
class Support(Declared):
    r"""The shared support (a grid or Sobol support must be the settings' own)."""

    support: Annotated[np.ndarray, unit_points(rows=True)]


@declare("posterior", relayed=True)
class Posterior(Declared):
    r"""Round ``t``: send your discretised posterior on the support."""

    t: Annotated[int, RoundNumber()]


@declare("evaluate")
class Evaluate(Declared):
    r"""Round ``t``: evaluate ``x`` (the round of your last posterior)."""

    x: Annotated[np.ndarray, unit_points()]
    t: Annotated[int, RoundNumber()]


@declare("optimum", relayed=True)
class Optimum(Declared):
    r"""After the last round: send your local optimum on the support (Alg. 1 line 10)."""


@declare("weighted_mean:args")
class WeightedMean(Declared):
    r"""The arguments of a ``weighted_mean`` secure sum: it runs over the whole
    federation, each agent's mean weighted ``1/M``."""

    clients: Annotated[np.ndarray, WHOLE_FEDERATION]
    weights: Annotated[np.ndarray, UNIFORM_WEIGHTS]
