r"""What ``botorch-fed run`` reports: the result tables on the console and the
``--plot`` convergence curve (:mod:`botorch_fed.runs.outputs` checks the paths and
writes the ``--out`` JSON). Everything the user named (objectives, error messages of
their black box) is printed verbatim, never read as console markup.
"""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Console
from rich.markup import escape
from rich.table import Table

MAX_FAILURES_SHOWN = 5


def _exchanges(counts: list[int]) -> str:
    r"""Round trips to the clients: round 0's, then the rounds' median, mean and max."""
    rounds = counts[1:]
    if not rounds:
        return f"{counts[0]} (initialisation)"
    ordered = sorted(rounds)
    middle = len(ordered) // 2
    median = ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2
    mean = sum(rounds) / len(rounds)
    return f"median {median:g}, mean {mean:.1f}, max {max(rounds)} (initialisation {counts[0]})"


def plot_run(data: dict, path: str, console: Console) -> None:
    r"""The convergence curve of a run (``RunResult.to_dict()``), when there is one."""
    from botorch_fed.plotting import plot_convergence, plot_cumulative_regret

    if not any(v is not None for v in data["best_per_round"]):
        console.print(f"no plot written to {escape(path)}: every evaluation failed", soft_wrap=True)
        return
    if data.get("average_values_per_round"):
        from botorch_fed.plotting import plot_iterates

        plot_iterates([data], path)
        console.print(f"iterate values written to {escape(path)}", soft_wrap=True)
        return
    if data.get("cumulative_regret_per_round") and _cumulative(data["algorithm"]):
        plot_cumulative_regret([data], path)
        console.print(f"cumulative regret curve written to {escape(path)}", soft_wrap=True)
        return
    plot_convergence([data], path)
    kind = "regret" if data.get("regret_per_round") else "convergence"
    console.print(f"{kind} curve written to {escape(path)}", soft_wrap=True)


def _cumulative(algorithm: str) -> bool:
    r"""Whether ``algorithm`` is judged by its cumulative regret (registry)."""
    from botorch_fed.algorithms import get_algorithm

    try:
        return get_algorithm(algorithm).cumulative_regret
    except ValueError:
        return False


def _number(value: float | None, empty: str = "none") -> str:
    return empty if value is None else f"{value:.6g}"


def _point(x: Sequence[float] | None, shown: int = 8) -> str:
    if x is None:
        return "-"
    head = ", ".join(f"{v:.4g}" for v in list(x)[:shown])
    more = f", ... ({len(x)} coordinates; all in --out)" if len(x) > shown else ""
    return f"[{head}{more}]"


def _releases(privacy: dict) -> str:
    users = privacy["users"].values()
    return f"{sum(u['releases'] for u in users):,} / {sum(u['clipped'] for u in users):,}"


def _cumulative_rows(result, rounds: int) -> list[tuple[str, str]]:
    r"""The cumulative regret and its mean, labelled with what they sum and divide by:
    FedZero's iterates (one per round), every other algorithm's evaluations."""
    cumulative = getattr(result, "cumulative_regret_per_round", None)
    if not cumulative or rounds < 1:
        return []
    total = cumulative[-1]
    if getattr(result, "iterate_values_per_round", None):
        iterates = f"cumulative regret R_T of the iterates: sum of |f(x_t) - f*| over T = {rounds}"
        return [
            (f"{iterates} rounds", f"{total:.6g}"),
            ("mean regret per iterate R_T / T", f"{total / rounds:.6g}"),
        ]
    n = sum(
        1
        for e in result.evaluations
        if e.get("value") is not None and 0 <= e["round"] < len(cumulative)
    )
    label = f"cumulative regret R_N: sum of |f(x) - f*| over all N = {n} successful evaluations"
    rows = [(f"{label} (every client, initial design included)", f"{total:.6g}")]
    if n:
        rows.append(("mean regret per evaluation R_N / N", f"{total / n:.6g}"))
    return rows


