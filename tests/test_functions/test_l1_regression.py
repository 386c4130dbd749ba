r"""Least-absolute-deviations regression (the convex problem of [FedZero], paper 004).

The reference regenerates ``(A, x*, b)`` from the generator calls the module
documents (``torch.Generator().manual_seed(function_seed)``: ``randn(N, d) / sqrt(d)``,
``randperm(d)[:s]``, ``rand(s) - 0.5``, then ``randn(N)`` when ``data_noise > 0``)
and evaluates ``(1/N) sum_i |a_i' x - b_i|`` in numpy, row by row.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import optimize

from botorch_fed.protocol.setup import FederationSetup
from botorch_fed.test_functions import (
    L1Regression,
    get_test_function,
    get_test_function_class,
    list_test_functions,
)
from tests.helpers.tolerances import assert_within

EPS = float(np.finfo(np.float64).eps)
EPS32 = float(np.finfo(np.float32).eps)


# Rounding bounds (float64). A residual a_i' x - b_i is a d-term dot product, which errs
# by at most d eps sum_j |a_ij x_j| in any summation order (Higham, Thm. 3.5), and a
# subtraction (eps (|a_i' x| + |b_i|)); f averages N absolute residuals (N eps f). Two
# evaluations of the same values (torch's GEMM or row sums, numpy's row-by-row dot and
# pairwise mean) differ by at most the sum of the two bounds.
def _residual_error(A: np.ndarray, b: np.ndarray, X: np.ndarray) -> np.ndarray:
    r"""``points x N``: the rounding bound of each ``|a_i' x - b_i|``."""
    X = np.atleast_2d(X)
    S = np.abs(X) @ np.abs(A).T
    return EPS * (A.shape[1] * S + np.abs(X @ A.T) + np.abs(b))


def _f_error(A: np.ndarray, b: np.ndarray, X: np.ndarray) -> np.ndarray:
    r"""``points``: the rounding bound of ``f(x) = (1/N) sum_i |a_i' x - b_i|``."""
    X = np.atleast_2d(X)
    f = np.abs(X @ A.T - b).mean(axis=-1)
    return _residual_error(A, b, X).mean(axis=-1) + A.shape[0] * EPS * f


def _b_error(A: np.ndarray, x_star: np.ndarray) -> np.ndarray:
    r"""``N``: ``b = A x*`` formed by torch's GEMM and by numpy's row-by-row dot products
    (d-term sums in two orders: ``2 d eps sum_j |a_ij x*_j|``)."""
    return 2 * A.shape[1] * EPS * (np.abs(A) @ np.abs(x_star))


def _assert_within(actual, expected, bound) -> None:
    assert_within(torch.as_tensor(actual), torch.as_tensor(expected), torch.as_tensor(bound))


def _reference_data(dim, num_data=1000, sparsity=10, data_noise=0.0, seed=0):
    g = torch.Generator().manual_seed(seed)
    A = torch.randn(num_data, dim, generator=g, dtype=torch.float64) / math.sqrt(dim)
    support = torch.randperm(dim, generator=g)[:sparsity]
    values = torch.rand(sparsity, generator=g, dtype=torch.float64) - 0.5
    x_star = np.zeros(dim)
    x_star[support.numpy()] = values.numpy()
    A = A.numpy()
    b = np.array([np.dot(A[i], x_star) for i in range(num_data)])
    if data_noise > 0:
        b = b + data_noise * torch.randn(num_data, generator=g, dtype=torch.float64).numpy()
    return A, b, x_star


def _f_numpy(A, b, X):
    X = np.atleast_2d(np.asarray(X, dtype=np.float64))
    rows = list(zip(A, b, strict=True))
    return np.array([np.mean([abs(np.dot(a, x) - bi) for a, bi in rows]) for x in X])


