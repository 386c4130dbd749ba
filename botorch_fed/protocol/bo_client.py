r"""What every Bayesian-optimisation client of a federation has in common.

A :class:`BOClient` holds private unit-cube data, evaluates its black box, keeps a local
GP and maximises UCB, log-EI, Thompson sampling or KG on any model it is given.
"""

from __future__ import annotations

import functools
import math
import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, cast

import torch
from botorch.acquisition.acquisition import AcquisitionFunction
from botorch.models import SingleTaskGP
from botorch.models.model import Model
from torch import Tensor

from botorch_fed.acquisition import (
    make_step_acquisition,
    maximize_step_acquisition,
    propose_step_candidate,
    ranked_step_candidates,
)
from botorch_fed.acquisition.step_acquisition import StepKind
from botorch_fed.models import ExactGPRefitter, check_exact_gp_state, exact_gp_state, fit_exact_gp
from botorch_fed.privacy import KeyStream
from botorch_fed.problems.heterogeneity import initial_design
from botorch_fed.problems.objectives import Objective
from botorch_fed.protocol.checkpoint import (
    CheckpointError,
    check_history,
    check_tensor,
    split_state,
)
from botorch_fed.protocol.client import FederatedClient
from botorch_fed.protocol.declarations import (
    Choice,
    Declared,
    Int,
    Real,
    check_settings,
    check_value,
    declare,
    handles,
)
from botorch_fed.protocol.evaluation import EVALUATION_ERRORS, evaluate_point
from botorch_fed.protocol.round_budget import RoundBudget, round_seed

ACQUISITIONS = ("ucb", "ei", "ts", "kg")


@dataclass
class BOSettings:
    r"""Settings shared by the BO clients of every algorithm.

    Attributes:
        num_init: Initial design size per client.
        num_rounds: Number of rounds ``T``.
        acquisition: ``"ucb"`` (GP-UCB), ``"ei"`` (log-EI), ``"ts"`` (Thompson) or
            ``"kg"`` (one-shot knowledge gradient).
        beta: UCB ``beta``; ``None`` uses ``beta_t = 0.2 d log(2t)``.
        local_refit_every: Refit the local GP's hyperparameters every ``K``-th update.
        fit_maxiter: L-BFGS-B iterations of a (warm-started) local refit.
        num_restarts: ``optimize_acqf`` restarts.
        raw_samples: ``optimize_acqf`` raw samples.
        maxiter: ``optimize_acqf`` L-BFGS-B iterations.
        ts_candidates: Candidate-set size of discrete Thompson sampling.
        num_fantasies: Fantasies of the knowledge gradient (``acquisition="kg"``).
    """

    num_init: Annotated[int, Int(1)] = 4
    num_rounds: Annotated[int, Int(1)] = 50
    acquisition: Annotated[str, Choice(ACQUISITIONS)] = "ucb"
    beta: Annotated[float | None, Real(0, optional=True)] = None
    local_refit_every: Annotated[int, Int(1)] = 5
    fit_maxiter: Annotated[int, Int(1)] = 50
    num_restarts: Annotated[int, Int(1)] = 2
    raw_samples: Annotated[int, Int(1)] = 64
    maxiter: Annotated[int, Int(1)] = 50
    ts_candidates: Annotated[int, Int(1)] = 512
    num_fantasies: Annotated[int, Int(1)] = 64

    def validate(self) -> None:
        r"""Raise ``ValueError`` naming the first setting outside its domain."""
        check_settings(self)

    def beta_at(self, t: int, dim: int) -> float:
        r"""The UCB ``beta`` of round ``t`` (``0.2 d log(2t)`` unless fixed)."""
        return self.beta if self.beta is not None else 0.2 * dim * math.log(2 * max(t, 1))


MIN_DISTANCE = 0.05  # in the unit cube: closer points count as one

# torch's CPU generator state (``Generator.get_state``): the seed (8 bytes), ``left``,
# ``seeded`` (4 bytes each), ``next`` (8 bytes), then the Mersenne Twister's 624 32-bit
# words, each stored in 8 native-endian bytes, then the cached normal samples
_MT_WORDS = 624
_MT_OFFSET = 24
_MT_STATE_BYTES = 5056


