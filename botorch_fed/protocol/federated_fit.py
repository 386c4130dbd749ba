r"""The federated hyperparameter fit of the dPITC sparse GP (paper 000), minimising
``-(log p(y) + log prior(theta)) / n`` from sums over the clients: :func:`fit_federated_pitc`
(in process) sums the summaries at ``theta``, then their products with the loss's adjoint
(:func:`fit_loss`), and L-BFGS-B (:class:`SteppedMinimizer`) picks the next ``theta``;
FBO-FedGP, over secure sums, sums summaries and their Jacobians in one sum per evaluation
and takes a few steps of :class:`SummaryTrustRegion` instead (fewer round trips)."""

from __future__ import annotations

import math
import numbers
import queue
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from botorch.exceptions.errors import InputDataError
from botorch.models.transforms.outcome import Standardize
from gpytorch.kernels import Kernel
from gpytorch.likelihoods import Likelihood
from gpytorch.means import Mean
from scipy.optimize import OptimizeResult, minimize
from torch import Tensor

from botorch_fed.models import (
    PITCFitClient,
    PITCHyperparameters,
    center_from_moments,
    centred_moments,
    outcome_moments,
    pitc_loss_and_adjoint,
    standardize_from_moments,
)

Aggregate = Callable[[Sequence[np.ndarray]], np.ndarray]
FAILED_LOSS = 1e300  # the loss at summed summaries that give none (only a forged sum can)
ADJOINT_LIMIT = 1e100  # |adjoint| entries; a product with it stays finite
_TIMEOUT = 3600.0  # seconds either side of a SteppedMinimizer waits for the other


class SteppedMinimizer:
    r"""L-BFGS-B driven from outside, one objective evaluation at a time.

    Args:
        x0: Starting point.
        bounds: ``n x 2`` bounds (``None`` or infinite entries for none).
        maxiter: Maximum L-BFGS-B iterations.
        maxfun: Maximum evaluations, a hard cap (SciPy checks its own between
            iterations only): at the cap the result is the best point evaluated.
        gtol: Projected-gradient tolerance (``None``: SciPy's default).
    """

    def __init__(
        self,
        x0: np.ndarray,
        bounds: np.ndarray | None,
        maxiter: int,
        maxfun: int | None = None,
        gtol: float | None = None,
    ) -> None:
        self._x0, self._maxfun = np.asarray(x0, dtype=np.float64), maxfun
        options = {"maxiter": int(maxiter)} | ({} if gtol is None else {"gtol": gtol})
        self._kwargs = {"jac": True, "method": "L-BFGS-B", "bounds": bounds, "options": options}
        self._thread: threading.Thread | None = None
        self._best: tuple[float, np.ndarray] | None = None
        self.result: OptimizeResult | None = None
        self.num_evaluations = 0

    def _objective(self, x: np.ndarray) -> tuple[float, np.ndarray]:
        if self._maxfun is not None and self.num_evaluations >= self._maxfun:
            raise _Stop
        x = np.array(x, dtype=np.float64)
        self._requests.put(("evaluate", x))
        value = self._values.get(timeout=_TIMEOUT)
        if value is None:  # close()
            raise _Stop
        if self._best is None or value[0] < self._best[0]:
            self._best = (value[0], x)
        return value

    def _work(self) -> None:
        try:
            reply = ("done", minimize(self._objective, self._x0, **self._kwargs))
        except _Stop:  # the budget is spent (after >= 1 evaluation), or close()
            if self._best is None:  # maxfun=0, or closed before the first value
                self._requests.put(("error", RuntimeError("No objective value was evaluated.")))
                return
            (fun, x), nfev = self._best, self.num_evaluations
            msg = "evaluation budget reached"
            reply = ("done", OptimizeResult(x=x, fun=fun, success=False, nfev=nfev, message=msg))
        except Exception as e:  # surfaced to the caller of start/feed
            reply = ("error", e)
        self._requests.put(reply)

    def _next(self) -> np.ndarray | None:
        kind, value = self._requests.get(timeout=_TIMEOUT)
        if kind == "evaluate":
            return value
        if kind == "error":
            raise value
        self.result, self._thread = value, None
        return None

    def start(self) -> np.ndarray | None:
        r"""Start the worker; return the first point to evaluate."""
        if self._thread is not None:
            raise RuntimeError("The minimisation is already running.")
        self._requests: queue.Queue = queue.Queue(maxsize=1)  # a fresh pair per run
        self._values: queue.Queue = queue.Queue(maxsize=1)
        self._thread = threading.Thread(target=self._work, daemon=True)
        self._thread.start()
        return self._next()

    def feed(self, loss: float, grad: np.ndarray) -> np.ndarray | None:
        r"""The value and gradient at the last point in; the next point (``None``: ``result``)."""
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
        if self._thread is not None:
            self._values.put(None)
            self._thread.join()
            self._thread = None


