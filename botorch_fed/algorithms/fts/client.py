r"""An FTS client [FTS]. Choices of this implementation: one fixed lengthscale for all
clients (the mode of BoTorch's lengthscale prior: shared features need a shared kernel),
unit signal variance on standardised outcomes, noise variance ``1e-2``, and the argmax of
``phi(x)' omega_j`` over a seeded Sobol candidate set."""

from __future__ import annotations

import math

import numpy as np
import torch
from botorch.utils.sampling import draw_sobol_samples
from torch import Tensor

from botorch_fed.acquisition import MixingSchedule
from botorch_fed.algorithms.fts.messages import Init, Round
from botorch_fed.protocol.bo_client import BOClient
from botorch_fed.protocol.declarations import handles

FTS_NUM_FEATURES = 100
FTS_NOISE = 1e-2


def prior_mode_lengthscale(dim: int) -> float:
    r"""Mode of BoTorch's ``LogNormal(sqrt 2 + log(d)/2, sqrt 3)`` lengthscale prior."""
    return math.exp(math.sqrt(2) + 0.5 * math.log(dim) - 3.0)


class RandomFourierFeatures:
    r"""``phi(x) = sqrt(2/M) cos(W x + b)`` for an RBF kernel (unit variance), ``M``
    features of a ``dim``-dimensional input drawn from ``seed`` (shared by all clients)."""

    def __init__(self, dim: int, num_features: int, lengthscale: float, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        self.W = torch.randn(num_features, dim, generator=g, dtype=torch.float64) / lengthscale
        self.b = 2 * math.pi * torch.rand(num_features, generator=g, dtype=torch.float64)
        self.scale = math.sqrt(2.0 / num_features)

    def __call__(self, X: Tensor) -> Tensor:
        r"""``n x M`` features of ``n x d`` inputs."""
        return self.scale * torch.cos(X @ self.W.T + self.b)


class FTSClient(BOClient):
    r"""An FTS client: local Thompson steps or steps on another client's sample."""

    def __init__(self, *args, features: RandomFourierFeatures, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.features = features
        self.schedule = MixingSchedule(prob_fn=lambda t: 1.0 - 1.0 / t**2)  # p_t

    def _omega_sample(self) -> np.ndarray:
        r"""One draw from the posterior of the feature weights given own data."""
        with self.timed("local_fit"):
            y = self.Y.squeeze(-1)
            if len(y):  # (no data while every evaluation failed: the prior)
                y = (y - y.mean()) / (y.std() if len(y) > 1 and y.std() > 0 else 1.0)
            Phi = self.features(self.X)
            M = Phi.shape[-1]
            precision = Phi.T @ Phi / FTS_NOISE + torch.eye(M, dtype=torch.float64)
            L = torch.linalg.cholesky(precision)
            mean = torch.cholesky_solve((Phi.T @ y / FTS_NOISE).unsqueeze(-1), L).squeeze(-1)
            z = torch.randn(M, generator=self.rng, dtype=torch.float64).unsqueeze(-1)
            sample = mean + torch.linalg.solve_triangular(L.T, z, upper=True).squeeze(-1)
        return sample.numpy()

    @handles(Init)
    def on_init(self, message: Init) -> dict:
        r"""Round 0: the initial design, then a first weight sample."""
        super().on_init(message)
        return {"omega": self._omega_sample()}

    @handles(Round)
    def on_round(self, message: Round) -> dict:
        r"""Round ``t``: one step (``t`` spent first), then a fresh weight sample."""
        t = self.accept_round(message.t, "round")
        local = bool(self.schedule.sample(t, seed=self.rng)) or message.omega is None
        if local:
            x = self.propose_local(t, kind="ts")
        else:
            with self.timed("acquisition"):
                n, seed = self.settings.ts_candidates, self.step_seed(t)
                Xc = draw_sobol_samples(self.bounds, n, 1, seed=seed).squeeze(-2)
                best = (self.features(Xc) @ torch.as_tensor(message.omega)).argmax()
                x = self.avoid_failures(Xc[best].unsqueeze(0))
        self.evaluate(x, t, "local" if local else "federated")
        return {"omega": self._omega_sample()}
