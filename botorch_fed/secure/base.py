r"""Round-based, transport-agnostic interface of the secure-aggregation backends: the
backend (a factory for its roles), its rounds and its key material.

A backend computes ``sum_i x_i`` over clients' float64 vectors ``x_i`` (``length``)
so that the server learns at most the sum. It is a conversation in rounds in which
every message is ``bytes`` (so the same objects run in one process, see
:mod:`botorch_fed.secure.driver`, or over a network such as Flower):

.. code-block:: text

    server.start(client_ids, length)   -> {cid: bytes}                      round 0
    client.step(msg, x)                -> bytes            (each addressed client)
    server.step({cid: reply})          -> {cid: bytes}                      next round
                                        | np.ndarray       the sum, learnt by the server
                                        | None             done; the sum is held by the
                                                           clients (``client.result``)

A client that does not answer a round has dropped out (the server records it in
``dropped``). The client and server roles are separate objects: client state (keys,
secret shares, the input) lives only in
:class:`~botorch_fed.secure.client_role.ClientRole` objects, and the
:class:`~botorch_fed.secure.server_role.ServerRole` only ever sees the bytes it is
handed. Key material that must
exist before a session (the CKKS key holder's keys) is produced client-side by
:meth:`SecureAggregationBackend.setup`; only ``BackendSetup.server_material`` may be
given to the server, the client material is distributed out of band.

Every frame is bound to its session, round, client and direction and is
authenticated (see :mod:`botorch_fed.secure.wire`): the first server message of a
session carries an ephemeral X25519 public key, every client answers with its own,
and all later frames in both directions carry an HMAC-SHA256 tag over header and
payload under the per-client channel key. This authenticates against
third parties on the network (not against an active man in the middle of the very
first exchange; there is no PKI), not against the server, which holds every channel
key. A role abandons its session on any error (fail closed): after a malformed,
misrouted or unauthenticated frame, even a genuine frame of that session is refused.

Every backend enforces a minimum number of contributors (default 3; a sum over two
clients reveals each one's input to the other): the server refuses to start or
finish with fewer, and a client refuses a session that announces fewer.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

from botorch_fed.secure.errors import ConfigurationError
from botorch_fed.secure.validation import validate_client_ids

if TYPE_CHECKING:
    from botorch_fed.secure.client_role import ClientRole
    from botorch_fed.secure.server_role import ServerRole

__all__ = [
    "STAGES",
    "BackendSetup",
    "RoundSpec",
    "SecureAggregationBackend",
]

STAGES = ("client_encode", "server_aggregate", "decrypt_unmask")


@dataclass(frozen=True)
class RoundSpec:
    """Name of a protocol round and the timing stage each side's work belongs to.

    Attributes:
        name: Round name used in errors and statistics.
        client_stage: Stage of the clients' work answering this round (one of
            :data:`STAGES`).
        server_stage: Stage of the server's work on the replies of this round.
    """

    name: str
    client_stage: str
    server_stage: str


@dataclass(frozen=True)
class BackendSetup:
    """Key material produced client-side before a session.

    Attributes:
        server_material: Public material for the server role (e.g. a CKKS public
            context); empty for backends that need none.
        client_material: Per-client secret material, distributed out of band (never
            through the server).
    """

    server_material: bytes = b""
    client_material: Mapping[int, bytes] = field(default_factory=dict)

    def for_client(self, client_id: int) -> bytes:
        """Material for ``client_id`` (empty if the backend needs none)."""
        return self.client_material.get(client_id, b"")


class SecureAggregationBackend(ABC):
    """A secure-aggregation protocol: a factory for its server and client roles.

    Args:
        min_clients: Minimum number of contributors to a sum (default 3).
        allow_two_clients: Must be True to set ``min_clients=2``: with two
            contributors each learns the other's input from the sum.
    """

    name: ClassVar[str]
    code: ClassVar[int]
    rounds: ClassVar[tuple[RoundSpec, ...]]

    def __init__(self, *, min_clients: int = 3, allow_two_clients: bool = False) -> None:
        if not isinstance(allow_two_clients, bool):
            raise ConfigurationError(
                f"option 'allow_two_clients' must be True or False, got {allow_two_clients!r}"
            )
        if isinstance(min_clients, bool) or not isinstance(min_clients, int):
            raise ConfigurationError(
                f"option 'min_clients' must be an int >= 3 (>= 2 with "
                f"allow_two_clients=True), got {min_clients!r}"
            )
        if min_clients < 2:
            raise ConfigurationError(
                f"option 'min_clients' must be >= 2 (a 'sum' of one input is that "
                f"input), got {min_clients}"
            )
        if min_clients == 2 and not allow_two_clients:
            raise ConfigurationError(
                "option 'min_clients'=2 lets each of two contributors recover the "
                "other's input from the sum; pass allow_two_clients=True to accept "
                "that, or use min_clients >= 3"
            )
        self.min_clients = min_clients
        self.allow_two_clients = allow_two_clients

    @property
    def options(self) -> dict[str, object]:
        """The options this backend was created with (JSON-friendly)."""
        return {"min_clients": self.min_clients, "allow_two_clients": self.allow_two_clients}

    def __repr__(self) -> str:
        opts = ", ".join(f"{k}={v!r}" for k, v in self.options.items())
        return f"{type(self).__name__}({opts})"

    def round_name(self, round: int) -> str:
        """Name of round ``round`` (for messages and statistics)."""
        return self.rounds[round].name if 0 <= round < len(self.rounds) else "?"

    def setup(self, client_ids: Iterable[int], *, seed: int | None = None) -> BackendSetup:
        """Produce the key material a session needs before it starts (client-side).

        Args:
            client_ids: The clients of the federation.
            seed: Seed for reproducible key material (tests only), or None.

        Returns:
            The material; the default backend needs none.
        """
        ids = validate_client_ids(client_ids)
        return BackendSetup(b"", {cid: b"" for cid in ids})

    @abstractmethod
    def server(self, material: bytes = b"", *, seed: int | None = None) -> ServerRole:
        """Create the server role.

        Args:
            material: ``BackendSetup.server_material`` (public only).
            seed: Seed for the session ids / ephemeral keys (tests only), or None.
        """

    @abstractmethod
    def client(
        self, client_id: int, material: bytes = b"", *, seed: int | None = None
    ) -> ClientRole:
        """Create the role of client ``client_id``.

        Args:
            client_id: This client's id.
            material: ``BackendSetup.for_client(client_id)``, received out of band.
            seed: Seed for this client's key material (tests only), or None.
        """

    @abstractmethod
    def max_abs_supported(self, n_clients: int) -> float:
        """Largest ``max|x_i|`` each of ``n_clients`` inputs may have.

        Beyond it the sum could overflow (wrap around) or, for approximate encodings
        (CKKS), miss the backend's accuracy promise; clients raise HeadroomError.
        """
