r"""Federated hyperparameter fitting of the dPITC sparse GP.

Two strategies, both written over a pluggable ``aggregate(list_of_arrays) -> sum``
callable so that secure aggregation (``botorch_fed.secure``) plugs in:

1. :func:`fit_federated_pitc`: exact type-II maximum likelihood of the PITC model
   from aggregated quantities only. The log marginal likelihood is a function of
   the summed whitened summaries (see
   :func:`~botorch_fed.models.sparse_summary.pitc_log_marginal_likelihood`), so one
   evaluation of the objective and its gradient takes two aggregation rounds:

   - round 1: the server broadcasts the hyperparameters ``theta``; each client
     returns its packed summary (``SparseSummary.pack``); the server sums them and
     evaluates ``loss = -(log p(y) + log prior(theta)) / n``;
   - round 2: the server broadcasts the adjoint ``d loss / d packed sum``; each
     client returns the vector-Jacobian product of its packed summary with the
     adjoint (a vector of the size of ``theta``); the sum plus the server's prior
     gradient is ``d loss / d theta``.

   L-BFGS-B (scipy) drives the server side, exactly as ``fit_gpytorch_mll`` does
   for BoTorch models. The objective equals gpytorch's ``ExactMarginalLogLikelihood``
   normalisation (divided by ``n``, priors included).

2. :func:`fit_local_average`: each client fits an exact GP to its own data; the
   server averages the hyperparameter values (weighted by client size) in one
   aggregation round. Cheap, but biased when clients see different regions.

The client side of both lives in :class:`PITCFitClient`, which owns the client's
data and its own copy of the hyperparameter modules; the server functions only
see the arrays the clients return.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from copy import deepcopy
from dataclasses import dataclass

import numpy as np
import torch
from botorch.models.transforms.input import InputTransform
from botorch.optim.utils import get_parameters_and_bounds
from botorch.optim.utils.numpy_utils import get_bounds_as_ndarray
from gpytorch import Module as GPyTorchModule
from gpytorch.kernels import Kernel
from gpytorch.likelihoods import Likelihood
from gpytorch.means import Mean, ZeroMean
from scipy.optimize import minimize
from torch import Tensor

from botorch_fed.models.exact_gp import fit_exact_gp
from botorch_fed.models.local_summary import compute_local_summary
from botorch_fed.models.plaintext_sum import sum_arrays
from botorch_fed.models.sparse_summary import SparseSummary, pitc_log_marginal_likelihood
from botorch_fed.models.support_set import check_input_transform, support_factor

Aggregate = Callable[[Sequence[np.ndarray]], np.ndarray]


class PITCHyperparameters:
    r"""The shared hyperparameters of the kernel, likelihood and mean, as one vector.

    Wraps the three modules (in place, no copy) and maps their raw parameters to a
    flat float64 numpy vector ``theta`` and back, in a fixed order that every party
    derives from the same module structure.

    Args:
        covar_module: The kernel.
        likelihood: The ``GaussianLikelihood``.
        mean_module: The prior mean (``None``: zero mean, no parameters).
    """

    def __init__(
        self, covar_module: Kernel, likelihood: Likelihood, mean_module: Mean | None = None
    ) -> None:
        container = GPyTorchModule()
        container.covar_module = covar_module
        container.likelihood = likelihood
        if mean_module is not None:
            container.mean_module = mean_module
        self.covar_module = covar_module
        self.likelihood = likelihood
        self.mean_module = mean_module
        self.container = container
        self.parameters, bounds = get_parameters_and_bounds(container, requires_grad=True)
        # botorch types these bounds narrower than get_bounds_as_ndarray takes (a dict
        # is invariant): the same values
        self.bounds = get_bounds_as_ndarray(self.parameters, bounds)  # type: ignore[arg-type]
        self._constraints = {
            name: constraint for name, _, constraint in container.named_parameters_and_constraints()
        }

    @property
    def size(self) -> int:
        r"""Number of scalar hyperparameters."""
        return sum(p.numel() for p in self.parameters.values())

    def get_theta(self) -> np.ndarray:
        r"""The raw hyperparameters as a flat float64 vector."""
        return np.concatenate(
            [p.detach().cpu().double().reshape(-1).numpy() for p in self.parameters.values()]
        )

    def set_theta(self, theta: np.ndarray) -> None:
        r"""Load a raw hyperparameter vector (as produced by :meth:`get_theta`)."""
        theta = self._check_vector("theta", theta)
        with torch.no_grad():
            i = 0
            for p in self.parameters.values():
                k = p.numel()
                p.copy_(torch.as_tensor(theta[i : i + k]).reshape(p.shape).to(p))
                i += k

    def get_values(self) -> np.ndarray:
        r"""The hyperparameters in their natural (constrained) space, flattened."""
        out = []
        with torch.no_grad():
            for name, p in self.parameters.items():
                c = self._constraints.get(name)
                v = p if c is None or not c.enforced else c.transform(p)
                out.append(v.detach().cpu().double().reshape(-1).numpy())
        return np.concatenate(out)

    def set_values(self, values: np.ndarray) -> None:
        r"""Load natural-space values (inverse of :meth:`get_values`)."""
        values = self._check_vector("values", values)
        with torch.no_grad():
            i = 0
            for name, p in self.parameters.items():
                k = p.numel()
                v = torch.as_tensor(values[i : i + k]).reshape(p.shape).to(p)
                c = self._constraints.get(name)
                p.copy_(v if c is None or not c.enforced else c.inverse_transform(v))
                i += k

    def log_prior(self) -> Tensor:
        r"""Sum of the log densities of all registered priors (0 if none), in float64
        on the modules' device."""
        device = next((p.device for p in self.parameters.values()), None)
        total = torch.zeros((), dtype=torch.float64, device=device)
        for _, module, prior, closure, _ in self.container.named_priors():
            total = total + prior.log_prob(closure(module)).sum().to(total)
        return total

    def flat_grad(self, grads: Sequence[Tensor | None]) -> np.ndarray:
        r"""Flatten per-parameter gradients (``None`` -> zeros) in ``theta`` order."""
        return np.concatenate(
            [
                np.zeros(p.numel()) if g is None else g.detach().cpu().double().reshape(-1).numpy()
                for p, g in zip(self.parameters.values(), grads, strict=True)
            ]
        )

    def _check_vector(self, name: str, vector: np.ndarray) -> np.ndarray:
        vector = np.asarray(vector, dtype=np.float64)
        if vector.shape != (self.size,):
            raise ValueError(
                f"`{name}` must have shape ({self.size},) for these modules, got {vector.shape}."
            )
        if not np.isfinite(vector).all():
            raise ValueError(f"`{name}` contains NaN or infinite values.")
        return vector


