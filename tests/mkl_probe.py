r"""Which kernels this process's linear algebra goes through, for ``make test-matrix``
(not a test).

Prints one line: the settings that can change rounding (``MKL_CBWR``,
``MKL_ENABLE_INSTRUCTIONS``, torch's thread count, ``torch.backends.mkldnn``; the last
two as :func:`apply_session_settings` sets them for the suite), the
processor class MKL's verbose header names (``MKL_VERBOSE=1`` on a small GEMM; Intel CPUs
report the ISA, e.g. "Intel(R) Advanced Vector Extensions 512 (Intel(R) AVX-512) enabled
processors", other CPUs "Intel(R) Architecture processors", MKL's generic path) and a
fingerprint of float32 and float64 results of the operations the library's GP maths
uses (GEMM, batched GEMM, Cholesky, triangular solve, ``F.linear``, a long sum). Runs
whose fingerprints agree went through the same kernels, at least for these shapes.

With ``--baseline FILE`` it compares the fingerprint of each operation with the ones in
``FILE`` (written by the first call, the matrix's reference run) and names those that
changed: which of the matrix's settings change rounding on this machine.

Usage: ``MKL_CBWR=AVX2 .venv/bin/python tests/mkl_probe.py [--baseline FILE]``
"""

from __future__ import annotations

import argparse
import configparser
import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import torch

SETTINGS = ("MKL_CBWR", "MKL_ENABLE_INSTRUCTIONS")


def mkl_processor_class() -> str:
    r"""The processor class in MKL's verbose header, run in a child process."""
    code = "import torch; a = torch.rand(8, 8); a @ a"
    env = {**os.environ, "MKL_VERBOSE": "1"}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    match = re.search(r"architecture (.*?),? Lnx", out.stdout + out.stderr)
    return match.group(1) if match else "no MKL_VERBOSE header"


def _digest(*tensors: torch.Tensor) -> str:
    h = hashlib.sha1()
    for t in tensors:
        h.update(t.detach().contiguous().numpy().tobytes())
    return h.hexdigest()[:8]


def fingerprints() -> dict[str, str]:
    r"""A hash per operation and dtype of results that depend on the kernels, their
    blocking and the thread count."""
    out = {}
    for dtype in (torch.float32, torch.float64):
        g = torch.Generator().manual_seed(0)
        A = torch.rand(257, 263, generator=g, dtype=dtype)
        B = torch.rand(263, 129, generator=g, dtype=dtype)
        small = torch.rand(64, 13, 11, generator=g, dtype=dtype)
        S = A @ A.mT + 263 * torch.eye(257, dtype=dtype)
        L = torch.linalg.cholesky(S)
        bits = {32: "32", 64: "64"}[torch.finfo(dtype).bits]
        out[f"gemm{bits}"] = _digest(A @ B)
        out[f"bmm{bits}"] = _digest(small @ small.mT)
        out[f"cholesky{bits}"] = _digest(L)
        out[f"trsm{bits}"] = _digest(torch.linalg.solve_triangular(L, B[:257], upper=False))
        out[f"linear{bits}"] = _digest(torch.nn.functional.linear(A, B.mT))
        out[f"sum{bits}"] = _digest(torch.rand(1_000_003, generator=g, dtype=dtype).sum())
    return out


def apply_session_settings(workers: int = 1) -> None:
    r"""The session settings of ``make test`` / ``make test-matrix``:
    ``BOTORCH_FED_TEST_THREADS=N`` torch threads (default ``cpu_count / workers``, at
    least 1; torch caps ``OMP_NUM_THREADS`` at the number of cores, this does not) and
    ``BOTORCH_FED_TEST_MKLDNN=0|1`` (``torch.backends.mkldnn``; default unchanged).

    Raises:
        ValueError: Naming the variable whose value is not allowed.
    """
    threads = os.environ.get("BOTORCH_FED_TEST_THREADS")
    if threads is not None:
        if not threads.isdigit() or int(threads) < 1:
            raise ValueError(f"BOTORCH_FED_TEST_THREADS must be an integer >= 1, got {threads!r}.")
        torch.set_num_threads(int(threads))
    elif workers > 1:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // workers))
    mkldnn = os.environ.get("BOTORCH_FED_TEST_MKLDNN")
    if mkldnn is not None:
        if mkldnn not in ("0", "1"):
            raise ValueError(f"BOTORCH_FED_TEST_MKLDNN must be 0 or 1, got {mkldnn!r}.")
        torch.backends.mkldnn.enabled = mkldnn == "1"


def suite_workers() -> int:
    r"""The number of pytest-xdist workers ``make test`` starts (``-n`` in setup.cfg's
    ``addopts``; 1 without)."""
    config = configparser.ConfigParser()
    config.read(Path(__file__).parents[1] / "setup.cfg")
    found = re.search(r"(?:^|\s)-n\s*(\d+)", config.get("tool:pytest", "addopts", fallback=""))
    return int(found.group(1)) if found else 1


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", type=Path, help="compare with (or write) this file")
    args = parser.parse_args(argv)
    apply_session_settings(suite_workers())  # as tests/conftest.py does in each worker
    prints = fingerprints()
    combined = hashlib.sha1(json.dumps(prints, sort_keys=True).encode()).hexdigest()[:10]
    settings = ", ".join(f"{k}={os.environ[k]}" for k in SETTINGS if k in os.environ)
    mkldnn = "on" if torch.backends.mkldnn.enabled else "off"
    settings = (settings + ", " if settings else "") + (
        f"threads {torch.get_num_threads()}, mkldnn {mkldnn}"
    )
    line = f"{settings}; MKL: {mkl_processor_class()}; fingerprint {combined}"
    if args.baseline is not None:
        if args.baseline.exists():
            base = json.loads(args.baseline.read_text())
            changed = [op for op in prints if prints[op] != base.get(op)]
            line += f"; vs baseline: {'changed ' + ' '.join(changed) if changed else 'same'}"
        else:
            args.baseline.parent.mkdir(parents=True, exist_ok=True)
            args.baseline.write_text(json.dumps(prints, indent=1))
            line += "; the baseline"
    print(line)


if __name__ == "__main__":
    main()
