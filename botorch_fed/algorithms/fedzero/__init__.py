r"""FedZero [FedZero] (Alg. 1): workers (clients) send two-point gradient estimates, the
server averages them and takes a projected step on ``Theta`` (the box, or an l1 / l2 ball
around its centre, shrunk by ``h``). FedZero hides nothing: the server sees every
worker's estimate, a difference of its objective at two known points.

.. [FedZero] A. Akhavan, D. Janz, E.-M. El-Mhamdi. High-probability analysis of online
   and federated zero-order optimisation (paper 004 in ``shared/papers``).
"""

from __future__ import annotations

import warnings

import torch
from torch import Tensor

from botorch_fed.algorithms.fedzero.client import FedZeroClient
from botorch_fed.algorithms.fedzero.server import FedZeroServer
from botorch_fed.algorithms.fedzero.settings import FedZeroSettings, make_domain, step_parameters
from botorch_fed.problems.objectives import Objective
from botorch_fed.protocol.registry import AlgorithmSpec, register_algorithm

__all__ = ["FedZeroClient", "FedZeroServer", "FedZeroSettings"]


def _function(objective: Objective):
    return getattr(objective, "function", None)  # a built-in problem's test function


def _shard(objective: Objective, i: int, M: int) -> Tensor | None:
    r"""Client ``i`` samples the contexts ``i, i + M, i + 2M, ...`` (its own data)."""
    n = getattr(_function(objective), "num_contexts", None)
    if n is not None and n < M:
        raise ValueError(f"The problem has {n} contexts (data rows) for {M} clients.")
    return None if n is None else torch.arange(i, n, M)


def _check(ctx) -> None:
    objective = ctx.objectives[0]
    _, h = step_parameters(ctx.settings, objective, len(ctx.objectives))
    domain = make_domain(ctx.settings, objective, h)
    for obj in ctx.objectives:
        function = _function(obj)
        if not hasattr(function, "evaluate_contexts"):
            continue
        shifted = bool((getattr(obj, "shift", torch.zeros(1)) != 0).any())
        shifted = shifted or getattr(obj, "rotation", None) is not None
        if shifted or getattr(function, "noise_std", None) is not None or obj.noise_bound != 0.0:
            raise ValueError(
                f"{obj.name}'s workers evaluate their own data rows (contexts): `shift`, "
                "`rotation` and `noise_std`/`noise` do not apply to it."
            )
    optimizers = getattr(_function(objective), "optimizers", None)
    if optimizers is not None:
        inside = domain.contains(optimizers.to(torch.float64).reshape(-1, objective.dim))
        if not bool(inside.any()):
            warnings.warn(
                f"The optimum of {objective.name} lies outside Theta (`domain`="
                f"{ctx.settings.domain!r} shrunk by h={h:.3g}): its regrets are against the "
                "unconstrained optimum and cannot reach 0.",
                UserWarning,
                stacklevel=2,
            )


def _make_client(ctx, cid: int) -> FedZeroClient:
    objective, errors = ctx.objectives[cid], ctx.setup.evaluation_errors
    shard = _shard(objective, cid, len(ctx.objectives))
    return FedZeroClient(cid, objective, ctx.settings, ctx.client_seeds[cid], errors, shard)


register_algorithm(
    AlgorithmSpec(
        name="fedzero",
        summary="FedZero: workers send two-point l1-sphere gradient estimates, the server "
        "averages and takes a projected step (zero-order, convex)",
        settings_class=FedZeroSettings,
        make_client=_make_client,
        make_server=lambda ctx, transport: FedZeroServer(
            transport, ctx.settings, ctx.objectives[0], len(ctx.objectives)
        ),
        check=_check,
    )
)
