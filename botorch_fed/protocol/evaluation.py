r"""One evaluation of a client's black box, with the failure policy every client shares."""

from __future__ import annotations

import math

from torch import Tensor

from botorch_fed.problems.objectives import EvaluationError, Objective, ObjectiveContractError

EVALUATION_ERRORS = ("record", "raise")


def evaluate_point(
    objective: Objective, x: Tensor, entry: dict, evaluation_errors: str, client_id: int
) -> tuple[dict, Tensor | None]:
    r"""Evaluate ``objective`` at the ``1 x d`` unit-cube point ``x``; returns ``entry``
    (``round``, ``step``, ``x``) completed (``value``, or ``None`` with ``failed`` and
    ``error``) and the observed value (``None`` on failure).

    Raises:
        EvaluationError: It raised or returned NaN/inf and ``evaluation_errors="raise"``.
        ObjectiveContractError: Always, from a callable that breaks its contract.
    """
    error: BaseException | None = None
    failure: str | None = None
    try:
        observed, reported = objective.evaluate(x)
    except (KeyboardInterrupt, SystemExit, ObjectiveContractError):
        raise
    except Exception as exc:  # noqa: BLE001 - any failure of the user's black box
        error = exc
        failure = f"{type(exc).__name__}: {exc}"
    else:
        values = [*observed.reshape(-1).tolist(), *reported.reshape(-1).tolist()]
        bad = [v for v in values if not math.isfinite(v)]
        failure = f"non-finite value {bad[0]}" if bad else None
    if failure is not None:
        if evaluation_errors == "raise":
            raise EvaluationError(
                f"Client {client_id}, round {entry['round']}: evaluating {objective.name!r} at "
                f"{entry['x']} failed ({failure})."
            ) from error
        return {**entry, "value": None, "failed": True, "error": failure}, None
    return {**entry, "value": float(reported.item())}, observed
