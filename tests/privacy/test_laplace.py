r"""LaplaceMechanism (LDP-BO, Zhou & Tan 2020, Curator 1 / Lemma 1 / Sec. 4.5).

The distribution is checked against scipy's Laplace (KS test, moments), the privacy
inequality ``P[M(y) in A] <= e^eps P[M(y') in A]`` on histograms of extreme inputs
(with a variant without clipping that must fail the same check), and the sub-Weibull
radius against hand computations and Monte Carlo draws from numpy.
"""

from __future__ import annotations

import io
import math

import numpy as np
import pytest
import torch
from scipy import stats

from botorch_fed.privacy import LaplaceMechanism, PrivacyLedger, sub_weibull_radius
from botorch_fed.privacy import laplace as laplace_module
from tests.helpers.tolerances import assert_close

# Allowance of every Monte Carlo check, in standard errors.
Z = 5.0


# --------------------------------------------------------------------------- helpers
class _UnclippedLaplace(LaplaceMechanism):
    r"""CTL without clipping: ``y + Laplace(scale)`` for any ``y`` (NOT private)."""

    def _clip(self, y):
        return y, 0


def _privacy_excess(a: np.ndarray, b: np.ndarray, epsilon: float, width: float = 0.5):
    r"""Largest standardised excess of ``P_a(A) - e^eps P_b(A)`` over histogram bins ``A``.

    Only bins where both samples have >= 200 points are used. The standard error is
    the binomial one of the difference, ``sqrt(pa (1 - pa) / na + e^{2 eps} pb (1 - pb)
    / nb)``.

    Returns:
        ``(max z, number of bins used)``.
    """
    lo = math.floor(min(a.min(), b.min()))
    hi = math.ceil(max(a.max(), b.max())) + width
    edges = np.arange(lo, hi + width, width)
    ca, _ = np.histogram(a, edges)
    cb, _ = np.histogram(b, edges)
    keep = (ca >= 200) & (cb >= 200)
    pa, pb = ca / a.size, cb / b.size
    e = math.exp(epsilon)
    se = np.sqrt(pa * (1 - pa) / a.size + e**2 * pb * (1 - pb) / b.size)
    z = (pa - e * pb)[keep] / se[keep]
    return float(z.max()), int(keep.sum())


def _draws(mech: LaplaceMechanism, value: float, n: int) -> np.ndarray:
    return mech(torch.full((n,), value, dtype=torch.float64)).numpy()


# --------------------------------------------------------------------------- distribution
@pytest.mark.parametrize(("epsilon", "B", "R"), [(1.0, 1.0, 0.5), (0.3, 2.0, 1.0)])
def test_noise_is_laplace(epsilon, B, R):
    n = 20_000
    mech = LaplaceMechanism(epsilon, B, R, seed=1234)
    scale = 2.0 * (B + R) / epsilon
    assert mech.scale == pytest.approx(scale, rel=1e-15)
    assert mech.bound == B + R
    # inputs inside the bound: nothing is clipped, M(y) - y is the noise
    y = 0.9 * torch.linspace(-(B + R), B + R, n)
    noise = (mech(y) - y.double()).numpy()
    assert stats.kstest(noise, stats.laplace(scale=scale).cdf).pvalue > 1e-3
    var = 2.0 * scale**2
    assert abs(noise.mean()) <= Z * math.sqrt(var / n)
    # Var of the sample variance of Laplace: (mu4 - sigma^4) / n = (24 - 4) scale^4 / n
    assert abs(noise.var(ddof=1) - var) <= Z * math.sqrt(20.0 / n) * scale**2


def test_ks_detects_a_wrong_scale():
    # the KS check above is not vacuous: the same draws fail against a 20% wrong scale
    mech = LaplaceMechanism(1.0, 1.0, 0.5, seed=1234)
    noise = mech(torch.zeros(20_000)).numpy()
    assert stats.kstest(noise, stats.laplace(scale=1.2 * 3.0).cdf).pvalue < 1e-6


