r"""A comparison's run records (:mod:`botorch_fed.runs.compare`): one run scored as
``botorch-fed compare`` scores it (:func:`score_record`), and the fingerprint of what it
depends on besides its seed.

The score (lower is better) is the final simple regret where every client's optimum
is known: the federation's (``best value - f*``) when all clients share one objective,
else the mean over clients of each client's own simple regret on its own objective
(shifted or rotated clients, per-client black boxes: does every party gain?). A moved
client whose optimum the clipping may have cut away is scored against the function's
optimum, a bound its values never beat (its regret is then an upper bound, the same for
every algorithm; the records list such clients). Where an optimum is unknown (the user's
black box) the score is the best value found, oriented so that lower is better (negated
for a maximised objective).
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import json
from pathlib import Path

import numpy as np

FORMAT = 1  #: of records, manifests and summaries


def _code_digests(setup) -> list[str | None]:
    r"""SHA-256 (16 hex digits) of the source file of each of the user's black-box
    functions (``None`` where there is none to read): a changed function is another
    comparison."""
    out: list[str | None] = []
    objectives = setup.objectives
    given = (
        []
        if objectives is None
        else objectives
        if isinstance(objectives, list | tuple)
        else [objectives]
    )
    for objective in given:
        fn = getattr(objective, "fn", None)
        try:
            source = inspect.getsourcefile(fn) if fn is not None else None
            text = Path(source).read_bytes() if source else None
        except (TypeError, OSError):
            text = None
        out.append(None if text is None else hashlib.sha256(text).hexdigest()[:16])
    return out


def _fingerprint(
    algorithm: str, setup, settings, runner: str = "protocol", device: str | None = None
) -> dict:
    r"""What a run of ``algorithm`` depends on besides its seed (JSON-friendly): the
    setup (all but the seed and the thread count), the settings, the libraries'
    versions, the source files of the user's black boxes and the runner (``protocol``
    or ``batched``: their optimisers' paths differ). Changes to botorch-fed's
    own code within one version are not seen (a benchmark pins its commit itself)."""
    from botorch_fed.protocol.results import library_versions

    described = setup.describe()
    described.pop("seed")
    described.pop("threads")  # how fast, not what
    return json.loads(
        json.dumps(
            {
                "format": FORMAT,
                "algorithm": algorithm,
                "setup": described,
                "settings": None if settings is None else dataclasses.asdict(settings),
                "versions": library_versions(),
                "code": _code_digests(setup),
                "runner": runner,
                "device": device,
            },
            default=repr,
        )
    )


def torch_device_type(device: str) -> str:
    r"""``"cpu"`` or ``"cuda"`` of a device name (``ValueError`` for others)."""
    import torch

    try:
        kind = torch.device(device).type
    except (RuntimeError, TypeError) as exc:
        raise ValueError(f"`device`={device!r} is not a torch device ({exc}).") from None
    if kind not in ("cpu", "cuda"):
        raise ValueError(f"`device`={device!r}: the batched runner runs on cpu or cuda.")
    return kind


def _comparable(setup) -> dict:
    r"""A setup as every algorithm of one comparison must share it (all but the
    aggregator, which only the algorithms that aggregate take, and the seed)."""
    described = _fingerprint("", setup, None)["setup"]
    described.pop("aggregator")
    return described


def run_record(algorithm: str, setup, settings) -> dict:
    r"""Run ``algorithm`` once in this process and score it (module docstring).

    Returns:
        A JSON-friendly record: ``algorithm``, ``seed``, ``metric``, ``score``,
        ``worst_client``, ``best_value``, ``optimal_value``, ``client_best``,
        ``client_optimum`` (the bound ``optimum_bound`` for the clients listed in
        ``client_optimum_bound_only``), ``client_score``, ``score_per_round`` (the federation's
        regret or best value after each round), ``below_optimum`` (who found a value
        better than the declared optimum: a rounded optimum, a negative regret),
        ``time_s`` and ``fingerprint``.
    """
    from botorch_fed.algorithms import run_federated  # registers the algorithms

    result = run_federated(algorithm, setup, settings)
    return score_record(algorithm, setup, settings, result)


def score_record(
    algorithm: str, setup, settings, result, runner: str = "protocol", device: str | None = None
) -> dict:
    r"""The record of a finished run (:func:`run_record`) from its result: a
    ``RunResult`` or a batched grid's :class:`~botorch_fed.experiments.grid.GridResult`
    (``runner="batched"``)."""
    objectives = setup.make_objectives()
    shared = _shared_objective(setup)
    sign = 1.0 if result.minimize else -1.0
    exact = {cid: objectives[cid].optimal_value for cid in result.best_per_client}
    # a moved client whose optimum may be clipped away: regret against the bound (f*)
    optima = {c: v if v is not None else objectives[c].optimum_bound for c, v in exact.items()}
    known = all(v is not None for v in optima.values())
    inexact = sorted(c for c in optima if exact[c] is None and optima[c] is not None)
    below: list[str] = []  # better than the declared optimum: a rounded or wrong f*

    def regret(value: float, optimum: float, who: str) -> float:
        r = sign * (value - optimum)
        if r < 0:
            below.append(who)
        return r

    client_score: dict[str, float | None] = {}
    for cid, best in result.best_per_client.items():
        if best is None:
            client_score[str(cid)] = None
        elif known:
            client_score[str(cid)] = regret(best, optima[cid], str(cid))
        else:
            client_score[str(cid)] = sign * best
    finite = [v for v in client_score.values() if v is not None]
    if shared:
        metric = "federation regret" if known else "best value"
        optimum = optima[0]

        def scored(b: float | None) -> float | None:
            if b is None:
                return None
            return sign * b if optimum is None else regret(b, optimum, "federation")

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
        "below_optimum": sorted(set(below)),
        "client_score": client_score,
        "score_per_round": per_round,
        "time_s": result.time_s,
        "fingerprint": _fingerprint(
            algorithm,
            setup,
            settings,
            runner,
            None if device is None else torch_device_type(device),
        ),
    }


def _shared_objective(setup) -> bool:
    r"""Whether every client optimises the same objective."""
    from botorch_fed.problems.objectives import Objective

    if setup.problem is not None:
        return setup.shift == 0 and setup.rotation == 0
    return isinstance(setup.objectives, Objective) or len(setup.objectives) == 1
