r"""FedZero's server [FedZero]: broadcasts ``x_t`` and ``h``, averages the estimates and
steps ``x_{t+1} = Proj_Theta(x_t - eta mean_j g_j)``; recommends the averaged iterate.
An estimate travels as ``g_j`` (``vector``), two values and the seed of ``z`` (``seed``)
or ``sign(z)`` as bits and ``d / (2h) (y+ - y-)`` (``sign``)."""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor

from botorch_fed.algorithms.fedzero.client import draw_direction
from botorch_fed.algorithms.fedzero.messages import Round
from botorch_fed.algorithms.fedzero.settings import FedZeroSettings, make_domain, step_parameters
from botorch_fed.problems.objectives import Objective
from botorch_fed.protocol.checkpoint import check_tensor, split_state
from botorch_fed.protocol.declarations import ProtocolViolation
from botorch_fed.protocol.messages import TIME_PREFIX
from botorch_fed.protocol.server import FederatedServer
from botorch_fed.zeroth_order import l1_sign

_FIELDS = {"vector": {"g"}, "seed": {"y_plus", "y_minus", "seed"}, "sign": {"scale", "signs"}}


class FedZeroServer(FederatedServer):
    r"""Broadcasts ``x_t``, averages the workers' estimates, takes the projected step.

    Args:
        transport: The transport.
        settings: The settings.
        objective: The (public) domain: its bounds, dimension and declared constants.
        num_workers: ``m``.
    """

    def __init__(
        self, transport, settings: FedZeroSettings, objective: Objective, num_workers: int
    ) -> None:
        super().__init__(transport)
        self.settings, self.objective = settings, objective
        self.eta, self.h = step_parameters(settings, objective, num_workers)
        self.domain = make_domain(settings, objective, self.h)
        self.bounds = objective.bounds.to(torch.float64)
        lower, upper = self.bounds
        self.x = self.domain.project(((lower + upper) / 2).unsqueeze(0)).squeeze(0)  # x_1
        self.total = torch.zeros_like(self.x)  # sum of the iterates x_1 .. x_t
        self.iterates: list[list[float]] = []  # x_1 .. x_t (unit cube, for scoring)
        self.failed = 0

    def initialize(self) -> None:
        r"""Nothing: ``x_1`` is the domain's centre."""

    def run_round(self, t: int) -> None:
        r"""Round ``t``: broadcast ``x_t``, average the estimates, step and project."""
        self.total += self.x
        lower, upper = self.bounds
        self.iterates.append(((self.x - lower) / (upper - lower)).tolist())
        replies = self.broadcast(Round(t=t, x=self.x.numpy(), h=self.h))
        with self.ledger.timer("aggregate"):
            estimates = [
                g
                for cid in sorted(replies)
                if (g := self._estimate(cid, t, replies[cid].payload)) is not None
            ]
            if estimates:  # (every worker failed: no step)
                self.x = self.domain.project(self.x - self.eta * torch.stack(estimates).mean(0))

    def _estimate(self, cid: int, t: int, payload: dict) -> Tensor | None:
        r"""Worker ``cid``'s reply decoded to ``g_j`` (``None``: its evaluation failed)."""
        payload = {k: v for k, v in payload.items() if not k.startswith(TIME_PREFIX)}
        d, mode, estimator = self.x.numel(), self.settings.message, self.settings.estimator
        if set(payload) == {"failed"}:
            self.failed += 1
            return None
        if set(payload) != _FIELDS[mode]:
            raise ProtocolViolation(
                f"Round {t}: worker {cid} sent fields {sorted(payload)}; expected "
                f"{sorted(_FIELDS[mode])} (message={mode!r})."
            )
        try:
            if mode == "vector":
                g = torch.as_tensor(np.asarray(payload["g"], dtype=np.float64)).reshape(d)
            elif mode == "seed":
                z = draw_direction(estimator, d, int(payload["seed"]))
                scale = d / (2 * self.h) * (float(payload["y_plus"]) - float(payload["y_minus"]))
                g = scale * (l1_sign(z) if estimator == "l1" else z)
            else:
                bits = np.unpackbits(raw := np.frombuffer(payload["signs"], dtype=np.uint8))
                if len(raw) != math.ceil(d / 8) or bits[d:].any():  # exact length, zero pad
                    raise ValueError
                g = float(payload["scale"]) * torch.as_tensor(bits[:d].astype(np.float64) * 2 - 1)
        except (TypeError, ValueError, RuntimeError, OverflowError):
            raise ProtocolViolation(
                f"Round {t}: worker {cid}'s estimate does not decode."
            ) from None
        if not torch.isfinite(g).all():
            raise ProtocolViolation(f"Round {t}: worker {cid}'s estimate is not finite.")
        return g

    @property
    def recommendation(self) -> dict | None:
        r"""The averaged iterate ``(1/n) sum_t x_t`` (the quantity Cor. 3.2 bounds)."""
        if not self.iterates:
            return None
        mean = self.total / len(self.iterates)
        lower, upper = self.bounds
        return {
            "kind": "averaged iterate",
            "round": len(self.iterates),
            "client": 0,
            "x": mean.tolist(),
            "x_unit": ((mean - lower) / (upper - lower)).clamp(0, 1).tolist(),
            "predicted_value": None,
            "eta": self.eta,
            "h": self.h,
        }

    def state_dict(self) -> dict:
        iterates = [list(v) for v in self.iterates]
        own = {"x": self.x.clone(), "total": self.total.clone(), "iterates": iterates}
        return {**super().state_dict(), **own, "failed": self.failed, "eta": self.eta, "h": self.h}

    def load_state_dict(self, state: dict) -> None:
        own, rest = split_state("Server", state, ("x", "total", "iterates", "failed", "eta", "h"))
        super().load_state_dict(rest)
        d = self.x.numel()
        self.x = check_tensor("Server", "x", own["x"], (d,)).clone()
        self.total = check_tensor("Server", "total", own["total"], (d,)).clone()
        self.iterates = [list(map(float, v)) for v in own["iterates"]]
        self.failed = int(own["failed"])
        # a resumed run keeps its step sizes (a longer `num_rounds` changes Cor. 3.2's)
        eta, h = float(own["eta"]), float(own["h"])
        if h != self.h:
            self.domain = make_domain(self.settings, self.objective, h)
        self.eta, self.h = eta, h
