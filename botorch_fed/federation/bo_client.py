r"""What every Bayesian-optimisation client of a federation has in common.

A :class:`BOClient` holds its private data in the unit cube, evaluates its own black
box, keeps a local ``SingleTaskGP`` and maximises an acquisition function (UCB, EI
or Thompson sampling) on any model it is given. ``history`` is a harness-side record
of what it evaluated (for result tables); it is never sent to the server.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from botorch.acquisition import LogExpectedImprovement, UpperConfidenceBound
from botorch.fit import fit_gpytorch_mll
from botorch.models import SingleTaskGP
from botorch.optim import optimize_acqf
from botorch.utils.sampling import draw_sobol_samples, manual_seed
from gpytorch.mlls import ExactMarginalLogLikelihood
from torch import Tensor

from botorch_fed.acquisition import thompson_sample_candidate
from botorch_fed.federation.problem import ClientObjective, initial_design
from botorch_fed.federation.roles import FederatedClient

ACQUISITIONS = ("ucb", "ei", "ts")


@dataclass
class BOSettings:
    r"""Settings shared by the BO clients of every algorithm.

    Attributes:
        num_init: Initial design size per client.
        num_rounds: Number of rounds ``T``.
        acquisition: ``"ucb"`` (GP-UCB), ``"ei"`` (log-EI) or ``"ts"`` (Thompson).
        beta: UCB ``beta``; ``None`` uses ``beta_t = 0.2 d log(2t)``.
        local_refit_every: Refit the local GP's hyperparameters on every ``K``-th
            model update (in between, the last fitted values are reused).
        fit_maxiter: L-BFGS-B iterations of a local refit (warm-started from the
            previous fit).
        num_restarts: ``optimize_acqf`` restarts.
        raw_samples: ``optimize_acqf`` raw samples.
        maxiter: ``optimize_acqf`` L-BFGS-B iterations.
        ts_candidates: Candidate-set size of discrete Thompson sampling.
    """

    num_init: int = 4
    num_rounds: int = 50
    acquisition: str = "ucb"
    beta: float | None = None
    local_refit_every: int = 5
    fit_maxiter: int = 50
    num_restarts: int = 2
    raw_samples: int = 64
    maxiter: int = 50
    ts_candidates: int = 512

    def validate(self) -> None:
        r"""Raise ``ValueError`` naming the first invalid setting."""
        for name in (
            "num_init",
            "num_rounds",
            "local_refit_every",
            "fit_maxiter",
            "num_restarts",
            "raw_samples",
            "maxiter",
            "ts_candidates",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"`{name}` must be a positive integer, got {value!r}.")
        if self.acquisition not in ACQUISITIONS:
            raise ValueError(f"`acquisition`={self.acquisition!r} must be one of {ACQUISITIONS}.")
        if self.beta is not None and not (self.beta >= 0 and math.isfinite(self.beta)):
            raise ValueError(f"`beta` must be a non-negative number, got {self.beta!r}.")

    def beta_at(self, t: int, dim: int) -> float:
        r"""The UCB ``beta`` of round ``t`` (``0.2 d log(2t)`` unless fixed)."""
        return self.beta if self.beta is not None else 0.2 * dim * math.log(2 * max(t, 1))


MIN_DISTANCE = 0.05  # in the unit cube: closer points count as one


def _ranked_distinct(groups: list[tuple[Tensor, Tensor]]) -> Tensor:
    r"""Points of the groups in order (each group by decreasing value), dropping any
    within :data:`MIN_DISTANCE` of a point already kept."""
    kept: list[Tensor] = []
    for X, values in groups:
        for i in values.argsort(descending=True).tolist():
            if all((X[i] - k).norm() > MIN_DISTANCE for k in kept):
                kept.append(X[i])
    return torch.stack(kept)


class BOClient(FederatedClient):
    r"""A client that evaluates its black box and runs BO steps on given models.

    Args:
        client_id: The id.
        objective: The client's black box (unit-cube inputs).
        settings: The BO settings.
        seed: The client's seed (initial design, draws, acquisition restarts).
        secagg: The client's secure-aggregation role (or ``None``).
        init_region: Optional ``2 x d`` sub-box of the unit cube for the initial design.
    """

    def __init__(
        self,
        client_id: int,
        objective: ClientObjective,
        settings: BOSettings,
        seed: int,
        secagg=None,
        init_region: Tensor | None = None,
    ) -> None:
        super().__init__(client_id, secagg)
        settings.validate()
        self.objective = objective
        self.settings = settings
        self.dim = objective.dim
        self.seed = int(seed)
        self.init_region = init_region
        self.rng = torch.Generator().manual_seed(self.seed)
        self.bounds = torch.stack([torch.zeros(self.dim), torch.ones(self.dim)]).double()
        self.X = torch.empty(0, self.dim, dtype=torch.float64)
        self.Y = torch.empty(0, 1, dtype=torch.float64)
        self.history: list[dict] = []  # harness-only record, never sent
        self._local_model: SingleTaskGP | None = None
        self._local_state: dict | None = None
        self._local_updates = 0

    def evaluate(self, x: Tensor, t: int, step: str) -> None:
        r"""Evaluate ``x`` (``1 x d``), add it to the private data, record it."""
        with self.timed("evaluation"):
            y = self.objective.observe(x)
            value = float(self.objective.value(x).item())
        self.X = torch.cat([self.X, x])
        self.Y = torch.cat([self.Y, y])
        self._local_model = None
        self.history.append({"round": t, "step": step, "value": value})

    def local_model(self) -> SingleTaskGP:
        r"""The client's own GP on its data (BoTorch defaults, outcome standardised)."""
        if self._local_model is not None:
            return self._local_model
        with self.timed("local_fit"):
            model = SingleTaskGP(self.X, self.Y)
            refit = (
                self._local_state is None
                or self._local_updates % self.settings.local_refit_every == 0
            )
            if refit:
                if self._local_state is not None:  # warm start from the last fit
                    model.load_state_dict(self._local_state, strict=False)
                fit_gpytorch_mll(
                    ExactMarginalLogLikelihood(model.likelihood, model),
                    optimizer_kwargs={"options": {"maxiter": self.settings.fit_maxiter}},
                )
                self._local_state = {
                    k: v for k, v in model.state_dict().items() if "outcome_transform" not in k
                }
            else:
                model.load_state_dict(self._local_state, strict=False)
            self._local_updates += 1
            model.eval()
        self._local_model = model
        return model

    def step_seed(self, t: int) -> int:
        r"""A seed for round ``t``'s acquisition optimisation on this client."""
        return (self.seed * 1_000_003 + t) % (2**31)

    def make_acquisition(self, model, t: int, best_f: Tensor | float | None = None):
        r"""The configured analytic acquisition (UCB or log-EI) of round ``t``.

        Args:
            model: The GP to acquire on.
            t: The round (UCB's ``beta_t``).
            best_f: EI's incumbent (``None``: the best value of the local data).
        """
        s = self.settings
        if s.acquisition == "ucb":
            # BoTorch's class as is (it stores a float beta in the default dtype): the
            # stored CEC-2005 benchmark runs were made with exactly this acquisition
            return UpperConfidenceBound(model, beta=s.beta_at(t, self.dim))
        return LogExpectedImprovement(model, best_f=self.Y.max() if best_f is None else best_f)

    def acquire(self, model, t: int, acqf=None, rank: int = 0, count: int = 1, seed=None) -> Tensor:
        r"""Maximise the configured acquisition (or ``acqf``) on ``model``.

        With ``count > 1`` (``count`` clients maximise the same acquisition on the same
        model in this round, and this one has ``rank``), all of them run the same
        seeded search -- a multi-start optimisation plus its raw Sobol samples -- and
        rank the results: the optimised points by value, then the raw samples by
        value, skipping any point within :data:`MIN_DISTANCE` of one already ranked.
        This client takes the ``rank``-th, so simultaneous steps do not evaluate one
        point ``count`` times. Searches run under a fixed seed (the global RNG state
        is restored afterwards).

        Returns:
            The ``1 x d`` candidate in the unit cube.
        """
        s = self.settings
        seed = self.step_seed(t) if seed is None else int(seed)
        with self.timed("acquisition"):
            if acqf is None and s.acquisition == "ts":
                return thompson_sample_candidate(
                    model, self.bounds, num_candidates=s.ts_candidates, seed=seed
                ).reshape(1, self.dim)
            acqf = self.make_acquisition(model, t) if acqf is None else acqf
            restarts = max(s.num_restarts, 2 * count) if count > 1 else s.num_restarts
            raw = max(s.raw_samples, 4 * restarts)
            with manual_seed(seed):
                X, values = optimize_acqf(
                    acqf,
                    self.bounds,
                    q=1,
                    num_restarts=restarts,
                    raw_samples=raw,
                    return_best_only=count == 1,
                    options={"maxiter": s.maxiter, "seed": seed},
                )
            if count > 1:
                X_raw = draw_sobol_samples(self.bounds, n=raw, q=1, seed=seed)
                with torch.no_grad():
                    v_raw = acqf(X_raw)
                ranked = _ranked_distinct(
                    [(X.reshape(-1, self.dim), values.reshape(-1)), (X_raw.squeeze(-2), v_raw)]
                )
                X = ranked[min(rank, len(ranked) - 1)]
        return X.detach().reshape(1, self.dim).clamp(0.0, 1.0)

    def on_init(self, payload: dict) -> dict:
        X0 = initial_design(self.settings.num_init, self.dim, self.seed, self.init_region)
        for x in X0:
            self.evaluate(x.unsqueeze(0), 0, "init")
        return {}
