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
