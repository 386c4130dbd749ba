r"""The ``plaintext`` reference backend: clients send their float64 vectors in clear.

No privacy at all: the server sees every input. It exists as the reference the secure
backends are compared with (same interface, same framing and authentication, same
validation and minimum-contributor rule), and for debugging federations.

Rounds:

0. ``submit``: the server announces the session; each client answers with its
   vector (``<f8``). The server sums the vectors it received.
"""

from __future__ import annotations

import numpy as np

from botorch_fed.secure.base import RoundSpec, SecureAggregationBackend
from botorch_fed.secure.client_role import ClientRole
from botorch_fed.secure.errors import ConfigurationError, InputError
from botorch_fed.secure.server_role import ServerRole
from botorch_fed.secure.validation import error_context
from botorch_fed.secure.wire import PayloadReader, PayloadWriter

__all__ = ["PlaintextBackend"]

# Largest magnitude for which a float64 sum cannot overflow to inf.
_FLOAT64_HEADROOM = float(np.finfo(np.float64).max) / 2.0


class PlaintextBackend(SecureAggregationBackend):
    """Reference backend: the server receives the inputs in clear and sums them.

    Args:
        min_clients: Minimum number of contributors (default 3).
        allow_two_clients: Must be True to allow ``min_clients=2``.
    """

    name = "plaintext"
    code = 1
    rounds = (RoundSpec("submit", "client_encode", "server_aggregate"),)

    def server(self, material: bytes = b"", *, seed: int | None = None) -> ServerRole:
        """Create the server role (``material`` must be empty)."""
        if material:
            raise ConfigurationError("the plaintext backend takes no server material")
        return _PlaintextServer(self, seed=seed)

    def client(
        self, client_id: int, material: bytes = b"", *, seed: int | None = None
    ) -> ClientRole:
        """Create the role of client ``client_id`` (``material`` must be empty)."""
        if material:
            raise ConfigurationError("the plaintext backend takes no client material")
        return _PlaintextClient(self, client_id, seed=seed)

    def max_abs_supported(self, n_clients: int) -> float:
        """Largest ``max|x|`` whose float64 sum over ``n_clients`` stays finite."""
        return _FLOAT64_HEADROOM / max(int(n_clients), 1)


class _PlaintextServer(ServerRole):
    def _handle(self, round: int, payloads: dict[int, bytes]) -> np.ndarray:
        ids = self._require(payloads, self.backend.min_clients, "submitted an input")
        total = np.zeros(self.length)
        for cid in ids:
            with error_context(cid, None, None):
                reader = PayloadReader(payloads[cid])
                x = reader.array("f", self.length)
                reader.done()
            if not np.isfinite(x).all():
                raise InputError("submitted vector contains NaN/inf", client_id=cid)
            total += x
        self._contributors = ids
        return total


class _PlaintextClient(ClientRole):
    def federation_secret(self) -> None:
        """None: the clients of a plaintext federation share no secret, so whatever an
        algorithm would derive from one (e.g. FBO-FedGP's global-step seed) falls back
        to public values the server can recompute. No protection here."""
        return None

    def _begin(self, reader: PayloadReader, x: np.ndarray | None) -> bytes:
        reader.done()
        arr = self.checked_input(x, self.backend.max_abs_supported(self.n_clients))
        return PayloadWriter().array(arr).getvalue()
