r"""Server and client roles of the federation protocol.

A :class:`FederatedClient` owns its private state (data, local model, keys) and
answers messages by type: ``handle(Message("fit", ...))`` calls ``on_fit(payload)``.
A :class:`FederatedServer` drives the rounds through a
:class:`~botorch_fed.federation.transport.Transport` and never touches client
objects.

Secure sums are a sub-protocol both roles share (:meth:`FederatedServer.secure_sum`):
the server starts a session of a ``botorch_fed.secure`` backend and relays its
bytes; the first message of the session also names the vector the clients should
contribute (``request``), which each client computes with ``vector_<request>``.
Depending on the backend the sum ends on the server (plaintext, masking) or only on
the clients (CKKS: the server cannot decrypt). :meth:`FederatedServer.secure_sum`
then tells every client the outcome, so that afterwards every client holds the sum
in :attr:`FederatedClient.last_sum` and the server knows it only if the backend
revealed it to the server.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager

import numpy as np

from botorch_fed.federation.ledger import Ledger
from botorch_fed.federation.messages import TIME_PREFIX, Message
from botorch_fed.federation.transport import Transport
from botorch_fed.secure.errors import InputError
from botorch_fed.secure.limbs import LimbEncoding

SECAGG = "secagg"
SUM_RESULT = "secagg_result"


def limb_encoding(high: int) -> LimbEncoding:
    r"""The limb encoding for values below ``2^high`` (resolution ``2^-40``)."""
    return LimbEncoding(bits=12, low=-40, high=int(high))


class ProtocolViolation(RuntimeError):
    r"""A party received a message it cannot handle in its current state."""


class FederatedClient:
    r"""Base class of a client: dispatches messages to ``on_<type>`` methods.

    Args:
        client_id: This client's id.
        secagg: This client's role in the secure-aggregation backend (``None``:
            the client cannot take part in secure sums).
    """

    def __init__(self, client_id: int, secagg=None) -> None:
        self.client_id = int(client_id)
        self.secagg = secagg
        self.last_sum: np.ndarray | None = None
        self._pending: np.ndarray | None = None
        self._request: str | None = None
        self._encoding: LimbEncoding | None = None
        self._timings: dict[str, float] = {}

    def handle(self, message: Message) -> Message:
        r"""Answer one message (the transport calls this)."""
        handler = getattr(self, f"on_{message.type}", None)
        if handler is None:
            raise ProtocolViolation(
                f"Client {self.client_id} cannot handle messages of type {message.type!r}."
            )
        self._timings = {}
        payload = handler(message.payload) or {}
        payload.update({f"{TIME_PREFIX}{k}": v for k, v in self._timings.items()})
        return Message(message.type, payload)

    @contextmanager
    def timed(self, stage: str) -> Iterator[None]:
        r"""Time a block of this client's work as ``stage`` (reported to the ledger)."""
        t0 = time.perf_counter()
        try:
            yield
        finally:
            dt = time.perf_counter() - t0
            self._timings[stage] = self._timings.get(stage, 0.0) + dt

    # --- secure sums -------------------------------------------------------------
    def on_secagg(self, payload: dict) -> dict:
        if self.secagg is None:
            raise ProtocolViolation(f"Client {self.client_id} has no secure-aggregation role.")
        if "request" in payload:  # first message of a session: compute the vector
            request = str(payload["request"])
            compute = getattr(self, f"vector_{request}", None)
            if compute is None:
                raise ProtocolViolation(
                    f"Client {self.client_id} cannot contribute a {request!r} vector."
                )
            args = {k[len("arg:") :]: v for k, v in payload.items() if k.startswith("arg:")}
            vector = np.asarray(compute(**args), dtype=np.float64)
            if vector.ndim != 1 or not np.isfinite(vector).all():
                raise InputError(
                    f"Client {self.client_id}: its {request!r} vector for secure aggregation "
                    f"must be a finite 1-D array, got shape {vector.shape} with "
                    f"{int((~np.isfinite(vector)).sum())} non-finite entries."
                )
            high = int(payload.get("wide", 0))
            self._encoding = limb_encoding(high) if high else None
            self._pending = self._encoding.encode(vector) if self._encoding else vector
            self._request = request
            self.last_sum = None
        if self._pending is None:
            raise ProtocolViolation(f"Client {self.client_id}: secure-sum round without a vector.")
        with self.timed("secure_aggregation"):
            data = self.secagg.step(bytes(payload["data"]), self._pending)
        return {"data": data}

    def on_secagg_result(self, payload: dict) -> dict:
        if "sum" in payload:  # the server learnt the sum and shares it
            self.last_sum = np.asarray(payload["sum"], dtype=np.float64)
        else:  # the sum stayed on the clients (e.g. CKKS decryption)
            result = getattr(self.secagg, "result", None)
            if result is None:
                raise ProtocolViolation(f"Client {self.client_id} holds no decrypted sum.")
            result = np.asarray(result, dtype=np.float64)
            self.last_sum = self._encoding.decode(result) if self._encoding else result.copy()
        self._pending = None
        request, self._request = self._request, None
        return self.sum_received(request, self.last_sum) or {}

    def sum_received(self, request: str | None, total: np.ndarray) -> dict | None:
        r"""Hook: a secure sum of ``vector_<request>`` vectors is now in ``last_sum``.

        Subclasses act on it here (e.g. apply averaged hyperparameters) and may return
        a reply payload.
        """
        return None


