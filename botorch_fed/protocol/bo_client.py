r"""What every Bayesian-optimisation client of a federation has in common.

A :class:`BOClient` holds its private data in the unit cube, evaluates its own black
box, keeps a local ``SingleTaskGP`` and maximises an acquisition function (UCB, EI
or Thompson sampling) on any model it is given. ``history`` is a harness-side record
of what it evaluated (for result tables); it is never sent to the server.

It implements neither piece itself: the local GP is fitted by
:class:`~botorch_fed.models.ExactGPRefitter` (warm-started refits every
``local_refit_every`` updates, seeded from the client's seed), and acquisitions are
built and maximised by :mod:`botorch_fed.acquisition.step_acquisition` -- UCB with a
float64 ``beta``, log-EI, pathwise Thompson sampling on the local GP (discrete
Thompson sampling on a Sobol set only for models without pathwise support, such as
the global ``FederatedPITCGP``), and the ranked distinct optima of a shared search.
"""

from __future__ import annotations

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
from botorch_fed.models import (
    ExactGPRefitter,
    check_exact_gp_state,
    exact_gp_state,
    fit_exact_gp,
)
from botorch_fed.privacy import KeyStream
from botorch_fed.protocol.checkpoint import CheckpointError, check_tensor, split_state
from botorch_fed.protocol.client import FederatedClient
from botorch_fed.protocol.declarations import (
    Choice,
    Declared,
    Int,
    Real,
    check_settings,
    declare,
    handles,
)
from botorch_fed.protocol.evaluation import EVALUATION_ERRORS, evaluate_point
from botorch_fed.protocol.objectives import Objective
from botorch_fed.protocol.problem import initial_design
from botorch_fed.protocol.round_budget import RoundBudget, round_seed

ACQUISITIONS = ("ucb", "ei", "ts", "kg")


