r"""Which MKL code path this process gets, for ``make test-matrix`` (not a test).

Prints one line: the processor class MKL's verbose header names (``MKL_VERBOSE=1`` on
a small GEMM; Intel CPUs report the ISA, e.g. "Intel(R) Advanced Vector Extensions 512
(Intel(R) AVX-512) enabled processors", other CPUs "Intel(R) Architecture processors",
MKL's generic path) and a fingerprint of float32 GEMM / Cholesky / triangular-solve
results. Runs whose fingerprints agree went through the same kernels, at least for
these shapes; runs that differ round differently.

Usage: ``MKL_ENABLE_INSTRUCTIONS=AVX2 .venv/bin/python tests/mkl_probe.py``
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys

import torch


def mkl_processor_class() -> str:
    r"""The processor class in MKL's verbose header, run in a child process."""
    code = "import torch; a = torch.rand(8, 8); a @ a"
    env = {**os.environ, "MKL_VERBOSE": "1"}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    match = re.search(r"architecture (.*?processors)", out.stdout + out.stderr)
    return match.group(1) if match else "no MKL_VERBOSE header"


def fingerprint() -> str:
    r"""A hash of float32 results that depend on MKL's kernels and blocking."""
    g = torch.Generator().manual_seed(0)
    A = torch.rand(257, 263, generator=g)
    B = torch.rand(263, 129, generator=g)
    small = torch.rand(4, 13, 11, generator=g)
    S = A @ A.mT + 263 * torch.eye(257)
    L = torch.linalg.cholesky(S)
    X = torch.linalg.solve_triangular(L, B[:257], upper=False)
    h = hashlib.sha1()
    for t in (A @ B, small @ small.mT, L, X):
        h.update(t.numpy().tobytes())
    return h.hexdigest()[:10]


if __name__ == "__main__":
    print(f"MKL: {mkl_processor_class()}, fingerprint {fingerprint()}")
