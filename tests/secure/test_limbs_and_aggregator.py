r"""Limb encoding for wide-range secure sums, and the ``aggregate`` callable adapter."""

from __future__ import annotations

import numpy as np
import pytest

from botorch_fed.secure import LimbEncoding, get_backend, make_aggregator


def test_limb_round_trip_and_resolution():
    enc = LimbEncoding()
    rng = np.random.default_rng(0)
    x = np.concatenate(
        [rng.normal(size=20) * 10.0 ** rng.integers(-10, 18, size=20), [0.0, -1.0, 2.0**-40]]
    )
    back = enc.decode(enc.encode(x))
    assert np.all(np.abs(back - x) <= 2.0**-41 + 1e-16 * np.abs(x))
    limbs = enc.encode(x)
    assert limbs.size == x.size * enc.num_limbs
    assert np.all(np.abs(limbs) <= enc.max_limb()) and np.all(limbs == np.round(limbs))


def test_limb_sums_are_sums():
    enc = LimbEncoding(bits=10, low=-30, high=50)
    rng = np.random.default_rng(1)
    xs = [rng.normal(size=7) * 1e9 for _ in range(25)]
    total = enc.decode(sum(enc.encode(x) for x in xs))
    np.testing.assert_allclose(total, np.sum(xs, axis=0), rtol=0, atol=25 * 2.0**-30 + 1e-6)


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
    tol = 4 * 2.0**-40 if wide else 1e-9  # wide: each input rounded to 2^-40
    np.testing.assert_allclose(total, np.sum(arrays, axis=0), rtol=0, atol=tol)
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
