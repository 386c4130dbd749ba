r"""Federated outcome standardisation: two rounded passes through every aggregator.

References are independent of the implementation: Python's ``statistics.mean`` /
``statistics.stdev`` (exact rational arithmetic, correctly rounded) and a float64
two-pass computation with ``math.fsum``. The clients round every sum to 40
significant bits (privacy, see ``docs/security.md``), so the federated mean and
standard deviation are accurate to ~2^-38 relative, not to the last bit.
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
from tests.helpers.tolerances import assert_within

MAX = 1.7976931348623157e308
TINY = 5e-324  # smallest subnormal
# accuracy promised for these cases (|mean| / std <= 2^41): mean within REL * std of
# the exact mean (plus its rounding), std within REL relative
REL = 2.0**-37  # 7.3e-12


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
    "scale 1e-6": lambda: 1e-6 * _normal(40, 17),
    "tiny scale 1e-200": lambda: 1e-200 * _normal(40, 6),
    "mixed magnitudes": lambda: torch.cat(
        [1e12 * _normal(10, 7), 1e-12 * _normal(10, 8), _normal(10, 9), -1e6 + _normal(10, 10)]
    ),
    "huge 1e300": lambda: 1e300 * (1 + _normal(40, 11).abs()),
    "branin-like 50 + 40 N": lambda: 50 + 40 * _normal(40, 18),
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


def _two_passes(Y: torch.Tensor, num_clients: int = 10, aggregate=sum):
    r"""Both passes for ``Y`` split over clients: ``(first_sum, second_sum)``."""
    parts = Y.tensor_split(num_clients)
    first = aggregate([fs.outcome_moments(y) for y in parts])
    _, center = fs.center_from_moments(first)
    second = aggregate([fs.centred_moments(y, center) for y in parts])
    return first, second


def _assert_accurate(
    tf: Standardize, mean: float, std: float, dtype=torch.float64, rel: float = REL
) -> None:
    r"""Mean within ``rel * std`` (+ 1 ulp), std within ``rel`` relative (then cast)."""
    got_mean, got_std = tf.means.item(), tf.stdvs.item()
    assert tf.means.dtype == tf.stdvs.dtype == dtype
    if dtype == torch.float64:
        assert abs(got_mean - mean) <= rel * std + math.ulp(mean), (got_mean, mean, std)
        assert abs(got_std - std) <= rel * std, (got_std, std)
    else:
        eps = 2.0**-23
        cast_mean, cast_std = (torch.tensor(v, dtype=dtype).item() for v in (mean, std))
        assert got_mean == pytest.approx(cast_mean, rel=eps, abs=rel * std)
        assert got_std == pytest.approx(cast_std, rel=eps)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("case", list(CASES))
def test_accurate_for_large_offsets_small_spreads_and_extreme_magnitudes(case, dtype):
    Y = CASES[case]()
    mean, std = _reference(Y)
    first, second = _two_passes(Y)
    if dtype == torch.float32 and mean > torch.finfo(dtype).max:
        with pytest.raises(ValueError, match="overflows torch.float32"):
            fs.standardize_from_moments(first, second, dtype=dtype)
        return
    tf = fs.standardize_from_moments(first, second, dtype=dtype, min_stdv=0.0)
    _assert_accurate(tf, mean, std, dtype)
    # and an independent float64 two-pass agrees (where it does not overflow)
    if Y.abs().max() < 1e150:
        m2, s2 = _fsum_two_pass(Y)
        assert m2 == pytest.approx(mean, rel=1e-15) and s2 == pytest.approx(std, rel=1e-13)


def test_old_one_pass_float_formula_fails_where_the_two_passes_do_not():
    # the old one-pass formula: (sum y^2 - n mean^2) / (n - 1) in float64
    for case, bad in (("offset 1e8, spread 1", 0.5), ("offset 1e5, spread 1e-3", 0.5)):
        Y = CASES[case]()
        y = Y.reshape(-1)
        n = len(y)
        old = math.sqrt(max(float((y * y).sum() - n * y.mean() ** 2) / (n - 1), 0.0))
        ref = _reference(Y)[1]
        assert abs(old - ref) > bad * ref
        _, _, std = fs.outcome_statistics(*_two_passes(Y))
        assert abs(std - ref) <= REL * ref


def test_matches_botorch_standardize_on_pooled_data():
    Y = 1e3 + 5 * _normal(23, 12)
    tf = fs.standardize_from_moments(*_two_passes(Y, 5))
    ref = Standardize(m=1)
    ref(Y)
    ref.eval()
    # the federated statistics are within their promised accuracy of the exact ones
    # (mean: REL * std + 1 ulp; std: REL relative); BoTorch's torch.mean within (n - 1)
    # eps of the sum of |y| / n, torch.std within n eps kappa relative (kappa =
    # sqrt(1 + n mean^2 / ((n - 1) var)), the condition number of the variance; Chan,
    # Golub & LeVeque)
    mean, std = _reference(Y)
    n, e = Y.shape[0], 2.0**-52
    kappa = math.sqrt(1 + n * mean**2 / ((n - 1) * std**2))
    d_mean = REL * std + math.ulp(mean) + (n - 1) * e * float(Y.abs().mean())
    d_std = (REL + n * kappa * e) * std
    assert abs(tf.means.item() - ref.means.item()) <= d_mean
    assert abs(tf.stdvs.item() - ref.stdvs.item()) <= d_std
    # (y - mean) / std moves by d_mean / std + |y - mean| d_std / std^2, and each side
    # rounds the difference and the quotient (eps of |y - mean| / std each)
    Y_new = _normal(5, 13)
    z = (Y_new - mean).abs() / std
    assert_within(tf(Y_new)[0], ref(Y_new)[0], d_mean / std + z * d_std / std + 4 * e * z)
    torch.testing.assert_close(tf.untransform(Y_new)[0], ref.untransform(Y_new)[0])
    # float32 transform on float32 data
    tf32 = fs.standardize_from_moments(*_two_passes(Y, 5), dtype=torch.float32)
    torch.testing.assert_close(tf32(Y_new.float())[0], ref(Y_new)[0].float())


def test_partition_and_order():
    # order of the clients never matters (integer limbs sum exactly); each split rounds
    # its own per-client sums, so splits agree to the promised accuracy
    Y = 1e9 + 1e-4 * _normal(30, 14)
    mean, std = _reference(Y)
    for k in (1, 3, 7, 30):
        parts = Y.tensor_split(k)
        stats = fs.outcome_statistics(*_two_passes(Y, k))
        first = sum(fs.outcome_moments(y) for y in reversed(parts))
        _, center = fs.center_from_moments(first)
        second = sum(fs.centred_moments(y, center) for y in reversed(parts))
        assert fs.outcome_statistics(first, second) == stats
        assert stats[0] == 30
        assert abs(stats[1] - mean) <= REL * std + math.ulp(mean)
        assert abs(stats[2] - std) <= REL * std
    # a client without data contributes nothing
    empty = torch.empty(0, 1, dtype=torch.float64)
    np.testing.assert_array_equal(fs.outcome_moments(empty), 0.0)
    np.testing.assert_array_equal(fs.centred_moments(empty, 1e9), 0.0)


def test_limbs_are_small_integers():
    for Y in (
        CASES["huge 1e300"](),
        torch.tensor([[MAX], [-MAX], [TINY], [-TINY], [0.0]], dtype=torch.float64),
    ):
        m = fs.outcome_moments(Y)
        assert m.shape == (fs.OUTCOME_MOMENTS_LENGTH,) and m.dtype == np.float64
        assert np.all(m == np.round(m)) and np.abs(m).max() <= 2048
        for center in (0.0, MAX, -MAX, float(Y.mean() / 2)):
            c = fs.centred_moments(Y, center)
            assert c.shape == (fs.CENTRED_MOMENTS_LENGTH,) and c.dtype == np.float64
            assert np.all(c == np.round(c)) and np.abs(c).max() <= 2048


def _client_values(vector: np.ndarray, layout) -> list[int]:
    r"""The integers one client's vector encodes (its limbs decoded)."""
    return fs._decode(vector, layout, "v", "v", max_contributors=1)


