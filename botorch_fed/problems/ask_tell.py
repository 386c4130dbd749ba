r"""Ask/tell black boxes: a party's evaluation is a measurement that a person reports
later (hours or weeks), not a function call.

An :class:`AskTellObjective` records each point it is asked to evaluate as *pending* in
a folder (one JSON file per point, written atomically, so a pending point survives any
restart) and waits -- sleeping, not spinning -- until the party's operator reports the
measurement through :class:`Party` (``report`` or ``report_failure``, which the
algorithm treats as a failed evaluation). A point's id is a digest of the objective's
name, its run (a random id kept in the objective's checkpoint state) and the point's
sequence number, so a run resumed from a checkpoint finds the reports already made, and
a new run in the same folder asks afresh. Points are asked one at a time, as the
algorithms evaluate them.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import socket
import tempfile
import time
import warnings
import weakref
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from botorch_fed.problems.ask_folder import Party, ask_check, load_ask, point_digest, write_once
from botorch_fed.problems.objectives import Objective, check_bounds

__all__ = ["AskTellObjective", "Party"]

_RUN = re.compile(r"[0-9a-f]{16}")


class AskTellObjective(Objective):
    r"""A black box whose values a person reports: each point is asked in ``folder`` and
    the evaluation waits for :meth:`Party.report` (or :meth:`Party.report_failure`). The
    reported value is both what the client learns from and what results report (there
    is no noise-free value). Use it as a context manager, or call :meth:`finish` (the
    run ended normally: its operator reads ``"finished"``) or :meth:`close`, to end the
    run (reports are refused afterwards; so they are once its process ended).

    Args:
        folder: Where the pending points and the reports are kept (created).
        bounds: ``2 x d`` lower and upper bounds of the domain (the user's units).
        minimize: Whether smaller values are better.
        name: A name for result tables and the point ids.
        poll_s: Seconds between two looks for a report while waiting.
        on_ask: Called with each new pending point (e.g. to notify the operator); an
            error it raises is a warning, not a failed evaluation.
        context: What each point is asked in, shown to the operator with it (e.g.
            ``{"run": ..., "round": ...}``; read when the point is asked, so its owner
            may update it).
        input_names: A name per input, shown to the operator with each point (e.g.
            ``["temperature (C)", "time (h)"]``; ``None``: ``x1``, ``x2``, ...).
        value_range: ``(lower, upper)`` that every measurement lies in; a report outside
            it is refused where reports are made (:meth:`Party.report`, ``party report``,
            the console; ``None``: any finite value).
    """

    def __init__(
        self,
        folder: str | os.PathLike,
        bounds,
        minimize: bool = True,
        name: str = "ask-tell",
        poll_s: float = 1.0,
        on_ask: Callable[[dict], None] | None = None,
        context: dict | None = None,
        input_names: list[str] | None = None,
        value_range: tuple[float, float] | None = None,
    ) -> None:
        if not isinstance(minimize, bool):
            raise ValueError(f"`minimize`={minimize!r} must be a bool.")
        if isinstance(poll_s, bool) or not isinstance(poll_s, int | float) or not poll_s > 0:
            raise ValueError(f"`poll_s`={poll_s!r} must be a number > 0.")
        if not isinstance(name, str) or not name:
            raise ValueError(f"`name`={name!r} must be a non-empty string.")
        self.bounds, self.minimize, self.name = check_bounds(bounds), minimize, name
        d = self.bounds.shape[-1]
        if input_names is not None:
            names = list(input_names) if isinstance(input_names, list | tuple) else None
            if (
                names is None
                or len(names) != d
                or not all(isinstance(n, str) and n.strip() for n in names)
                or len(set(names)) != d
            ):
                raise ValueError(
                    f"`input_names`={input_names!r:.60} must be {d} distinct non-empty strings."
                )
            input_names = names
        if value_range is not None:
            ok = isinstance(value_range, list | tuple) and len(value_range) == 2
            try:
                ok = ok and all(
                    isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
                    for v in value_range
                )
            except OverflowError:  # an integer beyond float's range
                ok = False
            if not ok or not value_range[0] < value_range[1]:
                raise ValueError(
                    f"`value_range`={value_range!r:.60} must be (lower, upper), finite, "
                    "lower < upper."
                )
            value_range = (float(value_range[0]), float(value_range[1]))
        self.input_names, self.value_range = input_names, value_range
        self.party, self.poll_s, self.on_ask = Party(folder), float(poll_s), on_ask
        if context is not None and not isinstance(context, dict):
            raise ValueError(f"`context`={context!r:.40} must be a dict or None.")
        self.context = {} if context is None else context
        self.sequence = 0  # points asked so far
        self.party.folder.mkdir(parents=True, exist_ok=True)
        self._marker = self.party.folder / f"active-{os.urandom(8).hex()}.json"
        self._finalizer = weakref.finalize(self, self._marker.unlink, missing_ok=True)
        self.run = os.urandom(8).hex()  # a new run asks afresh; a resumed one loads its own

    @property
    def run(self) -> str:
        r"""The run's id (16 hex digits): in every point's id, and in the folder's marker
        of this objective's process, which tells the operator's commands the points it
        waits for."""
        return self._run

    @run.setter
    def run(self, value: str) -> None:
        if not (isinstance(value, str) and _RUN.fullmatch(value)):
            raise ValueError(f"`run`={value!r:.40} must be 16 lower-case hex digits.")
        self._run = value
        if self._finalizer.alive:  # a closed objective marks nothing
            # a run that asks again (a resumed campaign) is not finished any more
            (self.party.folder / f"finished-{value}.json").unlink(missing_ok=True)
            marker = {"objective": self.name, "run": value, "pid": os.getpid()}
            marker["host"] = socket.gethostname()
            tmp = self._marker.with_name(f".{self._marker.name}.tmp")
            tmp.write_text(json.dumps(marker))
            os.replace(tmp, self._marker)

    def close(self) -> None:
        r"""End the run: this objective no longer makes its folder active."""
        self._finalizer()

    def finish(self) -> None:
        r"""End the run as finished (its federation ended it normally): the folder records
        it (``finished-<run>.json``), so that its operator reads ``"finished"`` rather than
        ``"no run active"`` (:meth:`Party.status`); then :meth:`close`. A closed objective
        records nothing."""
        if not self._finalizer.alive:
            return
        try:
            path = self.party.folder / f"finished-{self.run}.json"
            record = {"objective": self.name, "run": self.run, "finished": time.time()}
            fd, tmp = tempfile.mkstemp(dir=self.party.folder, prefix=f".{path.name}.")
            try:
                with os.fdopen(fd, "w") as f:
                    json.dump(record, f)
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, path)
            except BaseException:
                os.unlink(tmp)
                raise
        finally:
            self.close()

    def __enter__(self) -> AskTellObjective:
        return self

    def __exit__(self, exc_type, *exc: object) -> None:
        r"""A ``with`` block that ends normally :meth:`finish`\ es the run; one that
        raises only closes it."""
        if exc_type is None:
            self.finish()
        else:
            self.close()

    def evaluate(self, X: Tensor) -> tuple[Tensor, Tensor]:
        values = [self._ask_and_wait(x) for x in self.to_domain(X)]
        out = torch.tensor(values, dtype=torch.float64)
        return out, out

    def _ask_and_wait(self, x: Tensor) -> float:
        point = [float(v) for v in x.tolist()]
        self.sequence += 1
        point_id = point_digest(self.name, self.run, self.sequence)
        path = self.party._ask_path(point_id)
        ask: dict[str, object] = {"id": point_id, "objective": self.name, "run": self.run}
        ask |= {"sequence": self.sequence, "x": point}
        lower, upper = self.bounds.tolist()
        ask |= {"bounds": [list(b) for b in zip(lower, upper, strict=True)]}
        ask |= {"minimize": self.minimize, "context": dict(self.context), "asked": time.time()}
        if self.input_names is not None:
            ask["names"] = list(self.input_names)
        if self.value_range is not None:
            ask["range"] = list(self.value_range)
        ask["check"] = ask_check(ask)
        try:
            write_once(path, ask)
        except FileExistsError:  # asked before a restart: its report may be in
            try:
                stored = load_ask(path)
            except ValueError:
                stored = None  # damaged: written again below
            if stored is not None:
                if not np.allclose(stored["x"], point, rtol=1e-9, atol=0.0):
                    raise RuntimeError(
                        f"The resumed run asks {point} as point #{self.sequence} of "
                        f"{self.name}, which asked {stored['x']} before ({path})."
                    ) from None
                ask = stored
        else:
            if self.on_ask is not None:
                try:
                    self.on_ask(ask)
                except Exception as exc:  # noqa: BLE001 - a notification is not the measurement
                    warnings.warn(f"`on_ask` failed: {exc!r}", RuntimeWarning, stacklevel=2)
        while True:
            try:
                answer = self.party.answer(point_id)
            except ValueError as exc:  # its report cannot be read: a failed measurement
                raise RuntimeError(f"the measurement's report is damaged: {exc}") from None
            if answer is not None:
                break
            self._keep(path, ask)
            time.sleep(self.poll_s)
        if "failed" in answer:
            raise RuntimeError(f"the measurement failed: {answer['failed']}")
        return float(answer["value"])

    @staticmethod
    def _keep(path: Path, ask: dict) -> None:
        r"""The pending point's file as asked: written again (the damaged one moved
        aside, ``<id>.ask.json.damaged-<time>``) if it was removed or edited."""
        with contextlib.suppress(ValueError):  # intact: nothing to do
            load_ask(path)
            return
        if path.exists():
            path.replace(path.with_name(f"{path.name}.damaged-{time.time_ns()}"))
        with contextlib.suppress(FileExistsError):  # the operator restored it meanwhile
            write_once(path, ask)
        warnings.warn(
            f"The pending point in {path} was removed or edited; it is written again.",
            RuntimeWarning,
            stacklevel=3,
        )

    def state_dict(self) -> dict:
        return {"run": self.run, "sequence": self.sequence}

    def load_state_dict(self, state: dict) -> None:
        run, sequence = state.get("run"), state.get("sequence")
        if not (isinstance(run, str) and re.fullmatch(r"[0-9a-f]{16}", run)):
            raise ValueError(f"`run` must be 16 hex digits, got {run!r:.40}.")
        if isinstance(sequence, bool) or not isinstance(sequence, int) or sequence < 0:
            raise ValueError(f"`sequence` must be an int >= 0, got {sequence!r:.40}.")
        self.run, self.sequence = run, sequence
