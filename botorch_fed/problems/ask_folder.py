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
import stat
import tempfile
from pathlib import Path
from typing import Any

_ID = re.compile(r"[0-9a-f]{16}")
_ASK_FIELDS = {"id": str, "objective": str, "run": str, "sequence": int, "x": list, "check": str}
#: what a point may also show its operator (what it was asked in)
_ASK_EXTRAS = {"bounds": list, "minimize": bool, "context": dict, "asked": int | float,
               "names": list, "range": list}  # fmt: skip
#: the longest failure reason a report keeps (characters)
MAX_REASON = 1000


#: the largest file of the folder that is read (a point, a report or a marker is < 4 KiB)
MAX_FILE = 1 << 16


def read_json(path: Path) -> Any:
    r"""The JSON in the regular file ``path``, or ``None`` where it is missing, not a
    regular file (a FIFO, a folder), larger than :data:`MAX_FILE`, unreadable or not
    JSON (nesting too deep included): whatever another local user left in the folder."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO does not block the open
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        data = b""
        while len(data) <= MAX_FILE and (chunk := os.read(fd, MAX_FILE + 1 - len(data))):
            data += chunk
    except OSError:
        return None
    finally:
        os.close(fd)
    if len(data) > MAX_FILE:
        return None
    try:
        return json.loads(data)
    except (ValueError, RecursionError):
        return None


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


def ask_check(ask: dict) -> str:
    r"""The digest that tells an intact pending point from an edited one: over its id
    and point, and the domain and direction it shows where it has them (and the inputs'
    names and the values' declared range where it has them)."""
    parts: list = [ask["id"], ask["x"]]
    if "bounds" in ask:
        parts += [ask["bounds"], ask.get("minimize")]
    parts += [ask[k] for k in ("names", "range") if k in ask]
    return point_digest(*parts)


def load_ask(path: Path) -> dict:
    r"""The pending point in ``path``, or ``ValueError`` if it is unreadable or was
    edited (its fields' types, or its point, domain or direction against its check)."""
    ask = read_json(path)
    ok = isinstance(ask, dict) and all(
        isinstance(ask.get(k), t) and not isinstance(ask.get(k), bool)
        for k, t in _ASK_FIELDS.items()
    )
    ok = ok and all(
        isinstance(ask[k], t) and (t is bool or not isinstance(ask[k], bool))
        for k, t in _ASK_EXTRAS.items()
        if k in ask
    )
    ok = ok and _extras_ok(ask)
    if not ok or ask is None or ask_check(ask) != ask["check"]:
        raise ValueError(f"The pending point in {path} is unreadable or was edited.")
    if path.name != f"{ask['id']}.ask.json":
        raise ValueError(f"The pending point in {path} is unreadable or was edited.")
    return {k: v for k, v in ask.items() if k in _ASK_FIELDS or k in _ASK_EXTRAS}


def _extras_ok(ask: dict) -> bool:
    r"""Whether a point's domain, input names and value range are what an objective
    writes: a ``[lower, upper]`` pair of numbers per input; distinct non-blank names, one
    per input; two finite numbers, lower < upper."""
    bounds, names, span = ask.get("bounds"), ask.get("names"), ask.get("range")
    if bounds is not None and not (
        len(bounds) == len(ask["x"])
        and all(isinstance(b, list) and len(b) == 2 and _finite(*b) for b in bounds)
    ):
        return False
    if names is not None and not (
        len(names) == len(ask["x"])
        and all(isinstance(n, str) and n.strip() for n in names)
        and len(set(names)) == len(names)
    ):
        return False
    if span is not None:
        return len(span) == 2 and _finite(*span) and float(span[0]) < float(span[1])
    return True


def _finite(*values: object) -> bool:
    r"""Whether every value is a finite number (huge integers included: no overflow)."""
    for v in values:
        if isinstance(v, bool) or not isinstance(v, int | float):
            return False
        try:
            if not math.isfinite(float(v)):
                return False
        except OverflowError:
            return False
    return True


def load_report(path: Path) -> dict | None:
    r"""The report in ``path`` (``{"value": v}`` or ``{"failed": reason}``), ``None`` if
    there is none yet, or ``ValueError`` if it is unreadable or was edited."""
    if not os.path.lexists(path):
        return None
    report = read_json(path)
    value = report.get("value") if isinstance(report, dict) else None
    reason = report.get("failed") if isinstance(report, dict) else None
    if isinstance(report, dict) and len(report) == 1:
        if isinstance(value, int | float) and not isinstance(value, bool):
            try:
                number = float(value)
            except OverflowError:  # an integer of hundreds of digits
                number = math.inf
            if math.isfinite(number):
                return {"value": number}
        if isinstance(reason, str) and reason.strip() and len(reason) <= MAX_REASON:
            return {"failed": reason}
    raise ValueError(f"The report in {path} is unreadable or was edited.")


def _alive(marker: dict) -> bool:
    r"""Whether the process that wrote an activity marker still runs (another host's:
    assumed so)."""
    if marker.get("host") != socket.gethostname():
        return True
    try:
        os.kill(int(marker["pid"]), 0)
    except (ProcessLookupError, OverflowError):  # no such process (or no such pid at all)
        return False
    except (PermissionError, KeyError, TypeError, ValueError):
        return True
    return True


class Party:
    r"""The operator's side of an ask/tell party: the pending points and the reports.

    A point is *pending* while the run that asked it still runs (its objective's marker
    names a live process) and nobody reported on it; a point of a run whose process ended
    without its report is *abandoned* (a campaign's restarted agent asks it again under
    the same id, and it is pending again).

    Args:
        folder: The party's ask/tell folder (shared with its :class:`AskTellObjective`).
    """

    def __init__(self, folder: str | os.PathLike) -> None:
        self.folder = Path(folder)

    def _ask_path(self, point_id: object) -> Path:
        if not (isinstance(point_id, str) and _ID.fullmatch(point_id)):
            raise ValueError(
                f"`id`={point_id!r:.40} is not a point id (16 lower-case hex digits, as "
                "`party suggest` shows them)."
            )
        return self.folder / f"{point_id}.ask.json"

    def _load_ask(self, path: Path) -> dict:
        return load_ask(path)

    def _scan(self) -> tuple[list[dict], list[str]]:
        r"""Every intact point of the folder (sorted by objective, run and sequence) and
        the names of the damaged files (points and reports)."""
        asks, damaged = [], []
        for path in sorted(self.folder.glob("*.ask.json")):
            try:
                asks.append(load_ask(path))
            except ValueError:
                damaged.append(path.name)
        for path in sorted(self.folder.glob("*.report.json")):
            try:
                load_report(path)
            except ValueError:
                damaged.append(path.name)
        return sorted(asks, key=lambda a: (a["objective"], a["run"], a["sequence"])), damaged

    def live_runs(self) -> set[tuple[str, str]]:
        r"""``(objective, run)`` of every objective whose process still runs in this
        folder."""
        live = set()
        for path in self.folder.glob("active-*.json"):
            marker = read_json(path)
            if isinstance(marker, dict) and _alive(marker):
                live.add((str(marker.get("objective")), str(marker.get("run"))))
        return live

    def finished_runs(self) -> set[tuple[str, str]]:
        r"""``(objective, run)`` of every run its objective recorded as finished
        (:meth:`~botorch_fed.problems.ask_tell.AskTellObjective.finish`)."""
        done = set()
        for path in self.folder.glob("finished-*.json"):
            record = read_json(path)
            if isinstance(record, dict):
                done.add((str(record.get("objective")), str(record.get("run"))))
        return done

    def active(self) -> bool:
        r"""Whether an objective whose process still runs asks in this folder."""
        return bool(self.live_runs())

    def _entries(self) -> tuple[list[dict], list[str]]:
        r"""Every point with its report, ``state`` (``pending``, ``reported``, ``failed``,
        ``abandoned``, ``damaged report``) and the damaged files' names."""
        asks, damaged = self._scan()
        live = self.live_runs()
        out = []
        for ask in asks:
            try:
                answer = self.answer(ask["id"])
            except ValueError:
                out.append({**ask, "state": "damaged report"})
                continue
            if answer is None:
                waiting = (ask["objective"], ask["run"]) in live
                out.append({**ask, "state": "pending" if waiting else "abandoned"})
            else:
                out.append(
                    {**ask, **answer, "state": "failed" if "failed" in answer else "reported"}
                )
        return out, damaged

    def status(self) -> dict:
        r"""Where the party stands: ``state`` (``"waiting for you"``: points are pending;
        ``"waiting for the federation"``: a run is active and nothing is pending;
        ``"finished"``: no run is active and the newest point's run was recorded as
        finished; ``"no run active"`` otherwise), ``pending``, ``asked``, ``reported``
        (failures included) and ``abandoned`` counts, ``damaged`` (the names of damaged
        files: a point's is written again by the run that asked it) and ``context`` (the
        newest point's run and round)."""
        entries, damaged = self._entries()
        count = {k: sum(e["state"] == k for e in entries) for k in ("pending", "abandoned")}
        newest = max(entries, key=lambda a: a.get("asked", 0.0), default={})
        state = "no run active"
        if self.active():
            state = "waiting for you" if count["pending"] else "waiting for the federation"
        elif (newest.get("objective"), newest.get("run")) in self.finished_runs():
            state = "finished"
        return {
            "state": state,
            "pending": count["pending"],
            "asked": len(entries),
            "reported": sum(e["state"] in ("reported", "failed") for e in entries),
            "abandoned": count["abandoned"],
            "damaged": damaged,
            "context": newest.get("context", {}),
        }

    def pending(self) -> list[dict]:
        r"""The points waiting for a report: ``id``, ``objective``, ``run``, ``sequence``,
        ``x`` (in the objective's own domain), ``check``, the domain (``bounds``, one
        ``[lower, upper]`` per input), ``minimize``, ``asked`` (a Unix time) and
        ``context`` (e.g. the run and round it was asked in)."""
        entries, _ = self._entries()
        return [
            {k: v for k, v in e.items() if k != "state"} for e in entries if e["state"] == "pending"
        ]

    def history(self) -> list[dict]:
        r"""Every point asked, with its report (``value`` or ``failed``) if made and its
        ``state`` (``pending``, ``reported``, ``failed``, ``abandoned``, ``damaged
        report``)."""
        return self._entries()[0]

    def answer(self, point_id: str) -> dict | None:
        r"""The report on ``point_id`` (``{"value": v}`` or ``{"failed": reason}``), or
        ``None`` while there is none; ``ValueError`` if its file was damaged."""
        return load_report(self._ask_path(point_id).with_name(f"{point_id}.report.json"))

    def report(self, point_id: str, value: float) -> None:
        r"""Report the measurement at ``point_id``.

        Raises:
            ValueError: No run is active, ``point_id`` is unknown, already reported or
                of a run that ended, the pending point's file was edited, or ``value`` is
                not a finite number.
        """
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise ValueError(f"`value`={value!r:.40} must be a number.")
        try:
            value = float(value)
        except OverflowError:
            value = math.inf
        if not math.isfinite(value):
            raise ValueError(f"`value`={value!r} must be finite (report a failure instead).")
        self._tell(point_id, {"value": value}, value)

    def report_failure(self, point_id: str, reason: str) -> None:
        r"""Report that the measurement at ``point_id`` failed (the algorithm records a
        failed evaluation), with a ``reason`` (at most :data:`MAX_REASON` characters);
        the errors of :meth:`report`."""
        if not isinstance(reason, str) or not reason.strip():
            raise ValueError(f"`reason`={reason!r:.40} must be a non-empty string.")
        if len(reason) > MAX_REASON:
            raise ValueError(
                f"`reason` has {len(reason)} characters, more than the {MAX_REASON} a report keeps."
            )
        self._tell(point_id, {"failed": reason})

    def _tell(self, point_id: str, answer: dict, value: float | None = None) -> None:
        path = self._ask_path(point_id)
        live = self.live_runs()
        if not live:
            raise ValueError(f"No run is active in {self.folder}: nothing to report to.")
        if not path.exists():
            raise ValueError(
                f"`id`={point_id!r} is not a point of {self.folder} (`party suggest` lists "
                "the pending ones)."
            )
        ask = load_ask(path)
        declared = ask.get("range")
        if value is not None and declared is not None and not declared[0] <= value <= declared[1]:
            raise ValueError(
                f"`value`={value!r} is outside the range [{declared[0]:g}, {declared[1]:g}] "
                "this objective declares for its measurements."
            )
        if (ask["objective"], ask["run"]) not in live:
            raise ValueError(
                f"`id`={point_id!r} was asked by a run that no longer runs: nothing waits "
                "for its report (`party suggest` lists the pending points)."
            )
        try:
            write_once(path.with_name(f"{point_id}.report.json"), answer)
        except FileExistsError:
            told = self.answer(point_id)
            raise ValueError(f"`id`={point_id!r} was reported already ({told}).") from None


#: a decimal number as an operator types it (no digit separators, ASCII digits)
_NUMBER = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
#: the longest value an operator types (characters)
MAX_VALUE_TEXT = 100


def parse_value(text: str, name: str = "value") -> float:
    r"""A measured value as an operator typed it (``12.5``, ``-3``, ``1.2e-3``): a finite
    float, or ``ValueError`` naming ``name`` (not a number, NaN, infinite)."""
    plain = str(text).strip()
    if len(plain) > MAX_VALUE_TEXT:
        raise ValueError(f"{name} has {len(plain)} characters: not a measured value.")
    named = re.fullmatch(r"[+-]?(nan|inf|infinity)", plain.lower()) is not None  # by name
    if not (_NUMBER.fullmatch(plain) or named):
        raise ValueError(f"{name} {str(text)!r:.40} is not a number (e.g. 12.5, -3, 1.2e-3).")
    value = float(plain)
    if not math.isfinite(value):
        raise ValueError(f"{name} {str(text)!r:.40} must be finite (report a failure instead).")
    return value
