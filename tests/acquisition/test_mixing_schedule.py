r"""MixingSchedule against hand computations of p_t = 1 - t^-c and eq. 3."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy.special import zeta
from scipy.stats import binomtest

from botorch_fed.acquisition import MixingSchedule

CS = [0.25, 0.5, 0.75, 1.0]


@pytest.mark.parametrize("c", CS)
def test_power_values_by_hand(c):
    s = MixingSchedule(c=c)
    assert s.is_power_family and s.c == c and not s.per_client
    for t in range(1, 60):
        p = s.prob_local(t)
        assert p == pytest.approx(1.0 - math.pow(t, -c), abs=1e-15)
        assert s.prob_global(t) == pytest.approx(math.pow(t, -c), abs=1e-15)
        assert p + s.prob_global(t) == pytest.approx(1.0, abs=1e-15)
    # first round always global
    assert s.prob_local(1) == 0.0 and s.prob_global(1) == 1.0


def test_known_values_and_default():
    assert MixingSchedule().c == 0.5  # the paper's choice
    assert MixingSchedule(0.5).prob_local(4) == pytest.approx(0.5)
    assert MixingSchedule(0.5).prob_local(100) == pytest.approx(0.9)
    assert MixingSchedule(1.0).prob_local(10) == pytest.approx(0.9)
    assert MixingSchedule(0.25).prob_local(16) == pytest.approx(0.5)
    # numpy integers are rounds too
    assert MixingSchedule(1.0).prob_local(np.int64(4)) == pytest.approx(0.75)


@pytest.mark.parametrize("c", CS)
def test_monotone(c):
    s = MixingSchedule(c=c)
    p = [s.prob_local(t) for t in range(1, 2001)]
    assert all(b > a for a, b in zip(p, p[1:], strict=False))
    assert all(0.0 <= v < 1.0 for v in p)


@pytest.mark.parametrize("c", [0.0, -0.5, 1.0001, 2.0, math.nan, math.inf, True, "0.5"])
def test_bad_c(c):
    with pytest.raises(ValueError, match="`c`"):
        MixingSchedule(c=c)
    with pytest.raises(ValueError, match=r"`c\[1\]`"):
        MixingSchedule(c=[0.5, c])


@pytest.mark.parametrize("t", [0, -1, 1.5, 2.0, "2", True, None])
def test_bad_t(t):
    s = MixingSchedule(0.5)
    for method in (s.prob_local, s.prob_global):
        with pytest.raises(ValueError, match="`t`"):
            method(t)
    with pytest.raises(ValueError, match="`t`"):
        s.sample(t, seed=0)


def test_custom_schedule():
    fn = lambda t: 1.0 - 1.0 / (1.0 + math.log(t))  # noqa: E731
    s = MixingSchedule(prob_fn=fn)
    assert not s.is_power_family and s.c is None
    for t in (1, 2, 7, 5000):  # 5000 is beyond the validated range
        assert s.prob_local(t) == pytest.approx(fn(t), abs=1e-15)
        assert s.prob_global(t) == pytest.approx(1.0 - fn(t), abs=1e-15)
    T = 50
    # the same fsum of the same terms (exact by construction; any tolerance would do)
    assert s.expected_global_steps(T) == pytest.approx(
        math.fsum(1.0 - fn(t) for t in range(1, T + 1)), rel=1e-14
    )
    with pytest.raises(NotImplementedError, match="custom"):
        s.satisfies_eq3()
    # a constant schedule is non-decreasing
    assert MixingSchedule(prob_fn=lambda t: 0.3).prob_local(9) == 0.3


@pytest.mark.parametrize(
    "fn, match",
    [
        (lambda t: 1.0 / t, "monotonically non-decreasing"),  # decreasing
        (lambda t: 0.5 if t != 37 else 0.4, "monotonically non-decreasing"),
        (lambda t: 1.0 - 2.0 / t, r"outside \[0, 1\]"),  # p_1 = -1
        (lambda t: 0.5 + 0.1 * t, r"outside \[0, 1\]"),  # exceeds 1 at t = 6
        (lambda t: math.nan, r"outside \[0, 1\]"),
        (lambda t: "x", "expected a float"),
    ],
)
def test_custom_schedule_rejected(fn, match):
    with pytest.raises(ValueError, match=match):
        MixingSchedule(prob_fn=fn)


def test_custom_schedule_checked_beyond_validated_range():
    s = MixingSchedule(prob_fn=lambda t: 0.5 if t <= 20 else 0.1, validate_up_to=10)
    assert s.prob_local(15) == 0.5
    with pytest.raises(ValueError, match="monotonically non-decreasing"):
        s.prob_local(21)
    s = MixingSchedule(prob_fn=lambda t: 0.5 if t <= 20 else 1.5, validate_up_to=10)
    with pytest.raises(ValueError, match=r"outside \[0, 1\]"):
        s.prob_local(21)


def test_constructor_errors():
    with pytest.raises(ValueError, match="not both"):
        MixingSchedule(c=0.5, prob_fn=lambda t: 0.5)
    with pytest.raises(ValueError, match="`num_clients`"):
        MixingSchedule(c=0.5, num_clients=0)
    with pytest.raises(ValueError, match="`num_clients`"):
        MixingSchedule(c=[0.5, 0.75], num_clients=3)
    with pytest.raises(ValueError, match="`prob_fn`"):
        MixingSchedule(prob_fn=0.5)
    with pytest.raises(ValueError, match="at least one client"):
        MixingSchedule(c=[])
    with pytest.raises(ValueError, match="`validate_up_to`"):
        MixingSchedule(prob_fn=lambda t: 0.5, validate_up_to=1)


def test_per_client_schedules():
    cs = (0.25, 0.5, 1.0)
    s = MixingSchedule(c=cs)
    assert s.per_client and s.num_clients == 3 and s.c == cs
    for i, c in enumerate(cs):
        for t in (1, 2, 9, 30):
            assert s.prob_local(t, client=i) == pytest.approx(1.0 - t**-c, abs=1e-15)
    for bad in (None, 3, -1, True, 1.0):
        with pytest.raises(ValueError, match="`client`"):
            s.prob_local(4, client=bad)
    with pytest.raises(ValueError, match="`client`"):
        s.expected_global_steps(4)
    draws = s.sample(5, seed=0)
    assert draws.dtype == torch.bool and draws.shape == (3,)
    assert isinstance(s.sample(5, seed=0, client=1), bool)
    # custom per-client schedules
    fns = [lambda t: 1.0 - 1.0 / t, lambda t: 0.2]
    s = MixingSchedule(prob_fn=fns)
    assert s.num_clients == 2 and s.prob_local(4, 0) == 0.75 and s.prob_local(4, 1) == 0.2
    # a shared schedule with known num_clients checks the index but ignores it otherwise
    s = MixingSchedule(c=0.5, num_clients=2)
    assert s.prob_local(4, 1) == s.prob_local(4) == 0.5
    with pytest.raises(ValueError, match="`client`"):
        s.prob_local(4, 2)


def test_sample_seeded_no_global_rng():
    s = MixingSchedule(c=0.5, num_clients=64)
    state = torch.random.get_rng_state()
    a, b = s.sample(9, seed=123), s.sample(9, seed=123)
    assert torch.equal(a, b)
    assert not torch.equal(a, s.sample(9, seed=124))
    g1, g2 = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    first = s.sample(9, seed=g1)
    assert torch.equal(first, s.sample(9, seed=g2))
    assert not torch.equal(first, s.sample(9, seed=g1))  # the generator advanced
    n1, n2 = np.random.default_rng(3), np.random.default_rng(3)
    assert torch.equal(s.sample(9, seed=n1), s.sample(9, seed=n2))
    s.sample(9)  # fresh entropy also leaves the global state alone
    assert torch.equal(torch.random.get_rng_state(), state)
    # Alg. 2 lines 14-15: r ~ U(0, 1) from the seed; local iff r < p_t
    r = torch.rand(64, generator=torch.Generator().manual_seed(77), dtype=torch.float64)
    assert torch.equal(s.sample(9, seed=77), r < s.prob_local(9))
    with pytest.raises(ValueError, match="`seed`"):
        s.sample(9, seed=-1)
    with pytest.raises(ValueError, match="`seed`"):
        s.sample(9, seed=1.5)


@pytest.mark.parametrize("c, t", [(0.5, 4), (0.25, 3), (0.75, 20), (1.0, 2)])
def test_sample_frequency_matches_p(c, t):
    s = MixingSchedule(c=c)
    g = torch.Generator().manual_seed(2024)
    n = 4000
    k = sum(s.sample(t, seed=g) for _ in range(n))
    assert binomtest(k, n, s.prob_local(t)).pvalue > 1e-3
    assert not any(s.sample(1, seed=g) for _ in range(200))  # p_1 = 0


def test_per_client_sample_frequency():
    cs = (0.25, 0.5, 1.0)
    s = MixingSchedule(c=cs)
    g = np.random.default_rng(11)
    n, t = 3000, 6
    counts = torch.stack([s.sample(t, seed=g) for _ in range(n)]).sum(0)
    for i in range(3):
        assert binomtest(int(counts[i]), n, s.prob_local(t, i)).pvalue > 1e-3


@pytest.mark.parametrize("c", CS)
def test_expected_global_steps(c):
    s = MixingSchedule(c=c)
    for T in (1, 10, 333):
        # torch's float64 sum of T positive terms (any order) errs by <= (T - 1) eps / 2
        # of the sum; each t^-c (torch's and libm's pow) by <= 1 ulp; fsum rounds once
        rel = (T / 2 + 2) * np.finfo(float).eps
        assert s.expected_global_steps(T) == pytest.approx(
            math.fsum(t**-c for t in range(1, T + 1)), rel=rel
        )
    assert s.expected_global_steps(0) == 0.0
    for bad in (-1, 2.5, True):
        with pytest.raises(ValueError, match="`T`"):
            s.expected_global_steps(bad)


@pytest.mark.parametrize("c, expected", [(0.25, False), (0.5, False), (0.75, True), (1.0, True)])
def test_satisfies_eq3(c, expected):
    s = MixingSchedule(c=c)
    assert s.satisfies_eq3() is expected
    # the first condition (global steps happen infinitely often) holds for all c <= 1
    assert s.eq3_conditions() == (True, expected)


def test_satisfies_eq3_per_client():
    s = MixingSchedule(c=[0.75, 1.0])
    assert s.satisfies_eq3()
    s = MixingSchedule(c=[0.75, 0.5])
    assert not s.satisfies_eq3()
    assert s.satisfies_eq3(client=0) and not s.satisfies_eq3(client=1)


def test_eq3_second_sum_numerically():
    r"""Illustrates the discrepancy: for c = 0.5, sum (1 - p_t)^2 is the harmonic series."""
    T0, T1 = 2000, 20000
    half, three_quarters = MixingSchedule(0.5), MixingSchedule(0.75)
    sq = lambda s, a, b: math.fsum(s.prob_global(t) ** 2 for t in range(a, b + 1))  # noqa: E731
    # c = 0.5: each decade adds ~ln(10) (divergent, sum 1/t)
    assert sq(half, T0 + 1, T1) == pytest.approx(math.log(10.0), abs=1e-3)
    # c = 0.75: partial sums stay below zeta(1.5) = sum t^-1.5 < inf
    assert sq(three_quarters, 1, T1) < zeta(1.5)
    assert zeta(1.5) - sq(three_quarters, 1, T1) < 2.0 / math.sqrt(T1)  # tail bound
