r"""Limb encoding for wide-range secure sums, and the ``aggregate`` callable adapter."""

from __future__ import annotations

import math

import numpy as np
import pytest

from botorch_fed.secure import LimbEncoding, get_backend, make_aggregator
from tests.helpers.secure_sum_bounds import EPS, assert_sum_close


def _decode_error(enc: LimbEncoding, limbs: np.ndarray) -> np.ndarray:
    r"""Bound on the float64 rounding of ``enc.decode(limbs)``: it adds the ``K``
    (exact) products ``d_k 2^(low + b k)`` of each value in float64, within
    ``gamma_{K-1} sum_k |d_k| 2^(low + b k)`` of their exact sum (Higham, Thm. 3.5)."""
    weights = np.ldexp(1.0, enc.low + enc.bits * np.arange(enc.num_limbs))
    magnitude = (np.abs(np.round(limbs)).reshape(-1, enc.num_limbs) * weights).sum(axis=1)
    return (enc.num_limbs - 1) * (EPS / 2) * magnitude


def _exact_sum(arrays) -> np.ndarray:
    r"""The correctly rounded sum of each coordinate (``math.fsum``): within ``u |sum|``."""
    return np.array([math.fsum(col) for col in np.stack(arrays).reshape(len(arrays), -1).T])


def test_limb_round_trip_and_resolution():
    enc = LimbEncoding()
    rng = np.random.default_rng(0)
    x = np.concatenate(
        [rng.normal(size=20) * 10.0 ** rng.integers(-10, 18, size=20), [0.0, -1.0, 2.0**-40]]
    )
    back = enc.decode(enc.encode(x))
    # x rounded to the grid 2^low (2^(low-1) at most), then decode's float64 sum
    assert np.all(np.abs(back - x) <= 2.0 ** (enc.low - 1) + _decode_error(enc, enc.encode(x)))
    limbs = enc.encode(x)
    assert limbs.size == x.size * enc.num_limbs
    assert np.all(np.abs(limbs) <= enc.max_limb()) and np.all(limbs == np.round(limbs))


def test_limb_sums_are_sums():
    enc = LimbEncoding(bits=10, low=-30, high=50)
    rng = np.random.default_rng(1)
    xs = [rng.normal(size=7) * 1e9 for _ in range(25)]
    limbs = sum(enc.encode(x) for x in xs)  # integer limb sums: exact
    total = enc.decode(limbs)
    # 25 inputs rounded to the grid 2^-30 (2^-31 each), decode's float64 sum, and the
    # rounding of the (correctly rounded) reference
    exact = _exact_sum(xs)
    bound = 25 * 2.0**-31 + _decode_error(enc, limbs) + (EPS / 2) * np.abs(exact)
    assert np.all(np.abs(total - exact) <= bound), np.abs(total - exact) / bound


def test_limb_errors():
    enc = LimbEncoding()
    with pytest.raises(ValueError, match="range"):
        enc.encode(np.array([2.0**70]))
    with pytest.raises(ValueError, match="NaN"):
        enc.encode(np.array([np.nan]))
    with pytest.raises(ValueError, match="multiple"):
        enc.decode(np.zeros(enc.num_limbs + 1))
    corrupted = enc.encode(np.array([3.0]))
    corrupted[0] += 0.4
    with pytest.raises(ValueError, match="corrupted"):
        enc.decode(corrupted)
    for bad in ({"bits": 1}, {"bits": 30}, {"low": 5, "high": 5}):
        with pytest.raises(ValueError):
            LimbEncoding(**bad)


@pytest.mark.parametrize("backend", ["plaintext", "ckks", "masking"])
@pytest.mark.parametrize("wide", [True, False])
def test_make_aggregator_sums_like_numpy(backend, wide):
    rng = np.random.default_rng(2)
    arrays = [rng.normal(size=(3, 4)) for _ in range(4)]
    stats: list = []
    total = make_aggregator(backend, wide=wide, seed=3, stats=stats)(arrays)
    assert total.shape == (3, 4)
    expected = np.sum(arrays, axis=0)
    if wide:
        # each input rounded to the limbs' grid 2^-40 (2^-41 each); the limb sums are
        # exact under every backend (CKKS's rounded back to integers); then decode's
        # float64 sum and numpy's (3 additions) of the reference
        enc = LimbEncoding()
        limbs = sum(enc.encode(a.reshape(-1)) for a in arrays)
        reference = 3 * (EPS / 2) * np.sum(np.abs(arrays), axis=0).reshape(-1)
        bound = 4 * 2.0**-41 + _decode_error(enc, limbs) + reference
        assert np.all(np.abs(total - expected).reshape(-1) <= bound)
    elif backend == "ckks":  # encryption noise, not rounding (measured ~1e-12)
        np.testing.assert_allclose(total, expected, rtol=0, atol=1e-9)
    else:
        inputs = {i: a.reshape(-1) for i, a in enumerate(arrays)}
        assert_sum_close(total.reshape(-1), expected.reshape(-1), backend, inputs)
    assert len(stats) == 1 and stats[0]["n_clients"] == 4


def test_wide_aggregation_handles_magnitudes_raw_masking_cannot():
    arrays = [np.array([1e10 * (i + 1), -3.5]) for i in range(3)]
    total = make_aggregator("masking", seed=0)(arrays)
    np.testing.assert_allclose(total, np.sum(arrays, axis=0), rtol=1e-15)
    from botorch_fed.secure import HeadroomError

    with pytest.raises(HeadroomError):
        make_aggregator("masking", wide=False, seed=0)(arrays)


def test_make_aggregator_bad_inputs():
    agg = make_aggregator("plaintext")
    with pytest.raises(ValueError, match="empty"):
        agg([])
    with pytest.raises(ValueError, match="shape"):
        agg([np.zeros(3), np.zeros(3), np.zeros(4)])
    with pytest.raises(ValueError, match="options"):
        make_aggregator(get_backend("plaintext"), min_clients=3)
    with pytest.raises(TypeError, match="backend"):
        make_aggregator(42)