def print_run(result, console: Console, label: str | None = None) -> None:
    r"""The result tables of a :class:`~botorch_fed.protocol.results.RunResult`:
    federation, stages, clients, failed evaluations (``label``: the black box's name)."""
    rounds = len(result.best_per_round) - 1
    goal = "minimised" if result.minimize else "maximised"
    console.print(
        f"[bold]{escape(result.algorithm)} on {escape(label or result.problem)} "
        f"({result.dim}-D, {goal}), {len(result.best_per_client)} clients, {rounds} rounds[/]",
        soft_wrap=True,
    )
    head = Table()
    head.add_column("quantity")
    head.add_column("value", justify="right")
    recommendation = getattr(result, "recommendation", None)
    averaged = recommendation is not None and recommendation.get("kind") == "averaged iterate"
    head.add_row(
        # FedZero's queries are perturbations x_t +- h z around its iterates, not its output
        "best queried value (x_t +- h z)" if averaged else "best value (federation)",
        _number(result.best_value, "none (every evaluation failed)"),
    )
    if result.best_point is not None:
        head.add_row("best point", _point(result.best_point))
    if recommendation is not None:
        label = "recommended point (x^, averaged iterate)" if averaged else "recommended point (x^)"
        head.add_row(label, _point(recommendation["x"]))
        for key in ("eta", "h"):
            if recommendation.get(key) is not None:
                head.add_row(f"step parameter {key}", f"{recommendation[key]:.6g}")
        if recommendation.get("predicted_value") is not None:
            predicted = _number(recommendation["predicted_value"])
            if recommendation.get("predicted_std") is not None:
                predicted += f" +- {recommendation['predicted_std']:.3g} (posterior std)"
            head.add_row("x^: predicted value", predicted)
        if recommendation.get("value") is not None:
            head.add_row("x^: true value", _number(recommendation["value"]))
            if result.optimal_value is not None:
                regret = abs(recommendation["value"] - result.optimal_value)
                head.add_row("x^: simple regret", f"{regret:.6g}")
    if result.optimal_value is not None:
        head.add_row("optimal value", f"{result.optimal_value:.6g}")
        if result.best_value is not None:
            head.add_row(
                "simple regret (best evaluation)",
                f"{abs(result.best_value - result.optimal_value):.6g}",
            )
        for row in _cumulative_rows(result, rounds):
            head.add_row(*row)
    iterates = getattr(result, "iterate_values_per_round", None)
    if iterates:
        head.add_row("value at the last iterate x_n", _number(iterates[-1]))
    privacy = getattr(result, "privacy", None)
    if privacy is not None:
        head.add_row(
            "privacy: epsilon spent (max over users)",
            f"{privacy['max_epsilon']:.6g} (basic composition)",
        )
        head.add_row("privacy: releases / clipped", _releases(privacy))
    head.add_row("steps", ", ".join(f"{k} {v}" for k, v in sorted(result.steps.items())))
    head.add_row("failed evaluations", str(len(result.failures)))
    head.add_row("wall time (s)", f"{result.time_s:.2f}")
    ledger = result.ledger
    head.add_row(
        "bytes to / from clients",
        f"{ledger['total_bytes_down']:,} / {ledger['total_bytes_up']:,}",
    )
    if result.exchanges_per_round:
        head.add_row("exchanges per round", _exchanges(result.exchanges_per_round))
    console.print(head)
    stages = Table(title="time per stage (s, summed over parties)")
    stages.add_column("stage")
    stages.add_column("seconds", justify="right")
    for stage, seconds in sorted(ledger["stage_s"].items(), key=lambda kv: -kv[1]):
        stages.add_row(stage, f"{seconds:.3f}")
    console.print(stages)
    objectives = result.config.get("setup", {}).get("objectives")
    per_client_names = objectives if objectives and len(objectives) > 1 else None
    clients = Table(title="best value per client")
    clients.add_column("client", justify="right")
    if per_client_names:
        clients.add_column("objective")
    clients.add_column("best value", justify="right")
    for cid, best in result.best_per_client.items():
        cells = [str(cid)]
        if per_client_names:
            cells.append(escape(per_client_names[int(cid)]["name"]))
        evaluated = any(str(e["client"]) == str(cid) for e in result.evaluations)
        clients.add_row(*cells, _number(best, "none (all failed)" if evaluated else "never asked"))
    console.print(clients)
    if result.failures:
        shown = result.failures[:MAX_FAILURES_SHOWN]
        failed = Table(
            title=f"failed evaluations (first {len(shown)} of {len(result.failures)}; all in --out)"
        )
        for name in ("client", "round", "step", "point", "error"):
            failed.add_column(name, justify="right" if name in ("client", "round") else "left")
        for f in shown:
            failed.add_row(
                str(f["client"]), str(f["round"]), escape(str(f["step"])), _point(f["x"]),
                escape(str(f["error"])),
            )  # fmt: skip
        console.print(failed)
