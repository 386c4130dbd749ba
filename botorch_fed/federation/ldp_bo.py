r"""LDP-BO on the federation protocol: a learner (the server) and its users (the clients).

[LDP-BO]'s setting, as a round-based program: in round ``t`` the server's learner
proposes ``x_t`` and sends it to one user; the user evaluates its black box, privatises
the reward with Curator 1 (:class:`~botorch_fed.privacy.LaplaceMechanism`: clip to
``[-(B + R), B + R]``, add ``Laplace(2 (B + R) / epsilon)``) and returns only that; the
learner updates. The raw reward never leaves the user: the server sees ``x_t`` (it
chose it) and the privatised value. Users answer in turn (``users="round-robin"``) or
drawn at random.

Registered algorithms (``botorch-fed run <name>``):

=============  ===============================================  =========
name           learner                                          rewards
=============  ===============================================  =========
``ldp-tgp``    :class:`~botorch_fed.ldp.TGPUCB` (Alg. 2)        private
``ldp-ata``    :class:`~botorch_fed.ldp.ATAGPUCB` (Alg. 1)      private
``ldp-moma``   :class:`~botorch_fed.ldp.MoMAGPUCB` (Alg. 3)     private
``tgp``        TGP-UCB (heavy-tailed noise)                      raw
``ata``        ATA-GP-UCB (heavy-tailed noise)                   raw
``moma``       MoMA-GP-UCB (heavy-tailed noise)                  raw
``gp-ucb``     :class:`~botorch_fed.ldp.GPUCB` (IGP-UCB)         raw
=============  ===============================================  =========

Privacy accounting is the users' own: each keeps a
:class:`~botorch_fed.privacy.PrivacyLedger` of its releases; the run's result merges
them (``RunResult.privacy``). Under basic composition a user who answers ``k`` queries
has spent ``k epsilon``: with ``M`` users and ``T`` rounds that is about
``(T / M) epsilon`` each. ``user_budget`` caps it: a user refuses any query beyond its
budget (a server that re-queries one user to average the noise away is refused), and a
run whose rounds cannot fit the users' budgets is refused before it starts.

The Laplace noise comes from each user's *private* generator (``crypto_seed`` or OS
randomness), never from the run's public seed: a server that knows the seed cannot
subtract the noise.

A user answers a query only for a round of its own settings (``1 .. num_rounds``), each
once and in increasing order, and with ``users="round-robin"`` only on its turn (user
``i`` answers rounds ``i + 1, i + 1 + M, ...``): a server cannot have a user evaluate its
black box, or spend its epsilon, more often than the settings allow
(:meth:`~botorch_fed.federation.bo_client.RoundBudget.accept_round`). A failed
evaluation is a release too (its failure bit is answered in the clear): it is counted
before anything leaves the user, and with ``evaluation_errors="raise"`` before the error
is raised.

References:

.. [LDP-BO] X. Zhou, J. Tan. Local differential privacy for Bayesian optimization
   (paper 002 in ``shared/papers``).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from botorch_fed.federation.bo_client import RoundBudget
from botorch_fed.federation.checkpoint import CheckpointError, check_tensor, split_state
from botorch_fed.federation.evaluation import evaluate_point
from botorch_fed.federation.messages import Message
from botorch_fed.federation.objectives import EvaluationError, Objective
from botorch_fed.federation.registry import AlgorithmSpec, register_algorithm
from botorch_fed.federation.roles import FederatedClient, FederatedServer, ProtocolViolation
from botorch_fed.ldp import KERNELS, LEARNERS, RewardModel, make_kernel
from botorch_fed.privacy import LaplaceMechanism, PrivacyLedger, ReleaseLog, ReleaseLogError

USER_ORDERS = ("round-robin", "random")

# name -> (learner, private)
VARIANTS = {
    "ldp-tgp": ("tgp", True),
    "ldp-ata": ("ata", True),
    "ldp-moma": ("moma", True),
    "tgp": ("tgp", False),
    "ata": ("ata", False),
    "moma": ("moma", False),
    "gp-ucb": ("gp-ucb", False),
}


def _number(name: str, value, *, positive: bool = False, optional: bool = True) -> None:
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"`{name}` must be a finite number, got {value!r}.")
    if value < 0 or (positive and value == 0):
        raise ValueError(
            f"`{name}` must be {'positive' if positive else 'non-negative'}, got {value!r}."
        )


@dataclass
class LDPBOSettings:
    r"""Settings of the LDP-BO algorithms (the paper's formulas are the defaults).

    Attributes:
        num_rounds: Rounds ``T``: one query (one reward) per round.
        epsilon: Each reported reward is ``epsilon``-LDP (private variants only;
            ``None``: 1).
        reward_bound: ``B``, a bound on ``|f|`` (``None``: the objective's declaration).
        noise_bound: ``R``, a bound on the noise (``None``: the objective's
            declaration). Private variants need it; rewards beyond ``B + R`` are
            clipped by the users.
        noise_moment: ``E[eta^2]`` of unbounded noise for the non-private variants
            (``None``: the objective's noise, else ``R^2``).
        kernel: ``se``, ``matern`` or ``auto`` (the objective's hint, else ``se``).
        lengthscale: Kernel lengthscale in the unit cube (``None``: the objective's
            hint, else 0.2).
        nu: Matern smoothness (0.5, 1.5, 2.5).
        lam: ``lambda``, the ridge (surrogate noise) parameter.
        delta: Confidence parameter of the formulas.
        accuracy: Nystrom accuracy of ATA and MoMA (the paper's epsilon in (0, 1)).
        q: Nystrom dictionary rate (``None``: ``6 rho ln(4T/delta)/accuracy^2``).
        plays_per_epoch: MoMA's ``k`` (``None``: ``ceil(24 ln(4 e T / delta))``).
        beta: A constant UCB ``beta`` (``None``: the paper's ``beta_t`` times
            ``beta_scale``).
        beta_scale: Factor on the paper's ``beta_t`` (the theory's constants are
            conservative; the paper's experiments set them "order-wise").
        truncation_scale: Factor on the truncation points ``b_t`` (TGP, ATA).
        users: Which user answers round ``t``: ``round-robin`` or ``random``.
        user_budget: Total epsilon a user will spend (``None``: unlimited; the result
            reports what each spent).
        num_restarts: ``optimize_acqf`` restarts (box domains).
        raw_samples: ``optimize_acqf`` raw samples (box domains).
        maxiter: ``optimize_acqf`` L-BFGS-B iterations (box domains).
    """

    num_rounds: int = 200
    epsilon: float | None = None
    reward_bound: float | None = None
    noise_bound: float | None = None
    noise_moment: float | None = None
    kernel: str = field(default="auto", metadata={"choices": ("auto", *KERNELS)})
    lengthscale: float | None = None
    nu: float = 2.5
    lam: float = 1.0
    delta: float = 0.1
    accuracy: float = 0.5
    q: float | None = None
    plays_per_epoch: int | None = None
    beta: float | None = None
    beta_scale: float = 1.0
    truncation_scale: float = 1.0
    users: str = field(default="round-robin", metadata={"choices": USER_ORDERS})
    user_budget: float | None = None
    num_restarts: int = 4
    raw_samples: int = 256
    maxiter: int = 100

    def validate(self) -> None:
        r"""Raise ``ValueError`` naming the first invalid setting."""
        for name in ("num_rounds", "num_restarts", "raw_samples", "maxiter"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"`{name}` must be a positive integer, got {value!r}.")
        k = self.plays_per_epoch
        if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 1):
            raise ValueError(f"`plays_per_epoch` must be a positive integer or None, got {k!r}.")
        _number("epsilon", self.epsilon, positive=True)
        for name in ("reward_bound", "noise_bound", "noise_moment", "beta"):
            _number(name, getattr(self, name))
        for name in ("lengthscale", "q", "user_budget"):
            _number(name, getattr(self, name), positive=True)
        for name in ("lam", "beta_scale", "truncation_scale"):
            _number(name, getattr(self, name), positive=True, optional=False)
        if self.kernel not in ("auto", *KERNELS):
            raise ValueError(f"`kernel`={self.kernel!r} must be one of {('auto', *KERNELS)}.")
        if self.nu not in (0.5, 1.5, 2.5):
            raise ValueError(f"`nu` must be 0.5, 1.5 or 2.5, got {self.nu!r}.")
        for name in ("delta", "accuracy"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < 1:
                raise ValueError(f"`{name}` must be in (0, 1), got {value!r}.")
        if self.users not in USER_ORDERS:
            raise ValueError(f"`users`={self.users!r} must be one of {USER_ORDERS}.")


def _noise_moment(objective: Objective) -> float | None:
    r"""``E[eta^2]`` of a built-in problem's noise, if the objective knows it."""
    noise = getattr(objective, "noise", None)
    if noise is None:
        return None
    moment = float(noise.moment(2))
    return moment if math.isfinite(moment) else None  # infinite variance: none to give


def reward_model(name: str, settings: LDPBOSettings, objective: Objective) -> RewardModel:
    r"""The learner's :class:`~botorch_fed.ldp.RewardModel` for algorithm ``name``: the
    settings' ``B``, ``R``, moment, else the objective's declarations."""
    _, private = VARIANTS[name]
    B = settings.reward_bound
    if B is None:
        B = getattr(objective, "reward_bound", None)
    if B is None:
        raise ValueError(
            f"{name} needs `reward_bound` (B, a bound on |f|): the objective "
            f"{objective.name!r} declares none."
        )
    R = settings.noise_bound
    if R is None:
        R = getattr(objective, "noise_bound", None)
    if private:
        if R is None:
            raise ValueError(
                f"{name} needs `noise_bound` (R): the noise of {objective.name!r} is unbounded "
                "or undeclared. Give R: rewards beyond B + R are clipped by the users (for "
                "sub-Weibull noise, R = (ln(a T / delta) / b)^theta makes the release "
                "(epsilon, delta)-LDP, see LaplaceMechanism.sub_weibull)."
            )
        epsilon = 1.0 if settings.epsilon is None else float(settings.epsilon)
        return RewardModel(B=float(B), R=float(R), epsilon=epsilon)
    moment = settings.noise_moment
    if moment is None:
        moment = _noise_moment(objective)
    if moment is None and R is None:
        raise ValueError(
            f"{name} needs `noise_moment` (E[eta^2]) or `noise_bound`: the noise of "
            f"{objective.name!r} is undeclared."
        )
    return RewardModel(
        B=float(B),
        R=None if R is None else float(R),
        noise_moment=None if moment is None else float(moment),
    )


def make_learner(name: str, settings: LDPBOSettings, objective: Objective, seed: int):
    r"""The learner of algorithm ``name`` for ``objective`` (finite domain if the
    objective has ``candidates``)."""
    kind, _ = VARIANTS[name]
    hint = getattr(objective, "kernel_hint", None) or {}
    auto = settings.kernel == "auto"
    kernel = make_kernel(
        hint.get("kernel", "se") if auto else settings.kernel,
        settings.lengthscale or hint.get("lengthscale", 0.2),
        hint.get("nu", settings.nu) if auto else settings.nu,
        objective.dim,
    )
    extra = {}
    if kind in ("ata", "moma"):
        extra.update(accuracy=settings.accuracy, q=settings.q)
    if kind == "moma":
        extra["k"] = settings.plays_per_epoch
    if kind in ("tgp", "ata"):
        extra["truncation_scale"] = settings.truncation_scale
    return LEARNERS[kind](
        kernel,
        objective.dim,
        settings.num_rounds,
        reward_model(name, settings, objective),
        lam=settings.lam,
        delta=settings.delta,
        candidates=getattr(objective, "candidates", None),
        beta=settings.beta,
        beta_scale=settings.beta_scale,
        seed=seed,
        num_restarts=settings.num_restarts,
        raw_samples=settings.raw_samples,
        maxiter=settings.maxiter,
        **extra,
    )


class LDPUserClient(RoundBudget, FederatedClient):
    r"""A user: evaluates its black box where the learner asks and returns the reward,
    privatised on this side when the algorithm is private.

    Args:
        client_id: The id.
        objective: The user's black box.
        mechanism: Curator 1 with the user's private generator and ledger (``None``:
            non-private, the raw reward is returned).
        budget: The total epsilon this user will spend (``None``: unlimited).
        evaluation_errors: ``"record"`` or ``"raise"``.
        num_rounds: ``T`` of the run's settings: the user answers rounds ``1 .. T``
            only.
        num_users: ``M``, the number of users (ids ``0 .. M-1``).
        users: The settings' user order: ``"round-robin"`` (this user answers rounds
            ``client_id + 1 + k M`` only, in turn) or ``"random"`` (any later round).
    """

    def __init__(
        self,
        client_id: int,
        objective: Objective,
        mechanism: LaplaceMechanism | None,
        budget: float | None = None,
        evaluation_errors: str = "record",
        *,
        num_rounds: int,
        num_users: int = 1,
        users: str = "round-robin",
    ) -> None:
        super().__init__(client_id)
        for name, value in (("num_rounds", num_rounds), ("num_users", num_users)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"`{name}` must be a positive integer, got {value!r}.")
        if not 0 <= self.client_id < num_users:
            raise ValueError(
                f"`client_id`={client_id} is not one of the {num_users} users 0..{num_users - 1}."
            )
        if users not in USER_ORDERS:
            raise ValueError(f"`users`={users!r} must be one of {USER_ORDERS}.")
        if evaluation_errors not in ("record", "raise"):
            raise ValueError(
                f"`evaluation_errors`={evaluation_errors!r} must be 'record' or 'raise'."
            )
        self.objective = objective
        self.mechanism = mechanism
        self.budget = budget
        self.evaluation_errors = evaluation_errors
        self.num_rounds = num_rounds
        self.num_users = num_users
        self.users = users
        self.privacy_ledger = None if mechanism is None else mechanism.ledger
        self.history: list[dict] = []  # harness-only record, never sent
        self._release_log: Path | None = None  # part of the user's own state
        self._log: ReleaseLog | None = None

    # --- the rounds this user answers ---------------------------------------------------
    def round_limit(self) -> int:
        r"""``num_rounds`` of the run's settings."""
        return self.num_rounds

    def next_round_problem(self, t: int, last: int) -> str | None:
        r"""Round-robin users answer on their turn only (user ``i``: rounds
        ``i + 1, i + 1 + M, ...``, as the server picks them); under ``users="random"``
        any later round is this user's."""
        if self.users != "round-robin":
            return None
        due = self.client_id + 1 if last == 0 else last + self.num_users
        if t != due:
            return (
                f"round t={t} is not this user's turn: {self.num_users} users answer in turn "
                f"(user {self.client_id}: rounds {self.client_id + 1}, "
                f"{self.client_id + 1 + self.num_users}, ...), and its next is round {due}"
            )
        return None

    # --- the write-ahead release log ---------------------------------------------------
    def attach_release_log(self, path: str | os.PathLike) -> None:
        r"""Keep this user's releases in a write-ahead log (:class:`~botorch_fed.privacy.
        ReleaseLog`), bound to its key.

        A user that has a log already (its state names it: a restored user) keeps that
        one, wherever the run resumes, and refuses to answer if it is missing; ``path``
        is used only for a user without one. Every release then happens under the log's
        lock, after catching up with it (releases a restored state does not know are
        counted, the noise stream moves past every position used). The harness calls
        this after any ``load_state_dict`` and before the first query.
        """
        if self.mechanism is None:
            return
        fingerprint = self.mechanism.fingerprint()
        try:
            if self._release_log is not None:  # restored: its own log, which must exist
                self._log = ReleaseLog(self._release_log, fingerprint, create=False)
            else:
                self._log = ReleaseLog(path, fingerprint, create=True)
                self._release_log = Path(path)
        except ReleaseLogError as exc:
            raise CheckpointError(f"Client {self.client_id}: {exc}") from None
        with self._log.locked() as view:
            self._catch_up(view)

    def _catch_up(self, view) -> None:
        r"""Count the logged releases this user's state does not know; move its stream
        past every logged position."""
        known = self.privacy_ledger.releases(self.client_id)
        if view.releases < known:
            raise CheckpointError(
                f"Client {self.client_id}: release log {self._release_log} holds "
                f"{view.releases} releases, the ledger {known}: the log was truncated."
            )
        missing = [r for r in view.records if int(r["releases"]) > known]
        if missing:
            self.privacy_ledger.record(
                self.client_id,
                epsilon=self.mechanism.epsilon,
                delta=self.mechanism.delta,
                count=view.releases - known,
                clipped=sum(int(r["clipped"]) for r in missing),
            )
        if view.position > self.mechanism.position:
            self.mechanism.advance_to(view.position)

    def _check_query(self, payload: dict) -> torch.Tensor:
        d = self.objective.dim
        try:
            x = torch.as_tensor(np.asarray(payload["x"], dtype=np.float64)).reshape(1, d)
        except (KeyError, TypeError, ValueError, RuntimeError):
            raise self.violation(f"a query needs one point `x` of dimension {d}") from None
        if not torch.isfinite(x).all() or (x < 0).any() or (x > 1).any():
            raise self.violation(f"the query point {x.tolist()} is not in the unit cube")
        if getattr(self.objective, "candidates", None) is not None:
            if not (self.objective.candidates == x).all(-1).any():
                raise self.violation(f"the query point {x.tolist()} is not in the finite domain")
        return x

    def on_query(self, payload: dict) -> dict:
        r"""Answer one query ``{"x", "t"}`` with ``{"y"}`` (privatised if private) or
        ``{"failed": 1}`` when the evaluation failed (nothing about the value; in a
        private run the failure counts as a release of ``epsilon``: the bit is not
        privatised). The point, the budget and the round (:meth:`accept_round`) are
        checked before the black box is evaluated."""
        x = self._check_query(payload)
        if self._log is None:
            return self._answer(x, payload.get("t"))
        with self._log.locked() as view:  # no other copy of this user draws meanwhile
            self._catch_up(view)
            return self._answer(x, payload.get("t"))

    def _answer(self, x: torch.Tensor, t: object) -> dict:
        if self.mechanism is not None and self.budget is not None:
            spent = self.privacy_ledger.spent(self.client_id)[0]
            if spent + self.mechanism.epsilon > self.budget * (1 + 1e-12):
                raise self.violation(
                    f"answering would spend {spent + self.mechanism.epsilon:g} > the budget "
                    f"{self.budget:g} (epsilon); query refused",
                    "query",
                )
        t = self.accept_round(t, "query")
        entry = {"round": t, "step": "query", "x": self.objective.to_domain(x).squeeze(0).tolist()}
        # no `time:` entries in the reply: the black box's running time at x could
        # depend on the reward, a side channel around the mechanism
        try:
            entry, observed = evaluate_point(
                self.objective, x, entry, self.evaluation_errors, self.client_id
            )
        except EvaluationError:
            # evaluation_errors="raise": the failure is told (the run stops on it), so
            # it is a release as in "record" mode, counted before the error leaves
            self._release_failure()
            raise
        self.history.append(entry)
        if observed is None:
            self._release_failure()
            return {"failed": 1}
        y = -observed if self.objective.minimize else observed  # maximisation convention
        if self.mechanism is not None:
            clipped_before = self.privacy_ledger.clipped(self.client_id)
            y = self.mechanism(y.reshape(()))
            self._log_release(self.privacy_ledger.clipped(self.client_id) - clipped_before)
        return {"y": float(y.reshape(()))}

    def _release_failure(self) -> None:
        r"""Count a failed evaluation as a release of ``epsilon`` (private runs).

        The failure itself is answered in the clear -- ``{"failed": 1}``, or the error
        that stops the run under ``evaluation_errors="raise"`` --: it counts against
        the budget (and the party's total, which reads the ledger), so a server learns
        at most ``budget / epsilon`` of these bits (without this, a black box that fails
        where it is high gives its failure set away for free). Called before the reply
        or the error leaves the user.
        """
        if self.mechanism is None:
            return
        self.privacy_ledger.record(
            self.client_id, epsilon=self.mechanism.epsilon, delta=self.mechanism.delta
        )
        self._log_release(clipped=0)

    def _log_release(self, clipped: int) -> None:
        r"""Append the release just counted to the write-ahead log (durable before the
        reply leaves)."""
        if self._log is not None:
            self._log.append(
                {
                    "releases": self.privacy_ledger.releases(self.client_id),
                    "position": self.mechanism.position,
                    "clipped": clipped,
                }
            )

    def state_dict(self) -> dict:
        r"""History, the mechanism's generator, the privacy ledger, the objective's state
        and the last round answered."""
        state = super().state_dict()
        state.update(self.round_state())
        state.update(
            history=[dict(h) for h in self.history],
            mechanism=None if self.mechanism is None else self.mechanism.state_dict(),
            privacy=None if self.privacy_ledger is None else self.privacy_ledger.state_dict(),
            objective=self.objective.state_dict(),
            release_log=None if self._release_log is None else str(self._release_log),
        )
        return state

    def load_state_dict(self, state: dict) -> None:
        r"""Restore :meth:`state_dict`; a checkpoint written before the last answered
        round was saved restores it from the history."""
        owner = f"Client {self.client_id}"
        last, state = self.load_round_state(owner, state)
        own, rest = split_state(
            owner, state, ("history", "mechanism", "privacy", "objective", "release_log")
        )
        super().load_state_dict(rest)
        if not isinstance(own["history"], list) or not all(
            isinstance(h, dict) for h in own["history"]
        ):
            raise CheckpointError(f"{owner}: `history` must be a list of dicts.")
        if (own["mechanism"] is None) != (self.mechanism is None):
            raise CheckpointError(f"{owner}: the checkpoint's mechanism does not match the run.")
        try:
            if self.mechanism is not None:
                self.mechanism.load_state_dict(own["mechanism"])
                self.privacy_ledger.load_state_dict(own["privacy"])
            self.objective.load_state_dict(own["objective"])
        except (ValueError, TypeError, KeyError) as exc:
            raise CheckpointError(f"{owner}: {exc}") from exc
        self.history = [dict(h) for h in own["history"]]
        self.restore_round(last, self.history)
        log = own["release_log"]
        self._release_log = None if log is None else Path(str(log))
        self._log = None  # attach_release_log opens it (and catches up) before a query


class LDPServer(FederatedServer):
    r"""The learning agent: one query per round, to one user."""

    def __init__(
        self,
        transport,
        settings: LDPBOSettings,
        learner,
        seed: int,
        bounds: torch.Tensor,
        minimize: bool = False,
    ) -> None:
        super().__init__(transport)
        self.settings = settings
        self.bounds = bounds.to(torch.float64)  # the public domain and convention (for x^)
        self.minimize = bool(minimize)
        self.learner = learner
        self.seed = int(seed)
        self.user_rng = torch.Generator().manual_seed(self.seed * 7_919 + 3)
        self.failed = 0  # queries that brought no reward
        self.queries: dict[int, int] = {}  # queries sent to each user
        self.capacity = answers_per_user(settings) if learner.rewards.private else None

    def initialize(self) -> None:
        r"""Nothing to initialise: the learner starts from the prior (Alg. 1-3, line 2)."""

    def _user(self, t: int) -> int:
        r"""The user of round ``t``: the next in turn, or one drawn at random, among the
        users whose budget (public) still covers a query."""
        ids = self.client_ids
        open_ = [c for c in ids if self.capacity is None or self.queries.get(c, 0) < self.capacity]
        if not open_:
            raise ProtocolViolation(f"Round {t}: every user's budget is spent.")
        if self.settings.users == "random":
            return open_[int(torch.randint(len(open_), (1,), generator=self.user_rng))]
        turn = (t - 1) % len(ids)
        return min(open_, key=lambda c: (ids.index(c) - turn) % len(ids))

    def run_round(self, t: int) -> None:
        r"""Round ``t``: propose, ask one user, observe the (privatised) reward."""
        user = self._user(t)
        self.queries[user] = self.queries.get(user, 0) + 1
        with self.ledger.timer("acquisition"):
            x = self.learner.propose()
        reply = self.send({user: Message("query", {"x": x.reshape(-1).numpy(), "t": t})})[user]
        y = self._reward(user, t, reply.payload)
        if y is None:
            self.failed += 1
            return
        with self.ledger.timer("model_update"):
            self.learner.observe(x, y)

    def _reward(self, user: int, t: int, payload: dict) -> float | None:
        if set(payload) == {"failed"}:
            return None
        if set(payload) != {"y"}:
            raise ProtocolViolation(
                f"Round {t}: user {user} replied with fields {sorted(payload)}; expected `y`."
            )
        try:
            y = float(np.asarray(payload["y"], dtype=np.float64).reshape(()))
        except (TypeError, ValueError):
            raise ProtocolViolation(f"Round {t}: user {user}'s reward is not a number.") from None
        if not math.isfinite(y):
            raise ProtocolViolation(f"Round {t}: user {user}'s reward {y!r} is not finite.")
        return y

    @property
    def recommendation(self) -> dict | None:
        r"""``x^``: the maximiser of the surrogate's mean over the finite domain (or over
        the points played, on a box) -- what the learner would deploy after ``T`` rounds."""
        learner = self.learner
        if learner.t == 0:
            return None
        X = learner.candidates if learner.candidates is not None else learner.X
        mean, variance = learner.model.mean_and_variance(X)
        i = int(torch.argmax(mean))
        lower, upper = self.bounds
        return {
            "round": self.ledger.round,
            "client": 0,
            "x_unit": X[i].tolist(),
            "x": (lower + X[i] * (upper - lower)).tolist(),
            # the user's convention (the learner maximises)
            "predicted_value": (-float(mean[i]) if self.minimize else float(mean[i])) + 0.0,
            "predicted_std": float(variance[i].sqrt()),
        }

    def state_dict(self) -> dict:
        return {
            **super().state_dict(),
            "learner": self.learner.state_dict(),
            "user_rng": self.user_rng.get_state(),
            "failed": self.failed,
            "queries": {str(c): n for c, n in sorted(self.queries.items())},
        }

    def load_state_dict(self, state: dict) -> None:
        own, rest = split_state("Server", state, ("learner", "user_rng", "failed", "queries"))
        super().load_state_dict(rest)
        try:
            self.learner.load_state_dict(own["learner"])
        except (ValueError, TypeError, KeyError, RuntimeError) as exc:
            raise CheckpointError(f"Server: learner state: {exc}") from exc
        rng = check_tensor("Server", "user_rng", own["user_rng"], (None,), torch.uint8)
        self.user_rng.set_state(rng)
        self.failed = int(own["failed"])
        self.queries = {int(c): int(n) for c, n in dict(own["queries"]).items()}


def _check_privacy_settings(name: str, ctx) -> None:
    r"""Privacy settings of a non-private variant are refused (not silently ignored),
    and a private run must fit the users' budgets."""
    s = ctx.settings
    if not VARIANTS[name][1]:
        given = [n for n in ("epsilon", "user_budget") if getattr(s, n) is not None]
        if given:
            private = f"; ldp-{name} privatises them" if name != "gp-ucb" else ""
            raise ValueError(
                f"{name} sends raw rewards (no privacy): "
                + " and ".join(f"`{n}`" for n in given)
                + (" does" if len(given) == 1 else " do")
                + f" not apply{private}."
            )
        return
    if s.user_budget is None:
        return
    per_user = answers_per_user(s)
    M = len(ctx.objectives)
    if per_user * M < s.num_rounds:
        raise ValueError(
            f"`user_budget`={s.user_budget:g} allows {per_user} answer(s) of `epsilon`="
            f"{1.0 if s.epsilon is None else s.epsilon:g} per user: {M} users can answer "
            f"{per_user * M} of the `num_rounds`={s.num_rounds} queries. Add users, raise "
            "the budget or lower `num_rounds`."
        )


def answers_per_user(settings: LDPBOSettings) -> int | None:
    r"""How many queries a user's ``user_budget`` covers (``None``: unlimited)."""
    if settings.user_budget is None:
        return None
    epsilon = 1.0 if settings.epsilon is None else settings.epsilon
    return math.floor(settings.user_budget / epsilon * (1 + 1e-12))


def _check(name: str):
    def check(ctx) -> None:
        _check_privacy_settings(name, ctx)
        make_learner(name, ctx.settings, ctx.objectives[0], seed=ctx.setup.seed)

    return check


def _make_client(name: str):
    private = VARIANTS[name][1]

    def build(ctx, cid: int) -> LDPUserClient:
        s = ctx.settings
        mechanism = None
        if private:
            rewards = reward_model(name, s, ctx.objectives[cid])
            mechanism = LaplaceMechanism(
                rewards.epsilon,
                rewards.B,
                rewards.R,
                seed=ctx.private_seed(cid),  # private randomness: never the public seed
                ledger=PrivacyLedger(),
                user=cid,
            )
        return LDPUserClient(
            cid,
            ctx.objectives[cid],
            mechanism,
            budget=s.user_budget if private else None,
            evaluation_errors=ctx.setup.evaluation_errors,
            num_rounds=s.num_rounds,
            num_users=len(ctx.objectives),
            users=s.users,
        )

    return build


def _make_server(name: str):
    def build(ctx, transport) -> LDPServer:
        _check_privacy_settings(name, ctx)
        learner = make_learner(name, ctx.settings, ctx.objectives[0], seed=ctx.setup.seed)
        objective = ctx.objectives[0]
        return LDPServer(
            transport,
            ctx.settings,
            learner,
            seed=ctx.setup.seed,
            bounds=objective.bounds,
            minimize=objective.minimize,
        )

    return build


_SUMMARIES = {
    "ldp-tgp": "LDP-TGP-UCB: users privatise rewards (Laplace); exact GP on truncated rewards",
    "ldp-ata": "LDP-ATA-GP-UCB: users privatise rewards; Nystrom features, adaptive truncation",
    "ldp-moma": "LDP-MoMA-GP-UCB: users privatise rewards; epochs, median of means, Nystrom",
    "tgp": "TGP-UCB for heavy-tailed noise (no privacy): exact GP on truncated rewards",
    "ata": "ATA-GP-UCB for heavy-tailed noise (no privacy): Nystrom, adaptive truncation",
    "moma": "MoMA-GP-UCB for heavy-tailed noise (no privacy): epochs, median of means",
    "gp-ucb": "GP-UCB (IGP-UCB) on raw rewards, one query per round (baseline)",
}

for _name in VARIANTS:
    register_algorithm(
        AlgorithmSpec(
            name=_name,
            summary=_SUMMARIES[_name],
            settings_class=LDPBOSettings,
            make_client=_make_client(_name),
            make_server=_make_server(_name),
            check=_check(_name),
            cumulative_regret=True,
        )
    )