@dataclass
class BOSettings:
    r"""Settings shared by the BO clients of every algorithm.

    Attributes:
        num_init: Initial design size per client.
        num_rounds: Number of rounds ``T``.
        acquisition: ``"ucb"`` (GP-UCB), ``"ei"`` (log-EI), ``"ts"`` (Thompson) or
            ``"kg"`` (one-shot knowledge gradient; ``local`` with it is the "no
            collaboration" baseline of Co-KG, ``central`` with q-KG over the clients'
            batch its "data sharing" baseline).
        beta: UCB ``beta``; ``None`` uses ``beta_t = 0.2 d log(2t)``.
        local_refit_every: Refit the local GP's hyperparameters on every ``K``-th
            model update (in between, the last fitted values are reused).
        fit_maxiter: L-BFGS-B iterations of a local refit (warm-started from the
            previous fit).
        num_restarts: ``optimize_acqf`` restarts.
        raw_samples: ``optimize_acqf`` raw samples.
        maxiter: ``optimize_acqf`` L-BFGS-B iterations.
        ts_candidates: Candidate-set size of discrete Thompson sampling (models
            without pathwise sampling: the global dPITC model; FTS's shared-feature
            steps).
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
    r"""A CPU ``torch.Generator`` for a client's private randomness, with a secret state.

    ``torch.Generator.manual_seed`` keeps only the low 32 bits of its seed, few enough
    for a server to try every one. This generator's whole Mersenne Twister state, all
    624 32-bit words, comes from a :class:`~botorch_fed.privacy.KeyStream` (ChaCha20)
    instead: under 32 bytes of OS randomness, or, for simulations and tests, under
    SHA-256 of ``private_seed`` (every bit of it counts; whoever knows it knows the
    stream). Its state is saved and restored with ``get_state`` / ``set_state``, as
    any generator's.

    Args:
        private_seed: ``None`` (OS randomness) or an integer of any size.

    Returns:
        The generator.

    Raises:
        TypeError: ``private_seed`` is not an integer.
        RuntimeError: torch's CPU generator state does not have the layout this
            function fills (its size, and the Mersenne Twister's words at byte 24).
    """
    if private_seed is None:
        stream = KeyStream()
    else:
        if isinstance(private_seed, bool):
            raise TypeError(f"`private_seed` must be an integer or None, got {private_seed!r}.")
        stream = KeyStream.from_seed(operator.index(private_seed))
    # the top 32 bits of each uniform's 52: (k + 1/2) / 2^52 * 2^32 floors to k >> 20
    words = (stream.uniform(_MT_WORDS) * 2.0**32).floor().to(torch.int64)
    generator = torch.Generator().manual_seed(0)
    state = generator.get_state()
    layout = state.numel() == _MT_STATE_BYTES
    if layout:
        slots = state[_MT_OFFSET : _MT_OFFSET + 8 * _MT_WORDS].view(torch.int64)
        # manual_seed(0) puts the words 0, 1, 1812433255, ... in the slots
        layout = slots[:3].tolist() == [0, 1, 1812433255]
    if not layout:
        raise RuntimeError(
            "torch's CPU generator state does not have the layout the private generator "
            f"fills: torch {torch.__version__} gives {state.numel()} bytes; expected "
            f"{_MT_STATE_BYTES} with the Mersenne Twister's words at byte {_MT_OFFSET}."
        )
    slots.copy_(words)  # the view writes into `state`
    generator.set_state(state)
    return generator


@declare("init", relayed=True)
class Init(Declared):
    r"""Round 0: evaluate the initial design (no fields)."""


class BOClient(RoundBudget, FederatedClient):
    r"""A client that evaluates its black box and runs BO steps on given models.

    Args:
        client_id: The id.
        objective: The client's black box (unit-cube inputs).
        settings: The BO settings.
        seed: The client's seed (initial design, draws, acquisition restarts).
        secagg: The client's secure-aggregation role (or ``None``).
        init_region: Optional ``2 x d`` sub-box of the unit cube for the initial design.
        evaluation_errors: ``"record"`` (a failed evaluation is recorded and the
            client carries on) or ``"raise"`` (it stops the run).
        private_seed: Seed of the client's private generator
            (:func:`private_generator`), which draws the random points that replace a
            candidate next to a failed point and the steps of a client without data
            (``None``: 32 bytes of OS randomness; an integer: every bit counts). It is
            kept apart from ``seed``, which is public (the server can derive the
            client's coins from it): a failure must not change anything the server
            observes.

    A handler of a round calls :meth:`accept_round` (:class:`RoundBudget`) before it
    evaluates anything: the client evaluates at most ``num_init + num_rounds`` points
    (the initial design once, one point per round) whatever the server sends.
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
            raise ValueError(
                f"`objective` must be an Objective (e.g. CallableObjective), got "
                f"{type(objective).__name__}."
            )
        if evaluation_errors not in EVALUATION_ERRORS:
            raise ValueError(
                f"`evaluation_errors`={evaluation_errors!r} must be one of {EVALUATION_ERRORS}."
            )
        self.objective = objective
        self.evaluation_errors = evaluation_errors
        self.settings = settings
        self.dim = objective.dim
        self.seed = int(seed)
        self.init_region = init_region
        self.rng = torch.Generator().manual_seed(self.seed)
        self.private_rng = private_generator(private_seed)
        self.bounds = torch.stack([torch.zeros(self.dim), torch.ones(self.dim)]).double()
        self.X = torch.empty(0, self.dim, dtype=torch.float64)
        self.Y = torch.empty(0, 1, dtype=torch.float64)
        self.failed_X = torch.empty(0, self.dim, dtype=torch.float64)  # never sent
        self.history: list[dict] = []  # harness-only record, never sent
        self._initialized = False  # the initial design was asked for (once)
        # searches every client of a round runs identically: the in-process runner
        # gives the clients of one run a shared memo (shared_search); None: compute
        self.search_memo: Callable[..., Tensor] | None = None
        self._local_model: SingleTaskGP | None = None
        self._local_fitter = ExactGPRefitter(
            refit_every=settings.local_refit_every,
            maxiter=settings.fit_maxiter,
            warm_start=True,
            seed=self.seed,
        )

    def evaluate(self, x: Tensor, t: int, step: str) -> bool:
        r"""Evaluate ``x`` (``1 x d``), add it to the private data, record it.

        A failed evaluation (the objective raises, or returns NaN/inf) is recorded in
        :attr:`history` and :attr:`failures` and the point is *not* added to the data
        (it is never sent anywhere); with ``evaluation_errors="raise"`` it raises
        :class:`~botorch_fed.protocol.objectives.EvaluationError` instead.

        Returns:
            Whether the evaluation succeeded.
        """
        x = x.detach().to(torch.float64)
        point = self.objective.to_domain(x).squeeze(0).tolist()
        entry = {"round": t, "step": step, "x": point}
        with self.timed("evaluation"):
            entry, observed = evaluate_point(
                self.objective, x, entry, self.evaluation_errors, self.client_id
            )
        if observed is None:
            self.history.append(entry)
            self.failed_X = torch.cat([self.failed_X, x])
            return False
        y = observed.reshape(1, 1)
        self.X = torch.cat([self.X, x])
        self.Y = torch.cat([self.Y, -y if self.objective.minimize else y])
        self._local_model = None
        self.history.append(entry)
        return True

    @property
    def failures(self) -> list[dict]:
        r"""The failed evaluations (round, step, point in the user's domain, error)."""
        return [h for h in self.history if h.get("failed")]

    _STATE = (
        "X",
        "Y",
        "failed_X",
        "history",
        "rng",
        "private_rng",
        "local_fitter",
        "local_model",
        "objective",
    )

    def state_dict(self) -> dict:
        r"""The client's state between rounds: private data, failed points, history,
        generator, local GP (fitter state and the current model's hyperparameters), the
        objective's own state (e.g. a noise generator) and the last round accepted
        (:meth:`accept_round`)."""
        state = super().state_dict()
        state.update(self.round_state())
        state.update(
            X=self.X.clone(),
            Y=self.Y.clone(),
            failed_X=self.failed_X.clone(),
            history=[dict(h) for h in self.history],
            rng=self.rng.get_state(),
            private_rng=self.private_rng.get_state(),
            local_fitter=self._local_fitter.state_dict(),
            local_model=None if self._local_model is None else exact_gp_state(self._local_model),
            objective=self.objective.state_dict(),
        )
        return state

    def load_state_dict(self, state: dict) -> None:
        r"""Restore :meth:`state_dict` (a checkpoint of a client with the same setup)."""
        owner = f"Client {self.client_id}"
        state = self.load_round_state(owner, state)
        own, rest = split_state(owner, state, self._STATE)
        super().load_state_dict(rest)
        X = check_tensor(owner, "X", own["X"], (None, self.dim))
        Y = check_tensor(owner, "Y", own["Y"], (len(X), 1))
        failed = check_tensor(owner, "failed_X", own["failed_X"], (None, self.dim))
        if not isinstance(own["history"], list) or not all(
            isinstance(h, dict) for h in own["history"]
        ):
            raise CheckpointError(f"{owner}: `history` must be a list of dicts.")
        if sum(1 for h in own["history"] if not h.get("failed")) != len(X):
            raise CheckpointError(f"{owner}: `history` does not match the {len(X)} data points.")
        self.X, self.Y, self.failed_X = X.clone(), Y.clone(), failed.clone()
        self.history = [dict(h) for h in own["history"]]
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
        if own["local_model"] is not None:  # the model the uninterrupted run holds now
            self._local_model = fit_exact_gp(
                self.X, self.Y, warm_start=own["local_model"], refit=False
            )

    def local_model(self) -> SingleTaskGP:
        r"""The client's own GP on its data (BoTorch defaults, outcome standardised).

        Fitted by :class:`~botorch_fed.models.ExactGPRefitter`: every
        ``local_refit_every``-th update refits the hyperparameters (warm-started from
        the last fit, at most ``fit_maxiter`` L-BFGS-B iterations, seeded from the
        client's seed); the updates in between reuse the last fitted values.
        """
        if self._local_model is None:
            with self.timed("local_fit"):
                self._local_model = self._local_fitter(self.X, self.Y)
        return self._local_model

    def propose_local(self, t: int, kind: str | None = None) -> Tensor:
        r"""A local step's point: the acquisition on the client's own GP, or a uniform
        point from the client's private generator while it holds no data (every
        evaluation so far failed)."""
        if len(self.X) == 0:
            return torch.rand(1, self.dim, generator=self.private_rng, dtype=torch.float64)
        return self.acquire(self.local_model(), t, kind=kind)

    def avoid_failures(self, x: Tensor) -> Tensor:
        r"""``x``, or, if it lies within :data:`MIN_DISTANCE` of a point whose evaluation
        failed, uniform points from the client's private generator until one does not
        (the models never learn of failures, so they would propose the same point
        again)."""
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
        if kind not in ACQUISITIONS:
            raise ValueError(f"`kind`={kind!r} must be one of {ACQUISITIONS}.")
        return cast(StepKind, kind)

    def _step_arguments(self, kind: str, t: int, best_f: Tensor | float | None) -> dict:
        r"""``beta`` (UCB), ``best_f`` (EI) and ``num_fantasies`` (KG) of round ``t`` for
        the step functions."""
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
        r"""The configured acquisition of round ``t``, by
        :func:`~botorch_fed.acquisition.make_step_acquisition`.

        Args:
            model: The GP to acquire on.
            t: The round (UCB's ``beta_t``, stored in float64; the default TS seed).
            best_f: EI's incumbent (``None``: the best value of the local data).
            seed: Seed of the Thompson path and of KG's fantasies (``None``:
                :meth:`step_seed` of ``t``).
            kind: ``"ucb"``, ``"ei"``, ``"ts"`` or ``"kg"`` (``None``: the settings').

        Returns:
            ``UpperConfidenceBound``, ``LogExpectedImprovement``,
            ``PathwiseThompsonSampling`` (only for models with pathwise sampling
            support) or ``qKnowledgeGradient``.
        """
        kind = self._kind(kind)
        return make_step_acquisition(
            kind,
            model,
            seed=self.step_seed(t) if seed is None else int(seed),
            **self._step_arguments(kind, t, best_f),
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
        r"""Maximise the configured acquisition (or ``acqf``) on ``model``.

        Without ``acqf`` this is one step of
        :func:`~botorch_fed.acquisition.propose_step_candidate` (UCB, log-EI with the
        local incumbent, one-shot KG with ``num_fantasies`` fantasies, pathwise TS --
        or discrete TS on ``ts_candidates`` Sobol points for a model without pathwise
        sampling); a given ``acqf`` is maximised
        by :func:`~botorch_fed.acquisition.maximize_step_acquisition`.

        With ``count > 1`` (``count`` clients maximise the same acquisition on the same
        model in this round, and this one has ``rank``), all of them run the same
        seeded search -- a multi-start optimisation plus its raw Sobol samples -- and
        rank the results (:func:`~botorch_fed.acquisition.ranked_step_candidates`):
        the optimised points by value, then the raw samples by value, skipping any
        point within :data:`MIN_DISTANCE` of one already ranked. This client takes the
        ``rank``-th, so simultaneous steps do not evaluate one point ``count`` times.
        Thompson sampling ignores ``rank`` and ``count`` (each client's own sample).
        Searches run under a fixed seed (the global RNG state is restored
        afterwards).

        Args:
            model: The GP to acquire on.
            t: The round.
            acqf: An acquisition to maximise instead of the configured one.
            rank: This client's rank among the ``count`` clients.
            count: Number of clients maximising the same acquisition this round.
            seed: The search's seed (``None``: :meth:`step_seed` of ``t``).
            kind: ``"ucb"``, ``"ei"``, ``"ts"`` or ``"kg"`` (``None``: the settings').

        Returns:
            The ``1 x d`` candidate in the unit cube.
        """
        s = self.settings
        kind = self._kind(kind)
        seed = self.step_seed(t) if seed is None else int(seed)
        distinct = count > 1 and not (acqf is None and kind == "ts")
        restarts = max(s.num_restarts, 2 * count) if distinct else s.num_restarts
        search: dict[str, Any] = {
            "num_restarts": restarts,
            "raw_samples": max(s.raw_samples, 4 * restarts),
            "maxiter": s.maxiter,
        }
        with self.timed("acquisition"):
            if acqf is None and not distinct:
                X = propose_step_candidate(
                    kind,
                    model,
                    self.bounds,
                    seed=seed,
                    num_candidates=s.ts_candidates,
                    **search,
                    **self._step_arguments(kind, t, None),
                )
            elif not distinct:
                assert acqf is not None  # the branch above takes acqf=None
                X = maximize_step_acquisition(acqf, self.bounds, seed=seed, **search)
            else:
                # the search's seed also seeds the acquisition (KG's fantasies): every
                # client of the round must build the same one, from the secret seed
                if acqf is None:
                    acqf = self.make_acquisition(model, t, seed=seed, kind=kind)

                # every client of the round runs this same search: in one process the
                # runner's memo runs it once (keyed by the digest of all its inputs)
                def run_search() -> Tensor:
                    return ranked_step_candidates(
                        acqf, self.bounds, seed=seed, min_distance=MIN_DISTANCE, **search
                    )

                if self.search_memo is None:
                    ranked = run_search()
                else:
                    ranked = self.search_memo(
                        acqf,
                        self.bounds,
                        # torch's thread count changes the search's last bits
                        {
                            "seed": seed,
                            "min_distance": MIN_DISTANCE,
                            **search,
                            "threads": torch.get_num_threads(),
                        },
                        run_search,
                    )
                X = ranked[min(rank, len(ranked) - 1)]
        return self.avoid_failures(X.detach().reshape(1, self.dim).clamp(0.0, 1.0))

    @handles(Init)
    def on_init(self, message: Init) -> dict:
        r"""Round 0: evaluate the initial design -- once. A client that has evaluated
        anything (a second ``init``, or a client resumed from a checkpoint) refuses, so
        a server cannot have the design evaluated again and again; so does one whose
        first ``init`` stopped at a failed point (``evaluation_errors="raise"``)."""
        if self.history or self._initialized or self._accepted_round:
            raise self.violation(
                "a second `init`: the initial design is evaluated once (this client holds "
                f"{len(self.history)} evaluations, last round {self._accepted_round})",
                "init",
            )
        self._initialized = True
        X0 = initial_design(self.settings.num_init, self.dim, self.seed, self.init_region)
        for x in X0:
            self.evaluate(x.unsqueeze(0), 0, "init")
        return {}


def _restore_generator(owner: str, name: str, generator: torch.Generator, state) -> None:
    r"""Set ``generator`` to the saved ``state`` of the field ``name``.

    Raises:
        CheckpointError: Naming ``owner`` and ``name``, when ``state`` is not a
            ``uint8`` tensor of torch's CPU generator state size or does not hold a
            valid Mersenne Twister state.
    """
    state = check_tensor(owner, name, state, (_MT_STATE_BYTES,), torch.uint8)
    try:
        generator.set_state(state)
    except RuntimeError as exc:
        raise CheckpointError(f"{owner}: `{name}` is not a generator state ({exc}).") from exc
