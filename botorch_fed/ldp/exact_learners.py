r"""The exact-GP learners of [LDP-BO]: GP-UCB on raw rewards and on truncated ones.

- :class:`GPUCB` -- IGP-UCB on the raw rewards (the sub-Gaussian baseline): an exact GP,
  written in the feature space of the Nystrom map on *all* distinct played points,
  which is the exact posterior (eqs. 2-3).
- :class:`TGPUCB` -- Alg. 2, LDP-TGP-UCB: the same exact GP on rewards truncated once,
  at ``b_t = B + R + L ln t`` (private) or ``sqrt(v) t^(1/4)`` (non-private heavy
  tails).

Both update counts and sums per distinct point and rebuild their embedding only when a
new distinct point is played (at most ``|D|`` times on a finite domain), so a round
costs ``O(|D| m^2)`` whatever ``t``.

References:

.. [LDP-BO] X. Zhou, J. Tan. Local differential privacy for Bayesian optimization
   (paper 002 in ``shared/papers``).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from botorch_fed.ldp import parameters as P
from botorch_fed.ldp.ucb_learner import UCBLearner
from botorch_fed.models import FeatureSpaceGP, NystromEmbedding


class GPUCB(UCBLearner):
    r"""IGP-UCB on the raw rewards: the exact GP posterior (no truncation).

    ``beta_t = B + (R / sqrt lam) sqrt(2 (gamma_{t-1} + 1 + ln 1/delta))`` with ``R`` the
    noise bound, or ``sqrt(E eta^2)`` for unbounded noise (then only a heuristic: heavy
    tails are not sub-Gaussian, which is what the other learners are for).
    """

    name = "gp-ucb"

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._reset_sums()

    def _reset_sums(self) -> None:
        self._bias_sq = 0.0  # sum over plays of the squared truncation bias bound
        self._sums = torch.empty(0, dtype=torch.float64)  # per distinct point: sum of targets
        self._embedding: NystromEmbedding | None = NystromEmbedding(self.kernel, self._points)

    def beta_formula(self) -> float:
        rw = self.rewards
        R = rw.R if rw.R is not None else math.sqrt(rw.noise_second_moment)
        return P.gp_ucb_beta(rw.B, R, self.gamma, self.delta, self.lam)

    def _target(self, t: int, y: float) -> float:
        r"""What the exact GP regresses on for the reward ``y`` of play ``t``."""
        return y

    @property
    def model(self) -> FeatureSpaceGP:
        r"""The current surrogate (``mu_t``, ``sigma_t``), refitted here if plays were
        recorded without it (:meth:`observe_with_variance`)."""
        if self._model is None:
            self._refresh()
        assert self._model is not None
        return self._model

    def _refresh(self) -> None:
        if self._embedding is None:  # a new distinct point: the exact embedding grows
            self._embedding = NystromEmbedding(self.kernel, self._points)
        self._model = self._fit()

    def observe_with_variance(self, x: Tensor, y: float | Tensor, variance: float) -> None:
        r""":meth:`observe` with ``sigma_{t-1}^2(x)`` computed elsewhere (a batched grid's
        exact posterior of every replication,
        :func:`~botorch_fed.experiments.batched_ldp.exact_posterior`): the same
        bookkeeping -- ``gamma``, the plays, the truncation, the counts and sums -- and the
        surrogate refitted only when it is next read (:attr:`model`).

        Args:
            x: The point played (``1 x d``).
            y: The reward received (maximisation convention).
            variance: The posterior variance at ``x`` before this play (``>= 0``).
        """
        x, value = self._checked_play(x, y)
        if not (isinstance(variance, int | float) and math.isfinite(variance) and variance >= 0):
            raise ValueError(f"`variance`={variance!r} must be a finite number >= 0.")
        self.gamma += 0.5 * math.log1p(float(variance) / self.lam)
        self._append_play(x, value)
        self._update(refit=False)

    def _update(self, refit: bool = True) -> None:
        i = int(self._inverse[-1])
        target = self._target(self.t, float(self.y[-1]))
        if i < len(self._sums):
            self._sums[i] += target
        else:  # a new distinct point: the exact embedding grows (when next read)
            self._sums = torch.cat([self._sums, torch.tensor([target], dtype=torch.float64)])
            self._embedding = None
        self._model = None
        if refit:  # now, as every play of the protocol does
            self._refresh()

    def _fit(self) -> FeatureSpaceGP:
        assert self._embedding is not None  # built by `model` first
        Phi = self._embedding(self._points)  # distinct points x m
        gram = Phi.mT @ (self._counts.unsqueeze(-1) * Phi)
        rhs = Phi.mT @ self._sums
        V = gram + self.lam * torch.eye(len(gram), dtype=torch.float64)
        theta = torch.linalg.solve(V, rhs) if len(gram) else rhs
        return FeatureSpaceGP(self._embedding, theta, gram, self.lam)

    def _rebuild(self) -> None:
        X, y, saved = self.X, self.y, self.gamma
        self._reset_points()
        self._reset_sums()
        self._model, self.gamma = self._prior(), 0.0
        for i in range(len(X)):  # replays the truncations in order (each depends on t)
            self.gamma += self._information_gain(X[i])
            self.X, self.y = X[: i + 1], y[: i + 1]
            self._record_point(X[i])
            self._update()
        if not math.isclose(self.gamma, saved, rel_tol=1e-9, abs_tol=1e-9):
            raise ValueError(
                f"Learner state: `gamma`={saved!r} does not match the plays ({self.gamma!r})."
            )


class TGPUCB(GPUCB):
    r"""Alg. 2, (LDP-)TGP-UCB: the exact GP on rewards truncated once, ``y 1{|y| <= b_t}``.

    Private: ``b_t = B + R + L ln t`` and Alg. 2's ``beta_t``. Non-private (heavy tails,
    finite variance ``v``): ``b_t = sqrt(v) t^(1/4)`` and the same self-normalised width
    with the truncation bias ``sqrt(sum (v / b_tau)^2)`` (see
    :func:`~botorch_fed.ldp.parameters.heavy_tailed_tgp_beta`).
    """

    name = "tgp"

    def __init__(self, *args, truncation_scale: float = 1.0, **kwargs) -> None:
        self.truncation_scale = P._positive("truncation_scale", truncation_scale)
        self.truncated = 0  # rewards set to zero so far
        super().__init__(*args, **kwargs)

    def truncation(self, t: int) -> float:
        r"""``b_t`` (times ``truncation_scale``)."""
        rw = self.rewards
        if rw.private:
            b = P.tgp_truncation(t, rw.B, rw.R, rw.laplace_scale)
        else:
            b = P.heavy_tailed_truncation(t, rw.reward_second_moment)
        return self.truncation_scale * b

    def beta_formula(self) -> float:
        rw, t = self.rewards, self.t + 1
        b_prev = self.truncation(t - 1)
        if rw.private:
            assert rw.R is not None  # a private RewardModel requires R
            K = rw.B**2 + rw.R**2 + 2 * rw.laplace_scale**2
            return P.tgp_beta(t, rw.B, self.lam, b_prev, self.gamma, self.delta, K)
        bias = math.sqrt(self._bias_sq)
        return P.heavy_tailed_tgp_beta(rw.B, self.lam, b_prev, self.gamma, self.delta, bias)

    def _target(self, t: int, y: float) -> float:
        b = self.truncation(t)
        self._bias_sq += (self.rewards.reward_second_moment / b) ** 2
        if abs(y) <= b:
            return y
        self.truncated += 1
        return 0.0

    def _rebuild(self) -> None:
        self.truncated = 0
        super()._rebuild()
