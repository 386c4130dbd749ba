r"""Central BO's server: one GP on everybody's data, one batch point per client."""

from __future__ import annotations

import torch
from botorch.acquisition import AcquisitionFunction, qLogExpectedImprovement, qUpperConfidenceBound

from botorch_fed.acquisition import maximize_step_acquisition, pathwise_thompson_sampling
from botorch_fed.acquisition.step_acquisition import knowledge_gradient
from botorch_fed.algorithms.central.messages import Evaluate, Upload
from botorch_fed.models import ExactGPRefitter, check_exact_gp_state
from botorch_fed.protocol.bo_client import BOSettings
from botorch_fed.protocol.checkpoint import CheckpointError, check_tensor, split_state
from botorch_fed.protocol.round_budget import round_seed
from botorch_fed.protocol.server import FederatedServer


class CentralServer(FederatedServer):
    r"""Fits a GP on everybody's data and hands out one batch point per client."""

    def __init__(self, transport, settings: BOSettings, dim: int, seed: int) -> None:
        super().__init__(transport)
        self.settings, self.dim, self.seed = settings, dim, int(seed)
        self.X = torch.empty(0, dim, dtype=torch.float64)
        self.Y = torch.empty(0, 1, dtype=torch.float64)
        # one model update per round: round t refits iff (t - 1) % local_refit_every == 0
        self._fitter = ExactGPRefitter(
            refit_every=settings.local_refit_every, warm_start=False, seed=self.seed
        )

    def state_dict(self) -> dict:
        own = {"X": self.X.clone(), "Y": self.Y.clone(), "fitter": self._fitter.state_dict()}
        return {**super().state_dict(), **own}

    def load_state_dict(self, state: dict) -> None:
        own, rest = split_state("Server", state, ("X", "Y", "fitter"))
        super().load_state_dict(rest)
        X = check_tensor("Server", "X", own["X"], (None, self.dim))
        Y = check_tensor("Server", "Y", own["Y"], (len(X), 1))
        try:
            fitter = own["fitter"]
            if isinstance(fitter, dict) and fitter.get("state") is not None:
                check_exact_gp_state(fitter["state"], self.dim, "fitter.state")
            self._fitter.load_state_dict(fitter)
        except ValueError as exc:
            raise CheckpointError(f"Server: {exc}") from exc
        self.X, self.Y = X.clone(), Y.clone()

    def _collect(self) -> None:
        replies = self.broadcast(Upload())
        with self.ledger.timer("upload"):
            for cid in sorted(replies):
                p = replies[cid].payload
                self.X = torch.cat([self.X, torch.as_tensor(p["X"], dtype=torch.float64)])
                self.Y = torch.cat([self.Y, torch.as_tensor(p["Y"], dtype=torch.float64)])

    def _batch(self, t: int, q: int) -> torch.Tensor:
        s, seed = self.settings, round_seed(self.seed, t)
        if len(self.X) == 0:  # every evaluation failed so far: a seeded random batch
            g = torch.Generator().manual_seed(seed)
            return torch.rand(q, self.dim, generator=g, dtype=torch.float64)
        with self.ledger.timer("local_fit"):
            model = self._fitter(self.X, self.Y)
        bounds = torch.stack([torch.zeros(self.dim), torch.ones(self.dim)]).double()
        with self.ledger.timer("acquisition"):
            acqf: AcquisitionFunction
            if s.acquisition == "ts":  # q independent paths, their sum maximised jointly
                acqf = pathwise_thompson_sampling(model, seed=seed, batch_size=q)
            elif s.acquisition == "kg":  # one-shot q-KG over the whole batch
                acqf = knowledge_gradient(model, num_fantasies=s.num_fantasies, seed=seed)
            elif s.acquisition == "ucb":
                acqf = qUpperConfidenceBound(model, beta=s.beta_at(t, self.dim))
            else:
                acqf = qLogExpectedImprovement(model, best_f=self.Y.max())
            options = {k: getattr(s, k) for k in ("num_restarts", "raw_samples", "maxiter")}
            options.update(seed=seed, q=q, sequential=s.acquisition not in ("ts", "kg"))
            X = maximize_step_acquisition(acqf, bounds, **options)
        return X.clamp(0.0, 1.0)

    def run_round(self, t: int) -> None:
        r"""Round ``t``: collect the new data, fit, hand out one batch point per client."""
        self._collect()
        X = self._batch(t, len(self.client_ids))
        self.send({cid: Evaluate(x=X[i].numpy(), t=t) for i, cid in enumerate(self.client_ids)})