def test_every_contributed_sum_is_rounded_to_40_significant_bits():
    # The privacy property: nobody receives a client's exact sums (the differencing
    # attack of docs/security.md needs them). Each value except n is the exact sum
    # rounded to nearest with 40 significant bits.
    g = torch.Generator().manual_seed(3)
    for Y in (
        50 + 40 * torch.randn(7, 1, generator=g, dtype=torch.float64),
        CASES["mixed magnitudes"](),
    ):
        y = Y.reshape(-1).numpy()
        n, s1, s2 = fs._exact_sums(y)
        count, r1 = _client_values(fs.outcome_moments(Y), fs._FIRST_LAYOUT)
        assert count == n == len(y)
        center = 12.345
        r1c, r2c = _client_values(fs.centred_moments(Y, center), fs._SECOND_LAYOUT)
        ci = fs._grid_int(center)
        exact = (s1, s1 - n * ci, s2 - 2 * ci * s1 + n * ci * ci)
        for got, value in zip((r1, r1c, r2c), exact, strict=True):
            odd = abs(got) >> ((abs(got) & -abs(got)).bit_length() - 1)
            assert odd.bit_length() <= 40
            assert got != value  # these data have more than 40 significant bits
            excess = abs(value).bit_length() - 40
            assert abs(got - value) <= 1 << (excess - 1)  # nearest


