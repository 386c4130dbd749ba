r"""The 2-D synthetic functions f_1, f_2 of the Co-KG slides (paper 001)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy.optimize import minimize

from botorch_fed.test_functions import CoKGRosenbrock, CoKGSinCosBowl
from tests.helpers.tolerances import assert_within, eps


def _f1(x1, x2):
    return x1**2 + x2**2 + np.sin(2 * np.pi * x1) + np.cos(2 * np.pi * x2)


def _f2(x1, x2):
    return (1 - x1) ** 2 + 100 * (x2 - x1**2) ** 2


@pytest.mark.parametrize("dtype", (torch.float32, torch.float64))
def test_values_against_formula(dtype: torch.dtype) -> None:
    pts = np.array([[0.0, 0.0], [0.25, -0.5], [-0.7, 0.3], [1.0, 1.0], [-1.0, 0.9]])
    X = torch.tensor(pts, dtype=dtype)
    x1, x2 = X.double().numpy().T  # the inputs as rounded to ``dtype``
    # Elementwise formulas, each intermediate rounded once (relative eps), sin / cos of
    # a rounded argument 2 pi x (absolute error 2 pi |x| eps): the error is at most a few
    # eps times the magnitude of the terms, which differs from the value where terms
    # cancel (x2 ~ x1^2, sin ~ -x^2).
    scale_f1 = x1**2 + x2**2 + 2 * np.pi * (np.abs(x1) + np.abs(x2)) + 2
    scale_f2 = (1 + np.abs(x1)) ** 2 + 100 * (np.abs(x2) + x1**2) ** 2
    for cls, formula, scale in ((CoKGSinCosBowl, _f1, scale_f1), (CoKGRosenbrock, _f2, scale_f2)):
        fn = cls()
        y = fn(X, noise=False)
        assert y.dtype == dtype and y.shape == torch.Size([5])
        expected = torch.from_numpy(formula(x1, x2))
        assert_within(y, expected, 4 * eps(dtype) * torch.from_numpy(scale))
    # f_1(0, 0) = 0 + 0 + sin 0 + cos 0 = 1 and f_2(1, 1) = 0, by hand
    assert CoKGSinCosBowl()(torch.zeros(2, dtype=torch.float64)).item() == 1.0
    assert CoKGRosenbrock()(torch.ones(2, dtype=torch.float64)).item() == 0.0


def test_sin_cos_bowl_optimum_is_global_minimum() -> None:
    fn = CoKGSinCosBowl()
    opt = fn.optimizers
    assert opt.shape == (2, 2)
    # the documented optimisers attain the documented optimal value ... to the formula's
    # rounding (as in test_values_against_formula), plus the rounding of the literal
    # optimal value (the rounded optimisers change f only to second order: grad f = 0)
    x1, x2 = opt.abs().T
    scale = x1**2 + x2**2 + 2 * math.pi * (x1 + x2) + 2
    expected = torch.full((2,), fn.optimal_value, dtype=torch.float64)
    assert_within(fn(opt), expected, eps(torch.float64) * (4 * scale + abs(fn.optimal_value)))
    # ... it is the minimum over the domain: dense grid + local refinement
    g = np.linspace(-1.0, 1.0, 801)
    grid_min = _f1(g[:, None], g[None, :]).min()
    assert grid_min >= fn.optimal_value - 1e-12
    best = min(
        minimize(lambda x: _f1(*x), x0, method="L-BFGS-B", bounds=[(-1, 1)] * 2).fun
        for x0 in [(-0.3, 0.5), (-0.3, -0.5), (0.7, 0.5), (0.9, -0.9)]
    )
    assert best == pytest.approx(fn.optimal_value, abs=1e-9)
    # stationarity of the 1-D factors at the optimiser
    x1, x2 = opt[1].tolist()
    assert 2 * x1 + 2 * math.pi * math.cos(2 * math.pi * x1) == pytest.approx(0, abs=1e-12)
    assert 2 * x2 - 2 * math.pi * math.sin(2 * math.pi * x2) == pytest.approx(0, abs=1e-12)


def test_rosenbrock_optimum_bounds_negate_and_batch() -> None:
    fn = CoKGRosenbrock(negate=True)
    assert fn.optimal_value == 0.0
    torch.testing.assert_close(fn.optimizers, torch.ones(1, 2, dtype=torch.float64))
    torch.testing.assert_close(
        fn.bounds, torch.tensor([[-2.0, -2.0], [2.0, 2.0]], dtype=torch.float64)
    )
    torch.testing.assert_close(
        CoKGSinCosBowl().bounds, torch.tensor([[-1.0, -1.0], [1.0, 1.0]]).double()
    )
    X = torch.rand(3, 4, 2, dtype=torch.float64) * 4 - 2
    y = fn(X)
    assert y.shape == torch.Size([3, 4])
    torch.testing.assert_close(y, -CoKGRosenbrock()(X))


def test_seeded_noise() -> None:
    X = torch.zeros(6, 2, dtype=torch.float64)
    state = torch.get_rng_state()
    a = CoKGSinCosBowl(noise_std=0.1, seed=5)(X)
    b = CoKGSinCosBowl(noise_std=0.1, seed=5)(X)
    c = CoKGSinCosBowl(noise_std=0.1, seed=6)(X)
    assert torch.equal(torch.get_rng_state(), state)
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert not torch.allclose(a, c)
