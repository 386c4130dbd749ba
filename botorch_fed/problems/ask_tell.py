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

import hashlib
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

from botorch_fed.problems.objectives import Objective, check_bounds

_ID = re.compile(r"[0-9a-f]{16}")
_ASK_FIELDS = {"id": str, "objective": str, "run": str, "sequence": int, "x": list, "check": str}
#: what a point may also show its operator (what it was asked in)
_ASK_EXTRAS = {"bounds": list, "minimize": bool, "context": dict, "asked": int | float}


def _digest(*parts: object) -> str:
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:16]


def _write_new(path: Path, content: dict) -> None:
    r"""Write ``content`` to ``path`` once, durably: ``FileExistsError`` if it exists."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(content, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        os.link(tmp, path)  # atomic, and refuses an existing file
    finally:
        os.unlink(tmp)


def _alive(marker: dict) -> bool:
    r"""Whether the process that wrote an activity marker still runs (another host's:
    assumed so)."""
    if marker.get("host") != socket.gethostname():
        return True
    try:
        os.kill(int(marker["pid"]), 0)
    except ProcessLookupError:
        return False
    except (PermissionError, KeyError, TypeError, ValueError):
        return True
    return True


class Party:
    r"""The operator's side of an ask/tell party: the pending points and the reports.

    Args:
        folder: The party's ask/tell folder (shared with its :class:`AskTellObjective`).
    """

    def __init__(self, folder: str | os.PathLike) -> None:
        self.folder = Path(folder)

    def _ask_path(self, point_id: object) -> Path:
        if not (isinstance(point_id, str) and _ID.fullmatch(point_id)):
            raise ValueError(f"`id`={point_id!r:.40} is not a point id (16 hex digits).")
        return self.folder / f"{point_id}.ask.json"

    def _load_ask(self, path: Path) -> dict:
        r"""The pending point in ``path``, or ``ValueError`` if it is unreadable or was
        edited (its fields, or its point against its check digest)."""
        try:
            ask = json.loads(path.read_text())
        except (OSError, ValueError):
            ask = None
        ok = isinstance(ask, dict) and all(
            isinstance(ask.get(k), t) and not isinstance(ask.get(k), bool)
            for k, t in _ASK_FIELDS.items()
        )
        ok = ok and all(
            isinstance(ask[k], t) and (t is bool or not isinstance(ask[k], bool))
            for k, t in _ASK_EXTRAS.items()
            if k in ask
        )
        if not ok or ask is None or _digest(ask["id"], ask["x"]) != ask["check"]:
            raise ValueError(f"The pending point in {path} is unreadable or was edited.")
        if path.name != f"{ask['id']}.ask.json":
            raise ValueError(f"The pending point in {path} is unreadable or was edited.")
        return ask

    def _asks(self) -> list[dict]:
        asks = []
        for path in self.folder.glob("*.ask.json"):
            try:
                asks.append(self._load_ask(path))
            except ValueError as exc:
                warnings.warn(str(exc), RuntimeWarning, stacklevel=3)
        return sorted(asks, key=lambda a: (a["objective"], a["run"], a["sequence"]))

    def active(self) -> bool:
        r"""Whether an objective whose process still runs asks in this folder."""
        for path in self.folder.glob("active-*.json"):
            try:
                marker = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
            if isinstance(marker, dict) and _alive(marker):
                return True
        return False

    def status(self) -> dict:
        r"""Where the party stands: ``state`` (``"waiting for you"``: points are pending;
        ``"waiting for the federation"``: a run is active and nothing is pending; ``"no
        run active"``), ``pending`` (how many points), ``asked`` and ``reported`` (over
        the folder's history) and ``context`` (the newest point's run and round)."""
        history, active = self.history(), self.active()
        pending = sum("value" not in a and "failed" not in a for a in history)
        state = "no run active"
        if active:
            state = "waiting for you" if pending else "waiting for the federation"
        newest = max(history, key=lambda a: a.get("asked", 0.0), default={})
        return {
            "state": state,
            "pending": pending,
            "asked": len(history),
            "reported": len(history) - pending,
            "context": newest.get("context", {}),
        }

    def pending(self) -> list[dict]:
        r"""The points waiting for a report: ``id``, ``objective``, ``run``, ``sequence``,
        ``x`` (in the objective's own domain), ``check``, the domain (``bounds``, one
        ``[lower, upper]`` per input), ``minimize``, ``asked`` (a Unix time) and
        ``context`` (e.g. the run and round it was asked in)."""
        return [a for a in self._asks() if self.answer(a["id"]) is None]

    def history(self) -> list[dict]:
        r"""Every point asked, with its report (``value`` or ``failed``) if made."""
        return [{**a, **(self.answer(a["id"]) or {})} for a in self._asks()]

    def answer(self, point_id: str) -> dict | None:
        r"""The report on ``point_id`` (``{"value": v}`` or ``{"failed": reason}``), or
        ``None`` while it is pending."""
        path = self._ask_path(point_id).with_name(f"{point_id}.report.json")
        return json.loads(path.read_text()) if path.exists() else None

    def report(self, point_id: str, value: float) -> None:
        r"""Report the measurement at ``point_id``.

        Raises:
            ValueError: No run is active, ``point_id`` is unknown or already reported,
                the pending point's file was edited, or ``value`` is not a finite number.
        """
        if isinstance(value, bool) or not isinstance(value, int | float | np.integer | np.floating):
            raise ValueError(f"`value`={value!r:.40} must be a number.")
        try:
            value = float(value)
        except OverflowError:
            value = math.inf
        if not math.isfinite(value):
            raise ValueError(f"`value`={value!r} must be finite (report a failure instead).")
        self._tell(point_id, {"value": value})

    def report_failure(self, point_id: str, reason: str) -> None:
        r"""Report that the measurement at ``point_id`` failed (the algorithm records a
        failed evaluation), with a ``reason``; the errors of :meth:`report`."""
        if not isinstance(reason, str) or not reason.strip():
            raise ValueError(f"`reason`={reason!r:.40} must be a non-empty string.")
        self._tell(point_id, {"failed": reason})

    def _tell(self, point_id: str, answer: dict) -> None:
        path = self._ask_path(point_id)
        if not self.active():
            raise ValueError(f"No run is active in {self.folder}: nothing to report to.")
        if not path.exists():
            raise ValueError(f"`id`={point_id!r} is not a point of {self.folder}.")
        self._load_ask(path)
        try:
            _write_new(path.with_name(f"{point_id}.report.json"), answer)
        except FileExistsError:
            raise ValueError(f"`id`={point_id!r} was reported already.") from None


class AskTellObjective(Objective):
    r"""A black box whose values a person reports: each point is asked in ``folder`` and
    the evaluation waits for :meth:`Party.report` (or :meth:`Party.report_failure`). The
    reported value is both what the client learns from and what results report (there
    is no noise-free value). Use it as a context manager, or call :meth:`close`, to
    end the run (reports are refused afterwards; so they are once its process ended).

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
    ) -> None:
        if not isinstance(minimize, bool):
            raise ValueError(f"`minimize`={minimize!r} must be a bool.")
        if isinstance(poll_s, bool) or not isinstance(poll_s, int | float) or not poll_s > 0:
            raise ValueError(f"`poll_s`={poll_s!r} must be a number > 0.")
        if not isinstance(name, str) or not name:
            raise ValueError(f"`name`={name!r} must be a non-empty string.")
        self.bounds, self.minimize, self.name = check_bounds(bounds), minimize, name
        self.party, self.poll_s, self.on_ask = Party(folder), float(poll_s), on_ask
        if context is not None and not isinstance(context, dict):
            raise ValueError(f"`context`={context!r:.40} must be a dict or None.")
        self.context = {} if context is None else context
        self.run = os.urandom(8).hex()  # a new run asks afresh; a resumed one loads its own
        self.sequence = 0  # points asked so far
        self.party.folder.mkdir(parents=True, exist_ok=True)
        self._marker = self.party.folder / f"active-{os.urandom(8).hex()}.json"
        marker = {"objective": name, "pid": os.getpid(), "host": socket.gethostname()}
        self._marker.write_text(json.dumps(marker))
        self._finalizer = weakref.finalize(self, self._marker.unlink, missing_ok=True)

    def close(self) -> None:
        r"""End the run: this objective no longer makes its folder active."""
        self._finalizer()

    def __enter__(self) -> AskTellObjective:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def evaluate(self, X: Tensor) -> tuple[Tensor, Tensor]:
        values = [self._ask_and_wait(x) for x in self.to_domain(X)]
        out = torch.tensor(values, dtype=torch.float64)
        return out, out

    def _ask_and_wait(self, x: Tensor) -> float:
        point = [float(v) for v in x.tolist()]
        self.sequence += 1
        point_id = _digest(self.name, self.run, self.sequence)
        path = self.party._ask_path(point_id)
        ask: dict[str, object] = {"id": point_id, "objective": self.name, "run": self.run}
        ask |= {"sequence": self.sequence, "x": point, "check": _digest(point_id, point)}
        lower, upper = self.bounds.tolist()
        ask |= {"bounds": [list(b) for b in zip(lower, upper, strict=True)]}
        ask |= {"minimize": self.minimize, "context": dict(self.context), "asked": time.time()}
        try:
            _write_new(path, ask)
        except FileExistsError:  # asked before a restart: its report may be in
            asked = self.party._load_ask(path)["x"]
            if not np.allclose(asked, point, rtol=1e-9, atol=0.0):
                raise RuntimeError(
                    f"The resumed run asks {point} as point #{self.sequence} of {self.name}, "
                    f"which asked {asked} before ({path})."
                ) from None
        else:
            if self.on_ask is not None:
                try:
                    self.on_ask(ask)
                except Exception as exc:  # noqa: BLE001 - a notification is not the measurement
                    warnings.warn(f"`on_ask` failed: {exc!r}", RuntimeWarning, stacklevel=2)
        while (answer := self.party.answer(point_id)) is None:
            time.sleep(self.poll_s)
        if "failed" in answer:
            raise RuntimeError(f"the measurement failed: {answer['failed']}")
        return float(answer["value"])

    def state_dict(self) -> dict:
        return {"run": self.run, "sequence": self.sequence}

    def load_state_dict(self, state: dict) -> None:
        run, sequence = state.get("run"), state.get("sequence")
        if not (isinstance(run, str) and re.fullmatch(r"[0-9a-f]{16}", run)):
            raise ValueError(f"`run` must be 16 hex digits, got {run!r:.40}.")
        if isinstance(sequence, bool) or not isinstance(sequence, int) or sequence < 0:
            raise ValueError(f"`sequence` must be an int >= 0, got {sequence!r:.40}.")
        self.run, self.sequence = run, sequence
