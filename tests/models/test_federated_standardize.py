r"""Federated outcome standardisation: exact moments through every aggregator.

References are independent of the implementation: Python's ``statistics.mean`` /
``statistics.stdev`` (exact rational arithmetic, correctly rounded) and a float64
two-pass computation with ``math.fsum``.
"""

from __future__ import annotations

import math
import statistics

import numpy as np
import pytest
import torch
from botorch.exceptions.errors import BotorchTensorDimensionError, InputDataError
from botorch.models.transforms.outcome import Standardize

from botorch_fed.models import federated_standardize as fs
from botorch_fed.secure import make_aggregator

MAX = 1.7976931348623157e308
TINY = 5e-324  # smallest subnormal


def _normal(n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 1, generator=g, dtype=torch.float64)


# name -> 40 outcomes (10 clients x 4 points)
CASES = {
    "offset 1e8, spread 1": lambda: 1e8 + _normal(40, 0),
    "offset 1e5, spread 1e-3": lambda: 1e5 + 1e-3 * _normal(40, 1),
    "offset -3e11, spread 1e-4": lambda: -3e11 + 1e-4 * _normal(40, 2),
    "offset 1e12, spread 1": lambda: 1e12 + _normal(40, 3),
    "scale 1e12": lambda: 1e12 * _normal(40, 4),
    "tiny spread 1e-9 at 1": lambda: 1.0 + 1e-9 * _normal(40, 5),
    "tiny scale 1e-200": lambda: 1e-200 * _normal(40, 6),
    "mixed magnitudes": lambda: torch.cat(
        [1e12 * _normal(10, 7), 1e-12 * _normal(10, 8), _normal(10, 9), -1e6 + _normal(10, 10)]
    ),
    "huge 1e300": lambda: 1e300 * (1 + _normal(40, 11).abs()),
}


def _reference(Y: torch.Tensor) -> tuple[float, float]:
    y = Y.reshape(-1).tolist()
    return statistics.mean(y), statistics.stdev(y)


def _fsum_two_pass(Y: torch.Tensor) -> tuple[float, float]:
    r"""float64 corrected two-pass (Chan, Golub & LeVeque) with exactly rounded sums."""
    y = Y.reshape(-1).tolist()
    n = len(y)
    m = math.fsum(y) / n
    d = [v - m for v in y]
    return m, math.sqrt((math.fsum(v * v for v in d) - math.fsum(d) ** 2 / n) / (n - 1))


def _client_moments(Y: torch.Tensor, num_clients: int = 10) -> list[np.ndarray]:
    return [fs.outcome_moments(y) for y in Y.tensor_split(num_clients)]


def _assert_exact(tf: Standardize, mean: float, std: float, dtype=torch.float64) -> None:
    r"""Mean correctly rounded, std within one ulp of the exact value (then cast)."""
    got_mean, got_std = tf.means.item(), tf.stdvs.item()
    assert tf.means.dtype == tf.stdvs.dtype == dtype
    if dtype == torch.float64:
        assert got_mean == mean
        assert abs(got_std - std) <= math.ulp(std), (got_std, std)
    else:
        assert got_mean == torch.tensor(mean, dtype=dtype).item()
        assert got_std == pytest.approx(torch.tensor(std, dtype=dtype).item(), rel=2**-23)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("case", list(CASES))
def test_exact_for_large_offsets_small_spreads_and_extreme_magnitudes(case, dtype):
    Y = CASES[case]()
    mean, std = _reference(Y)
    if dtype == torch.float32 and mean > torch.finfo(dtype).max:
        with pytest.raises(ValueError, match="overflows torch.float32"):
            fs.standardize_from_moments(sum(_client_moments(Y)), dtype=dtype)
        return
    tf = fs.standardize_from_moments(sum(_client_moments(Y)), dtype=dtype, min_stdv=0.0)
    _assert_exact(tf, mean, std, dtype)
    # and an independent float64 two-pass agrees to rounding (where it does not overflow)
    if Y.abs().max() < 1e150:
        m2, s2 = _fsum_two_pass(Y)
        assert m2 == pytest.approx(mean, rel=1e-15) and s2 == pytest.approx(std, rel=1e-13)


