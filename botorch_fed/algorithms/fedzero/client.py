r"""A FedZero worker: two evaluations around the broadcast point, one gradient estimate
back (Alg. 1 of Akhavan, Janz and El-Mhamdi, paper 004).

Worker ``j`` draws ``z`` uniformly on the l1 sphere (``estimator="l2"``: the l2
sphere), evaluates its black box at ``x_t + h z`` and ``x_t - h z`` (with its own context
``c_{j,t}`` where the problem has contexts, e.g. a data row of its own shard for
``l1-regression``) and answers with ``g_j = d / (2h) (y+ - y-) sign(z)`` in the
settings' message form. It answers the rounds ``1 .. num_rounds`` of its own settings,
each once and in turn: at most ``2 num_rounds`` evaluations, whatever the server sends.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor

from botorch_fed.algorithms.fedzero.messages import Round
from botorch_fed.algorithms.fedzero.settings import FedZeroSettings, builtin_function
from botorch_fed.protocol.checkpoint import CheckpointError, check_tensor, split_state
from botorch_fed.protocol.client import FederatedClient
from botorch_fed.protocol.declarations import handles
from botorch_fed.protocol.evaluation import evaluate_point
from botorch_fed.protocol.objectives import Objective
from botorch_fed.protocol.round_budget import RoundBudget
from botorch_fed.zeroth_order import l1_sign, sample_l1_sphere, sample_l2_sphere


def draw_direction(estimator: str, d: int, seed: int) -> Tensor:
    r"""The direction ``z`` drawn from ``seed`` (what the server redraws in ``seed`` mode)."""
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
        self.objective = objective
        self.settings = settings
        self.dim = objective.dim
        self.rng = torch.Generator().manual_seed(int(seed))
        self.evaluation_errors = evaluation_errors
        self.shard = shard
        self.history: list[dict] = []  # harness-only record, never sent

    def _values(self, P: Tensor, t: int) -> Tensor | None:
        r"""The black box at the 2 points ``P`` (domain coordinates), minimisation."""
        function = builtin_function(self.objective)
        if self.shard is not None and hasattr(function, "evaluate_contexts"):
            index = self.shard[int(torch.randint(len(self.shard), (1,), generator=self.rng))]
            with torch.no_grad():
                values = function.evaluate_contexts(P, index.expand(len(P)))
                # f itself, for tables (an objective with a built-in function: a
                # ClientObjective, which has `value`)
                reported = self.objective.value(self._unit(P))  # type: ignore[attr-defined]
            self._record(P, reported, t)
            return values
        X = self._unit(P)
        out = []
        for i in range(len(P)):  # a failure is per point
            entry: dict[str, Any] = {"round": t, "step": "plus" if i == 0 else "minus", "x": None}
            entry, observed = evaluate_point(
                self.objective, X[i : i + 1], entry, self.evaluation_errors, self.client_id
            )
            if self.settings.record_points:
                entry["x"] = P[i].tolist()
            self.history.append(entry)
            if observed is None:
                return None
            out.append(observed.reshape(()))
        values = torch.stack(out)
        return values if self.objective.minimize else -values

    def _unit(self, P: Tensor) -> Tensor:
        r"""Domain points as unit-cube points (clamped: rounding at the bounds)."""
        lower, upper = self.objective.bounds
        return ((P - lower) / (upper - lower)).clamp(0.0, 1.0)

    def _record(self, P: Tensor, values: Tensor, t: int) -> None:
        for i, kind in enumerate(("plus", "minus")):
            x = P[i].tolist() if self.settings.record_points else None
            self.history.append({"round": t, "step": kind, "x": x, "value": float(values[i])})

    @handles(Round)
    def on_round(self, message: Round) -> dict:
        r"""Answer round ``t`` with this worker's estimate at ``x`` (in the settings'
        message form), or ``{"failed": 1}``; ``t`` is checked and spent first."""
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
        r"""History, generator, the objective's state and the last round accepted."""
        return {
            **super().state_dict(),
            **self.round_state(),
            "history": [dict(h) for h in self.history],
            "rng": self.rng.get_state(),
            "objective": self.objective.state_dict(),
        }

    def load_state_dict(self, state: dict) -> None:
        r"""Restore :meth:`state_dict`."""
        owner = f"Client {self.client_id}"
        state = self.load_round_state(owner, state)
        own, rest = split_state(owner, state, ("history", "rng", "objective"))
        super().load_state_dict(rest)
        if not isinstance(own["history"], list) or not all(
            isinstance(h, dict) for h in own["history"]
        ):
            raise CheckpointError(f"{owner}: `history` must be a list of dicts.")
        self.history = [dict(h) for h in own["history"]]
        self.rng.set_state(check_tensor(owner, "rng", own["rng"], (None,), torch.uint8))
        try:
            self.objective.load_state_dict(own["objective"])
        except ValueError as exc:
            raise CheckpointError(f"{owner}: {exc}") from exc
