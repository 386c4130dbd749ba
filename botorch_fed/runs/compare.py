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

The score of a run and its fingerprint: :mod:`~botorch_fed.runs.comparison_records`;
the statistics and the report: :mod:`~botorch_fed.runs.comparison_statistics`.
"""

from __future__ import annotations

import dataclasses
import json
import multiprocessing
import os
import re
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from pathlib import Path
from typing import Any

from botorch_fed.runs.comparison_records import (
    FORMAT,
    _comparable,
    _fingerprint,
    run_record,
    score_record,
    torch_device_type,
)
from botorch_fed.runs.comparison_statistics import summarize, summary_markdown
from botorch_fed.runs.outputs import write_json

MANIFEST = "compare.json"
_LABEL = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]*")
RUNS = "runs"
SUMMARY = "summary"  # .json, .md, .png


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

    def __repr__(self) -> str:
        means = ", ".join(
            f"{a}: {'-' if st['mean'] is None else format(st['mean'], '.4g')}"
            for a, st in self.summary["algorithms"].items()
        )
        return f"Comparison({len(self.seeds)} seeds; mean final {self.summary['metric']}: {means})"


class ComparisonRunError(RuntimeError):
    r"""A run of a comparison failed (the finished runs are kept in ``out``).

    Attributes:
        algorithm: The failed run's algorithm (its label).
        seed: Its seed.
    """

    def __init__(
        self, algorithm: str, seed: int, cause: BaseException, which: str | None = None
    ) -> None:
        where = f"seed {seed}" if which is None else which
        super().__init__(f"the run of {algorithm} at {where} failed: "
                         f"{type(cause).__name__}: {cause}")  # fmt: skip
        self.algorithm, self.seed = algorithm, seed


def _job(job: tuple[str, str, Any, Any]) -> dict:
    r"""One run (in this process or a worker; ``setup.threads`` torch threads)."""
    import warnings

    from botorch_fed.runs.prepare import library_warnings_ignored

    label, algorithm, setup, settings = job
    try:
        with library_warnings_ignored(), warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            return {**run_record(algorithm, setup, settings), "algorithm": label}
    except Exception as exc:  # named by algorithm and seed, whichever process ran it
        raise ComparisonRunError(label, setup.seed, exc) from exc


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


def _check_manifest(out: Path, fingerprints: dict[str, dict], common: dict) -> None:
    r"""Refuse an ``out`` folder holding runs of another federation, or of an algorithm
    with other options."""
    path = out / MANIFEST
    if not path.exists():
        return
    try:
        stored = json.loads(path.read_text())
        old, old_common = stored["fingerprints"], stored["setup"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"`out` {out}: {MANIFEST} is not a comparison's ({exc}).") from None
    if old_common != common:
        keys = _differences(old_common, common, "setup.")
        raise ValueError(
            f"`out` {out} holds a comparison on another federation ({', '.join(keys)}); give "
            "another folder."
        )
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


@dataclasses.dataclass
class ComparisonPlan:
    r"""A checked comparison (:func:`plan_comparison`): what :func:`compare_algorithms`
    runs, nothing run or written yet.

    Attributes:
        algorithms: The labels, the first being the tests' reference.
        registered: Each label's registered algorithm.
        settings: Each label's settings.
        setups: Each label's setup (they differ in ``aggregator`` at most).
        seeds: The seeds.
        fingerprints: What each label's runs depend on besides the seed.
        common: The setup every label shares.
        out: The folder of the runs and the summary (``None``: nothing written).
        batched: Run each algorithm's seeds as one batched program
            (:func:`~botorch_fed.experiments.grid.run_grid`).
        device: The batched runner's device (``None``: CPU).
    """

    algorithms: list[str]
    registered: dict[str, str]
    settings: dict[str, Any]
    setups: dict[str, Any]
    seeds: list[int]
    fingerprints: dict[str, dict]
    common: dict
    out: Path | None
    batched: bool = False
    device: str | None = None


def plan_comparison(
    algorithms: Sequence[str] | Mapping[str, Any],
    setup,
    seeds: int | Sequence[int] = 5,
    out: str | os.PathLike | None = None,
    batched: bool = False,
    device: str | None = None,
) -> ComparisonPlan:
    r"""Check a comparison (arguments as :func:`compare_algorithms`) without running
    or writing anything; ``ValueError`` names the argument and what is wrong, e.g. an
    ``out`` folder that holds a comparison on another federation."""
    from botorch_fed.algorithms import get_algorithm

    names = list(algorithms)
    if not names or len(set(names)) != len(names):
        raise ValueError(f"`algorithms` must name distinct algorithms, got {names!r}.")
    given: dict[str, Any] = dict(algorithms) if isinstance(algorithms, Mapping) else {}
    # a label's value may be (registered algorithm, settings): two configurations of one
    pairs = {a: v if isinstance(v := given.get(a), tuple) else (a, v) for a in names}
    for a, pair in pairs.items():
        if len(pair) != 2:
            raise ValueError(f"`algorithms`[{a!r}] must be settings or (algorithm, settings).")
        if not _LABEL.fullmatch(a):
            raise ValueError(
                f"`algorithms`: the label {a!r} must be letters, digits, '.', '_' or '-' (it "
                "names a folder)."
            )
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
    seed_list = _seeds(seeds, firsts.pop())
    for a in names:
        if type(settings[a]) is not specs[a].settings_class:
            raise ValueError(
                f"`algorithms`[{a!r}]: {registered[a]} takes {specs[a].settings_class.__name__}, "
                f"got {type(settings[a]).__name__}."
            )
        settings[a].validate()
        setups[a].validate(registered[a])
    for field in ("num_init", "num_rounds"):  # the same initial designs and budget
        values = {a: getattr(settings[a], field) for a in names if hasattr(settings[a], field)}
        if len(set(values.values())) > 1:
            listed = ", ".join(f"{a} {v}" for a, v in values.items())
            raise ValueError(
                f"`{field}` differs between the algorithms ({listed}): a comparison gives "
                "every algorithm the same initial designs and budget."
            )
    common = _comparable(setups[names[0]])
    for a in names[1:]:  # one federation for all: the same problem, clients, noise, ...
        if (other := _comparable(setups[a])) != common:
            keys = _differences(common, other, "setup.")
            raise ValueError(
                f"The setups of `setup` differ between {names[0]} and {a} ({', '.join(keys)}): "
                "a comparison runs every algorithm on one federation (only `aggregator` may "
                "differ)."
            )
    runners = dict.fromkeys(names, "protocol")
    if batched:
        from botorch_fed.experiments import GRID_ALGORITHMS

        missing = [a for a in names if registered[a] not in GRID_ALGORITHMS]
        if missing:
            raise ValueError(
                f"`batched`: {', '.join(missing)} has no batched runner (it runs "
                f"{', '.join(GRID_ALGORITHMS)})."
            )
        runners = dict.fromkeys(names, "batched")
    elif device is not None:
        raise ValueError(f"`device`={device!r} applies to the batched runner (`batched=True`).")
    dev = None if device is None else torch_device_type(device)
    fps = {a: _fingerprint(registered[a], setups[a], settings[a], runners[a], dev) for a in names}
    folder = None if out is None else Path(out)
    if folder is not None:
        if folder.exists() and not folder.is_dir():
            raise ValueError(f"`out` {folder} is a file; give a folder.")
        if not folder.exists() and not folder.parent.is_dir():
            raise ValueError(f"`out` {folder}: the folder {folder.parent} does not exist.")
        if folder.is_dir():
            _check_manifest(folder, fps, common)
    return ComparisonPlan(
        names, registered, settings, setups, seed_list, fps, common, folder, batched, device
    )


def stored_runs(plan: ComparisonPlan) -> dict[str, dict[int, dict]]:
    r"""The runs of ``plan`` that its ``out`` folder holds already (not run again)."""
    if plan.out is None or not plan.out.is_dir():
        return {a: {} for a in plan.algorithms}
    return _load_runs(plan.out, plan.algorithms, plan.seeds, plan.fingerprints)


def compare_algorithms(
    algorithms: Sequence[str] | Mapping[str, Any] | ComparisonPlan,
    setup=None,
    seeds: int | Sequence[int] = 5,
    jobs: int = 1,
    out: str | os.PathLike | None = None,
    on_run: Callable[[dict, int, int], None] | None = None,
    batched: bool = False,
    device: str | None = None,
) -> Comparison:
    r"""Run every algorithm on every seed of one federation and compare them.

    Args:
        algorithms: Registered algorithm names, or ``{name: settings}`` (``None``: the
            algorithm's default settings), or ``{label: (name, settings)}`` (e.g. two
            configurations of one algorithm); the first is the reference of the tests.
            Or a :class:`ComparisonPlan` (then ``setup``, ``seeds`` and ``out`` are its).
        setup: The federation (:class:`~botorch_fed.protocol.setup.FederationSetup`), or
            ``{name: setup}`` differing in ``aggregator`` at most (only the algorithms
            that aggregate take one), all with the same ``seed``.
        seeds: A count ``N`` (seeds ``setup.seed ... setup.seed + N - 1``) or the seeds.
        jobs: Parallel worker processes (``1``: in this process).
        out: A folder for every run's record, ``summary.json`` and ``summary.md``; the
            runs stored there for the same setups and settings are not run again.
        on_run: Hook ``(record, done, total)`` after each run (stored ones first).
        batched: Run each algorithm's seeds as one batched program on ``device``
            (:func:`~botorch_fed.experiments.grid.run_grid`; ``jobs`` then unused).
        device: The batched runner's device (``None``: CPU; ``"cuda"``).

    Returns:
        The :class:`Comparison`.

    Raises:
        ValueError: Bad arguments (before anything runs).
        ComparisonRunError: A run failed (the finished ones are kept in ``out``).
    """
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise ValueError(f"`jobs`={jobs!r} must be an integer >= 1.")
    if isinstance(algorithms, ComparisonPlan):
        plan = algorithms
    else:
        plan = plan_comparison(algorithms, setup, seeds, out, batched, device)
    names, folder = plan.algorithms, plan.out
    records: dict[str, dict[int, dict]] = {a: {} for a in names}
    if folder is not None:
        folder.mkdir(exist_ok=True)
        _check_manifest(folder, plan.fingerprints, plan.common)
        records = _load_runs(folder, names, plan.seeds, plan.fingerprints)
        manifest = {"format": FORMAT, "setup": plan.common, "fingerprints": plan.fingerprints}
        if (folder / MANIFEST).exists():  # keep the algorithms of earlier invocations
            old = json.loads((folder / MANIFEST).read_text())["fingerprints"]
            manifest["fingerprints"] = {**old, **plan.fingerprints}
        write_json(manifest, str(folder / MANIFEST))
    todo = [(a, s) for s in plan.seeds for a in names if s not in records[a]]
    total, done = len(names) * len(plan.seeds), 0
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

    if plan.batched:  # each algorithm's missing seeds as one batched program
        for a in names:
            missing = [s for s in plan.seeds if s not in records[a]]
            if missing:
                for rec in _grid_records(a, plan, missing):
                    store(rec)
        todo = []
    jobs_ = [
        (a, plan.registered[a], dataclasses.replace(plan.setups[a], seed=s), plan.settings[a])
        for a, s in todo
    ]
    if jobs == 1 or len(jobs_) <= 1:
        for job in jobs_:
            store(_job(job))
    else:
        _run_pool(jobs_, min(jobs, len(jobs_)), store)
    summary = summarize(names, plan.seeds, records)
    comparison = Comparison(names, plan.seeds, records, summary)
    if folder is not None:
        write_json(summary, str(folder / f"{SUMMARY}.json"))
        (folder / f"{SUMMARY}.md").write_text(comparison.markdown())
    return comparison


def _grid_records(label: str, plan: ComparisonPlan, seeds: list[int]) -> list[dict]:
    r"""The records of ``label``'s runs at ``seeds`` from one batched grid."""
    from botorch_fed.experiments import run_grid
    from botorch_fed.runs.prepare import library_warnings_ignored

    algorithm, setup, settings = plan.registered[label], plan.setups[label], plan.settings[label]
    try:
        with library_warnings_ignored():
            results = run_grid(algorithm, setup, settings, seeds=seeds, device=plan.device)
    except Exception as exc:  # one program for all the seeds: none of them is kept
        listed = ", ".join(map(str, seeds))
        raise ComparisonRunError(
            label, seeds[0], exc, f"seeds {listed} (one batched grid)"
        ) from exc
    return [
        {
            **score_record(
                algorithm, dataclasses.replace(setup, seed=r.seed), settings, r, "batched"
            ),
            "algorithm": label,
        }  # fmt: skip
        for r in results
    ]


def _run_pool(jobs: list, workers: int, store: Callable[[dict], None]) -> None:
    r"""The jobs on ``workers`` spawned processes (torch's thread pools do not survive a
    fork), each result stored as it arrives; on a failure or an interrupt the results
    already finished are stored too, the queued jobs cancelled and the workers stopped
    (their runs are lost; the comparison continues from the stored ones)."""
    pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"))
    pending = {pool.submit(_job, job) for job in jobs}
    try:
        while pending:
            finished, pending = wait(pending, return_when=FIRST_COMPLETED)
            failed = None
            for future in finished:  # every success first, then the failure
                if future.exception() is None:
                    store(future.result())
                elif failed is None:
                    failed = future
            if failed is not None:
                failed.result()  # raises
    except BaseException:
        for future in pending:
            if future.done() and not future.cancelled() and future.exception() is None:
                store(future.result())
        processes = list(getattr(pool, "_processes", {}).values())
        pool.shutdown(wait=False, cancel_futures=True)
        for process in processes:  # do not wait minutes for runs that will be dropped
            process.terminate()
        raise
    pool.shutdown()