def private_generator(private_seed: int | None = None) -> torch.Generator:
    r"""A CPU ``torch.Generator`` whose whole Mersenne Twister state (not a 32-bit seed a
    server could enumerate) comes from a :class:`~botorch_fed.privacy.KeyStream` of the
    OS (``private_seed=None``) or of the integer ``private_seed``.

    Raises:
        TypeError: ``private_seed`` is not an integer.
        RuntimeError: torch's generator state does not have the layout filled here.
    """
    if isinstance(private_seed, bool):
        raise TypeError(f"`private_seed` must be an integer or None, got {private_seed!r}.")
    seed = None if private_seed is None else operator.index(private_seed)
    stream = KeyStream() if seed is None else KeyStream.from_seed(seed)
    # the top 32 bits of each uniform's 52: (k + 1/2) / 2^52 * 2^32 floors to k >> 20
    words = (stream.uniform(_MT_WORDS) * 2.0**32).floor().to(torch.int64)
    generator = torch.Generator().manual_seed(0)
    state = generator.get_state()
    layout = state.numel() == _MT_STATE_BYTES
    if layout:  # manual_seed(0) puts the words 0, 1, 1812433255, ... in the slots
        slots = state[_MT_OFFSET : _MT_OFFSET + 8 * _MT_WORDS].view(torch.int64)
        layout = slots[:3].tolist() == [0, 1, 1812433255]
    if not layout:
        raise RuntimeError(
            f"torch {torch.__version__}'s CPU generator state ({state.numel()} bytes) does not "
            f"have the layout the private generator fills ({_MT_STATE_BYTES} bytes)."
        )
    slots.copy_(words)  # the view writes into `state`
    generator.set_state(state)
    return generator


@declare("init", relayed=True)
class Init(Declared):
    r"""Round 0: evaluate the initial design (no fields)."""


