r"""Tests of the sphere samplers (FedZero, Definition 6.1: uniform on the l1 sphere =
standard Laplace vector / its l1 norm)."""

from __future__ import annotations

import os
import struct
import subprocess
import sys

import numpy as np
import pytest
import torch
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from scipy import stats

from botorch_fed.zeroth_order import l1_sign, sample_l1_sphere, sample_l2_sphere, sampling
from tests.helpers.tolerances import tol

DTYPES = [torch.float32, torch.float64]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("batch", [(), (3,), (2, 4)])
@pytest.mark.parametrize("d", [1, 2, 7])
def test_unit_norms_shapes_dtypes(dtype, batch, d, l1_path):
    g = torch.Generator().manual_seed(0)
    z1 = sample_l1_sphere(*batch, d=d, generator=g, dtype=dtype)
    z2 = sample_l2_sphere(*batch, d=d, generator=g, dtype=dtype)
    for z, p in ((z1, 1), (z2, 2)):
        assert z.shape == batch + (d,) and z.dtype == dtype and z.device.type == "cpu"
        assert torch.isfinite(z).all()
        n = torch.linalg.vector_norm(z.double(), ord=p, dim=-1)
        # a length-d sum and one division, each rounded in `dtype`
        assert ((n - 1).abs() <= tol(dtype, 2 * d + 2)).all(), (p, n)
    if d == 1:
        assert (z1.abs() == 1).all()