def test_round_significant():
    r = fs.round_significant
    assert r(0) == 0 and r(5) == 5 and r(-(2**40 - 1)) == -(2**40 - 1)
    assert r(2**41 + 1) == 2**41  # below half
    assert r(2**41 + 3) == 2**41 + 4  # above half
    assert r(2**41 + 2) == 2**41  # tie: to the even quotient (down) ...
    assert r(2**41 + 6) == 2**41 + 8  # ... and (up)
    assert r(-(2**41 + 3)) == -(2**41 + 4)  # symmetric
    assert r(2**80 - 1) == 2**80 and r(2**80 - 1, bits=80) == 2**80 - 1


def test_round_differences_do_not_reveal_the_new_outcomes_exactly():
    # With exact sums, the difference of two consecutive rounds' totals was the exact
    # count, sum and sum of squares of the outcomes added in between (three clients,
    # one new point each), from which integer factoring lists every float64 triple
    # consistent with them. The rounded sums differ from those exact integers.
    g = torch.Generator().manual_seed(4)
    old = [50 + 40 * torch.randn(5, 1, generator=g, dtype=torch.float64) for _ in range(3)]
    new = [
        torch.cat([y, 50 + 40 * torch.randn(1, 1, generator=g, dtype=torch.float64)]) for y in old
    ]
    totals = []
    for data in (old, new):
        first = sum(fs.outcome_moments(y) for y in data)
        n, center = fs.center_from_moments(first)
        second = sum(fs.centred_moments(y, center) for y in data)
        (s1,) = fs._decode(first, fs._FIRST_LAYOUT, "f", "f", None)[1:]
        s1c, s2c = fs._decode(second, fs._SECOND_LAYOUT, "s", "s", None)
        ci = fs._grid_int(center)
        # uncentred totals as the server would reconstruct them
        totals.append((n, s1, s1c + n * ci, s2c + 2 * ci * (s1c + n * ci) - n * ci * ci))
    (n0, a0, b0, q0), (n1, a1, b1, q1) = totals
    added = np.concatenate([y[-1:].reshape(-1).numpy() for y in new])
    k, exact_s1, exact_s2 = fs._exact_sums(added)
    assert n1 - n0 == k == 3  # the count is exact (it is not rounded)
    assert a1 - a0 != exact_s1 and b1 - b0 != exact_s1
    assert q1 - q0 != exact_s2
    # ... but close: the statistics stay accurate
    assert abs((b1 - b0) - exact_s1) << 30 < abs(exact_s1)


