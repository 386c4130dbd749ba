r"""Run a federated optimisation end to end on the in-process transport.

:func:`run_federated` looks the algorithm up in the registry
(:mod:`~botorch_fed.protocol.registry`), builds the clients (each with its
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
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from botorch_fed.protocol.checkpoint import (
    CheckpointError,
    check_tensor,
    expect_keys,
    folder_lock,
    json_normalised,
    load_checkpoint,
    prepare_folder,
    save_checkpoint,
)
from botorch_fed.protocol.problem import client_regions
from botorch_fed.protocol.registry import (
    AlgorithmSpec,
    BuildContext,
    get_algorithm,
)
from botorch_fed.protocol.results import RunResult, _BestTracker, library_versions, score_run
from botorch_fed.protocol.setup import (
    PRIVATE_RANDOMNESS,
    FederationSetup,
    simulation_crypto_seed,
)
from botorch_fed.protocol.shared_search import SharedSearchMemo
from botorch_fed.protocol.transport import InProcessTransport


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
    spec: AlgorithmSpec, setup: FederationSetup, settings: Any, private_randomness: str = "os"
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
            :func:`~botorch_fed.protocol.setup.simulation_crypto_seed`).
    """
    if private_randomness not in PRIVATE_RANDOMNESS:
        raise ValueError(
            f"`private_randomness`={private_randomness!r} must be one of {PRIVATE_RANDOMNESS}."
        )
    setup.validate(spec.name)
    if settings is None:
        settings = spec.settings_class()
    if type(settings) is not spec.settings_class:  # a subclass has fields it would ignore
        raise ValueError(
            f"{spec.name} needs `settings` of type {spec.settings_class.__name__}, got "
            f"{type(settings).__name__}."
        )
    settings.validate()
    objectives = setup.make_objectives()
    M = len(objectives)
    dim = objectives[0].dim
    regions: list[Tensor | None] = (
        list(client_regions(M, dim, seed=setup.seed + 29, width=setup.region_width))
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
    (:meth:`~botorch_fed.protocol.client.FederatedClient.own_torch_rng`)."""
    client = spec.make_client(ctx, cid)
    own = getattr(client, "own_torch_rng", None)
    if own is not None:
        own(ctx.client_seeds[cid] * 7 + 3)
    return client


def _build(spec, ctx: BuildContext, on_receive, material=None):
    if spec.secure_aggregation:
        ctx.secagg_server, ctx.secagg_clients, material = _secagg_roles(ctx, material)
    clients = {cid: make_client(spec, ctx, cid) for cid in ctx.client_ids}
    memo = SharedSearchMemo()  # the run's clients share one process: a search runs once
    for client in clients.values():
        if hasattr(client, "search_memo"):
            client.search_memo = memo
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
            ``FBOFedGPSettings`` for FBO-FedGP, ``BOSettings`` for the baselines);
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
    the uninterrupted one)."""
    round_: int = manifest["round"]  # load_checkpoint checked it
    best, time_s = manifest.get("best_per_round"), manifest.get("time_s")
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
    recorded = manifest.get("private_randomness")
    if recorded != info["private_randomness"]:
        differences.append(
            f"private_randomness: {recorded!r} -> {info['private_randomness']!r} (where "
            "the parties' keys, masks and noise come from; resume with the checkpoint's)"
        )
    for key in ("setup", "settings"):
        old, new = dict(manifest.get(key) or {}), dict(info[key])
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
            (:mod:`~botorch_fed.protocol.checkpoint`).
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


__all__ = ["build_context", "build_federation", "make_client", "run_federated", "torch_threads"]
