r"""Run a federated optimisation end to end on the in-process transport (key material is
generated client-side; the server gets only public material)."""

from __future__ import annotations

import contextlib
import os
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from botorch_fed.problems.heterogeneity import client_regions
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
from botorch_fed.protocol.declarations import Choice, check_value
from botorch_fed.protocol.registry import AlgorithmSpec, BuildContext, get_algorithm
from botorch_fed.protocol.results import RunResult, _BestTracker, library_versions, score_run
from botorch_fed.protocol.setup import PRIVATE_RANDOMNESS, FederationSetup, simulation_crypto_seed
from botorch_fed.protocol.shared_search import SharedSearchMemo
from botorch_fed.protocol.transport import InProcessTransport


def secagg_backend(setup: FederationSetup, ids: list[int]):
    r"""The backend ``setup.aggregator`` for clients ``ids`` (``plaintext`` also with two)."""
    from botorch_fed.secure import get_backend

    two = setup.aggregator == "plaintext" and len(ids) < 3
    return get_backend(
        setup.aggregator, **({"min_clients": 2, "allow_two_clients": True} if two else {})
    )


def secagg_role_seed(crypto_seed: int | None, cid: int | None) -> int | None:
    r"""Seed of the server's (``cid=None``) or client ``cid``'s secure-aggregation role."""
    return None if crypto_seed is None else crypto_seed + (0 if cid is None else 1 + cid)


def _secagg_roles(ctx: BuildContext, material=None):
    r"""Server and client roles with fresh key material, or the checkpoint's on resume
    (then with OS session randomness: reseeding would repeat nonces and masks)."""
    backend = secagg_backend(ctx.setup, ctx.client_ids)
    seed = ctx.crypto_seed if material is None else None
    if material is None:
        material = backend.setup(ctx.client_ids, seed=seed)  # client-side key generation
    server = backend.server(material.server_material, seed=secagg_role_seed(seed, None))
    clients = {
        cid: backend.client(cid, material.for_client(cid), seed=secagg_role_seed(seed, cid))
        for cid in ctx.client_ids
    }
    return server, clients, material


def build_context(
    spec: AlgorithmSpec, setup: FederationSetup, settings: Any, private_randomness: str = "os"
) -> BuildContext:
    r"""Validate ``setup`` and ``settings`` (defaults if ``None``) for ``spec`` and derive
    objectives, seeds and initial regions. ``private_randomness`` (without
    ``setup.crypto_seed``): ``"os"`` (a deployment) or ``"seed"`` (a simulation,
    :func:`~botorch_fed.protocol.setup.simulation_crypto_seed`)."""
    check_value("private_randomness", private_randomness, Choice(PRIVATE_RANDOMNESS))
    setup.validate(spec.name)
    settings = spec.settings_class() if settings is None else settings
    if type(settings) is not spec.settings_class:  # a subclass has fields it would ignore
        raise ValueError(
            f"{spec.name} needs `settings` of type {spec.settings_class.__name__}, got "
            f"{type(settings).__name__}."
        )
    settings.validate()
    objectives = setup.make_objectives()
    M, dim = len(objectives), objectives[0].dim
    regions: list[Tensor | None] = [None] * M
    if setup.init_regions:
        regions = list(client_regions(M, dim, seed=setup.seed + 29, width=setup.region_width))
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
    r"""Client ``cid`` as every runner builds it, with its own torch global RNG stream."""
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
    server = spec.make_server(ctx, InProcessTransport(clients, on_receive=on_receive))
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
    r"""``(server, clients, objectives)`` of a run, not run; the arguments are those of
    :func:`run_federated`."""
    spec = get_algorithm(algorithm)
    ctx = build_context(spec, setup, settings, private_randomness)
    return _build(spec, ctx, on_receive)[:3]


def _run_info(
    algorithm: str, setup: FederationSetup, settings, private_randomness: str = "seed"
) -> dict:
    r"""What identifies a run in its checkpoint (JSON-normalised; settings resolved)."""
    resolve = getattr(settings, "resolved", None)  # FBO-FedGP's preset fields
    info = {"algorithm": algorithm, "setup": setup.describe()}
    info["settings"] = asdict(settings if resolve is None else resolve())
    return json_normalised({**info, "private_randomness": private_randomness})


