r"""Batched experiment grids: ``R`` replications (seeds) of a federated BO experiment as
one tensor program, on CPU or GPU (:func:`run_grid`).

Every replication is the federation the protocol runner builds from the same setup and
seed (:func:`~botorch_fed.protocol.runner.build_context`: the clients' objectives --
shifts, rotations, noise streams -- their seeds and initial designs), and every client
of every replication is one member of a batch of ``B = R M``:

- ``local`` (independent BO): per round one batched GP fit of all ``B`` clients' own
  data (:func:`~botorch_fed.experiments.batched_gp.fit_batched_gp`, refitted every
  ``local_refit_every``-th round, warm-started, like each client's ``ExactGPRefitter``)
  and one batched UCB search (:func:`~botorch_fed.experiments.batched_gp.
  maximize_batched_ucb`) with the protocol's ``beta_t`` and each client's own step seed:
  on the CPU the protocol client's own search (its raw samples, starting points and
  L-BFGS-B problems) on a model fitted to the optimiser's tolerance of the client's, so
  the decisions part only where the fits' last digits do; a replication's result does not
  depend on the others (up to a fit's retry from prior samples, rare, which BoTorch draws
  for the whole batch);
- ``central`` (BO on the pooled data): per round one batched GP of every replication's
  pooled data (``R`` members, refitted every ``local_refit_every``-th round from the
  default hyperparameters, like the central server's) and each replication's batch of
  ``M`` points by sequential greedy ``qUpperConfidenceBound``
  (:func:`~botorch_fed.experiments.batched_gp.maximize_batched_qucb`: one quasi-MC
  sampler for the grid, so a replication's batch depends on the grid's first seed),
  point ``i`` to client ``i``;
- ``random``: each client's uniform points from its own generator, the protocol
  runner's decisions exactly;
- the LDP-BO algorithms on a finite domain (``gp-ucb``, ``tgp``, ``ldp-tgp``, ``ata``,
  ``ldp-ata``, ``moma``, ``ldp-moma``): each replication's learner, users and choice of
  users as the protocol builds them; the exact learners' GP posteriors on the whole domain
  as one batched factorisation a round, ATA's and MoMA's learners one replication at a
  time (:class:`~botorch_fed.experiments.batched_ldp.LDPGrid`); the users answer through
  their own handlers (evaluation, clipping, privatisation);
- ``fbo-fedgp`` (its default preset's choices): the protocol's rounds with every secure
  sum simulated in plaintext, whatever ``setup.aggregator``
  (:class:`~botorch_fed.experiments.batched_fbo.FBOGrid`): each replication's support,
  federated standardisation and trust-region fit, and every client's PIC model as one
  :class:`~botorch_fed.experiments.batched_pic.BatchedPICGP` searched as ``local``'s.

Evaluations stay per client (each client's own objective and noise stream); the
black boxes must be built-in problems whose evaluations do not fail (a batch needs the
same number of points in every member).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from botorch_fed.experiments.batched_fbo import FBOGrid
from botorch_fed.experiments.batched_gp import (
    batched_gp_state,
    fit_batched_gp,
    maximize_batched_qucb,
    maximize_batched_ucb,
)
from botorch_fed.experiments.batched_ldp import LDP_ALGORITHMS, LDPGrid, build_replications
from botorch_fed.protocol.round_budget import round_seed

#: what :func:`run_grid` runs batched
GRID_ALGORITHMS = ("local", "central", "random", "fbo-fedgp", *LDP_ALGORITHMS)


@dataclass
class GridResult:
    r"""One replication of a grid, with the fields a run's score needs.

    Attributes:
        algorithm: The algorithm.
        seed: The replication's seed.
        minimize: Whether smaller values are better.
        optimal_value: The clients' common optimum (``None``: unknown or not common).
        best_value: The best value any client evaluated (noise-free for test functions).
        best_per_round: The federation's best after the initial design and each round.
        best_per_client: Each client's own best value.
        time_s: The replication's share of the grid's wall time (total / R).
    """

    algorithm: str
    seed: int
    minimize: bool
    optimal_value: float | None
    best_value: float | None
    best_per_round: list[float | None]
    best_per_client: dict[int, float | None]
    time_s: float


def run_grid(
    algorithm: str,
    setup,
    settings=None,
    seeds: Sequence[int] | int = 1,
    device: str | torch.device | None = None,
    on_round: Callable[[int], None] | None = None,
) -> list[GridResult]:
    r"""Run ``R`` replications of ``algorithm`` as one batched program.

    Args:
        algorithm: One of :data:`GRID_ALGORITHMS`.
        setup: The federation (:class:`~botorch_fed.protocol.setup.FederationSetup`) of a
            built-in ``problem``; its ``seed`` is replaced by each replication's, and the
            grid runs on its ``threads`` torch threads (restored afterwards).
        settings: The algorithm's settings (``None``: defaults; ``acquisition="ucb"``
            only; FBO-FedGP's: :data:`~botorch_fed.experiments.batched_fbo.BATCHED_CHOICES`).
        seeds: The replications' seeds, or a count ``R`` (seeds ``setup.seed ...``).
        device: Where the models and searches run (``None``: CPU); the objectives are
            evaluated on the CPU in float64.
        on_round: Hook ``(t)`` after every round.

    Returns:
        One :class:`GridResult` per seed, in order.
    """
    from botorch_fed.algorithms import get_algorithm  # registers the algorithms

    if algorithm not in GRID_ALGORITHMS:
        raise ValueError(f"`algorithm`={algorithm!r}: the batched runner runs {GRID_ALGORITHMS}.")
    spec = get_algorithm(algorithm)
    settings = spec.settings_class() if settings is None else settings
    if getattr(settings, "acquisition", "ucb") != "ucb":
        raise ValueError(
            f"`settings.acquisition`={settings.acquisition!r}: the batched runner maximises UCB."
        )
    if isinstance(seeds, bool):
        raise ValueError(f"`seeds` must be a count or a list of seeds, got {seeds!r}.")
    seed_list = (
        list(range(setup.seed, setup.seed + seeds)) if isinstance(seeds, int) else list(seeds)
    )
    if not seed_list or len(set(seed_list)) != len(seed_list):
        raise ValueError(f"`seeds` must be distinct, at least one; got {seeds!r}.")
    device = torch.device("cpu" if device is None else device)
    threads = torch.get_num_threads()
    torch.set_num_threads(setup.threads)  # as run_federated: the setup's, restored after
    try:
        return _run(algorithm, spec, setup, settings, seed_list, device, on_round)
    finally:
        torch.set_num_threads(threads)


def _run(algorithm, spec, setup, settings, seed_list, device, on_round) -> list[GridResult]:
    r"""The body of :func:`run_grid` (arguments checked)."""
    from botorch_fed.problems.heterogeneity import ClientObjective, initial_design
    from botorch_fed.protocol.runner import build_context

    t0 = time.perf_counter()
    contexts = [  # private generators seeded as the protocol runner's simulation seeds them
        build_context(spec, dataclasses.replace(setup, seed=s), settings, "seed") for s in seed_list
    ]
    objectives = [o for ctx in contexts for o in ctx.objectives]
    if not all(isinstance(o, ClientObjective) for o in objectives):
        raise ValueError("The batched runner runs built-in problems (`setup.problem`).")
    if algorithm in LDP_ALGORITHMS:
        return _run_ldp(algorithm, spec, contexts, settings, seed_list, device, on_round, t0)
    M, d = len(contexts[0].objectives), contexts[0].dim
    seeds_b = [s for ctx in contexts for s in ctx.client_seeds]
    regions = [r for ctx in contexts for r in ctx.init_regions]
    # every member's history of reported values (minimisation sense where minimize)
    X = torch.stack(
        [initial_design(settings.num_init, d, s, r) for s, r in zip(seeds_b, regions, strict=True)]
    )
    Y, reported = _evaluate(objectives, X)
    best_rounds = [_best(reported, M, objectives[0].minimize)]
    rngs = [torch.Generator().manual_seed(s) for s in seeds_b]  # RandomSearchClient's
    state = None
    if algorithm == "fbo-fedgp":
        fbo = FBOGrid(contexts, settings, device)
        fbo.select_support(0, X)
    for t in range(1, settings.num_rounds + 1):
        if algorithm == "random":
            x = torch.cat([torch.rand(1, d, generator=g, dtype=torch.float64) for g in rngs])
        elif algorithm == "fbo-fedgp":
            x = fbo.step(t, X, Y)
        elif algorithm == "central":
            refit = state is None or (t - 1) % settings.local_refit_every == 0
            Xp, Yp = _pooled(X, M, settings.num_init), _pooled(Y, M, settings.num_init)
            model = fit_batched_gp(
                Xp.to(device), Yp.to(device), warm_start=None if refit else state,
                refit=refit, seed=round_seed(seed_list[0], t),
            )  # fmt: skip
            if refit:
                state = batched_gp_state(model)
            x = maximize_batched_qucb(
                model, settings.beta_at(t, d), M, num_restarts=settings.num_restarts,
                raw_samples=settings.raw_samples, maxiter=settings.maxiter,
                seeds=[round_seed(s, t) for s in seed_list],  # each server's round seed
            ).reshape(-1, d)  # fmt: skip
            x = x.detach().to(device="cpu", dtype=torch.float64).clamp(0.0, 1.0)
        else:
            refit = state is None or (t - 1) % settings.local_refit_every == 0
            model = fit_batched_gp(
                X.to(device), Y.to(device), warm_start=state, refit=refit,
                maxiter=settings.fit_maxiter, seed=round_seed(seed_list[0], t),
            )  # fmt: skip
            if refit:
                state = batched_gp_state(model)
            restarts = settings.num_restarts
            x, _ = maximize_batched_ucb(
                model, settings.beta_at(t, d), num_restarts=restarts,
                raw_samples=max(settings.raw_samples, 4 * restarts), maxiter=settings.maxiter,
                seeds=[round_seed(s, t) for s in seeds_b],  # each client's step seed
            )  # fmt: skip
            x = x.detach().to(device="cpu", dtype=torch.float64).clamp(0.0, 1.0)
        y, r = _evaluate(objectives, x.unsqueeze(1))
        X, Y = torch.cat([X, x.unsqueeze(1)], dim=1), torch.cat([Y, y], dim=1)
        reported = torch.cat([reported, r], dim=1)
        best_rounds.append(_best(reported, M, objectives[0].minimize))
        if on_round is not None:
            on_round(t)
    minimize = objectives[0].minimize
    per_member = reported.min(dim=1).values if minimize else reported.max(dim=1).values
    client_best = [
        {i: float(v) for i, v in enumerate(per_member[k * M : (k + 1) * M])}
        for k in range(len(seed_list))
    ]
    return _results(algorithm, seed_list, contexts, best_rounds, client_best, t0)


def _results(algorithm, seed_list, contexts, best_rounds, client_best, t0) -> list[GridResult]:
    r"""Each replication's :class:`GridResult` from the grid's bests after every round
    (``best_rounds[t][k]``) and each replication's clients' bests (``client_best[k]``)."""
    elapsed = (time.perf_counter() - t0) / len(seed_list)
    out = []
    for k, (seed, ctx) in enumerate(zip(seed_list, contexts, strict=True)):
        objs = ctx.objectives
        optimum = objs[0].optimal_value
        if any(o.optimal_value != optimum for o in objs):
            optimum = None
        out.append(GridResult(
            algorithm=algorithm, seed=seed, minimize=objs[0].minimize, optimal_value=optimum,
            best_value=best_rounds[-1][k], best_per_round=[b[k] for b in best_rounds],
            best_per_client=client_best[k], time_s=elapsed,
        ))  # fmt: skip
    return out


def _run_ldp(algorithm, spec, contexts, settings, seed_list, device, on_round, t0):
    r"""LDP-BO: one query a round in every replication
    (:class:`~botorch_fed.experiments.batched_ldp.LDPGrid`)."""
    from botorch_fed.protocol.results import _BestTracker

    servers, clients = build_replications(spec, contexts)
    grid = LDPGrid(servers, clients, device)
    minimize = contexts[0].objectives[0].minimize
    trackers = [_BestTracker(users, minimize) for users in clients]
    best_rounds = [[None if (b := tr.update()) is None else b["value"] for tr in trackers]]
    for t in range(1, settings.num_rounds + 1):
        grid.step(t)
        best_rounds.append([None if (b := tr.update()) is None else b["value"] for tr in trackers])
        if on_round is not None:
            on_round(t)
    client_best = [
        {c: None if h is None else h["value"] for c, h in tr.best_per_client.items()}
        for tr in trackers
    ]
    return _results(algorithm, seed_list, contexts, best_rounds, client_best, t0)


def _evaluate(objectives, X: Tensor) -> tuple[Tensor, Tensor]:
    r"""Each member's objective at its ``k`` points (``B x k x d``): ``(Y, reported)``,
    ``Y`` the ``B x k x 1`` values its GP learns from (maximisation) and ``reported``
    the ``B x k`` values results report; a failed evaluation raises."""
    Ys, reps = [], []
    for objective, x in zip(objectives, X, strict=True):
        # one point at a time, as a client evaluates (a batch of rows may round differently)
        pairs = [objective.evaluate(row.unsqueeze(0)) for row in x]
        observed = torch.cat([o.reshape(-1) for o, _ in pairs])
        reported = torch.cat([r.reshape(-1) for _, r in pairs])
        if not (torch.isfinite(observed).all() and torch.isfinite(reported).all()):
            raise ValueError(
                f"{objective.name} returned a non-finite value: the batched runner needs "
                "evaluations that do not fail."
            )
        Ys.append((-observed if objective.minimize else observed).reshape(-1, 1))
        reps.append(reported.reshape(-1))
    return torch.stack(Ys), torch.stack(reps)


def _pooled(Z: Tensor, M: int, num_init: int) -> Tensor:
    r"""Every replication's data pooled as the central server holds them (``R x n x k``
    from the members' ``B x n_i x k``): the initial designs client by client, then each
    round's points in client order."""
    R = Z.shape[0] // M
    Z = Z.reshape(R, M, *Z.shape[1:])
    init = Z[:, :, :num_init].reshape(R, M * num_init, -1)
    later = Z[:, :, num_init:].transpose(1, 2).reshape(R, -1, Z.shape[-1])
    return torch.cat([init, later], dim=1)


def _best(reported: Tensor, M: int, minimize: bool) -> list[float]:
    r"""Per replication, the best value over its ``M`` clients' evaluations so far."""
    per_rep = reported.reshape(-1, M * reported.shape[-1])
    best = per_rep.min(dim=1).values if minimize else per_rep.max(dim=1).values
    return best.tolist()
