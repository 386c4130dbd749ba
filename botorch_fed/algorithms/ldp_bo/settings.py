r"""LDP-BO's settings and the learner they define ([LDP-BO]: Zhou and Tan, paper 002; its
formulas are the defaults)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Annotated, Any

from botorch_fed.ldp import KERNELS, LEARNERS, RewardModel, make_kernel
from botorch_fed.problems.objectives import Objective
from botorch_fed.protocol.declarations import Choice, Int, Real, check_settings

USER_ORDERS = ("round-robin", "random")

# registered name -> (learner, private)
VARIANTS = {
    "ldp-tgp": ("tgp", True),
    "ldp-ata": ("ata", True),
    "ldp-moma": ("moma", True),
    "tgp": ("tgp", False),
    "ata": ("ata", False),
    "moma": ("moma", False),
    "gp-ucb": ("gp-ucb", False),
}


@dataclass
class LDPBOSettings:
    r"""Settings of the LDP-BO algorithms.

    Attributes:
        num_rounds: Rounds ``T``: one query (one reward) per round.
        epsilon: Each reported reward is ``epsilon``-LDP (``None``: 1; private only).
        reward_bound: ``B``, a bound on ``|f|`` (``None``: the objective's declaration).
        noise_bound: ``R``, a bound on the noise (``None``: the objective's declaration);
            private variants need it and clip rewards to ``[-(B + R), B + R]``.
        noise_moment: ``E[eta^2]`` for the non-private variants (``None``: the
            objective's noise, else ``R^2``).
        kernel: ``se``, ``matern`` or ``auto`` (the objective's hint, else ``se``).
        lengthscale: Unit-cube lengthscale (``None``: the objective's hint, else 0.2).
        nu: Matern smoothness (0.5, 1.5, 2.5).
        lam: ``lambda``, the ridge (surrogate noise) parameter.
        delta: Confidence parameter.
        accuracy: Nystrom accuracy of ATA and MoMA (the paper's epsilon in (0, 1)).
        q: Nystrom dictionary rate (``None``: ``6 rho ln(4T/delta)/accuracy^2``).
        plays_per_epoch: MoMA's ``k`` (``None``: ``ceil(24 ln(4 e T / delta))``).
        beta: A constant UCB ``beta`` (``None``: the paper's ``beta_t`` times ``beta_scale``).
        beta_scale: Factor on the paper's ``beta_t``.
        truncation_scale: Factor on the truncation points ``b_t`` (TGP, ATA).
        users: Which user answers round ``t``: ``round-robin`` or ``random``.
        user_budget: Total epsilon a user will spend (``None``: unlimited).
        num_restarts: ``optimize_acqf`` restarts (box domains).
        raw_samples: ``optimize_acqf`` raw samples (box domains).
        maxiter: ``optimize_acqf`` L-BFGS-B iterations (box domains).
    """

    num_rounds: Annotated[int, Int(1)] = 200
    epsilon: Annotated[float | None, Real(0, open=True, optional=True)] = None
    reward_bound: Annotated[float | None, Real(0, optional=True)] = None
    noise_bound: Annotated[float | None, Real(0, optional=True)] = None
    noise_moment: Annotated[float | None, Real(0, optional=True)] = None
    kernel: Annotated[str, Choice(("auto", *KERNELS))] = "auto"
    lengthscale: Annotated[float | None, Real(0, open=True, optional=True)] = None
    nu: float = 2.5
    lam: Annotated[float, Real(0, open=True)] = 1.0
    delta: Annotated[float, Real(0, 1, open=True)] = 0.1
    accuracy: Annotated[float, Real(0, 1, open=True)] = 0.5
    q: Annotated[float | None, Real(0, open=True, optional=True)] = None
    plays_per_epoch: Annotated[int | None, Int(1, optional=True)] = None
    beta: Annotated[float | None, Real(0, optional=True)] = None
    beta_scale: Annotated[float, Real(0, open=True)] = 1.0
    truncation_scale: Annotated[float, Real(0, open=True)] = 1.0
    users: Annotated[str, Choice(USER_ORDERS)] = "round-robin"
    user_budget: Annotated[float | None, Real(0, open=True, optional=True)] = None
    num_restarts: Annotated[int, Int(1)] = 4
    raw_samples: Annotated[int, Int(1)] = 256
    maxiter: Annotated[int, Int(1)] = 100

    def validate(self) -> None:
        r"""Raise ``ValueError`` naming the first invalid setting."""
        check_settings(self)
        if self.nu not in (0.5, 1.5, 2.5):
            raise ValueError(f"`nu`={self.nu!r} must be 0.5, 1.5 or 2.5.")


def reward_model(name: str, settings: LDPBOSettings, objective: Objective) -> RewardModel:
    r"""The learner's :class:`~botorch_fed.ldp.RewardModel` for algorithm ``name``: the
    settings' ``B``, ``R`` and noise moment, else the objective's declarations."""
    B, R = settings.reward_bound, settings.noise_bound
    B = getattr(objective, "reward_bound", None) if B is None else B
    R = getattr(objective, "noise_bound", None) if R is None else R
    if B is None:
        raise ValueError(
            f"{name} needs `reward_bound` (B, a bound on |f|): the objective "
            f"{objective.name!r} declares none."
        )
    if VARIANTS[name][1]:
        if R is None:
            raise ValueError(
                f"{name} needs `noise_bound` (R): the noise of {objective.name!r} is unbounded "
                "or undeclared. Give R: rewards beyond B + R are clipped by the users (for "
                "sub-Weibull noise, R = (ln(a T / delta) / b)^theta makes the release "
                "(epsilon, delta)-LDP, see LaplaceMechanism.sub_weibull)."
            )
        epsilon = 1.0 if settings.epsilon is None else float(settings.epsilon)
        return RewardModel(B=float(B), R=float(R), epsilon=epsilon)
    moment, noise = settings.noise_moment, getattr(objective, "noise", None)
    if moment is None and noise is not None:
        moment = float(noise.moment(2))
        moment = moment if math.isfinite(moment) else None  # infinite variance: none
    if moment is None and R is None:
        raise ValueError(
            f"{name} needs `noise_moment` (E[eta^2]) or `noise_bound`: the noise of "
            f"{objective.name!r} is undeclared."
        )
    R = None if R is None else float(R)
    moment = None if moment is None else float(moment)
    return RewardModel(B=float(B), R=R, noise_moment=moment)


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
