r"""The Co-KG agent: private data, its own GP, its discretised posterior on the support."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from botorch.exceptions.errors import UnsupportedError
from botorch.models import SingleTaskGP
from gpytorch.kernels import RBFKernel, ScaleKernel
from torch import Tensor

from botorch_fed.algorithms.co_kg.messages import (
    WEIGHTED_MEAN,
    Centers,
    Evaluate,
    Optimum,
    Posterior,
    Support,
    WeightedMean,
)
from botorch_fed.algorithms.co_kg.settings import (
    MIN_CLUSTER_SIZE,
    MIN_SECURE_AGENTS,
    CollaborativeSettings,
    public_support,
    support_kind,
)
from botorch_fed.inducing import local_centers
from botorch_fed.models import exact_gp_state, fit_exact_gp
from botorch_fed.protocol.bo_client import BOClient
from botorch_fed.protocol.checkpoint import CheckpointError, check_tensor, split_state
from botorch_fed.protocol.declarations import ProtocolViolation, contributes, handles
from botorch_fed.protocol.secure_sum import SecureSumStep

STEP = "collaborative"  # the history's step name of an assigned evaluation


def original_hyperparameters(model: SingleTaskGP) -> dict[str, Tensor]:
    r"""A fitted ``SingleTaskGP``'s hyperparameters in original outcome units.

    With BoTorch's defaults (RBF kernel on outcomes standardised with mean ``m_y`` and
    std ``s_y``) the prior in original units is ``GP(m_y + s_y c, s_y^2 k_RBF)`` and the
    noise variance ``s_y^2 sigma^2``.

    Args:
        model: The agent's model (RBF or scaled RBF kernel, constant mean, Gaussian
            likelihood, optional ``Standardize``).

    Returns:
        ``lengthscale`` (``d``), ``outputscale``, ``noise`` and ``mean_constant``
        (0-dim), float64.

    Raises:
        UnsupportedError: Another kernel or outcome transform.
    """
    covar = model.covar_module
    scale = torch.ones((), dtype=torch.float64)
    if isinstance(covar, ScaleKernel):
        scale = covar.outputscale.detach().to(torch.float64).reshape(())
        covar = covar.base_kernel
    if not isinstance(covar, RBFKernel):
        raise UnsupportedError(
            f"Co-KG's shared prior is an RBF kernel; the agent's model has a "
            f"{type(covar).__name__}."
        )
    d = model.train_inputs[0].shape[-1]
    lengthscale = covar.lengthscale.detach().to(torch.float64).reshape(-1).expand(d).clone()
    noise = model.likelihood.noise.detach().to(torch.float64).reshape(-1)[0]
    constant = model.mean_module.constant.detach().to(torch.float64).reshape(())
    mean_y, std_y = torch.zeros((), dtype=torch.float64), torch.ones((), dtype=torch.float64)
    transform = getattr(model, "outcome_transform", None)
    if transform is not None:
        if not hasattr(transform, "stdvs"):
            raise UnsupportedError(
                f"Co-KG reads a Standardize outcome transform, got {type(transform).__name__}."
            )
        mean_y = transform.means.detach().to(torch.float64).reshape(())
        std_y = transform.stdvs.detach().to(torch.float64).reshape(())
    return {
        "lengthscale": lengthscale,
        "outputscale": scale * std_y**2,
        "noise": noise * std_y**2,
        "mean_constant": mean_y + std_y * constant,
    }


def _psd(C: Tensor) -> Tensor:
    r"""``C`` symmetrised; its negative eigenvalues clipped when rounding made it
    indefinite beyond the barycenter's tolerance."""
    C = 0.5 * (C + C.transpose(-1, -2))
    scale = C.diagonal().abs().max().clamp_min(1e-300)
    eye = torch.eye(C.shape[-1], dtype=C.dtype)
    if torch.linalg.cholesky_ex(C + 1e-13 * scale * eye).info == 0:
        return C
    evals, evecs = torch.linalg.eigh(C)
    C = (evecs * evals.clamp_min(0.0)) @ evecs.transpose(-1, -2)
    return 0.5 * (C + C.transpose(-1, -2))


