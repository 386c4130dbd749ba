r"""The random RKHS function of [LDP-BO] Sec. 5.1 (paper 002), checked independently.

The reference recomputes ``f = sum_i a_i k(., x_i)`` in numpy: ``a_i`` and ``x_i``
from the documented generator calls (``torch.Generator().manual_seed(seed)``: ``p``
float64 uniforms ``u`` -> ``a = 2 u - 1``, then ``p`` grid indices from
``torch.randint``), the SE kernel written out and the Matern kernel from its general
Bessel form ``2^(1-nu) / Gamma(nu) z^nu K_nu(z)``, ``z = sqrt(2 nu) s / l``
(``scipy.special.kv``), not from the closed forms the module uses. The library
minimises, so the function returns ``-f``.
"""

from __future__ import annotations

import math
import pickle

import numpy as np
import pytest
import torch
from botorch.exceptions.errors import BotorchTensorDimensionError
from scipy import special

from botorch_fed.test_functions import (
    LDPSynthetic,
    get_test_function,
    get_test_function_class,
    list_test_functions,
)
from tests.helpers.tolerances import assert_close


def _draws(seed: int, num_points: int = 100, num_centers: int = 100):
    r"""``(a, center indices)`` from the generator calls the module documents."""
    g = torch.Generator().manual_seed(seed)
    a = 2.0 * torch.rand(num_centers, generator=g, dtype=torch.float64) - 1.0
    idx = torch.randint(num_points, (num_centers,), generator=g)
    return a.numpy(), idx.numpy()


def _kernel(s: np.ndarray, kernel: str, ell: float, nu: float) -> np.ndarray:
    if kernel == "se":
        return np.exp(-(s**2) / (2 * ell**2))
    z = np.sqrt(2 * nu) * s / ell
    with np.errstate(invalid="ignore"):
        k = 2 ** (1 - nu) / special.gamma(nu) * z**nu * special.kv(nu, z)
    return np.where(s == 0, 1.0, k)  # the limit z -> 0


def _f(x, seed, kernel="se", ell=0.2, nu=2.5, num_points=100, num_centers=100) -> np.ndarray:
    r"""The paper's ``f`` (to maximise) at points ``x`` of ``[0, 1]``, in numpy."""
    a, idx = _draws(seed, num_points, num_centers)
    centers = np.arange(num_points)[idx] / (num_points - 1)
    s = np.abs(np.asarray(x, dtype=np.float64)[:, None] - centers[None, :])
    return _kernel(s, kernel, ell, nu) @ a


# Rounding of f = sum_i a_i k(s_i) (|a_i| <= 1, 0 < k <= 1) in either computation:
# each kernel entry is within KERNEL_ROUNDING eps of exact (s = |u - c| rounds relative
# to s, which moves k by eps/2 max_r |r k'(r)| <= eps/2; r = s / l; the closed forms'
# few products, sums and exp, or scipy's Bessel K_nu), each product a_i k_i rounds once,
# and the p-term sum errs by p eps sum_i |a_i k_i| in any order: (p + KERNEL_ROUNDING + 1)
# eps sum_i |a_i| <= (p + KERNEL_ROUNDING + 1) eps p on each side.
KERNEL_ROUNDING = 8


def _factor(p: int) -> float:
    r"""The two evaluations' bounds, relative to ``p >= sum_i |a_i|``."""
    return 2 * (p + KERNEL_ROUNDING + 1)


FACTOR = _factor(100)


@pytest.mark.parametrize(
    "kernel, nu", [("se", 2.5), ("matern", 0.5), ("matern", 1.5), ("matern", 2.5)]
)
@pytest.mark.parametrize("seed", [0, 7])
def test_values_against_numpy(kernel, nu, seed):
    fn = LDPSynthetic(kernel=kernel, nu=nu, function_seed=seed)
    grid = np.arange(100) / 99
    rng = np.random.default_rng(seed)
    x = np.concatenate([grid, rng.uniform(0, 1, 50)])  # grid and off-grid points
    X = torch.from_numpy(x).unsqueeze(-1)
    expected = torch.from_numpy(_f(x, seed, kernel, 0.2, nu))
    value = fn(X, noise=False)
    assert value.shape == (150,) and value.dtype == torch.float64
    assert_close(-value, expected, dtype=torch.float64, factor=FACTOR, scale=100.0)
    # not a trivial match: the other kernel gives other values
    other = _f(x, seed, "matern" if kernel == "se" else "se", 0.2, 1.5 if nu != 1.5 else 2.5)
    assert np.abs(other - expected.numpy()).max() > 1e-2


