r"""A user's write-ahead log of its releases: what it has spent, and where its noise
stream stands, kept where a rollback of its other state cannot reach.

A user that is restored from a checkpoint older than its last release would, without
this log, draw the same noise again (a server that aborts a round after the reply and
resumes learns an exact difference of two rewards) and forget the release (its budget
would not hold). The log is the user's single source of truth:

- it is bound to the user's key (a fingerprint in its first line), and its path is part
  of the user's own state, so a restored user reads *its* log wherever a run resumes
  (a fresh folder does not give it a fresh log; a missing log stops it);
- every release happens under an exclusive lock on the log: read the log (and repair a
  torn last line), catch up (count releases the user's state does not know, move the
  stream past every position used), check the budget, draw, append the record, fsync,
  unlock -- so two copies of a user forked from one checkpoint cannot both spend the
  same budget or the same noise.
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO


class ReleaseLogError(RuntimeError):
    r"""The log is missing, belongs to another key, or is corrupt."""


@dataclass
class LogView:
    r"""The log as read under the lock: its records, and where to append."""

    records: list[dict] = field(default_factory=list)

    @property
    def releases(self) -> int:
        return int(self.records[-1]["releases"]) if self.records else 0

    @property
    def position(self) -> int:
        return max((int(r["position"]) for r in self.records), default=0)


class ReleaseLog:
    r"""The release log of one user, at ``path``, bound to the key ``fingerprint``.

    Args:
        path: The log file (created with its header if missing and ``create``).
        fingerprint: A fingerprint of the user's key (not the key).
        create: Create the file if it does not exist; otherwise a missing log raises.
    """

    def __init__(self, path: str | os.PathLike, fingerprint: str, create: bool) -> None:
        self.path = Path(path)
        self.fingerprint = str(fingerprint)
        if not self.path.exists():
            if not create:
                raise ReleaseLogError(
                    f"The release log {self.path} is missing: the user's releases since its "
                    "checkpoint are unknown, so it refuses to answer."
                )
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(json.dumps({"fingerprint": self.fingerprint}) + "\n")
                f.flush()
                os.fsync(f.fileno())
        with self.locked():
            pass  # checks the header (and repairs a torn tail) now

    @contextmanager
    def locked(self) -> Iterator[LogView]:
        r"""Hold the log exclusively; yields its records (after repairing a torn last
        line). Append with :meth:`append` before leaving."""
        with open(self.path, "r+b") as f:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX)
            try:
                self._file = f
                yield LogView(self._read(f))
            finally:
                self._file = None
                fcntl.flock(f.fileno(), fcntl.LOCK_UN)

    def _read(self, f) -> list[dict]:
        data = f.read()
        end = data.rfind(b"\n") + 1
        if end < len(data):  # a torn last write (a crash mid-append): cut it off
            f.truncate(end)
            f.flush()
            os.fsync(f.fileno())
            data = data[:end]
        lines = data.decode().splitlines()
        try:
            header, records = json.loads(lines[0]), [json.loads(line) for line in lines[1:]]
        except (IndexError, json.JSONDecodeError) as exc:
            raise ReleaseLogError(f"The release log {self.path} is corrupt ({exc}).") from None
        if header.get("fingerprint") != self.fingerprint:
            raise ReleaseLogError(
                f"The release log {self.path} belongs to another key (another user or run)."
            )
        return records

    def append(self, record: dict) -> None:
        r"""Append ``record`` and fsync (inside :meth:`locked`), before the release leaves."""
        if self._file is None:
            raise ReleaseLogError("append() must be called while the log is locked.")
        self._file.seek(0, os.SEEK_END)
        self._file.write((json.dumps(record) + "\n").encode())
        self._file.flush()
        os.fsync(self._file.fileno())

    _file: BinaryIO | None = None
