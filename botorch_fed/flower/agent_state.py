r"""What a party's agent keeps across restarts (``--state-file``):
:class:`AgentState`, the runs it began (an append-only journal) and the LDP epsilon
it spent over all runs (a small file replaced atomically), with the checks and the
durable writes of both files.
"""

from __future__ import annotations

import json
import math
import os
import stat
from pathlib import Path

__all__ = ["AgentState"]


class AgentState:
    r"""What a party's agent keeps across restarts (``--state-file PATH``), in two files.

    - ``PATH``: the LDP epsilon spent over all runs, JSON ``{"format": 2,
      "epsilon_spent": e}``. It is replaced atomically (a temporary file, fsync, rename,
      fsync of the folder) at every answer that released epsilon, before that answer
      leaves the agent: a crash leaves the total before or after the answer, never less
      than what left. It stays a few dozen bytes.
    - ``PATH.runs``: the runs the agent began, one decimal run id a line, appended and
      fsynced before a run's client answers its first message: the runs a restarted
      agent refuses.

    Why the runs are a journal. A run that began must never start again, or a server
    could reset a client mid-run (have its initial design evaluated again, its users
    answer again with fresh noise). Flower's run ids are random 64-bit numbers, not
    increasing, so no high-water mark can stand for the runs that ended: each id must
    be kept. Kept in a JSON file rewritten at every event, each event cost time growing
    with the history (3,000 ids: 110 s of agent time); appended, each run costs one line
    (~20 bytes) and one fsync whatever came before, and the journal is read once, when
    the agent starts. Only runs the agent began are written: a refused run, or the report
    of a run it never held, writes nothing. The journal is capped at
    :data:`~.agent.MAX_REMEMBERED` runs (about 2 MB): past that the agent refuses new runs --
    refusing is safe, forgetting is not -- until its operator moves the journal aside,
    a decision only the party takes (the runs in it could then be answered again by
    fresh clients) and one that leaves the epsilon spent as it is. A server fills it only
    with runs the party's policy accepts, at the cost of a client build each.

    A crash in the middle of an append leaves a torn last line; the next start cuts it
    off (that run's client had answered nothing: its line is written first). A state
    file of the earlier format (one JSON file holding the runs, rewritten at every
    event) is converted when the agent starts: its runs go to the journal.

    Both files and their folder must be this user's and closed to others' writes
    (:func:`_check_state_path`).
    """

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        self.journal = self.path.with_name(f"{self.path.name}.runs")
        _check_state_path(self.path)
        _check_state_path(self.journal)

    def load(self) -> tuple[list[int], float]:
        r"""``(runs begun, epsilon spent)``; converts a file of the earlier format.

        Raises:
            ValueError: Naming the file, when it is not what this class writes.
        """
        spent, earlier = 0.0, None
        if self.path.exists():
            spent, earlier = _read_epsilon(self.path)
        began = _read_journal(self.journal)
        if earlier is not None:  # the earlier format: its runs into the journal first
            known = set(began)
            new = [r for r in dict.fromkeys(earlier) if r not in known]
            if new:
                _append(self.journal, "".join(f"{r}\n" for r in new))
            began += new
            self.spent(spent)
        return began, spent

    def began(self, run_id: int) -> None:
        r"""Record that run ``run_id`` began (one line appended, fsynced)."""
        _append(self.journal, f"{int(run_id)}\n")

    def spent(self, total: float) -> None:
        r"""Record the epsilon spent over all runs (the small file, replaced atomically)."""
        _replace(self.path, json.dumps({"format": 2, "epsilon_spent": float(total)}))


def _check_state_path(path: Path) -> None:
    r"""The state file's folder is this user's and closed to others' writes; the file,
    if there, is a regular file of this user that only this user can write (another
    local user must not be able to reset what the party has spent).

    Raises:
        ValueError: Naming ``--state-file`` and what is wrong.
    """
    folder = path.parent
    if not folder.is_dir():
        raise ValueError(f"--state-file {path}: the folder {folder} does not exist.")
    for what, item in (("the folder", folder), ("the file", path)):
        try:
            info = os.lstat(item)
        except FileNotFoundError:
            continue
        if what == "the file" and not stat.S_ISREG(info.st_mode):
            raise ValueError(f"--state-file {path}: not a regular file (a link?).")
        if info.st_uid != os.getuid():
            raise ValueError(f"--state-file {path}: {what} belongs to another user.")
        if info.st_mode & 0o022:
            raise ValueError(
                f"--state-file {path}: {what} is writable by other users "
                f"(mode {oct(stat.S_IMODE(info.st_mode))}): chmod go-w {item}"
            )


def _read_epsilon(path: Path) -> tuple[float, list[int] | None]:
    r"""``(epsilon spent, runs)`` of an agent's state file; ``runs`` is ``None`` but in
    a file of the earlier format (which held the runs that ended or were running).

    Raises:
        ValueError: Naming the file, when it is not an agent state file.
    """
    try:
        data = json.loads(path.read_text())
        spent = float(data["epsilon_spent"])
        earlier = None
        if "format" not in data:
            earlier = [int(k) for k in data["over"]] + [int(r) for r in data["started"]]
        elif data["format"] != 2:
            raise ValueError(f"format {data['format']!r}")
    except (OSError, ValueError, TypeError, KeyError, AttributeError) as exc:
        raise ValueError(f"--state-file {path}: not an agent state file ({exc}).") from None
    if not (math.isfinite(spent) and spent >= 0):
        raise ValueError(f"--state-file {path}: epsilon_spent {spent!r} is not >= 0.")
    return spent, earlier


def _read_journal(path: Path) -> list[int]:
    r"""The run ids of a runs journal (``[]`` when there is none); a torn last line (a
    crash while it was appended) is cut off.

    Raises:
        ValueError: Naming the file, when a line is not a run id.
    """
    try:
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return []
    try:
        with os.fdopen(fd, "rb+", closefd=False) as fh:
            data = fh.read()
            whole = data.rfind(b"\n") + 1
            if whole < len(data):  # torn: its run had not begun answering
                fh.truncate(whole)
                os.fsync(fd)
    finally:
        os.close(fd)
    try:
        return [int(line) for line in data[:whole].decode("ascii").splitlines()]
    except ValueError:
        raise ValueError(
            f"--state-file {path}: not an agent runs journal (a line is not a run id)."
        ) from None


def _append(path: Path, text: str) -> None:
    r"""Append ``text`` to ``path`` (created ``0600``, never through a link) and fsync it:
    one write, whatever the file's length."""
    created = not os.path.lexists(path)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        data = memoryview(text.encode("ascii"))
        while data:
            data = data[os.write(fd, data) :]
        os.fsync(fd)
    finally:
        os.close(fd)
    if created:
        _fsync_folder(path.parent)


def _replace(path: Path, text: str) -> None:
    r"""Replace ``path`` by a file holding ``text``, atomically: a crash leaves the old
    file or the new one, both complete."""
    from botorch_fed.protocol.checkpoint import write_atomically

    write_atomically(path, text.encode())
    _fsync_folder(path.parent)


def _fsync_folder(folder: Path) -> None:
    dir_fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
