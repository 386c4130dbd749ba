r"""Review of 4730981 (the l1 estimator's per-thread scratch buffer and NumPy ``log2``
magnitudes): the defects found, each a test that failed before its fix (b96ae17 has
them as strict xfails; weak references to the storage are keep modes of
``test_scratch.test_what_f_keeps_is_never_written``).

The module docstring of ``estimators`` promises: "a buffer that anything still refers to
when ``f`` returns is left to it and never written again". ``_holders`` compares counts
taken just before and just after ``f``; the tests below keep access to the buffer in ways
those counts do not see (a weak reference to the *storage*; a reference taken before the
"before" count; a storage swapped in by ``f``).
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from botorch_fed.zeroth_order import l1_gradient

pytestmark = pytest.mark.usefixtures("scratch_words_path")


class _RecordOutputs(TorchDispatchMode):
    r"""A debugging / tracing mode that keeps every op's output (and a copy of its value
    at the time) -- a reference that exists before ``_holders``' "before" count."""

    def __init__(self):
        super().__init__()
        self.log = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if "addcmul" in str(func):
            self.log.append((out, out.clone()))
        return out


def test_outputs_recorded_by_a_mode_are_never_written():
    x = torch.rand(4, 3)
    with _RecordOutputs() as mode:
        l1_gradient(lambda Z: Z.sum(-1), x, 0.1, torch.Generator().manual_seed(0))
        l1_gradient(lambda Z: Z.sum(-1), x, 0.1, torch.Generator().manual_seed(1))
    assert len(mode.log) == 4
    for out, value in mode.log:
        assert torch.equal(out, value)


def test_storage_swapped_in_by_f_is_never_written():
    x = torch.rand(4, 3)
    arrays, values = [], []

    def f(Z):
        arr = np.clip(Z.numpy(), 0.0, 1.0)  # f's own array, e.g. kept as a log of points
        Z.set_(torch.from_numpy(arr))
        arrays.append(arr)
        values.append(arr.copy())
        return Z.sum(-1)

    l1_gradient(f, x, 0.1, torch.Generator().manual_seed(0))
    l1_gradient(f, x, 0.1, torch.Generator().manual_seed(1))
    assert len(arrays) == 4
    for arr, value in zip(arrays, values, strict=True):
        np.testing.assert_array_equal(arr, value)


_DRAW = r"""
import torch
from botorch_fed.zeroth_order import sample_l1_sphere
for dtype in (torch.float32, torch.float64):
    z = sample_l1_sphere(64, d=1024, generator=torch.Generator().manual_seed(0), dtype=dtype)
    print(" ".join(map(float.hex, z.double().flatten().tolist())))
"""


def _avx512_features() -> list[str]:
    um = np._core._multiarray_umath if hasattr(np, "_core") else np.core._multiarray_umath
    found = {k for k, v in um.__cpu_features__.items() if v}
    return [f for f in um.__cpu_dispatch__ if f.startswith(("AVX512", "X86_V4")) and f in found]


def test_seeded_l1_directions_across_numpy_cpu_dispatch():
    # np.log2 runs SVML on AVX-512 (<= 2.05 ulp) and libm elsewhere (< 1 ulp): a seeded
    # direction's magnitudes may differ in the last bits between such hosts (documented
    # in sample_l1_sphere), but its signs, which FedZero's seed message uses (the server
    # redraws them), are the random words' top bits and agree exactly
    features = _avx512_features()
    if not features:
        pytest.skip("NumPy uses no AVX-512 code on this host: nothing to compare")
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

    def draw(disable: str | None) -> list[torch.Tensor]:
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": repo}
        env.pop("NPY_DISABLE_CPU_FEATURES", None)
        if disable:
            env["NPY_DISABLE_CPU_FEATURES"] = disable
        run = subprocess.run(
            [sys.executable, "-c", _DRAW], env=env, capture_output=True, text=True, check=True
        )
        lines = run.stdout.strip().splitlines()
        return [torch.tensor([float.fromhex(v) for v in line.split()]) for line in lines]

    avx512, other = draw(None), draw(" ".join(features))
    for dtype, a, b in zip((torch.float32, torch.float64), avx512, other, strict=True):
        assert torch.equal(a > 0, b > 0)
        # each magnitude within 2 + 1 ulp (SVML, libm), the norm likewise, one division
        torch.testing.assert_close(a, b, rtol=8 * torch.finfo(dtype).eps, atol=0)
