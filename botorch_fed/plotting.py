r"""Plots of federated runs (matplotlib, an optional dependency)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path


def _pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:  # pragma: no cover - optional extra
        raise ImportError("Plotting needs matplotlib: pip install botorch-fed[plot]") from e
    return plt


def plot_cumulative_regret(
    runs: Sequence[dict], path: str | Path, title: str | None = None
) -> None:
    r"""Cumulative regret ``R_t`` per round (bandit algorithms such as LDP-BO).

    Args:
        runs: ``RunResult.to_dict()`` dicts with ``cumulative_regret_per_round``.
        path: Output PNG file.
        title: Figure title.
    """
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    for r in runs:
        y = r.get("cumulative_regret_per_round")
        if not y:
            raise ValueError(f"Run {r['algorithm']!r} has no cumulative regret (optimum unknown).")
        ax.plot(range(len(y)), y, label=r["algorithm"])
    ax.set_xlabel("round t")
    ax.set_ylabel("cumulative regret R_t")
    ax.set_title(title or f"{runs[0]['problem']} ({runs[0]['dim']}-D)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_iterates(runs: Sequence[dict], path: str | Path, title: str | None = None) -> None:
    r"""The objective at the iterate ``x_t`` and at the running average of the iterates
    per round (FedZero: ``average_values_per_round``, ``iterate_values_per_round``),
    minus the optimum when it is known (log scale then).

    Args:
        runs: ``RunResult.to_dict()`` dicts.
        path: Output PNG file.
        title: Figure title.
    """
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    known = all(r.get("optimal_value") is not None for r in runs)
    for r in runs:
        for key, style, what in (
            ("iterate_values_per_round", ":", "x_t"),
            ("average_values_per_round", "-", "average of x_1..x_t"),
        ):
            y = r.get(key)
            if not y:
                continue
            if known:
                y = [abs(v - r["optimal_value"]) for v in y]
            ax.plot(range(1, len(y) + 1), y, style, label=f"{r['algorithm']}: {what}")
    if known and all(v > 0 for r in runs for v in (r.get("average_values_per_round") or [1])):
        ax.set_yscale("log")
    ax.set_xlabel("round t")
    ax.set_ylabel("f - f*" if known else "f")
    ax.set_title(title or f"{runs[0]['problem']} ({runs[0]['dim']}-D)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_convergence(
    runs: Sequence[dict], path: str | Path, title: str | None = None, ylabel: str | None = None
) -> None:
    r"""Best value (or simple regret, when the optimum is known) per round.

    Args:
        runs: ``RunResult.to_dict()`` dicts (one curve each, labelled by algorithm).
        path: Output PNG file.
        title: Figure title.
        ylabel: y-axis label (default: regret or best value).
    """
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    use_regret = all(r.get("regret_per_round") for r in runs)
    curves = []
    for r in runs:
        y = r["regret_per_round"] if use_regret else r["best_per_round"]
        y = [float("nan") if v is None else v for v in y]  # rounds before any success
        curves.append(y)
        ax.plot(range(len(y)), y, label=r["algorithm"])
    values = [v for y in curves for v in y if v == v]
    if use_regret and values and all(v > 0 for v in values):
        ax.set_yscale("log")
    ax.set_xlabel("round (0 = initial design)")
    better = "lower" if all(r.get("minimize", True) for r in runs) else "higher"
    ax.set_ylabel(ylabel or ("simple regret" if use_regret else f"best value ({better} is better)"))
    ax.set_title(title or f"{runs[0]['problem']} ({runs[0]['dim']}-D)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_comparison(summary: dict, records: dict[str, dict[int, dict]], path: str | Path) -> None:
    r"""A comparison (:func:`~botorch_fed.runs.compare.compare_algorithms`): the final
    scores per algorithm, one point per seed over a box plot, and, where the runs score
    the federation per round, the median score per round with its interquartile band.

    Args:
        summary: The comparison's summary (``summary.json``).
        records: ``records[algorithm][seed]``: the runs' records.
        path: Output PNG file.
    """
    import warnings

    import numpy as np

    plt = _pyplot()
    algorithms = list(summary["algorithms"])
    finals = [[v for v in summary["scores"][a].values() if v is not None] for a in algorithms]
    curves = {
        a: [r["score_per_round"] for r in records[a].values() if r.get("score_per_round")]
        for a in algorithms
    }
    with_curves = all(curves[a] and len(curves[a]) == len(records[a]) for a in algorithms)
    fig, axes = plt.subplots(1, 2 if with_curves else 1, figsize=(11 if with_curves else 6, 4))
    axes = list(np.atleast_1d(axes))
    positive = all(v > 0 for vals in finals for v in vals)
    metric = summary["metric"] if isinstance(summary["metric"], str) else "score"
    if with_curves:
        ax = axes.pop(0)
        for a in algorithms:
            rows = [[np.nan if v is None else v for v in c] for c in curves[a]]
            length = min(len(r) for r in rows)
            Y = np.array([r[:length] for r in rows], dtype=float)
            with warnings.catch_warnings():  # a round where no run has a value yet
                warnings.simplefilter("ignore", RuntimeWarning)
                mid = np.nanmedian(Y, axis=0)
                lo, hi = np.nanpercentile(Y, 25, axis=0), np.nanpercentile(Y, 75, axis=0)
            ax.plot(range(length), mid, label=a)
            ax.fill_between(range(length), lo, hi, alpha=0.2)
        ax.set_xlabel("round t (0: initial designs)")
        ax.set_ylabel(f"{metric} (median, IQR)")
        if positive and np.all(np.array([v for c in curves.values() for r in c for v in r
                                         if v is not None]) > 0):  # fmt: skip
            ax.set_yscale("log")
        ax.legend()
    ax = axes[0]
    ax.boxplot(finals, showfliers=False)
    ax.set_xticks(range(1, len(algorithms) + 1), algorithms, rotation=20)
    rng = np.random.default_rng(0)  # jitter only
    for i, vals in enumerate(finals, start=1):
        ax.scatter(i + rng.uniform(-0.12, 0.12, len(vals)), vals, s=12, alpha=0.7, zorder=3)
    ax.set_ylabel(f"final {metric}")
    if positive:
        ax.set_yscale("log")
    ax.set_title(f"{len(summary['seeds'])} seeds; lower is better")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
