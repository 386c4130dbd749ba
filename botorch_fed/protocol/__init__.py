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
them).
"""

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
    available_algorithms,
    get_algorithm,
    register_algorithm,
    unregister_algorithm,
)
from botorch_fed.protocol.results import RunResult
from botorch_fed.protocol.runner import build_federation, run_federated
from botorch_fed.protocol.server import FederatedServer
from botorch_fed.protocol.setup import FederationSetup
from botorch_fed.protocol.transport import InProcessTransport, Transport

__all__ = [
    "AlgorithmSpec",
    "BOClient",
    "BOSettings",
    "BuildContext",
    "CallableObjective",
    "ClientObjective",
    "EvaluationError",
    "FederatedClient",
    "FederatedServer",
    "FederationSetup",
    "InProcessTransport",
    "Ledger",
    "Message",
    "Objective",
    "ObjectiveContractError",
    "ProtocolViolation",
    "RunResult",
    "Transport",
    "available_algorithms",
    "build_federation",
    "get_algorithm",
    "register_algorithm",
    "run_federated",
    "unregister_algorithm",
]
