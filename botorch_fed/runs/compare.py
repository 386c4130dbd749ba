r"""Several algorithms on the same federation and seeds, with paired statistics
(``botorch-fed compare``; :func:`compare_algorithms` in Python).

Every algorithm runs on the same problem, initial designs and seeds (the run's seed
fixes both), in parallel processes; each finished run is written at once to
``out/runs/<algorithm>/seed-<s>.json``, so an interrupted comparison continues where it
stopped (a run is reused only when its algorithm's setup and settings are the ones
asked for). The report per algorithm: the final score's mean +- standard error and
median, the worst client's, wins against the first algorithm and a paired two-sided
Wilcoxon signed-rank test against it over the seeds, Holm-corrected over the
comparisons (``summary.json``, ``summary.md``; ``botorch-fed compare`` draws
``summary.png`` with :func:`~botorch_fed.plotting.plot_comparison`).

The score (lower is better) is the final simple regret where every client's optimum
is known: the federation's (``f* - best value over all clients``) when all clients
share one objective, else the mean over clients of each client's own simple regret on
its own objective (shifted or rotated clients, per-client black boxes: does every party
gain?). A moved client whose optimum the clipping may have cut away is scored against
the function's optimum, a bound its values never beat (its regret is then an upper
bound, the same for every algorithm; the records list such clients). Where an optimum
is unknown (the user's black box) the score is the best value found, oriented so that
lower is better (negated for a maximised objective).
"""

from __future__ import annotations

import dataclasses
import json
import math
import multiprocessing
import os
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from pathlib import Path
from typing import Any

import numpy as np

from botorch_fed.runs.outputs import write_json

MANIFEST = "compare.json"
RUNS = "runs"
SUMMARY = "summary"  # .json, .md, .png
FORMAT = 1
METRICS = ("federation regret", "mean client regret", "best value", "mean client best value")


@dataclasses.dataclass
class Comparison:
    r"""The runs of a comparison and their statistics.

    Attributes:
        algorithms: The algorithms, the first being the reference of the paired tests.
        seeds: The seeds, each run by every algorithm.
        records: ``records[algorithm][seed]``: one run's record (:func:`run_record`).
        summary: Per-algorithm statistics and every run's final score
            (:func:`summarize`); what ``summary.json`` holds.
    """

    algorithms: list[str]
    seeds: list[int]
    records: dict[str, dict[int, dict]]
    summary: dict

    def markdown(self) -> str:
        r"""The summary as a markdown report (``summary.md``)."""
        return summary_markdown(self.summary)


def _fingerprint(algorithm: str, setup, settings) -> dict:
    r"""What a run of ``algorithm`` depends on, besides its seed (JSON-friendly)."""
    described = setup.describe()
    described.pop("seed")
    described.pop("threads")  # how fast, not what
    return json.loads(
        json.dumps(
            {"algorithm": algorithm, "setup": described, "settings": dataclasses.asdict(settings)},
            default=repr,
        )
    )


