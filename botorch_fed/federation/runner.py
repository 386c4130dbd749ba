r"""Run a federated optimisation end to end on the in-process transport.

:func:`run_federated` looks the algorithm up in the registry
(:mod:`~botorch_fed.federation.registry`), builds the clients (each with its
objective: the user's own or a seeded copy of a test function, and optional initial
regions), the secure-aggregation
backend (key material is produced client-side and handed to the clients out of
band; the server gets only public material), the transport and ledger, runs the
chosen algorithm's server program and collects the results. The harness reads the
clients' ``history`` to score the run; that record is never part of the protocol.
"""

from __future__ import annotations

import platform
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import numpy as np
import torch

from botorch_fed.federation.problem import client_regions
from botorch_fed.federation.registry import (
    AlgorithmSpec,
    BuildContext,
    available_algorithms,
    get_algorithm,
)
from botorch_fed.federation.setup import FederationSetup
from botorch_fed.federation.transport import InProcessTransport


@dataclass
class RunResult:
    r"""What a federated run produced, in the objective's own convention (``minimize``;
    built-in test functions minimise, as the CEC-2005 tables).

    Attributes:
        algorithm: The algorithm.
        problem: The objective's name (a test function's class name).
        dim: Dimension.
        minimize: Whether smaller values are better.
        optimal_value: The known optimum (``None`` if unknown).
        best_value: Best value evaluated by the federation (noise-free for test
            functions; ``None`` if every evaluation failed).
        best_point: Where (in the objective's domain).
        best_per_round: Best value after initialisation (index 0) and each round.
        regret_per_round: ``|best_per_round - optimal_value|`` (if known).
        best_per_client: Each client's own best value.
        steps: Count of steps by kind (init, local, global, ...).
        failures: Failed evaluations: client, round, step, point, error.
        time_s: Wall time of the run.
        ledger: The ledger (stage times, bytes).
        config: Setup and algorithm settings.
        versions: Library versions.
    """

    algorithm: str
    problem: str
    dim: int
    optimal_value: float | None
    best_value: float | None
    best_per_round: list[float | None]
    regret_per_round: list[float | None] | None
    best_per_client: dict[int, float | None]
    steps: dict[str, int]
    time_s: float
    ledger: dict
    config: dict
    versions: dict = field(default_factory=dict)
    minimize: bool = True
    best_point: list[float] | None = None
    failures: list[dict] = field(default_factory=list)

    def to_dict(self) -> dict:
        r"""JSON-friendly dict."""
        out = asdict(self)
        out["best_per_client"] = {str(k): v for k, v in self.best_per_client.items()}
        return out


def _best(entries, minimize: bool) -> dict | None:
    r"""The best successful history entry (first of ties), or ``None``."""
    best = None
    for h in entries:
        v = h["value"]
        if v is None:
            continue
        if best is None or (v < best["value"] if minimize else v > best["value"]):
            best = h
    return best


def library_versions() -> dict[str, str]:
    r"""Versions of Python and the libraries a run depends on."""
    import botorch
    import gpytorch

    import botorch_fed

    out = {
        "python": platform.python_version(),
        "botorch-fed": botorch_fed.__version__,
        "torch": torch.__version__,
        "botorch": botorch.__version__,
        "gpytorch": gpytorch.__version__,
        "numpy": np.__version__,
    }
    try:
        import tenseal

        out["tenseal"] = tenseal.__version__
    except ImportError:  # pragma: no cover - optional extra
        pass
    return out


def _secagg_roles(setup: FederationSetup, ids: list[int]):
    from botorch_fed.secure import get_backend

    options = {}
    if setup.aggregator == "plaintext" and len(ids) < 3:
        options = {"min_clients": 2, "allow_two_clients": True}
    backend = get_backend(setup.aggregator, **options)
    material = backend.setup(ids, seed=setup.crypto_seed)  # client-side key generation
    server = backend.server(material.server_material, seed=setup.crypto_seed)
    clients = {
        cid: backend.client(
            cid,
            material.for_client(cid),
            seed=None if setup.crypto_seed is None else setup.crypto_seed + 1 + cid,
        )
        for cid in ids
    }
    return server, clients


def build_context(spec: AlgorithmSpec, setup: FederationSetup, settings) -> BuildContext:
    r"""Validate ``setup`` and ``settings`` for ``spec`` and derive what the builders need
    (objectives, seeds, initial regions; secure-aggregation roles are added by the
    caller)."""
    setup.validate(spec.name)
    if settings is None:
        settings = spec.settings_class()
    if not isinstance(settings, spec.settings_class):
        raise ValueError(
            f"{spec.name} needs `settings` of type {spec.settings_class.__name__}, got "
            f"{type(settings).__name__}."
        )
    settings.validate()
    objectives = setup.make_objectives()
    M = len(objectives)
    dim = objectives[0].dim
    regions = (
        client_regions(M, dim, seed=setup.seed + 29, width=setup.region_width)
        if setup.init_regions
        else [None] * M
    )
    return BuildContext(
        setup=setup,
        settings=settings,
        objectives=objectives,
        dim=dim,
        client_seeds=[setup.seed * 1_000 + 101 * i + 1 for i in range(M)],
        init_regions=regions,
    )


