r"""ObservationNoise: the noises of [LDP-BO] Sec. 5.1 (paper 002) and a centred Pareto.

Distributions are checked with Kolmogorov-Smirnov tests against scipy.stats for fixed
seeds (deterministic; each test also shows the KS test rejects a wrong distribution,
so it can fail), means against their Monte Carlo error, and the constants the
algorithms use (``bound``, ``moment``) against scipy's variances and numerical
expectations (``scipy.stats.<dist>.expect``), not against the module's own formulas.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from scipy import stats

from botorch_fed.test_functions import NOISE_KINDS, ObservationNoise

N = 20_000


def _draw(noise: ObservationNoise, n: int = N) -> np.ndarray:
    return noise.sample(torch.Size([n]), like=torch.zeros(1, dtype=torch.float64)).numpy()


def _reference(kind: str, scale: float, df: float = 3.0, shape: float = 3.0):
    r"""The scipy distribution of ``eta``."""
    if kind == "gaussian":
        return stats.norm(scale=scale)
    if kind == "uniform":
        return stats.uniform(loc=-scale, scale=2 * scale)
    if kind == "student-t":
        return stats.t(df, scale=scale)
    mean = shape / (shape - 1)
    return stats.pareto(shape, loc=-scale * mean, scale=scale)  # scale * (P - E P)


CASES = [
    ("gaussian", 0.5, {}),
    ("uniform", 1.0, {}),
    ("uniform", 2.5, {}),
    ("student-t", 1.0, {"df": 3.0}),
    ("student-t", 0.7, {"df": 1.5}),
    ("pareto", 1.0, {"shape": 3.0}),
    ("pareto", 2.0, {"shape": 1.8}),
]


@pytest.mark.parametrize("kind, scale, extra", CASES)
@pytest.mark.parametrize("seed", [0, 11])
def test_kolmogorov_smirnov(kind, scale, extra, seed):
    noise = ObservationNoise(kind, scale, seed=seed, **extra)
    x = _draw(noise)
    ref = _reference(kind, scale, extra.get("df", 3.0), extra.get("shape", 3.0))
    assert stats.kstest(x, ref.cdf).pvalue > 1e-3
    # power: a visibly different distribution is rejected on the same draws
    wrong = _reference(kind, 1.3 * scale, extra.get("df", 3.0), extra.get("shape", 3.0))
    assert stats.kstest(x, wrong.cdf).pvalue < 1e-6


def test_student_t_degrees_of_freedom_matter():
    x = _draw(ObservationNoise("student-t", 1.0, seed=3, df=3.0), 50_000)
    assert stats.kstest(x, stats.t(3.0).cdf).pvalue > 1e-3
    assert stats.kstest(x, stats.norm.cdf).pvalue < 1e-6  # a Gaussian is rejected
    assert stats.kstest(x, stats.t(1.0).cdf).pvalue < 1e-6


@pytest.mark.parametrize(
    "kind, extra",
    [("gaussian", {}), ("uniform", {}), ("student-t", {"df": 3.0}), ("pareto", {"shape": 3.5})],
)
def test_zero_mean(kind, extra):
    n = 200_000
    x = _draw(ObservationNoise(kind, 1.5, seed=5, **extra), n)
    sd = _reference(kind, 1.5, extra.get("df", 3.0), extra.get("shape", 3.0)).std()
    assert abs(x.mean()) < 4 * sd / math.sqrt(n)


def test_uniform_draws_lie_within_the_bound():
    noise = ObservationNoise("uniform", 0.8, seed=1)
    x = _draw(noise)
    assert noise.bound == 0.8 and np.abs(x).max() <= 0.8 and np.abs(x).max() > 0.79


def test_bounds():
    assert ObservationNoise("uniform", 2.0).bound == 2.0
    for kind in NOISE_KINDS:
        assert ObservationNoise(kind, 0.0).bound == 0.0
        if kind != "uniform":
            assert ObservationNoise(kind, 1.0).bound == math.inf
    zero = ObservationNoise("student-t", 0.0, seed=0)
    assert not _draw(zero, 10).any() and zero.moment(2) == 0.0


@pytest.mark.parametrize("kind, scale, extra", CASES)
def test_second_moment_is_scipys_variance(kind, scale, extra):
    noise = ObservationNoise(kind, scale, **extra)
    variance = _reference(kind, scale, extra.get("df", 3.0), extra.get("shape", 3.0)).var()
    if math.isfinite(variance):
        assert math.isclose(noise.moment(2), variance, rel_tol=1e-10)
    else:
        assert noise.moment(2) == math.inf


@pytest.mark.parametrize(
    "kind, scale, extra, p",
    [
        ("gaussian", 0.5, {}, 1.0),
        ("gaussian", 2.0, {}, 3.3),
        ("uniform", 1.0, {}, 1.5),
        ("uniform", 3.0, {}, 4.0),
        ("student-t", 1.0, {"df": 3.0}, 1.5),
        ("student-t", 2.0, {"df": 3.0}, 2.9),
        ("student-t", 0.5, {"df": 5.0}, 1.0),
        ("pareto", 1.0, {"shape": 3.0}, 1.5),
        ("pareto", 2.0, {"shape": 2.5}, 1.2),
        ("pareto", 1.0, {"shape": 4.0}, 3.0),
    ],
)
def test_moments_against_numerical_expectations(kind, scale, extra, p):
    noise = ObservationNoise(kind, scale, **extra)
    ref = _reference(kind, scale, extra.get("df", 3.0), extra.get("shape", 3.0))
    # the kink of |x|^p at 0 and the heavy tails: split the integral at 0
    lo, hi = ref.support()
    left = ref.expect(lambda x: abs(x) ** p, lb=lo, ub=0.0) if lo < 0 else 0.0
    right = ref.expect(lambda x: abs(x) ** p, lb=0.0, ub=hi)
    assert math.isclose(noise.moment(p), left + right, rel_tol=1e-6)


@pytest.mark.parametrize(
    "kind, extra, p",
    [
        ("student-t", {"df": 3.0}, 3.0),
        ("student-t", {"df": 3.0}, 4.0),
        ("student-t", {"df": 1.0}, 1.0),
        ("pareto", {"shape": 3.0}, 3.0),
        ("pareto", {"shape": 1.5}, 2.0),
    ],
)
def test_infinite_moments(kind, extra, p):
    assert ObservationNoise(kind, 1.0, **extra).moment(p) == math.inf


def test_state_round_trip_and_reproducibility():
    like = torch.zeros(1, dtype=torch.float64)
    for kind in NOISE_KINDS:
        noise = ObservationNoise(kind, 1.0, seed=9)
        noise.sample(torch.Size([5]), like)
        state = noise.state_dict()
        a = noise.sample(torch.Size([7]), like)
        noise.load_state_dict(state)
        torch.testing.assert_close(noise.sample(torch.Size([7]), like), a, rtol=0, atol=0)
        other = ObservationNoise(kind, 1.0, seed=9)
        other.load_state_dict(state)
        torch.testing.assert_close(other.sample(torch.Size([7]), like), a, rtol=0, atol=0)
        assert not torch.equal(ObservationNoise(kind, 1.0, seed=10).sample((7,), like), a)
    with pytest.raises(ValueError, match="keys"):
        ObservationNoise("uniform", 1.0, seed=0).load_state_dict({})
    unseeded = ObservationNoise("uniform", 1.0)
    assert unseeded.state_dict() == {} and unseeded.generator is None
    unseeded.load_state_dict({})


def test_global_rng_untouched_and_generator_argument():
    state = torch.get_rng_state()
    a = ObservationNoise("student-t", 1.0, seed=2).sample((4,), torch.zeros(1))
    assert torch.equal(torch.get_rng_state(), state)
    b = ObservationNoise("student-t", 1.0, generator=torch.Generator().manual_seed(2)).sample(
        (4,), torch.zeros(1)
    )
    torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_dtype_and_shape_follow_like():
    like32 = torch.zeros(1, dtype=torch.float32)
    like64 = torch.zeros(1, dtype=torch.float64)
    for kind in NOISE_KINDS:
        a = ObservationNoise(kind, 1.0, seed=3).sample(torch.Size([2, 3]), like32)
        b = ObservationNoise(kind, 1.0, seed=3).sample(torch.Size([2, 3]), like64)
        assert a.shape == (2, 3) and a.dtype == torch.float32 and b.dtype == torch.float64
        torch.testing.assert_close(a, b.float(), rtol=0, atol=0)  # one float64 stream


def test_uniform_stream_is_documented():
    r"""Uniform noise is ``scale * (2 U - 1)`` with U the generator's float64 ``rand``."""
    u = torch.rand(6, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    x = ObservationNoise("uniform", 0.5, seed=4).sample((6,), torch.zeros(1, dtype=torch.float64))
    # exact: 2 U is exact, 2 U - 1 is exact (U is a multiple of 2^-53 in [0, 1)), and so is
    # the product by 0.5 (the sampler forms the same expression)
    torch.testing.assert_close(x, 0.5 * (2 * u - 1), rtol=0, atol=0)


def test_describe_is_json():
    d = ObservationNoise("student-t", 2.0, seed=1, df=3.0).describe()
    assert json.loads(json.dumps(d, allow_nan=False)) == {
        "kind": "student-t",
        "scale": 2.0,
        "df": 3.0,
        "seed": 1,
        "bound": None,
    }
    assert ObservationNoise("uniform", 1.0).describe()["bound"] == 1.0
    assert ObservationNoise("pareto", 1.0, shape=2.5).describe()["shape"] == 2.5
    assert "student-t" in repr(ObservationNoise("student-t", 1.0))


@pytest.mark.parametrize(
    "args, kwargs, match",
    [
        (("laplace", 1.0), {}, "`kind`.*'laplace'"),
        (("Uniform", 1.0), {}, "`kind`"),
        ((None, 1.0), {}, "`kind`"),
        (("uniform", -0.1), {}, "`scale`.*-0.1"),
        (("uniform", math.inf), {}, "`scale`.*inf"),
        (("uniform", math.nan), {}, "`scale`.*nan"),
        (("uniform", "1"), {}, "`scale`"),
        (("uniform", True), {}, "`scale`"),
        (("student-t", 1.0), {"df": 0.0}, "`df`.*0.0"),
        (("student-t", 1.0), {"df": -2}, "`df`.*-2"),
        (("student-t", 1.0), {"df": math.inf}, "`df`"),
        (("pareto", 1.0), {"shape": 1.0}, "`shape`.*1.0"),
        (("pareto", 1.0), {"shape": 0.5}, "`shape`.*0.5"),
        (("uniform", 1.0), {"seed": 1.5}, "`seed`.*1.5"),
        (("uniform", 1.0), {"generator": 3}, "`generator`"),
    ],
)
def test_bad_arguments(args, kwargs, match):
    with pytest.raises(ValueError, match=match):
        ObservationNoise(*args, **kwargs)


def test_both_seed_and_generator_are_refused():
    with pytest.raises(ValueError, match="either"):
        ObservationNoise("uniform", 1.0, seed=1, generator=torch.Generator())


@pytest.mark.parametrize("p", [0, -1.0, math.inf, math.nan, "2"])
def test_bad_moment_order(p):
    with pytest.raises(ValueError, match="`p`"):
        ObservationNoise("gaussian", 1.0).moment(p)


@pytest.mark.parametrize("kind", ["gaussian", "uniform", "student-t", "pareto"])
def test_a_scalar_sample_works_for_every_kind(kind):
    r"""A 0-d draw (scipy's stdtrit returns a numpy scalar there, not an array)."""
    noise = ObservationNoise(kind, 1.0, seed=0)
    draw = noise.sample(torch.Size([]), torch.zeros(()))
    assert draw.shape == () and torch.isfinite(draw)
