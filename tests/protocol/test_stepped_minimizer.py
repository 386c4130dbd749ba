r"""The externally driven L-BFGS-B of the federated hyperparameter fit."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.optimize import minimize

from botorch_fed.protocol.stepped_minimizer import SteppedMinimizer


def _quadratic(x: np.ndarray) -> tuple[float, np.ndarray]:
    target = np.array([1.0, -2.0, 0.5])
    return float(((x - target) ** 2).sum()), 2 * (x - target)


def test_stepped_minimizer_equals_scipy_calling_the_objective_itself():
    x0, bounds = np.zeros(3), np.array([[-5.0, 5.0], [-1.0, 5.0], [-5.0, 5.0]])
    ref = minimize(_quadratic, x0, jac=True, method="L-BFGS-B", bounds=bounds)
    m = SteppedMinimizer(x0, bounds, maxiter=100)
    x = m.start()
    while x is not None:
        x = m.feed(*_quadratic(x))
    np.testing.assert_array_equal(m.result.x, ref.x)  # -1 bound active on x[1]
    assert m.num_evaluations == ref.nfev


def test_non_finite_feed_aborts_the_worker():
    m = SteppedMinimizer(np.zeros(3), None, maxiter=10)
    m.start()
    worker = m._thread
    with pytest.raises(ValueError, match="not finite"):
        m.feed(float("nan"), np.zeros(3))
    assert not worker.is_alive()
    with pytest.raises(RuntimeError, match="no minimisation is running"):
        m.feed(1.0, np.zeros(3))


def test_close_ends_an_abandoned_minimisation():
    m = SteppedMinimizer(np.zeros(3), None, maxiter=10)
    m.start()
    worker = m._thread
    m.close()
    assert not worker.is_alive()
    m.close()  # idempotent
    assert m.start() is not None  # can run again
    m.close()


def _rosenbrock(x: np.ndarray) -> tuple[float, np.ndarray]:
    a, b = x
    value = (1 - a) ** 2 + 100 * (b - a * a) ** 2
    grad = np.array([-2 * (1 - a) - 400 * a * (b - a * a), 200 * (b - a * a)])
    return float(value), grad


@pytest.mark.parametrize("maxfun", [1, 5, 17])
def test_maxfun_is_a_hard_cap_and_the_result_is_the_best_point_evaluated(maxfun):
    # SciPy checks its own maxfun between iterations only (a line search may exceed
    # it); a federated fit's evaluations are secure sums, so the cap is exact here
    m = SteppedMinimizer(np.array([-1.2, 1.0]), None, maxiter=1000, maxfun=maxfun)
    seen = []
    x = m.start()
    while x is not None:
        seen.append((_rosenbrock(x)[0], x.copy()))
        x = m.feed(*_rosenbrock(x))
    assert len(seen) == maxfun == m.num_evaluations
    best = min(seen, key=lambda pair: pair[0])
    np.testing.assert_array_equal(m.result.x, best[1])
    assert m.result.fun == best[0] and not m.result.success
