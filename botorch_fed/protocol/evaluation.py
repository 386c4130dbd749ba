r"""One evaluation of a client's black box, with the failure policy every client shares.

An evaluation that raises, or returns NaN/inf, is a *failed* evaluation: it is recorded
(``evaluation_errors="record"``) or stops the run (``"raise"``,
:class:`~botorch_fed.protocol.objectives.EvaluationError`). A callable that returns
something that is not one number per point is a bug in the callable
(:class:`~botorch_fed.protocol.objectives.ObjectiveContractError`) and always raises.
"""

from __future__ import annotations

import torch
from torch import Tensor

from botorch_fed.protocol.objectives import (
    EvaluationError,
    Objective,
    ObjectiveContractError,
    describe_failure,
)

EVALUATION_ERRORS = ("record", "raise")


def evaluate_point(
    objective: Objective, x: Tensor, entry: dict, evaluation_errors: str, client_id: int
) -> tuple[dict, Tensor | None]:
    r"""Evaluate ``objective`` at one unit-cube point.

    Args:
        objective: The client's black box.
        x: ``1 x d`` unit-cube point.
        entry: The history entry so far (``round``, ``step``, ``x``); completed here.
        evaluation_errors: ``"record"`` or ``"raise"``.
        client_id: The client (for error messages).

    Returns:
        ``(entry, observed)``: the completed history entry (``value`` the reported value,
        or ``None`` with ``failed`` and ``error``) and the observed ``1``-element value
        in the user's convention (``None`` if the evaluation failed).

    Raises:
        EvaluationError: The evaluation failed and ``evaluation_errors="raise"``.
    """
    error: BaseException | None = None
    observed = reported = None
    try:
        observed, reported = objective.evaluate(x)
    except (KeyboardInterrupt, SystemExit):
        raise
    except ObjectiveContractError:  # a bug in the callable, not a failed point
        raise
    except Exception as exc:  # noqa: BLE001 - any failure of the user's black box
        error = exc
    if error is not None:
        failure = describe_failure(error)
    else:
        assert observed is not None and reported is not None  # evaluate returned them
        if not torch.isfinite(observed).all():
            failure = describe_failure(None, observed)
        elif not torch.isfinite(reported).all():
            failure = describe_failure(None, reported)
        else:
            failure = None
    if failure is not None:
        if evaluation_errors == "raise":
            raise EvaluationError(
                f"Client {client_id}, round {entry['round']}: evaluating {objective.name!r} at "
                f"{entry['x']} failed ({failure})."
            ) from error
        return {**entry, "value": None, "failed": True, "error": failure}, None
    assert reported is not None  # no failure: evaluate returned it
    return {**entry, "value": float(reported.item())}, observed