# --------------------------------------------------------------------------- privacy
@pytest.mark.parametrize(("epsilon", "B", "R"), [(1.0, 1.0, 0.5), (0.5, 0.5, 0.5)])
def test_privacy_inequality_on_histograms(epsilon, B, R):
    n = 200_000
    bound = B + R

    def mech(seed):
        return LaplaceMechanism(epsilon, B, R, seed=seed)

    hi = _draws(mech(11), bound, n)
    lo = _draws(mech(12), -bound, n)
    far = _draws(mech(13), 10 * bound, n)  # clipped to bound
    for a, b in [(hi, lo), (lo, hi), (far, lo), (lo, far)]:
        z, bins = _privacy_excess(a, b, epsilon)
        assert bins >= 20
        assert z <= Z
    # the inequality is tight in the tails (the density ratio is exactly e^eps there),
    # so the check is sensitive: the smaller allowance e^(0.7 eps) fails it
    z, _ = _privacy_excess(hi, lo, 0.7 * epsilon)
    assert z > Z


def test_without_clipping_the_inequality_fails():
    epsilon, B, R, n = 1.0, 1.0, 0.5, 200_000
    bound = B + R
    far = _draws(_UnclippedLaplace(epsilon, B, R, seed=13), 10 * bound, n)
    lo = _draws(_UnclippedLaplace(epsilon, B, R, seed=12), -bound, n)
    z, bins = _privacy_excess(far, lo, epsilon)
    assert bins >= 10
    assert z > 4 * Z  # the density ratio reaches e^(16.5 / 3) = e^5.5 >> e^1
    # while the real mechanism, fed the same input, passes
    far_clipped = _draws(LaplaceMechanism(epsilon, B, R, seed=13), 10 * bound, n)
    assert _privacy_excess(far_clipped, lo, epsilon)[0] <= Z


# --------------------------------------------------------------------------- randomness
def test_seed_reproducible_and_distinct():
    y = torch.randn(50, generator=torch.Generator().manual_seed(0))
    a = LaplaceMechanism(1.0, 1.0, 0.5, seed=3)(y)
    b = LaplaceMechanism(1.0, 1.0, 0.5, seed=3)(y)
    c = LaplaceMechanism(1.0, 1.0, 0.5, seed=4)(y)
    assert torch.equal(a, b)
    assert not torch.equal(a, c)
    # a caller's generator is used (reproducibly) and advanced
    g = torch.Generator().manual_seed(3)
    before = g.get_state()
    d = LaplaceMechanism(1.0, 1.0, 0.5, generator=g)(y)
    e = LaplaceMechanism(1.0, 1.0, 0.5, generator=torch.Generator().manual_seed(3))(y)
    assert torch.equal(d, e)
    assert not torch.equal(before, g.get_state())
    # seeds that agree in their low 32 bits give different streams (a torch generator
    # would not: its Mersenne Twister keeps 32 bits of the seed)
    f = LaplaceMechanism(1.0, 1.0, 0.5, seed=3 + 2**32)(y)
    assert not torch.equal(a, f)


def test_unseeded_uses_os_entropy_and_leaves_global_rng_alone():
    y = torch.zeros(20)
    state = torch.get_rng_state()
    a = LaplaceMechanism(1.0, 1.0, 0.5)(y)
    b = LaplaceMechanism(1.0, 1.0, 0.5)(y)
    assert torch.equal(state, torch.get_rng_state())
    assert not torch.equal(a, b)
    # seeded: the global RNG is not consumed either
    LaplaceMechanism(1.0, 1.0, 0.5, seed=0)(y)
    assert torch.equal(state, torch.get_rng_state())


def test_successive_calls_continue_the_stream():
    y = torch.zeros(10)
    m = LaplaceMechanism(1.0, 1.0, 0.5, seed=7)
    parts = torch.cat([m(y[:4]), m(y[4:])])
    whole = LaplaceMechanism(1.0, 1.0, 0.5, seed=7)(y)
    assert torch.equal(parts, whole)


def test_state_dict_round_trip_continues_the_stream():
    y = torch.linspace(-1, 1, 8)
    m = LaplaceMechanism(0.5, 1.0, 0.25, seed=21)
    m(y)
    buf = io.BytesIO()
    torch.save(m.state_dict(), buf)
    expected = m(y)
    other = LaplaceMechanism(0.5, 1.0, 0.25, seed=999)
    buf.seek(0)
    other.load_state_dict(torch.load(buf))
    assert torch.equal(other(y), expected)
    # the saved state is a copy: drawing more afterwards does not change it
    sd = m.state_dict()
    nxt = m(y)
    m(y)
    replay = LaplaceMechanism(0.5, 1.0, 0.25)  # unseeded: OS entropy, then overwritten
    replay.load_state_dict(sd)
    assert torch.equal(replay(y), nxt)