def run_record(algorithm: str, setup, settings) -> dict:
    r"""Run ``algorithm`` once in this process and score it (module docstring).

    Returns:
        A JSON-friendly record: ``algorithm``, ``seed``, ``metric``, ``score``,
        ``worst_client``, ``best_value``, ``optimal_value``, ``client_best``,
        ``client_optimum`` (the bound ``optimum_bound`` for the clients listed in
        ``client_optimum_bound_only``), ``client_score``, ``score_per_round`` (the federation's
        regret or best value after each round), ``time_s`` and ``fingerprint``.
    """
    from botorch_fed.algorithms import run_federated  # registers the algorithms

    result = run_federated(algorithm, setup, settings)
    objectives = setup.make_objectives()
    shared = _shared_objective(setup)
    sign = 1.0 if result.minimize else -1.0
    exact = {cid: objectives[cid].optimal_value for cid in result.best_per_client}
    # a moved client whose optimum may be clipped away: regret against the bound (f*)
    optima = {c: v if v is not None else objectives[c].optimum_bound for c, v in exact.items()}
    known = all(v is not None for v in optima.values())
    inexact = sorted(c for c in optima if exact[c] is None and optima[c] is not None)
    client_score: dict[str, float | None] = {}
    for cid, best in result.best_per_client.items():
        if best is None:
            client_score[str(cid)] = None
        elif known:
            client_score[str(cid)] = abs(best - optima[cid])
        else:
            client_score[str(cid)] = sign * best
    finite = [v for v in client_score.values() if v is not None]
    if shared:
        metric = "federation regret" if known else "best value"
        best = result.best_value
        optimum = optima[0]

        def scored(b: float | None) -> float | None:
            if b is None:
                return None
            return abs(b - optimum) if optimum is not None else sign * b

        score = scored(result.best_value)
        per_round = [scored(b) for b in result.best_per_round]
    else:
        metric = "mean client regret" if known else "mean client best value"
        # a client without a successful evaluation has no score: the run has none either
        score = float(np.mean(finite)) if len(finite) == len(client_score) else None
        per_round = None  # the clients' own bests per round are not in the result
    return {
        "algorithm": algorithm,
        "seed": setup.seed,
        "metric": metric,
        "score": score,
        "worst_client": max(finite) if len(finite) == len(client_score) else None,
        "best_value": result.best_value,
        "optimal_value": result.optimal_value,
        "client_best": {str(c): v for c, v in result.best_per_client.items()},
        "client_optimum": {str(c): v for c, v in optima.items()},
        "client_optimum_bound_only": [str(c) for c in inexact],
        "client_score": client_score,
        "score_per_round": per_round,
        "time_s": result.time_s,
        "fingerprint": _fingerprint(algorithm, setup, settings),
    }


def _shared_objective(setup) -> bool:
    r"""Whether every client optimises the same objective."""
    from botorch_fed.problems.objectives import Objective

    if setup.problem is not None:
        return setup.shift == 0 and setup.rotation == 0
    return isinstance(setup.objectives, Objective) or len(setup.objectives) == 1


def _job(job: tuple[str, str, Any, Any]) -> dict:
    r"""One run in a worker process (one torch thread: the pool is the parallelism)."""
    import warnings

    import torch

    from botorch_fed.runs.prepare import library_warnings_ignored

    torch.set_num_threads(1)
    with library_warnings_ignored(), warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        label, algorithm, setup, settings = job
        return {**run_record(algorithm, setup, settings), "algorithm": label}


def _seeds(seeds: int | Sequence[int], first: int) -> list[int]:
    if isinstance(seeds, bool):
        raise ValueError(f"`seeds` must be a count or a list of seeds, got {seeds!r}.")
    if isinstance(seeds, int):
        if seeds < 1:
            raise ValueError(f"`seeds`={seeds} must be >= 1.")
        return list(range(first, first + seeds))
    out = [int(s) for s in seeds]
    if not out or len(set(out)) != len(out) or any(s < 0 for s in out):
        raise ValueError(f"`seeds` must be distinct seeds >= 0, at least one; got {seeds!r}.")
    return out


def _check_manifest(out: Path, fingerprints: dict[str, dict]) -> None:
    r"""Refuse an ``out`` folder holding runs of other setups or settings."""
    path = out / MANIFEST
    if not path.exists():
        return
    try:
        stored = json.loads(path.read_text())
        old = stored["fingerprints"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"`out` {out}: {MANIFEST} is not a comparison's ({exc}).") from None
    for algorithm, fp in fingerprints.items():
        if algorithm in old and old[algorithm] != fp:
            keys = _differences(old[algorithm], fp)
            raise ValueError(
                f"`out` {out} holds runs of {algorithm} with other options ({', '.join(keys)}); "
                "give another folder, or the same options to continue that comparison."
            )


def _differences(a: Any, b: Any, prefix: str = "") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        keys = sorted(set(a) | set(b))
        return [d for k in keys for d in _differences(a.get(k), b.get(k), f"{prefix}{k}.")]
    return [] if a == b else [prefix.rstrip(".")]


def _load_runs(out: Path, algorithms: list[str], seeds: list[int], fps: dict) -> dict:
    records: dict[str, dict[int, dict]] = {a: {} for a in algorithms}
    for a in algorithms:
        for s in seeds:
            path = out / RUNS / a / f"seed-{s}.json"
            if not path.exists():
                continue
            try:
                rec = json.loads(path.read_text())
            except (OSError, ValueError):
                continue  # an unreadable record is run again (and overwritten)
            if rec.get("fingerprint") == fps[a] and rec.get("seed") == s:
                records[a][s] = rec
    return records


