r"""FTS's server: relays each client a random other client's last weight sample."""

from __future__ import annotations

import numpy as np
import torch

from botorch_fed.algorithms.fts.client import FTS_NUM_FEATURES
from botorch_fed.algorithms.fts.messages import Init, Round
from botorch_fed.protocol.bo_client import BOSettings
from botorch_fed.protocol.checkpoint import CheckpointError, check_tensor, split_state
from botorch_fed.protocol.server import FederatedServer


class FTSServer(FederatedServer):
    r"""Relays each client a random other client's weight sample every round."""

    def __init__(self, transport, settings: BOSettings, seed: int) -> None:
        super().__init__(transport)
        self.settings = settings
        self.rng = np.random.default_rng(seed)
        self.omegas: dict[int, np.ndarray] = {}  # each client's last weight sample

    def state_dict(self) -> dict:
        omegas = {int(c): torch.from_numpy(np.array(o)) for c, o in self.omegas.items()}
        return {**super().state_dict(), "rng": self.rng.bit_generator.state, "omegas": omegas}

    def load_state_dict(self, state: dict) -> None:
        own, rest = split_state("Server", state, ("rng", "omegas"))
        super().load_state_dict(rest)
        if not isinstance(own["omegas"], dict):
            raise CheckpointError("Server: `omegas` must be a dict of tensors.")
        omegas = {
            int(c): check_tensor("Server", f"omegas[{c}]", o, (FTS_NUM_FEATURES,)).numpy().copy()
            for c, o in own["omegas"].items()
        }
        try:
            self.rng.bit_generator.state = own["rng"]
        except (TypeError, ValueError, KeyError) as exc:
            raise CheckpointError(f"Server: `rng` is not a generator state ({exc}).") from exc
        self.omegas = omegas

    def initialize(self) -> None:
        r"""Initial designs; every client's first weight sample."""
        self.omegas = {cid: r.payload["omega"] for cid, r in self.broadcast(Init()).items()}

    def run_round(self, t: int) -> None:
        r"""Round ``t``: each client gets the last weight sample of a random other client."""
        messages = {}
        for cid in self.client_ids:
            others = [c for c in self.client_ids if c != cid]
            omega = self.omegas[others[self.rng.integers(len(others))]] if others else None
            messages[cid] = Round(t=t, omega=omega)
        self.omegas.update({cid: r.payload["omega"] for cid, r in self.send(messages).items()})