_MODEL_WALL = 1e10  # the model's value where it is no summary (moderate: L-BFGS-B's tests)


class SummaryTrustRegion:
    r"""A federated fit in few evaluations: a trust region on the linearised summary.

    Each evaluation sums the clients' summaries *and* their Jacobians at one ``theta``
    (:meth:`PITCFitClient.summary_and_jacobian
    <botorch_fed.models.PITCFitClient.summary_and_jacobian>`). The loss depends on
    ``theta`` through the summed summary ``S`` (and the prior), so ``S(theta) ~ S_k +
    J_k (theta - theta_k)`` gives a model of the loss that keeps its whole nonlinearity
    in ``S`` (log-determinants, solves), as Gauss-Newton keeps a least-squares loss's,
    which the coordinator minimises locally, without further sums,
    within a box of half-width ``radius`` in log space for the positive entries
    (lengthscales and noise move by factors) and in plain units for the others, inside
    ``bounds``. The model's step is evaluated; the best point so far is kept, and the
    radius doubles after a step the model predicted well that reached the box's edge
    and shrinks to 30% after one it predicted badly (the classic rules: Nocedal & Wright,
    *Numerical Optimization*, 2nd ed., ch. 4). The model is linear in ``theta``, where the
    summaries are evaluated; the box is in log space.

    Driven from outside like :class:`SteppedMinimizer`: :meth:`start` gives the first
    point (``x0``), :meth:`feed` takes the summed summary and Jacobian there and gives the
    next, or ``None`` when done (``result``: the best point evaluated).

    Args:
        x0: Starting point (clipped into ``bounds``).
        bounds: ``n x 2`` finite box (entries with a positive lower bound move in log
            space).
        maxiter: Steps after the first evaluation (evaluations: ``maxiter + 1`` at most).
        loss: ``(summed summary, theta) -> (loss, adjoint, prior_grad, failure)``
            (:func:`fit_loss` with the fit's modules).
        radius: The box's first half-width (log units: 0.5 lets a lengthscale move by
            ``e^0.5 ~ 1.65x``).
    """

    def __init__(
        self,
        x0: np.ndarray,
        bounds: np.ndarray,
        maxiter: int,
        loss: Callable[[np.ndarray, np.ndarray], tuple[float, np.ndarray, np.ndarray, object]],
        radius: float = 0.5,
    ) -> None:
        self._bounds = np.asarray(bounds, dtype=np.float64)
        if self._bounds.ndim != 2 or self._bounds.shape[1] != 2:
            raise ValueError(f"`bounds` must be n x 2, got shape {self._bounds.shape}.")
        if not np.isfinite(self._bounds).all() or (self._bounds[:, 0] >= self._bounds[:, 1]).any():
            raise ValueError("`bounds` must be finite with lower < upper.")
        x0 = np.asarray(x0, dtype=np.float64)
        if x0.shape != (len(self._bounds),) or not np.isfinite(x0).all():
            raise ValueError(f"`x0` must be a finite vector of length {len(self._bounds)}.")
        if isinstance(maxiter, bool) or not isinstance(maxiter, int) or maxiter < 0:
            raise ValueError(f"`maxiter` must be an int >= 0, got {maxiter!r}.")
        real = isinstance(radius, numbers.Real) and not isinstance(radius, bool | np.bool_)
        if not (real and math.isfinite(radius) and radius > 0):
            raise ValueError(f"`radius` must be a finite number > 0, got {radius!r}.")
        self._x0 = np.clip(x0, self._bounds[:, 0], self._bounds[:, 1])
        self._log = self._bounds[:, 0] > 0
        self._loss, self._maxiter, self._radius = loss, maxiter, float(radius)
        self._pending: np.ndarray | None = None
        self._best: tuple[float, np.ndarray, np.ndarray, np.ndarray] | None = None
        self._predicted: float | None = None  # the model's decrease for the pending step
        self._at_edge = False
        self.result: OptimizeResult | None = None
        self.num_evaluations = 0

    def _to_phi(self, theta: np.ndarray) -> np.ndarray:
        return np.where(self._log, np.log(np.where(self._log, theta, 1.0)), theta)

    def _to_theta(self, phi: np.ndarray) -> np.ndarray:
        theta = np.where(self._log, np.exp(np.where(self._log, phi, 0.0)), phi)
        return np.clip(theta, self._bounds[:, 0], self._bounds[:, 1])

    def close(self) -> None:
        r"""Nothing to end (no worker thread, unlike :class:`SteppedMinimizer`)."""

    def start(self) -> np.ndarray:
        r"""The first point to evaluate (``x0``, clipped into ``bounds``)."""
        if self._pending is not None or self.result is not None:
            raise RuntimeError("The minimisation has already started.")
        self._pending = self._x0.copy()
        return self._pending.copy()

    def feed(self, summary: np.ndarray, jacobian: np.ndarray) -> np.ndarray | None:
        r"""The summed summary and Jacobian at the last point in; the next point out
        (``None``: done, see ``result``).

        A sum that is not finite, or gives no loss (only a forged one can), is a failed
        evaluation: never the best point, and the model is not built on it (a refusal
        would be a bit of a sum that under ``ckks`` the server must not learn).

        Raises:
            RuntimeError: No point is pending.
            ValueError: ``jacobian`` is not ``len(summary) x n``.
        """
        if self._pending is None:
            raise RuntimeError("`feed` called while no point is pending.")
        summary = np.asarray(summary, dtype=np.float64)
        jacobian = np.asarray(jacobian, dtype=np.float64)
        if jacobian.shape != (summary.size, len(self._bounds)):
            raise ValueError(
                f"`jacobian` must be {summary.size} x {len(self._bounds)}, got {jacobian.shape}."
            )
        theta, self._pending = self._pending, None
        self.num_evaluations += 1
        value = FAILED_LOSS
        if np.isfinite(summary).all() and np.isfinite(jacobian).all():
            value = min(float(self._loss(summary, theta)[0]), FAILED_LOSS)
        if self._best is None and value >= FAILED_LOSS:  # nothing to build a model on
            self._best = (value, theta, summary, jacobian)
            self._finish("the first evaluation gives no loss")
            return None
        best = self._best
        if best is not None and self._predicted is not None:
            rho = (best[0] - value) / self._predicted if self._predicted > 0 else -1.0
            if rho > 0.75 and self._at_edge:
                self._radius *= 2.0
            elif rho < 0.25:
                self._radius *= 0.3
        if best is None or value < best[0]:
            self._best = best = (value, theta, summary, jacobian)
        if self.num_evaluations > self._maxiter:
            self._finish("evaluation budget reached")
            return None
        step = self._step(*best)
        if step is None:
            self._finish("converged")
            return None
        self._pending = step
        return step.copy()

    def _step(self, value: float, theta, summary, jacobian) -> np.ndarray | None:
        r"""The minimiser of the linearised model in the box around ``theta``."""
        phi0, r = self._to_phi(theta), self._radius
        lo = np.maximum(self._to_phi(self._bounds[:, 0]), phi0 - r)
        hi = np.minimum(self._to_phi(self._bounds[:, 1]), phi0 + r)

        def model(phi: np.ndarray) -> tuple[float, np.ndarray]:
            point = self._to_theta(phi)
            loss, adjoint, prior_grad, failure = self._loss(
                summary + jacobian @ (point - theta), point
            )
            if failure is not None:  # beyond where the model is a summary: back away
                return _MODEL_WALL, np.zeros_like(phi)
            scale = np.where(self._log, point, 1.0)  # d theta / d phi
            return float(loss), (jacobian.T @ adjoint + prior_grad) * scale

        found = minimize(
            model,
            phi0,
            jac=True,
            method="L-BFGS-B",
            bounds=list(zip(lo, hi, strict=True)),
            options={"maxiter": 200, "maxfun": 400},  # the coordinator's latency: bounded
        )
        if not found.fun < value - 1e-12 * max(1.0, abs(value)):
            return None  # the model promises nothing: the best point is the result
        self._predicted = value - float(found.fun)
        self._at_edge = bool(np.any(np.isclose(np.abs(found.x - phi0), r, rtol=1e-3)))
        step = self._to_theta(found.x)
        return None if np.array_equal(step, theta) else step

    def _finish(self, message: str) -> None:
        assert self._best is not None
        value, theta = self._best[:2]
        self.result = OptimizeResult(
            x=theta.copy(), fun=value, success=message == "converged", message=message,
            nfev=self.num_evaluations,
        )  # fmt: skip


