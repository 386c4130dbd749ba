r"""The federated algorithms, one package each; importing this package registers them.

- :mod:`~botorch_fed.algorithms.fbo_fedgp`: FBO-FedGP (paper 000, Alg. 1 + Alg. 2).
- :mod:`~botorch_fed.algorithms.co_kg`: Co-KG and its family (Co-EI, Co-ES,
  barycenter-qKG; paper 001): agents send their posteriors on a support, the server
  assigns every agent a point from their Wasserstein barycenter.
- :mod:`~botorch_fed.algorithms.ldp_bo`: LDP-BO (paper 002: ``ldp-tgp``, ``ldp-ata``,
  ``ldp-moma`` and their non-private versions, ``gp-ucb``).
- :mod:`~botorch_fed.algorithms.fedzero`: FedZero (paper 004, Alg. 1).
- Baselines: independent local BO and random search
  (:mod:`~botorch_fed.algorithms.independent`), BO on pooled data
  (:mod:`~botorch_fed.algorithms.central`), federated Thompson sampling
  (:mod:`~botorch_fed.algorithms.fts`).

:func:`run_federated`, :func:`build_federation`, :func:`available_algorithms` and
:func:`get_algorithm` are the protocol's (:mod:`botorch_fed.protocol.runner`), here with
every algorithm registered; :func:`run_federated` is typed by algorithm (a type checker
refuses settings of another algorithm's class).
"""

import functools
import os
from collections.abc import Callable
from typing import Any, Literal, TypedDict, Unpack, overload

from botorch_fed.algorithms.central import CentralClient, CentralServer
from botorch_fed.algorithms.co_kg import (
    BarycenterQKGSettings,
    CoEISettings,
    CoESSettings,
    CoKGClient,
    CoKGServer,
    CoKGSettings,
)
from botorch_fed.algorithms.fbo_fedgp import FBOFedGPClient, FBOFedGPServer, FBOFedGPSettings
from botorch_fed.algorithms.fedzero import FedZeroClient, FedZeroServer, FedZeroSettings
from botorch_fed.algorithms.fts import FTSClient, FTSServer
from botorch_fed.algorithms.independent import LocalBOClient, PacingServer, RandomSearchClient
from botorch_fed.algorithms.ldp_bo import LDPBOSettings, LDPServer, LDPUserClient
from botorch_fed.protocol.bo_client import BOSettings
from botorch_fed.protocol.registry import available_algorithms, get_algorithm
from botorch_fed.protocol.results import RunResult
from botorch_fed.protocol.runner import build_federation
from botorch_fed.protocol.runner import run_federated as _run_federated
from botorch_fed.protocol.setup import FederationSetup


class _RunOptions(TypedDict, total=False):
    on_round: Callable[[int, float | None], None] | None
    on_receive: Callable[[int, dict], None] | None
    checkpoint: str | os.PathLike | None
    resume: str | os.PathLike | None
    private_randomness: Literal["seed", "os"]


_LDP = Literal["ldp-tgp", "ldp-ata", "ldp-moma", "tgp", "ata", "moma", "gp-ucb"]
_BO = Literal["local", "random", "central", "fts"]


# run_federated typed by algorithm: the settings class follows from the name; a name only
# known at run time (``str``) type-checks with default settings only
# fmt: off
@overload
def run_federated(algorithm: Literal["fbo-fedgp"], setup: FederationSetup, settings: FBOFedGPSettings | None = None, **options: Unpack[_RunOptions]) -> RunResult: ...  # noqa: E501
@overload
def run_federated(algorithm: Literal["co-kg"], setup: FederationSetup, settings: CoKGSettings | None = None, **options: Unpack[_RunOptions]) -> RunResult: ...  # noqa: E501
@overload
def run_federated(algorithm: Literal["co-ei"], setup: FederationSetup, settings: CoEISettings | None = None, **options: Unpack[_RunOptions]) -> RunResult: ...  # noqa: E501
@overload
def run_federated(algorithm: Literal["co-es"], setup: FederationSetup, settings: CoESSettings | None = None, **options: Unpack[_RunOptions]) -> RunResult: ...  # noqa: E501
@overload
def run_federated(algorithm: Literal["barycenter-qkg"], setup: FederationSetup, settings: BarycenterQKGSettings | None = None, **options: Unpack[_RunOptions]) -> RunResult: ...  # noqa: E501
@overload
def run_federated(algorithm: _LDP, setup: FederationSetup, settings: LDPBOSettings | None = None, **options: Unpack[_RunOptions]) -> RunResult: ...  # noqa: E501
@overload
def run_federated(algorithm: Literal["fedzero"], setup: FederationSetup, settings: FedZeroSettings | None = None, **options: Unpack[_RunOptions]) -> RunResult: ...  # noqa: E501
@overload
def run_federated(algorithm: _BO, setup: FederationSetup, settings: BOSettings | None = None, **options: Unpack[_RunOptions]) -> RunResult: ...  # noqa: E501
@overload
def run_federated(algorithm: str, setup: FederationSetup, settings: None = None, **options: Unpack[_RunOptions]) -> RunResult: ...  # noqa: E501
# fmt: on
def run_federated(
    algorithm: str, setup: FederationSetup, settings: Any = None, **options: Any
) -> RunResult:
    return _run_federated(algorithm, setup, settings, **options)


# help() and inspect show the protocol's docstring and signature
functools.update_wrapper(run_federated, _run_federated, assigned=("__doc__",))


__all__ = [
    "BarycenterQKGSettings",
    "CentralClient",
    "CentralServer",
    "CoEISettings",
    "CoESSettings",
    "CoKGClient",
    "CoKGServer",
    "CoKGSettings",
    "FBOFedGPClient",
    "FBOFedGPServer",
    "FBOFedGPSettings",
    "FTSClient",
    "FTSServer",
    "FedZeroClient",
    "FedZeroServer",
    "FedZeroSettings",
    "LDPBOSettings",
    "LDPServer",
    "LDPUserClient",
    "LocalBOClient",
    "PacingServer",
    "RandomSearchClient",
    "available_algorithms",
    "build_federation",
    "get_algorithm",
    "run_federated",
]
