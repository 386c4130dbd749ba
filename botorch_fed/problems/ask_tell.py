r"""Ask/tell black boxes: a party's evaluation is a measurement that a person reports
later (hours or weeks), not a function call.

An :class:`AskTellObjective` records each point it is asked to evaluate as *pending* in
a folder (one JSON file per point, written atomically, so a pending point survives any
restart) and waits -- sleeping, not spinning -- until the party's operator reports the
measurement through :class:`Party` (``report`` or ``report_failure``, which the
algorithm treats as a failed evaluation). The ids are digests of the objective's name,
the point's sequence number and the point, so a run that is resumed from a checkpoint
and asks for the same point again finds the report already made.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from botorch_fed.problems.objectives import Objective, check_bounds

ACTIVE = "active.json"  # present while an objective may ask for points


def _digest(*parts: object) -> str:
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()


def _write_new(path: Path, content: dict) -> None:
    r"""Write ``content`` to ``path`` once: ``FileExistsError`` if it exists."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(content, indent=1))
    try:
        os.link(tmp, path)  # atomic, and refuses an existing file
    finally:
        tmp.unlink()


class Party:
    r"""The operator's side of an ask/tell party: the pending points and the reports.

    Args:
        folder: The party's ask/tell folder (shared with its :class:`AskTellObjective`).
    """

    def __init__(self, folder: str | os.PathLike) -> None:
        self.folder = Path(folder)

    def _ask_path(self, point_id: str) -> Path:
        if not (isinstance(point_id, str) and point_id.isalnum() and len(point_id) == 16):
            raise ValueError(f"`id`={point_id!r} is not a point id (16 letters and digits).")
        return self.folder / f"{point_id}.ask.json"

    def _asks(self) -> list[dict]:
        asks = [json.loads(p.read_text()) for p in self.folder.glob("*.ask.json")]
        return sorted(asks, key=lambda a: a["sequence"])

    def pending(self) -> list[dict]:
        r"""The points waiting for a report, oldest first: ``id``, ``objective``,
        ``sequence`` and ``x`` (in the objective's own domain)."""
        return [a for a in self._asks() if self.answer(a["id"]) is None]

    def history(self) -> list[dict]:
        r"""Every point asked, oldest first, with its report (``value`` or ``failed``)."""
        return [{**a, **(self.answer(a["id"]) or {})} for a in self._asks()]

    def answer(self, point_id: str) -> dict | None:
        r"""The report on ``point_id`` (``{"value": v}`` or ``{"failed": reason}``), or
        ``None`` while it is pending."""
        path = self._ask_path(point_id).with_suffix("").with_suffix(".report.json")
        return json.loads(path.read_text()) if path.exists() else None

    def report(self, point_id: str, value: float) -> None:
        r"""Report the measurement at ``point_id``.

        Raises:
            ValueError: No run is active, ``point_id`` is unknown or already reported,
                the pending point's file was edited, or ``value`` is not a finite number.
        """
        if isinstance(value, bool) or not isinstance(value, int | float | np.integer | np.floating):
            raise ValueError(f"`value`={value!r} must be a number.")
        if not math.isfinite(value):
            raise ValueError(f"`value`={value!r} must be finite (report a failure instead).")
        self._tell(point_id, {"value": float(value)})

    def report_failure(self, point_id: str, reason: str) -> None:
        r"""Report that the measurement at ``point_id`` failed (the algorithm records a
        failed evaluation), with a ``reason``; the errors of :meth:`report`."""
        if not isinstance(reason, str) or not reason.strip():
            raise ValueError(f"`reason`={reason!r} must be a non-empty string.")
        self._tell(point_id, {"failed": reason})

    def _tell(self, point_id: str, answer: dict) -> None:
        path = self._ask_path(point_id)
        if not (self.folder / ACTIVE).exists():
            raise ValueError(f"No run is active in {self.folder}: nothing to report to.")
        if not path.exists():
            raise ValueError(f"`id`={point_id!r} is not a point of {self.folder}.")
        ask = json.loads(path.read_text())
        if _digest(ask["objective"], ask["sequence"], ask["x"])[:16] != point_id:
            raise ValueError(f"The pending point {point_id} was edited in {path}; not reported.")
        try:
            _write_new(path.with_suffix("").with_suffix(".report.json"), answer)
        except FileExistsError:
            raise ValueError(f"`id`={point_id!r} was reported already.") from None


class AskTellObjective(Objective):
    r"""A black box whose values a person reports: each point is asked in ``folder`` and
    the evaluation waits for :meth:`Party.report` (or :meth:`Party.report_failure`).

    Args:
        folder: Where the pending points and the reports are kept (created).
        bounds: ``2 x d`` lower and upper bounds of the domain (the user's units).
        minimize: Whether smaller values are better.
        name: A name for result tables and the point ids.
        poll_s: Seconds between two looks for a report while waiting.
        on_ask: Called with each new pending point (e.g. to notify the operator).
    """

    def __init__(
        self,
        folder: str | os.PathLike,
        bounds,
        minimize: bool = True,
        name: str = "ask-tell",
        poll_s: float = 1.0,
        on_ask: Callable[[dict], None] | None = None,
    ) -> None:
        if not isinstance(minimize, bool):
            raise ValueError(f"`minimize`={minimize!r} must be a bool.")
        if isinstance(poll_s, bool) or not isinstance(poll_s, int | float) or not poll_s > 0:
            raise ValueError(f"`poll_s`={poll_s!r} must be a number > 0.")
        self.bounds, self.minimize, self.name = check_bounds(bounds), minimize, name
        self.party, self.poll_s, self.on_ask = Party(folder), float(poll_s), on_ask
        self.sequence = 0  # points asked so far (checkpointed: a resumed run asks the same)
        self.party.folder.mkdir(parents=True, exist_ok=True)
        (self.party.folder / ACTIVE).write_text(json.dumps({"objective": name}))

    def close(self) -> None:
        r"""End the run: reports are refused from now on."""
        (self.party.folder / ACTIVE).unlink(missing_ok=True)

    def evaluate(self, X: Tensor) -> tuple[Tensor, Tensor]:
        values = [self._ask_and_wait(x) for x in self.to_domain(X)]
        out = torch.tensor(values, dtype=torch.float64)
        return out, out

    def _ask_and_wait(self, x: Tensor) -> float:
        point = [float(v) for v in x.tolist()]
        self.sequence += 1
        point_id = _digest(self.name, self.sequence, point)[:16]
        ask = {"id": point_id, "objective": self.name, "sequence": self.sequence, "x": point}
        try:
            _write_new(self.party._ask_path(point_id), ask)
            if self.on_ask is not None:
                self.on_ask(ask)
        except FileExistsError:  # asked before a restart: its report may be in
            pass
        while (answer := self.party.answer(point_id)) is None:
            time.sleep(self.poll_s)
        if "failed" in answer:
            raise RuntimeError(f"the measurement failed: {answer['failed']}")
        return float(answer["value"])

    def state_dict(self) -> dict:
        return {"sequence": self.sequence}

    def load_state_dict(self, state: dict) -> None:
        sequence = state.get("sequence")
        if isinstance(sequence, bool) or not isinstance(sequence, int) or sequence < 0:
            raise ValueError(f"`sequence` must be an int >= 0, got {sequence!r}.")
        self.sequence = sequence
