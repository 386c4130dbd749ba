r"""What a federated run produced: :class:`RunResult`, scored from the clients'
``history`` by :func:`score_run` (the harness reads it; it is never part of the
protocol), with the library versions that produced it."""

from __future__ import annotations

import platform
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch

from botorch_fed.protocol.problem import ClientObjective


@dataclass
class RunResult:
    r"""What a federated run produced, in the objective's own convention (``minimize``;
    built-in test functions minimise, as the CEC-2005 tables).

    Attributes:
        algorithm: The algorithm.
        problem: The objective's name (a test function's class name).
        dim: Dimension.
        minimize: Whether smaller values are better.
        optimal_value: The known optimum (``None`` if unknown).
        best_value: Best value evaluated by the federation (noise-free for test
            functions; ``None`` if every evaluation failed). With different
            objectives per client this compares values of different functions: use
            ``best_per_client`` / ``best_point_per_client`` then.
        best_point: Where (in the objective's domain).
        best_per_round: Best value after initialisation (index 0) and each round.
        regret_per_round: ``|best_per_round - optimal_value|`` (if known).
        best_per_client: Each client's own best value.
        best_point_per_client: Where each client found it.
        cumulative_regret_per_round: ``R_t = sum_{s <= t} |value_s - optimal_value|``
            over every successful evaluation up to round ``t`` (index 0: the
            initialisation), the regret of the bandit literature (LDP-BO); for an
            algorithm with one iterate per round (FedZero) ``sum_{s <= t} f(x_s) - f*``
            over its iterates; ``None`` if the optimum is unknown.
        iterate_values_per_round: The noise-free objective at the algorithm's iterate of
            each round (FedZero's ``x_t``, which no party evaluates), for built-in test
            functions; ``None`` otherwise.
        average_values_per_round: The noise-free objective at the running average of the
            iterates after each round (FedZero's output ``x^`` so far), for built-in test
            functions; ``None`` otherwise.
        privacy: The users' privacy ledgers merged (algorithms whose clients release
            privatised values: LDP-BO): per user the releases, the epsilon and delta
            spent under basic composition and the clipped values; ``None`` otherwise.
        recommendation: The algorithm's own recommended point, where it makes one
            (Co-KG's ``x^``, Alg. 1 line 10 of the slides: the best of the agents'
            local optima): ``round``, ``client``, ``x`` (objective's domain),
            ``x_unit``, the model's ``predicted_value`` and, for built-in test
            functions, the noise-free ``value`` there; ``None`` otherwise.
        steps: Count of steps by kind (init, local, global, ...).
        failures: Failed evaluations: client, round, step, point, error.
        evaluations: Every evaluation in order (client by client): client, round,
            step, point ``x`` in the objective's domain, reported ``value`` (``None``
            if it failed).
        time_s: Wall time of the run.
        ledger: The ledger (stage times, bytes).
        config: Setup and algorithm settings, and where the parties' private randomness
            came from (``private_randomness``: ``"seed"``, ``"crypto_seed"``, ``"os"``).
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

    def to_dict(self) -> dict:
        r"""JSON-friendly dict."""
        out = asdict(self)
        out["best_per_client"] = {str(k): v for k, v in self.best_per_client.items()}
        out["best_point_per_client"] = {str(k): v for k, v in self.best_point_per_client.items()}
        return out


def _best(entries, minimize: bool) -> dict | None:
    r"""The best successful history entry (first of ties), or ``None``."""
    best = None
    for h in entries:
        v = h["value"]
        if v is None:
            continue
        if best is None or (v < best["value"] if minimize else v > best["value"]):
            best = h
    return best


class _BestTracker:
    r"""The best history entry so far, reading only the entries added since the last
    call (a run of ``T`` rounds scores in ``O(T)``, not ``O(T^2)``); ties keep the first
    entry in client order, as :func:`_best` over all histories does."""

    def __init__(self, clients: dict, minimize: bool) -> None:
        self.clients = clients
        self.minimize = minimize
        self.seen = {cid: 0 for cid in clients}
        self.best_per_client: dict[int, dict | None] = {cid: None for cid in clients}

    def update(self) -> dict | None:
        for cid, client in self.clients.items():
            new = client.history[self.seen[cid] :]
            self.seen[cid] = len(client.history)
            current = self.best_per_client[cid]
            found = _best(([] if current is None else [current]) + new, self.minimize)
            self.best_per_client[cid] = found
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
    }
    try:
        import tenseal

        out["tenseal"] = tenseal.__version__
    except ImportError:  # pragma: no cover - optional extra
        pass
    return out


def _objectives_name(objectives) -> str:
    r"""The objectives' common name, or a list of the distinct names."""
    names = list(dict.fromkeys(o.name for o in objectives))
    return names[0] if len(names) == 1 else f"{len(names)} objectives: " + ", ".join(names)