def test_matches_numpy_reference_and_planted_solution() -> None:
    dim, n = 12, 50
    f = L1Regression(dim=dim, num_data=n, sparsity=4, function_seed=5)
    A, b, x_star = _reference_data(dim, n, 4, seed=5)
    np.testing.assert_allclose(f.A.numpy(), A, rtol=0, atol=0)
    np.testing.assert_allclose(f.solution.numpy(), x_star, rtol=0, atol=0)
    db = _b_error(A, x_star)
    _assert_within(f.b.numpy(), b, db)
    assert torch.equal(f.data[0], f.A) and torch.equal(f.data[1], f.b)
    assert int((f.solution != 0).sum()) == 4 and float(f.solution.abs().max()) <= 0.5
    X = 3 * torch.rand(7, dim, dtype=torch.float64) - 1.5  # also outside the box
    # both evaluations' rounding, and the two b's (a residual moves by |db_i|)
    bound = 2 * _f_error(A, b, X.numpy()) + db.mean()
    _assert_within(f(X, noise=False).numpy(), _f_numpy(A, b, X.numpy()), bound)
    # data_noise > 0: the extra draw follows the documented order
    g = L1Regression(dim=dim, num_data=n, sparsity=4, data_noise=0.3, function_seed=5)
    A2, b2, _ = _reference_data(dim, n, 4, data_noise=0.3, seed=5)
    np.testing.assert_allclose(g.A.numpy(), A2, rtol=0, atol=0)
    db2 = db + EPS * np.abs(b2)  # + the same noise, rounded once (eps/2) on each side
    _assert_within(g.b.numpy(), b2, db2)
    bound = 2 * _f_error(A2, b2, X.numpy()) + db2.mean()
    _assert_within(g(X, noise=False).numpy(), _f_numpy(A2, b2, X.numpy()), bound)


def test_defaults_zero_at_planted_optimum_and_nonnegative() -> None:
    f = L1Regression()
    assert f.dim == 100 and f.num_contexts == 1000 and f.sparsity == 10
    assert f.A.shape == (1000, 100) and f.b.shape == (1000,)
    assert f.bounds.tolist() == [[-1.0] * 100, [1.0] * 100]
    assert f.optimal_value == 0.0
    assert torch.equal(f.optimizers, f.solution.unsqueeze(0))
    assert f.evaluate_true(f.solution).item() == 0.0
    assert f(f.optimizers, noise=False).item() == 0.0
    X = 2 * torch.rand(64, 100, dtype=torch.float64) - 1
    values = f(X, noise=False)
    assert (values >= 0).all() and (values > 0).all()
    # ||a_i|| ~ 1: the norms concentrate around 1
    norms = torch.linalg.vector_norm(f.A, dim=-1)
    assert 0.7 < float(norms.mean()) < 1.3
    # negate
    fn = L1Regression(dim=10, num_data=30, sparsity=2, negate=True)
    assert fn.optimal_value == 0.0
    assert torch.allclose(fn(X[:, :10], noise=False), -fn.evaluate_true(X[:, :10]))


def test_lp_optimum_with_data_noise() -> None:
    f = L1Regression(dim=20, num_data=200, sparsity=5, data_noise=0.2, function_seed=1)
    opt = f.optimal_value
    assert opt > 0
    x_opt = f.optimizers
    assert x_opt.shape == (1, 20)
    assert ((x_opt >= f.bounds[0]) & (x_opt <= f.bounds[1])).all()
    # optimal_value is f at the stored argmin, evaluated the same way: exact
    assert f(x_opt, noise=False).item() == opt
    assert opt <= f.evaluate_true(f.solution).item()
    X = 2 * torch.rand(500, 20, dtype=torch.float64) - 1
    assert (f(X, noise=False) >= opt).all()
    # near the optimum, f does not go below it (up to the LP tolerance)
    near = (x_opt + 1e-3 * torch.randn(200, 20, dtype=torch.float64)).clamp(-1, 1)
    assert (f(near, noise=False) >= opt - 1e-7).all()


