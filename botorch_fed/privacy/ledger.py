r"""Per-user privacy accounting under basic composition.

The Laplace mechanism of LDP-BO (Zhou & Tan, "Local Differential Privacy for Bayesian
Optimization", 2020, Sec. 4.1, Curator 1 ``CTL(epsilon)`` and Lemma 1) is
``epsilon``-LDP *per reported value*. A user who reports ``k`` values (``k`` rounds,
or one vector of ``k`` entries) has, by basic composition (Dwork & Roth, "The
Algorithmic Foundations of Differential Privacy", 2014, Thm 3.16), spent
``sum_i epsilon_i`` and ``sum_i delta_i`` -- ``k * epsilon`` for ``k`` releases with the
same parameters. :class:`PrivacyLedger` keeps that sum per user.

Basic composition is an upper bound and is tight only in the worst case; advanced
composition (Dwork & Roth Thm 3.20) gives smaller totals for many releases but is not
implemented here. A ``delta`` total ``>= 1`` is a vacuous guarantee; it is reported
as is, never capped.
"""

from __future__ import annotations

import math
from collections.abc import Hashable
from typing import Any

from botorch_fed.privacy._validation import (
    check_count,
    check_positive_finite,
    check_probability,
    check_user,
)

__all__ = ["PrivacyLedger"]

_NOTE = (
    "Basic composition (Dwork & Roth 2014, Thm 3.16): a user who answers k times with an "
    "(epsilon, delta)-LDP mechanism has spent k*epsilon and k*delta, so each user's "
    "epsilon and delta are the sums over that user's releases."
)

_STATE_VERSION = 1


class _Account:
    r"""One user's releases, grouped by their ``(epsilon, delta)`` parameters."""

    __slots__ = ("counts", "clipped")

    def __init__(self) -> None:
        # (epsilon, delta) -> number of values released with those parameters.
        self.counts: dict[tuple[float, float], int] = {}
        self.clipped = 0

    def add(self, epsilon: float, delta: float, count: int, clipped: int) -> None:
        key = (epsilon, delta)
        self.counts[key] = self.counts.get(key, 0) + count
        self.clipped += clipped

    @property
    def releases(self) -> int:
        return sum(self.counts.values())

    def spent(self) -> tuple[float, float]:
        # One product per distinct parameter pair, summed with fsum: k releases of
        # the same epsilon give exactly the float k * epsilon (no k-fold rounding).
        eps = math.fsum(c * e for (e, _), c in self.counts.items())
        dlt = math.fsum(c * d for (_, d), c in self.counts.items())
        return eps, dlt