def test_matches_botorch_standardize_on_pooled_data():
    Y = 1e3 + 5 * _normal(23, 12)
    tf = fs.standardize_from_moments(sum(_client_moments(Y, 5)))
    ref = Standardize(m=1)
    ref(Y)
    ref.eval()
    torch.testing.assert_close(tf.means, ref.means, rtol=1e-15, atol=0)
    torch.testing.assert_close(tf.stdvs, ref.stdvs, rtol=1e-14, atol=0)
    Y_new = _normal(5, 13)
    torch.testing.assert_close(tf(Y_new)[0], ref(Y_new)[0])
    torch.testing.assert_close(tf.untransform(Y_new)[0], ref.untransform(Y_new)[0])
    # float32 transform on float32 data
    tf32 = fs.standardize_from_moments(sum(_client_moments(Y, 5)), dtype=torch.float32)
    torch.testing.assert_close(tf32(Y_new.float())[0], ref(Y_new)[0].float())


def test_partition_and_order_do_not_change_the_result():
    # integer limbs sum exactly: any split of the data gives the same exact moments
    # (the limb sums themselves differ by carries)
    Y = 1e9 + 1e-4 * _normal(30, 14)
    whole = fs.outcome_statistics(fs.outcome_moments(Y))
    assert whole[1:] == _reference(Y)
    for k in (1, 3, 7, 30):
        parts = _client_moments(Y, k)
        assert fs.outcome_statistics(sum(parts)) == whole
        assert fs.outcome_statistics(sum(reversed(parts))) == whole
    # a client without data contributes nothing
    empty = fs.outcome_moments(torch.empty(0, 1, dtype=torch.float64))
    np.testing.assert_array_equal(empty, 0.0)


def test_limbs_are_small_integers():
    for Y in (
        CASES["huge 1e300"](),
        torch.tensor([[MAX], [-MAX], [TINY], [-TINY], [0.0]], dtype=torch.float64),
    ):
        m = fs.outcome_moments(Y)
        assert m.shape == (fs.OUTCOME_MOMENTS_LENGTH,) and m.dtype == np.float64
        assert np.all(m == np.round(m)) and np.abs(m).max() <= 2048


@pytest.mark.parametrize(
    "y",
    [[MAX, -MAX, TINY], [TINY, 0.0], [MAX, MAX], [-TINY, TINY, 3 * TINY], [2.0**-1022, -1.0]],
)
def test_extreme_float64_values(y):
    Y = torch.tensor(y, dtype=torch.float64).unsqueeze(-1)
    n, mean, std = fs.outcome_statistics(fs.outcome_moments(Y))
    assert n == len(y)
    assert mean == statistics.mean(y)
    ref = statistics.stdev(y)
    assert abs(std - ref) <= math.ulp(ref)


def test_std_overflowing_float64_raises():
    Y = torch.tensor([[MAX], [-MAX]], dtype=torch.float64)  # std = sqrt(2) * MAX
    with pytest.raises(ValueError, match="overflows float64"):
        fs.standardize_from_moments(fs.outcome_moments(Y))
    Y = torch.tensor([[1e300], [-1e300]], dtype=torch.float64)
    with pytest.raises(ValueError, match="overflows torch.float32"):
        fs.standardize_from_moments(fs.outcome_moments(Y), dtype=torch.float32)


def test_one_observation_one_client_and_constant_data():
    # one observation: mean = y, std 1 (as BoTorch)
    Y = torch.tensor([[1e8 + 0.5]], dtype=torch.float64)
    m = fs.outcome_moments(Y)
    tf = fs.standardize_from_moments(m)
    assert tf.means.item() == 1e8 + 0.5 and tf.stdvs.item() == 1.0
    n, mean, std = fs.outcome_statistics(m)
    assert (n, mean) == (1, 1e8 + 0.5) and math.isnan(std)
    # one client holding everything
    Y = CASES["offset 1e5, spread 1e-3"]()
    _assert_exact(fs.standardize_from_moments(fs.outcome_moments(Y)), *_reference(Y))
    # constant data (std 0) and spreads below min_stdv: std 1, as BoTorch
    for Y in (torch.full((6, 1), 1e12, dtype=torch.float64), 3.0 + 1e-10 * _normal(8, 15)):
        tf = fs.standardize_from_moments(sum(_client_moments(Y, 3)))
        ref = Standardize(m=1)
        ref(Y)
        assert tf.stdvs.item() == ref.stdvs.item() == 1.0
        assert tf.means.item() == _reference(Y)[0]
    # ... unless min_stdv allows them
    Y = 3.0 + 1e-10 * _normal(8, 15)
    _assert_exact(fs.standardize_from_moments(fs.outcome_moments(Y), min_stdv=0), *_reference(Y))


def test_float32_outcomes():
    Y = (1e4 + 0.01 * _normal(20, 16)).float()
    y64 = Y.double()
    tf = fs.standardize_from_moments(sum(_client_moments(Y, 4)), min_stdv=0)
    _assert_exact(tf, *_reference(y64))


