r"""A FedZero worker [FedZero]: evaluates its black box at ``x_t +- h z`` (``z`` on the l1
or l2 sphere; a context of its own shard where the problem has some) and answers
``g_j = d / (2h) (y+ - y-) sign(z)``; at most ``2 num_rounds`` evaluations in all."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor

from botorch_fed.algorithms.fedzero.messages import Round
from botorch_fed.algorithms.fedzero.settings import FedZeroSettings
from botorch_fed.problems.objectives import Objective
from botorch_fed.protocol.checkpoint import (
    CheckpointError,
    check_history,
    check_tensor,
    split_state,
)
from botorch_fed.protocol.client import FederatedClient
from botorch_fed.protocol.declarations import handles
from botorch_fed.protocol.evaluation import evaluate_point
from botorch_fed.protocol.round_budget import RoundBudget
from botorch_fed.zeroth_order import l1_sign, sample_l1_sphere, sample_l2_sphere


def draw_direction(estimator: str, d: int, seed: int) -> Tensor:
    r"""The direction ``z`` drawn from ``seed`` (the server redraws it in ``seed`` mode)."""
    g = torch.Generator().manual_seed(seed)
    sample = sample_l1_sphere if estimator == "l1" else sample_l2_sphere
    return sample(d=d, generator=g, dtype=torch.float64)


class FedZeroClient(RoundBudget, FederatedClient):
    r"""A worker: two evaluations around the broadcast point, one estimate back.

    Args:
        client_id: The id.
        objective: The worker's black box (minimised; a maximised one is negated).
        settings: The settings.
        seed: The worker's own seed (its directions and contexts).
        evaluation_errors: ``"record"`` or ``"raise"``.
        shard: The context indices this worker samples from (problems with contexts).
    """

    def __init__(
        self,
        client_id: int,
        objective: Objective,
        settings: FedZeroSettings,
        seed: int,
        evaluation_errors: str = "record",
        shard: Tensor | None = None,
    ) -> None:
        super().__init__(client_id)
        self.objective, self.settings, self.dim = objective, settings, objective.dim
        self.rng = torch.Generator().manual_seed(int(seed))
        self.evaluation_errors, self.shard = evaluation_errors, shard
        self.history: list[dict] = []  # harness-only record, never sent

    def _values(self, P: Tensor, t: int) -> Tensor | None:
        r"""The black box at the 2 points ``P`` (domain coordinates), minimised."""
        function: Any = getattr(self.objective, "function", None)
        lower, upper = self.objective.bounds
        X = ((P - lower) / (upper - lower)).clamp(0.0, 1.0)  # clamped: rounding at the bounds
        record = self.settings.record_points
        if self.shard is not None and hasattr(function, "evaluate_contexts"):
            index = self.shard[int(torch.randint(len(self.shard), (1,), generator=self.rng))]
            with torch.no_grad():
                values = function.evaluate_contexts(P, index.expand(len(P)))
                reported = self.objective.value(X)  # type: ignore[attr-defined]  # f itself
            for i, step in enumerate(("plus", "minus")):
                x = P[i].tolist() if record else None
                self.history.append({"round": t, "step": step, "x": x, "value": float(reported[i])})
            return values
        out = []
        for i in range(len(P)):  # a failure is per point
            entry: dict[str, Any] = {"round": t, "step": "plus" if i == 0 else "minus", "x": None}
            entry, observed = evaluate_point(
                self.objective, X[i : i + 1], entry, self.evaluation_errors, self.client_id
            )
            if record:
                entry["x"] = P[i].tolist()
            self.history.append(entry)
            if observed is None:
                return None
            out.append(observed.reshape(()))
        values = torch.stack(out)
        return values if self.objective.minimize else -values

    @handles(Round)
    def on_round(self, message: Round) -> dict:
        r"""This worker's estimate at ``x`` (or ``{"failed": 1}``); ``t`` is spent first."""
        t = self.accept_round(message.t, "round")
        x, h = torch.as_tensor(message.x), message.h
        seed = int(torch.randint(2**62, (1,), generator=self.rng))
        z = draw_direction(self.settings.estimator, self.dim, seed)
        P = torch.stack([x + h * z, x - h * z])
        values = self._values(P, t)
        if values is None:
            return {"failed": 1}
        y_plus, y_minus = float(values[0]), float(values[1])
        scale = self.dim / (2 * h) * (y_plus - y_minus)
        mode = self.settings.message
        if mode == "seed":
            return {"y_plus": y_plus, "y_minus": y_minus, "seed": seed}
        if mode == "sign":
            bits = np.packbits((l1_sign(z) > 0).numpy().astype(np.uint8))
            return {"scale": scale, "signs": bits.tobytes()}
        direction = l1_sign(z) if self.settings.estimator == "l1" else z
        return {"g": (scale * direction).numpy()}

    def state_dict(self) -> dict:
        history, objective = [dict(h) for h in self.history], self.objective.state_dict()
        own = {"history": history, "rng": self.rng.get_state(), "objective": objective}
        return {**super().state_dict(), **own}

    def load_state_dict(self, state: dict) -> None:
        owner = f"Client {self.client_id}"
        own, rest = split_state(owner, state, ("history", "rng", "objective"))
        super().load_state_dict(rest)
        self.history = check_history(owner, own["history"])
        self.rng.set_state(check_tensor(owner, "rng", own["rng"], (None,), torch.uint8))
        try:
            self.objective.load_state_dict(own["objective"])
        except ValueError as exc:
            raise CheckpointError(f"{owner}: {exc}") from exc
