r"""Checkpoints of a federated run: every party's state in its own file, written atomically.

A save writes fresh party files, then replaces the manifest ``checkpoint.json`` (files,
SHA-256 digests, run), then removes the old files: a crash keeps the previous checkpoint.
:func:`load_checkpoint` verifies everything first and loads ``weights_only`` (no code
runs). Client files hold private data and keys.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import re
import secrets
import stat
import tempfile
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

import torch

FORMAT = 3
MANIFEST = "checkpoint.json"
LOCK = ".checkpoint.lock"
_PARTY = re.compile(r"^(server|client-\d+)$")
_FILE = re.compile(r"^(server|client-\d+)\.r\d{6}\.[0-9a-f]{16}\.pt$")
_TMP = re.compile(r"^\.((server|client-\d+)\.r\d{6}\.[0-9a-f]{16}\.pt|checkpoint\.json)\..+\.tmp$")


class CheckpointError(ValueError):
    r"""A checkpoint that is missing, corrupt or does not belong to this run."""


def split_state(owner: str, state: Mapping, keys: Iterable[str]) -> tuple[dict, dict]:
    r"""``(own, rest)``: the entries ``keys`` of ``state`` (all required) and the others."""
    if not isinstance(state, Mapping):
        raise CheckpointError(f"{owner}: state must be a dict, got {type(state).__name__}.")
    keys = tuple(keys)
    missing = [k for k in keys if k not in state]
    if missing:
        raise CheckpointError(f"{owner}: state lacks {missing}.")
    own = {k: state[k] for k in keys}
    return own, {k: v for k, v in state.items() if k not in own}


def expect_keys(owner: str, state: Mapping, expected: Iterable[str]) -> None:
    r"""Raise :class:`CheckpointError` unless ``state`` has exactly the ``expected`` keys."""
    extra = split_state(owner, state, expected)[1]
    if extra:
        raise CheckpointError(f"{owner}: state has unexpected keys {sorted(map(str, extra))}.")


def check_history(owner: str, value) -> list[dict]:
    r"""Copies of the entries of a saved ``history``, which must be a list of dicts."""
    if not isinstance(value, list) or not all(isinstance(h, dict) for h in value):
        raise CheckpointError(f"{owner}: `history` must be a list of dicts.")
    return [dict(h) for h in value]


def check_tensor(owner: str, name: str, value, shape: tuple, dtype=torch.float64):
    r"""``value`` if it is a tensor of ``dtype`` and ``shape`` (``None``: any size)."""
    ok = isinstance(value, torch.Tensor) and value.dtype == dtype and value.ndim == len(shape)
    if not (ok and all(s is None or s == v for s, v in zip(shape, value.shape, strict=True))):
        got = type(value).__name__
        if isinstance(value, torch.Tensor):
            got = f"{value.dtype} tensor of shape {tuple(value.shape)}"
        want = " x ".join("n" if s is None else str(s) for s in shape)
        raise CheckpointError(
            f"{owner}: `{name}` must be a {dtype} tensor of shape {want}, got {got}."
        )
    return value


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory descriptors
        return
    with contextlib.suppress(OSError):
        os.fsync(fd)
    os.close(fd)


def write_atomically(path: Path, data: bytes) -> None:
    r"""Write ``data`` to a fresh, private (0600), randomly named temporary file
    (``O_EXCL``: a planted file or symlink is never followed), then rename it."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def save_checkpoint(folder: str | os.PathLike, round: int, parties: Mapping, info: dict) -> Path:
    r"""Write the checkpoint of ``round``: ``parties`` (``{"server": state,
    "client-0": state, ...}``) and ``info`` (JSON) in the manifest; returns its path."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    token = secrets.token_hex(8)
    files = {}
    for name, state in parties.items():
        if not _PARTY.match(name):
            raise ValueError(f"Party name {name!r} must be 'server' or 'client-<id>'.")
        buf = io.BytesIO()
        torch.save(dict(state), buf)
        data = buf.getvalue()
        file = f"{name}.r{int(round):06d}.{token}.pt"
        write_atomically(folder / file, data)
        files[name] = {"file": file, "sha256": hashlib.sha256(data).hexdigest()}
    manifest = {"format": FORMAT, "round": int(round), "files": files, **info}
    _fsync_dir(folder)
    write_atomically(folder / MANIFEST, json.dumps(manifest, indent=1).encode())
    _fsync_dir(folder)
    keep = {f["file"] for f in files.values()}
    for old in folder.iterdir():  # earlier rounds' files and leftovers of crashed saves
        if _FILE.match(old.name) and old.name not in keep or _TMP.match(old.name):
            old.unlink(missing_ok=True)
    return folder / MANIFEST


def prepare_folder(folder, resuming_from=None) -> Path:
    r"""``folder`` (created) as a ``Path`` if a run may checkpoint into it: a private,
    writable folder without a checkpoint, unless it is ``resuming_from``."""
    path, where = Path(folder), f"`checkpoint`={str(folder)!r}"
    if path.exists() and not path.is_dir():
        raise CheckpointError(f"{where} is a file, not a folder.")
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:
        raise CheckpointError(f"{where} cannot be created ({exc}).") from exc
    if not os.access(path, os.W_OK | os.X_OK):
        raise CheckpointError(f"{where} is not writable.")
    info = path.stat()
    if hasattr(os, "getuid") and (info.st_uid != os.getuid() or info.st_mode & stat.S_IWOTH):
        raise CheckpointError(
            f"{where} is not a private folder of this user (owned by another user, or writable "
            "by everyone): others could plant or replace files in it. Use a folder of your own."
        )
    same = resuming_from is not None and path.resolve() == Path(resuming_from).resolve()
    if (path / MANIFEST).exists() and not same:
        raise CheckpointError(
            f"{where} already holds a checkpoint; resume from it (`resume=`) or choose an "
            "empty folder (a run never overwrites another's)."
        )
    return path


@contextlib.contextmanager
def folder_lock(folder) -> Iterator[None]:
    r"""Hold an exclusive advisory lock on ``folder`` (POSIX; released on exit)."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX: no lock
        yield
        return
    flags = os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(Path(folder) / LOCK, flags, 0o600)
    except OSError as exc:  # e.g. a planted symlink (O_NOFOLLOW)
        raise CheckpointError(f"Cannot lock {str(folder)!r} ({exc}).") from exc
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise CheckpointError(
                f"Another run is checkpointing into {str(folder)!r} right now."
            ) from None
        yield
    finally:
        os.close(fd)


