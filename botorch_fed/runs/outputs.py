r"""A run's output files and folders, checked before the run starts (``--out``, ``--plot``,
``--checkpoint``, ``--resume``), and :func:`write_json`, which writes atomically."""

from __future__ import annotations

import importlib.util
import json
import os


def _writable(label: str, path: str, folder: bool) -> None:
    r"""``path`` (a file or a ``folder``) is of its kind and in a writable folder."""
    parent = os.path.dirname(os.path.abspath(path))
    if os.path.exists(path) and os.path.isdir(path) != folder:
        kind = "file; give a folder" if folder else "folder; give a file name"
        raise ValueError(f"{label} {path} is a {kind}.")
    if not os.path.isdir(parent):
        raise ValueError(f"{label} {path}: the folder {parent} does not exist.")
    target = path if folder and os.path.isdir(path) else parent
    if not os.access(target, os.W_OK):
        raise ValueError(f"{label} {path}: the folder {target} is not writable.")


def check_checkpoint_folders(checkpoint: str | None, resume: str | None, label: str) -> None:
    r"""``--resume`` is a writable folder; ``--checkpoint`` (``label``) one it may write."""
    from botorch_fed.protocol.checkpoint import MANIFEST

    if resume and not (os.path.isdir(resume) and os.access(resume, os.W_OK)):
        why = "the folder is not writable (the resumed run checkpoints into it)"
        why = why if os.path.isdir(resume) else "no such checkpoint folder"
        raise ValueError(f"--resume {resume}: {why}.")
    if checkpoint:
        _writable(label, checkpoint, folder=True)
        if os.path.isfile(os.path.join(checkpoint, MANIFEST)) and not (
            resume and os.path.samefile(resume, checkpoint)
        ):
            raise ValueError(
                f"{label} {checkpoint} already holds a checkpoint, which this run would "
                f"overwrite: continue that run with --resume {checkpoint}, or give another folder."
            )


def check_output_paths(
    paths: dict[str, tuple[str, str | None]], config_path: str | None = None
) -> None:
    r"""Refuse output files that could not be written (``paths``: ``{dest: (flag or key,
    path or None)}``) or would overwrite ``config_path``: ``ValueError`` naming the flag or
    key and the path; ``ImportError`` for ``--plot`` without matplotlib."""
    seen: dict[str, str] = {}
    for dest, (label, path) in paths.items():
        if not path:
            continue
        _writable(label, path, folder=False)
        if os.path.exists(path) and not os.access(path, os.W_OK):
            raise ValueError(f"{label} {path}: the file exists and is not writable.")
        if config_path and os.path.exists(path) and os.path.samefile(path, config_path):
            raise ValueError(f"{label} {path} is the --config file; give another file name.")
        real = os.path.realpath(path)
        if real in seen:
            raise ValueError(f"{seen[real]} and {label} name the same file {path}.")
        seen[real] = label
        if dest != "plot":
            continue
        if importlib.util.find_spec("matplotlib") is None:
            raise ImportError(
                f"{label} needs matplotlib, which is not installed: "
                "pip install 'botorch-fed[plot]'."
            )
        suffix = os.path.splitext(path)[1].lstrip(".").lower()
        if suffix:
            from matplotlib.backend_bases import FigureCanvasBase

            formats = FigureCanvasBase.get_supported_filetypes()
            if suffix not in formats:
                raise ValueError(
                    f"{label} {path}: matplotlib cannot write .{suffix} files (it writes "
                    f"{', '.join(f'.{f}' for f in sorted(formats))})."
                )


def write_json(data: dict, path: str) -> None:
    r"""``data`` as JSON into ``path``, atomically (a failure leaves an existing file as is)."""
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        with open(tmp, "w") as fh:
            json.dump(data, fh, indent=2)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
