r"""The client's side of the federated PITC hyperparameter fit, and its loss.

:class:`PITCHyperparameters` maps the kernel, likelihood and mean to one raw vector
``theta``; :class:`PITCFitClient` holds a client's data and returns its packed summary
at ``theta``, that summary's Jacobian, the vector-Jacobian product of that summary with an
adjoint, or its own exact-GP fit; :func:`pitc_loss_and_adjoint` is the loss
``-(log p(y) + log prior) / n`` at summed summaries and its adjoint. The fit itself,
which sums over clients, is :mod:`botorch_fed.protocol.federated_fit`.
"""

from __future__ import annotations

from collections.abc import Sequence
from copy import deepcopy

import numpy as np
import torch
from botorch.models.transforms.input import InputTransform
from botorch.optim.utils import get_parameters_and_bounds
from botorch.optim.utils.numpy_utils import get_bounds_as_ndarray
from gpytorch import Module as GPyTorchModule
from gpytorch.kernels import Kernel
from gpytorch.likelihoods import Likelihood
from gpytorch.means import Mean, ZeroMean
from torch import Tensor

from botorch_fed.models.exact_gp import fit_exact_gp
from botorch_fed.models.local_summary import compute_local_summary
from botorch_fed.models.sparse_summary import SparseSummary, pitc_log_marginal_likelihood
from botorch_fed.models.support_set import check_input_transform, support_factor


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


def _flat(grads, params, like: Tensor) -> Tensor:
    return torch.cat(
        [
            like.new_zeros(p.numel()) if g is None else g.reshape(-1)
            for p, g in zip(params, grads, strict=True)
        ]
    )


def _jacobian_by_columns(packed: Tensor, params: list) -> Tensor:
    r"""``d packed / d params`` (``L x P``): ``J' u`` for a symbolic ``u`` (linear in it),
    then one backward pass per column (the derivative of ``(J' u)_i`` in ``u`` is column
    ``i``): about three vector-Jacobian products per parameter, whatever ``L``."""
    u = torch.zeros_like(packed, requires_grad=True)
    grads = torch.autograd.grad(
        packed, params, grad_outputs=u, create_graph=True, allow_unused=True
    )
    product = _flat(grads, params, packed)
    columns = []
    for i in range(product.numel()):
        column = None
        if product[i].requires_grad:  # else the summary does not depend on it
            (column,) = torch.autograd.grad(product[i], u, retain_graph=True, allow_unused=True)
        columns.append(torch.zeros_like(packed) if column is None else column)
    return torch.stack(columns, dim=1).detach()


def _jacobian_by_rows(packed: Tensor, params: list, chunk: int = 128) -> Tensor:
    r"""``d packed / d params`` by batched vector-Jacobian products of ``chunk`` rows at a
    time (for graphs without a double backward; ``L`` backward passes in all)."""
    rows = []
    for start in range(0, packed.numel(), chunk):
        count = min(chunk, packed.numel() - start)
        onehot = packed.new_zeros(count, packed.numel())  # rows start.. of the identity
        onehot[torch.arange(count), torch.arange(start, start + count)] = 1.0
        grads = torch.autograd.grad(
            packed,
            params,
            grad_outputs=onehot,
            is_grads_batched=True,
            retain_graph=True,
            allow_unused=True,
        )
        rows.append(
            torch.cat(
                [
                    packed.new_zeros(count, p.numel()) if g is None else g.reshape(count, -1)
                    for p, g in zip(params, grads, strict=True)
                ],
                dim=1,
            )
        )
    return torch.cat(rows, dim=0).detach()


class PITCFitClient:
    r"""Client side of the federated hyperparameter fit (holds the private data).

    The client keeps its data and its own copy of the shared modules; it only ever
    returns packed summaries, their Jacobians (``L x P``: more than a vector-Jacobian
    product reveals, see docs/security.md), vector-Jacobian products and (for the
    averaging strategy) its locally fitted hyperparameter values.

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

    def summary_and_jacobian(self, theta: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        r"""The packed summary at ``theta`` and its Jacobian ``d(packed)/d theta``.

        Summed over clients, both give every party the loss and its gradient at
        ``theta`` (``J' adjoint``) and a first-order model of the summed summary near it,
        in one secure sum instead of a summary sum followed by a product sum.

        Args:
            theta: The raw hyperparameter vector (``num_hyperparameters``).

        Returns:
            ``(packed, jacobian)``: float64 arrays ``L`` and ``L x num_hyperparameters``
            (``L = SparseSummary.packed_length(m)``).
        """
        self._hyper.set_theta(theta)
        with torch.enable_grad():  # also under a caller's no_grad
            packed = self._summary().pack()
        params = list(self._hyper.parameters.values())
        try:
            jacobian = _jacobian_by_columns(packed, params)
        except (NotImplementedError, RuntimeError):  # no double backward (Matern's cdist)
            jacobian = _jacobian_by_rows(packed, params)
        self._packed = None
        return packed.detach().cpu().double().numpy(), jacobian.cpu().double().numpy()

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
            client size, to be summed over clients.
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


def pitc_loss_and_adjoint(
    packed_sum: np.ndarray, num_support: int, hyper: PITCHyperparameters, include_prior: bool = True
) -> tuple[float, np.ndarray, np.ndarray]:
    r"""The loss at summed summaries and its adjoint.

    Args:
        packed_sum: The summed packed summaries at the current ``theta``.
        num_support: Number of support points ``m``.
        hyper: The hyperparameters, set to the current ``theta`` (for the prior term).
        include_prior: Whether to add the modules' log priors.

    Returns:
        ``(loss, adjoint, prior_grad)``: ``-(log p(y) + log prior) / n``, its gradient
        with respect to the packed sum, and the prior's part of ``d loss / d theta``.
    """
    packed = torch.as_tensor(np.asarray(packed_sum, dtype=np.float64)).requires_grad_(True)
    summary = SparseSummary.unpack(packed, num_support)
    n = float(summary.num_data.detach())
    if not n >= 1:
        raise ValueError(f"The summed summaries report {n} observations; need >= 1.")
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