class _Stop(Exception):
    r"""Ends the worker: ``maxfun`` evaluations are spent, or :meth:`~SteppedMinimizer.close`."""


def plain_sum(arrays: Sequence[np.ndarray]) -> np.ndarray:
    r"""The float64 elementwise sum of the clients' arrays (the default ``aggregate``)."""
    if len(arrays) == 0:
        raise ValueError("`arrays` is empty: no client contributed to the sum.")
    return np.sum(np.stack([np.asarray(a, dtype=np.float64) for a in arrays]), axis=0)


def fit_loss(
    packed_sum: np.ndarray, num_support: int, hyper: PITCHyperparameters, include_prior: bool = True
) -> tuple[float, np.ndarray, np.ndarray, str | None]:
    r"""The loss and its adjoint at summed summaries, never refusing the sum (a refusal
    would be a bit of it): a sum without a finite loss (only a forged one) gives
    :data:`FAILED_LOSS` and a zero adjoint, which the line search backs away from.

    Args:
        packed_sum: The summed packed summaries at ``theta``.
        num_support: Number of support points ``m``.
        hyper: The hyperparameters, set to ``theta``.
        include_prior: Whether the loss includes the modules' log priors.

    Returns:
        ``(loss, adjoint, prior_grad, failure)``: the adjoint clipped to
        ``[-ADJOINT_LIMIT, ADJOINT_LIMIT]``, the prior's part of ``d loss / d theta``,
        and why the sum gives no loss (``None`` when it does).
    """
    failure: str | None
    try:
        loss, adjoint, prior_grad = pitc_loss_and_adjoint(
            packed_sum, num_support, hyper, include_prior
        )
        failure = None if np.isfinite(adjoint).all() and math.isfinite(loss) else "not finite"
    except (ValueError, RuntimeError, InputDataError) as exc:  # linalg: RuntimeError
        prior_grad, failure = np.zeros(hyper.size), type(exc).__name__
    if failure is not None:
        loss, adjoint = FAILED_LOSS, np.zeros(len(packed_sum))
    return loss, np.clip(adjoint, -ADJOINT_LIMIT, ADJOINT_LIMIT), prior_grad, failure