def test_load_state_dict_rejects_bad_states():
    m = LaplaceMechanism(0.5, 1.0, 0.25, seed=0)
    sd = m.state_dict()
    with pytest.raises(TypeError, match="state"):
        m.load_state_dict([1, 2])
    with pytest.raises(ValueError, match="generator_state"):
        m.load_state_dict({k: v for k, v in sd.items() if k != "generator_state"})
    with pytest.raises(ValueError, match="epsilon"):
        LaplaceMechanism(0.6, 1.0, 0.25).load_state_dict(sd)
    with pytest.raises(ValueError, match="R"):
        LaplaceMechanism(0.5, 1.0, 0.5).load_state_dict(sd)
    with pytest.raises(TypeError, match="generator_state"):
        m.load_state_dict({**sd, "generator_state": sd["generator_state"].float()})
    with pytest.raises(ValueError, match="generator_state"):
        m.load_state_dict({**sd, "generator_state": sd["generator_state"][:10]})


def test_redraws_the_open_endpoint(monkeypatch):
    # torch.rand in [0, 1) can return exactly 0, i.e. u = -1/2 and log1p(-1) = -inf:
    # such draws must be redrawn, never returned as an infinite noise value
    calls = []
    real_rand = torch.rand

    def fake_rand(n, *args, **kwargs):
        calls.append(n)
        if len(calls) == 1:
            out = real_rand(n, *args, **kwargs)
            out[::2] = 0.0
            return out
        return torch.full((n,), 0.75, dtype=torch.float64)

    monkeypatch.setattr(laplace_module.torch, "rand", fake_rand)
    noise = laplace_module._laplace_noise((5,), 2.0, torch.Generator().manual_seed(0))
    assert calls == [5, 3]
    assert torch.isfinite(noise).all()
    # u = 0.25 -> L = -2 * log1p(-0.5) = 2 ln 2
    torch.testing.assert_close(noise[::2], torch.full((3,), 2 * math.log(2.0), dtype=torch.float64))


# --------------------------------------------------------------------------- shapes, dtypes
@pytest.mark.parametrize("shape", [(), (7,), (7, 1), (3, 4, 2)])
def test_shapes_and_float64_output(shape):
    y = torch.zeros(shape, dtype=torch.float32)
    out = LaplaceMechanism(1.0, 1.0, 0.5, seed=0)(y)
    assert out.shape == y.shape
    assert out.dtype == torch.float64
    assert out.device == y.device
    # the noise stream does not depend on the shape
    flat = LaplaceMechanism(1.0, 1.0, 0.5, seed=0)(torch.zeros(max(1, y.numel())))
    assert torch.equal(out.reshape(-1), flat[: y.numel()])


def test_dtype_does_not_change_the_noise():
    y64 = torch.tensor([0.1, -0.3, 1.0], dtype=torch.float64)
    out32 = LaplaceMechanism(1.0, 1.0, 0.5, seed=5)(y64.float())
    out64 = LaplaceMechanism(1.0, 1.0, 0.5, seed=5)(y64)
    # each side recovers the noise L as (y + L) - y: two roundings, u |y + L| and u |L|,
    # so the two sides agree to 2 eps times the larger of |out| and |L|
    scale = max(out32.abs().max().item(), out64.abs().max().item(), 1.0)
    noise32, noise64 = out32 - y64.float().double(), out64 - y64
    scale = max(scale, noise64.abs().max().item())
    assert_close(noise32, noise64, dtype=torch.float64, factor=2, scale=scale)
    ints = LaplaceMechanism(1.0, 1.0, 0.5, seed=5)(torch.tensor([0, 1, -1]))
    assert ints.dtype == torch.float64


def test_output_is_detached():
    y = torch.zeros(3, requires_grad=True)
    out = LaplaceMechanism(1.0, 1.0, 0.5, seed=0)(y)
    assert not out.requires_grad


def test_empty_input_releases_nothing():
    ledger = PrivacyLedger()
    out = LaplaceMechanism(1.0, 1.0, 0.5, seed=0, ledger=ledger, user=1)(torch.zeros(0, 2))
    assert out.shape == (0, 2) and out.dtype == torch.float64
    assert ledger.releases(1) == 0 and ledger.users == []


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_input_same_stream_as_cpu():
    y = torch.linspace(-1, 1, 100)
    cpu = LaplaceMechanism(1.0, 1.0, 0.5, seed=2)(y)
    gpu = LaplaceMechanism(1.0, 1.0, 0.5, seed=2)(y.cuda())
    assert gpu.device.type == "cuda" and gpu.dtype == torch.float64
    torch.testing.assert_close(gpu.cpu(), cpu, rtol=0, atol=0)


