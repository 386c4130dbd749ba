r"""An LDP-BO user: evaluates its black box where the learner asks and returns the
reward, privatised on its side by the private variants (Curator 1 of Zhou and Tan,
paper 002).

The Laplace noise comes from the user's *private* generator (``crypto_seed`` or OS
randomness), never from the run's public seed: a server that knows the seed cannot
subtract the noise. A user answers a query only for a round of its own settings
(``1 .. num_rounds``), each once and in increasing order, and with
``users="round-robin"`` only on its turn (user ``i`` answers rounds
``i + 1, i + 1 + M, ...``); it refuses a query its ``user_budget`` does not cover. A
failed evaluation is a release too (its failure bit is answered in the clear): it is
counted before anything leaves the user, and with ``evaluation_errors="raise"`` before
the error is raised. Each release is made durable in a write-ahead log before the
reply leaves (:meth:`LDPUserClient.attach_release_log`).
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from botorch_fed.algorithms.ldp_bo.messages import Query
from botorch_fed.algorithms.ldp_bo.settings import USER_ORDERS
from botorch_fed.privacy import LaplaceMechanism, ReleaseLog, ReleaseLogError
from botorch_fed.protocol.checkpoint import CheckpointError, split_state
from botorch_fed.protocol.client import FederatedClient
from botorch_fed.protocol.declarations import handles
from botorch_fed.protocol.evaluation import evaluate_point
from botorch_fed.protocol.objectives import EvaluationError, Objective
from botorch_fed.protocol.round_budget import RoundBudget


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
        # a release log is kept only with a mechanism (and its ledger)
        assert self.mechanism is not None and self.privacy_ledger is not None
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

    @handles(Query)
    def on_query(self, message: Query) -> dict:
        r"""Answer one query with ``{"y"}`` (privatised if private) or ``{"failed": 1}``
        when the evaluation failed (nothing about the value; in a private run the
        failure counts as a release of ``epsilon``: the bit is not privatised). The
        budget and the round (:meth:`accept_round`) are checked before the black box is
        evaluated."""
        x = torch.as_tensor(message.x).reshape(1, -1)
        if self._log is None:
            return self._answer(x, message.t)
        with self._log.locked() as view:  # no other copy of this user draws meanwhile
            self._catch_up(view)
            return self._answer(x, message.t)

    def _answer(self, x: torch.Tensor, t: int) -> dict:
        if self.mechanism is not None and self.budget is not None:
            assert self.privacy_ledger is not None  # the mechanism's ledger
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
            assert self.privacy_ledger is not None  # the mechanism's ledger
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
        assert self.privacy_ledger is not None  # the mechanism's ledger
        self.privacy_ledger.record(
            self.client_id, epsilon=self.mechanism.epsilon, delta=self.mechanism.delta
        )
        self._log_release(clipped=0)

    def _log_release(self, clipped: int) -> None:
        r"""Append the release just counted to the write-ahead log (durable before the
        reply leaves)."""
        if self._log is not None:
            # a release log is kept only with a mechanism (and its ledger)
            assert self.mechanism is not None and self.privacy_ledger is not None
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
        r"""Restore :meth:`state_dict`."""
        owner = f"Client {self.client_id}"
        state = self.load_round_state(owner, state)
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
                assert self.privacy_ledger is not None  # the mechanism's ledger
                self.privacy_ledger.load_state_dict(own["privacy"])
            self.objective.load_state_dict(own["objective"])
        except (ValueError, TypeError, KeyError) as exc:
            raise CheckpointError(f"{owner}: {exc}") from exc
        self.history = [dict(h) for h in own["history"]]
        log = own["release_log"]
        self._release_log = None if log is None else Path(str(log))
        self._log = None  # attach_release_log opens it (and catches up) before a query
