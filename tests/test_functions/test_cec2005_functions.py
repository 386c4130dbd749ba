r"""CEC-2005 F1-F20 against the report's definitions and independent numpy code."""

from __future__ import annotations

import math
import pickle

import numpy as np
import pytest
import torch
from botorch.exceptions.errors import BotorchTensorDimensionError
from botorch.test_functions.synthetic import SyntheticTestFunction
from torch import Tensor

from botorch_fed.test_functions import (
    CEC2005_FUNCTIONS,
    CEC2005F2,
    CEC2005F4,
    CEC2005F7,
    CEC2005F17,
    load_cec2005_data,
)
from tests.helpers import cec_numpy_reference as ref
from tests.helpers.tolerances import assert_close, assert_within, eps, tol

pytestmark = pytest.mark.skipif(
    not ref.HAS_OPFUNU, reason="needs the optional extra botorch-fed[cec]"
)
DTYPES = (torch.float32, torch.float64)


def _needs_2d_matrices(n: int, dim: int) -> None:
    if dim == 2 and n in ref.ROTATED and not ref.HAS_OPTPROBLEMS:
        pytest.skip("2-D matrices need optproblems (botorch-fed[cec])")


# Rounding-error bounds, in units of eps(dtype). Each basic function is a short chain
# of elementwise operations and D-term sums, each rounded once (relative eps), so the
# error of a value is a few eps times the magnitude of the terms it is made of:
#   - at the optimum the shifted input is exactly 0 (x and the stored optimum round the
#     same way) and only constants that cancel there are left: Rastrigin's
#     -10 cos(0) + 10 per coordinate, Ackley's -20 e^0 - e + 20 + e, ... ;
#   - elsewhere the inputs are rounded (relative eps) and each shift x - o is rounded
#     relative to max(|x|, |o|) <= max|bounds|, which moves the value by at most
#     sum_j (|x_j| + max|bounds|) |df/dx_j| to first order (this also covers the
#     rounded arguments of sin / cos, which are linear in x - o), and the D-term sums
#     of non-negative terms add D (|f - bias| + |bias|).
_FACTOR = 8  # roundings per term, with slack
_CANCELLING = {  # magnitude of the terms that cancel at z = 0, per basic function
    "sphere": lambda d: 0.0,
    "rastrigin": lambda d: 20.0 * d,
    "weierstrass": lambda d: 4.0 * d,  # 2 d sum_k 0.5^k
    "griewank": lambda d: 2.0,
    "ackley": lambda d: 2.0 * (20.0 + math.e),
}
_BASIC_OF = {7: "griewank", 8: "ackley", 9: "rastrigin", 10: "rastrigin", 11: "weierstrass"}


def _optimum_scale(fn, n: int, dim: int) -> float:
    r"""Magnitude of the terms of ``F_n(o)``: the bias and what cancels at ``z = 0``."""
    bias = abs(ref.BIASES[n])
    if hasattr(fn, "components"):  # composition: the nearest component has weight 1
        first = _CANCELLING[fn.components[0]](dim)
        return bias + fn.C * first / float(fn.f_max[0]) + float(fn.component_bias[0])
    if n == 13:  # Griewank of Rosenbrock: r^2 / 4000 - cos(r) + 1 per coordinate
        return bias + 2.0 * dim
    if n == 14:  # expanded Scaffer F6: 0.5 + (sin^2 - 0.5) / (...)^2 per coordinate
        return bias + 1.0 * dim
    return bias + (_CANCELLING[_BASIC_OF[n]](dim) if n in _BASIC_OF else 0.0)


def _value_bound(fn, X: Tensor, dtype: torch.dtype) -> Tensor:
    r"""Elementwise rounding bound of ``fn.evaluate_true`` in ``dtype`` at ``X``."""
    X = X.detach().to(torch.float64).requires_grad_(True)
    f = fn.evaluate_true(X)
    (grad,) = torch.autograd.grad(f.sum(), X)
    bias = abs(fn.optimal_value)
    sens = ((X.detach().abs() + fn.bounds.abs().max()) * grad.abs()).sum(-1)
    size = fn.dim * ((f.detach() - fn.optimal_value).abs() + bias)
    return _FACTOR * eps(dtype) * (sens + size)