@pytest.mark.parametrize(
    "y",
    [
        [MAX / 2, -MAX / 2, TINY],
        [TINY, 0.0],
        [MAX, MAX],
        [-TINY, TINY, 3 * TINY],
        [2.0**-1022, -1.0],
    ],
)
def test_extreme_float64_values(y):
    Y = torch.tensor(y, dtype=torch.float64).unsqueeze(-1)
    n, mean, std = fs.outcome_statistics(*_two_passes(Y, 1))
    assert n == len(y)
    ref_mean, ref_std = statistics.mean(y), statistics.stdev(y)
    assert abs(mean - ref_mean) <= REL * ref_std + math.ulp(ref_mean)
    assert abs(std - ref_std) <= REL * ref_std


def test_std_overflowing_float64_raises():
    Y = torch.tensor([[MAX], [-MAX]], dtype=torch.float64)  # std = sqrt(2) * MAX
    with pytest.raises(ValueError, match="overflows float64"):
        fs.standardize_from_moments(*_two_passes(Y, 2))
    Y = torch.tensor([[1e300], [-1e300]], dtype=torch.float64)
    with pytest.raises(ValueError, match="overflows torch.float32"):
        fs.standardize_from_moments(*_two_passes(Y, 1), dtype=torch.float32)


def test_one_observation_one_client_and_constant_data():
    # one observation: mean = y, std 1 (as BoTorch)
    Y = torch.tensor([[1e8 + 0.5]], dtype=torch.float64)
    first, second = _two_passes(Y, 1)
    tf = fs.standardize_from_moments(first, second)
    assert tf.means.item() == 1e8 + 0.5 and tf.stdvs.item() == 1.0
    n, mean, std = fs.outcome_statistics(first, second)
    assert (n, mean) == (1, 1e8 + 0.5) and math.isnan(std)
    # one client holding everything
    Y = CASES["offset 1e5, spread 1e-3"]()
    _assert_accurate(fs.standardize_from_moments(*_two_passes(Y, 1)), *_reference(Y))
    # constant data (std 0, also where the rounded sums cannot represent it exactly)
    # and spreads below min_stdv: std 1, as BoTorch
    for Y in (
        torch.full((6, 1), 1e12, dtype=torch.float64),
        torch.full((7, 1), 1e12 + 0.3711, dtype=torch.float64),
        torch.full((9, 1), math.pi, dtype=torch.float64),
        3.0 + 1e-10 * _normal(8, 15),
    ):
        first, second = _two_passes(Y, 3)
        tf = fs.standardize_from_moments(first, second)
        ref = Standardize(m=1)
        ref(Y)
        assert tf.stdvs.item() == ref.stdvs.item() == 1.0
        assert tf.means.item() == pytest.approx(_reference(Y)[0], rel=2.0**-52)
        if Y.std() == 0:
            assert fs.outcome_statistics(first, second)[2] == 0.0
    # ... unless min_stdv allows them
    Y = 3.0 + 1e-10 * _normal(8, 15)
    tf = fs.standardize_from_moments(*_two_passes(Y, 1), min_stdv=0)
    _assert_accurate(tf, *_reference(Y))


def test_float32_outcomes():
    Y = (1e4 + 0.01 * _normal(20, 16)).float()
    tf = fs.standardize_from_moments(*_two_passes(Y, 4), min_stdv=0)
    _assert_accurate(tf, *_reference(Y.double()))


