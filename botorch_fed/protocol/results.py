r"""What a federated run produced: :class:`RunResult`, scored by :func:`score_run` from
the clients' ``history`` (read by the harness, never sent)."""

from __future__ import annotations

import collections
import contextlib
import functools
import platform
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import scipy
import torch

from botorch_fed.problems.heterogeneity import ClientObjective


@dataclass
class RunResult:
    r"""What a federated run produced, in the objective's own convention (``minimize``).

    Attributes:
        algorithm: The registered algorithm.
        problem: The objective's name (or the clients' distinct names).
        dim: The dimension.
        minimize: Whether smaller values are better.
        optimal_value: The known optimum (``None``: unknown).
        best_value: Best value evaluated (noise-free for test functions; ``None``: none).
        best_point: Where (in the objective's domain).
        best_per_round: Best value after initialisation (index 0) and each round.
        regret_per_round: ``|best_per_round - optimal_value|`` (if known).
        best_per_client: Each client's own best value.
        best_point_per_client: Each client's own best point.
        cumulative_regret_per_round: ``sum_{s <= t} |value_s - optimal_value|`` over the
            successful evaluations (LDP-BO) or the iterates (FedZero), if known.
        iterate_values_per_round: Noise-free values at the iterates (FedZero; test
            functions).
        average_values_per_round: The same at the iterates' running average.
        privacy: The clients' privacy ledgers merged (LDP-BO).
        recommendation: The recommended point (Co-KG): ``round``, ``client``, ``x``,
            ``x_unit``, ``predicted_value``, ``value`` (test functions).
        steps: Count of steps by kind (init, local, global, ...).
        failures: Failed evaluations (client, round, step, ``x``, error).
        evaluations: All evaluations (client, round, step, ``x``, ``value`` or error).
        time_s: Wall time.
        ledger: Stage times, bytes and exchanges.
        exchanges_per_round: The server's exchanges (round trips to the clients) in round
            0 (initialisation) and each round.
        config: Setup, settings and ``private_randomness``.
        versions: Library versions.
    """

    algorithm: str
    problem: str
    dim: int
    optimal_value: float | None
    best_value: float | None
    best_per_round: list[float | None]
    regret_per_round: list[float | None] | None
    best_per_client: dict[int, float | None]
    steps: dict[str, int]
    time_s: float
    ledger: dict
    config: dict
    versions: dict = field(default_factory=dict)
    minimize: bool = True
    best_point: list[float] | None = None
    failures: list[dict] = field(default_factory=list)
    evaluations: list[dict] = field(default_factory=list)
    best_point_per_client: dict[int, list[float] | None] = field(default_factory=dict)
    recommendation: dict | None = None
    cumulative_regret_per_round: list[float] | None = None
    privacy: dict | None = None
    iterate_values_per_round: list[float] | None = None
    average_values_per_round: list[float] | None = None
    exchanges_per_round: list[int] = field(default_factory=list)

    def to_dict(self) -> dict:
        r"""JSON-friendly dict."""
        out = asdict(self)
        out["best_per_client"] = {str(k): v for k, v in self.best_per_client.items()}
        out["best_point_per_client"] = {str(k): v for k, v in self.best_point_per_client.items()}
        return out


def _best(entries, minimize: bool) -> dict | None:
    r"""The best successful history entry (first of ties), or ``None``."""
    done = [h for h in entries if h["value"] is not None]
    return (min if minimize else max)(done, key=lambda h: h["value"], default=None)


class _BestTracker:
    r"""The best history entry so far, reading only the entries added since the last
    call; ties keep the first in client order, as :func:`_best` does."""

    def __init__(self, clients: dict, minimize: bool) -> None:
        self.clients, self.minimize = clients, minimize
        self.seen = dict.fromkeys(clients, 0)
        self.best_per_client: dict[int, dict | None] = dict.fromkeys(clients)

    def update(self) -> dict | None:
        for cid, client in self.clients.items():
            new = client.history[self.seen[cid] :]
            self.seen[cid] = len(client.history)
            current = [h for h in [self.best_per_client[cid]] if h is not None]
            self.best_per_client[cid] = _best(current + new, self.minimize)
        return _best(
            (h for _, h in sorted(self.best_per_client.items()) if h is not None), self.minimize
        )