def compare_algorithms(
    algorithms: Sequence[str] | Mapping[str, Any],
    setup,
    seeds: int | Sequence[int] = 5,
    jobs: int = 1,
    out: str | os.PathLike | None = None,
    on_run: Callable[[dict, int, int], None] | None = None,
) -> Comparison:
    r"""Run every algorithm on every seed of one federation and compare them.

    Args:
        algorithms: Registered algorithm names, or ``{name: settings}`` (``None``: the
            algorithm's default settings), or ``{label: (name, settings)}`` (e.g. two
            configurations of one algorithm). The first is the reference of the tests.
        setup: The federation (:class:`~botorch_fed.protocol.setup.FederationSetup`), or
            ``{name: setup}`` (e.g. an aggregator for the algorithms that aggregate),
            all with the same ``seed``.
        seeds: A count ``N`` (seeds ``setup.seed ... setup.seed + N - 1``) or the seeds.
        jobs: Parallel worker processes (``1``: in this process).
        out: A folder for every run's record, ``summary.json`` and ``summary.md``; the
            runs stored there for the same setups and settings are not run again.
        on_run: Hook ``(record, done, total)`` after each run (stored ones first).

    Returns:
        The :class:`Comparison`.
    """
    from botorch_fed.algorithms import get_algorithm

    names = list(algorithms)
    if not names or len(set(names)) != len(names):
        raise ValueError(f"`algorithms` must name distinct algorithms, got {names!r}.")
    given: dict[str, Any] = dict(algorithms) if isinstance(algorithms, Mapping) else {}
    # a label's value may be (registered algorithm, settings): two configurations of one
    pairs = {a: v if isinstance(v := given.get(a), tuple) else (a, v) for a in names}
    registered = {a: pairs[a][0] for a in names}
    specs = {a: get_algorithm(registered[a]) for a in names}  # unknown names: ValueError
    chosen = {a: pairs[a][1] for a in names}
    settings: dict[str, Any] = {
        a: specs[a].settings_class() if chosen[a] is None else chosen[a] for a in names
    }
    setups = (
        {a: setup[a] for a in names} if isinstance(setup, Mapping) else dict.fromkeys(names, setup)
    )
    firsts = {s.seed for s in setups.values()}
    if len(firsts) != 1:
        raise ValueError(f"The setups of `setup` have different seeds {sorted(firsts)}.")
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise ValueError(f"`jobs`={jobs!r} must be an integer >= 1.")
    seed_list = _seeds(seeds, firsts.pop())
    for a in names:
        if type(settings[a]) is not specs[a].settings_class:
            raise ValueError(
                f"`algorithms`[{a!r}]: {registered[a]} takes {specs[a].settings_class.__name__}, "
                f"got {type(settings[a]).__name__}."
            )
        settings[a].validate()
        setups[a].validate(registered[a])
    fps = {a: _fingerprint(registered[a], setups[a], settings[a]) for a in names}
    folder = None if out is None else Path(out)
    records: dict[str, dict[int, dict]] = {a: {} for a in names}
    if folder is not None:
        if folder.exists() and not folder.is_dir():
            raise ValueError(f"`out` {folder} is a file; give a folder.")
        folder.mkdir(parents=True, exist_ok=True)
        _check_manifest(folder, fps)
        records = _load_runs(folder, names, seed_list, fps)
        manifest = {"format": FORMAT, "fingerprints": fps}
        if (folder / MANIFEST).exists():  # keep the algorithms of earlier invocations
            old = json.loads((folder / MANIFEST).read_text())["fingerprints"]
            manifest["fingerprints"] = {**old, **fps}
        write_json(manifest, str(folder / MANIFEST))
    todo = [(a, s) for s in seed_list for a in names if s not in records[a]]
    total, done = len(names) * len(seed_list), 0
    for a in names:
        for rec in records[a].values():
            done += 1
            if on_run is not None:
                on_run(rec, done, total)

    def store(rec: dict) -> None:
        nonlocal done
        records[rec["algorithm"]][rec["seed"]] = rec
        if folder is not None:
            (folder / RUNS / rec["algorithm"]).mkdir(parents=True, exist_ok=True)
            write_json(rec, str(folder / RUNS / rec["algorithm"] / f"seed-{rec['seed']}.json"))
        done += 1
        if on_run is not None:
            on_run(rec, done, total)

    jobs_ = [
        (a, registered[a], dataclasses.replace(setups[a], seed=s), settings[a]) for a, s in todo
    ]
    if jobs == 1 or len(jobs_) <= 1:
        for job in jobs_:
            store(_job(job))
    else:
        # spawn: torch's thread pools do not survive a fork
        context = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(min(jobs, len(jobs_)), mp_context=context) as pool:
            pending = {pool.submit(_job, job) for job in jobs_}
            try:
                while pending:
                    finished, pending = wait(pending, return_when=FIRST_COMPLETED)
                    for future in finished:
                        store(future.result())
            except BaseException:
                for future in pending:
                    future.cancel()
                raise
    summary = summarize(names, seed_list, records)
    comparison = Comparison(names, seed_list, records, summary)
    if folder is not None:
        write_json(summary, str(folder / f"{SUMMARY}.json"))
        (folder / f"{SUMMARY}.md").write_text(comparison.markdown())
    return comparison


