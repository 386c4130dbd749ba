r"""The PITC marginal likelihood as a gpytorch ``MarginalLogLikelihood``.

:class:`~botorch_fed.models.FederatedPITCGP` holds no training data, so BoTorch's
``fit_gpytorch_mll`` cannot fit it through ``ExactMarginalLogLikelihood``. When all
clients' data are at hand in one process (simulations, tests, tutorials),
:class:`PITCMarginalLogLikelihood` holds them and gives ``fit_gpytorch_mll`` the
objective that :func:`~botorch_fed.protocol.federated_fit.fit_federated_pitc` optimises
in a real federation: ``-(log p(y) + log prior(theta)) / n`` with ``log p(y)`` the exact PITC
marginal likelihood (one block per client, :func:`pitc_log_marginal_likelihood`).
(``fit_gpytorch_mll`` also fits the parameters, and adds the priors, of an input
transform such as ``Warp``; ``fit_federated_pitc`` fits the kernel, likelihood and
mean only.)
When the fit ends (``mll.eval()``) it recomputes the model's summary at the fitted
hyperparameters, so the model predicts with them.

Example:
    >>> model = FederatedPITCGP.from_client_data(clients, S, covar, likelihood)
    >>> mll = PITCMarginalLogLikelihood(model.likelihood, model, clients)
    >>> fit_gpytorch_mll(mll)  # model now holds the fitted summary
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from gpytorch.likelihoods import Likelihood
from gpytorch.mlls import MarginalLogLikelihood
from torch import Tensor

from botorch_fed.models.local_summary import compute_local_summary, local_summary
from botorch_fed.models.pitc import FederatedPITCGP
from botorch_fed.models.pitc_inputs import _check_client_data, transform_outcomes
from botorch_fed.models.sparse_summary import SparseSummary, pitc_log_marginal_likelihood
from botorch_fed.models.support_set import support_factor, transform_support_inputs


class PITCMarginalLogLikelihood(MarginalLogLikelihood):
    r"""Exact PITC type-II marginal likelihood of a ``FederatedPITCGP`` from pooled data.

    Args:
        likelihood: The model's likelihood (``model.likelihood``).
        model: The ``FederatedPITCGP`` whose hyperparameters are fitted.
        client_data: One ``(train_X, train_Y)`` pair per client (``n_i x d``,
            ``n_i x 1``) in the original spaces, as given to
            ``FederatedPITCGP.from_client_data``; the model's transforms are applied.
    """

    def __init__(
        self,
        likelihood: Likelihood,
        model: FederatedPITCGP,
        client_data: Sequence[tuple[Tensor, Tensor]],
    ) -> None:
        if not isinstance(model, FederatedPITCGP):
            raise TypeError(f"`model` must be a FederatedPITCGP, got {type(model).__name__}.")
        if likelihood is not model.likelihood:
            raise ValueError("`likelihood` must be the model's likelihood (`model.likelihood`).")
        super().__init__(likelihood, model)
        self.client_data = _check_client_data(client_data)
        with torch.no_grad():  # validate every client's data once, with clear errors
            for X, Y in self._outcome_transformed():
                compute_local_summary(
                    X,
                    Y,
                    model.support,
                    model.covar_module,
                    model.likelihood,
                    model.mean_module,
                    jitter=model._jitter,
                    input_transform=getattr(model, "input_transform", None),
                )

    def _outcome_transformed(self) -> list[tuple[Tensor, Tensor]]:
        return transform_outcomes(self.client_data, getattr(self.model, "outcome_transform", None))

    def summary(self) -> SparseSummary:
        r"""The summed summary of all clients at the current hyperparameters
        (differentiable in them)."""
        model = self.model
        tf = getattr(model, "input_transform", None)
        S, L = support_factor(model.support, model.covar_module, model._jitter, tf)
        return SparseSummary.sum(
            local_summary(
                transform_support_inputs(X.to(torch.float64), tf),
                Y,
                S,
                L,
                model.covar_module,
                model.likelihood,
                model.mean_module,
            )
            for X, Y in self._outcome_transformed()
        )

    def compute_custom_loss(self, **kwargs: Any) -> Tensor:
        r"""The loss ``fit_gpytorch_mll`` minimises: ``-(log p(y) + log prior) / n``.

        BoTorch's loss closures call this instead of ``mll(model(train_X), train_Y)``.

        Returns:
            A 0-dim float64 tensor (summed over model batches, as BoTorch's closures
            reduce the MLL).
        """
        total = self.summary()
        log_prior = sum(
            (
                prior.log_prob(closure(module)).sum().to(torch.float64)
                for _, module, prior, closure, _ in self.model.named_priors()
            ),
            torch.zeros((), dtype=torch.float64, device=total.b.device),
        )
        return (-(pitc_log_marginal_likelihood(total) + log_prior) / total.num_data).sum()

    def forward(self, *args: Any, **kwargs: Any) -> Tensor:
        r"""The normalised log marginal likelihood ``(log p(y) + log prior) / n``.

        Any arguments are ignored: the data are the clients' (``client_data``).
        """
        return -self.compute_custom_loss()

    def train(self, mode: bool = True) -> PITCMarginalLogLikelihood:
        r"""Set the mode; switching to eval (the end of ``fit_gpytorch_mll``) gives the
        model the summary at the current hyperparameters."""
        super().train(mode)
        if not mode:
            with torch.no_grad():
                self.model.update_summary(self.summary())
        return self
