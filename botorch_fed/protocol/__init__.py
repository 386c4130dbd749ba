r"""The federation protocol every algorithm runs on: messages, transports, the ledger,
the server/client roles with secure sums, the BO client state, the registry
and the in-process runner. Names load on first use, so a Flower ClientApp that needs only
:mod:`~botorch_fed.protocol.payloads` imports no torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_MODULES = {
    "bo_client": ("BOClient", "BOSettings"),
    "client": ("FederatedClient",),
    "declarations": ("ProtocolViolation",),
    "ledger": ("Ledger",),
    "messages": ("Message",),
    "registry": ("AlgorithmSpec", "BuildContext", "register_algorithm", "unregister_algorithm"),
    "results": ("RunResult",),
    "server": ("FederatedServer",),
    "setup": ("FederationSetup",),
    "transport": ("InProcessTransport", "Transport"),
}
_API = {name: module for module, names in _MODULES.items() for name in names}

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