# --------------------------------------------------------------------------- clipping
def test_clipping_with_huge_epsilon():
    ledger = PrivacyLedger()
    mech = LaplaceMechanism(1e9, 1.0, 0.5, seed=0, ledger=ledger, user="u")
    y = torch.tensor([-100.0, -1.5, 0.3, 1.5, 2.0, 1e300], dtype=torch.float64)
    out = mech(y)
    expected = torch.tensor([-1.5, -1.5, 0.3, 1.5, 1.5, 1.5], dtype=torch.float64)
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-6)
    assert ledger.clipped("u") == 3  # |y| > 1.5; the bound itself is not clipped
    assert ledger.releases("u") == 6
    mech(torch.tensor([[5.0], [-5.0]]))
    assert ledger.clipped("u") == 5


def test_zero_bound_outputs_zero():
    mech = LaplaceMechanism(1.0, 0.0, 0.0, seed=0)
    assert mech.scale == 0.0 and mech.bound == 0.0
    out = mech(torch.tensor([3.0, -2.0, 0.0]))
    assert torch.equal(out.abs(), torch.zeros(3, dtype=torch.float64))


# --------------------------------------------------------------------------- ledger hookup
def test_ledger_records_every_call():
    ledger = PrivacyLedger()
    mech = LaplaceMechanism(0.5, 1.0, 0.5, seed=0, ledger=ledger, user=4)
    for _ in range(3):
        mech(torch.tensor(0.0))
    mech(torch.zeros(5, 1))
    assert ledger.releases(4) == 8
    assert ledger.spent(4) == pytest.approx((8 * 0.5, 0.0), rel=1e-15)
    assert ledger.clipped(4) == 0


def test_failed_call_records_nothing():
    ledger = PrivacyLedger()
    mech = LaplaceMechanism(0.5, 1.0, 0.5, seed=0, ledger=ledger, user=4)
    with pytest.raises(ValueError, match=r"\by\b"):
        mech(torch.tensor([0.0, float("nan")]))
    with pytest.raises(ValueError, match=r"\by\b"):
        mech(torch.tensor([float("inf")]))
    with pytest.raises(ValueError, match=r"\by\b"):
        mech(torch.tensor([float("-inf")], dtype=torch.float16))
    assert ledger.users == []


# --------------------------------------------------------------------------- sub-Weibull
def test_sub_weibull_radius_hand_computed():
    # sub-Gaussian defaults a=2, b=1, theta=1/2: R = sqrt(ln(2 * 100 / 0.1))
    assert sub_weibull_radius(0.1, 100, 0.5) == pytest.approx(math.sqrt(math.log(2000.0)))
    # theta=2, a=3, b=1/2, T=7, delta=0.2: R = (2 ln(105))^2
    assert sub_weibull_radius(0.2, 7, 2.0, a=3.0, b=0.5) == pytest.approx(
        (2.0 * math.log(105.0)) ** 2
    )
    # a T / delta = 0.02 < 1: the log is negative and R = 0
    assert sub_weibull_radius(0.5, 10, 1.0, a=0.001) == 0.0
    mech = LaplaceMechanism.sub_weibull(0.5, 2.0, 0.1, 100, 0.5, seed=0)
    assert mech.R == pytest.approx(math.sqrt(math.log(2000.0)))
    assert mech.B == 2.0 and mech.delta == 0.1 and mech.epsilon == 0.5 and mech.horizon == 100
    assert mech.scale == pytest.approx(2 * (2.0 + math.sqrt(math.log(2000.0))) / 0.5)


def test_sub_weibull_delta_reaches_the_ledger():
    ledger = PrivacyLedger()
    mech = LaplaceMechanism.sub_weibull(1.0, 1.0, 0.01, 50, 1.0, a=1.0, ledger=ledger, user="x")
    mech(torch.zeros(4))
    assert ledger.spent("x") == pytest.approx((4.0, 0.04))


