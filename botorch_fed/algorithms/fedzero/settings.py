r"""FedZero's settings and what they define: the step sizes ``eta`` and ``h`` (Cor. 3.2
of Akhavan, Janz and El-Mhamdi, paper 004) and the domain ``Theta`` shrunk by ``h``."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from botorch_fed.protocol.objectives import Objective
from botorch_fed.zeroth_order import ESTIMATORS, Box, L1Ball, L2Ball, fedzero_defaults

MESSAGES = ("vector", "seed", "sign")
DOMAINS = ("box", "l1-ball", "l2-ball")


def _number(name: str, value, positive: bool = True) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"`{name}` must be a finite number, got {value!r}.")
    if value <= 0 if positive else value < 0:
        raise ValueError(f"`{name}` must be {'positive' if positive else '>= 0'}, got {value!r}.")


@dataclass
class FedZeroSettings:
    r"""Settings of FedZero (defaults: Cor. 3.2 of the paper).

    Attributes:
        num_rounds: Rounds ``n``.
        eta: Step size (``None``: ``(1/L) sqrt(m / (n d))``).
        h: Perturbation radius (``None``: ``(1/L) sqrt((d + 1) / n)``).
        lipschitz: ``L`` (``None``: the problem's declared constant).
        estimator: ``l1`` (the paper's l1-sphere estimator) or ``l2`` (the classical
            l2-sphere one).
        message: What a worker sends: ``vector`` (its estimate), ``seed`` (two values
            and the seed of its direction) or ``sign`` (the sign vector as bits and one
            scalar; l1 only).
        domain: ``Theta``: the objective's ``box``, or an ``l1-ball`` / ``l2-ball``
            around the box's centre.
        radius: The ball's radius (``None``: half the box's smallest side).
        record_points: Record the queried points in the results (``2 m n`` points of
            dimension ``d``: large); otherwise only their values.
    """

    num_rounds: int = 200
    eta: float | None = None
    h: float | None = None
    lipschitz: float | None = None
    estimator: str = field(default="l1", metadata={"choices": tuple(ESTIMATORS)})
    message: str = field(default="vector", metadata={"choices": MESSAGES})
    domain: str = field(default="box", metadata={"choices": DOMAINS})
    radius: float | None = None
    record_points: bool = False

    def validate(self) -> None:
        r"""Raise ``ValueError`` naming the first invalid setting."""
        n = self.num_rounds
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"`num_rounds` must be a positive integer, got {n!r}.")
        for name in ("eta", "h", "lipschitz", "radius"):
            _number(name, getattr(self, name))
        if self.estimator not in ESTIMATORS:
            raise ValueError(f"`estimator`={self.estimator!r} must be one of {tuple(ESTIMATORS)}.")
        if self.message not in MESSAGES:
            raise ValueError(f"`message`={self.message!r} must be one of {MESSAGES}.")
        if self.domain not in DOMAINS:
            raise ValueError(f"`domain`={self.domain!r} must be one of {DOMAINS}.")
        if self.domain == "box" and self.radius is not None:
            raise ValueError("`radius` applies to `domain`='l1-ball' or 'l2-ball', not to the box.")
        if self.message == "sign" and self.estimator != "l1":
            raise ValueError(
                "`message`='sign' sends sign(z), which is the l1 estimator's direction: it "
                "needs `estimator`='l1'."
            )
        if not isinstance(self.record_points, bool):
            raise ValueError(f"`record_points` must be True or False, got {self.record_points!r}.")


def builtin_function(objective: Objective):
    r"""The test function behind a built-in objective (``None`` for the user's own)."""
    return getattr(objective, "function", None)


def step_parameters(settings: FedZeroSettings, objective: Objective, m: int) -> tuple[float, float]:
    r"""``(eta, h)``: the settings', else Cor. 3.2's from ``L``."""
    eta, h = settings.eta, settings.h
    if eta is None or h is None:
        L = settings.lipschitz
        if L is None:
            L = getattr(builtin_function(objective), "lipschitz", None)
        if L is None:
            raise ValueError(
                f"fedzero needs `eta` and `h`, or `lipschitz` (L) to derive them (Cor. 3.2): "
                f"the objective {objective.name!r} declares no Lipschitz constant."
            )
        eta0, h0 = fedzero_defaults(float(L), settings.num_rounds, m, objective.dim)
        eta = eta0 if eta is None else eta
        h = h0 if h is None else h
    return float(eta), float(h)


def make_domain(settings: FedZeroSettings, objective: Objective, h: float):
    r"""``Theta`` shrunk by ``h``: every query ``x +- h z`` lies within the bounds."""
    lower, upper = objective.bounds.to(torch.float64)
    half = float((upper - lower).min()) / 2
    # a default h too large for the domain: say where it came from and what to change
    origin = (
        " (Cor. 3.2's default (1/L) sqrt((d + 1) / n) for `num_rounds`="
        f"{settings.num_rounds}: raise `num_rounds` or give `h`)"
        if settings.h is None
        else ""
    )
    if settings.domain == "box":
        if h >= half:
            raise ValueError(
                f"`h`={h:g}{origin} must be below half the box's smallest side ({half:g}): "
                "the queries x +- h z must stay within the bounds."
            )
        return Box(lower, upper).shrink(h)
    radius = half if settings.radius is None else settings.radius
    if radius > half:
        raise ValueError(
            f"`radius`={radius:g} must be at most half the box's smallest side ({half:g}) "
            "so that the ball lies within the bounds."
        )
    if h >= radius:
        raise ValueError(f"`h`={h:g}{origin} must be below `radius`={radius:g}.")
    ball = L1Ball if settings.domain == "l1-ball" else L2Ball
    return ball((lower + upper) / 2, radius).shrink(h)
