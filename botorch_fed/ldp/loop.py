r"""A learner against a reward function, round by round, without the federation protocol.

:func:`run_learner` is what the benchmarks time: ``T`` rounds of propose, reward,
(privatise), observe. The federation versions (``botorch-fed run ldp-moma`` ...) run the
same learners with every reward coming from a user (client) that privatises it
before it leaves; both give the same plays for the same rewards.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor

from botorch_fed.ldp.ucb_learner import UCBLearner


@dataclass
class LearnerTrace:
    r"""What one run of :func:`run_learner` did.

    Attributes:
        X: ``T x d`` points played.
        rewards: ``T`` rewards the learner received (privatised where private).
        values: ``T`` noise-free values ``f(x_t)`` (if ``f`` was given, else empty).
        cumulative_regret: ``T`` values ``R_t = sum_{s <= t} f* - f(x_s)`` (if ``f`` and
            ``optimum`` were given, else empty).
        time_s: Wall time of the rounds.
        round_times: Seconds of each round (propose + observe).
    """

    X: Tensor
    rewards: Tensor
    values: Tensor
    cumulative_regret: Tensor
    time_s: float
    round_times: list[float] = field(default_factory=list)


def run_learner(
    learner: UCBLearner,
    reward: Callable[[Tensor], Tensor],
    rounds: int,
    privatise: Callable[[Tensor], Tensor] | None = None,
    f: Callable[[Tensor], Tensor] | None = None,
    optimum: float | None = None,
) -> LearnerTrace:
    r"""Run ``learner`` for ``rounds`` plays.

    Args:
        learner: A fresh (or resumed) learner.
        reward: ``1 x d`` unit-cube point -> its noisy reward (maximisation convention).
        rounds: Number of plays.
        privatise: The users' mechanism (e.g. a
            :class:`~botorch_fed.privacy.LaplaceMechanism`), applied to each reward
            before the learner sees it; ``None``: the learner sees the raw reward.
        f: The noise-free function (for regret; never shown to the learner).
        optimum: ``max f`` over the domain (for regret).

    Returns:
        The :class:`LearnerTrace`.
    """
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
        raise ValueError(f"`rounds` must be a positive integer, got {rounds!r}.")
    if optimum is not None and f is None:
        raise ValueError("`optimum` needs `f` (the regret is computed from f(x_t)).")
    points, received, values, times = [], [], [], []
    start = time.perf_counter()
    for _ in range(rounds):
        t0 = time.perf_counter()
        x = learner.propose()
        y = torch.as_tensor(reward(x), dtype=torch.float64).reshape(())
        if privatise is not None:
            y = privatise(y).reshape(())
        learner.observe(x, y)
        times.append(time.perf_counter() - t0)
        points.append(x.reshape(-1))
        received.append(y)
        if f is not None:
            values.append(torch.as_tensor(f(x), dtype=torch.float64).reshape(()))
    X = torch.stack(points)
    vals = torch.stack(values) if values else torch.empty(0, dtype=torch.float64)
    regret = (
        torch.cumsum(optimum - vals, 0)
        if values and optimum is not None
        else torch.empty(0, dtype=torch.float64)
    )
    return LearnerTrace(
        X=X,
        rewards=torch.stack(received),
        values=vals,
        cumulative_regret=regret,
        time_s=time.perf_counter() - start,
        round_times=times,
    )
