r"""The algorithm registry: every federated algorithm is registered once.

An algorithm package calls :func:`register_algorithm` with an :class:`AlgorithmSpec`:
its name, a one-line summary, its settings dataclass and how to build its server
and one client. :func:`~botorch_fed.protocol.runner.run_federated`, the command
line and the Flower deployment dispatch on this registry, so a new algorithm touches its
own package only. Clients are built one at a time (:attr:`AlgorithmSpec.make_client`)
because on a real deployment each lives in its own process.

Example:
    >>> from botorch_fed.algorithms import available_algorithms, get_algorithm
    >>> "fbo-fedgp" in available_algorithms()
    True
    >>> get_algorithm("local").summary
    'independent BO: every client on its own GP, no collaboration (baseline)'
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from torch import Tensor

from botorch_fed.protocol.objectives import Objective


@dataclass
class BuildContext:
    r"""Everything a builder needs to create the parties of one run.

    Attributes:
        setup: The :class:`~botorch_fed.protocol.setup.FederationSetup`.
        settings: The algorithm's settings (an instance of its ``settings_class``).
        objectives: One objective per client, in client-id order.
        dim: The problem dimension.
        client_seeds: Each client's seed.
        init_regions: Each client's initial-design sub-box of the unit cube, or ``None``.
        secagg_clients: Each client's secure-aggregation role (algorithms with
            ``secure_aggregation``), else empty.
        secagg_server: The server's secure-aggregation role, or ``None``.
        crypto_seed: Seed of every party's private randomness (key material, masks,
            nonces, centre noise, Laplace noise, failed-evaluation redraws):
            ``setup.crypto_seed``, or in a simulation one derived from ``setup.seed``
            (:func:`~botorch_fed.protocol.runner.build_context`); ``None``: each
            party draws it from the OS, as in a deployment.
        private_randomness: Where ``crypto_seed`` comes from: ``"crypto_seed"``,
            ``"seed"`` (derived from ``setup.seed``) or ``"os"`` (``None``).
    """

    setup: Any
    settings: Any
    objectives: list[Objective]
    dim: int
    client_seeds: list[int]
    init_regions: list[Tensor | None]
    secagg_clients: dict[int, Any] = field(default_factory=dict)
    secagg_server: Any = None
    crypto_seed: int | None = None
    private_randomness: str = "os"

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
        r"""Seed of client ``cid``'s private generator: derived from :attr:`crypto_seed`
        (simulations, tests) or ``None`` (OS randomness)."""
        cs = self.crypto_seed
        return None if cs is None else (cs * 1_000_003 + 7_919 * cid + 13) % (2**62)


@dataclass(frozen=True)
class AlgorithmSpec:
    r"""How to build one federated algorithm.

    Attributes:
        name: The name users pick it by (``botorch-fed run <name>``).
        summary: One line for ``botorch-fed list``.
        settings_class: Its settings dataclass (with a ``validate()`` method).
        make_client: ``(context, client id) -> client``: a
            :class:`~botorch_fed.protocol.client.FederatedClient` (with ``history``
            and ``state_dict``/``load_state_dict``, as
            :class:`~botorch_fed.protocol.bo_client.BOClient`).
        make_server: ``(context, transport) -> server``: a
            :class:`~botorch_fed.protocol.server.FederatedServer` implementing
            ``run_round`` (and ``initialize``), whose ``settings`` attribute is the
            settings dataclass (``settings.num_rounds`` bounds the run).
        secure_aggregation: Whether it runs secure sums (needs ``setup.aggregator``).
        min_clients: The fewest clients it runs with (before the aggregator's own
            minimum).
        check: Optional ``(context) -> None`` run before anything is built (by
            :func:`~botorch_fed.protocol.runner.run_federated` and the command line):
            raises ``ValueError`` naming the settings for a run that cannot work with
            these objectives (e.g. bounds they do not declare).
        cumulative_regret: Whether its figure of merit is the cumulative regret
            ``R_T`` of the bandit literature (LDP-BO) rather than the simple regret
            (plots and tables show that one).
    """

    name: str
    summary: str
    settings_class: type[Any]
    make_client: Callable[[BuildContext, int], Any]
    make_server: Callable[[BuildContext, Any], Any]
    secure_aggregation: bool = False
    min_clients: int = 1
    check: Callable[[BuildContext], None] | None = None
    cumulative_regret: bool = False


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
        raise ValueError(
            f"Unknown algorithm {name!r}; choose one of {available_algorithms()}."
        ) from None


def available_algorithms() -> tuple[str, ...]:
    r"""The registered algorithms' names, in registration order."""
    return tuple(_REGISTRY)