class CoKGClient(BOClient):
    r"""A Co-KG agent: private data, its own GP, its discretised posterior.

    What the server sends is checked against its declaration
    (:mod:`~botorch_fed.algorithms.co_kg.messages`) before a handler runs; the handlers
    check what depends on the agent's state: a posterior request for each round
    ``1..num_rounds`` once and in order (:meth:`accept_round`), one evaluation per
    posterior sent, only the settings' grid or Sobol support, ``centers`` requests only
    for a k-means support. Under ``mean_aggregation="secure"`` the agent contributes
    ``mu_n / M`` to one masked sum over the whole federation per posterior request and
    forgets ``mu_n`` after it (or after the round).

    Args:
        *args: As :class:`BOClient` (``client_id``, ``objective``, ``settings``,
            ``seed``, ``secagg``: ``barycenter-qkg``'s secure-aggregation role, ...).
        support_seed: The run's public seed: the Sobol support it expects.
        num_agents: ``M``, the number of agents of the federation (ids ``0..M-1``):
            required with ``mean_aggregation="secure"`` (at least 3).
        **kwargs: As :class:`BOClient`.
    """

    # an agent's settings are CollaborativeSettings (which BOClient reads as BOSettings:
    # the fields it uses are the same)
    settings: CollaborativeSettings  # type: ignore[assignment]

    def __init__(
        self, *args, support_seed: int = 0, num_agents: int | None = None, **kwargs
    ) -> None:
        super().__init__(*args, **kwargs)
        M, secure = num_agents, self.settings.hides_means()
        if M is not None and (isinstance(M, bool) or not isinstance(M, int) or M < 1):
            raise ValueError(f"`num_agents` must be a positive integer or None, got {M!r}.")
        if secure and (M is None or M < MIN_SECURE_AGENTS):
            raise ValueError(
                f"`num_agents`={M!r}: an agent of `mean_aggregation`='secure' needs the "
                f"federation's size M >= {MIN_SECURE_AGENTS} (it weighs its own mean by 1/M "
                "and sums only over all M agents)."
            )
        # M is an int here: `secure` without one was refused just above
        if secure and not 0 <= self.client_id < M:  # type: ignore[operator]
            assert M is not None
            raise ValueError(
                f"`client_id`={self.client_id} is not one of the {M} agents 0..{M - 1}."
            )
        self.num_agents = M
        self.support_seed = int(support_seed)
        self.support: Tensor | None = None
        self._assigned_round: int | None = None  # the round whose point it may evaluate
        self._secure_armed = False  # a posterior request awaits its one secure sum
        self._hidden_mean: Tensor | None = None  # that request's mean (None: no data)

    def state_dict(self) -> dict:
        r"""Adds the support and the round whose point it may still evaluate to
        :meth:`BOClient.state_dict` (a hidden mean is never state: it lives from a
        posterior request to its secure sum or the end of the round)."""
        state = super().state_dict()
        state.update(
            support=None if self.support is None else self.support.clone(),
            assigned_round=self._assigned_round,
        )
        return state

    def load_state_dict(self, state: dict) -> None:
        owner = f"Client {self.client_id}"
        own, rest = split_state(owner, state, ("support", "assigned_round"))
        super().load_state_dict(rest)
        support, assigned = own["support"], own["assigned_round"]
        if support is not None:
            support = check_tensor(owner, "support", support, (None, self.dim)).clone()
        if assigned is not None and (isinstance(assigned, bool) or not isinstance(assigned, int)):
            raise CheckpointError(f"{owner}: `assigned_round` must be an int or None.")
        self.support, self._assigned_round = support, assigned
        self._disarm()

    def next_round_problem(self, t: int, last: int) -> str | None:
        r"""Every round asks every agent: ``t`` must be ``last + 1``."""
        if t != last + 1:
            return (
                f"round t={t}, but the next round of this agent is {last + 1} (no round is skipped)"
            )
        return None

    # --- support ------------------------------------------------------------------------
    @handles(Centers)
    def on_centers(self, message: Centers) -> dict:
        r"""The k-means centres of this agent's inputs (clusters of at least
        :data:`MIN_CLUSTER_SIZE` points; none while it holds fewer)."""
        kind = support_kind(self.settings, self.dim)
        if kind != "kmeans":
            raise self.violation(
                f"this run's support is the public {kind} support: no centres of the data",
                "centers",
            )
        if len(self.X) < MIN_CLUSTER_SIZE:
            return {"centers": np.empty((0, self.dim))}
        with self.timed("support"):
            centers = local_centers(
                self.X, k=message.k, seed=self.seed, min_cluster_size=MIN_CLUSTER_SIZE
            )
        return {"centers": centers.numpy()}

    @handles(Support)
    def on_support(self, message: Support) -> dict:
        r"""Keep the support; a grid or Sobol support must be the settings' own (a
        server that sends another, e.g. points clustered around this agent's data, is
        refused)."""
        support = torch.as_tensor(message.support)
        expected = public_support(self.settings, self.dim, self.support_seed)
        if expected is not None and not torch.equal(support, expected):
            kind = support_kind(self.settings, self.dim)
            raise self.violation(
                f"the support differs from the {kind} support of the settings", "support"
            )
        self.support = support
        return {}

    # --- the round -----------------------------------------------------------------------
    def posterior_summary(self) -> dict[str, Tensor]:
        r"""This agent's discretised posterior on the support (what it shares).

        Returns:
            ``mean`` (``s``), ``covariance`` (``s x s``, latent), ``lengthscale``
            (``d``), ``outputscale``, ``noise``, ``mean_constant`` -- original outcome
            units, in the agents' maximisation convention.
        """
        if self.support is None:
            raise ProtocolViolation(f"Client {self.client_id} holds no support yet.")
        model = self.local_model()
        with self.timed("summary"), torch.no_grad():
            posterior = model.posterior(self.support)
            mean = posterior.mean.reshape(-1).to(torch.float64)
            # botorch's stub: SingleTaskGP.posterior may be a TransformedPosterior; with
            # Standardize (or no transform) it is a GPyTorchPosterior
            covariance = _psd(posterior.covariance_matrix.to(torch.float64).reshape(len(mean), -1))  # type: ignore[union-attr]
            return {"mean": mean, "covariance": covariance, **original_hyperparameters(model)}

    @handles(Posterior)
    def on_posterior(self, message: Posterior) -> dict:
        r"""Round ``t``: the discretised posterior (the mean only in clear mode), the
        number of observations and the local optimum on the support; arms one
        evaluation (and, with the secure mean, one secure sum)."""
        if self.support is None:
            raise self.violation("no support yet (the support comes before round 1)", "posterior")
        t = self.accept_round(message.t, "posterior")
        mean = None
        if len(self.X) == 0:  # every evaluation failed so far: no posterior of its own
            reply: dict[str, Any] = {"num_data": 0}
        else:
            summary = self.posterior_summary()
            mean = summary.pop("mean")
            best = int(mean.argmax())
            reply = {
                "num_data": len(self.X),
                "best_index": best,
                "best_value": float(mean[best]),
                **{k: v.numpy() for k, v in summary.items()},
            }
            if not self.settings.hides_means():
                reply["mean"] = mean.numpy()
        self._assigned_round = t
        self._secure_armed = self.settings.hides_means()
        self._hidden_mean = mean if self._secure_armed else None
        return reply

    def _check_armed(self) -> None:
        if not self._secure_armed:
            raise self.violation(
                "a secure mean without a posterior request (each request answers one sum)",
                WEIGHTED_MEAN,
            )

    def _disarm(self) -> None:
        self._secure_armed, self._hidden_mean = False, None

    def on_secagg(self, message: SecureSumStep) -> dict:
        r"""A secure-sum step. A ``weighted_mean`` session must answer a posterior
        request of the secure mean and run on the masking backend over all
        ``num_agents`` agents (the session's own client list, which the backend
        authenticates, not only the ``clients`` argument the server names); it spends
        the request, refused or not."""
        if message.request != WEIGHTED_MEAN:
            return super().on_secagg(message)
        backend = getattr(getattr(self.secagg, "backend", None), "name", None)
        if backend != "masking":
            raise self.violation(
                f"a secure mean through the {backend!r} backend (only masking hides the "
                "inputs from the server)",
                WEIGHTED_MEAN,
            )
        self._check_armed()
        try:
            reply = super().on_secagg(message)
        finally:
            self._disarm()
        session = tuple(int(c) for c in getattr(self.secagg, "client_ids", ()))
        assert self.num_agents is not None  # armed: the secure mean, which needs M
        if session != tuple(range(self.num_agents)):
            self._pending = self._request = None  # nothing of it leaves this agent
            raise self.violation(
                f"the secure-sum session runs over clients {list(session)}, not the whole "
                f"federation 0..{self.num_agents - 1}",
                WEIGHTED_MEAN,
            )
        return reply

    @contributes(WEIGHTED_MEAN, args=WeightedMean)
    def vector_weighted_mean(self, weights: np.ndarray, clients: np.ndarray) -> np.ndarray:
        r"""``mu_n / M`` for the secure sum of the uniform barycenter mean (zeros
        without data: the server adds the prior's share itself). The arguments are
        checked against :class:`~botorch_fed.algorithms.co_kg.messages.WeightedMean`
        (the whole federation, ``1/M`` each); the weight is this agent's own ``1/M``.

        Raises:
            ProtocolViolation: No posterior request armed this sum (or it was used).
        """
        self._check_armed()
        # armed: a posterior request (after the support) of the secure mean (which needs M)
        assert self.support is not None and self.num_agents is not None
        mean = self._hidden_mean
        self._disarm()  # one sum per posterior request
        if mean is None:
            return np.zeros(len(self.support))
        return (1.0 / self.num_agents) * mean.numpy()

    @handles(Evaluate)
    def on_evaluate(self, message: Evaluate) -> dict:
        r"""Evaluate the server's point of the round of this agent's last posterior
        (once); the round ends here, and a hidden mean not summed by now is dropped (as
        a resumed agent, which never holds one, would)."""
        t = message.t
        if self._assigned_round != t:
            raise self.violation(
                f"an evaluation for round {t}, but this agent's last posterior was for "
                f"round {self._assigned_round}",
                "evaluate",
            )
        self._assigned_round = None
        self._disarm()
        x = torch.as_tensor(message.x).reshape(1, self.dim)
        # the server's models never learn of a failed point: do not evaluate it again
        self.evaluate(self.avoid_failures(x), t, STEP)
        return {}

    @handles(Optimum)
    def on_optimum(self, message: Optimum) -> dict:
        r"""Alg. 1 line 10: this agent's local optimum (largest posterior mean on the
        support), hyperparameters refitted on all its data."""
        if len(self.X) == 0 or self.support is None:
            return {"num_data": 0}
        with self.timed("local_fit"):
            model = fit_exact_gp(
                self.X,
                self.Y,
                seed=self.seed,
                warm_start=exact_gp_state(self.local_model()),
                maxiter=self.settings.fit_maxiter,
            )
        with self.timed("summary"), torch.no_grad():
            mean = model.posterior(self.support).mean.reshape(-1)
        best = int(mean.argmax())
        return {"num_data": len(self.X), "best_index": best, "best_value": float(mean[best])}
