r"""FedZero's settings and what they define: the step sizes ``eta`` and ``h`` (Cor. 3.2
of [FedZero]: Akhavan, Janz and El-Mhamdi, paper 004) and the domain ``Theta`` shrunk
by ``h``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

import torch

from botorch_fed.problems.objectives import Objective
from botorch_fed.protocol.declarations import Choice, Flag, Int, Real, check_settings
from botorch_fed.zeroth_order import ESTIMATORS, Box, L1Ball, L2Ball, fedzero_defaults

MESSAGES = ("vector", "seed", "sign")
DOMAINS = ("box", "l1-ball", "l2-ball")


@dataclass
class FedZeroSettings:
    r"""Settings of FedZero (defaults: Cor. 3.2).

    Attributes:
        num_rounds: Rounds ``n``.
        eta: Step size (``None``: ``(1/L) sqrt(m / (n d))``).
        h: Perturbation radius (``None``: ``(1/L) sqrt((d + 1) / n)``).
        lipschitz: ``L`` (``None``: the problem's declared constant).
        estimator: ``l1`` (the paper's l1-sphere estimator) or ``l2`` (l2 sphere).
        message: What a worker sends: ``vector`` (its estimate), ``seed`` (two values
            and the seed of its direction) or ``sign`` (sign bits and a scalar; l1 only).
        domain: ``Theta``: the objective's ``box``, or an ``l1-ball`` / ``l2-ball``
            around the box's centre.
        radius: The ball's radius (``None``: half the box's smallest side).
        record_points: Record the queried points in the results (``2 m n`` points of
            dimension ``d``: large); otherwise only their values.
    """

    num_rounds: Annotated[int, Int(1)] = 200
    eta: Annotated[float | None, Real(0, open=True, optional=True)] = None
    h: Annotated[float | None, Real(0, open=True, optional=True)] = None
    lipschitz: Annotated[float | None, Real(0, open=True, optional=True)] = None
    estimator: Annotated[str, Choice(tuple(ESTIMATORS))] = "l1"
    message: Annotated[str, Choice(MESSAGES)] = "vector"
    domain: Annotated[str, Choice(DOMAINS)] = "box"
    radius: Annotated[float | None, Real(0, open=True, optional=True)] = None
    record_points: Annotated[bool, Flag()] = False

    def validate(self) -> None:
        r"""Raise ``ValueError`` naming the first invalid setting."""
        check_settings(self)
        if self.domain == "box" and self.radius is not None:
            raise ValueError("`radius` applies to `domain`='l1-ball' or 'l2-ball', not to the box.")
        if self.message == "sign" and self.estimator != "l1":
            raise ValueError(
                "`message`='sign' sends sign(z), which is the l1 estimator's direction: it "
                "needs `estimator`='l1'."
            )


def step_parameters(settings: FedZeroSettings, objective: Objective, m: int) -> tuple[float, float]:
    r"""``(eta, h)``: the settings', else Cor. 3.2's from ``L``."""
    eta, h = settings.eta, settings.h
    if eta is None or h is None:
        L = settings.lipschitz or getattr(getattr(objective, "function", None), "lipschitz", None)
        if L is None:
            raise ValueError(
                f"fedzero needs `eta` and `h`, or `lipschitz` (L) to derive them (Cor. 3.2): "
                f"the objective {objective.name!r} declares no Lipschitz constant."
            )
        eta0, h0 = fedzero_defaults(float(L), settings.num_rounds, m, objective.dim)
        eta, h = eta0 if eta is None else eta, h0 if h is None else h
    return float(eta), float(h)


def make_domain(settings: FedZeroSettings, objective: Objective, h: float):
    r"""``Theta`` shrunk by ``h``: every query ``x +- h z`` lies within the bounds."""
    lower, upper = objective.bounds.to(torch.float64)
    half = float((upper - lower).min()) / 2
    radius = half if settings.radius is None or settings.domain == "box" else settings.radius
    if radius > half:
        raise ValueError(
            f"`radius`={radius:g} must be at most half the box's smallest side ({half:g}) "
            "so that the ball lies within the bounds."
        )
    if h >= radius:
        what = "half the box's smallest side" if settings.domain == "box" else "`radius`"
        default = f" (Cor. 3.2's for `num_rounds`={settings.num_rounds}: raise it or give `h`)"
        raise ValueError(
            f"`h`={h:g}{default if settings.h is None else ''} must be below {what} "
            f"({radius:g}): the queries x +- h z must stay within the bounds."
        )
    if settings.domain == "box":
        return Box(lower, upper).shrink(h)
    ball = L1Ball if settings.domain == "l1-ball" else L2Ball
    return ball((lower + upper) / 2, radius).shrink(h)
