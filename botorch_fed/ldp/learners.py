r"""The GP-UCB learners of [LDP-BO] as step-by-step programs: propose, observe, repeat.

A learner holds what the learning agent of the paper holds -- the points it played and
the (privatised) rewards it received -- and nothing else. Each round it

1. proposes ``x_t``: the maximiser of ``mu_{t-1}(x) + beta_t sigma_{t-1}(x)``, exactly over
   a finite domain (``candidates``) or by ``optimize_acqf`` on the unit cube;
2. observes the reward ``y_t`` a user returns for it, and updates its surrogate.

Its surrogate (:attr:`UCBLearner.model`) is a BoTorch :class:`~botorch_fed.models.FeatureSpaceGP`
(``mu = phi' theta``, ``sigma^2 = k(x,x) - phi' phi + lam phi' V^-1 phi``), so it works with
BoTorch's acquisition functions and ``optimize_acqf`` like any other model.

- :class:`GPUCB` -- IGP-UCB on the raw rewards (the sub-Gaussian baseline): an exact GP,
  written in the feature space of the Nystrom map on *all* distinct played points, which
  is the exact posterior (eqs. 2-3).
- :class:`TGPUCB` -- Alg. 2, LDP-TGP-UCB: the same exact GP on rewards truncated once, at
  ``b_t = B + R + L ln t`` (private) or ``sqrt(v) t^(1/4)`` (non-private heavy tails).
- :class:`ATAGPUCB` -- Alg. 1, LDP-ATA-GP-UCB: a fresh Nystrom embedding every round
  (dictionary sampled with probabilities ``min(q sigma~^2_{t-1}, 1)``, Alg. 4) and
  feature-adaptive truncation of every past payoff (TOFU).
- :class:`MoMAGPUCB` -- Alg. 3, MoMA-GP-UCB: epochs of ``k`` plays of one point, ``k``
  least-squares estimates and the median-of-means pick; the embedding is updated once
  per epoch.

Whether a learner is private is a property of its :class:`RewardModel`: with ``epsilon``
the rewards it receives are Curator 1's ``y + Laplace(2 (B + R) / epsilon)`` and its
constants follow the LDP theorems; without, they follow the heavy-tailed ones (finite
variance, ``alpha = 1``). The learner never privatises anything: users do, before a
reward leaves them (:mod:`botorch_fed.privacy`).

Incremental work: the exact learners update counts and sums per distinct point and
rebuild their embedding only when a new distinct point is played (at most ``|D|`` times
on a finite domain), so a round costs ``O(|D| m^2)`` whatever ``t``; MoMA does its work once
per epoch; ATA re-truncates the whole history every round, as Alg. 1 prescribes
(``O(t m^2)`` a round: the paper's reason for MoMA).

References:

.. [LDP-BO] X. Zhou, J. Tan. Local differential privacy for Bayesian optimization
   (paper 002 in ``shared/papers``).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch
from botorch.acquisition import UpperConfidenceBound
from gpytorch.kernels import Kernel, MaternKernel, RBFKernel
from torch import Tensor

from botorch_fed.acquisition import maximize_step_acquisition
from botorch_fed.ldp import parameters as P
from botorch_fed.models import (
    FeatureSpaceGP,
    NystromEmbedding,
    ata_estimate,
    median_of_means_estimate,
    ridge_estimate,
    sample_dictionary,
)

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
        return self.noise_moment if self.noise_moment is not None else self.R**2

    @property
    def reward_second_moment(self) -> float:
        r"""``v = B^2 + c``: a bound on the second moment of a received reward."""
        return self.B**2 + self.noise_second_moment


class UCBLearner(ABC):
    r"""Base class: the UCB step on a surrogate, the history, checkpoints.

    Args:
        kernel: The kernel ``k`` (``k(x, x) <= 1``, fixed hyperparameters; see
            :func:`make_kernel`).
        dim: Input dimension (the unit cube ``[0, 1]^d``).
        horizon: ``T``, the number of plays the parameter formulas assume.
        rewards: The :class:`RewardModel`.
        lam: ``lambda`` (ridge / surrogate noise variance).
        delta: Confidence parameter of the formulas.
        candidates: The finite domain (``n x d`` unit-cube points; ``None``: the box).
        beta: A constant ``beta`` overriding the formula (``None``: the formula).
        beta_scale: A factor on the formula's ``beta``.
        seed: Seed of the learner's randomness (dictionary sampling, ``optimize_acqf``).
        num_restarts: ``optimize_acqf`` restarts (box domains).
        raw_samples: ``optimize_acqf`` raw samples (box domains).
        maxiter: ``optimize_acqf`` L-BFGS-B iterations (box domains).
    """

    name = "ucb"

    def __init__(
        self,
        kernel: Kernel,
        dim: int,
        horizon: int,
        rewards: RewardModel,
        lam: float = 1.0,
        delta: float = 0.1,
        candidates: Tensor | None = None,
        beta: float | None = None,
        beta_scale: float = 1.0,
        seed: int = 0,
        num_restarts: int = 4,
        raw_samples: int = 256,
        maxiter: int = 100,
    ) -> None:
        for name, value in (
            ("dim", dim),
            ("horizon", horizon),
            ("num_restarts", num_restarts),
            ("raw_samples", raw_samples),
            ("maxiter", maxiter),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"`{name}` must be a positive integer, got {value!r}.")
        if not isinstance(rewards, RewardModel):
            raise ValueError(f"`rewards` must be a RewardModel, got {type(rewards).__name__}.")
        self.lam = P._positive("lam", lam)
        if not (isinstance(delta, int | float) and 0 < delta < 1):
            raise ValueError(f"`delta` must be in (0, 1), got {delta!r}.")
        if beta is not None:
            P._positive("beta", beta, allow_zero=True)
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ValueError(f"`seed` must be an integer, got {seed!r}.")
        P._positive("beta_scale", beta_scale, allow_zero=True)
        if candidates is not None:
            candidates = torch.as_tensor(candidates).detach().to(torch.float64).clone()
            if candidates.ndim != 2 or candidates.shape[-1] != dim:
                raise ValueError(
                    f"`candidates` must have shape n x {dim}, got {tuple(candidates.shape)}."
                )
            if len(candidates) == 0:
                raise ValueError("`candidates` is an empty domain: give at least one point.")
            if (
                not torch.isfinite(candidates).all()
                or (candidates < 0).any()
                or (candidates > 1).any()
            ):
                raise ValueError("`candidates` must be finite points of the unit cube.")
        self.kernel = kernel
        self.dim = dim
        self.horizon = horizon
        self.rewards = rewards
        self.delta = float(delta)
        self.candidates = candidates
        self.beta_override = beta
        self.beta_scale = float(beta_scale)
        self.seed = int(seed)
        self.num_restarts, self.raw_samples, self.maxiter = num_restarts, raw_samples, maxiter
        self.generator = torch.Generator().manual_seed(self.seed)
        self.X = torch.empty(0, dim, dtype=torch.float64)  # every play, in order
        self.y = torch.empty(0, dtype=torch.float64)  # every received reward
        self.gamma = 0.0  # information gain of the plays (chain rule of the exact GP)
        self._reset_points()
        self._model = self._prior()

    def _reset_points(self) -> None:
        r"""The distinct points played, how often, and which one each play was."""
        self._points = torch.empty(0, self.dim, dtype=torch.float64)
        self._counts = torch.empty(0, dtype=torch.float64)
        self._inverse = torch.empty(0, dtype=torch.long)

    def _record_point(self, x: Tensor) -> int:
        r"""Book the play of ``x`` (``d``); returns its distinct-point index."""
        hit = (self._points == x).all(-1).nonzero()
        if len(hit):
            i = int(hit[0])
            self._counts[i] += 1
        else:
            i = len(self._points)
            self._points = torch.cat([self._points, x.unsqueeze(0)])
            self._counts = torch.cat([self._counts, torch.ones(1, dtype=torch.float64)])
        self._inverse = torch.cat([self._inverse, torch.tensor([i])])
        return i

    # --- the surrogate -------------------------------------------------------------
    def _prior(self) -> FeatureSpaceGP:
        empty = torch.empty(0, self.dim, dtype=torch.float64)
        none = torch.empty(0, dtype=torch.float64)
        return FeatureSpaceGP(
            NystromEmbedding(self.kernel, empty), none, none.reshape(0, 0), self.lam
        )

    @property
    def model(self) -> FeatureSpaceGP:
        r"""The current surrogate (``mu_t``, ``sigma_t``) as a BoTorch model."""
        return self._model

    @property
    def t(self) -> int:
        r"""Plays so far."""
        return len(self.y)

    @abstractmethod
    def beta_formula(self) -> float:
        r"""The paper's ``beta`` for the next play."""

    def beta(self) -> float:
        r"""``beta`` of the next play: the override, or ``beta_scale`` times the formula."""
        if self.beta_override is not None:
            return float(self.beta_override)
        return self.beta_scale * self.beta_formula()

    # --- one round -------------------------------------------------------------------
    def propose(self) -> Tensor:
        r"""The next point to play, ``1 x d`` in the unit cube."""
        beta = self.beta()
        if self.candidates is not None:
            mean, var = self.model.mean_and_variance(self.candidates)
            ucb = mean + beta * var.sqrt()
            # ties (e.g. the flat prior of round 1) are broken at random, not by position
            best = (ucb >= ucb.max() - 1e-12 * max(1.0, float(ucb.abs().max()))).nonzero()
            pick = best[int(torch.randint(len(best), (1,), generator=self.generator))]
            return self.candidates[int(pick)].unsqueeze(0)
        acqf = UpperConfidenceBound(self.model, beta=beta**2)  # BoTorch: mean + sqrt(beta) sigma
        bounds = torch.stack([torch.zeros(self.dim), torch.ones(self.dim)]).to(torch.float64)
        x = maximize_step_acquisition(
            acqf,
            bounds,
            seed=(self.seed * 1_000_003 + self.t) % (2**31),
            num_restarts=self.num_restarts,
            raw_samples=self.raw_samples,
            maxiter=self.maxiter,
        )
        return x.detach().clamp(0.0, 1.0)

    def observe(self, x: Tensor, y: float | Tensor) -> None:
        r"""Record the reward ``y`` received for playing ``x`` (``1 x d``) and update.

        Args:
            x: The point played (what :meth:`propose` returned).
            y: The reward in the maximisation convention (privatised for a private
                learner).
        """
        x = torch.as_tensor(x, dtype=torch.float64).reshape(-1)
        if x.shape != (self.dim,) or not torch.isfinite(x).all():
            raise ValueError(f"`x` must be one finite point of dimension {self.dim}.")
        if (x < 0).any() or (x > 1).any():
            raise ValueError(f"`x`={x.tolist()} must lie in the unit cube [0, 1]^{self.dim}.")
        try:
            y = torch.as_tensor(y, dtype=torch.float64)
        except (TypeError, ValueError, RuntimeError):
            raise ValueError(f"The reward `y` must be one number, got {y!r}.") from None
        if y.numel() != 1:
            raise ValueError(f"The reward `y` must be one number, got shape {tuple(y.shape)}.")
        y = float(y.reshape(()))
        if not math.isfinite(y):
            raise ValueError(f"The reward `y` must be finite, got {y!r}.")
        if self.candidates is not None and self._candidate_index(x) is None:
            raise ValueError(f"`x`={x.tolist()} is not a point of the finite domain.")
        self.gamma += self._information_gain(x)
        self.X = torch.cat([self.X, x.unsqueeze(0)])
        self.y = torch.cat([self.y, torch.tensor([y], dtype=torch.float64)])
        self._record_point(x)
        self._update()

    @abstractmethod
    def _update(self) -> None:
        r"""Update the surrogate after the last play was recorded."""

    def _variance(self, X: Tensor) -> Tensor:
        r"""The exact GP posterior variance of the plays so far (for ``gamma``): the
        surrogate's own variance (subclasses whose surrogate is approximate override)."""
        return self.model.mean_and_variance(X)[1]

    def _information_gain(self, x: Tensor) -> float:
        r"""``0.5 ln(1 + sigma_{t-1}^2(x) / lam)``: what playing ``x`` adds to ``gamma``."""
        return 0.5 * math.log1p(float(self._variance(x.unsqueeze(0))) / self.lam)

    def _check_dictionary(self, points: Tensor) -> None:
        r"""A loaded dictionary must be a set of the points it was drawn from."""
        D = getattr(self, "_dictionary", None)
        if D is None:
            return
        if D.ndim != 2 or D.shape[-1] != self.dim:
            raise ValueError(f"Learner state: `dictionary` must be m x {self.dim}.")
        if len(D) and not (D.unsqueeze(1) == points.unsqueeze(0)).all(-1).any(-1).all():
            raise ValueError("Learner state: `dictionary` holds points that were never played.")

    def _candidate_index(self, x: Tensor) -> int | None:
        hit = (self.candidates == x).all(-1).nonzero()
        return int(hit[0]) if len(hit) else None

    # --- checkpoints -----------------------------------------------------------------
    def state_dict(self) -> dict:
        r"""The learner's state between rounds (plays, rewards, generator, horizon)."""
        return {
            "learner": self.name,
            "X": self.X.clone(),
            "y": self.y.clone(),
            "gamma": self.gamma,
            "generator": self.generator.get_state(),
            "horizon": self.horizon,
        }

    def load_state_dict(self, state: dict) -> None:
        r"""Restore :meth:`state_dict`: the surrogate is rebuilt from the plays.

        The horizon the parameters were derived from is restored with it: a run whose
        ``num_rounds`` is extended keeps the formulas of its original horizon.
        """
        keys = {"learner", "X", "y", "gamma", "generator", "horizon"}  # this class's state_dict
        if set(state) != keys:
            raise ValueError(f"Learner state has keys {sorted(state)}, expected {sorted(keys)}.")
        if state["learner"] != self.name:
            raise ValueError(
                f"Learner state of a {state['learner']!r} learner, not of {self.name!r}."
            )
        X = torch.as_tensor(state["X"], dtype=torch.float64)
        y = torch.as_tensor(state["y"], dtype=torch.float64)
        if X.ndim != 2 or X.shape[-1] != self.dim or y.shape != (len(X),):
            raise ValueError("Learner state: `X` must be t x d and `y` of length t.")
        self.horizon = int(state["horizon"])
        self.X, self.y, self.gamma = X.clone(), y.clone(), float(state["gamma"])
        self._reset_points()
        for x in self.X:
            self._record_point(x)
        self._rebuild()
        self.generator.set_state(state["generator"])

    @abstractmethod
    def _rebuild(self) -> None:
        r"""Rebuild the surrogate from ``X`` and ``y`` (after loading a state)."""


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
        self._embedding = NystromEmbedding(self.kernel, self._points)

    def beta_formula(self) -> float:
        rw = self.rewards
        R = rw.R if rw.R is not None else math.sqrt(rw.noise_second_moment)
        return P.gp_ucb_beta(rw.B, R, self.gamma, self.delta, self.lam)

    def _target(self, t: int, y: float) -> float:
        r"""What the exact GP regresses on for the reward ``y`` of play ``t``."""
        return y

    def _update(self) -> None:
        i = int(self._inverse[-1])
        target = self._target(self.t, float(self.y[-1]))
        if i < len(self._sums):
            self._sums[i] += target
        else:  # a new distinct point: the exact embedding grows
            self._sums = torch.cat([self._sums, torch.tensor([target], dtype=torch.float64)])
            self._embedding = NystromEmbedding(self.kernel, self._points)
        self._model = self._fit()

    def _fit(self) -> FeatureSpaceGP:
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