def _holm(pvalues: list[float]) -> list[float]:
    from statsmodels.stats.multitest import multipletests

    return [float(p) for p in multipletests(pvalues, method="holm")[1]] if pvalues else []


def _paired_test(a: np.ndarray, b: np.ndarray) -> float:
    r"""Two-sided Wilcoxon signed-rank p of the paired scores (1 where all are equal)."""
    from scipy.stats import wilcoxon

    if np.all(a == b):
        return 1.0
    return float(wilcoxon(a, b, alternative="two-sided").pvalue)


def summarize(algorithms: list[str], seeds: list[int], records: dict[str, dict[int, dict]]) -> dict:
    r"""Statistics of the final scores (module docstring): ``algorithms`` (per algorithm:
    ``runs``, ``mean``, ``se``, ``median``, ``worst_client_mean``, ``wins``, ``losses``,
    ``ties`` and ``p``/``p_holm`` against the first over the seeds both scored), and
    ``scores`` (``scores[algorithm][seed]``: every run's final score, ``None`` where a
    run has none)."""
    metrics = {rec["metric"] for recs in records.values() for rec in recs.values()}
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
            both = [
                s for s in scores[a] if scores[a][s] is not None and scores[ref].get(s) is not None
            ]
            x = np.array([scores[a][s] for s in both], dtype=float)
            y = np.array([scores[ref][s] for s in both], dtype=float)
            entry.update(
                paired=len(both),
                wins=int((x < y).sum()),
                losses=int((x > y).sum()),
                ties=int((x == y).sum()),
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
        "metric": metrics.pop() if len(metrics) == 1 else sorted(metrics),
        "seeds": seeds,
        "algorithms": stats,
        "scores": scores,
    }


def _num(v: float | None, digits: int = 4) -> str:
    return "-" if v is None else f"{v:.{digits}g}"


def summary_markdown(summary: dict) -> str:
    r"""``summary.md``: one row per algorithm (module docstring)."""
    ref = summary["reference"]
    metric = summary["metric"]
    lines = [
        f"# Comparison over {len(summary['seeds'])} seeds",
        "",
        f"Score: final {metric if isinstance(metric, str) else ' / '.join(metric)} (lower is "
        f"better). Wins/losses/ties and p against {ref}, paired by seed: two-sided Wilcoxon "
        "signed-rank, Holm-corrected over the comparisons.",
        "",
        "| algorithm | runs | mean +- s.e. | median | worst client (mean) | wins/losses/ties "
        f"vs {ref} | p | p (Holm) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for a, st in summary["algorithms"].items():
        mean = f"{_num(st['mean'])} +- {_num(st['se'], 2)}"
        wlt = f"{st['wins']}/{st['losses']}/{st['ties']}" if a != ref else "-"
        lines.append(
            f"| {a} | {st['runs']} | {mean} | {_num(st['median'])} | "
            f"{_num(st['worst_client_mean'])} | {wlt} | {_num(st.get('p'), 3)} | "
            f"{_num(st.get('p_holm'), 3)} |"
        )
    return "\n".join(lines) + "\n"
