r"""A comparison's statistics (:mod:`botorch_fed.runs.compare`): per algorithm the
final score's mean, standard error, median and the worst client's, wins, losses and ties
against the first algorithm, and a paired two-sided Wilcoxon signed-rank test against it,
Holm-corrected over the comparisons (statsmodels); the markdown report."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from botorch_fed.runs.comparison_records import FORMAT


def _holm(pvalues: list[float]) -> list[float]:
    from statsmodels.stats.multitest import multipletests

    return [float(p) for p in multipletests(pvalues, method="holm")[1]] if pvalues else []


def _paired_test(a: np.ndarray, b: np.ndarray) -> float:
    r"""Two-sided Wilcoxon signed-rank p of the paired scores: zero differences dropped
    (Wilcoxon's convention; 1 where all are zero), exact for up to 50 differences
    without ties among their sizes, else the normal approximation -- stated here so
    that every SciPy version computes the same."""
    from scipy.stats import wilcoxon

    d = (a - b)[a != b]
    if len(d) == 0:
        return 1.0
    exact = len(d) <= 50 and len(np.unique(np.abs(d))) == len(d)
    return float(wilcoxon(d, alternative="two-sided", method="exact" if exact else "approx").pvalue)


def min_two_sided_p(pairs: int) -> float:
    r"""The smallest p a two-sided exact Wilcoxon signed-rank test over ``pairs`` pairs
    can give (``2^(1 - pairs)``): below 0.05 only from 6 pairs on."""
    return 2.0 ** (1 - pairs) if pairs else 1.0


def summarize(algorithms: list[str], seeds: list[int], records: dict[str, dict[int, dict]]) -> dict:
    r"""Statistics of the final scores (module docstring): ``algorithms`` (per algorithm:
    ``runs``, ``scored`` (runs with a score; a run without one -- every evaluation of
    some client failed -- counts as a loss against a scored one), ``mean``, ``se``,
    ``median``, ``worst_client_mean`` over the scored runs; against the first: ``wins``,
    ``losses``, ``ties`` over the seeds both ran, ``p`` / ``p_holm`` over the seeds both
    scored), and ``scores`` (``scores[algorithm][seed]``: every run's final score,
    ``None`` where a run has none).

    Raises:
        ValueError: The runs were scored with different metrics (regrets and best values).
    """
    metrics = {rec["metric"] for recs in records.values() for rec in recs.values()}
    if len(metrics) > 1:
        raise ValueError(
            f"The runs were scored with different metrics ({', '.join(sorted(metrics))}): "
            "their scores cannot be compared."
        )
    scores = {
        a: {str(s): records[a][s]["score"] for s in seeds if s in records[a]} for a in algorithms
    }
    ref = algorithms[0]
    stats: dict[str, dict] = {}
    tests: list[tuple[str, float]] = []
    for a in algorithms:
        vals = np.array([v for v in scores[a].values() if v is not None], dtype=float)
        worst = [records[a][s]["worst_client"] for s in seeds if s in records[a]]
        worst_f = np.array([w for w in worst if w is not None], dtype=float)
        entry: dict[str, Any] = {
            "runs": len(scores[a]),
            "scored": int(len(vals)),
            "mean": float(vals.mean()) if len(vals) else None,
            "se": float(vals.std(ddof=1) / math.sqrt(len(vals))) if len(vals) > 1 else None,
            "median": float(np.median(vals)) if len(vals) else None,
            "worst_client_mean": float(worst_f.mean()) if len(worst_f) else None,
        }
        if a != ref:
            ran = [s for s in scores[a] if s in scores[ref]]
            both = [s for s in ran if scores[a][s] is not None and scores[ref][s] is not None]
            x = np.array([scores[a][s] for s in both], dtype=float)
            y = np.array([scores[ref][s] for s in both], dtype=float)
            # a run without a score loses against one with a score; two without: a tie
            only_a = sum(1 for s in ran if scores[a][s] is not None and scores[ref][s] is None)
            only_ref = sum(1 for s in ran if scores[a][s] is None and scores[ref][s] is not None)
            neither = sum(1 for s in ran if scores[a][s] is None and scores[ref][s] is None)
            entry.update(
                paired=len(both),
                wins=int((x < y).sum()) + only_a,
                losses=int((x > y).sum()) + only_ref,
                ties=int((x == y).sum()) + neither,
                p=_paired_test(x, y) if len(both) else None,
            )
            if entry["p"] is not None:
                tests.append((a, entry["p"]))
        stats[a] = entry
    for (a, _), adjusted in zip(tests, _holm([p for _, p in tests]), strict=True):
        stats[a]["p_holm"] = adjusted
    return {
        "format": FORMAT,
        "reference": ref,
        "metric": metrics.pop() if metrics else None,
        "seeds": seeds,
        "algorithms": stats,
        "scores": scores,
    }


def _num(v: float | None, digits: int = 4) -> str:
    return "-" if v is None else f"{v:.{digits}g}"


def summary_markdown(summary: dict) -> str:
    r"""``summary.md``: one row per algorithm (module docstring)."""
    ref = summary["reference"]
    pairs = max((st.get("paired", 0) for st in summary["algorithms"].values()), default=0)
    lines = [
        f"# Comparison over {len(summary['seeds'])} seeds",
        "",
        f"Score: final {summary['metric']} (lower is better). Runs: run (scored); a run "
        f"without a score counts as a loss. Wins/losses/ties and p against {ref}, paired by "
        "seed: two-sided Wilcoxon signed-rank, Holm-corrected over the comparisons (with "
        f"{pairs} pairs its smallest possible p is {min_two_sided_p(pairs):.3g}).",
        "",
        "| algorithm | runs | mean +- s.e. | median | worst client (mean) | wins/losses/ties "
        f"vs {ref} | p | p (Holm) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for a, st in summary["algorithms"].items():
        mean = f"{_num(st['mean'])} +- {_num(st['se'], 2)}"
        wlt = f"{st['wins']}/{st['losses']}/{st['ties']}" if a != ref else "-"
        lines.append(
            f"| {a} | {st['runs']} ({st['scored']}) | {mean} | {_num(st['median'])} | "
            f"{_num(st['worst_client_mean'])} | {wlt} | {_num(st.get('p'), 3)} | "
            f"{_num(st.get('p_holm'), 3)} |"
        )
    return "\n".join(lines) + "\n"