def test_lp_optimum_brute_force_tiny() -> None:
    f = L1Regression(dim=2, num_data=5, sparsity=2, data_noise=0.5, function_seed=4)
    A, b = f.A.numpy(), f.b.numpy()
    grid = np.linspace(-1, 1, 801)
    G = np.stack(np.meshgrid(grid, grid, indexing="ij"), axis=-1).reshape(-1, 2)
    f_grid = np.abs(G @ A.T - b).mean(axis=-1)
    assert f.optimal_value <= f_grid.min() + 1e-9
    # a grid of step 2.5e-3 is within L * 2.5e-3 / sqrt(2) of the minimum
    assert f.optimal_value >= f_grid.min() - f.lipschitz * 2.5e-3
    best = np.inf
    for x0 in np.random.default_rng(0).uniform(-1, 1, size=(10, 2)):
        res = optimize.minimize(
            lambda x: np.abs(A @ x - b).mean(),
            x0,
            method="Nelder-Mead",
            options={"xatol": 1e-12, "fatol": 1e-14, "maxiter": 5000},
        )
        if np.all(np.abs(res.x) <= 1):
            best = min(best, res.fun)
    assert f.optimal_value <= best + 1e-9
    assert f.optimal_value == pytest.approx(min(best, f_grid.min()), abs=1e-6)


def test_custom_bounds_excluding_planted_solution_use_lp() -> None:
    f0 = L1Regression(dim=5, num_data=40, sparsity=5, function_seed=2)
    lower = [float(v) + 0.1 for v in f0.solution]  # x* is outside [x* + 0.1, x* + 1]
    bounds = [(lo, lo + 0.9) for lo in lower]
    f = L1Regression(dim=5, num_data=40, sparsity=5, function_seed=2, bounds=bounds)
    assert torch.equal(f.A, f0.A)
    assert f.optimal_value > 0
    X = f.bounds[0] + (f.bounds[1] - f.bounds[0]) * torch.rand(300, 5, dtype=torch.float64)
    assert (f(X, noise=False) >= f.optimal_value).all()


def test_evaluate_contexts() -> None:
    f = L1Regression(dim=8, num_data=30, sparsity=3, data_noise=0.1, function_seed=7)
    A, b = f.A.numpy(), f.b.numpy()
    X = 2 * torch.rand(4, 5, 8, dtype=torch.float64) - 1
    index = torch.randint(30, (4, 5))
    values = f.evaluate_contexts(X, index)
    assert values.shape == (4, 5) and values.dtype == torch.float64
    expected = np.array(
        [
            [abs(A[index[i, j]] @ X[i, j].numpy() - b[index[i, j]]) for j in range(5)]
            for i in range(4)
        ]
    )
    errors = _residual_error(A, b, X.reshape(20, 8).numpy())  # 20 points x 30 rows
    residual_error = errors[np.arange(20), index.reshape(20).numpy()].reshape(4, 5)
    _assert_within(values.numpy(), expected, 2 * residual_error)
    # the mean over all contexts is f (row sums vs GEMM, then N-term means)
    Xr = X.reshape(20, 8)
    all_ctx = f.evaluate_contexts(Xr.unsqueeze(-2), torch.arange(30))  # 20 x 30
    assert all_ctx.shape == (20, 30)
    _assert_within(all_ctx.mean(-1), f.evaluate_true(Xr), 2 * _f_error(A, b, Xr.numpy()))
    # broadcasting one index over a batch, float32, not negated, no noise
    one = f.evaluate_contexts(Xr, torch.tensor(3))
    assert one.shape == (20,)
    x32 = Xr.float()
    v32 = f.evaluate_contexts(x32, torch.full((20,), 3))
    assert v32.dtype == torch.float32
    # computed in float64 from the float32-rounded x (eps32/2 of each |a_j x_j|), then
    # rounded to float32 (eps32/2 of the value), and the float64 sums of the two inputs
    S = (Xr.abs() @ f.A[3].abs()).numpy()
    bound = EPS32 / 2 * (S + one.abs().numpy()) + 2 * errors[:, 3]
    _assert_within(v32.double(), one, bound)
    fn = L1Regression(
        dim=8,
        num_data=30,
        sparsity=3,
        data_noise=0.1,
        function_seed=7,
        negate=True,
        noise_std=1.0,
        seed=0,
    )
    torch.testing.assert_close(fn.evaluate_contexts(Xr, torch.tensor(3)), one)
    # sample_contexts
    idx = f.sample_contexts((100,), generator=torch.Generator().manual_seed(0))
    assert idx.shape == (100,) and idx.min() >= 0 and idx.max() < 30
    with pytest.raises(ValueError, match="index"):
        f.evaluate_contexts(Xr, torch.tensor([30]))
    with pytest.raises(ValueError, match="index"):
        f.evaluate_contexts(Xr, torch.tensor([-1]))
    with pytest.raises(ValueError, match="index"):
        f.evaluate_contexts(Xr, torch.zeros(20))
    with pytest.raises(ValueError, match="broadcast"):
        f.evaluate_contexts(Xr, torch.zeros(7, dtype=torch.long))


