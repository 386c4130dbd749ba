r"""Co-KG's messages (Zhan et al., paper 001, Alg. 1), each with the domains its receiver
accepts; the server decodes the agents' replies (``*Reply``) against a party with
``dim``, ``k`` (centres per agent), ``size`` (of the support), ``max_data`` and
``hides_means``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Self

import numpy as np

from botorch_fed.algorithms.co_kg.settings import MAX_SUPPORT_SIZE
from botorch_fed.protocol.declarations import (
    Array,
    Declared,
    FieldError,
    Int,
    Real,
    Refused,
    declare,
    resolve,
)
from botorch_fed.protocol.round_budget import RoundNumber

WEIGHTED_MEAN = "weighted_mean"  # the secure sum of the agents' means
WEIGHT_RTOL = 1e-12  # relative tolerance of a secure mean's weights 1/M
# wide ranges around every honest fit: they keep the server's numerics finite
LENGTHSCALE_RANGE = (1e-3, 1e4)  # in the unit cube
OUTPUTSCALE_RANGE = (1e-40, 1e40)  # outcome standard deviations 1e-20..1e20, squared
SUPPORT_POINTS = Array(
    (None, "dim"),
    0.0,
    1.0,
    rows=(1, MAX_SUPPORT_SIZE),
    note=lambda a: f"the support must be 1..{MAX_SUPPORT_SIZE} finite points of [0, 1]^{a.dim}",
)
UNIT_POINT = Array(
    ("dim",), 0.0, 1.0, note=lambda a: f"the point must be {a.dim} finite values in [0, 1]"
)
WHOLE_FEDERATION = Array(  # the ids 0..M-1
    ("num_agents",),
    0,
    lambda a: a.num_agents - 1,
    kind="int",
    distinct=True,
    note=lambda a: f"are not the whole federation 0..{a.num_agents - 1}",
)
UNIFORM_WEIGHTS = Array(  # 1/M each
    ("num_agents",),
    lambda a: (1 - WEIGHT_RTOL) / a.num_agents,
    lambda a: (1 + WEIGHT_RTOL) / a.num_agents,
    note=lambda a: f"the secure mean is uniform, 1/{a.num_agents} per agent",
)


@declare("centers", relayed=True)
class Centers(Declared):
    r"""Send the k-means centres of your inputs (at most ``k``; a k-means support only)."""

    k: Annotated[int, Int(1, MAX_SUPPORT_SIZE)]


@declare("support", relayed=True)
class Support(Declared):
    r"""The shared support (a grid or Sobol support must be the settings' own)."""

    support: Annotated[np.ndarray, SUPPORT_POINTS]


@declare("posterior", relayed=True)
class Posterior(Declared):
    r"""Round ``t``: send your discretised posterior on the support."""

    t: Annotated[int, RoundNumber()]


@declare("evaluate")
class Evaluate(Declared):
    r"""Round ``t``: evaluate ``x`` (the round of your last posterior)."""

    x: Annotated[np.ndarray, UNIT_POINT]
    t: Annotated[int, RoundNumber()]


@declare("optimum", relayed=True)
class Optimum(Declared):
    r"""After the last round: send your local optimum on the support (Alg. 1 line 10)."""


@declare("weighted_mean:args")
class WeightedMean(Declared):
    r"""The arguments of a ``weighted_mean`` secure sum: the whole federation, each
    agent's mean weighted ``1/M``."""

    clients: Annotated[np.ndarray, WHOLE_FEDERATION]
    weights: Annotated[np.ndarray, UNIFORM_WEIGHTS]


class Count(Int):
    r"""An agent's number of observations, ``0..high``."""

    def check(self, value: object, party: object) -> int:
        try:
            return super().check(value, party)
        except FieldError:
            raise FieldError(f"(expected an int in 0..{resolve(self.high, party)})") from None


@declare("centers:reply")
class CentersReply(Declared):
    r"""An agent's k-means centres: at most ``k`` points of the unit cube."""

    centers: Annotated[np.ndarray, Array((None, "dim"), 0.0, 1.0, rows=(0, "k"))]


@declare("optimum:reply")
class OptimumReply(Declared):
    r"""An agent's number of observations and (with data) its local optimum."""

    num_data: Annotated[int, Count(0, "max_data")]
    best_index: Annotated[int | None, Int(0, lambda server: server.size - 1, optional=True)]
    best_value: Annotated[float | None, Real(optional=True)]

    @classmethod
    def decode(cls, payload: Mapping[str, object], party: object) -> Self:
        r"""With data every field is required (but ``mean`` when the party hides means)."""
        reply = super().decode(payload, party)
        optional = ("mean",) if getattr(party, "hides_means", False) else ()
        missing = [n for n in cls.DOMAINS if getattr(reply, n) is None and n not in optional]
        if reply.num_data and missing:
            raise Refused(missing[0], "is missing")
        return reply


@declare("posterior:reply")
class PosteriorReply(OptimumReply):
    r"""Adds an agent's posterior on the support (``mean`` in clear mode) and prior."""

    covariance: Annotated[np.ndarray | None, Array(("size", "size"), optional=True)]
    lengthscale: Annotated[np.ndarray | None, Array(("dim",), *LENGTHSCALE_RANGE, optional=True)]
    outputscale: Annotated[np.ndarray | None, Array((), *OUTPUTSCALE_RANGE, optional=True)]
    noise: Annotated[np.ndarray | None, Array((), optional=True)]
    mean_constant: Annotated[np.ndarray | None, Array((), optional=True)]
    mean: Annotated[np.ndarray | None, Array(("size",), optional=True)]