@pytest.mark.parametrize(
    ("sampler", "theta", "a", "b"),
    [
        # Laplace(1): P(|X| >= x) = exp(-x), sub-exponential with a = b = 1
        (lambda rng, size: rng.laplace(0.0, 1.0, size), 1.0, 1.0, 1.0),
        # N(0, 1): P(|X| >= x) <= 2 exp(-x^2 / 2), sub-Gaussian with a = 2, b = 1/2
        (lambda rng, size: rng.standard_normal(size), 0.5, 2.0, 0.5),
    ],
)
def test_sub_weibull_union_bound_holds_empirically(sampler, theta, a, b):
    horizon, delta, n_seq = 10, 0.5, 20_000
    mech = LaplaceMechanism.sub_weibull(1.0, 1.0, delta, horizon, theta, a=a, b=b, seed=0)
    eta = sampler(np.random.default_rng(2024), (n_seq, horizon))
    frac = np.mean(np.any(np.abs(eta) > mech.R, axis=1))
    se = math.sqrt(delta * (1 - delta) / n_seq)
    assert frac <= delta
    if theta == 1.0:
        # the tail bound is exact for Laplace(1): P(any) = 1 - (1 - delta / T)^T
        exact = 1.0 - (1.0 - delta / horizon) ** horizon
        assert abs(frac - exact) <= Z * se
    # teeth: half that radius is exceeded far more often than delta
    assert np.mean(np.any(np.abs(eta) > mech.R / 2, axis=1)) > delta + Z * se


# --------------------------------------------------------------------------- bad inputs
@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"epsilon": 0.0}, "epsilon"),
        ({"epsilon": -1.0}, "epsilon"),
        ({"epsilon": math.inf}, "epsilon"),
        ({"epsilon": math.nan}, "epsilon"),
        ({"B": -0.1}, "B"),
        ({"B": math.inf}, "B"),
        ({"B": math.nan}, "B"),
        ({"R": -1e-9}, "R"),
        ({"R": math.nan}, "R"),
        ({"delta": -0.1}, "delta"),
        ({"delta": 1.0}, "delta"),
        ({"delta": math.nan}, "delta"),
        ({"seed": 0, "generator": torch.Generator()}, "seed"),
        ({"epsilon": 1e-300, "B": 1e10}, "scale"),
    ],
)
def test_bad_arguments_raise_value_error(kwargs, name):
    args = {"epsilon": 1.0, "B": 1.0, "R": 0.5, **kwargs}
    with pytest.raises(ValueError, match=rf"\b{name}\b"):
        LaplaceMechanism(**args)


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"epsilon": "1"}, "epsilon"),
        ({"epsilon": True}, "epsilon"),
        ({"B": None}, "B"),
        ({"R": torch.ones(2)}, "R"),
        ({"generator": 3}, "generator"),
        ({"ledger": object()}, "ledger"),
        ({"user": 1.5}, "user"),
    ],
)
def test_bad_types_raise_type_error(kwargs, name):
    args = {"epsilon": 1.0, "B": 1.0, "R": 0.5, **kwargs}
    with pytest.raises(TypeError, match=rf"\b{name}\b"):
        LaplaceMechanism(**args)


def test_bad_y_types():
    mech = LaplaceMechanism(1.0, 1.0, 0.5, seed=0)
    for bad in ([0.1, 0.2], 0.3, torch.tensor([True]), torch.tensor([1 + 1j])):
        with pytest.raises(TypeError, match=r"\by\b"):
            mech(bad)


def test_numeric_scalars_accepted():
    mech = LaplaceMechanism(np.float32(0.5), 1, torch.tensor(0.5), seed=np.int64(3))
    assert (mech.epsilon, mech.B, mech.R) == (0.5, 1.0, 0.5)
    assert all(isinstance(v, float) for v in (mech.epsilon, mech.B, mech.R, mech.delta))


@pytest.mark.parametrize(
    ("kwargs", "exc", "name"),
    [
        ({"delta": 0.0}, ValueError, "delta"),
        ({"delta": 1.0}, ValueError, "delta"),
        ({"horizon": 0}, ValueError, "horizon"),
        ({"horizon": 2.5}, TypeError, "horizon"),
        ({"theta": 0.0}, ValueError, "theta"),
        ({"theta": math.inf}, ValueError, "theta"),
        ({"a": -1.0}, ValueError, "a"),
        ({"b": 0.0}, ValueError, "b"),
        ({"epsilon": math.nan}, ValueError, "epsilon"),
        ({"theta": 400.0, "horizon": 10**9}, ValueError, "overflows"),
    ],
)
def test_sub_weibull_bad_arguments(kwargs, exc, name):
    args = {"epsilon": 1.0, "B": 1.0, "delta": 0.1, "horizon": 10, "theta": 0.5, **kwargs}
    with pytest.raises(exc, match=rf"\b{name}\b"):
        LaplaceMechanism.sub_weibull(**args)