class PITCFitClient:
    r"""Client side of the federated hyperparameter fit (holds the private data).

    The client keeps its data and its own copy of the shared modules; it only ever
    returns packed summaries, vector-Jacobian products and (for the averaging
    strategy) its locally fitted hyperparameter values.

    Args:
        train_X: ``n x d`` private inputs.
        train_Y: ``n x 1`` private outcomes (already outcome-transformed if the
            federation standardises outcomes).
        support: ``m x d`` shared support set.
        covar_module: The shared kernel (copied).
        likelihood: The shared ``GaussianLikelihood`` (copied).
        mean_module: The shared mean (copied; ``None``: zero mean).
        jitter: Relative jitter of ``K_SS``.
        input_transform: The input transform every party applies, with fixed
            coefficients (e.g. ``Normalize(d, bounds=bounds)``): inputs and support
            are given in the original space, and the hyperparameters are fitted in the
            transformed one, as ``FederatedPITCGP(..., input_transform=...)`` uses them.
    """

    def __init__(
        self,
        train_X: Tensor,
        train_Y: Tensor,
        support: Tensor,
        covar_module: Kernel,
        likelihood: Likelihood,
        mean_module: Mean | None = None,
        jitter: float | None = None,
        input_transform: InputTransform | None = None,
    ) -> None:
        check_input_transform(input_transform)
        self._X = train_X
        self._Y = train_Y
        self._support = support
        self._jitter = jitter
        self._input_transform = input_transform
        self._hyper = PITCHyperparameters(
            deepcopy(covar_module), deepcopy(likelihood), deepcopy(mean_module)
        )
        self._packed: Tensor | None = None
        # Validate the data once, up front, with a throw-away evaluation.
        with torch.no_grad():
            self._summary()

    @property
    def num_data(self) -> int:
        r"""Number of local observations."""
        return self._X.shape[-2]

    @property
    def num_hyperparameters(self) -> int:
        r"""Size of the hyperparameter vector ``theta`` this client expects."""
        return self._hyper.size

    def set_theta(self, theta: np.ndarray) -> None:
        r"""Adopt hyperparameters broadcast by the server (e.g. after a fit)."""
        self._hyper.set_theta(theta)

    def _summary(self) -> SparseSummary:
        h, tf = self._hyper, self._input_transform
        _, L = support_factor(self._support, h.covar_module, self._jitter, tf)
        return compute_local_summary(
            self._X,
            self._Y,
            self._support,
            h.covar_module,
            h.likelihood,
            h.mean_module,
            support_chol=L,
            input_transform=tf,
        )

    def summary(self, theta: np.ndarray) -> np.ndarray:
        r"""Round 1: the packed whitened summary at hyperparameters ``theta``.

        Args:
            theta: The raw hyperparameter vector broadcast by the server.

        Returns:
            The float64 packed summary (``SparseSummary.packed_length(m)``).
        """
        self._hyper.set_theta(theta)
        self._packed = self._summary().pack()
        return self._packed.detach().cpu().double().numpy()

    def vjp(self, adjoint: np.ndarray) -> np.ndarray:
        r"""Round 2: ``adjoint' d(packed summary)/d theta`` at the last ``theta``.

        Args:
            adjoint: The server's adjoint of the packed summary sum.

        Returns:
            The float64 vector-Jacobian product (size of ``theta``).
        """
        if self._packed is None:
            raise RuntimeError("`vjp` called before `summary`: no forward pass to differentiate.")
        packed, self._packed = self._packed, None
        adjoint_t = torch.as_tensor(np.asarray(adjoint, dtype=np.float64)).to(packed)
        if adjoint_t.shape != packed.shape:
            raise ValueError(
                f"`adjoint` must have shape {tuple(packed.shape)}, got {tuple(adjoint_t.shape)}."
            )
        params = list(self._hyper.parameters.values())
        grads = torch.autograd.grad(packed, params, grad_outputs=adjoint_t, allow_unused=True)
        return self._hyper.flat_grad(grads)

    def fit_local(self, theta: np.ndarray | None = None, seed: int | None = None) -> np.ndarray:
        r"""Fit an exact GP to the local data; return ``[n * values, n]``.

        The fit is :func:`~botorch_fed.models.exact_gp.fit_exact_gp` on this client's
        copy of the shared modules (fitted in place), without outcome transform.

        Args:
            theta: Optional raw starting point broadcast by the server.
            seed: Seed of the fit's random restarts (``None``: BoTorch's behaviour,
                drawing from torch's global RNG).

        Returns:
            The client-size-weighted natural hyperparameter values followed by the
            client size, ready to be summed by the aggregator.
        """
        if theta is not None:
            self._hyper.set_theta(theta)
        h = self._hyper
        X = self._X
        if self._input_transform is not None:  # fitted in the transformed space
            X = self._input_transform.preprocess_transform(X.to(torch.float64)).to(X)
        fit_exact_gp(
            X,
            self._Y,
            seed=seed,
            likelihood=h.likelihood,
            covar_module=h.covar_module,
            # no mean module is the PITC model's zero mean (SingleTaskGP would add a
            # constant one)
            mean_module=ZeroMean() if h.mean_module is None else h.mean_module,
            outcome_transform=None,
        )
        n = float(self.num_data)
        return np.concatenate([n * h.get_values(), [n]])


