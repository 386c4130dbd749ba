r"""An LDP-BO user: evaluates its black box where the learner asks and returns the reward,
privatised on its side by the private variants (Curator 1 of [LDP-BO]).

Security invariants: the Laplace noise comes from the user's private generator, never
the public seed; a user answers rounds ``1 .. num_rounds`` once each, in order, and under
``users="round-robin"`` only on its turn; it refuses a query its ``user_budget`` does not
cover; a failed evaluation counts as a release before anything leaves the user; every
release is durable in a write-ahead log before the reply leaves.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from botorch_fed.algorithms.ldp_bo.messages import Query
from botorch_fed.algorithms.ldp_bo.settings import LDPBOSettings
from botorch_fed.privacy import LaplaceMechanism, ReleaseLog, ReleaseLogError
from botorch_fed.problems.objectives import EvaluationError, Objective
from botorch_fed.protocol.checkpoint import CheckpointError, check_history, split_state
from botorch_fed.protocol.client import FederatedClient
from botorch_fed.protocol.declarations import handles
from botorch_fed.protocol.evaluation import evaluate_point
from botorch_fed.protocol.round_budget import RoundBudget


class LDPUserClient(RoundBudget, FederatedClient):
    r"""A user: answers the learner's queries with its (privatised) reward.

    Args:
        client_id: The id, in ``0 .. num_users - 1``.
        objective: The user's black box.
        mechanism: Curator 1 with the user's private generator and ledger (``None``:
            non-private, the raw reward is returned).
        settings: The run's settings.
        num_users: ``M``, the number of users.
        evaluation_errors: ``"record"`` or ``"raise"``.
    """

    def __init__(
        self,
        client_id: int,
        objective: Objective,
        mechanism: LaplaceMechanism | None,
        settings: LDPBOSettings,
        num_users: int = 1,
        evaluation_errors: str = "record",
    ) -> None:
        super().__init__(client_id)
        self.objective, self.mechanism, self.settings = objective, mechanism, settings
        self.num_users, self.evaluation_errors = num_users, evaluation_errors
        self.privacy_ledger = None if mechanism is None else mechanism.ledger
        self.history: list[dict] = []  # harness-only record, never sent
        self._release_log: Path | None = None  # part of the user's own state
        self._log: ReleaseLog | None = None

    def next_round_problem(self, t: int, last: int) -> str | None:
        r"""Under ``users="round-robin"``, why round ``t`` is not this user's turn
        (user ``i`` answers rounds ``i + 1, i + 1 + M, ...``)."""
        if self.settings.users != "round-robin":
            return None
        due = self.client_id + 1 if last == 0 else last + self.num_users
        if t != due:
            return (
                f"round t={t} is not this user's turn: {self.num_users} users answer in turn "
                f"(user {self.client_id}: rounds {self.client_id + 1}, "
                f"{self.client_id + 1 + self.num_users}, ...), and its next is round {due}"
            )
        return None

    def attach_release_log(self, path: str | os.PathLike) -> None:
        r"""Keep this user's releases in a write-ahead :class:`~botorch_fed.privacy.ReleaseLog`
        bound to its key and catch up with it (called after ``load_state_dict``, before the
        first query); a restored user keeps the log its state names, which must exist."""
        if self.mechanism is None:
            return
        new, log = self._release_log is None, self._release_log or Path(path)
        try:
            self._log = ReleaseLog(log, self.mechanism.fingerprint(), create=new)
        except ReleaseLogError as exc:
            raise CheckpointError(f"Client {self.client_id}: {exc}") from None
        self._release_log = log
        with self._log.locked() as view:
            self._catch_up(view)

    def _catch_up(self, view) -> None:
        r"""Count the logged releases this state does not know; move the noise stream
        past every logged position."""
        m, ledger = self.mechanism, self.privacy_ledger
        assert m is not None and ledger is not None
        known = ledger.releases(self.client_id)
        if view.releases < known:
            raise CheckpointError(
                f"Client {self.client_id}: release log {self._release_log} holds "
                f"{view.releases} releases, the ledger {known}: the log was truncated."
            )
        missing = [r for r in view.records if int(r["releases"]) > known]
        if missing:
            clipped = sum(int(r["clipped"]) for r in missing)
            ledger.record(self.client_id, m.epsilon, m.delta, view.releases - known, clipped)
        if view.position > m.position:
            m.advance_to(view.position)

    @handles(Query)
    def on_query(self, message: Query) -> dict:
        r"""Answer with ``{"y"}`` (privatised if private) or ``{"failed": 1}``; the budget
        and the round are checked before the black box is evaluated."""
        x = torch.as_tensor(message.x).reshape(1, -1)
        if self._log is None:
            return self._answer(x, message.t)
        with self._log.locked() as view:  # no other copy of this user draws meanwhile
            self._catch_up(view)
            return self._answer(x, message.t)

    def _answer(self, x: torch.Tensor, t: int) -> dict:
        ledger, budget = self.privacy_ledger, self.settings.user_budget
        if self.mechanism is not None and budget is not None:
            assert ledger is not None
            spent = ledger.spent(self.client_id)[0]
            if spent + self.mechanism.epsilon > budget * (1 + 1e-12):
                raise self.violation(
                    f"answering would spend {spent + self.mechanism.epsilon:g} > the budget "
                    f"{budget:g} (epsilon); query refused",
                    "query",
                )
        t = self.accept_round(t, "query")
        entry = {"round": t, "step": "query", "x": self.objective.to_domain(x).squeeze(0).tolist()}
        # no `time:` entries in the reply: the running time could depend on the reward
        try:
            entry, observed = evaluate_point(
                self.objective, x, entry, self.evaluation_errors, self.client_id
            )
        except EvaluationError:  # "raise": the failure is told, so it is a release
            self._release_failure()
            raise
        self.history.append(entry)
        if observed is None:
            self._release_failure()
            return {"failed": 1}
        y = -observed if self.objective.minimize else observed  # maximisation convention
        if self.mechanism is not None:
            assert ledger is not None
            clipped_before = ledger.clipped(self.client_id)
            y = self.mechanism(y.reshape(()))
            self._log_release(ledger.clipped(self.client_id) - clipped_before)
        return {"y": float(y.reshape(()))}

    def _release_failure(self) -> None:
        r"""Count a failed evaluation (answered in the clear) as a release of ``epsilon``,
        so a server learns at most ``budget / epsilon`` failure bits."""
        if self.mechanism is None:
            return
        assert self.privacy_ledger is not None
        self.privacy_ledger.record(self.client_id, self.mechanism.epsilon, self.mechanism.delta)
        self._log_release(clipped=0)

    def _log_release(self, clipped: int) -> None:
        r"""Append the release just counted to the log (durable before the reply leaves)."""
        if self._log is not None:
            assert self.mechanism is not None and self.privacy_ledger is not None
            n, position = self.privacy_ledger.releases(self.client_id), self.mechanism.position
            self._log.append({"releases": n, "position": position, "clipped": clipped})

    _STATE = ("history", "mechanism", "privacy", "objective", "release_log")

    def state_dict(self) -> dict:
        return {
            **super().state_dict(),
            "history": [dict(h) for h in self.history],
            "mechanism": None if self.mechanism is None else self.mechanism.state_dict(),
            "privacy": None if self.privacy_ledger is None else self.privacy_ledger.state_dict(),
            "objective": self.objective.state_dict(),
            "release_log": None if self._release_log is None else str(self._release_log),
        }

    def load_state_dict(self, state: dict) -> None:
        owner = f"Client {self.client_id}"
        own, rest = split_state(owner, state, self._STATE)
        super().load_state_dict(rest)
        history = check_history(owner, own["history"])
        if (own["mechanism"] is None) != (self.mechanism is None):
            raise CheckpointError(f"{owner}: the checkpoint's mechanism does not match the run.")
        try:
            if self.mechanism is not None:
                self.mechanism.load_state_dict(own["mechanism"])
                assert self.privacy_ledger is not None
                self.privacy_ledger.load_state_dict(own["privacy"])
            self.objective.load_state_dict(own["objective"])
        except (ValueError, TypeError, KeyError) as exc:
            raise CheckpointError(f"{owner}: {exc}") from exc
        self.history = history
        log = own["release_log"]
        self._release_log = None if log is None else Path(str(log))
        self._log = None  # attach_release_log opens it (and catches up) before a query