def test_lipschitz_per_context() -> None:
    f = L1Regression(dim=15, num_data=100, sparsity=5, data_noise=0.1)
    L, d = f.lipschitz, f.dim
    # a norm is sqrt of a d-term sum of squares (d eps relative on each side, halved by the
    # root) and the root (eps/2): (d + 1) eps relative between the two
    L_numpy = float(np.linalg.norm(f.A.numpy(), axis=1).max())
    assert abs(L - L_numpy) <= (d + 1) * EPS * L_numpy
    gen = torch.Generator().manual_seed(0)
    X = 4 * torch.rand(2000, 15, generator=gen, dtype=torch.float64) - 2
    Y = X + torch.randn(2000, 15, generator=gen, dtype=torch.float64) * torch.rand(
        2000, 1, generator=gen, dtype=torch.float64
    )
    index = torch.randint(100, (2000,), generator=gen)
    dist = torch.linalg.vector_norm(X - Y, dim=-1)
    ratio = (f.evaluate_contexts(X, index) - f.evaluate_contexts(Y, index)).abs() / dist
    # |f_c(x) - f_c(y)| <= L ||x - y|| up to rounding: each value's bound over ||x - y||,
    # and (d/2 + 5) eps relative for the norm (a d-term sum and a root), the difference
    # x - y, the subtraction and the division
    A, b = f.A.numpy(), f.b.numpy()
    rows = np.arange(len(index))
    err_X = _residual_error(A, b, X.numpy())[rows, index.numpy()]
    err_Y = _residual_error(A, b, Y.numpy())[rows, index.numpy()]
    slack = torch.from_numpy(err_X + err_Y) / dist
    assert bool((ratio <= (L + slack) * (1 + (d / 2 + 5) * EPS)).all())
    # the bound is attained in the direction of the row with the largest norm
    i = int(torch.linalg.vector_norm(f.A, dim=-1).argmax())
    x = torch.zeros(15, dtype=torch.float64)
    y = x + f.A[i] / torch.linalg.vector_norm(f.A[i])
    x, y = x + 10 * f.A[i], y + 10 * f.A[i]  # both on the side a_i'x > b_i of the kink
    r = (f.evaluate_contexts(x, torch.tensor(i)) - f.evaluate_contexts(y, torch.tensor(i))).abs()
    # a_i'(y - x) = ||a_i|| up to: the two values' rounding, y's (the unit vector carries the
    # norm's (d/2 + 1) eps and a division, y = u + 10 a_i one more eps/2 of |y_j|), and L's
    # own norm (d/2 + 1) eps
    a = f.A[i]
    u = a / torch.linalg.vector_norm(a)
    err = _residual_error(A[i : i + 1], b[i], np.stack([x.numpy(), y.numpy()])).sum()
    err += EPS * float((a.abs() * ((d / 2 + 2) * u.abs() + y.abs() / 2)).sum())
    err += (d / 2 + 1) * EPS * L
    assert abs(float(r) - L) <= err
    # population f is Lipschitz too (the same rounding slack, with f's bound)
    fr = (f.evaluate_true(X) - f.evaluate_true(Y)).abs() / dist
    slack = torch.from_numpy(_f_error(A, b, X.numpy()) + _f_error(A, b, Y.numpy())) / dist
    assert bool((fr <= (L + slack) * (1 + (d / 2 + 5) * EPS)).all())


def test_function_seed_reproducible() -> None:
    a = L1Regression(dim=10, num_data=20, sparsity=3, function_seed=3)
    b = L1Regression(dim=10, num_data=20, sparsity=3, function_seed=3)
    c = L1Regression(dim=10, num_data=20, sparsity=3, function_seed=4)
    assert torch.equal(a.A, b.A) and torch.equal(a.b, b.b) and torch.equal(a.solution, b.solution)
    assert not torch.equal(a.A, c.A) and not torch.equal(a.solution, c.solution)
    state = torch.get_rng_state()
    L1Regression(dim=10, num_data=20, sparsity=3, data_noise=0.1, function_seed=3)
    assert torch.equal(torch.get_rng_state(), state)  # the global RNG is untouched


