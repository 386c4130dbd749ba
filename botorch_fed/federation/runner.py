r"""Run a federated optimisation end to end on the in-process transport.

:func:`run_federated` builds the clients (each with its own seeded copy of the test
function, optional per-client shifts and initial regions), the secure-aggregation
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

from botorch_fed.federation.bo_client import BOSettings
from botorch_fed.federation.central_bo import CentralClient, CentralServer
from botorch_fed.federation.fbo_fedgp import FBOFedGPClient, FBOFedGPConfig, FBOFedGPServer
from botorch_fed.federation.fts import (
    FTS_NUM_FEATURES,
    FTSClient,
    FTSServer,
    RandomFourierFeatures,
    prior_mode_lengthscale,
)
from botorch_fed.federation.independent import LocalBOClient, PacingServer, RandomSearchClient
from botorch_fed.federation.problem import ClientObjective, client_regions, client_shifts
from botorch_fed.federation.transport import InProcessTransport
from botorch_fed.test_functions import get_test_function

ALGORITHMS = ("fbo-fedgp", "local", "central", "fts", "random")


@dataclass
class FederationSetup:
    r"""The federation an algorithm runs in.

    Attributes:
        problem: Test function name (``cec2005-f1``, ``hartmann``, ...).
        dim: Dimension (``None``: the function's default).
        num_clients: Number of clients ``M``.
        seed: Seed of the run.
        aggregator: Secure-aggregation backend (FBO-FedGP): ``plaintext``, ``ckks``,
            ``masking``.
        noise_std: Additive observation noise of the function (``None``: none).
        init_regions: Draw each client's initial design from its own sub-box of the
            domain (side ``region_width``).
        region_width: Side of the initial-design sub-boxes (fraction of the domain).
        shift: Per-client shifted objectives: maximal shift per coordinate as a
            fraction of the domain width (0: one shared objective).
        crypto_seed: Seed of the key material (tests only; ``None``: OS randomness).
    """

    problem: str = "cec2005-f1"
    dim: int | None = None
    num_clients: int = 10
    seed: int = 0
    aggregator: str = "plaintext"
    noise_std: float | None = None
    init_regions: bool = False
    region_width: float = 0.5
    shift: float = 0.0
    crypto_seed: int | None = None

    def validate(self, algorithm: str) -> None:
        r"""Raise ``ValueError`` naming the first invalid setting."""
        if algorithm not in ALGORITHMS:
            raise ValueError(f"Unknown algorithm {algorithm!r}; choose one of {ALGORITHMS}.")
        if isinstance(self.num_clients, bool) or not isinstance(self.num_clients, int):
            raise ValueError(f"`num_clients` must be an integer, got {self.num_clients!r}.")
        if self.num_clients < 1:
            raise ValueError(f"`num_clients` must be >= 1, got {self.num_clients}.")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ValueError(f"`seed` must be a non-negative integer, got {self.seed!r}.")
        if algorithm == "fbo-fedgp":
            from botorch_fed.secure.registry import BACKENDS, require_backend

            if self.aggregator not in BACKENDS:
                raise ValueError(
                    f"`aggregator`={self.aggregator!r} must be one of {tuple(BACKENDS)}."
                )
            require_backend(self.aggregator)  # 'ckks' without TenSEAL: says why, names 'masking'
            minimum = 2 if self.aggregator == "plaintext" else 3
            if self.num_clients < minimum:
                raise ValueError(
                    f"`num_clients`={self.num_clients}: FBO-FedGP with the {self.aggregator!r} "
                    f"aggregator needs at least {minimum} clients (a secure sum over fewer "
                    "than 3 reveals each input to the others)."
                )
        if self.noise_std is not None and not self.noise_std >= 0:
            raise ValueError(f"`noise_std` must be non-negative, got {self.noise_std}.")
        if not 0 <= self.shift < 1:
            raise ValueError(f"`shift` must be in [0, 1), got {self.shift}.")
        if not 0 < self.region_width <= 1:
            raise ValueError(f"`region_width` must be in (0, 1], got {self.region_width}.")


@dataclass
class RunResult:
    r"""What a federated run produced (all values in the function's own convention:
    minimisation, as the CEC-2005 tables).

    Attributes:
        algorithm: The algorithm.
        problem: The test function's class name.
        dim: Dimension.
        optimal_value: The known optimum (``None`` if unknown).
        best_value: Best (lowest, noise-free) value evaluated by the federation.
        best_per_round: Best value after initialisation (index 0) and each round.
        regret_per_round: ``best_per_round - optimal_value`` (if known).
        best_per_client: Each client's own best value.
        steps: Count of steps by kind (init, local, global, ...).
        time_s: Wall time of the run.
        ledger: The ledger (stage times, bytes).
        config: Setup and algorithm settings.
        versions: Library versions.
    """

    algorithm: str
    problem: str
    dim: int
    optimal_value: float | None
    best_value: float
    best_per_round: list[float]
    regret_per_round: list[float] | None
    best_per_client: dict[int, float]
    steps: dict[str, int]
    time_s: float
    ledger: dict
    config: dict
    versions: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        r"""JSON-friendly dict."""
        out = asdict(self)
        out["best_per_client"] = {str(k): v for k, v in self.best_per_client.items()}
        return out


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


def build_federation(
    algorithm: str,
    setup: FederationSetup,
    settings: BOSettings | None = None,
    on_receive=None,
):
    r"""Create the server program and clients of a run (without running it).

    Args:
        algorithm: One of :data:`ALGORITHMS`.
        setup: The federation.
        settings: Algorithm settings (``FBOFedGPConfig`` for FBO-FedGP, else
            ``BOSettings``); defaults if ``None``.
        on_receive: Optional transport hook ``(client id, reply) -> None``.

    Returns:
        ``(server, clients, objectives)``.
    """
    setup.validate(algorithm)
    if settings is None:
        settings = FBOFedGPConfig() if algorithm == "fbo-fedgp" else BOSettings()
    if algorithm == "fbo-fedgp" and not isinstance(settings, FBOFedGPConfig):
        raise ValueError("FBO-FedGP needs `settings` of type FBOFedGPConfig.")
    settings.validate()
    M = setup.num_clients
    ids = list(range(M))
    functions = [
        get_test_function(
            setup.problem, dim=setup.dim, noise_std=setup.noise_std, seed=setup.seed * 7919 + i
        )
        for i in ids
    ]
    dim = functions[0].dim
    shifts = client_shifts(M, dim, setup.shift, seed=setup.seed + 17)
    objectives = [ClientObjective(f, s) for f, s in zip(functions, shifts, strict=True)]
    regions = (
        client_regions(M, dim, seed=setup.seed + 29, width=setup.region_width)
        if setup.init_regions
        else [None] * M
    )
    client_seeds = [setup.seed * 1_000 + 101 * i + 1 for i in ids]
    if algorithm == "fbo-fedgp":
        secagg_server, secagg_clients = _secagg_roles(setup, ids)
        clients = {
            i: FBOFedGPClient(
                i, objectives[i], settings, client_seeds[i], secagg_clients[i], regions[i]
            )
            for i in ids
        }
    elif algorithm == "fts":
        features = RandomFourierFeatures(
            dim, FTS_NUM_FEATURES, prior_mode_lengthscale(dim), seed=setup.seed + 31
        )
        clients = {
            i: FTSClient(
                i,
                objectives[i],
                settings,
                client_seeds[i],
                init_region=regions[i],
                features=features,
            )
            for i in ids
        }
    else:
        cls = {"local": LocalBOClient, "central": CentralClient, "random": RandomSearchClient}[
            algorithm
        ]
        clients = {
            i: cls(i, objectives[i], settings, client_seeds[i], init_region=regions[i]) for i in ids
        }
    transport = InProcessTransport(clients, on_receive=on_receive)
    if algorithm == "fbo-fedgp":
        server = FBOFedGPServer(transport, settings, dim, secagg_server, seed=setup.seed)
    elif algorithm == "central":
        server = CentralServer(transport, settings, dim, seed=setup.seed)
    elif algorithm == "fts":
        server = FTSServer(transport, settings, seed=setup.seed)
    else:
        server = PacingServer(transport, settings)
    return server, clients, objectives


def run_federated(
    algorithm: str,
    setup: FederationSetup,
    settings: BOSettings | None = None,
    on_round: Callable[[int, float], None] | None = None,
    on_receive=None,
) -> RunResult:
    r"""Run one federated optimisation and score it.

    Args:
        algorithm: ``"fbo-fedgp"``, ``"local"``, ``"central"``, ``"fts"`` or
            ``"random"``.
        setup: The federation (problem, clients, seed, aggregator, heterogeneity).
        settings: Algorithm settings (defaults if ``None``).
        on_round: Progress hook ``(t, best value so far)`` after every round.
        on_receive: Transport hook ``(client id, reply)`` (instrumentation).

    Returns:
        The :class:`RunResult`.
    """
    best_per_round: list[float] = []
    # BoTorch's fitting restarts draw from the global RNG: seed it for the run and
    # restore the caller's state afterwards
    with torch.random.fork_rng():
        torch.manual_seed(setup.seed)
        t_start = time.perf_counter()
        server, clients, objectives = build_federation(algorithm, setup, settings, on_receive)

        def after_round(t: int) -> None:
            best = min(h["value"] for c in clients.values() for h in c.history)
            best_per_round.append(best)
            if on_round is not None:
                on_round(t, best)

        server.run(on_round=after_round)
    time_s = time.perf_counter() - t_start
    fn = objectives[0].function
    optimum = getattr(fn, "_optimal_value", None)
    optimum = None if optimum is None or setup.shift > 0 else float(optimum)
    steps: dict[str, int] = {}
    for c in clients.values():
        for h in c.history:
            steps[h["step"]] = steps.get(h["step"], 0) + 1
    settings = server.settings
    return RunResult(
        algorithm=algorithm,
        problem=type(fn).__name__.replace("Seeded", ""),
        dim=fn.dim,
        optimal_value=optimum,
        best_value=min(best_per_round),
        best_per_round=best_per_round,
        regret_per_round=None if optimum is None else [b - optimum for b in best_per_round],
        best_per_client={
            cid: min(h["value"] for h in c.history) for cid, c in sorted(clients.items())
        },
        steps=steps,
        time_s=time_s,
        ledger=server.ledger.to_dict(),
        config={"algorithm": algorithm, "setup": asdict(setup), "settings": asdict(settings)},
        versions=library_versions(),
    )