def _check_resumable(manifest: dict, info: dict, folder) -> None:
    r"""Refuse a checkpoint of another run (only ``num_rounds`` may grow) or with scores
    that do not fit its round; warn when the library versions changed."""
    round_: int = manifest["round"]  # load_checkpoint checked it
    where = f"The checkpoint in {folder}"
    best, time_s = manifest.get("best_per_round"), manifest.get("time_s")
    if not (
        isinstance(best, list)
        and len(best) == round_ + 1
        and all(v is None or type(v) in (int, float) for v in best)
    ):
        raise CheckpointError(
            f"{where}: `best_per_round` must be a list of {round_ + 1} numbers or None (rounds "
            f"0..{round_}), got {best!r:.80}."
        )
    if isinstance(time_s, bool) or not isinstance(time_s, int | float) or not time_s >= 0:
        raise CheckpointError(f"{where}: `time_s` must be >= 0, got {time_s!r}.")
    versions = manifest.get("versions")
    if versions is not None and versions != json_normalised(library_versions()):
        warnings.warn(
            f"{where} was written with other library versions ({versions}); the resumed run "
            "may differ from an uninterrupted one.",
            stacklevel=3,
        )

    def flat(run: dict) -> dict:  # only num_rounds may grow
        out = {k: run.get(k) for k in ("algorithm", "private_randomness")}
        for key in ("setup", "settings"):
            out |= {f"{key} {k}": v for k, v in dict(run.get(key) or {}).items()}
        out.pop("settings num_rounds", None)
        return out

    old, new = flat(manifest), flat(info)
    differences = [  # every difference at once, checkpoint value -> this run's
        f"{k}: {old.get(k)!r} -> {new.get(k)!r}"
        for k in sorted(old.keys() | new.keys())
        if old.get(k) != new.get(k)
    ]
    rounds = info["settings"]["num_rounds"]
    if differences:
        raise CheckpointError(
            f"{where} is of another run (it has the first value): " + "; ".join(differences) + "."
        )
    if rounds < round_:
        raise CheckpointError(f"{where} is at round {round_}, beyond `num_rounds`={rounds}.")


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
    r"""Run one federated optimisation in this process (``setup.threads`` threads) and
    score it; by default it repeats from ``setup.seed``.

    Args:
        algorithm: A registered algorithm (:func:`available_algorithms`), e.g.
            ``"fbo-fedgp"``, ``"local"``, ``"central"``, ``"fts"``, ``"random"``.
        setup: The federation.
        settings: The algorithm's settings (``None``: defaults).
        on_round: Hook ``(t, best value so far or None)`` after every round.
        on_receive: Transport hook ``(client id, reply)``.
        checkpoint: A folder to write the complete state into after every round.
        resume: A checkpoint folder to continue from, to the uninterrupted run's result
            (``num_rounds`` may grow); checkpointing continues into it by default.
        private_randomness: Without ``setup.crypto_seed``: ``"seed"`` (derived from
            ``setup.seed``) or ``"os"`` (as a deployment; the run does not repeat).

    Returns:
        The scored run (:class:`~botorch_fed.protocol.results.RunResult`: best value and
        point, regret, per-round bests, failures, ledger, privacy spend).

    Raises:
        ValueError: An unknown algorithm, or settings or a setup it refuses (naming the
            field).
        CheckpointError: ``resume`` holds no checkpoint, a corrupt one, or another run's.
    """
    spec = get_algorithm(algorithm)
    ctx = build_context(spec, setup, settings, private_randomness)  # validates both
    info = {}
    if checkpoint or resume:
        info = _run_info(algorithm, setup, ctx.settings, ctx.private_randomness)
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
        best_per_round: list[float | None] = list(manifest["best_per_round"] if manifest else [])
        elapsed = 0.0 if manifest is None else float(manifest["time_s"])
        # BoTorch's fitting restarts draw from the global RNG: seeded here, restored after
        with torch.random.fork_rng():
            torch.manual_seed(setup.seed)
            t_start = time.perf_counter()
            material = None
            if states is not None and spec.secure_aggregation:
                material = _material_from(states)
            server, clients, objectives, material = _build(spec, ctx, on_receive, material)
            if states is not None:
                _restore(server, clients, states)
            start = None if manifest is None else int(manifest["round"])  # None: a fresh run
            if checkpoint is not None:  # users that release privatised values log them first
                for cid, client in clients.items():
                    attach = getattr(client, "attach_release_log", None)
                    if attach is not None:
                        attach(Path(checkpoint) / f"client-{cid}.releases.jsonl")
            tracker = _BestTracker(clients, objectives[0].minimize)

            def after_round(t: int) -> None:
                best = tracker.update()
                best_per_round.append(None if best is None else best["value"])
                if checkpoint is not None:
                    time_s = elapsed + time.perf_counter() - t_start
                    scores = {"best_per_round": best_per_round, "time_s": time_s}
                    scores["versions"] = library_versions()
                    parties = _party_states(t, server, clients, material)
                    save_checkpoint(checkpoint, t, parties, {**info, **scores})
                if on_round is not None:
                    on_round(t, best_per_round[-1])

            server.run(on_round=after_round, start_round=start)
        time_s = elapsed + time.perf_counter() - t_start
        args = (spec.name, setup, server, clients, objectives, best_per_round, time_s)
        return score_run(*args, private_randomness=ctx.private_randomness)


@contextlib.contextmanager
def torch_threads(threads: int) -> Iterator[None]:
    r"""torch's intra-op thread count set to ``threads`` inside the block."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _party_states(t: int, server, clients, material) -> dict[str, dict]:
    r"""Each party's checkpoint state after round ``t``, with its own key material."""
    states = {}
    for cid, party in [(None, server), *sorted(clients.items())]:
        state = {"round": t, "state": party.state_dict()}
        if cid is None:
            state["torch_rng"] = torch.get_rng_state()
        if material is None:
            state["secagg_material"] = None
        else:  # checkpoints hold tensors
            data = material.server_material if cid is None else material.for_client(cid)
            data = np.frombuffer(bytes(data or b""), dtype=np.uint8).copy()
            state["secagg_material"] = torch.from_numpy(data)
        states["server" if cid is None else f"client-{cid}"] = state
    return states


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
        keys = ("round", "state", "secagg_material")
        expect_keys(name, entry, (*keys, "torch_rng") if name == "server" else keys)
    server.load_state_dict(states["server"]["state"])
    server.forget_commitments()  # the clients' roles are fresh (OS randomness): none held
    for cid, client in clients.items():
        client.load_state_dict(states[f"client-{cid}"]["state"])
    size = torch.get_rng_state().numel()
    rng = check_tensor("server", "torch_rng", states["server"]["torch_rng"], (size,), torch.uint8)
    torch.set_rng_state(rng)


__all__ = ["build_context", "build_federation", "make_client", "run_federated", "torch_threads"]
