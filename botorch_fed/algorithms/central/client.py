r"""A central-BO client: uploads its raw data and evaluates the points the server
assigns (rounds ``1 .. num_rounds``, once each, in order)."""

from __future__ import annotations

import torch

from botorch_fed.algorithms.central.messages import Evaluate, Upload
from botorch_fed.protocol.bo_client import BOClient
from botorch_fed.protocol.checkpoint import split_state
from botorch_fed.protocol.declarations import handles


class CentralClient(BOClient):
    r"""Uploads its raw data and evaluates the points the server assigns."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._uploaded = 0

    def state_dict(self) -> dict:
        return {**super().state_dict(), "uploaded": self._uploaded}

    def load_state_dict(self, state: dict) -> None:
        own, rest = split_state(f"Client {self.client_id}", state, ("uploaded",))
        super().load_state_dict(rest)
        self._uploaded = int(own["uploaded"])

    @handles(Upload)
    def on_upload(self, message: Upload) -> dict:
        r"""The observations made since the last upload."""
        new = slice(self._uploaded, len(self.X))
        self._uploaded = len(self.X)
        return {"X": self.X[new].numpy(), "Y": self.Y[new].numpy()}

    @handles(Evaluate)
    def on_evaluate(self, message: Evaluate) -> dict:
        r"""Round ``t``: evaluate the assigned point (``t`` checked and spent first)."""
        t = self.accept_round(message.t, "evaluate")
        x = torch.as_tensor(message.x).reshape(1, self.dim)
        # the server's GP never learns of a failed point: do not evaluate it again
        self.evaluate(self.avoid_failures(x), t, "central")
        return {}
