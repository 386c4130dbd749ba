r"""A client's evaluation budget (:class:`RoundBudget`; docs/security.md "Budgets: every
algorithm") and the declared domain of a round the server names (:class:`RoundNumber`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from botorch_fed.protocol.checkpoint import CheckpointError
from botorch_fed.protocol.declarations import Bound, Domain, FieldError, _integer, resolve

if TYPE_CHECKING:
    from botorch_fed.protocol.declarations import ProtocolViolation

ROUND_STATE = "accepted_round"  # the state key of the last round a client accepted


def round_seed(seed: int, t: int) -> int:
    r"""The public seed of round ``t``'s stochastic steps in a run seeded ``seed``."""
    return (seed * 1_000_003 + t) % (2**31)


@dataclass(frozen=True)
class RoundNumber(Domain):
    r"""An ``int`` in ``1 .. limit`` (by default the client's :meth:`RoundBudget.round_limit`);
    whether it comes next is checked by :meth:`RoundBudget.accept_round`."""

    limit: Bound = "round_limit"

    def check(self, value: object, party: object) -> int:
        t, limit = _integer(value), int(resolve(self.limit, party))
        if not 1 <= t <= limit:
            raise FieldError(
                f"is not one of this run's rounds 1..{limit} (`num_rounds`={limit} of this "
                "client's settings: its evaluation budget)"
            )
        return t


class RoundBudget:
    r"""Client mixin: each round is answered once, in order, and spent once accepted (a
    failed evaluation does not give it back)."""

    _accepted_round: int = 0  # the last round accepted (0: none yet)
    round: int | None  # FederatedClient's: the round this client's errors name
    client_id: int
    if TYPE_CHECKING:

        def violation(self, problem: str, request: str | None = None) -> ProtocolViolation: ...

    @property
    def accepted_round(self) -> int:
        r"""The last round this client accepted (0: none yet)."""
        return self._accepted_round

    def round_limit(self) -> int:
        r"""``num_rounds`` of this client's own settings: the last round it answers."""
        return int(self.settings.num_rounds)  # type: ignore[attr-defined]

    def next_round_problem(self, t: int, last: int) -> str | None:
        r"""Why round ``t > last`` is not the one this client answers next (``None``: it is)."""
        if t != last + 1:
            return (
                f"round t={t} skips round {last + 1} (this client answered round {last} "
                f"last; each round comes once, in turn)"
            )
        return None

    def accept_round(self, t: object, request: str) -> int:
        r"""Spend round ``t`` before anything touches private data; :class:`ProtocolViolation`
        unless it is an integer in ``1 .. round_limit()`` (checked here too, whatever domain
        a message declared for it) and the round that comes next."""
        try:
            t = RoundNumber().check(t, self)
        except FieldError as exc:
            raise self.violation(f"the round `t`={t!r:.40} {exc}", request) from None
        if t <= self._accepted_round:
            raise self.violation(
                f"round t={t}, but this client already answered round {self._accepted_round} "
                "(each round once, in increasing order)",
                request,
            )
        problem = self.next_round_problem(t, self._accepted_round)
        if problem is not None:
            raise self.violation(problem, request)
        self._accepted_round = self.round = t  # named by this client's errors from now on
        return t

    def state_dict(self) -> dict:
        r"""The client's state with the last round accepted."""
        return {**super().state_dict(), ROUND_STATE: self._accepted_round}  # type: ignore[misc]

    def load_state_dict(self, state: dict) -> None:
        r"""Restore :meth:`state_dict`: the last round accepted, then the rest."""
        last = state.get(ROUND_STATE) if isinstance(state, Mapping) else None
        if isinstance(last, bool) or not isinstance(last, int) or last < 0:
            raise CheckpointError(
                f"Client {self.client_id}: `{ROUND_STATE}` must be an int >= 0, got {last!r}."
            )
        super().load_state_dict({k: v for k, v in state.items() if k != ROUND_STATE})  # type: ignore[misc]
        self._accepted_round = last  # once the rest loaded: a refused state changes nothing
