r"""LDP-BO's settings and the learner they define (Zhou and Tan, paper 002).

The paper's formulas are the defaults; :func:`reward_model` fills ``B``, ``R`` and the
noise moment from the objective's declarations where the settings leave them open, and
:func:`make_learner` builds the learner of each registered variant (:data:`VARIANTS`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from botorch_fed.ldp import KERNELS, LEARNERS, RewardModel, make_kernel
from botorch_fed.protocol.objectives import Objective

USER_ORDERS = ("round-robin", "random")

# name -> (learner, private)
VARIANTS = {
    "ldp-tgp": ("tgp", True),
    "ldp-ata": ("ata", True),
    "ldp-moma": ("moma", True),
    "tgp": ("tgp", False),
    "ata": ("ata", False),
    "moma": ("moma", False),
    "gp-ucb": ("gp-ucb", False),
}


def _number(name: str, value, *, positive: bool = False, optional: bool = True) -> None:
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"`{name}` must be a finite number, got {value!r}.")
    if value < 0 or (positive and value == 0):
        raise ValueError(
            f"`{name}` must be {'positive' if positive else 'non-negative'}, got {value!r}."
        )


@dataclass
class LDPBOSettings:
    r"""Settings of the LDP-BO algorithms (the paper's formulas are the defaults).

    Attributes:
        num_rounds: Rounds ``T``: one query (one reward) per round.
        epsilon: Each reported reward is ``epsilon``-LDP (private variants only;
            ``None``: 1).
        reward_bound: ``B``, a bound on ``|f|`` (``None``: the objective's declaration).
        noise_bound: ``R``, a bound on the noise (``None``: the objective's
            declaration). Private variants need it; rewards beyond ``B + R`` are
            clipped by the users.
        noise_moment: ``E[eta^2]`` of unbounded noise for the non-private variants
            (``None``: the objective's noise, else ``R^2``).
        kernel: ``se``, ``matern`` or ``auto`` (the objective's hint, else ``se``).
        lengthscale: Kernel lengthscale in the unit cube (``None``: the objective's
            hint, else 0.2).
        nu: Matern smoothness (0.5, 1.5, 2.5).
        lam: ``lambda``, the ridge (surrogate noise) parameter.
        delta: Confidence parameter of the formulas.
        accuracy: Nystrom accuracy of ATA and MoMA (the paper's epsilon in (0, 1)).
        q: Nystrom dictionary rate (``None``: ``6 rho ln(4T/delta)/accuracy^2``).
        plays_per_epoch: MoMA's ``k`` (``None``: ``ceil(24 ln(4 e T / delta))``).
        beta: A constant UCB ``beta`` (``None``: the paper's ``beta_t`` times
            ``beta_scale``).
        beta_scale: Factor on the paper's ``beta_t`` (the theory's constants are
            conservative; the paper's experiments set them "order-wise").
        truncation_scale: Factor on the truncation points ``b_t`` (TGP, ATA).
        users: Which user answers round ``t``: ``round-robin`` or ``random``.
        user_budget: Total epsilon a user will spend (``None``: unlimited; the result
            reports what each spent).
        num_restarts: ``optimize_acqf`` restarts (box domains).
        raw_samples: ``optimize_acqf`` raw samples (box domains).
        maxiter: ``optimize_acqf`` L-BFGS-B iterations (box domains).
    """

    num_rounds: int = 200
    epsilon: float | None = None
    reward_bound: float | None = None
    noise_bound: float | None = None
    noise_moment: float | None = None
    kernel: str = field(default="auto", metadata={"choices": ("auto", *KERNELS)})
    lengthscale: float | None = None
    nu: float = 2.5
    lam: float = 1.0
    delta: float = 0.1
    accuracy: float = 0.5
    q: float | None = None
    plays_per_epoch: int | None = None
    beta: float | None = None
    beta_scale: float = 1.0
    truncation_scale: float = 1.0
    users: str = field(default="round-robin", metadata={"choices": USER_ORDERS})
    user_budget: float | None = None
    num_restarts: int = 4
    raw_samples: int = 256
    maxiter: int = 100

    def validate(self) -> None:
        r"""Raise ``ValueError`` naming the first invalid setting."""
        for name in ("num_rounds", "num_restarts", "raw_samples", "maxiter"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"`{name}` must be a positive integer, got {value!r}.")
        k = self.plays_per_epoch
        if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 1):
            raise ValueError(f"`plays_per_epoch` must be a positive integer or None, got {k!r}.")
        _number("epsilon", self.epsilon, positive=True)
        for name in ("reward_bound", "noise_bound", "noise_moment", "beta"):
            _number(name, getattr(self, name))
        for name in ("lengthscale", "q", "user_budget"):
            _number(name, getattr(self, name), positive=True)
        for name in ("lam", "beta_scale", "truncation_scale"):
            _number(name, getattr(self, name), positive=True, optional=False)
        if self.kernel not in ("auto", *KERNELS):
            raise ValueError(f"`kernel`={self.kernel!r} must be one of {('auto', *KERNELS)}.")
        if self.nu not in (0.5, 1.5, 2.5):
            raise ValueError(f"`nu` must be 0.5, 1.5 or 2.5, got {self.nu!r}.")
        for name in ("delta", "accuracy"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < 1:
                raise ValueError(f"`{name}` must be in (0, 1), got {value!r}.")
        if self.users not in USER_ORDERS:
            raise ValueError(f"`users`={self.users!r} must be one of {USER_ORDERS}.")


def _noise_moment(objective: Objective) -> float | None:
    r"""``E[eta^2]`` of a built-in problem's noise, if the objective knows it."""
    noise = getattr(objective, "noise", None)
    if noise is None:
        return None
    moment = float(noise.moment(2))
    return moment if math.isfinite(moment) else None  # infinite variance: none to give


def reward_model(name: str, settings: LDPBOSettings, objective: Objective) -> RewardModel:
    r"""The learner's :class:`~botorch_fed.ldp.RewardModel` for algorithm ``name``: the
    settings' ``B``, ``R``, moment, else the objective's declarations."""
    _, private = VARIANTS[name]
    B = settings.reward_bound
    if B is None:
        B = getattr(objective, "reward_bound", None)
    if B is None:
        raise ValueError(
            f"{name} needs `reward_bound` (B, a bound on |f|): the objective "
            f"{objective.name!r} declares none."
        )
    R = settings.noise_bound
    if R is None:
        R = getattr(objective, "noise_bound", None)
    if private:
        if R is None:
            raise ValueError(
                f"{name} needs `noise_bound` (R): the noise of {objective.name!r} is unbounded "
                "or undeclared. Give R: rewards beyond B + R are clipped by the users (for "
                "sub-Weibull noise, R = (ln(a T / delta) / b)^theta makes the release "
                "(epsilon, delta)-LDP, see LaplaceMechanism.sub_weibull)."
            )
        epsilon = 1.0 if settings.epsilon is None else float(settings.epsilon)
        return RewardModel(B=float(B), R=float(R), epsilon=epsilon)
    moment = settings.noise_moment
    if moment is None:
        moment = _noise_moment(objective)
    if moment is None and R is None:
        raise ValueError(
            f"{name} needs `noise_moment` (E[eta^2]) or `noise_bound`: the noise of "
            f"{objective.name!r} is undeclared."
        )
    return RewardModel(
        B=float(B),
        R=None if R is None else float(R),
        noise_moment=None if moment is None else float(moment),
    )


def make_learner(name: str, settings: LDPBOSettings, objective: Objective, seed: int):
    r"""The learner of algorithm ``name`` for ``objective`` (finite domain if the
    objective has ``candidates``)."""
    kind, _ = VARIANTS[name]
    hint = getattr(objective, "kernel_hint", None) or {}
    auto = settings.kernel == "auto"
    kernel = make_kernel(
        hint.get("kernel", "se") if auto else settings.kernel,
        settings.lengthscale or hint.get("lengthscale", 0.2),
        hint.get("nu", settings.nu) if auto else settings.nu,
        objective.dim,
    )
    extra: dict[str, Any] = {}
    if kind in ("ata", "moma"):
        extra.update(accuracy=settings.accuracy, q=settings.q)
    if kind == "moma":
        extra["k"] = settings.plays_per_epoch
    if kind in ("tgp", "ata"):
        extra["truncation_scale"] = settings.truncation_scale
    return LEARNERS[kind](
        kernel,
        objective.dim,
        settings.num_rounds,
        reward_model(name, settings, objective),
        lam=settings.lam,
        delta=settings.delta,
        candidates=getattr(objective, "candidates", None),
        beta=settings.beta,
        beta_scale=settings.beta_scale,
        seed=seed,
        num_restarts=settings.num_restarts,
        raw_samples=settings.raw_samples,
        maxiter=settings.maxiter,
        **extra,
    )


def answers_per_user(settings: LDPBOSettings) -> int | None:
    r"""How many queries a user's ``user_budget`` covers (``None``: unlimited)."""
    if settings.user_budget is None:
        return None
    epsilon = 1.0 if settings.epsilon is None else settings.epsilon
    return math.floor(settings.user_budget / epsilon * (1 + 1e-12))
