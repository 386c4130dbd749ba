r"""The federation protocol: what every algorithm runs on.

- :mod:`~botorch_fed.protocol.messages`, :mod:`~botorch_fed.protocol.transport`,
  :mod:`~botorch_fed.protocol.ledger`, :mod:`~botorch_fed.protocol.client`: messages,
  the in-process transport, the communication/timing ledger, and the server/client
  roles (with the secure-sum sub-protocol).
- :mod:`~botorch_fed.protocol.bo_client`: the state every BO client keeps (data,
  local model, history) and its evaluation budget (:mod:`~botorch_fed.protocol.round_budget`).
- :mod:`~botorch_fed.protocol.objectives`, :mod:`~botorch_fed.protocol.problem`,
  :mod:`~botorch_fed.protocol.setup`: the clients' black boxes and a federation's set-up.
- :mod:`~botorch_fed.protocol.registry`, :mod:`~botorch_fed.protocol.runner`,
  :mod:`~botorch_fed.protocol.checkpoint`: every algorithm registers once; the in-process
  runner builds and runs any of them; checkpoints.

The algorithms themselves live in :mod:`botorch_fed.algorithms` (importing it registers
them; run them with :func:`botorch_fed.algorithms.run_federated`). The names below load
on first use, so a process that needs only what a message may carry
(:mod:`~botorch_fed.protocol.payloads`: a Flower ClientApp) imports no torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_API = {
    "BOClient": "bo_client",
    "BOSettings": "bo_client",
    "Ledger": "ledger",
    "Message": "messages",
    "CallableObjective": "objectives",
    "EvaluationError": "objectives",
    "Objective": "objectives",
    "ObjectiveContractError": "objectives",
    "ClientObjective": "problem",
    "AlgorithmSpec": "registry",
    "BuildContext": "registry",
    "register_algorithm": "registry",
    "unregister_algorithm": "registry",
    "FederatedClient": "client",
    "FederatedServer": "server",
    "ProtocolViolation": "declarations",
    "RunResult": "results",
    "FederationSetup": "setup",
    "InProcessTransport": "transport",
    "Transport": "transport",
}

__all__ = sorted(_API)


def __getattr__(name: str) -> Any:
    try:
        module = _API[name]
    except KeyError:
        raise AttributeError(f"module 'botorch_fed.protocol' has no attribute {name!r}") from None
    value = getattr(importlib.import_module(f"botorch_fed.protocol.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*__all__, *(n for n in globals() if not n.startswith("_"))} - {"annotations"})


if TYPE_CHECKING:
    from botorch_fed.protocol.bo_client import BOClient, BOSettings
    from botorch_fed.protocol.client import FederatedClient
    from botorch_fed.protocol.declarations import ProtocolViolation
    from botorch_fed.protocol.ledger import Ledger
    from botorch_fed.protocol.messages import Message
    from botorch_fed.protocol.objectives import (
        CallableObjective,
        EvaluationError,
        Objective,
        ObjectiveContractError,
    )
    from botorch_fed.protocol.problem import ClientObjective
    from botorch_fed.protocol.registry import (
        AlgorithmSpec,
        BuildContext,
        register_algorithm,
        unregister_algorithm,
    )
    from botorch_fed.protocol.results import RunResult
    from botorch_fed.protocol.server import FederatedServer
    from botorch_fed.protocol.setup import FederationSetup
    from botorch_fed.protocol.transport import InProcessTransport, Transport