# --- secure aggregation ----------------------------------------------------------------
# All cases in one session per (backend, wide): each client sends a cases x L matrix.
SECURE_CASES = [
    "offset 1e8, spread 1",
    "offset 1e5, spread 1e-3",
    "offset 1e12, spread 1",
    "scale 1e12",
    "tiny spread 1e-9 at 1",
    "mixed magnitudes",
]


@pytest.mark.parametrize("wide", [True, False])
@pytest.mark.parametrize("backend", ["plaintext", "masking", "ckks"])
def test_exact_through_secure_aggregators(backend, wide):
    data = [CASES[c]() for c in SECURE_CASES]
    per_client = [np.stack(m) for m in zip(*(_client_moments(Y) for Y in data), strict=True)]
    total = make_aggregator(backend, wide=wide, seed=0)(per_client)  # 10 clients
    for Y, row in zip(data, total, strict=True):
        if backend != "ckks":
            np.testing.assert_array_equal(row, sum(_client_moments(Y)))
        for dtype in (torch.float64, torch.float32):
            tf = fs.standardize_from_moments(row, dtype=dtype, min_stdv=0.0)
            _assert_exact(tf, *_reference(Y), dtype=dtype)


def test_ckks_raw_sum_is_approximate_but_decodes_exactly():
    Y = CASES["offset 1e5, spread 1e-3"]()
    total = make_aggregator("ckks", wide=False, seed=1)(_client_moments(Y, 4))
    assert not np.array_equal(total, np.round(total))  # CKKS error is there ...
    np.testing.assert_array_equal(np.round(total), sum(_client_moments(Y, 4)))  # ... and small
    _assert_exact(fs.standardize_from_moments(total, min_stdv=0), *_reference(Y))


# --- bad inputs ------------------------------------------------------------------------
def test_outcome_moments_rejects_bad_inputs():
    with pytest.raises(InputDataError, match=r"`train_Y` contains 1 NaN"):
        fs.outcome_moments(torch.tensor([[1.0], [float("nan")]]))
    with pytest.raises(InputDataError, match="`train_Y` contains 1 NaN or infinite"):
        fs.outcome_moments(torch.tensor([[1.0], [float("inf")]]))
    for shape in [(4,), (4, 2), (2, 4, 1)]:
        with pytest.raises(BotorchTensorDimensionError, match=r"`train_Y` must be `n x 1`"):
            fs.outcome_moments(torch.zeros(shape))
    with pytest.raises(TypeError, match="`train_Y` must be a Tensor"):
        fs.outcome_moments(np.zeros((4, 1)))
    with pytest.raises(InputDataError, match="`train_Y` must be real"):
        fs.outcome_moments(torch.zeros(4, 1, dtype=torch.complex64))


def test_standardize_from_moments_rejects_bad_inputs():
    good = sum(_client_moments(_normal(12, 17), 3))
    with pytest.raises(ValueError, match=r"`moments` must be the sum .* no longer accepted"):
        fs.standardize_from_moments(np.array([4.0, 2.0, 3.0]))  # the old format
    with pytest.raises(ValueError, match=r"`moments` must be the sum .*got shape \(2, 552\)"):
        fs.standardize_from_moments(np.stack([good, good]))
    bad = good.copy()
    bad[7] = np.nan
    with pytest.raises(ValueError, match="`moments` contains 1 NaN"):
        fs.standardize_from_moments(bad)
    bad = good.copy()
    bad[9] += 0.4
    with pytest.raises(ValueError, match="`moments` entries must be sums of integer limbs"):
        fs.standardize_from_moments(bad)
    with pytest.raises(ValueError, match=r"`moments` reports n=0 observations"):
        fs.standardize_from_moments(np.zeros(fs.OUTCOME_MOMENTS_LENGTH))
    with pytest.raises(ValueError, match=r"`moments` reports n=-1 observations"):
        fs.standardize_from_moments(good - fs.outcome_moments(torch.zeros(13, 1)))
    bad = good.copy()
    bad[5 + 100] += 1  # sum y far too large for sum y^2
    with pytest.raises(ValueError, match="`moments` is inconsistent"):
        fs.standardize_from_moments(bad)
    with pytest.raises(ValueError, match="`dtype` must be a floating"):
        fs.standardize_from_moments(good, dtype=torch.int64)
    for bad_min in (-1.0, float("nan"), "small"):
        with pytest.raises(ValueError, match="`min_stdv` must be"):
            fs.standardize_from_moments(good, min_stdv=bad_min)
    # a Tensor sum is accepted
    tf = fs.standardize_from_moments(torch.as_tensor(good))
    torch.testing.assert_close(tf.means, fs.standardize_from_moments(good).means)