def test_draws_and_grid_follow_the_paper():
    fn = LDPSynthetic(function_seed=3)
    a, idx = _draws(3)
    np.testing.assert_array_equal(fn.coefficients.numpy(), a)
    np.testing.assert_array_equal(fn.center_indices.numpy(), idx)
    assert (np.abs(a) <= 1).all() and a.min() < -0.5 and a.max() > 0.5
    grid = np.arange(100) / 99  # i / (n - 1), correctly rounded
    np.testing.assert_array_equal(fn.candidates.squeeze(-1).numpy(), grid)
    assert fn.candidates.shape == (100, 1) and fn.candidates.dtype == torch.float64
    np.testing.assert_array_equal(fn.centers.squeeze(-1).numpy(), grid[idx])
    assert fn.dim == 1 and fn.bounds.tolist() == [[0.0], [1.0]]
    assert fn.kernel_hint == {"kernel": "se", "lengthscale": 0.2, "nu": 2.5}
    assert fn.noise_std is None


@pytest.mark.parametrize("kernel", ["se", "matern"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_grid_constants(kernel, seed):
    fn = LDPSynthetic(kernel=kernel, function_seed=seed)
    f_grid = _f(np.arange(100) / 99, seed, kernel)
    tol = FACTOR * np.finfo(np.float64).eps * 100  # each constant is f at a grid point
    assert abs(fn.reward_bound - np.abs(f_grid).max()) <= tol  # B = max_D |f|
    assert abs(fn.optimal_value - (-f_grid.max())) <= tol  # minimising -f
    best = int(np.argmax(f_grid))
    assert fn.optimizers.tolist() == [[best / 99]]
    # the function at its optimiser is its optimal value, and no grid point is better
    at_opt = fn(fn.optimizers, noise=False).item()
    assert at_opt == fn.optimal_value
    assert fn(fn.candidates, noise=False).min().item() == fn.optimal_value
    # negate: the paper's f itself
    neg = LDPSynthetic(kernel=kernel, function_seed=seed, negate=True)
    assert neg.optimal_value == -fn.optimal_value
    torch.testing.assert_close(neg(fn.candidates), -fn(fn.candidates), rtol=0, atol=0)


def test_function_seed_picks_the_function():
    X = torch.linspace(0, 1, 37, dtype=torch.float64).unsqueeze(-1)
    a, b, c = (LDPSynthetic(function_seed=s) for s in (5, 5, 6))
    torch.testing.assert_close(a(X), b(X), rtol=0, atol=0)
    assert (a(X) - c(X)).abs().max() > 0.1
    assert a.reward_bound == b.reward_bound != c.reward_bound
    # the noise seed does not change f
    d = LDPSynthetic(function_seed=5, seed=123, noise_std=0.1)
    torch.testing.assert_close(d(X, noise=False), a(X), rtol=0, atol=0)


def test_custom_bounds_and_grid_size_stretch_the_function():
    unit = LDPSynthetic(function_seed=2, num_points=40, num_centers=17, lengthscale=0.1)
    wide = LDPSynthetic(
        function_seed=2, num_points=40, num_centers=17, lengthscale=0.1, bounds=[(-2.0, 3.0)]
    )
    u = (torch.arange(40, dtype=torch.float64) / 39).unsqueeze(-1)
    # lower + width u: a product and a sum on each side, eps/2 each of |lower| + width = 7
    assert_close(wide.candidates, -2.0 + 5.0 * u, dtype=torch.float64, factor=2, scale=7.0)
    # wide maps its candidates back to u' = (x - lower) / width: x carries 2 roundings of
    # 7 eps/2, x - lower one of 5 eps/2, / width one of eps/2, so |u' - u| <= (7 + 5 / 2)
    # eps / 5 + eps / 2 = 2.4 eps, which moves f by at most 2.4 eps max|k'| sum|a_i|
    # (max|k'| = e^(-1/2) / l = 6.1); and both evaluations round (_factor): relative to
    # sum|a_i| <= p = 17
    lipschitz = math.exp(-0.5) / 0.1
    factor = _factor(17) + 2.4 * lipschitz
    assert_close(wide(wide.candidates), unit(u), dtype=torch.float64, factor=factor, scale=17.0)
    assert wide.optimizers.item() == wide.candidates[int(torch.argmin(unit(u)))].item()
    expected = _f(u.squeeze(-1).numpy(), 2, "se", 0.1, 2.5, num_points=40, num_centers=17)
    expected = torch.from_numpy(expected)
    assert_close(-unit(u), expected, dtype=torch.float64, factor=_factor(17), scale=17.0)
    assert unit.kernel_hint["lengthscale"] == 0.1 == wide.kernel_hint["lengthscale"]


def test_float32_inputs_and_pickle():
    fn = LDPSynthetic(function_seed=1)
    X = torch.rand(8, 1, generator=torch.Generator().manual_seed(0))
    y = fn(X)
    assert y.dtype == torch.float32
    torch.testing.assert_close(y, fn(X.double()).float())
    clone = pickle.loads(pickle.dumps(fn))
    torch.testing.assert_close(clone(X.double()), fn(X.double()), rtol=0, atol=0)


def test_seeded_gaussian_noise_is_reproducible():
    X = torch.linspace(0, 1, 11, dtype=torch.float64).unsqueeze(-1)
    state = torch.get_rng_state()
    a = LDPSynthetic(noise_std=0.3, seed=4)
    b = LDPSynthetic(noise_std=0.3, seed=4)
    c = LDPSynthetic(noise_std=0.3, seed=5)
    ya = a(X)
    assert torch.equal(torch.get_rng_state(), state)  # the global RNG is left alone
    torch.testing.assert_close(ya, b(X), rtol=0, atol=0)
    assert not torch.allclose(ya, c(X))
    # the noise is noise_std times the generator's standard normals
    expected_noise = 0.3 * torch.randn(
        11, generator=torch.Generator().manual_seed(4), dtype=torch.float64
    )
    # ya = f + noise (one rounding, eps/2 of |ya|), minus the same f (one more, eps/2 of
    # |noise|); the noise itself is the same product on both sides
    scale = float(ya.abs().max() + expected_noise.abs().max())
    assert_close(ya - a(X, noise=False), expected_noise, dtype=torch.float64, factor=1, scale=scale)


def test_registry():
    names = list_test_functions()
    assert {"ldp-synthetic", "ldp-synthetic-matern"} <= set(names)
    se = get_test_function("ldp-synthetic")
    matern = get_test_function("LDP_Synthetic_Matern", dim=1, function_seed=4)
    assert type(se) is LDPSynthetic and se.kernel_hint["kernel"] == "se"
    assert matern.kernel_hint == {"kernel": "matern", "lengthscale": 0.2, "nu": 2.5}
    assert matern.function_seed == 4 and se.function_seed == 0
    assert get_test_function("ldp-synthetic-se").kernel == "se"
    assert get_test_function_class("ldp-synthetic-matern") is LDPSynthetic
    X = torch.linspace(0, 1, 9, dtype=torch.float64).unsqueeze(-1)
    expected = _f(X.squeeze(-1).numpy(), 4, "matern", 0.2, 2.5)
    assert_close(
        -matern(X), torch.from_numpy(expected), dtype=torch.float64, factor=FACTOR, scale=100.0
    )
    noisy = get_test_function("ldp-synthetic", noise_std=0.1, seed=2)
    assert noisy.noise_std == 0.1 and not torch.equal(noisy(X), noisy(X, noise=False))
    with pytest.raises(ValueError, match="fixed dimension 1; got dim=2"):
        get_test_function("ldp-synthetic", dim=2)
    with pytest.raises(ValueError, match="`kernel`"):
        get_test_function("ldp-synthetic-matern", kernel="se")


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"kernel": "rbf"}, "`kernel`.*'rbf'"),
        ({"kernel": 3}, "`kernel`"),
        ({"lengthscale": 0.0}, "`lengthscale`.*0.0"),
        ({"lengthscale": -1}, "`lengthscale`.*-1"),
        ({"lengthscale": math.inf}, "`lengthscale`"),
        ({"lengthscale": True}, "`lengthscale`"),
        ({"nu": 2.0}, "`nu`.*2.0"),
        ({"nu": "2.5"}, "`nu`"),
        ({"num_points": 1}, "`num_points`.*1"),
        ({"num_points": 10.0}, "`num_points`"),
        ({"num_centers": 0}, "`num_centers`.*0"),
        ({"function_seed": -1}, "`function_seed`.*-1"),
        ({"function_seed": 1.5}, "`function_seed`.*1.5"),
        ({"function_seed": None}, "`function_seed`.*None"),
        ({"bounds": [(1.0, 0.0)]}, "`bounds`"),
        ({"bounds": [(0.0, 1.0), (0.0, 1.0)]}, "`bounds`"),
        ({"bounds": [(0.0, math.inf)]}, "`bounds`"),
        ({"bounds": "x"}, "`bounds`"),
    ],
)
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        LDPSynthetic(**kwargs)


def test_bad_points():
    fn = LDPSynthetic()
    with pytest.raises(BotorchTensorDimensionError):
        fn(torch.rand(3, 2, dtype=torch.float64))
    with pytest.raises(ValueError, match="within the bounds"):
        fn(torch.tensor([[1.5]], dtype=torch.float64))
