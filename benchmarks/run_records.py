r"""What the benchmark drivers share: their JSON-lines run records and the machine they
ran on (for the results' headers)."""

from __future__ import annotations

import json
import platform
import sys
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


def command_line(script: str, argv: list[str] | None) -> str:
    r"""How ``benchmarks/<script>`` was run: its arguments (``argv``, else the process's)."""
    return f"python benchmarks/{script} " + " ".join(sys.argv[1:] if argv is None else argv)


def write_report(folder: Path, stem: str, text: str, rows: list[dict]) -> None:
    r"""``<stem>.md`` (``text``) and ``<stem>.json`` (``rows``) in ``folder``; prints the text."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{stem}.md").write_text(text)
    (folder / f"{stem}.json").write_text(json.dumps(rows, indent=1) + "\n")
    print(text)