class FederatedServer:
    r"""Base class of a server program.

    Args:
        transport: How messages reach the clients.
        secagg: The server role of a secure-aggregation backend (``None``: no secure
            sums).
    """

    def __init__(self, transport: Transport, secagg=None) -> None:
        self.transport = transport
        self.secagg = secagg

    @property
    def ledger(self) -> Ledger:
        return self.transport.ledger

    @property
    def client_ids(self) -> tuple[int, ...]:
        return self.transport.client_ids

    def broadcast(
        self, type: str, payload: dict | None = None, clients: Iterable[int] | None = None
    ) -> dict[int, Message]:
        r"""Send the same message to ``clients`` (default all); return the replies."""
        ids = self.client_ids if clients is None else tuple(clients)
        msg = Message(type, dict(payload or {}))
        return self.transport.send(dict.fromkeys(ids, msg))

    def send(self, messages: Mapping[int, Message]) -> dict[int, Message]:
        r"""Send individual messages; return the replies."""
        return self.transport.send(messages)

    def secure_sum(
        self,
        request: str,
        length: int,
        args: dict | None = None,
        clients: Iterable[int] | None = None,
        share: bool = True,
        wide: int = 64,
    ) -> np.ndarray | None:
        r"""Sum a vector over clients with the secure-aggregation backend.

        Args:
            request: Which vector the clients contribute (``vector_<request>``).
            length: Its length.
            args: Scalars/arrays passed to ``vector_<request>(**args)``.
            clients: Contributors (default all).
            share: Tell the clients the outcome so each holds the sum in
                ``last_sum`` (the server forwards it if it learnt it).
            wide: Send the vectors in the wide-range limb encoding
                (:class:`~botorch_fed.secure.limbs.LimbEncoding`): exact to ``2^-40``
                for any magnitude below ``2^wide``, at ``num_limbs`` times the length
                (0: raw float64 values).

        Returns:
            The sum if the backend reveals it to the server, else ``None`` (the
            clients hold it).
        """
        if self.secagg is None:
            raise ProtocolViolation("This server has no secure-aggregation backend.")
        ids = self.client_ids if clients is None else tuple(clients)
        first = {"request": request, **{f"arg:{k}": v for k, v in (args or {}).items()}}
        first["wide"] = int(wide)
        encoding = limb_encoding(wide) if wide else None
        with self.ledger.timer("secure_aggregation"):
            outgoing = self.secagg.start(
                ids, encoding.encoded_length(length) if encoding else length
            )
        extra = first
        while True:
            replies = self.send(
                {cid: Message(SECAGG, {"data": data, **extra}) for cid, data in outgoing.items()}
            )
            extra = {}
            with self.ledger.timer("secure_aggregation"):
                out = self.secagg.step({cid: r.payload["data"] for cid, r in replies.items()})
            if isinstance(out, dict):
                outgoing = out
                continue
            break
        result = out if isinstance(out, np.ndarray) else None
        if result is not None and encoding is not None:
            result = encoding.decode(result)
        if share:
            payload = {} if result is None else {"sum": result}
            self.broadcast(SUM_RESULT, payload, clients=self.secagg.contributors)
        return result