class ATAGPUCB(UCBLearner):
    r"""Alg. 1, (LDP-)ATA-GP-UCB: Nystrom features resampled every round and TOFU's
    feature-adaptive truncation of every past payoff at ``b_t = sqrt(v / ln(4 m_t T / delta))``.

    Every past payoff is truncated at the *current* ``b_t`` (the threshold of Thm. 2 at
    round ``t``, as TOFU [Shao et al. 2018] truncates all payoffs at round ``t``); Alg. 1
    line 10 writes ``b_tau``, which with ``alpha = 1`` differs only through ``m_tau``.

    Args:
        *args, **kwargs: As :class:`UCBLearner`.
        accuracy: The Nystrom accuracy ``epsilon`` of Thm. 2 (in (0, 1)).
        q: The dictionary rate (``None``: ``6 rho ln(4 T / delta) / accuracy^2``).
        truncation_scale: A factor on ``b_t``.
    """

    name = "ata"

    def __init__(
        self,
        *args,
        accuracy: float = 0.5,
        q: float | None = None,
        truncation_scale: float = 1.0,
        **kwargs,
    ) -> None:
        P.rho(accuracy)
        self.accuracy = float(accuracy)
        self.q_override = None if q is None else P._positive("q", q)
        self.truncation_scale = P._positive("truncation_scale", truncation_scale)
        self.truncated = 0  # truncated terms in the last estimate
        super().__init__(*args, **kwargs)

    @property
    def q(self) -> float:
        if self.q_override is not None:
            return self.q_override
        return P.nystrom_rate(self.horizon, self.delta, self.accuracy)

    def beta_formula(self) -> float:
        rw, m = self.rewards, self.model.embedding.dim
        return P.ata_beta(
            rw.B, self.accuracy, rw.reward_second_moment, m, self.horizon, self.delta, self.lam
        )

    def _variance(self, X: Tensor) -> Tensor:
        return torch.zeros(len(X), dtype=torch.float64)  # gamma is not used by ATA

    def _update(self) -> None:
        # Alg. 4 on the plays x_1..x_t with sigma~_{t-1}(x_i) (Alg. 1 line 6): each play
        # enters with probability p = min(q sigma~^2, 1) and the dictionary is the set of
        # points drawn, so a point played n times enters with probability 1 - (1 - p)^n
        # -- drawn here once per distinct point (same distribution, O(distinct) draws)
        variances = self.model.mean_and_variance(self._points)[1].clamp_min(0.0)
        p = (self.q * variances).clamp_max(1.0)
        u = torch.rand(len(p), generator=self.generator, dtype=torch.float64)
        self._model = self._fit(self._points[u < 1 - (1 - p) ** self._counts])

    def _fit(self, dictionary: Tensor) -> FeatureSpaceGP:
        r"""Alg. 1 lines 7-13 on the dictionary ``dictionary``."""
        embedding = NystromEmbedding(self.kernel, dictionary)
        Phi_points = embedding(self._points)  # distinct points x m
        Phi = Phi_points[self._inverse]  # every play, t x m
        b = self.truncation_scale * P.ata_truncation(
            self.rewards.reward_second_moment, embedding.dim, self.horizon, self.delta
        )
        theta, self.truncated = ata_estimate(Phi, self.y, self.lam, torch.full_like(self.y, b))
        gram = Phi_points.mT @ (self._counts.unsqueeze(-1) * Phi_points)
        return FeatureSpaceGP(embedding, theta, gram, self.lam)

    def state_dict(self) -> dict:
        return {**super().state_dict(), "dictionary": self.model.embedding.dictionary.clone()}

    def load_state_dict(self, state: dict) -> None:
        state = dict(state)
        self._dictionary = torch.as_tensor(state.pop("dictionary"), dtype=torch.float64)
        super().load_state_dict(state)

    def _rebuild(self) -> None:
        self._check_dictionary(self._points)
        self._model = self._fit(self._dictionary) if self.t else self._prior()


