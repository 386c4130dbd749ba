"""Shamir sharing, fixed point, wire codec, and the no-torch import rule."""

from __future__ import annotations

import ast
import pathlib
import subprocess
import sys

import numpy as np
import pytest

import botorch_fed.secure
from botorch_fed.secure import TamperedMessageError, shamir
from botorch_fed.secure import fixed_point as fp
from botorch_fed.secure.crypto import RandomSource, chacha20_uint64
from botorch_fed.secure.wire import PayloadReader, PayloadWriter
from tests.helpers.secure_sum_bounds import assert_sum_close


@pytest.mark.parametrize(("n", "t"), [(3, 2), (5, 3), (20, 11), (7, 7)])
def test_shamir_any_t_shares_reconstruct(n: int, t: int) -> None:
    rng = np.random.default_rng(n * t)
    secret = rng.bytes(32)
    xs = [int(v) + 1 for v in rng.choice(1000, n, replace=False)]
    shares = shamir.split(secret, xs, t, rng.bytes)
    for _ in range(5):
        subset = [int(v) for v in rng.choice(xs, t, replace=False)]
        assert shamir.reconstruct({x: shares[x] for x in subset}, 32) == secret
    if t > 1:  # t - 1 shares interpolate to something else
        subset = xs[: t - 1]
        wrong = (
            sum(c * shares[x] for c, x in zip(shamir.lagrange_at_zero(subset), subset, strict=True))
            % shamir.PRIME
        )
        assert wrong != int.from_bytes(secret, "big")


def test_shamir_share_codec() -> None:
    value = shamir.PRIME - 1
    assert shamir.share_from_bytes(shamir.share_to_bytes(value)) == value
    with pytest.raises(TamperedMessageError):
        shamir.share_from_bytes(shamir.share_to_bytes(shamir.PRIME))
    with pytest.raises(TamperedMessageError):
        shamir.share_from_bytes(b"\x00" * 10)
    with pytest.raises(ValueError):
        shamir.split(b"x" * 65, [1, 2], 2, RandomSource(0).bytes)


def test_fixed_point_sum_is_exact_mod_2_64() -> None:
    rng = np.random.default_rng(0)
    xs = [rng.uniform(-100, 100, 1000) for _ in range(7)]
    total = np.zeros(1000, dtype=np.uint64)
    masks = [chacha20_uint64(rng.bytes(32), 1000) for _ in range(7)]
    for x, m in zip(xs, masks, strict=True):
        total += fp.encode(x, 7) + m
    for m in masks:
        total -= m
    # 7 roundings to the grid 2^-40 (2^-41 each) and the float64 roundings of the two
    # sides (tests/helpers/secure_sum_bounds.py)
    inputs = dict(enumerate(xs))
    assert_sum_close(fp.decode(total), np.sum(xs, axis=0), "masking", inputs)


def test_chacha20_prg_is_deterministic_and_key_dependent() -> None:
    a = chacha20_uint64(b"k" * 32, 100)
    assert np.array_equal(a, chacha20_uint64(b"k" * 32, 100))
    assert not np.array_equal(a, chacha20_uint64(b"j" * 32, 100))
    assert a.dtype == np.uint64 and len(np.unique(a)) == 100


def test_payload_codec_round_trip_and_errors() -> None:
    data = (
        PayloadWriter()
        .u32(7)
        .blob(b"abc")
        .ids((1, 5))
        .array(np.arange(3.0))
        .array(np.arange(2, dtype=np.uint64))
        .getvalue()
    )
    r = PayloadReader(data)
    assert r.u32() == 7 and r.blob() == b"abc" and r.ids() == (1, 5)
    assert np.array_equal(r.array("f", 3), np.arange(3.0))
    assert np.array_equal(r.array("u"), np.arange(2, dtype=np.uint64))
    r.done()
    with pytest.raises(TamperedMessageError, match="truncated"):
        PayloadReader(data[:5]).blob()
    r = PayloadReader(data + b"\x00")
    r.u32()
    r.blob()
    r.ids()
    r.array("f")
    r.array("u")
    with pytest.raises(TamperedMessageError, match="trailing"):
        r.done()
    r = PayloadReader(PayloadWriter().array(np.arange(3.0)).getvalue())
    with pytest.raises(TamperedMessageError, match="expected 4"):
        r.array("f", 4)


def test_secure_package_never_imports_torch() -> None:
    code = (
        "import sys, botorch_fed.secure as s, numpy as np; "
        "s.aggregate(s.get_backend('masking'), {i: np.ones(2) for i in range(3)}); "
        "s.aggregate(s.get_backend('ckks'), {i: np.ones(2) for i in range(3)}); "
        "assert 'torch' not in sys.modules, 'torch was imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
    # And no module of the package mentions torch in an import statement.
    root = pathlib.Path(botorch_fed.secure.__file__).parent
    for path in root.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import | ast.ImportFrom):
                names = [a.name for a in node.names] + [getattr(node, "module", "") or ""]
                assert not any(n.split(".")[0] == "torch" for n in names), path
