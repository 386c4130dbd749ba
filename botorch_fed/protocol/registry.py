r"""The algorithm registry: every federated algorithm registers one :class:`AlgorithmSpec`
(its name, summary, settings and builders of its server and of one client -- on a
deployment each client lives in its own process); the runner, the CLI and Flower
dispatch on it.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from torch import Tensor

from botorch_fed.problems.objectives import Objective


@dataclass
class BuildContext:
    r"""Everything a builder needs to create the parties of one run."""

    setup: Any  # the FederationSetup
    settings: Any  # an instance of the algorithm's settings_class
    objectives: list[Objective]  # one per client, in client-id order
    dim: int
    client_seeds: list[int]
    init_regions: list[Tensor | None]  # each client's initial-design sub-box, or None
    secagg_clients: dict[int, Any] = field(default_factory=dict)  # secure-aggregation roles
    secagg_server: Any = None
    crypto_seed: int | None = None  # seed of every party's private randomness (None: the OS's)
    private_randomness: str = "os"  # where crypto_seed comes from: "crypto_seed", "seed", "os"

    @property
    def client_ids(self) -> list[int]:
        return list(range(len(self.objectives)))

    def client_arguments(self, cid: int) -> dict:
        r"""The keyword arguments every :class:`BOClient` takes, for client ``cid``."""
        return {
            "client_id": cid,
            "objective": self.objectives[cid],
            "settings": self.settings,
            "seed": self.client_seeds[cid],
            "init_region": self.init_regions[cid],
            "evaluation_errors": self.setup.evaluation_errors,
            "private_seed": self.private_seed(cid),
        }

    def private_seed(self, cid: int) -> int | None:
        r"""Seed of client ``cid``'s private generator (``None``: OS randomness)."""
        cs = self.crypto_seed
        return None if cs is None else (cs * 1_000_003 + 7_919 * cid + 13) % (2**62)


@dataclass(frozen=True)
class AlgorithmSpec:
    r"""How to build one federated algorithm."""

    name: str  # what users pick it by (`botorch-fed run <name>`)
    summary: str  # one line for `botorch-fed list`
    settings_class: type[Any]
    make_client: Callable[[BuildContext, int], Any]  # (context, client id) -> FederatedClient
    make_server: Callable[[BuildContext, Any], Any]  # (context, transport) -> FederatedServer
    secure_aggregation: bool = False  # runs secure sums (needs setup.aggregator)
    min_clients: int = 1
    # run before anything is built: ValueError for settings these objectives cannot run
    check: Callable[[BuildContext], None] | None = None
    cumulative_regret: bool = False  # its figure of merit is R_T (LDP-BO), not simple regret


_REGISTRY: dict[str, AlgorithmSpec] = {}
_NAME = re.compile(r"[a-z0-9][a-z0-9_-]*")


def register_algorithm(spec: AlgorithmSpec) -> AlgorithmSpec:
    r"""Register ``spec`` under ``spec.name``; a second registration of a name raises."""
    if not isinstance(spec, AlgorithmSpec):
        raise TypeError(f"`spec` must be an AlgorithmSpec, got {type(spec).__name__}.")
    if not isinstance(spec.name, str) or not _NAME.fullmatch(spec.name):
        raise ValueError(
            f"Algorithm name {spec.name!r} must be lower-case letters, digits, '-' or '_', "
            "starting with a letter or digit."
        )
    if spec.name in _REGISTRY and _REGISTRY[spec.name] is not spec:
        raise ValueError(f"An algorithm named {spec.name!r} is already registered.")
    _REGISTRY[spec.name] = spec
    return spec


def unregister_algorithm(name: str) -> AlgorithmSpec:
    r"""Remove ``name`` from the registry (plugins, tests); returns its spec."""
    try:
        return _REGISTRY.pop(name)
    except KeyError:
        raise ValueError(
            f"No algorithm named {name!r} is registered; known: {available_algorithms()}."
        ) from None


def get_algorithm(name: str) -> AlgorithmSpec:
    r"""The registered algorithm ``name``; ``ValueError`` listing the known ones."""
    try:
        return _REGISTRY[name]
    except (KeyError, TypeError):
        known = available_algorithms()
        raise ValueError(f"Unknown algorithm {name!r}; choose one of {known}.") from None


def available_algorithms() -> tuple[str, ...]:
    r"""The registered algorithms' names, in registration order."""
    return tuple(_REGISTRY)
