r"""What the learners of [LDP-BO] assume about the function and the rewards.

The unknown function lies in the RKHS of a kernel ``k`` with ``k(x, x) = 1`` (the
paper's SE or Matern kernels, :func:`make_kernel`) with norm at most ``B``; a
:class:`RewardModel` states ``B`` and the noise of the rewards the learner receives
(bounded by ``R``, or heavy-tailed with a finite second moment), from which every
learner's constants follow.

Whether a learner is private is a property of its :class:`RewardModel`: with ``epsilon``
the rewards it receives are Curator 1's ``y + Laplace(2 (B + R) / epsilon)`` and its
constants follow the LDP theorems; without, they follow the heavy-tailed ones (finite
variance, ``alpha = 1``). The learner never privatises anything: users do, before a
reward leaves them (:mod:`botorch_fed.privacy`).

References:

.. [LDP-BO] X. Zhou, J. Tan. Local differential privacy for Bayesian optimization
   (paper 002 in ``shared/papers``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from gpytorch.kernels import MaternKernel, RBFKernel

from botorch_fed.ldp import parameters as P

KERNELS = ("se", "matern")


def make_kernel(kind: str = "se", lengthscale: float = 0.2, nu: float = 2.5, dim: int = 1):
    r"""The paper's kernels with ``k(x, x) = 1``: SE ``exp(-s^2 / 2 l^2)`` or Matern(``nu``).

    Args:
        kind: ``"se"`` or ``"matern"``.
        lengthscale: ``l`` (unit-cube coordinates), shared by all dimensions.
        nu: Matern smoothness, 0.5, 1.5 or 2.5.
        dim: Input dimension.

    Returns:
        A float64 gpytorch kernel with fixed hyperparameters (no outputscale).
    """
    if kind not in KERNELS:
        raise ValueError(f"`kernel`={kind!r} must be one of {KERNELS}.")
    if not (isinstance(lengthscale, int | float) and 0 < lengthscale < math.inf):
        raise ValueError(f"`lengthscale` must be a positive number, got {lengthscale!r}.")
    if kind == "matern" and nu not in (0.5, 1.5, 2.5):
        raise ValueError(f"`nu` must be 0.5, 1.5 or 2.5, got {nu!r}.")
    kernel = RBFKernel() if kind == "se" else MaternKernel(nu=nu)
    kernel = kernel.to(torch.float64)
    kernel.lengthscale = torch.tensor(float(lengthscale), dtype=torch.float64)
    kernel.requires_grad_(False)
    return kernel


@dataclass(frozen=True)
class RewardModel:
    r"""What the learner assumes about the rewards it receives.

    Attributes:
        B: Bound on ``|f|`` (the paper's RKHS-norm bound ``B``).
        R: Bound on the noise ``|eta| <= R`` (``None``: unbounded, e.g. heavy tails).
        epsilon: The users' LDP level: rewards are privatised by Curator 1 with
            ``L = 2 (B + R) / epsilon``. ``None``: non-private rewards.
        noise_moment: ``E[eta^2]`` (non-private heavy-tailed noise; ``None``: ``R^2``).
    """

    B: float
    R: float | None = None
    epsilon: float | None = None
    noise_moment: float | None = None

    def __post_init__(self) -> None:
        P._positive("B", self.B, allow_zero=True)
        if self.R is not None:
            P._positive("R", self.R, allow_zero=True)
        if self.noise_moment is not None:
            P._positive("noise_moment", self.noise_moment, allow_zero=True)
        if self.epsilon is not None:
            P._positive("epsilon", self.epsilon)
            if self.R is None:
                raise ValueError(
                    "A private RewardModel needs the noise bound `R` (Curator 1 clips to "
                    "[-(B + R), B + R]); for unbounded noise use LaplaceMechanism.sub_weibull's R."
                )
        elif self.R is None and self.noise_moment is None:
            raise ValueError(
                "A non-private RewardModel needs `R` (bounded noise) or `noise_moment` "
                "(E[eta^2] of heavy-tailed noise)."
            )

    @property
    def private(self) -> bool:
        return self.epsilon is not None

    @property
    def laplace_scale(self) -> float:
        r"""``L`` of Curator 1 (0 for non-private rewards)."""
        return P.laplace_scale(self.epsilon, self.B, self.R) if self.private else 0.0

    @property
    def noise_second_moment(self) -> float:
        r"""``c``: the second moment of the total noise of a received reward."""
        if self.private:
            return P.private_noise_moment(self.B, self.R, self.epsilon)
        if self.noise_moment is not None:
            return self.noise_moment
        assert self.R is not None  # checked at construction: R or noise_moment
        return self.R**2

    @property
    def reward_second_moment(self) -> float:
        r"""``v = B^2 + c``: a bound on the second moment of a received reward."""
        return self.B**2 + self.noise_second_moment
