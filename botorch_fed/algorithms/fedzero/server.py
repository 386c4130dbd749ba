r"""FedZero's server: broadcasts ``x_t`` and ``h``, averages the workers' estimates and
takes the projected step ``x_{t+1} = Proj_Theta(x_t - eta mean_j g_j)``; its
recommendation is the averaged iterate (Alg. 1 and Cor. 3.2 of Akhavan, Janz and
El-Mhamdi, paper 004).

An estimate travels in one of three forms (``message``), whose bytes the ledger counts
(the payload below plus its field names):

- ``vector``: ``g_j`` itself (``8 d`` bytes);
- ``seed``: the two values and the seed ``z`` was drawn from (24 bytes; the server
  redraws ``z``) -- the compression the paper notes;
- ``sign``: ``sign(z)`` packed to bits and the scalar ``d / (2h) (y+ - y-)``
  (``ceil(d / 8) + 8`` bytes; l1 estimator only).
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor

from botorch_fed.algorithms.fedzero.client import draw_direction
from botorch_fed.algorithms.fedzero.messages import Round
from botorch_fed.algorithms.fedzero.settings import FedZeroSettings
from botorch_fed.protocol.checkpoint import check_tensor, split_state
from botorch_fed.protocol.declarations import ProtocolViolation
from botorch_fed.protocol.messages import TIME_PREFIX
from botorch_fed.protocol.server import FederatedServer
from botorch_fed.zeroth_order import l1_sign


class FedZeroServer(FederatedServer):
    r"""Broadcasts ``x_t``, averages the workers' estimates, takes the projected step."""

    def __init__(
        self,
        transport,
        settings: FedZeroSettings,
        domain,
        x0: Tensor,
        eta: float,
        h: float,
        bounds,
        domain_for=None,
    ) -> None:
        super().__init__(transport)
        self.settings = settings
        self._domain_for = domain_for  # h -> Theta shrunk by h (resumed runs)
        self.domain = domain
        self.eta, self.h = eta, h
        self.bounds = bounds.to(torch.float64)
        self.x = x0.clone()
        self.total = torch.zeros_like(x0)  # sum of the iterates x_1 .. x_t
        self.iterates: list[list[float]] = []  # x_1 .. x_t (unit cube, for scoring)
        self.failed = 0

    def initialize(self) -> None:
        r"""Nothing to initialise: ``x_1`` is the domain's centre."""

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
            if not estimates:  # every worker failed: no step
                return
            g = torch.stack(estimates).mean(0)
            self.x = self.domain.project(self.x - self.eta * g)

    def _estimate(self, cid: int, t: int, payload: dict) -> Tensor | None:
        payload = {k: v for k, v in payload.items() if not k.startswith(TIME_PREFIX)}
        d, mode = self.x.numel(), self.settings.message
        expected = {
            "vector": {"g"},
            "seed": {"y_plus", "y_minus", "seed"},
            "sign": {"scale", "signs"},
        }
        if set(payload) == {"failed"}:
            self.failed += 1
            return None
        if set(payload) != expected[mode]:
            raise ProtocolViolation(
                f"Round {t}: worker {cid} sent fields {sorted(payload)}; expected "
                f"{sorted(expected[mode])} (message={mode!r})."
            )
        try:
            if mode == "vector":
                g = torch.as_tensor(np.asarray(payload["g"], dtype=np.float64)).reshape(d)
            elif mode == "seed":
                z = draw_direction(self.settings.estimator, d, int(payload["seed"]))
                scale = d / (2 * self.h) * (float(payload["y_plus"]) - float(payload["y_minus"]))
                g = scale * (l1_sign(z) if self.settings.estimator == "l1" else z)
            else:
                raw = np.frombuffer(payload["signs"], dtype=np.uint8)
                bits = np.unpackbits(raw)
                if len(raw) != math.ceil(d / 8) or bits[d:].any():  # exact length, zero pad
                    raise ValueError
                bits = bits[:d]
                signs = torch.as_tensor(bits.astype(np.float64) * 2 - 1)
                g = float(payload["scale"]) * signs
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
        return {
            **super().state_dict(),
            "x": self.x.clone(),
            "total": self.total.clone(),
            "iterates": [list(v) for v in self.iterates],
            "failed": self.failed,
            "eta": self.eta,
            "h": self.h,
        }

    def load_state_dict(self, state: dict) -> None:
        own, rest = split_state("Server", state, ("x", "total", "iterates", "failed", "eta", "h"))
        super().load_state_dict(rest)
        d = self.x.numel()
        self.x = check_tensor("Server", "x", own["x"], (d,)).clone()
        self.total = check_tensor("Server", "total", own["total"], (d,)).clone()
        self.iterates = [list(map(float, v)) for v in own["iterates"]]
        self.failed = int(own["failed"])
        # a resumed run keeps the step sizes it started with (an extended `num_rounds`
        # would change Cor. 3.2's defaults halfway)
        eta, h = float(own["eta"]), float(own["h"])
        if h != self.h:
            self.domain = self._domain_for(h)
        self.eta, self.h = eta, h
