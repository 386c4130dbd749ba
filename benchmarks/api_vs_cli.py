r"""The two doors take the same time: README's ``run_federated`` example against the same
run through ``botorch-fed run --config``.

The Python example is README's own code (section "Your own black box", the block that
calls ``run_federated``: three sites with their own ``site_loss``, FBO-FedGP with masking,
5 rounds), run as ``python -c``; the command line runs the same federation from a config
file (``mylab.py`` with ``site_loss``, one ``[[objectives]]`` table per site, the same
seed and settings). Each is one fresh process, timed from start to exit (imports
included), alternately, ``--repeats`` times; the medians are compared (target: within
20%). Both use one torch thread unless told otherwise (``FederationSetup.threads``,
``--threads``), and they find the same best value (checked).

Usage::

    python benchmarks/api_vs_cli.py --repeats 3
    python benchmarks/api_vs_cli.py --smoke   # one repeat each

Writes ``benchmarks/results/api_vs_cli.{json,md}`` (``--smoke``: ``*_smoke.*``).
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.run_records import cpu_model  # noqa: E402
from botorch_fed.protocol.results import library_versions  # noqa: E402

RESULTS = Path(__file__).parent / "results"

MODULE = """
def site_loss(X, site=0):
    return ((X[:, :2] - 0.2 * site) ** 2).sum(-1) + 0.01 * X[:, 2] ** 2
"""
CONFIG = """
bounds = [[0.0, 1.0], [0.0, 1.0], [-5.0, 5.0]]
seed = 0
aggregator = "masking"
{objectives}
[settings]
num_init = 4
num_rounds = 5
support_size = 8
"""


def readme_example() -> str:
    r"""The ``run_federated`` example of the documentation's "Your own black box" page,
    printing its best value as JSON at the end."""
    text = (ROOT / "docs" / "own_black_box.md").read_text()
    section = text[: text.find("\n## ")]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    code = next(b for b in blocks if "run_federated" in b)
    for needle in ("seed=0", 'aggregator="masking"', "num_init=4, num_rounds=5, support_size=8"):
        if needle not in code:
            raise SystemExit(f"The page's example changed ({needle!r} not found): update CONFIG")
    return code + "\nimport json\nprint('BEST', json.dumps(result.best_value))\n"


def timed(command: list[str], cwd: Path) -> tuple[float, str]:
    start = time.perf_counter()
    proc = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=1800)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{command[:3]} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return seconds, proc.stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--smoke", action="store_true", help="one repeat each")
    args = parser.parse_args()
    repeats = 1 if args.smoke else args.repeats
    work = Path(tempfile.mkdtemp(prefix="api-vs-cli-"))
    (work / "mylab.py").write_text(MODULE)
    objectives = "".join(
        f'\n[[objectives]]\nfunction = "mylab:site_loss"\nkwargs = {{ site = {s} }}\n'
        for s in range(3)
    )
    (work / "run.toml").write_text(CONFIG.format(objectives=objectives))
    api = [sys.executable, "-c", readme_example()]
    cli = [sys.executable, "-m", "botorch_fed.cli", "run", "fbo-fedgp", "--config", "run.toml",
           "--out", "cli.json"]  # fmt: skip
    times: dict[str, list[float]] = {"api": [], "cli": []}
    best = {}
    for _ in range(repeats):
        seconds, out = timed(api, work)
        times["api"].append(seconds)
        best["api"] = json.loads(out.rsplit("BEST", 1)[1])
        seconds, _ = timed(cli, work)
        times["cli"].append(seconds)
        best["cli"] = json.loads((work / "cli.json").read_text())["best_value"]
    if best["api"] != best["cli"]:
        raise SystemExit(f"the two doors found different best values: {best}")
    api_s, cli_s = (statistics.median(times[k]) for k in ("api", "cli"))
    ratio = api_s / cli_s
    flags = "--smoke" if args.smoke else f"--repeats {repeats}"
    command = f"python benchmarks/api_vs_cli.py {flags}"
    record = {
        "command": command,
        "machine": f"{cpu_model()}, {platform.machine()}, Python {platform.python_version()}",
        "versions": library_versions(),
        "seconds": times,
        "median_s": {"api": api_s, "cli": cli_s},
        "api_over_cli": ratio,
        "within_20_percent": abs(ratio - 1) <= 0.2,
        "best_value": best["api"],
    }
    name = "api_vs_cli_smoke" if args.smoke else "api_vs_cli"
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(record, indent=1) + "\n")
    lines = [
        "# README's `run_federated` example vs `botorch-fed run --config`",
        "",
        f"Command: `{command}`; machine: {record['machine']}; "
        + ", ".join(f"{k} {v}" for k, v in record["versions"].items())
        + ".",
        "",
        "One fresh process per run (imports included), the two doors alternately; the same "
        "federation (3 sites, FBO-FedGP, masking, 5 rounds, seed 0), one torch thread each.",
        "",
        "| door | runs (s) | median (s) |",
        "|---|---|---|",
        f"| `run_federated` (README's example, `python -c`) | "
        f"{', '.join(f'{t:.1f}' for t in times['api'])} | {api_s:.1f} |",
        f"| `botorch-fed run fbo-fedgp --config run.toml` | "
        f"{', '.join(f'{t:.1f}' for t in times['cli'])} | {cli_s:.1f} |",
        "",
        f"API / CLI: {ratio:.2f} (target: within 20%: "
        f"{'met' if record['within_20_percent'] else 'NOT met'}); both found the best value "
        f"{best['api']:.6g}.",
        "",
    ]
    (RESULTS / f"{name}.md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
