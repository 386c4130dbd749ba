r"""Centralised BO on pooled data: the non-private oracle baseline.

Clients upload their raw observations to the server (this baseline is *not*
private, by design); the server fits one ``SingleTaskGP`` on the pooled data and
assigns each client one point of a jointly optimised batch (sequential greedy
``q``-UCB / ``q``-log-EI, or batch Thompson sampling), which the client evaluates.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from botorch.acquisition import qLogExpectedImprovement, qUpperConfidenceBound
from botorch.fit import fit_gpytorch_mll
from botorch.generation.sampling import MaxPosteriorSampling
from botorch.models import SingleTaskGP
from botorch.optim import optimize_acqf
from botorch.utils.sampling import draw_sobol_samples, manual_seed
from gpytorch.mlls import ExactMarginalLogLikelihood

from botorch_fed.federation.bo_client import BOClient, BOSettings
from botorch_fed.federation.messages import Message
from botorch_fed.federation.roles import FederatedServer


class CentralClient(BOClient):
    r"""Uploads its raw data and evaluates the points the server assigns."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._uploaded = 0

    def on_upload(self, payload: dict) -> dict:
        new = slice(self._uploaded, len(self.X))
        self._uploaded = len(self.X)
        return {"X": self.X[new].numpy(), "Y": self.Y[new].numpy()}

    def on_evaluate(self, payload: dict) -> dict:
        x = torch.as_tensor(np.asarray(payload["x"]), dtype=torch.float64).reshape(1, self.dim)
        self.evaluate(x, int(payload["t"]), "central")
        return {}


class CentralServer(FederatedServer):
    r"""Fits a GP on everybody's data and hands out one batch point per client."""

    def __init__(self, transport, settings: BOSettings, dim: int, seed: int) -> None:
        super().__init__(transport)
        self.settings = settings
        self.dim = dim
        self.seed = int(seed)
        self.X = torch.empty(0, dim, dtype=torch.float64)
        self.Y = torch.empty(0, 1, dtype=torch.float64)
        self._state: dict | None = None

    def _collect(self) -> None:
        replies = self.broadcast("upload")
        with self.ledger.timer("upload"):
            for cid in sorted(replies):
                p = replies[cid].payload
                self.X = torch.cat([self.X, torch.as_tensor(p["X"], dtype=torch.float64)])
                self.Y = torch.cat([self.Y, torch.as_tensor(p["Y"], dtype=torch.float64)])

    def _batch(self, t: int, q: int) -> torch.Tensor:
        s = self.settings
        with self.ledger.timer("local_fit"):
            model = SingleTaskGP(self.X, self.Y)
            if self._state is None or (t - 1) % s.local_refit_every == 0:
                fit_gpytorch_mll(ExactMarginalLogLikelihood(model.likelihood, model))
                self._state = {
                    k: v for k, v in model.state_dict().items() if "outcome_transform" not in k
                }
            else:
                model.load_state_dict(self._state, strict=False)
            model.eval()
        bounds = torch.stack([torch.zeros(self.dim), torch.ones(self.dim)]).double()
        seed = self.seed * 1_000_003 + t
        with self.ledger.timer("acquisition"):
            if s.acquisition == "ts":
                Xc = draw_sobol_samples(bounds, s.ts_candidates, 1, seed=seed).squeeze(-2)
                with torch.no_grad(), manual_seed(seed + 1):
                    return MaxPosteriorSampling(model, replacement=False)(Xc, num_samples=q)
            if s.acquisition == "ucb":
                acqf = qUpperConfidenceBound(model, beta=s.beta_at(t, self.dim))
            else:
                acqf = qLogExpectedImprovement(model, best_f=self.Y.max())
            X, _ = optimize_acqf(
                acqf,
                bounds,
                q=q,
                num_restarts=s.num_restarts,
                raw_samples=s.raw_samples,
                sequential=True,
                options={"maxiter": s.maxiter, "seed": seed},
            )
        return X.detach().clamp(0.0, 1.0)

    def run(self, on_round: Callable[[int], None] | None = None) -> None:
        r"""Run initialisation and all rounds (``on_round(t)`` after each)."""
        self.ledger.round = 0
        self.broadcast("init")
        if on_round is not None:
            on_round(0)
        ids = self.client_ids
        for t in range(1, self.settings.num_rounds + 1):
            self.ledger.round = t
            self._collect()
            X = self._batch(t, len(ids))
            self.send(
                {cid: Message("evaluate", {"x": X[i].numpy(), "t": t}) for i, cid in enumerate(ids)}
            )
            if on_round is not None:
                on_round(t)
