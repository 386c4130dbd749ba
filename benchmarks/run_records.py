r"""What the benchmark drivers share: their JSON-lines run records and the machine they
ran on (for the results' headers)."""

from __future__ import annotations

import json
import platform
from pathlib import Path


def load_runs(path: Path) -> dict[str, dict]:
    r"""The run records of a JSON-lines file (one JSON object with a ``key`` per line),
    by key; later lines replace earlier ones. Empty if the file does not exist."""
    runs = {}
    if path.exists():
        for line in path.read_text().splitlines():
            if line.strip():
                rec = json.loads(line)
                runs[rec["key"]] = rec
    return runs


def cpu_model() -> str:
    r"""The CPU's model name (``/proc/cpuinfo`` on Linux), else what ``platform`` says."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"