@dataclass
class FederatedFitResult:
    r"""Outcome of a federated hyperparameter fit.

    Attributes:
        loss: Final ``-(log p(y) + log prior) / n``.
        success: Whether the optimiser reported convergence.
        message: The optimiser's message.
        num_evaluations: Objective evaluations.
        num_rounds: Aggregation rounds used (two per evaluation).
    """

    loss: float
    success: bool
    message: str
    num_evaluations: int
    num_rounds: int


def pitc_loss_and_adjoint(
    packed_sum: np.ndarray, num_support: int, hyper: PITCHyperparameters, include_prior: bool = True
) -> tuple[float, np.ndarray, np.ndarray]:
    r"""Server side of one objective evaluation.

    Args:
        packed_sum: The aggregated packed summary at the current ``theta``.
        num_support: Number of support points ``m``.
        hyper: The server's hyperparameters, set to the current ``theta`` (for the
            prior term).
        include_prior: Whether to add the modules' log priors.

    Returns:
        ``(loss, adjoint, prior_grad)``: the loss
        ``-(log p(y) + log prior) / n``, its gradient with respect to the packed
        sum (to broadcast for round 2), and the prior's contribution to
        ``d loss / d theta``.
    """
    packed = torch.as_tensor(np.asarray(packed_sum, dtype=np.float64)).requires_grad_(True)
    summary = SparseSummary.unpack(packed, num_support)
    n = float(summary.num_data.detach())
    if not n >= 1:
        raise ValueError(f"The aggregated summary reports {n} observations; need >= 1.")
    loss = -pitc_log_marginal_likelihood(summary) / n
    (adjoint,) = torch.autograd.grad(loss, packed)
    prior_grad = np.zeros(hyper.size)
    if include_prior:
        params = list(hyper.parameters.values())
        log_prior = hyper.log_prior()
        if log_prior.requires_grad:
            grads = torch.autograd.grad(-log_prior / n, params, allow_unused=True)
            prior_grad = hyper.flat_grad(grads)
        loss = loss - log_prior.detach() / n
    return float(loss.detach()), adjoint.numpy(), prior_grad


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
    r"""Exact federated type-II ML for the PITC model (two rounds per evaluation).

    The given modules are updated in place with the fitted hyperparameters (as
    ``fit_gpytorch_mll`` does for a model). The clients end at the fitted values.

    Args:
        clients: The client endpoints (each holds its own data).
        support: ``m x d`` shared support set.
        covar_module: The server's kernel (its values are the starting point).
        likelihood: The server's ``GaussianLikelihood``.
        mean_module: The server's mean (``None``: zero mean).
        aggregate: ``list of arrays -> their sum``; default plaintext sum. A secure
            backend's aggregation function plugs in here.
        include_prior: Add the modules' priors (MAP, as BoTorch's default fit).
        maxiter: Maximum L-BFGS-B iterations.
        gtol: Projected-gradient tolerance of L-BFGS-B.

    Returns:
        A :class:`FederatedFitResult`.
    """
    if len(clients) == 0:
        raise ValueError("`clients` is empty: a federation needs clients.")
    aggregate = sum_arrays if aggregate is None else aggregate
    hyper = PITCHyperparameters(covar_module, likelihood, mean_module)
    for i, c in enumerate(clients):
        if c.num_hyperparameters != hyper.size:
            raise ValueError(
                f"Client {i} has {c.num_hyperparameters} hyperparameters but the server's modules "
                f"have {hyper.size}: the module structures differ."
            )
    m = support.shape[0]
    evaluations = 0

    def objective(theta: np.ndarray) -> tuple[float, np.ndarray]:
        nonlocal evaluations
        evaluations += 1
        hyper.set_theta(theta)
        packed_sum = aggregate([c.summary(theta) for c in clients])
        loss, adjoint, grad = pitc_loss_and_adjoint(packed_sum, m, hyper, include_prior)
        grad = grad + aggregate([c.vjp(adjoint) for c in clients])
        return loss, grad

    result = minimize(
        objective,
        hyper.get_theta(),
        jac=True,
        method="L-BFGS-B",
        bounds=hyper.bounds,
        options={"maxiter": maxiter, "gtol": gtol},
    )
    hyper.set_theta(result.x)
    for c in clients:
        c.set_theta(result.x)
    return FederatedFitResult(
        loss=float(result.fun),
        success=bool(result.success),
        message=str(result.message),
        num_evaluations=evaluations,
        num_rounds=2 * evaluations,
    )


