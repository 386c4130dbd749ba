r"""LDP-BO's learner (the server): one query per round, to one user [LDP-BO]; it sees
``x_t`` and the privatised reward, never a raw one."""

from __future__ import annotations

import torch

from botorch_fed.algorithms.ldp_bo.messages import Query, Reward
from botorch_fed.algorithms.ldp_bo.settings import LDPBOSettings, answers_per_user
from botorch_fed.problems.objectives import Objective
from botorch_fed.protocol.checkpoint import CheckpointError, check_tensor, split_state
from botorch_fed.protocol.declarations import ProtocolViolation
from botorch_fed.protocol.messages import TIME_PREFIX
from botorch_fed.protocol.server import FederatedServer


class LDPServer(FederatedServer):
    r"""The learning agent: one query per round, to one user."""

    def __init__(
        self, transport, settings: LDPBOSettings, learner, seed: int, objective: Objective
    ) -> None:
        super().__init__(transport)
        self.settings, self.learner, self.seed = settings, learner, int(seed)
        self.bounds = objective.bounds.to(torch.float64)  # the public domain and convention
        self.minimize = bool(objective.minimize)
        self.user_rng = torch.Generator().manual_seed(self.seed * 7_919 + 3)
        self.failed = 0  # queries that brought no reward
        self.queries: dict[int, int] = {}  # queries sent to each user
        self.capacity = answers_per_user(settings) if learner.rewards.private else None

    def initialize(self) -> None:
        r"""Nothing: the learner starts from the prior (Alg. 1-3, line 2)."""

    def _user(self, t: int) -> int:
        r"""The next user in turn (or a random one) whose public budget covers a query."""
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
        payload = self.send({user: Query(x=x.reshape(-1).numpy(), t=t)})[user].payload
        if {k for k in payload if not k.startswith(TIME_PREFIX)} == {"failed"}:  # no reward
            self.failed += 1
            return
        y = self.decode_reply(Reward, user, f"round-{t} reward", payload).y
        with self.ledger.timer("model_update"):
            self.learner.observe(x, y)

    @property
    def recommendation(self) -> dict | None:
        r"""The maximiser of the surrogate's mean over the finite domain (on a box: over
        the points played)."""
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
        queries = {str(c): n for c, n in sorted(self.queries.items())}
        own = {"learner": self.learner.state_dict(), "user_rng": self.user_rng.get_state()}
        return {**super().state_dict(), **own, "failed": self.failed, "queries": queries}

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
