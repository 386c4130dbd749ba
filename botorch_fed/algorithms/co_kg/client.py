r"""The Co-KG agent: private data, its own GP, its discretised posterior on the support
(Zhan et al., "Collaborative Bayesian optimization via Wasserstein barycenters", paper
001, Alg. 1)."""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from botorch_fed.algorithms.co_kg import messages as msg
from botorch_fed.algorithms.co_kg.settings import (
    MIN_CLUSTER_SIZE,
    MIN_SECURE_AGENTS,
    CollaborativeSettings,
)
from botorch_fed.inducing import local_centers
from botorch_fed.models import exact_gp_state, fit_exact_gp
from botorch_fed.models.rbf_prior import nearest_psd, original_hyperparameters
from botorch_fed.protocol.bo_client import BOClient
from botorch_fed.protocol.checkpoint import CheckpointError, check_tensor, split_state
from botorch_fed.protocol.declarations import ProtocolViolation, contributes, handles
from botorch_fed.protocol.secure_sum import SecureSumStep

UNARMED = "a secure mean without a posterior request"


class CoKGClient(BOClient):
    r"""A Co-KG agent: private data, its own GP, its discretised posterior.

    Handlers check what depends on its state: each round's posterior once, in order;
    one evaluation per posterior; only the settings' grid or Sobol support; centres for
    k-means only; one masked sum of ``mu_n / M`` over all agents per secure posterior.

    Args:
        *args: As :class:`BOClient`.
        support_seed: The run's public seed: the Sobol support it expects.
        num_agents: ``M``, the federation's size (ids ``0..M-1``); required, at least
            3, with ``mean_aggregation="secure"``.
        **kwargs: As :class:`BOClient`.
    """

    # BOClient reads the fields it uses, which CollaborativeSettings shares
    settings: CollaborativeSettings  # type: ignore[assignment]

    def __init__(
        self, *args, support_seed: int = 0, num_agents: int | None = None, **kwargs
    ) -> None:
        super().__init__(*args, **kwargs)
        M = num_agents
        if self.settings.hides_means():
            if isinstance(M, bool) or not isinstance(M, int) or M < MIN_SECURE_AGENTS:
                raise ValueError(
                    f"`num_agents`={M!r}: the secure mean needs M >= {MIN_SECURE_AGENTS}."
                )
            if not 0 <= self.client_id < M:
                raise ValueError(f"`client_id`={self.client_id} is not one of the agents 0..{M}-1.")
        self.num_agents, self.support_seed = M, int(support_seed)
        self.support: Tensor | None = None
        self._assigned_round: int | None = None  # the round whose point it may evaluate
        # the armed secure sum's vector mu_n / M (a posterior request arms one sum)
        self._contribution: np.ndarray | None = None

    def state_dict(self) -> dict:
        r"""Adds the support and the round whose point it may evaluate (a hidden mean
        is never state)."""
        state = {"support": self.support, "assigned_round": self._assigned_round}
        return {**super().state_dict(), **state}

    def load_state_dict(self, state: dict) -> None:
        owner = f"Client {self.client_id}"
        own, rest = split_state(owner, state, ("support", "assigned_round"))
        super().load_state_dict(rest)
        support, assigned = own["support"], own["assigned_round"]
        if support is not None:
            support = check_tensor(owner, "support", support, (None, self.dim)).clone()
        if assigned is not None and (isinstance(assigned, bool) or not isinstance(assigned, int)):
            raise CheckpointError(f"{owner}: `assigned_round` must be an int or None.")
        self.support, self._assigned_round, self._contribution = support, assigned, None

    def next_round_problem(self, t: int, last: int) -> str | None:
        r"""Every round asks every agent: no round is skipped."""
        return None if t == last + 1 else f"round t={t}, but no round is skipped after {last}"

    @handles(msg.Centers)
    def on_centers(self, message: msg.Centers) -> dict:
        r"""The k-means centres of this agent's inputs (of clusters of at least
        :data:`MIN_CLUSTER_SIZE` points)."""
        if (kind := self.settings.support_kind(self.dim)) != "kmeans":
            raise self.violation(f"the support is the public {kind} support: no centres", "centers")
        if len(self.X) < MIN_CLUSTER_SIZE:
            return {"centers": np.empty((0, self.dim))}
        with self.timed("support"):
            centers = local_centers(
                self.X, k=message.k, seed=self.seed, min_cluster_size=MIN_CLUSTER_SIZE
            )
        return {"centers": centers.numpy()}

    @handles(msg.Support)
    def on_support(self, message: msg.Support) -> dict:
        r"""Keep the support; a grid or Sobol support must be the settings' own."""
        support = torch.as_tensor(message.support)
        expected = self.settings.public_support(self.dim, self.support_seed)
        if expected is not None and not torch.equal(support, expected):
            kind = self.settings.support_kind(self.dim)
            raise self.violation(f"the support differs from the {kind} support", "support")
        self.support = support
        return {}

    def posterior_summary(self) -> dict[str, Tensor]:
        r"""This agent's discretised posterior on the support (what it shares).

        Returns:
            ``mean`` (``s``), ``covariance`` (``s x s``, latent), ``lengthscale``
            (``d``), ``outputscale``, ``noise``, ``mean_constant``, in original units.
        """
        if self.support is None:
            raise ProtocolViolation(f"Client {self.client_id} holds no support yet.")
        model = self.local_model()
        with self.timed("summary"), torch.no_grad():
            posterior = model.posterior(self.support)
            mean = posterior.mean.reshape(-1).to(torch.float64)
            # a GPyTorchPosterior with Standardize or no transform
            C = posterior.covariance_matrix  # type: ignore[union-attr]
            covariance = nearest_psd(C.to(torch.float64).reshape(len(mean), -1))
            return {"mean": mean, "covariance": covariance, **original_hyperparameters(model)}

    @handles(msg.Posterior)
    def on_posterior(self, message: msg.Posterior) -> dict:
        r"""Round ``t``: the posterior (the mean only in clear mode), the number of
        observations and the local optimum; arms one evaluation (and secure sum)."""
        if self.support is None:
            raise self.violation("no support yet (the support comes before round 1)", "posterior")
        t = self.accept_round(message.t, "posterior")
        secure, contribution = self.settings.hides_means(), np.zeros(len(self.support))
        reply: dict = {"num_data": 0}
        if len(self.X):  # else every evaluation failed so far: no posterior of its own
            summary = self.posterior_summary()
            mean = summary.pop("mean")
            reply = {**self._optimum(mean), **{k: v.numpy() for k, v in summary.items()}}
            if not secure:
                reply["mean"] = mean.numpy()
            else:
                assert self.num_agents is not None  # checked at construction
                contribution = (1.0 / self.num_agents) * mean.numpy()
        self._assigned_round = t
        self._contribution = contribution if secure else None
        return reply

    def on_secagg(self, message: SecureSumStep) -> dict:
        r"""A secure-sum step; a ``weighted_mean`` session must answer a posterior
        request and run on masking over all ``M`` agents (the backend's authenticated
        session, not the server's ``clients`` argument); it spends the request."""
        request = message.request
        if request != msg.WEIGHTED_MEAN:
            return super().on_secagg(message)
        backend = getattr(getattr(self.secagg, "backend", None), "name", None)
        if backend != "masking":
            raise self.violation(f"a secure mean through the {backend!r} backend", request)
        if self._contribution is None:
            raise self.violation(UNARMED, request)
        try:
            reply = super().on_secagg(message)
        finally:
            self._contribution = None
        session = tuple(int(c) for c in getattr(self.secagg, "client_ids", ()))
        if session != tuple(range(self.num_agents or 0)):
            self._pending = self._request = None  # nothing of it leaves this agent
            clients = list(session)
            raise self.violation(
                f"the secure-sum session runs over clients {clients}, not all", request
            )
        return reply

    @contributes(msg.WEIGHTED_MEAN, args=msg.WeightedMean)
    def vector_weighted_mean(self, weights: np.ndarray, clients: np.ndarray) -> np.ndarray:
        r"""``mu_n / M`` (the agent's own ``M``; zeros without data), once per posterior
        request (else :class:`ProtocolViolation`)."""
        contribution, self._contribution = self._contribution, None  # one sum per request
        if contribution is None:
            raise self.violation(UNARMED, msg.WEIGHTED_MEAN)
        return contribution

    @handles(msg.Evaluate)
    def on_evaluate(self, message: msg.Evaluate) -> dict:
        r"""Evaluate the point of the round of this agent's last posterior, once; a
        hidden mean not summed by now is dropped."""
        if self._assigned_round != message.t:
            last = self._assigned_round
            raise self.violation(
                f"round {message.t}, but the last posterior was for round {last}", "evaluate"
            )
        self._assigned_round = self._contribution = None
        x = torch.as_tensor(message.x).reshape(1, self.dim)
        # the server's models never learn of a failed point: do not evaluate it again
        self.evaluate(self.avoid_failures(x), message.t, "collaborative")
        return {}

    @handles(msg.Optimum)
    def on_optimum(self, message: msg.Optimum) -> dict:
        r"""Alg. 1 line 10: the largest posterior mean on the support, refitted on all
        data."""
        if len(self.X) == 0 or self.support is None:
            return {"num_data": 0}
        with self.timed("local_fit"):
            warm = exact_gp_state(self.local_model())
            model = fit_exact_gp(
                self.X, self.Y, seed=self.seed, warm_start=warm, maxiter=self.settings.fit_maxiter
            )
        with self.timed("summary"), torch.no_grad():
            return self._optimum(model.posterior(self.support).mean.reshape(-1))

    def _optimum(self, mean: Tensor) -> dict:
        best = int(mean.argmax())
        return {"num_data": len(self.X), "best_index": best, "best_value": float(mean[best])}