class MoMAGPUCB(UCBLearner):
    r"""Alg. 3, (LDP-)MoMA-GP-UCB: epochs of ``k`` plays of one point; at the end of epoch
    ``n`` a Nystrom embedding of the ``n`` epoch points, ``k`` least-squares estimates (one
    per play index ``j``) and the median-of-means pick ``k*``.

    Plays beyond the last full epoch (``T`` not a multiple of ``k``) keep playing the next
    epoch's point; they do not change the surrogate.

    Args:
        *args, **kwargs: As :class:`UCBLearner`.
        accuracy: The Nystrom accuracy ``epsilon`` of Thm. 4 (in (0, 1)).
        q: The dictionary rate (``None``: ``6 rho ln(4 T / delta) / accuracy^2``).
        k: Plays per epoch (``None``: ``ceil(24 ln(4 e T / delta))``).
    """

    name = "moma"

    def __init__(
        self,
        *args,
        accuracy: float = 0.5,
        q: float | None = None,
        k: int | None = None,
        **kwargs,
    ) -> None:
        P.rho(accuracy)
        if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 1):
            raise ValueError(f"`k` must be a positive integer, got {k!r}.")
        self.accuracy = float(accuracy)
        self.q_override = None if q is None else P._positive("q", q)
        self.k_override = k
        super().__init__(*args, **kwargs)
        if self.k > self.horizon:
            raise ValueError(
                f"MoMA-GP-UCB plays each point k={self.k} times per epoch, more than the "
                f"horizon T={self.horizon}: no epoch would complete. Give a smaller `k` "
                "(`plays_per_epoch`; the paper's ceil(24 ln(4 e T / delta)) needs T > k)."
            )
        self._epoch_point: Tensor | None = None
        self.chosen: list[int] = []  # k* of every epoch

    @property
    def q(self) -> float:
        if self.q_override is not None:
            return self.q_override
        return P.nystrom_rate(self.horizon, self.delta, self.accuracy)

    @property
    def k(self) -> int:
        if self.k_override is not None:
            return self.k_override
        return P.plays_per_epoch(self.horizon, self.delta)

    @property
    def epochs(self) -> int:
        r"""Completed epochs ``n``."""
        return self.t // self.k

    def beta_formula(self) -> float:
        rw = self.rewards
        return P.moma_beta(
            rw.B, self.accuracy, rw.noise_second_moment, self.model.embedding.dim, self.lam
        )

    def propose(self) -> Tensor:
        if self.t % self.k == 0 or self._epoch_point is None:  # a new epoch: a UCB step
            self._epoch_point = super().propose()
        return self._epoch_point.clone()

    def observe(self, x: Tensor, y: float | Tensor) -> None:
        x = torch.as_tensor(x, dtype=torch.float64).reshape(1, -1)
        if self.t % self.k == 0:  # an epoch starts: its first play is its point
            self._epoch_point = x.clone()
        elif self._epoch_point is not None and not torch.equal(x, self._epoch_point):
            raise ValueError(
                f"MoMA-GP-UCB plays one point per epoch: `x`={x.tolist()} is not the epoch's "
                f"point {self._epoch_point.tolist()}."
            )
        super().observe(x, y)

    def _variance(self, X: Tensor) -> Tensor:
        return torch.zeros(len(X), dtype=torch.float64)  # gamma is not used by MoMA

    def _update(self) -> None:
        if self.t % self.k == 0:
            self._model = self._estimate(self.epochs, self.model)

    def _epoch_data(self) -> tuple[Tensor, Tensor]:
        r"""The completed epochs' points (``n x d``) and rewards (``n x k``: column ``j``
        holds the ``j``-th play of every epoch)."""
        n, k = self.epochs, self.k
        return self.X[: n * k : k], self.y[: n * k].reshape(n, k)

    def _estimate(self, n: int, previous: FeatureSpaceGP) -> FeatureSpaceGP:
        points, Y = self._epoch_data()
        variances = previous.mean_and_variance(points)[1]  # sigma~_{n-1}(x_i), Alg. 3 line 7
        index = sample_dictionary(points, variances, self.q, generator=self.generator)
        embedding = NystromEmbedding(self.kernel, points[index])
        Phi = embedding(points)
        theta, chosen = median_of_means_estimate(Phi, Y, self.lam)
        self.chosen.append(int(chosen))
        return FeatureSpaceGP(embedding, theta, Phi.mT @ Phi, self.lam)

    def state_dict(self) -> dict:
        return {
            **super().state_dict(),
            "dictionary": self.model.embedding.dictionary.clone(),
            "epoch_point": None if self._epoch_point is None else self._epoch_point.clone(),
            "chosen": list(self.chosen),
        }

    def load_state_dict(self, state: dict) -> None:
        state = dict(state)
        self._dictionary = torch.as_tensor(state.pop("dictionary"), dtype=torch.float64)
        epoch_point = state.pop("epoch_point")
        self.chosen = [int(c) for c in state.pop("chosen")]
        self._epoch_point = (
            None if epoch_point is None else torch.as_tensor(epoch_point, dtype=torch.float64)
        )
        super().load_state_dict(state)

    def _rebuild(self) -> None:
        if self.epochs == 0:
            self._model = self._prior()
            return
        if len(self.chosen) != self.epochs:
            raise ValueError(
                f"Learner state: `chosen` has {len(self.chosen)} entries for {self.epochs} epochs."
            )
        points, Y = self._epoch_data()
        self._check_dictionary(points)
        embedding = NystromEmbedding(self.kernel, self._dictionary)
        Phi = embedding(points)
        theta = ridge_estimate(Phi, Y[:, self.chosen[-1]], self.lam)  # theta_{n, k*}
        self._model = FeatureSpaceGP(embedding, theta, Phi.mT @ Phi, self.lam)


LEARNERS = {cls.name: cls for cls in (GPUCB, TGPUCB, ATAGPUCB, MoMAGPUCB)}
