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

import contextlib
import os
import platform
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

from botorch_fed.federation.checkpoint import (
    CheckpointError,
    check_tensor,
    expect_keys,
    folder_lock,
    json_normalised,
    load_checkpoint,
    prepare_folder,
    save_checkpoint,
)
from botorch_fed.federation.problem import ClientObjective, client_regions
from botorch_fed.federation.registry import (
    AlgorithmSpec,
    BuildContext,
    available_algorithms,
    get_algorithm,
)
from botorch_fed.federation.setup import (
    PRIVATE_RANDOMNESS,
    FederationSetup,
    simulation_crypto_seed,
)
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
            functions; ``None`` if every evaluation failed). With different
            objectives per client this compares values of different functions: use
            ``best_per_client`` / ``best_point_per_client`` then.
        best_point: Where (in the objective's domain).
        best_per_round: Best value after initialisation (index 0) and each round.
        regret_per_round: ``|best_per_round - optimal_value|`` (if known).
        best_per_client: Each client's own best value.
        best_point_per_client: Where each client found it.
        cumulative_regret_per_round: ``R_t = sum_{s <= t} |value_s - optimal_value|``
            over every successful evaluation up to round ``t`` (index 0: the
            initialisation), the regret of the bandit literature (LDP-BO); for an
            algorithm with one iterate per round (FedZero) ``sum_{s <= t} f(x_s) - f*``
            over its iterates; ``None`` if the optimum is unknown.
        iterate_values_per_round: The noise-free objective at the algorithm's iterate of
            each round (FedZero's ``x_t``, which no party evaluates), for built-in test
            functions; ``None`` otherwise.
        average_values_per_round: The noise-free objective at the running average of the
            iterates after each round (FedZero's output ``x^`` so far), for built-in test
            functions; ``None`` otherwise.
        privacy: The users' privacy ledgers merged (algorithms whose clients release
            privatised values: LDP-BO): per user the releases, the epsilon and delta
            spent under basic composition and the clipped values; ``None`` otherwise.
        recommendation: The algorithm's own recommended point, where it makes one
            (Co-KG's ``x^``, Alg. 1 line 10 of the slides: the best of the agents'
            local optima): ``round``, ``client``, ``x`` (objective's domain),
            ``x_unit``, the model's ``predicted_value`` and, for built-in test
            functions, the noise-free ``value`` there; ``None`` otherwise.
        steps: Count of steps by kind (init, local, global, ...).
        failures: Failed evaluations: client, round, step, point, error.
        evaluations: Every evaluation in order (client by client): client, round,
            step, point ``x`` in the objective's domain, reported ``value`` (``None``
            if it failed).
        time_s: Wall time of the run.
        ledger: The ledger (stage times, bytes).
        config: Setup and algorithm settings, and where the parties' private randomness
            came from (``private_randomness``: ``"seed"``, ``"crypto_seed"``, ``"os"``).
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
    evaluations: list[dict] = field(default_factory=list)
    best_point_per_client: dict[int, list[float] | None] = field(default_factory=dict)
    recommendation: dict | None = None
    cumulative_regret_per_round: list[float] | None = None
    privacy: dict | None = None
    iterate_values_per_round: list[float] | None = None
    average_values_per_round: list[float] | None = None

    def to_dict(self) -> dict:
        r"""JSON-friendly dict."""
        out = asdict(self)
        out["best_per_client"] = {str(k): v for k, v in self.best_per_client.items()}
        out["best_point_per_client"] = {str(k): v for k, v in self.best_point_per_client.items()}
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


class _BestTracker:
    r"""The best history entry so far, reading only the entries added since the last
    call (a run of ``T`` rounds scores in ``O(T)``, not ``O(T^2)``); ties keep the first
    entry in client order, as :func:`_best` over all histories does."""

    def __init__(self, clients: dict, minimize: bool) -> None:
        self.clients = clients
        self.minimize = minimize
        self.seen = {cid: 0 for cid in clients}
        self.best_per_client: dict[int, dict | None] = {cid: None for cid in clients}

    def update(self) -> dict | None:
        for cid, client in self.clients.items():
            new = client.history[self.seen[cid] :]
            self.seen[cid] = len(client.history)
            current = self.best_per_client[cid]
            found = _best(([] if current is None else [current]) + new, self.minimize)
            self.best_per_client[cid] = found
        return _best(
            (h for _, h in sorted(self.best_per_client.items()) if h is not None), self.minimize
        )


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


def secagg_backend(setup: FederationSetup, ids: list[int]):
    r"""The secure-aggregation backend ``setup.aggregator`` for the clients ``ids``
    (``plaintext`` also runs with two clients, for baselines and tests)."""
    from botorch_fed.secure import get_backend

    options = {}
    if setup.aggregator == "plaintext" and len(ids) < 3:
        options = {"min_clients": 2, "allow_two_clients": True}
    return get_backend(setup.aggregator, **options)


def secagg_role_seed(crypto_seed: int | None, cid: int | None) -> int | None:
    r"""The seed of a fresh run's secure-aggregation role: the server's (``cid`` None)
    or client ``cid``'s, derived from the run's ``crypto_seed``
    (:attr:`BuildContext.crypto_seed`; ``None``: OS randomness)."""
    if crypto_seed is None:
        return None
    return crypto_seed if cid is None else crypto_seed + 1 + cid


def _secagg_roles(ctx: BuildContext, material=None):
    r"""The backend's server and client roles, with fresh key material (generated
    client-side) or, on resume, the material the checkpoint holds."""
    ids, crypto_seed = ctx.client_ids, ctx.crypto_seed
    backend = secagg_backend(ctx.setup, ids)
    seeded = crypto_seed is not None
    if material is None:
        material = backend.setup(ids, seed=crypto_seed)  # client-side key generation
    else:
        # a resume: roles rebuilt from the same seed would repeat the session ids, nonces
        # and masks of the run before it, which a server could replay or subtract; the
        # key material comes from the checkpoint, the per-session randomness from the OS
        seeded = False
    server = backend.server(
        material.server_material, seed=secagg_role_seed(crypto_seed, None) if seeded else None
    )
    clients = {
        cid: backend.client(
            cid,
            material.for_client(cid),
            seed=secagg_role_seed(crypto_seed, cid) if seeded else None,
        )
        for cid in ids
    }
    return server, clients, material


def build_context(
    spec: AlgorithmSpec, setup: FederationSetup, settings, private_randomness: str = "os"
) -> BuildContext:
    r"""Validate ``setup`` and ``settings`` for ``spec`` and derive what the builders need
    (objectives, seeds, initial regions; secure-aggregation roles are added by the
    caller).

    Args:
        spec: The algorithm.
        setup: The federation.
        settings: The algorithm's settings (defaults if ``None``).
        private_randomness: Where the parties' private randomness comes from when
            ``setup.crypto_seed`` is ``None``: ``"os"`` (a deployment: each party's own
            OS entropy) or ``"seed"`` (a simulation: derived from ``setup.seed`` by
            :func:`~botorch_fed.federation.setup.simulation_crypto_seed`).
    """
    if private_randomness not in PRIVATE_RANDOMNESS:
        raise ValueError(
            f"`private_randomness`={private_randomness!r} must be one of {PRIVATE_RANDOMNESS}."
        )
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
    ctx = BuildContext(
        setup=setup,
        settings=settings,
        objectives=objectives,
        dim=dim,
        client_seeds=[setup.seed * 1_000 + 101 * i + 1 for i in range(M)],
        init_regions=regions,
    )
    if setup.crypto_seed is not None:
        ctx.crypto_seed, ctx.private_randomness = setup.crypto_seed, "crypto_seed"
    elif private_randomness == "seed":
        ctx.crypto_seed, ctx.private_randomness = simulation_crypto_seed(setup.seed), "seed"
    if spec.check is not None:
        spec.check(ctx)
    return ctx


def make_client(spec: AlgorithmSpec, ctx: BuildContext, cid: int):
    r"""Client ``cid`` of a run, as every runner builds it (in process, a Flower party):
    ``spec.make_client`` with the client's own stream of torch's global random numbers
    (:meth:`~botorch_fed.federation.roles.FederatedClient.own_torch_rng`)."""
    client = spec.make_client(ctx, cid)
    own = getattr(client, "own_torch_rng", None)
    if own is not None:
        own(ctx.client_seeds[cid] * 7 + 3)
    return client


def _build(spec, ctx: BuildContext, on_receive, material=None):
    if spec.secure_aggregation:
        ctx.secagg_server, ctx.secagg_clients, material = _secagg_roles(ctx, material)
    clients = {cid: make_client(spec, ctx, cid) for cid in ctx.client_ids}
    transport = InProcessTransport(clients, on_receive=on_receive)
    server = spec.make_server(ctx, transport)
    for cid, client in clients.items():  # what the harness relies on (AlgorithmSpec)
        if not isinstance(getattr(client, "history", None), list):
            raise TypeError(
                f"{spec.name}: client {cid} ({type(client).__name__}) has no `history` list "
                "(make_client must build clients like BOClient)."
            )
    return server, clients, ctx.objectives, material


def build_federation(
    algorithm: str,
    setup: FederationSetup,
    settings=None,
    on_receive=None,
    private_randomness: str = "seed",
):
    r"""Create the server program and clients of a run (without running it).

    Args:
        algorithm: A registered algorithm (:func:`available_algorithms`).
        setup: The federation.
        settings: The algorithm's settings (an instance of its ``settings_class``, e.g.
            ``FBOFedGPConfig`` for FBO-FedGP, ``BOSettings`` for the baselines);
            defaults if ``None``.
        on_receive: Optional transport hook ``(client id, reply) -> None``.
        private_randomness: Without ``setup.crypto_seed``: ``"seed"`` derives every
            party's private randomness from ``setup.seed`` (a simulation repeats from
            its seed), ``"os"`` draws it from the OS as a deployment does.

    Returns:
        ``(server, clients, objectives)``.
    """
    spec = get_algorithm(algorithm)
    ctx = build_context(spec, setup, settings, private_randomness)
    server, clients, objectives, _ = _build(spec, ctx, on_receive)
    return server, clients, objectives


def _run_info(
    algorithm: str, setup: FederationSetup, settings, private_randomness: str = "seed"
) -> dict:
    r"""What identifies a run in its checkpoint (JSON-normalised): the algorithm, the
    setup, the resolved settings and where the parties' private randomness comes from
    (:attr:`BuildContext.private_randomness`)."""
    return json_normalised(
        {
            "algorithm": algorithm,
            "setup": setup.describe(),
            "settings": asdict(_resolved(settings)),
            "private_randomness": private_randomness,
        }
    )


def _resolved(settings):
    r"""The settings as the algorithm runs them: a settings class whose fields may be left
    to a preset (FBO-FedGP's) resolves them with ``resolved()``."""
    resolve = getattr(settings, "resolved", None)
    return settings if resolve is None else resolve()


def _check_resumable(manifest: dict, info: dict, folder) -> None:
    r"""Refuse a checkpoint of another run (only ``num_rounds`` may grow; the private
    randomness must come from where it came from) or a manifest whose scores do not fit
    its round; warn when the libraries changed (a resumed run is then not bit for bit
    the uninterrupted one). A setup recorded without ``threads`` ran under one thread
    (the only count before the setup had the field); one without ``private_randomness``
    resumes under this run's."""
    round_, best, time_s = (manifest.get(k) for k in ("round", "best_per_round", "time_s"))
    if not isinstance(best, list) or len(best) != round_ + 1:
        raise CheckpointError(
            f"The checkpoint in {folder}: `best_per_round` must be a list of {round_ + 1} "
            f"values (rounds 0..{round_}), got {best!r:.80}."
        )
    if not all(v is None or (isinstance(v, int | float) and not isinstance(v, bool)) for v in best):
        raise CheckpointError(f"The checkpoint in {folder}: `best_per_round` holds non-numbers.")
    if isinstance(time_s, bool) or not isinstance(time_s, int | float) or not time_s >= 0:
        raise CheckpointError(f"The checkpoint in {folder}: `time_s` must be >= 0, got {time_s!r}.")
    versions = manifest.get("versions")
    if versions is not None and versions != json_normalised(library_versions()):
        warnings.warn(
            f"The checkpoint in {folder} was written with other library versions "
            f"({versions}); the resumed run may differ from an uninterrupted one.",
            stacklevel=3,
        )
    differences = []  # every difference at once, checkpoint value -> this run's
    if manifest.get("algorithm") != info["algorithm"]:
        differences.append(f"algorithm: {manifest.get('algorithm')!r} -> {info['algorithm']!r}")
    # a manifest without the field (written before it was recorded) takes this run's
    recorded = manifest.get("private_randomness", info["private_randomness"])
    if recorded != info["private_randomness"]:
        differences.append(
            f"private_randomness: {recorded!r} -> {info['private_randomness']!r} (where "
            "the parties' keys, masks and noise come from; resume with the checkpoint's)"
        )
    for key in ("setup", "settings"):
        old, new = dict(manifest.get(key) or {}), dict(info[key])
        if key == "setup":
            old.setdefault("threads", 1)
        if key == "settings":
            old.pop("num_rounds", None)
            new_rounds = new.pop("num_rounds")
        differences += [
            f"{key} {k}: {old.get(k)!r} -> {new.get(k)!r}"
            for k in sorted(old.keys() | new.keys())
            if old.get(k) != new.get(k)
        ]
    if differences:
        raise CheckpointError(
            f"The checkpoint in {folder} is of another run (it has the first value): "
            + "; ".join(differences)
            + "."
        )
    if new_rounds < manifest["round"]:
        raise CheckpointError(
            f"The checkpoint in {folder} is at round {manifest['round']}, beyond "
            f"`num_rounds`={new_rounds}."
        )


def run_federated(
    algorithm: str,
    setup: FederationSetup,
    settings=None,
    on_round: Callable[[int, float | None], None] | None = None,
    on_receive=None,
    checkpoint: str | os.PathLike | None = None,
    resume: str | os.PathLike | None = None,
    private_randomness: str = "seed",
) -> RunResult:
    r"""Run one federated optimisation and score it.

    The run holds every party in this process and runs under ``setup.threads`` torch
    threads (the caller's count is restored afterwards). By default it repeats from
    ``setup.seed``: every party's private randomness (key material, masks, nonces,
    centre noise, Laplace noise, failed-evaluation redraws) is derived from it unless
    ``setup.crypto_seed`` is given, so two runs with the same arguments give the same
    result (timings aside).

    Args:
        algorithm: A registered algorithm (:func:`available_algorithms`):
            ``"fbo-fedgp"``, ``"local"``, ``"central"``, ``"fts"``, ``"random"``, ...
        setup: The federation (objectives or problem, clients, seed, aggregator,
            heterogeneity).
        settings: The algorithm's settings (defaults if ``None``).
        on_round: Progress hook ``(t, best value so far)`` after every round run (the
            best value is ``None`` while every evaluation has failed).
        on_receive: Transport hook ``(client id, reply)`` (instrumentation).
        checkpoint: A folder to write the complete state into after every round
            (:mod:`~botorch_fed.federation.checkpoint`).
        resume: A checkpoint folder to continue from: the run goes on after the
            checkpoint's round and ends exactly as the uninterrupted run would (same
            algorithm, setup and settings required; ``num_rounds`` may be larger to
            extend a finished run). Keeps checkpointing into it unless
            ``checkpoint`` names another folder.
        private_randomness: Without ``setup.crypto_seed``: ``"seed"`` (default)
            derives the parties' private randomness from ``setup.seed``; ``"os"`` draws
            it from the OS, as the parties of a deployment do (the run then does not
            repeat).

    Returns:
        The :class:`RunResult`.

    Raises:
        CheckpointError: ``resume`` holds no checkpoint, a corrupt one, or one of
            another run (nothing is loaded then).
    """
    spec = get_algorithm(algorithm)
    ctx = build_context(spec, setup, settings, private_randomness)  # validates both
    settings = ctx.settings
    info = {}
    if checkpoint or resume:
        info = _run_info(algorithm, setup, settings, ctx.private_randomness)
    manifest, states = None, None
    if resume is not None:
        manifest, states = load_checkpoint(resume)  # verified, all in memory
        _check_resumable(manifest, info, resume)
        checkpoint = resume if checkpoint is None else checkpoint
    if checkpoint is not None:
        checkpoint = prepare_folder(checkpoint, resuming_from=resume)
    with contextlib.ExitStack() as stack:
        if checkpoint is not None:
            stack.enter_context(folder_lock(checkpoint))
        stack.enter_context(torch_threads(setup.threads))
        return _run(spec, ctx, setup, on_round, on_receive, checkpoint, info, manifest, states)


@contextlib.contextmanager
def torch_threads(threads: int) -> Iterator[None]:
    r"""torch's intra-op thread count set to ``threads`` inside the block, the caller's
    after it (some algorithms' decisions differ in the last bits between thread
    counts, so a run gets the same count wherever it runs)."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _run(spec, ctx, setup, on_round, on_receive, checkpoint, info, manifest, states) -> RunResult:
    algorithm = spec.name
    best_per_round: list[float | None] = (
        [] if manifest is None else list(manifest["best_per_round"])
    )
    elapsed = 0.0 if manifest is None else float(manifest["time_s"])
    # BoTorch's fitting restarts draw from the global RNG: seed it for the run and
    # restore the caller's state afterwards
    with torch.random.fork_rng():
        torch.manual_seed(setup.seed)
        t_start = time.perf_counter()
        material = None
        if states is not None and spec.secure_aggregation:
            material = _material_from(states)
        server, clients, objectives, material = _build(spec, ctx, on_receive, material)
        start = None  # a fresh run: initialisation first
        if states is not None:
            _restore(server, clients, states)
            start = int(manifest["round"])
        if checkpoint is not None:  # users that release privatised values log them first
            for cid, client in clients.items():
                attach = getattr(client, "attach_release_log", None)
                if attach is not None:
                    attach(Path(checkpoint) / f"client-{cid}.releases.jsonl")
        minimize = objectives[0].minimize
        tracker = _BestTracker(clients, minimize)

        def after_round(t: int) -> None:
            best = tracker.update()
            best_per_round.append(None if best is None else best["value"])
            if checkpoint is not None:
                _save(
                    checkpoint,
                    t,
                    server,
                    clients,
                    material,
                    info,
                    best_per_round,
                    elapsed + time.perf_counter() - t_start,
                )
            if on_round is not None:
                on_round(t, best_per_round[-1])

        server.run(on_round=after_round, start_round=start)
    time_s = elapsed + time.perf_counter() - t_start
    return score_run(
        algorithm,
        setup,
        server,
        clients,
        objectives,
        best_per_round,
        time_s,
        private_randomness=ctx.private_randomness,
    )


def _party_states(t: int, server, clients, material) -> dict[str, dict]:
    r"""Each party's checkpoint state after round ``t``; its own key material included."""
    states = {
        "server": {
            "round": t,
            "state": server.state_dict(),
            "torch_rng": torch.get_rng_state(),
            "secagg_material": _bytes_tensor(material, None),
        }
    }
    for cid, client in sorted(clients.items()):
        states[f"client-{cid}"] = {
            "round": t,
            "state": client.state_dict(),
            "secagg_material": _bytes_tensor(material, cid),
        }
    return states


def _bytes_tensor(material, cid: int | None) -> torch.Tensor | None:
    r"""A party's key material as a ``uint8`` tensor (checkpoints hold tensors only)."""
    if material is None:
        return None
    data = material.server_material if cid is None else material.for_client(cid)
    if not data:
        return torch.empty(0, dtype=torch.uint8)
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).clone()


def _save(folder, t, server, clients, material, info, best_per_round, time_s) -> None:
    save_checkpoint(
        folder,
        t,
        _party_states(t, server, clients, material),
        {
            **info,
            "best_per_round": best_per_round,
            "time_s": time_s,
            "versions": library_versions(),
        },
    )


def _material_from(states: dict[str, dict]):
    from botorch_fed.secure import BackendSetup

    def material_of(name):
        value = states[name].get("secagg_material")
        if value is None:
            raise CheckpointError(f"The {name} file holds no secure-aggregation key material.")
        return check_tensor(name, "secagg_material", value, (None,), torch.uint8).numpy().tobytes()

    clients = {int(n.split("-")[1]): material_of(n) for n in states if n.startswith("client-")}
    return BackendSetup(server_material=material_of("server"), client_material=clients)


def _restore(server, clients, states: dict[str, dict]) -> None:
    r"""Load every party's state (fresh objects: on an error they are discarded)."""
    names = {f"client-{cid}" for cid in clients} | {"server"}
    if set(states) != names:
        raise CheckpointError(
            f"The checkpoint holds parties {sorted(states)}, this run has {sorted(names)}."
        )
    for name, entry in states.items():
        expect_keys(
            name,
            entry,
            ("round", "state", "torch_rng", "secagg_material")
            if name == "server"
            else ("round", "state", "secagg_material"),
        )
    server.load_state_dict(states["server"]["state"])
    for cid, client in clients.items():
        client.load_state_dict(states[f"client-{cid}"]["state"])
    size = torch.get_rng_state().numel()
    rng = check_tensor("server", "torch_rng", states["server"]["torch_rng"], (size,), torch.uint8)
    torch.set_rng_state(rng)


def _objectives_name(objectives) -> str:
    r"""The objectives' common name, or a list of the distinct names."""
    names = list(dict.fromkeys(o.name for o in objectives))
    return names[0] if len(names) == 1 else f"{len(names)} objectives: " + ", ".join(names)


def score_run(
    algorithm,
    setup,
    server,
    clients,
    objectives,
    best_per_round,
    time_s,
    private_randomness: str = "os",
) -> RunResult:
    r"""The :class:`RunResult` of a finished run (the harness reads the clients'
    ``history``; it is never part of the protocol); ``private_randomness`` is
    :attr:`BuildContext.private_randomness`, recorded in its ``config``."""
    first = objectives[0]
    minimize = first.minimize
    optimum = first.optimal_value
    steps: dict[str, int] = {}
    failures, evaluations = [], []
    for cid, c in sorted(clients.items()):
        for h in c.history:
            steps[h["step"]] = steps.get(h["step"], 0) + 1
            evaluations.append({"client": cid, **h})
            if h.get("failed"):
                failures.append({"client": cid, **h})
    best = _best((h for _, c in sorted(clients.items()) for h in c.history), minimize)
    per_client = {cid: _best(c.history, minimize) for cid, c in sorted(clients.items())}
    regret = cumulative = None
    iterate_values, average_values = _iterate_scores(server, objectives)
    if optimum is not None:
        regret = [None if b is None else abs(b - optimum) for b in best_per_round]
        if iterate_values is not None:  # an iterate per round (FedZero): sum f(x_t) - f*
            gaps = [0.0] + [abs(v - optimum) for v in iterate_values]
            cumulative = np.cumsum(gaps).tolist()
        else:
            cumulative = _cumulative_regret(evaluations, optimum, len(best_per_round))
    return RunResult(
        algorithm=algorithm,
        problem=_objectives_name(objectives),
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
            "private_randomness": private_randomness,
        },
        versions=library_versions(),
        minimize=minimize,
        best_point=None if best is None else best["x"],
        failures=failures,
        evaluations=evaluations,
        best_point_per_client={cid: None if h is None else h["x"] for cid, h in per_client.items()},
        recommendation=_scored_recommendation(server, objectives),
        cumulative_regret_per_round=cumulative,
        privacy=_privacy(clients),
        iterate_values_per_round=iterate_values,
        average_values_per_round=average_values,
    )