class BOClient(RoundBudget, FederatedClient):
    r"""A client that evaluates its black box (at most ``num_init + num_rounds`` points:
    round handlers call :meth:`accept_round` first) and runs BO steps on given models.

    Args:
        client_id: The id.
        objective: The client's black box.
        settings: The BO settings.
        seed: The client's public seed (initial design, acquisition searches).
        secagg: The client's secure-aggregation role (or ``None``).
        init_region: Optional ``2 x d`` sub-box of the unit cube for the initial design.
        evaluation_errors: ``"record"`` or ``"raise"``.
        private_seed: Seed of :func:`private_generator` (``None``: OS randomness): its
            draws after failures change nothing the server observes.
    """

    def __init__(
        self,
        client_id: int,
        objective: Objective,
        settings: BOSettings,
        seed: int,
        secagg=None,
        init_region: Tensor | None = None,
        evaluation_errors: str = "record",
        private_seed: int | None = None,
    ) -> None:
        super().__init__(client_id, secagg)
        settings.validate()
        if not isinstance(objective, Objective):
            got = type(objective).__name__
            raise ValueError(
                f"`objective` must be an Objective (CallableObjective, ...), got {got}."
            )
        check_value("evaluation_errors", evaluation_errors, Choice(EVALUATION_ERRORS))
        self.objective, self.settings, self.dim = objective, settings, objective.dim
        self.evaluation_errors = evaluation_errors
        self.seed, self.init_region = int(seed), init_region
        self.rng = torch.Generator().manual_seed(self.seed)
        self.private_rng = private_generator(private_seed)
        self.bounds = torch.stack([torch.zeros(self.dim), torch.ones(self.dim)]).double()
        self.X = torch.empty(0, self.dim, dtype=torch.float64)
        self.Y = torch.empty(0, 1, dtype=torch.float64)
        self.failed_X = torch.empty(0, self.dim, dtype=torch.float64)  # never sent
        self.history: list[dict] = []  # harness-only record, never sent
        self._initialized = False  # the initial design was asked for (once)
        # a memo of searches the run's clients share in one process (shared_search)
        self.search_memo: Callable[..., Tensor] | None = None
        self._local_model: SingleTaskGP | None = None
        self._local_fitter = ExactGPRefitter(
            refit_every=settings.local_refit_every, maxiter=settings.fit_maxiter, seed=self.seed
        )

    def evaluate(self, x: Tensor, t: int, step: str) -> bool:
        r"""Evaluate ``x`` (``1 x d``), add it to the data and record it; returns whether
        it succeeded (a failed point is recorded only, or raises with ``"raise"``)."""
        x = x.detach().to(torch.float64)
        point = self.objective.to_domain(x).squeeze(0).tolist()
        entry = {"round": t, "step": step, "x": point}
        with self.timed("evaluation"):
            entry, observed = evaluate_point(
                self.objective, x, entry, self.evaluation_errors, self.client_id
            )
        self.history.append(entry)
        if observed is None:
            self.failed_X = torch.cat([self.failed_X, x])
            return False
        y = observed.reshape(1, 1)
        self.X = torch.cat([self.X, x])
        self.Y = torch.cat([self.Y, -y if self.objective.minimize else y])
        self._local_model = None
        return True

    @property
    def failures(self) -> list[dict]:
        r"""The failed evaluations (round, step, point in the user's domain, error)."""
        return [h for h in self.history if h.get("failed")]

    _STATE = tuple(
        "X Y failed_X history rng private_rng local_fitter local_model objective".split()
    )

    def state_dict(self) -> dict:
        r"""The client's state between rounds (data, history, generators, GP, objective)."""
        state = super().state_dict()
        state |= {k: getattr(self, k).clone() for k in ("X", "Y", "failed_X")}
        state |= {k: getattr(self, k).get_state() for k in ("rng", "private_rng")}
        state["history"] = [dict(h) for h in self.history]
        state["local_fitter"] = self._local_fitter.state_dict()
        model = self._local_model
        state["local_model"] = None if model is None else exact_gp_state(model)
        state["objective"] = self.objective.state_dict()
        return state

    def load_state_dict(self, state: dict) -> None:
        r"""Restore :meth:`state_dict` (of a client with the same setup)."""
        owner = f"Client {self.client_id}"
        own, rest = split_state(owner, state, self._STATE)
        super().load_state_dict(rest)
        X = check_tensor(owner, "X", own["X"], (None, self.dim))
        Y = check_tensor(owner, "Y", own["Y"], (len(X), 1))
        failed = check_tensor(owner, "failed_X", own["failed_X"], (None, self.dim))
        history = check_history(owner, own["history"])
        if sum(1 for h in history if not h.get("failed")) != len(X):
            raise CheckpointError(f"{owner}: `history` does not match the {len(X)} data points.")
        self.X, self.Y, self.failed_X = X.clone(), Y.clone(), failed.clone()
        self.history = history
        self._initialized = bool(self.history)
        _restore_generator(owner, "rng", self.rng, own["rng"])
        _restore_generator(owner, "private_rng", self.private_rng, own["private_rng"])
        try:
            fitter = own["local_fitter"]
            if isinstance(fitter, dict) and fitter.get("state") is not None:
                check_exact_gp_state(fitter["state"], self.dim, "local_fitter.state")
            if own["local_model"] is not None:
                check_exact_gp_state(own["local_model"], self.dim, "local_model")
            self._local_fitter.load_state_dict(fitter)
        except ValueError as exc:
            raise CheckpointError(f"{owner}: {exc}") from exc
        self.objective.load_state_dict(own["objective"])
        self._local_model = None
        if (gp := own["local_model"]) is not None:  # the model the uninterrupted run holds now
            self._local_model = fit_exact_gp(self.X, self.Y, warm_start=gp, refit=False)

    def local_model(self) -> SingleTaskGP:
        r"""The client's own GP on its data (refitted every ``local_refit_every``-th update)."""
        if self._local_model is None:
            with self.timed("local_fit"):
                self._local_model = self._local_fitter(self.X, self.Y)
        return self._local_model

    def propose_local(self, t: int, kind: str | None = None) -> Tensor:
        r"""A local step: the acquisition on the local GP (without data a private uniform point)."""
        if len(self.X) == 0:
            return torch.rand(1, self.dim, generator=self.private_rng, dtype=torch.float64)
        return self.acquire(self.local_model(), t, kind=kind)

    def avoid_failures(self, x: Tensor) -> Tensor:
        r"""``x``, or private uniform points until one lies :data:`MIN_DISTANCE` from every
        failed point (the models never learn of failures)."""
        for _ in range(1000):  # a redraw may land next to another failed point
            if not len(self.failed_X) or torch.cdist(x, self.failed_X).min() >= MIN_DISTANCE:
                break
            x = torch.rand(1, self.dim, generator=self.private_rng, dtype=torch.float64)
        return x

    def step_seed(self, t: int) -> int:
        r"""A seed for round ``t``'s acquisition optimisation on this client."""
        return round_seed(self.seed, t)

    def _kind(self, kind: str | None) -> StepKind:
        kind = self.settings.acquisition if kind is None else kind
        return cast(StepKind, check_value("kind", kind, Choice(ACQUISITIONS)))

    def _step_arguments(self, kind: str, t: int, best_f: Tensor | float | None) -> dict:
        r"""``beta`` (UCB), ``best_f`` (EI) or ``num_fantasies`` (KG) of round ``t``."""
        if kind == "ucb":
            return {"beta": self.settings.beta_at(t, self.dim)}
        if kind == "ei":
            return {"best_f": self.Y.max() if best_f is None else best_f}
        if kind == "kg":
            return {"num_fantasies": self.settings.num_fantasies}
        return {}

    def make_acquisition(
        self,
        model: Model,
        t: int,
        best_f: Tensor | float | None = None,
        seed: int | None = None,
        kind: str | None = None,
    ) -> AcquisitionFunction:
        r"""The acquisition ``kind`` (``None``: the settings') of round ``t`` on ``model``
        (:func:`~botorch_fed.acquisition.make_step_acquisition`); ``best_f``: EI's
        incumbent (``None``: the local best); ``seed``: of TS and KG (``None``:
        :meth:`step_seed`)."""
        kind, seed = self._kind(kind), self.step_seed(t) if seed is None else int(seed)
        return make_step_acquisition(
            kind, model, seed=seed, **self._step_arguments(kind, t, best_f)
        )

    def acquire(
        self,
        model: Model,
        t: int,
        acqf: AcquisitionFunction | None = None,
        rank: int = 0,
        count: int = 1,
        seed: int | None = None,
        kind: str | None = None,
    ) -> Tensor:
        r"""Maximise the configured acquisition (or ``acqf``) on ``model``; ``count > 1``
        clients doing so this round run one search and take its ``rank``-th distinct
        result (:func:`~botorch_fed.acquisition.ranked_step_candidates`; not with TS).

        Args:
            model: The GP to acquire on.
            t: The round.
            acqf: An acquisition to maximise instead of the configured one.
            rank: This client's rank among the ``count`` clients.
            count: Number of clients maximising the same acquisition this round.
            seed: The search's seed (``None``: :meth:`step_seed` of ``t``).
            kind: ``"ucb"``, ``"ei"``, ``"ts"`` or ``"kg"`` (``None``: the settings').

        Returns:
            The ``1 x d`` unit-cube candidate (:meth:`avoid_failures`).
        """
        s = self.settings
        kind = self._kind(kind)
        seed = self.step_seed(t) if seed is None else int(seed)
        distinct = count > 1 and not (acqf is None and kind == "ts")
        restarts = max(s.num_restarts, 2 * count) if distinct else s.num_restarts
        search: dict[str, Any] = {"num_restarts": restarts, "maxiter": s.maxiter}
        search["raw_samples"] = max(s.raw_samples, 4 * restarts)
        with self.timed("acquisition"):
            if acqf is None and not distinct:
                args = {"num_candidates": s.ts_candidates, **self._step_arguments(kind, t, None)}
                X = propose_step_candidate(kind, model, self.bounds, seed=seed, **search, **args)
            elif not distinct:
                assert acqf is not None  # the branch above takes acqf=None
                X = maximize_step_acquisition(acqf, self.bounds, seed=seed, **search)
            else:
                # every client of the round builds the same acquisition (KG's fantasies
                # too) and runs the same search: once in one process (the runner's memo)
                if acqf is None:
                    acqf = self.make_acquisition(model, t, seed=seed, kind=kind)
                options = {"seed": seed, "min_distance": MIN_DISTANCE, **search}
                run_search = functools.partial(ranked_step_candidates, acqf, self.bounds, **options)
                if self.search_memo is None:
                    ranked = run_search()
                else:  # torch's thread count changes the search's last bits
                    threads = {"threads": torch.get_num_threads()}
                    ranked = self.search_memo(acqf, self.bounds, options | threads, run_search)
                X = ranked[min(rank, len(ranked) - 1)]
        return self.avoid_failures(X.detach().reshape(1, self.dim).clamp(0.0, 1.0))

    @handles(Init)
    def on_init(self, message: Init) -> dict:
        r"""Round 0: evaluate the initial design, once (a client that has evaluated
        anything refuses, so a server cannot have it evaluated again)."""
        if self.history or self._initialized or self._accepted_round:
            raise self.violation(
                "a second `init`: the initial design is evaluated once (this client holds "
                f"{len(self.history)} evaluations, last round {self._accepted_round})",
                "init",
            )
        self._initialized = True
        for x in initial_design(self.settings.num_init, self.dim, self.seed, self.init_region):
            self.evaluate(x.unsqueeze(0), 0, "init")
        return {}


def _restore_generator(owner: str, name: str, generator: torch.Generator, state) -> None:
    r"""Set ``generator`` to the saved ``state`` of field ``name``."""
    state = check_tensor(owner, name, state, (_MT_STATE_BYTES,), torch.uint8)
    try:
        generator.set_state(state)
    except RuntimeError as exc:
        raise CheckpointError(f"{owner}: `{name}` is not a generator state ({exc}).") from exc
