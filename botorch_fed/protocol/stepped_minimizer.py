r"""An L-BFGS-B minimisation whose objective values arrive through protocol messages.

A federated fit evaluates its objective with secure sums that span several message
rounds, so the optimiser cannot call the objective itself. :class:`SteppedMinimizer`
runs ``scipy.optimize.minimize`` in a worker thread and hands each requested point
out (:meth:`start`, :meth:`feed`); the caller supplies the value and gradient when
the protocol has computed them.
"""

from __future__ import annotations

import queue
import threading

import numpy as np
from scipy.optimize import OptimizeResult, minimize


class SteppedMinimizer:
    r"""L-BFGS-B driven from outside, one objective evaluation at a time.

    Args:
        x0: Starting point.
        bounds: ``n x 2`` bounds (``None`` or infinite entries for none).
        maxiter: Maximum L-BFGS-B iterations.
        maxfun: Maximum objective evaluations, a hard cap (SciPy's own ``maxfun`` is
            checked between iterations only, so a line search may exceed it): at the
            cap the minimisation ends with the best point evaluated (``None``: no cap).
        timeout: Seconds to wait for an evaluation before aborting the worker.
    """

    def __init__(
        self,
        x0: np.ndarray,
        bounds: np.ndarray | None,
        maxiter: int,
        timeout: float = 3600.0,
        maxfun: int | None = None,
    ) -> None:
        self._x0 = np.asarray(x0, dtype=np.float64)
        self._bounds = bounds
        self._maxiter = int(maxiter)
        self._maxfun = None if maxfun is None else int(maxfun)
        self._timeout = float(timeout)
        self._requests: queue.Queue = queue.Queue(maxsize=1)
        self._values: queue.Queue = queue.Queue(maxsize=1)
        self._thread: threading.Thread | None = None
        self.result: OptimizeResult | None = None
        self.num_evaluations = 0
        self._asked = 0
        self._best: tuple[float, np.ndarray] | None = None

    def _objective(self, x: np.ndarray) -> tuple[float, np.ndarray]:
        if self._maxfun is not None and self._asked >= self._maxfun:
            raise _BudgetReached
        self._asked += 1
        x = np.array(x, dtype=np.float64)
        self._requests.put(("evaluate", x))
        value = self._values.get(timeout=self._timeout)
        if value is None:
            raise _Aborted
        if self._best is None or value[0] < self._best[0]:
            self._best = (value[0], x)
        return value

    def _work(self) -> None:
        try:
            result = minimize(
                self._objective,
                self._x0,
                jac=True,
                method="L-BFGS-B",
                bounds=self._bounds,
                options={"maxiter": self._maxiter},
            )
            self._requests.put(("done", result))
        except _BudgetReached:
            # raised only once ``maxfun >= 1`` evaluations were answered (fed a value)
            assert self._best is not None
            fun, x = self._best
            result = OptimizeResult(
                x=x, fun=fun, success=False, nfev=self._asked, message="evaluation budget reached"
            )
            self._requests.put(("done", result))
        except Exception as e:  # surfaced to the caller of start/feed
            self._requests.put(("error", e))

    def _next(self) -> np.ndarray | None:
        kind, value = self._requests.get(timeout=self._timeout)
        if kind == "evaluate":
            return value
        if kind == "error":
            raise value
        self.result = value
        self._thread = None
        return None

    def start(self) -> np.ndarray | None:
        r"""Start the worker; return the first point to evaluate."""
        if self._thread is not None:
            raise RuntimeError("The minimisation is already running.")
        self._thread = threading.Thread(target=self._work, daemon=True)
        self._thread.start()
        return self._next()

    def feed(self, loss: float, grad: np.ndarray) -> np.ndarray | None:
        r"""Supply the value and gradient at the last point.

        Returns:
            The next point to evaluate, or ``None`` when finished (see ``result``).
        """
        if self._thread is None:
            raise RuntimeError("`feed` called while no minimisation is running.")
        grad = np.asarray(grad, dtype=np.float64)
        if not np.isfinite(loss) or not np.isfinite(grad).all():
            self.close()
            raise ValueError("The objective value or gradient is not finite.")
        self.num_evaluations += 1
        self._values.put((float(loss), grad))
        return self._next()

    def close(self) -> None:
        r"""Abort a running minimisation and end its worker (no-op when idle)."""
        if self._thread is None:
            return
        self._values.put(None)
        self._thread.join()
        self._thread = None
        # drop the worker's last message (its abort) so a new run starts clean
        self._requests = queue.Queue(maxsize=1)
        self._values = queue.Queue(maxsize=1)


class _BudgetReached(Exception):
    r"""Raised inside the worker when ``maxfun`` evaluations are spent."""


class _Aborted(Exception):
    r"""Raised inside the worker to unwind an aborted minimisation."""