class PrivacyLedger:
    r"""Per-user record of private releases and the privacy spent under basic composition.

    Each :meth:`record` call registers ``count`` values released by one user with an
    ``(epsilon, delta)``-LDP mechanism; the user's total is
    ``(sum count * epsilon, sum count * delta)`` (basic composition, Dwork & Roth
    Thm 3.16). The guarantee of the Laplace mechanism (paper Sec. 4.1, Lemma 1) is per
    release and per user: it protects each reported value, and a user who answers
    ``k`` queries is ``k * epsilon``-LDP.

    Users are identified by an ``int``, a ``str`` or ``None``. Querying a user who
    never released anything returns zeros (nothing was spent). The ledger is not
    thread-safe.

    Example:
        >>> ledger = PrivacyLedger()
        >>> ledger.record("alice", epsilon=0.5, count=3)
        >>> ledger.spent("alice")
        (1.5, 0.0)
    """

    def __init__(self) -> None:
        self._accounts: dict[int | str | None, _Account] = {}

    # ----------------------------------------------------------------------- recording
    def record(
        self,
        user: int | str | None,
        epsilon: float,
        delta: float = 0.0,
        count: int = 1,
        clipped: int = 0,
    ) -> None:
        r"""Register ``count`` values released by ``user`` with an
        ``(epsilon, delta)``-LDP mechanism.

        Args:
            user: The user who released the values (``int``, ``str`` or ``None``).
            epsilon: Privacy parameter of each release; ``0 < epsilon < inf``.
            delta: Failure probability of each release; ``0 <= delta < 1``.
            count: Number of values released (e.g. ``y.numel()``); integer ``>= 1``.
            clipped: How many of them were clipped to the mechanism's bound; integer
                in ``[0, count]``.

        Raises:
            TypeError: If ``user`` is not an int/str/None, ``epsilon``/``delta`` are
                not real numbers, or ``count``/``clipped`` are not integers.
            ValueError: If a value is outside its domain (the message names it).
        """
        user = check_user(user)
        epsilon = check_positive_finite("epsilon", epsilon)
        delta = check_probability("delta", delta, allow_zero=True)
        count = check_count("count", count, minimum=1)
        clipped = check_count("clipped", clipped, minimum=0, maximum=count)
        self._accounts.setdefault(user, _Account()).add(epsilon, delta, count, clipped)

    # ----------------------------------------------------------------------- queries
    def releases(self, user: int | str | None) -> int:
        r"""Number of values ``user`` has released (0 for an unknown user).

        Raises:
            TypeError: If ``user`` is not an int, a str or None.
        """
        acc = self._accounts.get(check_user(user))
        return 0 if acc is None else acc.releases

    def spent(self, user: int | str | None) -> tuple[float, float]:
        r"""``(epsilon_total, delta_total)`` of ``user`` under basic composition.

        Returns:
            The sums of ``epsilon`` and ``delta`` over the user's releases
            (``(0.0, 0.0)`` for an unknown user).

        Raises:
            TypeError: If ``user`` is not an int, a str or None.
        """
        acc = self._accounts.get(check_user(user))
        return (0.0, 0.0) if acc is None else acc.spent()

    def clipped(self, user: int | str | None) -> int:
        r"""Number of ``user``'s released values that were clipped (0 if unknown).

        Raises:
            TypeError: If ``user`` is not an int, a str or None.
        """
        acc = self._accounts.get(check_user(user))
        return 0 if acc is None else acc.clipped

    def breakdown(self, user: int | str | None) -> list[tuple[float, float, int]]:
        r"""The distinct parameters of ``user``'s releases.

        Returns:
            ``[(epsilon, delta, count), ...]`` in first-use order (empty for an
            unknown user).

        Raises:
            TypeError: If ``user`` is not an int, a str or None.
        """
        acc = self._accounts.get(check_user(user))
        return [] if acc is None else [(e, d, c) for (e, d), c in acc.counts.items()]

    @property
    def users(self) -> list[int | str | None]:
        r"""Users with at least one release, in order of their first release."""
        return list(self._accounts)

    def __len__(self) -> int:
        return len(self._accounts)

    def __repr__(self) -> str:
        total = sum(a.releases for a in self._accounts.values())
        return f"PrivacyLedger(users={len(self._accounts)}, releases={total})"

    # ----------------------------------------------------------------------- reports
    def to_dict(self) -> dict[str, Any]:
        r"""A JSON-serialisable summary.

        Returns:
            ``{"composition": "basic", "users": {str(user): {"releases", "epsilon",
            "delta", "clipped"}}, "max_epsilon", "max_delta", "total_releases",
            "note"}``; the maxima are over users (0.0 without users).

        Raises:
            ValueError: If two users have the same string form (e.g. ``1`` and
                ``"1"``), which a JSON object cannot keep apart.
        """
        users: dict[str, dict[str, Any]] = {}
        owners: dict[str, Hashable] = {}
        for user, acc in self._accounts.items():
            key = str(user)
            if key in users:
                raise ValueError(
                    f"users {owners[key]!r} and {user!r} have the same string form {key!r}; "
                    "to_dict cannot keep them apart"
                )
            owners[key] = user
            eps, dlt = acc.spent()
            users[key] = {
                "releases": acc.releases,
                "epsilon": eps,
                "delta": dlt,
                "clipped": acc.clipped,
            }
        return {
            "composition": "basic",
            "users": users,
            "max_epsilon": max((u["epsilon"] for u in users.values()), default=0.0),
            "max_delta": max((u["delta"] for u in users.values()), default=0.0),
            "total_releases": sum(u["releases"] for u in users.values()),
            "note": _NOTE,
        }

    def merge(self, other: PrivacyLedger) -> PrivacyLedger:
        r"""A new ledger holding the releases of both (neither input is modified).

        A user present in both has the two records summed (e.g. several users' own
        ledgers collected for one report, or a user seen by two servers).

        Args:
            other: Another :class:`PrivacyLedger`.

        Returns:
            The combined ledger.

        Raises:
            TypeError: If ``other`` is not a :class:`PrivacyLedger`.
        """
        if not isinstance(other, PrivacyLedger):
            raise TypeError(f"other must be a PrivacyLedger, got {type(other).__name__}")
        out = PrivacyLedger()
        for src in (self, other):
            for user, acc in src._accounts.items():
                dst = out._accounts.setdefault(user, _Account())
                for (e, d), c in acc.counts.items():
                    dst.add(e, d, c, 0)
                dst.clipped += acc.clipped
        return out

    # ----------------------------------------------------------------------- checkpoints
    def state_dict(self) -> dict[str, Any]:
        r"""The full state as plain Python (ints, floats, strs, lists): it round-trips
        exactly through :meth:`load_state_dict`, ``torch.save`` and ``json``.

        Returns:
            ``{"version": 1, "users": [{"user": user, "clipped": int,
            "releases": [[epsilon, delta, count], ...]}, ...]}``.
        """
        return {
            "version": _STATE_VERSION,
            "users": [
                {
                    "user": user,
                    "clipped": acc.clipped,
                    "releases": [[e, d, c] for (e, d), c in acc.counts.items()],
                }
                for user, acc in self._accounts.items()
            ],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        r"""Replace this ledger's content by ``state`` (from :meth:`state_dict`).

        Every entry is validated as in :meth:`record`; on any error the ledger is left
        unchanged.

        Args:
            state: A dict as returned by :meth:`state_dict`.

        Raises:
            TypeError: If ``state`` or one of its parts has the wrong type.
            ValueError: If the version is unknown or an entry is out of its domain.
        """
        if not isinstance(state, dict):
            raise TypeError(f"state must be a dict, got {type(state).__name__}")
        version = state.get("version")
        if version != _STATE_VERSION:
            raise ValueError(f"state['version'] must be {_STATE_VERSION}, got {version!r}")
        entries = state.get("users")
        if not isinstance(entries, list | tuple):
            raise TypeError(f"state['users'] must be a list, got {type(entries).__name__}")
        accounts: dict[int | str | None, _Account] = {}
        for i, entry in enumerate(entries):
            if not isinstance(entry, dict) or set(entry) != {"user", "clipped", "releases"}:
                raise ValueError(
                    f"state['users'][{i}] must be a dict with keys 'user', 'clipped', "
                    f"'releases', got {entry!r}"
                )
            user = check_user(entry["user"])
            if user in accounts:
                raise ValueError(f"state['users'][{i}]: user {user!r} appears twice")
            rels = entry["releases"]
            if not isinstance(rels, list | tuple) or not rels:
                raise ValueError(
                    f"state['users'][{i}]['releases'] must be a non-empty list, got {rels!r}"
                )
            acc = _Account()
            for j, rel in enumerate(rels):
                if not isinstance(rel, list | tuple) or len(rel) != 3:
                    raise ValueError(
                        f"state['users'][{i}]['releases'][{j}] must be "
                        f"[epsilon, delta, count], got {rel!r}"
                    )
                e = check_positive_finite("epsilon", rel[0])
                d = check_probability("delta", rel[1], allow_zero=True)
                c = check_count("count", rel[2], minimum=1)
                if (e, d) in acc.counts:
                    raise ValueError(
                        f"state['users'][{i}]['releases'][{j}]: parameters "
                        f"(epsilon={e!r}, delta={d!r}) appear twice"
                    )
                acc.add(e, d, c, 0)
            acc.clipped = check_count("clipped", entry["clipped"], minimum=0, maximum=acc.releases)
            accounts[user] = acc
        self._accounts = accounts
