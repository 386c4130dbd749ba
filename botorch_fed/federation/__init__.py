r"""The federation protocol and the federated algorithms as round-based programs.

- :mod:`~botorch_fed.federation.messages`, :mod:`~botorch_fed.federation.transport`,
  :mod:`~botorch_fed.federation.ledger`, :mod:`~botorch_fed.federation.roles`: typed
  messages, the in-process transport, the communication/timing ledger, and the
  server/client roles (with the secure-sum sub-protocol).
- :mod:`~botorch_fed.federation.fbo_fedgp`: FBO-FedGP (Alg. 1 + Alg. 2).
- :mod:`~botorch_fed.federation.co_kg`: Co-KG and its family (Co-EI, Co-ES,
  barycenter-qKG): agents send their posteriors on a support, the server assigns every
  agent a point from their Wasserstein barycenter (Alg. 1 of the Co-KG slides).
- :mod:`~botorch_fed.federation.ldp_bo`: LDP-BO (``ldp-tgp``, ``ldp-ata``,
  ``ldp-moma`` and their non-private heavy-tailed versions, ``gp-ucb``): a learner
  queries one user per round and users privatise their reward before it leaves them.
- :mod:`~botorch_fed.federation.fedzero`: FedZero (paper 004, Alg. 1): workers send
  two-point l1-sphere gradient estimates, the server averages and takes a projected step.
- Baselines: independent local BO and random search
  (:mod:`~botorch_fed.federation.independent`), centralised BO on pooled data
  (:mod:`~botorch_fed.federation.central_bo`), FTS-style federated Thompson sampling
  (:mod:`~botorch_fed.federation.fts`).
- :mod:`~botorch_fed.federation.objectives`: the clients' black boxes
  (:class:`CallableObjective` for the user's own functions); a
  :class:`FederationSetup` takes them or a built-in test function name.
- :mod:`~botorch_fed.federation.registry`: every algorithm registers its name,
  settings and builders once; :func:`run_federated` (build and run any of them and
  score the result), the CLI and the Flower deployment (:mod:`botorch_fed.flower`)
  dispatch on it: the same clients and servers run in process and on Flower.
"""

# the algorithm modules register themselves on import (registry below)
from botorch_fed.federation import (  # noqa: F401
    central_bo,
    co_kg,
    fbo_fedgp,
    fedzero,
    fts,
    independent,
    ldp_bo,
)
from botorch_fed.federation.bo_client import BOClient, BOSettings
from botorch_fed.federation.co_kg import (
    BarycenterQKGSettings,
    CoEISettings,
    CoESSettings,
    CoKGClient,
    CoKGServer,
    CoKGSettings,
)
from botorch_fed.federation.fbo_fedgp import FBOFedGPClient, FBOFedGPConfig, FBOFedGPServer
from botorch_fed.federation.fedzero import FedZeroClient, FedZeroServer, FedZeroSettings
from botorch_fed.federation.ldp_bo import LDPBOSettings, LDPServer, LDPUserClient
from botorch_fed.federation.ledger import Ledger
from botorch_fed.federation.messages import Message
from botorch_fed.federation.objectives import (
    CallableObjective,
    EvaluationError,
    Objective,
    ObjectiveContractError,
)
from botorch_fed.federation.problem import ClientObjective
from botorch_fed.federation.registry import (
    AlgorithmSpec,
    BuildContext,
    available_algorithms,
    get_algorithm,
    register_algorithm,
    unregister_algorithm,
)
from botorch_fed.federation.roles import FederatedClient, FederatedServer, ProtocolViolation
from botorch_fed.federation.runner import RunResult, build_federation, run_federated
from botorch_fed.federation.setup import FederationSetup
from botorch_fed.federation.transport import InProcessTransport, Transport

__all__ = [
    "AlgorithmSpec",
    "BarycenterQKGSettings",
    "BOClient",
    "BOSettings",
    "BuildContext",
    "CallableObjective",
    "ClientObjective",
    "CoEISettings",
    "CoESSettings",
    "CoKGClient",
    "CoKGServer",
    "CoKGSettings",
    "EvaluationError",
    "FBOFedGPClient",
    "FBOFedGPConfig",
    "FBOFedGPServer",
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
    "FedZeroClient",
    "FedZeroServer",
    "FedZeroSettings",
    "LDPBOSettings",
    "LDPServer",
    "LDPUserClient",
    "register_algorithm",
    "unregister_algorithm",
    "run_federated",
]