# --------------------------------------------------------------------------------
# f(o) = bias
# --------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=["float32", "float64"])
@pytest.mark.parametrize("dim", (2, 10))
@pytest.mark.parametrize("n", range(1, 21))
def test_value_at_optimum_is_bias(n: int, dim: int, dtype: torch.dtype) -> None:
    _needs_2d_matrices(n, dim)
    fn = CEC2005_FUNCTIONS[n](dim=dim)
    assert isinstance(fn, SyntheticTestFunction)
    o = ref.optimum(n, dim)
    bias = ref.BIASES[n]
    assert fn.optimal_value == bias
    # the registered optimiser is the report's o, and it lies within the bounds
    np.testing.assert_array_equal(fn.optimizers.numpy(), o[None, :])
    assert bool(((fn.bounds[0] <= fn.optimizers) & (fn.optimizers <= fn.bounds[1])).all())
    x = torch.tensor(o, dtype=dtype)
    scale = _optimum_scale(fn, n, dim)
    for value in (fn.evaluate_true(x), fn(x, noise=False)):
        assert value.dtype == dtype and value.shape == torch.Size([])
        expected = torch.tensor(bias, dtype=torch.float64)
        assert_close(value, expected, dtype=dtype, factor=_FACTOR, scale=scale)
    # o is a minimiser: random perturbations are not better
    gen = torch.Generator().manual_seed(n)
    lb, ub = fn.bounds.to(dtype)
    near = (x + 0.01 * (ub - lb) * torch.randn(64, dim, generator=gen, dtype=dtype)).clamp(lb, ub)
    assert bool((fn.evaluate_true(near) >= bias - tol(dtype, _FACTOR) * scale).all())


def test_negate_and_optimal_value() -> None:
    fn = CEC2005_FUNCTIONS[9](dim=10)
    neg = CEC2005_FUNCTIONS[9](dim=10, negate=True)
    x = torch.rand(5, 10, dtype=torch.float64) * 10 - 5
    torch.testing.assert_close(neg(x), -fn(x))
    assert neg.optimal_value == 330.0 and fn.optimal_value == -330.0
    assert fn.is_minimization_problem and not neg.is_minimization_problem


# --------------------------------------------------------------------------------
# values at random points, computed independently with numpy from the data files
# --------------------------------------------------------------------------------