def library_versions() -> dict[str, str]:
    r"""Versions of Python and the libraries a run depends on."""
    import botorch
    import gpytorch

    import botorch_fed

    out = {
        "python": platform.python_version(),
        "botorch-fed": botorch_fed.__version__,
        "torch": torch.__version__,
        "botorch": botorch.__version__,
        "gpytorch": gpytorch.__version__,
        "numpy": np.__version__,
        "scipy": scipy.__version__,
    }
    with contextlib.suppress(ImportError):  # an optional extra
        import tenseal

        out["tenseal"] = tenseal.__version__
    return out


def score_run(
    algorithm, setup, server, clients, objectives, best_per_round, time_s, private_randomness="os"
) -> RunResult:
    r"""The :class:`RunResult` of a finished run, from the clients' ``history``."""
    first, histories = objectives[0], [(cid, c.history) for cid, c in sorted(clients.items())]
    minimize, optimum = first.minimize, first.optimal_value
    if any(o.optimal_value != optimum for o in objectives):  # clients' own optima differ
        optimum = None
    evaluations = [{"client": cid, **h} for cid, history in histories for h in history]
    steps = dict(collections.Counter(e["step"] for e in evaluations))
    best = _best((h for _, history in histories for h in history), minimize)
    per_client = {cid: _best(history, minimize) for cid, history in histories}
    # the server's iterates (FedZero) and their running averages, scored noise-free
    iterates = getattr(server, "iterates", None)
    iterate_values = average_values = None
    if iterates and isinstance(first, ClientObjective):
        X = torch.tensor(iterates, dtype=torch.float64)
        running = torch.cumsum(X, 0) / torch.arange(1, len(X) + 1, dtype=X.dtype).unsqueeze(-1)
        values = first.value(torch.cat([X, running]).clamp(0.0, 1.0)).reshape(-1).tolist()
        iterate_values, average_values = values[: len(X)], values[len(X) :]
    regret = cumulative = None
    if optimum is not None:
        regret = [None if b is None else abs(b - optimum) for b in best_per_round]
        if iterate_values is not None:  # an iterate per round (FedZero): sum f(x_t) - f*
            cumulative = np.cumsum([0.0] + [abs(v - optimum) for v in iterate_values]).tolist()
        else:  # every successful evaluation
            per_round = [0.0] * len(best_per_round)
            for e in evaluations:
                if e.get("value") is not None and 0 <= e["round"] < len(per_round):
                    per_round[e["round"]] += abs(e["value"] - optimum)
            cumulative = np.cumsum(per_round).tolist()
    recommendation = getattr(server, "recommendation", None)
    if recommendation is not None:  # scored noise-free for test functions
        recommendation = dict(recommendation)
        objective = objectives[recommendation["client"]] if len(objectives) > 1 else first
        if isinstance(objective, ClientObjective):
            x = torch.tensor([recommendation["x_unit"]], dtype=torch.float64)
            recommendation["value"] = float(objective.value(x).reshape(-1)[0])
    ledgers: list[Any] = [getattr(c, "privacy_ledger", None) for _, c in sorted(clients.items())]
    ledgers = [ledger for ledger in ledgers if ledger is not None]
    names = list(dict.fromkeys(o.name for o in objectives))
    return RunResult(
        algorithm=algorithm,
        problem=names[0] if len(names) == 1 else f"{len(names)} objectives: " + ", ".join(names),
        dim=first.dim,
        optimal_value=optimum,
        best_value=None if best is None else best["value"],
        best_per_round=best_per_round,
        regret_per_round=regret,
        best_per_client={cid: None if h is None else h["value"] for cid, h in per_client.items()},
        steps=steps,
        time_s=time_s,
        ledger=server.ledger.to_dict(),
        config={
            "algorithm": algorithm,
            "setup": setup.describe(),
            "settings": asdict(server.settings),
            "private_randomness": private_randomness,
        },
        versions=library_versions(),
        minimize=minimize,
        best_point=None if best is None else best["x"],
        failures=[dict(e) for e in evaluations if e.get("failed")],
        evaluations=evaluations,
        best_point_per_client={cid: None if h is None else h["x"] for cid, h in per_client.items()},
        recommendation=recommendation,
        cumulative_regret_per_round=cumulative,
        privacy=functools.reduce(lambda a, b: a.merge(b), ledgers).to_dict() if ledgers else None,
        iterate_values_per_round=iterate_values,
        average_values_per_round=average_values,
        exchanges_per_round=server.ledger.exchanges_per_round(len(best_per_round)),
    )