def test_batch_shapes_dtypes_out_of_box_and_noise() -> None:
    f = L1Regression(dim=6, num_data=25, sparsity=2, function_seed=1)
    for shape in [(), (3,), (2, 4), (2, 1, 3)]:
        X = 2 * torch.rand(*shape, 6, dtype=torch.float64) - 1
        assert f(X, noise=False).shape == shape
    X = 2 * torch.rand(5, 6, dtype=torch.float64) - 1
    v32 = f(X.float(), noise=False)
    assert v32.dtype == torch.float32
    # f in float64 of the float32-rounded X (eps32/2 of each |a_ij x_j|, averaged), rounded
    # to float32 (eps32/2 of f), and the float64 evaluations of the two inputs
    A, b = f.A.numpy(), f.b.numpy()
    f64 = f(X, noise=False)
    S = (np.abs(X.numpy()) @ np.abs(A).T).mean(axis=-1)
    bound = EPS32 / 2 * (S + f64.numpy()) + 2 * _f_error(A, b, X.numpy())
    _assert_within(v32.double(), f64, bound)
    outside = torch.full((2, 6), 1.5, dtype=torch.float64)
    outside[1] = -3.0
    expected = _f_numpy(A, b, outside.numpy())
    _assert_within(f(outside, noise=False).numpy(), expected, 2 * _f_error(A, b, outside.numpy()))
    # seeded observation noise
    g1 = L1Regression(dim=6, num_data=25, sparsity=2, function_seed=1, noise_std=0.1, seed=9)
    g2 = L1Regression(dim=6, num_data=25, sparsity=2, function_seed=1, noise_std=0.1, seed=9)
    torch.testing.assert_close(g1(X), g2(X))
    assert not torch.allclose(g1(X), f(X, noise=False))
    with pytest.raises(Exception, match="dim"):
        f(torch.zeros(3, 5, dtype=torch.float64))


def test_registry_and_federation_setup() -> None:
    assert "l1-regression" in list_test_functions()
    assert get_test_function_class("L1_Regression") is L1Regression
    f = get_test_function("l1-regression", dim=20, function_seed=3)
    assert isinstance(f, L1Regression) and f.dim == 20 and f.function_seed == 3
    assert torch.equal(f.A, L1Regression(dim=20, function_seed=3).A)
    default = get_test_function("l1-regression", seed=0)
    assert default.dim == 100 and default.generator is not None
    setup = FederationSetup(problem="l1-regression", dim=20, num_clients=4, seed=1)
    objectives = setup.make_objectives()
    assert len(objectives) == 4
    functions = [o.function for o in objectives]
    assert all(isinstance(fn, L1Regression) and fn.function_seed == 1 for fn in functions)
    assert all(
        torch.equal(fn.A, functions[0].A) and torch.equal(fn.b, functions[0].b) for fn in functions
    )


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"dim": 0}, "dim"),
        ({"dim": 2.5}, "dim"),
        ({"num_data": 0}, "num_data"),
        ({"dim": 5, "sparsity": 6}, "sparsity"),
        ({"sparsity": 0}, "sparsity"),
        ({"data_noise": -0.1}, "data_noise"),
        ({"data_noise": float("nan")}, "data_noise"),
        ({"function_seed": -1}, "function_seed"),
        ({"dim": 2, "sparsity": 1, "bounds": [(0, 1)]}, "bounds"),
        ({"dim": 2, "sparsity": 1, "bounds": [(1, 0), (0, 1)]}, "bounds"),
    ],
)
def test_bad_arguments(kwargs, name) -> None:
    with pytest.raises(ValueError, match=name):
        L1Regression(**kwargs)


def test_lp_size_limit(monkeypatch) -> None:
    monkeypatch.setattr(L1Regression, "MAX_LP_SIZE", 100)
    with pytest.raises(ValueError, match="MAX_LP_SIZE"):
        L1Regression(dim=20, num_data=10, sparsity=2, data_noise=0.1)
    L1Regression(dim=20, num_data=10, sparsity=2)  # no LP needed: fine
