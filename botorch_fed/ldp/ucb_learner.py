r"""The GP-UCB learners of [LDP-BO] as step-by-step programs: propose, observe, repeat.

A learner holds what the learning agent of the paper holds -- the points it played and
the (privatised) rewards it received -- and nothing else. Each round it

1. proposes ``x_t``: the maximiser of ``mu_{t-1}(x) + beta_t sigma_{t-1}(x)``, exactly over
   a finite domain (``candidates``) or by ``optimize_acqf`` on the unit cube;
2. observes the reward ``y_t`` a user returns for it, and updates its surrogate.

Its surrogate (:attr:`UCBLearner.model`) is a BoTorch :class:`~botorch_fed.models.FeatureSpaceGP`
(``mu = phi' theta``, ``sigma^2 = k(x,x) - phi' phi + lam phi' V^-1 phi``), so it works with
BoTorch's acquisition functions and ``optimize_acqf`` like any other model.

The learners (subclasses of :class:`UCBLearner`):

- :class:`~botorch_fed.ldp.exact_learners.GPUCB` -- IGP-UCB on the raw rewards (the
  sub-Gaussian baseline): an exact GP, written in the feature space of the Nystrom map
  on *all* distinct played points, which is the exact posterior (eqs. 2-3).
- :class:`~botorch_fed.ldp.exact_learners.TGPUCB` -- Alg. 2, LDP-TGP-UCB: the same exact
  GP on rewards truncated once, at ``b_t = B + R + L ln t`` (private) or
  ``sqrt(v) t^(1/4)`` (non-private heavy tails).
- :class:`~botorch_fed.ldp.ata.ATAGPUCB` -- Alg. 1, LDP-ATA-GP-UCB: a fresh Nystrom
  embedding every round (dictionary sampled with probabilities
  ``min(q sigma~^2_{t-1}, 1)``, Alg. 4) and feature-adaptive truncation of every past
  payoff (TOFU).
- :class:`~botorch_fed.ldp.moma.MoMAGPUCB` -- Alg. 3, MoMA-GP-UCB: epochs of ``k`` plays
  of one point, ``k`` least-squares estimates and the median-of-means pick; the
  embedding is updated once per epoch.

What a learner assumes about the rewards (private or not) is its
:class:`~botorch_fed.ldp.assumptions.RewardModel`.

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

import torch
from botorch.acquisition import UpperConfidenceBound
from gpytorch.kernels import Kernel
from torch import Tensor

from botorch_fed.acquisition import maximize_step_acquisition
from botorch_fed.ldp import parameters as P
from botorch_fed.ldp.assumptions import RewardModel
from botorch_fed.models import FeatureSpaceGP, NystromEmbedding


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
        self._model: FeatureSpaceGP | None = self._prior()  # None: refit when read

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
        assert self._model is not None  # only the exact learners defer their refit
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
        x, value = self._checked_play(x, y)
        self.gamma += self._information_gain(x)
        self._append_play(x, value)
        self._update()

    def _checked_play(self, x: Tensor, y: float | Tensor) -> tuple[Tensor, float]:
        r"""``x`` as a ``d`` float64 point of the domain and ``y`` as a finite float, or
        ``ValueError`` naming what is wrong."""
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
        value = float(y.reshape(()))
        if not math.isfinite(value):
            raise ValueError(f"The reward `y` must be finite, got {value!r}.")
        if self.candidates is not None and self._candidate_index(x) is None:
            raise ValueError(f"`x`={x.tolist()} is not a point of the finite domain.")
        return x, value

    def _append_play(self, x: Tensor, y: float) -> None:
        r"""Book the play (``X``, ``y`` and the distinct points)."""
        self.X = torch.cat([self.X, x.unsqueeze(0)])
        self.y = torch.cat([self.y, torch.tensor([y], dtype=torch.float64)])
        self._record_point(x)

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
        assert self.candidates is not None  # called on a finite domain only
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