@dataclass
class FederatedFitResult:
    r"""Outcome of :func:`fit_federated_pitc`.

    Attributes:
        loss: The final loss ``-(log p(y) + log prior) / n``.
        success: Whether L-BFGS-B converged.
        message: L-BFGS-B's message.
        num_evaluations: Objective evaluations.
        num_rounds: Sums over the clients (two per evaluation).
    """

    loss: float
    success: bool
    message: str
    num_evaluations: int
    num_rounds: int


def _server_hyper(clients: Sequence[PITCFitClient], *modules) -> PITCHyperparameters:
    if len(clients) == 0:
        raise ValueError("`clients` is empty: a federation needs clients.")
    hyper = PITCHyperparameters(*modules)
    for i, c in enumerate(clients):
        if c.num_hyperparameters != hyper.size:
            raise ValueError(
                f"Client {i} has {c.num_hyperparameters} hyperparameters but the server's modules "
                f"have {hyper.size}: the module structures differ."
            )
    return hyper


def fit_federated_pitc(
    clients: Sequence[PITCFitClient],
    support: Tensor,
    covar_module: Kernel,
    likelihood: Likelihood,
    mean_module: Mean | None = None,
    aggregate: Aggregate | None = None,
    include_prior: bool = True,
    maxiter: int = 200,
    gtol: float = 1e-6,
) -> FederatedFitResult:
    r"""Exact federated type-II ML (MAP) of the PITC model in one process: the modules
    (in place, as ``fit_gpytorch_mll``) and the clients end at the fitted values.

    L-BFGS-B to convergence (two sums per evaluation): the reference fit. FBO-FedGP's
    refreshes take a few :class:`SummaryTrustRegion` steps instead (one sum each, fewer
    round trips), which need not end at the same point.

    Args:
        clients: The clients (each holds its own data).
        support: ``m x d`` shared support set.
        covar_module: The server's kernel (its values are the starting point).
        likelihood: The server's ``GaussianLikelihood``.
        mean_module: The server's mean (``None``: zero mean).
        aggregate: ``list of arrays -> their sum`` (e.g. ``make_aggregator("masking")``).
        include_prior: Add the modules' log priors (MAP, as BoTorch's default fit).
        maxiter: Maximum L-BFGS-B iterations.
        gtol: Projected-gradient tolerance of L-BFGS-B.

    Returns:
        The fit's :class:`FederatedFitResult`.

    Raises:
        ValueError: No clients, module structures that differ, or summed summaries
            that give no (finite) loss.
    """
    aggregate = aggregate or plain_sum
    hyper = _server_hyper(clients, covar_module, likelihood, mean_module)
    minimizer = SteppedMinimizer(hyper.get_theta(), hyper.bounds, maxiter, gtol=gtol)
    theta = minimizer.start()
    try:
        while theta is not None:
            hyper.set_theta(theta)
            packed_sum = aggregate([c.summary(theta) for c in clients])
            # no adversary in one process: a sum without a loss raises (fit_loss would not)
            loss, adjoint, prior_grad = pitc_loss_and_adjoint(
                packed_sum, len(support), hyper, include_prior
            )
            grad = aggregate([c.vjp(adjoint) for c in clients]) + prior_grad
            theta = minimizer.feed(loss, grad)
    finally:
        minimizer.close()  # ends the worker of a fit a client's error interrupted
    result = minimizer.result
    assert result is not None  # the minimisation ended
    hyper.set_theta(result.x)
    for c in clients:
        c.set_theta(result.x)
    fun, success, n = float(result.fun), bool(result.success), minimizer.num_evaluations
    return FederatedFitResult(fun, success, str(result.message), n, 2 * n)