def score_run(
    algorithm,
    setup,
    server,
    clients,
    objectives,
    best_per_round,
    time_s,
    private_randomness: str = "os",
) -> RunResult:
    r"""The :class:`RunResult` of a finished run (the harness reads the clients'
    ``history``; it is never part of the protocol); ``private_randomness`` is
    :attr:`BuildContext.private_randomness`, recorded in its ``config``."""
    first = objectives[0]
    minimize = first.minimize
    optimum = first.optimal_value
    steps: dict[str, int] = {}
    failures, evaluations = [], []
    for cid, c in sorted(clients.items()):
        for h in c.history:
            steps[h["step"]] = steps.get(h["step"], 0) + 1
            evaluations.append({"client": cid, **h})
            if h.get("failed"):
                failures.append({"client": cid, **h})
    best = _best((h for _, c in sorted(clients.items()) for h in c.history), minimize)
    per_client = {cid: _best(c.history, minimize) for cid, c in sorted(clients.items())}
    regret = cumulative = None
    iterate_values, average_values = _iterate_scores(server, objectives)
    if optimum is not None:
        regret = [None if b is None else abs(b - optimum) for b in best_per_round]
        if iterate_values is not None:  # an iterate per round (FedZero): sum f(x_t) - f*
            gaps = [0.0] + [abs(v - optimum) for v in iterate_values]
            cumulative = np.cumsum(gaps).tolist()
        else:
            cumulative = _cumulative_regret(evaluations, optimum, len(best_per_round))
    return RunResult(
        algorithm=algorithm,
        problem=_objectives_name(objectives),
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
        failures=failures,
        evaluations=evaluations,
        best_point_per_client={cid: None if h is None else h["x"] for cid, h in per_client.items()},
        recommendation=_scored_recommendation(server, objectives),
        cumulative_regret_per_round=cumulative,
        privacy=_privacy(clients),
        iterate_values_per_round=iterate_values,
        average_values_per_round=average_values,
    )


def _iterate_scores(server, objectives) -> tuple[list[float] | None, list[float] | None]:
    r"""The noise-free value at each of the server's iterates and at their running
    average (FedZero's output so far), for built-in test functions; ``(None, None)``
    otherwise. The harness scores them; no party evaluates them."""
    iterates = getattr(server, "iterates", None)
    objective = objectives[0]
    if not iterates or not isinstance(objective, ClientObjective):
        return None, None
    X = torch.tensor(iterates, dtype=torch.float64)
    counts = torch.arange(1, len(X) + 1, dtype=torch.float64).unsqueeze(-1)
    running = torch.cumsum(X, 0) / counts
    values = objective.value(torch.cat([X, running]).clamp(0.0, 1.0)).reshape(-1)
    return [float(v) for v in values[: len(X)]], [float(v) for v in values[len(X) :]]


def _cumulative_regret(evaluations: list[dict], optimum: float, rounds: int) -> list[float]:
    r"""``R_t`` for ``t = 0 .. rounds - 1`` from the successful evaluations."""
    per_round = [0.0] * rounds
    for e in evaluations:
        if e.get("value") is not None and 0 <= e["round"] < rounds:
            per_round[e["round"]] += abs(e["value"] - optimum)
    return np.cumsum(per_round).tolist()


def _privacy(clients: dict) -> dict | None:
    r"""The clients' own privacy ledgers, merged (``None`` if none keeps one)."""
    ledgers: list[Any] = [getattr(c, "privacy_ledger", None) for _, c in sorted(clients.items())]
    ledgers = [ledger for ledger in ledgers if ledger is not None]
    if not ledgers:
        return None
    merged = ledgers[0]
    for ledger in ledgers[1:]:
        merged = merged.merge(ledger)
    return merged.to_dict()


def _scored_recommendation(server, objectives) -> dict | None:
    r"""The server's recommendation with, for built-in test functions (whose noise-free
    value is known without spending an evaluation), its ``value`` there."""
    rec = getattr(server, "recommendation", None)
    if rec is None:
        return None
    rec = dict(rec)
    objective = objectives[rec["client"]] if len(objectives) > 1 else objectives[0]
    if isinstance(objective, ClientObjective):
        x = torch.tensor([rec["x_unit"]], dtype=torch.float64)
        rec["value"] = float(objective.value(x).reshape(-1)[0])
    return rec