# --- secure aggregation ----------------------------------------------------------------
# All cases in one session per (backend, wide, pass): each client sends a cases x L matrix.
SECURE_CASES = [
    "offset 1e8, spread 1",
    "offset 1e5, spread 1e-3",
    "offset 1e12, spread 1",
    "scale 1e12",
    "tiny spread 1e-9 at 1",
    "scale 1e-6",
    "mixed magnitudes",
]


@pytest.mark.parametrize("wide", [True, False])
@pytest.mark.parametrize("backend", ["plaintext", "masking", "ckks"])
def test_accurate_through_secure_aggregators(backend, wide):
    data = [CASES[c]().tensor_split(10) for c in SECURE_CASES]
    aggregate = make_aggregator(backend, wide=wide, seed=0)  # 10 clients

    def per_client(vectors):  # [case][client] -> one cases x L matrix per client
        return [np.stack(v) for v in zip(*vectors, strict=True)]

    first = aggregate(per_client([[fs.outcome_moments(y) for y in parts] for parts in data]))
    centers = [fs.center_from_moments(row)[1] for row in first]
    second = aggregate(
        per_client(
            [
                [fs.centred_moments(y, c) for y in parts]
                for parts, c in zip(data, centers, strict=True)
            ]
        )
    )
    for parts, f, s in zip(data, first, second, strict=True):
        plain = _two_passes(torch.cat(parts))
        if backend != "ckks":
            np.testing.assert_array_equal(f, plain[0])
            np.testing.assert_array_equal(s, plain[1])
        # the decoded statistics equal the plain sum's exactly, whatever the backend
        assert fs.outcome_statistics(f, s, max_contributors=10) == fs.outcome_statistics(*plain)
        for dtype in (torch.float64, torch.float32):
            tf = fs.standardize_from_moments(f, s, dtype=dtype, min_stdv=0.0)
            _assert_accurate(tf, *_reference(torch.cat(parts)), dtype=dtype)


def test_ckks_raw_sum_is_approximate_but_decodes_exactly():
    Y = CASES["offset 1e5, spread 1e-3"]()
    aggregate = make_aggregator("ckks", wide=False, seed=1)
    first, second = _two_passes(Y, 4, aggregate)
    plain = _two_passes(Y, 4)
    for total, exact in zip((first, second), plain, strict=True):
        assert not np.array_equal(total, np.round(total))  # CKKS error is there ...
        np.testing.assert_array_equal(np.round(total), exact)  # ... and small
    _assert_accurate(fs.standardize_from_moments(first, second, min_stdv=0), *_reference(Y))


# --- bad inputs ------------------------------------------------------------------------
def test_moment_vectors_reject_bad_inputs():
    for make in (fs.outcome_moments, lambda Y: fs.centred_moments(Y, 0.0)):
        with pytest.raises(InputDataError, match=r"`train_Y` contains 1 NaN"):
            make(torch.tensor([[1.0], [float("nan")]]))
        with pytest.raises(InputDataError, match="`train_Y` contains 1 NaN or infinite"):
            make(torch.tensor([[1.0], [float("inf")]]))
        for shape in [(4,), (4, 2), (2, 4, 1)]:
            with pytest.raises(BotorchTensorDimensionError, match=r"`train_Y` must be `n x 1`"):
                make(torch.zeros(shape))
        with pytest.raises(TypeError, match="`train_Y` must be a Tensor"):
            make(np.zeros((4, 1)))
        with pytest.raises(InputDataError, match="`train_Y` must be real"):
            make(torch.zeros(4, 1, dtype=torch.complex64))
    for bad in (float("nan"), float("inf"), "middle", None):
        with pytest.raises(ValueError, match="`center` must be a finite number"):
            fs.centred_moments(torch.zeros(4, 1), bad)
    # a 0-d tensor centre is accepted
    np.testing.assert_array_equal(
        fs.centred_moments(torch.ones(4, 1), torch.tensor(0.5)),
        fs.centred_moments(torch.ones(4, 1), 0.5),
    )