def _iterate_scores(server, objectives) -> tuple[list[float] | None, list[float] | None]:
    r"""The noise-free value at each of the server's iterates and at their running
    average (FedZero's output so far), for built-in test functions; ``(None, None)``
    otherwise. The harness scores them; no party evaluates them."""
    iterates = getattr(server, "iterates", None)
    objective = objectives[0]
    if not iterates or not isinstance(objective, ClientObjective):
        return None, None
    X = torch.tensor(iterates, dtype=torch.float64)
    counts = torch.arange(1, len(X) + 1, dtype=torch.float64).unsqueeze(-1)
    running = torch.cumsum(X, 0) / counts
    values = objective.value(torch.cat([X, running]).clamp(0.0, 1.0)).reshape(-1)
    return [float(v) for v in values[: len(X)]], [float(v) for v in values[len(X) :]]


def _cumulative_regret(evaluations: list[dict], optimum: float, rounds: int) -> list[float]:
    r"""``R_t`` for ``t = 0 .. rounds - 1`` from the successful evaluations."""
    per_round = [0.0] * rounds
    for e in evaluations:
        if e.get("value") is not None and 0 <= e["round"] < rounds:
            per_round[e["round"]] += abs(e["value"] - optimum)
    return np.cumsum(per_round).tolist()


def _privacy(clients: dict) -> dict | None:
    r"""The clients' own privacy ledgers, merged (``None`` if none keeps one)."""
    ledgers = [getattr(c, "privacy_ledger", None) for _, c in sorted(clients.items())]
    ledgers = [ledger for ledger in ledgers if ledger is not None]
    if not ledgers:
        return None
    merged = ledgers[0]
    for ledger in ledgers[1:]:
        merged = merged.merge(ledger)
    return merged.to_dict()


def _scored_recommendation(server, objectives) -> dict | None:
    r"""The server's recommendation with, for built-in test functions (whose noise-free
    value is known without spending an evaluation), its ``value`` there."""
    rec = getattr(server, "recommendation", None)
    if rec is None:
        return None
    rec = dict(rec)
    objective = objectives[rec["client"]] if len(objectives) > 1 else objectives[0]
    if isinstance(objective, ClientObjective):
        x = torch.tensor([rec["x_unit"]], dtype=torch.float64)
        rec["value"] = float(objective.value(x).reshape(-1)[0])
    return rec


__all__ = [
    "FederationSetup",
    "RunResult",
    "available_algorithms",
    "build_federation",
    "run_federated",
]
