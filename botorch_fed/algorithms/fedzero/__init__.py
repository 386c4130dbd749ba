r"""FedZero on the federation protocol: workers (clients) estimate gradients from two
evaluations, the server averages them and takes a projected step ([FedZero] Alg. 1).

Round ``t``: the server broadcasts ``x_t`` and ``h`` (:mod:`.messages`); each worker
answers with a two-point estimate of its gradient (:mod:`.client`); the server averages
them and steps (:mod:`.server`). ``Theta`` is the objective's box, or an l1 / l2 ball
around its centre (``domain``, ``radius``), shrunk by ``h`` so that every query
``x +- h z`` stays within the bounds (``||h z||_inf <= h``, ``||h z||_1 = h``). ``eta``
and ``h`` default to Cor. 3.2's ``(1/L) sqrt(m / (n d))`` and ``(1/L) sqrt((d + 1) / n)``,
with ``L`` the problem's declared Lipschitz constant (``lipschitz``; :mod:`.settings`).

FedZero shares no data and hides nothing either: the server sees every worker's
estimate (in ``seed`` mode the two values), which is a difference of the worker's
objective at two points the server can compute (docs/security.md).

References:

.. [FedZero] A. Akhavan, D. Janz, E.-M. El-Mhamdi. High-probability analysis of online
   and federated zero-order optimisation (paper 004 in ``shared/papers``).
"""

from __future__ import annotations

import warnings

import torch
from torch import Tensor

from botorch_fed.algorithms.fedzero.client import FedZeroClient
from botorch_fed.algorithms.fedzero.server import FedZeroServer
from botorch_fed.algorithms.fedzero.settings import (
    FedZeroSettings,
    builtin_function,
    make_domain,
    step_parameters,
)
from botorch_fed.protocol.objectives import Objective
from botorch_fed.protocol.registry import AlgorithmSpec, register_algorithm

__all__ = ["FedZeroClient", "FedZeroServer", "FedZeroSettings"]


def _shards(objective: Objective, M: int) -> list[Tensor | None]:
    r"""Client ``i`` samples the contexts ``i, i + M, i + 2M, ...`` (its own data)."""
    n = getattr(builtin_function(objective), "num_contexts", None)
    if n is None:
        return [None] * M
    if n < M:
        raise ValueError(f"The problem has {n} contexts (data rows) for {M} clients.")
    return [torch.arange(i, n, M) for i in range(M)]


def _check(ctx) -> None:
    objective = ctx.objectives[0]
    eta, h = step_parameters(ctx.settings, objective, len(ctx.objectives))
    domain = make_domain(ctx.settings, objective, h)
    for obj in ctx.objectives:
        function = builtin_function(obj)
        if not hasattr(function, "evaluate_contexts"):
            continue
        shifted = bool((getattr(obj, "shift", torch.zeros(1)) != 0).any())
        noisy = getattr(function, "noise_std", None) is not None or obj.noise_bound != 0.0
        if shifted or noisy:
            raise ValueError(
                f"{obj.name}'s workers evaluate their own data rows (contexts): `shift` and "
                "`noise_std`/`noise` do not apply to it."
            )
    optimizers = getattr(builtin_function(objective), "optimizers", None)
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
    return FedZeroClient(
        cid,
        ctx.objectives[cid],
        ctx.settings,
        seed=ctx.client_seeds[cid],
        evaluation_errors=ctx.setup.evaluation_errors,
        shard=_shards(ctx.objectives[cid], len(ctx.objectives))[cid],
    )


def _make_server(ctx, transport) -> FedZeroServer:
    objective = ctx.objectives[0]
    eta, h = step_parameters(ctx.settings, objective, len(ctx.objectives))
    domain = make_domain(ctx.settings, objective, h)
    lower, upper = objective.bounds.to(torch.float64)
    x0 = domain.project(((lower + upper) / 2).unsqueeze(0)).squeeze(0)
    return FedZeroServer(
        transport,
        ctx.settings,
        domain,
        x0,
        eta,
        h,
        objective.bounds,
        domain_for=lambda h: make_domain(ctx.settings, objective, h),
    )


register_algorithm(
    AlgorithmSpec(
        name="fedzero",
        summary="FedZero: workers send two-point l1-sphere gradient estimates, the server "
        "averages and takes a projected step (zero-order, convex)",
        settings_class=FedZeroSettings,
        make_client=_make_client,
        make_server=_make_server,
        check=_check,
    )
)