def fit_local_average(
    clients: Sequence[PITCFitClient],
    covar_module: Kernel,
    likelihood: Likelihood,
    mean_module: Mean | None = None,
    aggregate: Aggregate | None = None,
) -> np.ndarray:
    r"""Average of locally fitted hyperparameters (one aggregation round).

    Each client fits an exact GP (MAP, BoTorch's default fit) to its own data
    starting from the server's hyperparameters; the server sets its modules to the
    client-size-weighted average of the natural-space values (lengthscales, noise,
    ...) and the clients adopt them.

    Args:
        clients: The client endpoints.
        covar_module: The server's kernel (updated in place).
        likelihood: The server's likelihood (updated in place).
        mean_module: The server's mean (updated in place; ``None``: zero mean).
        aggregate: ``list of arrays -> their sum``; default plaintext sum.

    Returns:
        The averaged natural-space hyperparameter values.
    """
    if len(clients) == 0:
        raise ValueError("`clients` is empty: a federation needs clients.")
    aggregate = sum_arrays if aggregate is None else aggregate
    hyper = PITCHyperparameters(covar_module, likelihood, mean_module)
    theta = hyper.get_theta()
    total = aggregate([c.fit_local(theta) for c in clients])
    values = total[:-1] / total[-1]
    hyper.set_values(values)
    theta = hyper.get_theta()
    for c in clients:
        c.set_theta(theta)
    return values