def build_federation(
    algorithm: str,
    setup: FederationSetup,
    settings=None,
    on_receive=None,
):
    r"""Create the server program and clients of a run (without running it).

    Args:
        algorithm: A registered algorithm (:func:`available_algorithms`).
        setup: The federation.
        settings: The algorithm's settings (an instance of its ``settings_class``, e.g.
            ``FBOFedGPConfig`` for FBO-FedGP, ``BOSettings`` for the baselines);
            defaults if ``None``.
        on_receive: Optional transport hook ``(client id, reply) -> None``.

    Returns:
        ``(server, clients, objectives)``.
    """
    spec = get_algorithm(algorithm)
    ctx = build_context(spec, setup, settings)
    if spec.secure_aggregation:
        ctx.secagg_server, ctx.secagg_clients = _secagg_roles(setup, ctx.client_ids)
    clients = {cid: spec.make_client(ctx, cid) for cid in ctx.client_ids}
    transport = InProcessTransport(clients, on_receive=on_receive)
    server = spec.make_server(ctx, transport)
    return server, clients, ctx.objectives


def run_federated(
    algorithm: str,
    setup: FederationSetup,
    settings=None,
    on_round: Callable[[int, float | None], None] | None = None,
    on_receive=None,
) -> RunResult:
    r"""Run one federated optimisation and score it.

    Args:
        algorithm: A registered algorithm (:func:`available_algorithms`):
            ``"fbo-fedgp"``, ``"local"``, ``"central"``, ``"fts"``, ``"random"``, ...
        setup: The federation (objectives or problem, clients, seed, aggregator,
            heterogeneity).
        settings: The algorithm's settings (defaults if ``None``).
        on_round: Progress hook ``(t, best value so far)`` after every round (the best
            value is ``None`` while every evaluation has failed).
        on_receive: Transport hook ``(client id, reply)`` (instrumentation).

    Returns:
        The :class:`RunResult`.
    """
    best_per_round: list[float | None] = []
    # BoTorch's fitting restarts draw from the global RNG: seed it for the run and
    # restore the caller's state afterwards
    with torch.random.fork_rng():
        torch.manual_seed(setup.seed)
        t_start = time.perf_counter()
        server, clients, objectives = build_federation(algorithm, setup, settings, on_receive)
        minimize = objectives[0].minimize

        def after_round(t: int) -> None:
            best = _best((h for c in clients.values() for h in c.history), minimize)
            best_per_round.append(None if best is None else best["value"])
            if on_round is not None:
                on_round(t, best_per_round[-1])

        server.run(on_round=after_round)
    time_s = time.perf_counter() - t_start
    return score_run(algorithm, setup, server, clients, objectives, best_per_round, time_s)


def score_run(algorithm, setup, server, clients, objectives, best_per_round, time_s) -> RunResult:
    r"""The :class:`RunResult` of a finished run (the harness reads the clients'
    ``history``; it is never part of the protocol)."""
    first = objectives[0]
    minimize = first.minimize
    optimum = first.optimal_value
    steps: dict[str, int] = {}
    failures = []
    for cid, c in sorted(clients.items()):
        for h in c.history:
            steps[h["step"]] = steps.get(h["step"], 0) + 1
            if h.get("failed"):
                failures.append({"client": cid, **h})
    best = _best((h for _, c in sorted(clients.items()) for h in c.history), minimize)
    per_client = {cid: _best(c.history, minimize) for cid, c in sorted(clients.items())}
    regret = None
    if optimum is not None:
        regret = [None if b is None else abs(b - optimum) for b in best_per_round]
    return RunResult(
        algorithm=algorithm,
        problem=first.name,
        dim=first.dim,
        optimal_value=optimum,
        best_value=None if best is None else best["value"],
        best_per_round=best_per_round,
        regret_per_round=regret,
        best_per_client={cid: None if h is None else h["value"] for cid, h in per_client.items()},
        steps=steps,
        time_s=time_s,
        ledger=server.ledger.to_dict(),
        config={
            "algorithm": algorithm,
            "setup": setup.describe(),
            "settings": asdict(server.settings),
        },
        versions=library_versions(),
        minimize=minimize,
        best_point=None if best is None else best["x"],
        failures=failures,
    )


__all__ = [
    "FederationSetup",
    "RunResult",
    "available_algorithms",
    "build_federation",
    "run_federated",
]