def test_default_dtype_and_device():
    z = sample_l1_sphere(4, d=3)
    assert z.dtype == torch.get_default_dtype() and z.device.type == "cpu"
    z = sample_l2_sphere(d=3, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    assert z.shape == (3,) and z.dtype == torch.float64


def test_seeded_reproducible(l1_path):
    a = sample_l1_sphere(5, d=4, generator=torch.Generator().manual_seed(3))
    b = sample_l1_sphere(5, d=4, generator=torch.Generator().manual_seed(3))
    c = sample_l1_sphere(5, d=4, generator=torch.Generator().manual_seed(4))
    assert torch.equal(a, b) and not torch.equal(a, c)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("d", [2, 5, 20])
def test_l1_marginal_is_beta_and_signs_symmetric(d, dtype, l1_path):
    # |z| is Dirichlet(1, ..., 1), so each |z_j| ~ Beta(1, d - 1)
    N = 20000
    z = sample_l1_sphere(N, d=d, generator=torch.Generator().manual_seed(d), dtype=dtype).double()
    for j in (0, d - 1):
        p = stats.kstest(z[:, j].abs().numpy(), stats.beta(1, d - 1).cdf).pvalue
        assert p > 1e-3, (d, j, p)
        k = int((z[:, j] > 0).sum())
        assert stats.binomtest(k, N, 0.5).pvalue > 1e-3, (d, j, k)
    # signs independent of the magnitudes: E[z_j] = 0 within 5 standard errors
    se = z.std(dim=0) / N**0.5
    assert (z.mean(dim=0).abs() <= 5 * se).all()


def test_l2_marginal_is_beta():
    d, N = 6, 20000
    z = sample_l2_sphere(N, d=d, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    p = stats.kstest((z[:, 0] ** 2).numpy(), stats.beta(0.5, (d - 1) / 2).cdf).pvalue
    assert p > 1e-3


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_l1_no_nan_at_zero_words(monkeypatch, dtype):
    monkeypatch.setattr(sampling, "WORDS_MIN_NUMEL", 0)
    # every random word 0: each magnitude -log(1 - 2^-(p+1)) > 0, no 0 / 0
    calls = []

    def zeros(n, generator, dtype):
        calls.append(n)
        return torch.zeros(n, dtype=sampling._WORDS[dtype])

    monkeypatch.setattr(sampling, "_random_words", zeros)
    z = sample_l1_sphere(3, d=4, dtype=dtype)
    assert calls == [12]
    torch.testing.assert_close(z, torch.full((3, 4), 0.25, dtype=dtype))


def test_l1_no_nan_at_u_zero_torch_path(monkeypatch):
    # the torch.rand path (small batches, other dtypes and devices): u = 0 clamps too
    real = torch.rand

    def zeros(*args, **kwargs):
        return torch.zeros_like(real(*args, **kwargs))

    monkeypatch.setattr(sampling.torch, "rand", zeros)
    z = sample_l1_sphere(3, d=4, dtype=torch.float32)
    monkeypatch.setattr(sampling.torch, "rand", real)
    torch.testing.assert_close(z, torch.full((3, 4), -0.25))  # u = 0 < 1/2: negative


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_words_give_sign_and_exponential_magnitude(dtype, monkeypatch):
    monkeypatch.setattr(sampling, "WORDS_MIN_NUMEL", 0)
    # the bit layout: sign bit -> sign, mantissa bits -> w, magnitude -log2(u) with u =
    # w + 2^-(p+1), the middle of w's bin (Exp(1) / ln 2: the factor cancels in z);
    # checked against the closed form on hand-made words
    bits = 32 if dtype == torch.float32 else 64
    mant = 23 if dtype == torch.float32 else 52
    w = torch.tensor([0.0, 0.5, 0.75, 1 - 2.0**-mant], dtype=torch.float64)
    sign = [0, 1, 0, 1]
    raw = []
    for wi, si in zip(w.tolist(), sign, strict=True):  # exponent bits ignored: set some
        word = int(wi * 2**mant) | (si << (bits - 1)) | (0x55 << (mant + 1))
        raw.append(word - (1 << bits) if word >= 1 << (bits - 1) else word)
    words = torch.tensor(raw, dtype=sampling._WORDS[dtype])
    sign = torch.tensor(sign)
    monkeypatch.setattr(sampling, "_random_words", lambda n, g, dt: words[:n].clone())
    lap, total, _ = sampling._laplace_and_norm((4,), None, torch.device("cpu"), dtype)
    mag = -torch.log2(w + 2.0 ** -(mant + 1))
    expected = torch.where(sign == 1, -mag, mag)
    # each magnitude: NumPy's log2 in dtype (SVML <= 2.05 ulp on AVX-512, libm < 1 ulp)
    # against torch's float64 log2 of the same exact argument, <= 4 eps relative; the
    # total adds 3 positive terms in dtype (3 more roundings, relative): <= 8 eps
    torch.testing.assert_close(lap.double(), expected, rtol=tol(dtype, 4), atol=0)
    torch.testing.assert_close(total.double(), mag.sum().reshape(1), rtol=tol(dtype, 8), atol=0)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [1, 3, 65536, 65536 + 5, 3 * 65536 + 7])  # 2^16 float32 = a chunk
def test_random_words_are_the_aes_ctr_keystream(n, dtype):
    # independent computation: AES-128 of the counter blocks 0, 1, 2, ... (big-endian),
    # the definition of CTR mode, under the key made of four 32-bit draws of the generator
    words = sampling._random_words(n, torch.Generator().manual_seed(5), dtype)
    key_words = torch.randint(
        0, 1 << 32, (4,), generator=torch.Generator().manual_seed(5), dtype=torch.int64
    )
    key = struct.pack("<4I", *key_words.tolist())
    nbytes = n * (4 if dtype == torch.float32 else 8)
    counters = b"".join(i.to_bytes(16, "big") for i in range(-(-nbytes // 16)))
    ecb = Cipher(algorithms.AES(key), modes.ECB()).encryptor()
    expected = (ecb.update(counters) + ecb.finalize())[:nbytes]
    assert words.dtype == sampling._WORDS[dtype] and words.shape == (n,)
    # read as little-endian words on every host (a seed gives the same words, hence the
    # same signs, everywhere: the server of FedZero's seed message redraws them)
    assert words.tolist() == list(
        struct.unpack(f"<{n}{'i' if dtype == torch.float32 else 'q'}", expected)
    )


def test_random_words_advance_the_generator():
    g = torch.Generator().manual_seed(0)
    a, b = sampling._random_words(8, g, torch.float32), sampling._random_words(8, g, torch.float32)
    assert not torch.equal(a, b)


def test_l2_no_nan_at_zero_gaussian(monkeypatch):
    real = torch.randn
    monkeypatch.setattr(sampling.torch, "randn", lambda *a, **k: torch.zeros_like(real(*a, **k)))
    z = sample_l2_sphere(2, d=3, dtype=torch.float64)
    monkeypatch.setattr(sampling.torch, "randn", real)
    assert torch.equal(z, torch.tensor([[1.0, 0, 0], [1.0, 0, 0]], dtype=torch.float64))


def test_l1_sign_convention():
    z = torch.tensor([-2.0, -0.0, 0.0, 1e-30, 3.0])
    assert torch.equal(l1_sign(z), torch.tensor([-1.0, 1.0, 1.0, 1.0, 1.0]))
    with pytest.raises(ValueError, match="`z`"):
        l1_sign(torch.tensor([float("nan")]))
    with pytest.raises(ValueError, match="`z`"):
        l1_sign([1.0])


@pytest.mark.parametrize("bad", [0, -1, 2.0, True])
def test_bad_d(bad):
    with pytest.raises(ValueError, match="`d`"):
        sample_l1_sphere(3, d=bad)
    with pytest.raises(ValueError, match="`d`"):
        sample_l2_sphere(3, d=bad)


def test_bad_batch_dtype_generator():
    with pytest.raises(ValueError, match="`batch_shape`"):
        sample_l1_sphere(-1, d=2)
    with pytest.raises(ValueError, match="`batch_shape`"):
        sample_l1_sphere(2.5, d=2)
    with pytest.raises(ValueError, match="`dtype`"):
        sample_l1_sphere(2, d=2, dtype=torch.int64)
    with pytest.raises(ValueError, match="`generator`"):
        sample_l2_sphere(2, d=2, generator=0)


def test_words_key_is_drawn_on_the_cpu_whatever_the_default_device():
    n = sampling.WORDS_MIN_NUMEL
    torch.manual_seed(7)
    expected = sample_l1_sphere(n, d=1, dtype=torch.float64)
    torch.manual_seed(7)
    with torch.device("meta"):
        z = sample_l1_sphere(n, d=1, device="cpu", dtype=torch.float64)
    assert z.device.type == "cpu"
    assert torch.equal(z, expected)


# --- seeded directions across NumPy's CPU dispatch (np.log2 magnitudes) -----------------
# (scratch_words_path: the random-word sampler at test sizes in this process)
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


@pytest.mark.usefixtures("scratch_words_path")
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
        # the magnitudes, compared through z_j / z_0 = lap_j / lap_0, where the norm cancels
        # (a 1024-term sum of differently rounded terms, whose own roundings need not agree
        # between the hosts: up to ~1024 eps apart in the worst case): each magnitude is
        # within 2.05 + 1 ulp (SVML, libm) of log2, so a ratio of two within 2 * 3.05 eps,
        # and each side rounds z_j and z_0 (and the float64 ratio): 2 * (3.05 + 1.5) eps
        a, b = a.reshape(64, 1024), b.reshape(64, 1024)
        ratio_a, ratio_b = a / a[:, :1], b / b[:, :1]
        torch.testing.assert_close(ratio_a, ratio_b, rtol=tol(dtype, 9.1), atol=0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_generator_and_device():
    g = torch.Generator(device="cuda").manual_seed(0)
    z = sample_l1_sphere(5, d=3, generator=g, device="cuda", dtype=torch.float64)
    assert z.device.type == "cuda"
    assert torch.allclose(z.abs().sum(-1), torch.ones(5, dtype=torch.float64, device="cuda"))
    # a CUDA generator drawing for a CPU result: drawn on CUDA, moved
    z = sample_l2_sphere(5, d=3, generator=g, device="cpu")
    assert z.device.type == "cpu"
    # a CPU generator for a CUDA result
    z = sample_l1_sphere(5, d=3, generator=torch.Generator().manual_seed(0), device="cuda")
    assert z.device.type == "cuda"