def fit_local_average(
    clients: Sequence[PITCFitClient],
    covar_module: Kernel,
    likelihood: Likelihood,
    mean_module: Mean | None = None,
    aggregate: Aggregate | None = None,
) -> np.ndarray:
    r"""Set the modules and the clients to the size-weighted average of the clients' own
    exact-GP fits (:meth:`~botorch_fed.models.PITCFitClient.fit_local`); returns its values.

    Args:
        clients: The clients.
        covar_module: The server's kernel (updated in place).
        likelihood: The server's likelihood (updated in place).
        mean_module: The server's mean (updated in place; ``None``: zero mean).
        aggregate: ``list of arrays -> their sum``; default :func:`plain_sum`.
    """
    hyper = _server_hyper(clients, covar_module, likelihood, mean_module)
    theta = hyper.get_theta()
    total = (aggregate or plain_sum)([c.fit_local(theta) for c in clients])
    values = total[:-1] / total[-1]
    hyper.set_values(values)
    theta = hyper.get_theta()
    for c in clients:
        c.set_theta(theta)
    return values


def standardize_outcomes(
    client_Y: Sequence[Tensor],
    aggregate: Aggregate | None = None,
    min_stdv: float = 1e-8,
) -> Standardize:
    r"""Federated outcome standardisation in one process (both sums of moments): the
    trained float64 ``Standardize(m=1)`` of all clients' outcomes pooled.

    Args:
        client_Y: Each client's ``n_i x 1`` outcomes.
        aggregate: ``list of arrays -> their sum`` (default :func:`plain_sum`).
        min_stdv: Standard deviations below this are replaced by 1 (as BoTorch).
    """
    aggregate = aggregate or plain_sum
    client_Y = list(client_Y)
    first = aggregate([outcome_moments(Y) for Y in client_Y])
    _, center = center_from_moments(first)
    second = aggregate([centred_moments(Y, center) for Y in client_Y])
    return standardize_from_moments(first, second, min_stdv=min_stdv)
