r"""What a client accepts of the rounds and values the server names: every
algorithm's evaluation budget (:class:`RoundBudget`: round ``t = last + 1 <=
num_rounds``, docs/security.md "Budgets: every algorithm") and the declared domain of a
round the server names (:class:`RoundNumber`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import numpy as np

from botorch_fed.protocol.checkpoint import CheckpointError
from botorch_fed.protocol.declarations import Bound, Domain, FieldError, resolve


def round_seed(seed: int, t: int) -> int:
    r"""The public seed of round ``t``'s stochastic steps in a run seeded ``seed``."""
    return (seed * 1_000_003 + t) % (2**31)


if TYPE_CHECKING:
    from botorch_fed.protocol.declarations import ProtocolViolation

    class _RoundSettings(Protocol):
        @property
        def num_rounds(self) -> int: ...

    class _HasRoundSettings(Protocol):
        r"""A client whose settings name its ``num_rounds`` (:meth:`RoundBudget.round_limit`)."""

        @property
        def settings(self) -> _RoundSettings: ...

    class _RoundClient(Protocol):
        r"""What :class:`RoundBudget` uses of the
        :class:`~botorch_fed.protocol.client.FederatedClient` it is mixed into."""

        round: int | None
        _accepted_round: int

        def violation(self, problem: str, request: str | None = None) -> ProtocolViolation: ...

        def round_limit(self) -> int: ...

        def next_round_problem(self, t: int, last: int) -> str | None: ...


@dataclass(frozen=True)
class RoundNumber(Domain):
    r"""The domain of a round the server names: an ``int`` in ``1 .. num_rounds`` of the
    receiving client's own settings (``limit``, by default its
    :meth:`RoundBudget.round_limit`). Whether it is the round that comes next is the
    client's state: :meth:`RoundBudget.accept_round` checks that."""

    limit: Bound = "round_limit"

    def check(self, value: object, party: object) -> int:
        if isinstance(value, bool | np.bool_) or not isinstance(value, int | np.integer):
            raise FieldError(f"must be an integer (not {type(value).__name__})")
        t, limit = int(value), int(resolve(self.limit, party))
        if not 1 <= t <= limit:
            raise FieldError(
                f"is not one of this run's rounds 1..{limit} (`num_rounds`={limit} of this "
                "client's settings: its evaluation budget)"
            )
        return t


ROUND_STATE = "accepted_round"  # the state key of the last round a client accepted


class RoundBudget:
    r"""A client's evaluation budget: round ``t`` of a run is answered once, in order.

    The server chooses every ``t`` it sends (docs/security.md, "Budgets: every
    algorithm"); a client that took any ``t >= 1`` would evaluate its black box (a costly,
    possibly physical experiment) as often as the server asks -- past ``num_rounds``,
    the same round again, rounds out of order. A handler that evaluates or computes on
    private data therefore first calls :meth:`accept_round` with the round the server
    named: ``t`` must be an ``int`` (not a ``bool``, not a ``float``), within
    ``1 .. num_rounds`` of the client's *own* settings, and the round that comes next
    (by default ``last + 1``; :meth:`next_round_problem` says otherwise for a client
    that answers some rounds only). Anything else raises the client's
    :meth:`~botorch_fed.protocol.client.FederatedClient.violation` before anything
    happens, and the round is spent once accepted (a failed evaluation does not give
    it back).

    Mixed into :class:`~botorch_fed.protocol.client.FederatedClient` subclasses
    (:class:`BOClient`, FedZero's workers, LDP-BO's users). The last round accepted is
    checkpointed under :data:`ROUND_STATE` (:meth:`round_state`,
    :meth:`load_round_state`); a run resumed with a larger ``num_rounds`` continues
    after it.
    """

    _accepted_round: int = 0  # the last round accepted (0: none yet)
    round: int | None  # FederatedClient's: the round this client's errors name

    @property
    def accepted_round(self) -> int:
        r"""The last round this client accepted (0: none yet)."""
        return self._accepted_round

    def round_limit(self: _HasRoundSettings) -> int:
        r"""``num_rounds`` of this client's own settings: the last round it answers."""
        return int(self.settings.num_rounds)

    def next_round_problem(self, t: int, last: int) -> str | None:
        r"""Why round ``t`` (an int in ``last + 1 .. num_rounds``) is not the one this
        client answers next, or ``None`` if it is. Here: every round, in turn
        (``t = last + 1``)."""
        if t != last + 1:
            return (
                f"round t={t} skips round {last + 1} (this client answered round {last} "
                f"last; each round comes once, in turn)"
            )
        return None

    def accept_round(self: _RoundClient, t: object, request: str) -> int:
        r"""Check round ``t`` that the server named and spend it.

        Call it before anything is evaluated or computed on private data.

        Args:
            t: The round the server's message names (its ``t``).
            request: The message type (for the error).

        Returns:
            ``t`` as an ``int``: the round this message may evaluate for.

        Raises:
            ProtocolViolation: Naming the client, ``request`` and ``t``, when ``t`` is
                not an integer, lies outside ``1 .. num_rounds``, is a round already
                answered (or earlier) or is not the round that comes next.
        """
        if isinstance(t, bool | np.bool_) or not isinstance(t, int | np.integer):
            raise self.violation(
                f"the round `t`={t!r:.40} must be an integer (not {type(t).__name__})", request
            )
        t, last, limit = int(t), self._accepted_round, self.round_limit()
        if not 1 <= t <= limit:
            raise self.violation(
                f"round t={t} is not one of this run's rounds 1..{limit} (`num_rounds`="
                f"{limit} of this client's settings: its evaluation budget)",
                request,
            )
        if t <= last:
            raise self.violation(
                f"round t={t}, but this client already answered round {last} (each round "
                "once, in increasing order)",
                request,
            )
        problem = self.next_round_problem(t, last)
        if problem is not None:
            raise self.violation(problem, request)
        self._accepted_round = t
        self.round = t  # named by this client's errors from now on
        return t

    def round_state(self) -> dict:
        r"""The last round accepted, for :meth:`state_dict`."""
        return {ROUND_STATE: self._accepted_round}

    def load_round_state(self, owner: str, state: Mapping) -> dict:
        r"""Restore the last round accepted from a checkpoint ``state``; returns the
        other entries.

        Raises:
            CheckpointError: The saved round is missing or not an int ``>= 0``.
        """
        last = state.get(ROUND_STATE) if isinstance(state, Mapping) else None
        if isinstance(last, bool) or not isinstance(last, int) or last < 0:
            raise CheckpointError(f"{owner}: `{ROUND_STATE}` must be an int >= 0, got {last!r}.")
        self._accepted_round = last
        return {k: v for k, v in state.items() if k != ROUND_STATE}