def load_checkpoint(folder: str | os.PathLike) -> tuple[dict, dict[str, dict]]:
    r"""``(manifest, {party: state})`` of the verified checkpoint in ``folder``."""
    folder = Path(folder)
    path = folder / MANIFEST
    if not path.is_file():
        raise CheckpointError(f"{folder} holds no checkpoint ({MANIFEST} is missing).")
    try:
        manifest = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise CheckpointError(f"{path} is corrupt ({exc}).") from exc
    found = manifest.get("format") if isinstance(manifest, dict) else None
    if found != FORMAT:
        raise CheckpointError(
            f"{path}: not a botorch-fed checkpoint of format {FORMAT} ({found!r})."
        )
    files, round_ = manifest.get("files"), manifest.get("round")
    if not isinstance(files, dict) or "server" not in files:
        raise CheckpointError(f"{path}: the manifest lists no server file.")
    if isinstance(round_, bool) or not isinstance(round_, int) or round_ < 0:
        raise CheckpointError(f"{path}: `round` must be an integer >= 0, got {round_!r}.")
    states = {}
    for name, entry in files.items():
        if not _PARTY.match(str(name)) or not isinstance(entry, dict):
            raise CheckpointError(f"{path}: bad entry {name!r} in the manifest.")
        file = folder / str(entry.get("file", ""))
        if file.parent != folder or not file.is_file():
            raise CheckpointError(f"{path}: the file {entry.get('file')!r} of {name} is missing.")
        data = file.read_bytes()
        if hashlib.sha256(data).hexdigest() != entry.get("sha256"):
            raise CheckpointError(
                f"{file} does not match the manifest's SHA-256 (altered, truncated or from "
                "another checkpoint)."
            )
        try:
            state = torch.load(io.BytesIO(data), weights_only=True)
        except Exception as exc:  # noqa: BLE001 - any unpickling failure
            raise CheckpointError(f"{file} cannot be read ({exc}).") from exc
        found = state.get("round") if isinstance(state, dict) else None
        if found != round_:
            raise CheckpointError(f"{file} is no state dict of round {round_} ({found!r}).")
        states[name] = state
    return manifest, states


def json_normalised(value):
    r"""``value`` as it reads back from JSON (tuples become lists, keys strings)."""
    return json.loads(json.dumps(value))
