r"""The federation protocol and the federated algorithms as round-based programs.

- :mod:`~botorch_fed.federation.messages`, :mod:`~botorch_fed.federation.transport`,
  :mod:`~botorch_fed.federation.ledger`, :mod:`~botorch_fed.federation.roles`: typed
  messages, the in-process transport, the communication/timing ledger, and the
  server/client roles (with the secure-sum sub-protocol).
- :mod:`~botorch_fed.federation.fbo_fedgp`: FBO-FedGP (Alg. 1 + Alg. 2).
- Baselines: independent local BO and random search
  (:mod:`~botorch_fed.federation.independent`), centralised BO on pooled data
  (:mod:`~botorch_fed.federation.central_bo`), FTS-style federated Thompson sampling
  (:mod:`~botorch_fed.federation.fts`).
- :func:`run_federated`: build and run any of them and score the result.
"""

from botorch_fed.federation.bo_client import BOClient, BOSettings
from botorch_fed.federation.fbo_fedgp import FBOFedGPClient, FBOFedGPConfig, FBOFedGPServer
from botorch_fed.federation.ledger import Ledger
from botorch_fed.federation.messages import Message
from botorch_fed.federation.problem import ClientObjective
from botorch_fed.federation.roles import FederatedClient, FederatedServer, ProtocolViolation
from botorch_fed.federation.runner import (
    ALGORITHMS,
    FederationSetup,
    RunResult,
    build_federation,
    run_federated,
)
from botorch_fed.federation.transport import InProcessTransport, Transport

__all__ = [
    "ALGORITHMS",
    "BOClient",
    "BOSettings",
    "ClientObjective",
    "FBOFedGPClient",
    "FBOFedGPConfig",
    "FBOFedGPServer",
    "FederatedClient",
    "FederatedServer",
    "FederationSetup",
    "InProcessTransport",
    "Ledger",
    "Message",
    "ProtocolViolation",
    "RunResult",
    "Transport",
    "build_federation",
    "run_federated",
]