def test_standardize_from_moments_rejects_bad_inputs():
    good_first, good_second = _two_passes(_normal(12, 17), 3)
    with pytest.raises(ValueError, match=r"`first_sum` must be the sum of `outcome_moments`"):
        fs.standardize_from_moments(np.array([4.0, 2.0, 3.0]), good_second)  # the old format
    with pytest.raises(ValueError, match=r"`first_sum` must be the sum .*got shape \(552,\)"):
        fs.standardize_from_moments(np.zeros(552), good_second)  # the exact one-pass format
    with pytest.raises(ValueError, match=r"`second_sum` must be the sum of `centred_moments`"):
        fs.standardize_from_moments(good_first, np.stack([good_second, good_second]))
    bad = good_first.copy()
    bad[7] = np.nan
    with pytest.raises(ValueError, match="`first_sum` contains 1 NaN"):
        fs.standardize_from_moments(bad, good_second)
    bad = good_second.copy()
    bad[9] += 0.4
    with pytest.raises(ValueError, match="`second_sum` entries must be sums of integer limbs"):
        fs.standardize_from_moments(good_first, bad)
    with pytest.raises(ValueError, match=r"`first_sum` reports n=0 observations"):
        fs.standardize_from_moments(np.zeros(fs.OUTCOME_MOMENTS_LENGTH), good_second)
    with pytest.raises(ValueError, match=r"`first_sum` reports n=-1 observations"):
        fs.standardize_from_moments(
            good_first - fs.outcome_moments(torch.zeros(13, 1)), good_second
        )
    bad = good_second.copy()
    bad[100] += 1  # sum (y - mu) far too large for sum (y - mu)^2
    with pytest.raises(ValueError, match="`second_sum` is inconsistent"):
        fs.standardize_from_moments(good_first, bad)
    bad = good_second.copy()
    bad[-1] -= 1  # sum of squares negative
    with pytest.raises(ValueError, match="`second_sum` is inconsistent"):
        fs.standardize_from_moments(good_first, bad)
    # limb sums no sum of 3 clients' vectors can have
    for name, first, second in (
        ("first_sum", good_first + np.eye(fs.OUTCOME_MOMENTS_LENGTH)[6] * 2**40, good_second),
        ("second_sum", good_first, good_second + np.eye(fs.CENTRED_MOMENTS_LENGTH)[3] * 7000),
    ):
        with pytest.raises(ValueError, match=rf"`{name}` has a limb sum of .* 3 contributors"):
            fs.standardize_from_moments(first, second, max_contributors=3)
    fs.standardize_from_moments(good_first, good_second, max_contributors=3)  # honest: fine
    with pytest.raises(ValueError, match="`dtype` must be a floating"):
        fs.standardize_from_moments(good_first, good_second, dtype=torch.int64)
    for bad_min in (-1.0, float("nan"), "small"):
        with pytest.raises(ValueError, match="`min_stdv` must be"):
            fs.standardize_from_moments(good_first, good_second, min_stdv=bad_min)
    # Tensor sums are accepted
    tf = fs.standardize_from_moments(torch.as_tensor(good_first), torch.as_tensor(good_second))
    torch.testing.assert_close(tf.means, fs.standardize_from_moments(good_first, good_second).means)


# --- one pass around an agreed centre ------------------------------------------------
def _one_pass(Y: torch.Tensor, center: float, num_clients: int = 10, aggregate=sum):
    return aggregate([fs.moments_around(y, center) for y in Y.tensor_split(num_clients)])


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("case", list(CASES))
def test_one_pass_around_a_near_centre_is_as_accurate_as_two_passes(case, dtype):
    # the centre FBO-FedGP agrees on: the last round's mean, here off by a tenth of a
    # standard deviation (a round adds a few points to tens)
    Y = CASES[case]()
    mean, std = _reference(Y)
    center = mean + 0.1 * std if math.isfinite(mean + 0.1 * std) else mean
    total = _one_pass(Y, center)
    assert total.shape == (fs.MOMENTS_AROUND_LENGTH,)
    assert np.abs(total).max() <= 10 * fs.MAX_LIMB and np.array_equal(total, np.round(total))
    if dtype == torch.float32 and mean > torch.finfo(dtype).max:
        with pytest.raises(ValueError, match="overflows torch.float32"):
            fs.standardize_around(total, center, dtype=dtype)
        return
    tf = fs.standardize_around(total, center, dtype=dtype, min_stdv=0.0)
    _assert_accurate(tf, mean, std, dtype)
    assert fs.outcome_count(total) == len(Y)


