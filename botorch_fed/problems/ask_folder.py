r"""The operator's side of an ask/tell party (:mod:`.ask_tell`): its folder of pending
points and reports, read and written without torch (``botorch-fed party`` loads fast)."""

from __future__ import annotations

import hashlib
import json
import math
import numbers
import os
import re
import socket
import tempfile
import warnings
from pathlib import Path

_ID = re.compile(r"[0-9a-f]{16}")
_ASK_FIELDS = {"id": str, "objective": str, "run": str, "sequence": int, "x": list, "check": str}
#: what a point may also show its operator (what it was asked in)
_ASK_EXTRAS = {"bounds": list, "minimize": bool, "context": dict, "asked": int | float}


def point_digest(*parts: object) -> str:
    r"""16 hex digits naming (or checking) a point: the SHA-256 of ``parts`` as JSON."""
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:16]


def write_once(path: Path, content: dict) -> None:
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
        if not ok or ask is None or point_digest(ask["id"], ask["x"]) != ask["check"]:
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
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
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
            write_once(path.with_name(f"{point_id}.report.json"), answer)
        except FileExistsError:
            raise ValueError(f"`id`={point_id!r} was reported already.") from None