def _points(fn, n_points: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    lb, ub = fn.bounds.numpy()
    return lb + (ub - lb) * rng.random((n_points, fn.dim))


def _numpy_value(n: int, x: np.ndarray) -> float:
    d = len(x)
    bias = ref.BIASES[n]
    if n == 1:
        return float(np.sum((x - ref.optimum(1, d)) ** 2)) + bias
    if n == 2:
        z = x - ref.optimum(2, d)
        outer = sum(sum(z[j] for j in range(i + 1)) ** 2 for i in range(d))  # i = 1..D
        return outer + bias
    if n == 3:
        z = (x - ref.optimum(3, d)) @ ref.matrix("elliptic", d)
        return sum((1e6) ** (i / (d - 1)) * z[i] ** 2 for i in range(d)) + bias
    if n == 5:
        A = ref.load("data_schwefel_206.txt")[1:, :][:d, :d]
        B = A @ ref.optimum(5, d)
        return float(np.max(np.abs(A @ x - B))) + bias
    if n == 6:
        z = x - ref.optimum(6, d) + 1
        return sum(100 * (z[i] ** 2 - z[i + 1]) ** 2 + (z[i] - 1) ** 2 for i in range(d - 1)) + bias
    if n == 8:
        return ref.ackley((x - ref.optimum(8, d)) @ ref.matrix("ackley", d)) + bias
    if n == 9:
        return ref.rastrigin(x - ref.optimum(9, d)) + bias
    if n == 11:
        z = (x - ref.optimum(11, d)) @ ref.matrix("weierstrass", d)
        return ref.weierstrass(z) + bias
    if n == 12:
        data = ref.load("data_schwefel_213.txt")
        a, b, alpha = data[:100][:d, :d], data[100:200][:d, :d], data[200, :d]
        A = a @ np.sin(alpha) + b @ np.cos(alpha)
        B = a @ np.sin(x) + b @ np.cos(x)
        return float(np.sum((A - B) ** 2)) + bias
    if n == 13:
        z = x - ref.optimum(13, d) + 1
        total = 0.0
        for i in range(d):
            u, v = z[i], z[(i + 1) % d]
            r = 100 * (u**2 - v) ** 2 + (u - 1) ** 2
            total += r**2 / 4000 - np.cos(r) + 1
        return total + bias
    if n == 14:
        z = (x - ref.optimum(14, d)) @ ref.matrix("E_ScafferF6", d)
        total = 0.0
        for i in range(d):
            s = z[i] ** 2 + z[(i + 1) % d] ** 2
            total += 0.5 + (np.sin(np.sqrt(s)) ** 2 - 0.5) / (1 + 0.001 * s) ** 2
        return total + bias
    optima, matrices, sigmas, lambdas, funcs = ref.composition_spec(n, d)
    return ref.composition(x, optima, matrices, sigmas, lambdas, funcs, bias)


@pytest.mark.parametrize("n", (1, 2, 3, 5, 6, 8, 9, 11, 12, 13, 14, 15, 16, 18, 19, 20))
def test_values_match_independent_numpy(n: int) -> None:
    fn = CEC2005_FUNCTIONS[n](dim=10)
    X = _points(fn, 6, seed=n)
    if n >= 15:
        # also points close to the component optima (exercises the weight rule)
        optima = ref.composition_optima(n, 10)
        X = np.concatenate([X, np.clip(optima[[0, 3, 9]] + 0.05, -5, 5)])
    expected = np.array([_numpy_value(n, x) for x in X])
    actual = fn.evaluate_true(torch.tensor(X))
    # two float64 evaluations of one formula (torch's kernels and GEMMs, numpy's): each
    # within the rounding bound of the value
    bound = 2 * _value_bound(fn, torch.tensor(X), torch.float64)
    assert_within(actual, torch.from_numpy(expected), bound)


def test_schwefel_1_2_includes_last_term() -> None:
    fn = CEC2005F2(dim=10)
    o = ref.optimum(2, 10)
    x = o.copy()
    x[-1] += 3.0  # only the last partial sum (i = D) sees the last coordinate
    # against the exact values: within the rounding bound of the value at x
    X = torch.tensor(x)
    expected = torch.tensor(-450.0 + 9.0, dtype=torch.float64)
    assert_within(fn.evaluate_true(X), expected, _value_bound(fn, X, torch.float64))
    X = torch.tensor(o + 1.0)  # partial sums 1, 2, ..., 10: sum of squares = 385
    expected = torch.tensor(-450.0 + 385.0, dtype=torch.float64)
    assert_within(fn.evaluate_true(X), expected, _value_bound(fn, X, torch.float64))


@pytest.mark.skipif(not ref.HAS_OPTPROBLEMS, reason="needs optproblems")
@pytest.mark.parametrize("dim", (2, 30))
def test_matches_optproblems_reference(dim: int) -> None:
    """optproblems re-implements the reference code and was checked against the
    official test data (|y - y_hat| / y <= 1e-12); an independent oracle."""
    import optproblems.cec2005 as oc

    for n, cls in CEC2005_FUNCTIONS.items():
        if n in (4, 17) or (n == 5 and dim == 2):
            continue  # noisy; F5 in 2-D: optproblems applies o = -100 last (see doc)
        fn = cls(dim=dim)
        X = _points(fn, 3, seed=100 + n)
        expected = [getattr(oc, f"F{n}")(dim).objective_function(list(x)) for x in X]
        actual = fn.evaluate_true(torch.tensor(X))
        # each of the two float64 evaluations within the rounding bound of the value
        bound = 2 * _value_bound(fn, torch.tensor(X), torch.float64)
        assert_within(actual, torch.tensor(expected, dtype=torch.float64), bound, msg=f"F{n}")


def test_report_modifications_of_the_optima() -> None:
    o8 = load_cec2005_data(8, 10).optimum
    assert np.all(o8[0::2] == -32.0)  # o_1, o_3, ..., o_9 (1-based) on the bound
    np.testing.assert_array_equal(o8[1::2], ref.load("data_ackley.txt")[0, 1:10:2])
    o20 = load_cec2005_data(20, 10).shift
    assert np.all(o20[0, 1::2] == 5.0) and np.all(np.abs(o20[0, 0::2]) < 5)
    assert np.all(load_cec2005_data(18, 10).shift[9] == 0.0)
    np.testing.assert_array_equal(load_cec2005_data(5, 10).optimum[[0, 1, 2]], -100.0)
    np.testing.assert_array_equal(load_cec2005_data(5, 10).optimum[6:], 100.0)
    np.testing.assert_array_equal(load_cec2005_data(5, 2).optimum, [100.0, 100.0])
    # deterministic: two constructions give the same F8
    a, b = CEC2005_FUNCTIONS[8](dim=10), CEC2005_FUNCTIONS[8](dim=10)
    torch.testing.assert_close(a.shift, b.shift, rtol=0, atol=0)


def test_f7_default_bounds_and_unbounded_evaluation() -> None:
    fn = CEC2005F7(dim=10)
    torch.testing.assert_close(fn.bounds[0], torch.full((10,), -600.0, dtype=torch.float64))
    torch.testing.assert_close(fn.bounds[1], torch.full((10,), 600.0, dtype=torch.float64))
    o = ref.optimum(7, 10)
    assert np.all(o < 0)  # outside the report's initialisation range [0, 600]^D
    torch.testing.assert_close(fn.optimizers[0], torch.tensor(o, dtype=torch.float64))
    init_range = CEC2005F7(dim=10, bounds=[(0.0, 600.0)] * 10)
    assert not hasattr(init_range, "optimizers")
    assert fn.optimal_value == -180.0
    # "without bounds": evaluating outside the box is allowed; at o the shifted input is 0
    # and only Griewank's -cos(0) + 1 cancels (as in test_value_at_optimum_is_bias)
    value, expected = fn(torch.tensor(o), noise=False), torch.tensor(-180.0, dtype=torch.float64)
    scale = _optimum_scale(fn, 7, 10)
    assert_close(value, expected, dtype=torch.float64, factor=_FACTOR, scale=scale)


# --------------------------------------------------------------------------------
# shapes, dtypes, gradients
# --------------------------------------------------------------------------------


@pytest.mark.parametrize("n", range(1, 21))
def test_batch_shapes(n: int) -> None:
    fn = CEC2005_FUNCTIONS[n](dim=10)
    lb, ub = fn.bounds
    g = torch.Generator().manual_seed(n)
    X = lb + (ub - lb) * torch.rand(3, 4, 10, generator=g, dtype=torch.float64)
    Y = fn.evaluate_true(X)
    assert Y.shape == torch.Size([3, 4])
    single = torch.stack([fn.evaluate_true(x) for x in X.reshape(-1, 10)])
    # batched and one-by-one calls round differently (GEMM blocking of the rotations,
    # vectorised vs scalar transcendental kernels): both within the rounding bound
    bound64 = _value_bound(fn, X.reshape(-1, 10), torch.float64)
    assert_within(Y.reshape(-1), single, 2 * bound64)
    assert fn(X).shape == torch.Size([3, 4])
    Y32 = fn.evaluate_true(X.float())
    assert Y32.dtype == torch.float32
    # float32 inputs (rounded X) and float32 arithmetic vs float64
    bound32 = _value_bound(fn, X.reshape(-1, 10), torch.float32).reshape(3, 4)
    assert_within(Y32, Y, bound32 + bound64.reshape(3, 4))


@pytest.mark.parametrize("n", (3, 8, 11, 16, 19))
def test_gradients_are_finite(n: int) -> None:
    fn = CEC2005_FUNCTIONS[n](dim=10)
    lb, ub = fn.bounds
    X = (lb + (ub - lb) * torch.rand(4, 10, dtype=torch.float64)).requires_grad_(True)
    fn.evaluate_true(X).sum().backward()
    assert torch.isfinite(X.grad).all()


def test_pickle_roundtrip() -> None:
    fn = CEC2005F17(dim=10, seed=3)
    clone = pickle.loads(pickle.dumps(fn))
    X = torch.rand(4, 10, dtype=torch.float64)
    torch.testing.assert_close(clone(X), fn(X))


# --------------------------------------------------------------------------------
# noise
# --------------------------------------------------------------------------------


@pytest.mark.parametrize("cls,scale", [(CEC2005F4, 0.4), (CEC2005F17, 0.2)])
def test_fitness_noise_is_seeded_and_multiplicative(cls, scale: float) -> None:
    state = torch.get_rng_state()
    a, b, c = cls(dim=10, seed=0), cls(dim=10, seed=0), cls(dim=10, seed=1)
    lb, ub = a.bounds
    X = lb + (ub - lb) * torch.linspace(0.1, 0.9, 8, dtype=torch.float64).unsqueeze(-1)
    ya, yb, yc = a(X), b(X), c(X)
    assert torch.equal(torch.get_rng_state(), state)  # global RNG untouched
    torch.testing.assert_close(ya, yb, rtol=0, atol=0)
    assert not torch.allclose(ya, yc)
    assert not torch.allclose(a(X), ya)  # the stream advances between calls
    clean = a.evaluate_true(X)
    torch.testing.assert_close(a(X, noise=False), clean)
    bias = ref.BIASES[a.number]
    ratio = (ya - bias) / (clean - bias)  # = 1 + s |N(0, 1)|
    assert bool((ratio >= 1.0).all()) and bool((ratio < 1.0 + 6 * scale).all())
    # the same seed and fitness_noise=0: noise-free
    torch.testing.assert_close(cls(dim=10, seed=0, fitness_noise=0.0)(X), clean)
    # a generator works like a seed
    gen = torch.Generator().manual_seed(0)
    torch.testing.assert_close(cls(dim=10, generator=gen)(X), ya)


def test_noise_matches_report_distribution() -> None:
    fn = CEC2005F4(dim=10, seed=123)
    x = torch.tensor(ref.optimum(4, 10) + 1.0).expand(20000, 10)  # F4 - bias = 385
    ratio = (fn(x) + 450.0) / 385.0
    # E[1 + 0.4 |N(0, 1)|] = 1 + 0.4 sqrt(2 / pi)
    assert ratio.mean().item() == pytest.approx(1 + 0.4 * math.sqrt(2 / math.pi), abs=5e-3)


def test_additive_noise_std_seeded_and_global() -> None:
    X = torch.zeros(5, 10, dtype=torch.float64)
    fn = CEC2005_FUNCTIONS[1](dim=10, noise_std=2.0, seed=7)
    same = CEC2005_FUNCTIONS[1](dim=10, noise_std=2.0, seed=7)
    state = torch.get_rng_state()
    y = fn(X)
    assert torch.equal(torch.get_rng_state(), state)
    torch.testing.assert_close(y, same(X))
    assert not torch.allclose(y, fn.evaluate_true(X))
    # without a seed the global RNG is used (BoTorch's behaviour)
    unseeded = CEC2005_FUNCTIONS[1](dim=10, noise_std=2.0)
    torch.manual_seed(0)
    y1 = unseeded(X)
    torch.manual_seed(0)
    torch.testing.assert_close(unseeded(X), y1)
    with pytest.raises(ValueError, match="either `seed` or `generator`"):
        CEC2005_FUNCTIONS[1](dim=10, seed=1, generator=torch.Generator())


# --------------------------------------------------------------------------------
# errors
# --------------------------------------------------------------------------------


@pytest.mark.parametrize("dim", (1, 3, 20, 100))
def test_unsupported_dim(dim: int) -> None:
    with pytest.raises(ValueError, match=rf"dim={dim}") as info:
        CEC2005_FUNCTIONS[3](dim=dim)
    assert "(2, 10, 30, 50)" in str(info.value)


def test_bad_inputs() -> None:
    fn = CEC2005_FUNCTIONS[1](dim=10)
    with pytest.raises(BotorchTensorDimensionError, match=r"X.shape=\(4, 3\)"):
        fn(torch.zeros(4, 3, dtype=torch.float64))
    with pytest.raises(BotorchTensorDimensionError):
        fn(torch.tensor(1.0))
    with pytest.raises(ValueError, match="within the bounds"):
        fn(torch.full((2, 10), 101.0, dtype=torch.float64))
    with pytest.raises(ValueError, match="dim"):
        CEC2005_FUNCTIONS[1](dim=10.0)
    with pytest.raises(ValueError, match="No global optimum"):
        CEC2005_FUNCTIONS[1](dim=2, bounds=[(0.0, 1.0), (0.0, 1.0)])
