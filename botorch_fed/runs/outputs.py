r"""A run's output files: :func:`check_output_paths` refuses an ``--out`` / ``--plot``
path that could not be written before a run starts, so a long run never ends without
its results; :func:`write_json` writes atomically (a failure leaves an existing file as
it was).
"""

from __future__ import annotations

import json
import os


def check_output_paths(
    paths: dict[str, tuple[str, str | None]], config_path: str | None = None
) -> None:
    r"""Refuse output files that could not be written, before a run.

    Args:
        paths: ``{dest: (label, path)}`` for ``out`` and ``plot``: the flag or config
            key the path came from and the path (``None`` when not given).
        config_path: The ``--config`` file (an output must not overwrite it).

    Raises:
        ValueError: Naming the flag or key and the path.
        ImportError: ``--plot`` without matplotlib.
    """
    seen: dict[str, str] = {}
    for dest, (label, path) in paths.items():
        if not path:
            continue
        folder = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(folder):
            raise ValueError(f"{label} {path}: the folder {folder} does not exist.")
        if os.path.isdir(path):
            raise ValueError(f"{label} {path} is a folder; give a file name.")
        if not os.access(folder, os.W_OK):
            raise ValueError(f"{label} {path}: the folder {folder} is not writable.")
        if os.path.exists(path) and not os.access(path, os.W_OK):
            raise ValueError(f"{label} {path}: the file exists and is not writable.")
        if config_path and os.path.exists(path) and os.path.samefile(path, config_path):
            raise ValueError(f"{label} {path} is the --config file; give another file name.")
        real = os.path.realpath(path)
        if real in seen:
            raise ValueError(f"{seen[real]} and {label} name the same file {path}.")
        seen[real] = label
        if dest == "plot":
            check_plot_path(path, label)


def check_plot_path(path: str, label: str) -> None:
    r"""matplotlib is installed and writes the format of ``path`` (by its suffix)."""
    import importlib.util

    if importlib.util.find_spec("matplotlib") is None:
        raise ImportError(
            f"{label} needs matplotlib, which is not installed: pip install 'botorch-fed[plot]'."
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
    r"""``data`` as JSON into ``path``, atomically (a temporary file in the same folder
    replaces ``path`` once complete)."""
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        with open(tmp, "w") as fh:
            json.dump(data, fh, indent=2)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
