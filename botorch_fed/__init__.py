r"""botorch-fed: federated and privacy-preserving Bayesian optimisation for BoTorch.

``import botorch_fed as bf`` gives what a user needs: run an algorithm on a federation
(:func:`bf.run_federated`, :class:`bf.FederationSetup`, the user's own black box
:class:`bf.CallableObjective`), each algorithm's settings, and the BoTorch models and
acquisition functions the algorithms are built from. The names load on first use, so
``import botorch_fed.secure`` (numpy and crypto only) does not import torch.

Subpackages, top to bottom (imports only point down; ``tests/test_layers.py`` checks it):

- ``botorch_fed.cli``, ``botorch_fed.flower``, ``botorch_fed.runs``, ``botorch_fed.tasks``:
  the command line, the Flower deployment, a run's description, real tuning tasks.
- ``botorch_fed.algorithms``: one package per algorithm (settings, messages, client,
  server), registered on import.
- ``botorch_fed.protocol``: messages, transport, ledger, roles, secure sums, checkpoints,
  the registry and the in-process runner.
- ``botorch_fed.ldp``, ``botorch_fed.acquisition``, ``botorch_fed.models``: BoTorch
  pieces, e.g. the federated sparse GP :class:`~botorch_fed.models.FederatedPITCGP`
  (dPITC of [FBO-FedGP]).
- ``botorch_fed.privacy``, ``botorch_fed.zeroth_order``, ``botorch_fed.inducing``: LDP
  mechanisms; FedZero's estimators; the federated k-means support set.
- ``botorch_fed.secure``, ``botorch_fed.test_functions``: secure aggregation backends
  (numpy + crypto, no torch); test functions.

References:

.. [FBO-FedGP] Secure federated Bayesian optimisation with distributed sparse GPs
   and multiparty homomorphic encryption (paper 000 in ``shared/papers``).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0.dev0"

# name -> the module that defines it
_API = {
    # running a federation
    "run_federated": "botorch_fed.algorithms",
    "build_federation": "botorch_fed.algorithms",
    "available_algorithms": "botorch_fed.algorithms",
    "RunResult": "botorch_fed.protocol.results",
    "FederationSetup": "botorch_fed.protocol.setup",
    "ProtocolViolation": "botorch_fed.protocol.declarations",
    # black boxes
    "CallableObjective": "botorch_fed.problems.objectives",
    "Objective": "botorch_fed.problems.objectives",
    "EvaluationError": "botorch_fed.problems.objectives",
    "ObjectiveContractError": "botorch_fed.problems.objectives",
    # settings, one class per algorithm
    "BOSettings": "botorch_fed.protocol.bo_client",
    "FBOFedGPSettings": "botorch_fed.algorithms.fbo_fedgp.settings",
    "CoKGSettings": "botorch_fed.algorithms.co_kg",
    "CoEISettings": "botorch_fed.algorithms.co_kg",
    "CoESSettings": "botorch_fed.algorithms.co_kg",
    "BarycenterQKGSettings": "botorch_fed.algorithms.co_kg",
    "LDPBOSettings": "botorch_fed.algorithms.ldp_bo",
    "FedZeroSettings": "botorch_fed.algorithms.fedzero",
    # BoTorch models and acquisition functions
    "FederatedPITCGP": "botorch_fed.models",
    "FederatedPICGP": "botorch_fed.models",
    "PITCMarginalLogLikelihood": "botorch_fed.models",
    "SparseSummary": "botorch_fed.models",
    "compute_local_summary": "botorch_fed.models",
    "BarycenterGP": "botorch_fed.models",
    "FeatureSpaceGP": "botorch_fed.models",
    "qCoKnowledgeGradient": "botorch_fed.acquisition",
    "qCoExpectedImprovement": "botorch_fed.acquisition",
    "qCoMaxValueEntropy": "botorch_fed.acquisition",
    "MixedLocalGlobalUCB": "botorch_fed.acquisition",
    # privacy and zeroth-order optimisation
    "LaplaceMechanism": "botorch_fed.privacy",
    "FedZero": "botorch_fed.zeroth_order",
    "sample_l1_sphere": "botorch_fed.zeroth_order",
    "simulate_fedzero": "botorch_fed.zeroth_order",
}

__all__ = ["__version__", *_API]


def __getattr__(name: str) -> Any:
    try:
        module = _API[name]
    except KeyError:
        raise AttributeError(f"module 'botorch_fed' has no attribute {name!r}") from None
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)


if TYPE_CHECKING:
    from botorch_fed.acquisition import (
        MixedLocalGlobalUCB,
        qCoExpectedImprovement,
        qCoKnowledgeGradient,
        qCoMaxValueEntropy,
    )
    from botorch_fed.algorithms import available_algorithms, build_federation, run_federated
    from botorch_fed.algorithms.co_kg import (
        BarycenterQKGSettings,
        CoEISettings,
        CoESSettings,
        CoKGSettings,
    )
    from botorch_fed.algorithms.fbo_fedgp.settings import FBOFedGPSettings
    from botorch_fed.algorithms.fedzero import FedZeroSettings
    from botorch_fed.algorithms.ldp_bo import LDPBOSettings
    from botorch_fed.models import (
        BarycenterGP,
        FeatureSpaceGP,
        FederatedPICGP,
        FederatedPITCGP,
        PITCMarginalLogLikelihood,
        SparseSummary,
        compute_local_summary,
    )
    from botorch_fed.privacy import LaplaceMechanism
    from botorch_fed.problems.objectives import (
        CallableObjective,
        EvaluationError,
        Objective,
        ObjectiveContractError,
    )
    from botorch_fed.protocol.bo_client import BOSettings
    from botorch_fed.protocol.declarations import ProtocolViolation
    from botorch_fed.protocol.results import RunResult
    from botorch_fed.protocol.setup import FederationSetup
    from botorch_fed.zeroth_order import FedZero, sample_l1_sphere, simulate_fedzero