def test_one_pass_matches_the_two_passes_at_the_two_passes_centre():
    Y = CASES["branin-like 50 + 40 N"]()
    first, second = _two_passes(Y)
    n, center = fs.center_from_moments(first)
    assert fs.statistics_around(_one_pass(Y, center), center) == fs.outcome_statistics(
        first, second
    )
    assert fs.outcome_count(first) == n == 40


def test_one_pass_far_from_the_mean_loses_the_spread_but_not_the_mean():
    # why the first round takes two passes: around 0, the rounded sum of squares of
    # 1e8 + N(0, 1) says nothing about a spread of 1 (the check refuses it or it is off)
    Y = CASES["offset 1e8, spread 1"]()
    mean, std = _reference(Y)
    total = _one_pass(Y, 0.0)
    try:
        _, got_mean, got_std = fs.statistics_around(total, 0.0)
    except ValueError as exc:
        assert "inconsistent" in str(exc)
    else:
        assert abs(got_std - std) > 0.01 * std
        assert abs(got_mean - mean) <= 2.0**-38 * abs(mean)


def test_one_pass_sums_are_rounded_and_do_not_reveal_new_outcomes_exactly():
    g = torch.Generator().manual_seed(4)
    old = [50 + 40 * torch.randn(5, 1, generator=g, dtype=torch.float64) for _ in range(3)]
    new = [
        torch.cat([y, 50 + 40 * torch.randn(1, 1, generator=g, dtype=torch.float64)]) for y in old
    ]
    center = 49.0
    decoded = [
        fs._decode(
            sum(fs.moments_around(y, center) for y in data), fs._AROUND_LAYOUT, "t", "t", None
        )
        for data in (old, new)
    ]
    added = torch.cat([y[-1:] for y in new])
    k, exact_s1, exact_s2 = fs._centred_sums(added, center)
    (n0, a0, q0), (n1, a1, q1) = decoded
    assert n1 - n0 == k == 3
    assert a1 - a0 != exact_s1 and q1 - q0 != exact_s2
    assert abs((a1 - a0) - exact_s1) << 30 < abs(exact_s1)


def test_one_pass_rejects_bad_inputs():
    Y = _normal(6, 0)
    for center in (math.nan, math.inf, "x", None):
        with pytest.raises(ValueError, match="`center` must be a finite number"):
            fs.moments_around(Y, center)
        with pytest.raises(ValueError, match="`center` must be a finite number"):
            fs.statistics_around(fs.moments_around(Y, 0.0), center)
    with pytest.raises(BotorchTensorDimensionError):
        fs.moments_around(Y.reshape(-1), 0.0)
    total = fs.moments_around(Y, 0.0)
    for bad, match in (
        (total[:-1], "shape"),
        (np.where(np.arange(total.size) == 7, np.nan, total), "NaN"),
        (total + 0.5, "integer"),
        (np.zeros_like(total), "n=0"),
    ):
        with pytest.raises(ValueError, match=match):
            fs.standardize_around(bad, 0.0)
    with pytest.raises(ValueError, match="contributors"):
        fs.statistics_around(total * 0 + 3000, 0.0, max_contributors=1)
    assert fs.outcome_count(np.zeros(fs.MOMENTS_AROUND_LENGTH)) == 0
    assert fs.outcome_count(np.full(3, 1.0)) is None
    assert fs.outcome_count(total + 0.5) is None
