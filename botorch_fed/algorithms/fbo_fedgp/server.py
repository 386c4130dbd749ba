r"""The FBO-FedGP server: support selection, rounds, the relay of secure sums and of
the coordinator's federated fit (Alg. 1 + Alg. 2 of [FBO-FedGP]).

References:

.. [FBO-FedGP] Secure federated Bayesian optimisation with distributed sparse GPs
   (paper 000 in ``shared/papers``).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from botorch_fed.algorithms.fbo_fedgp.domain import FIT_EVALUATIONS_PER_ITERATION
from botorch_fed.algorithms.fbo_fedgp.fit import COORDINATOR
from botorch_fed.algorithms.fbo_fedgp.messages import (
    ApplyTheta,
    Centers,
    GlobalStep,
    HyperFeed,
    HyperStart,
    PITCSummaryArgs,
    Round,
    Support,
)
from botorch_fed.algorithms.fbo_fedgp.settings import FBOFedGPSettings, global_modules
from botorch_fed.inducing import global_support, random_support
from botorch_fed.models import (
    CENTRED_MOMENTS_LENGTH,
    OUTCOME_MOMENTS_LENGTH,
    PITCHyperparameters,
    SparseSummary,
)
from botorch_fed.protocol.bo_client import Init
from botorch_fed.protocol.checkpoint import check_tensor, split_state
from botorch_fed.protocol.declarations import ProtocolViolation
from botorch_fed.protocol.server import FederatedServer


class FBOFedGPServer(FederatedServer):
    r"""The FBO-FedGP server: support set, rounds, secure aggregation relay.

    Args:
        transport: Reaches the clients.
        config: The algorithm settings.
        dim: Problem dimension.
        secagg: The server role of the secure-aggregation backend.
        seed: Seed of the server's own randomness (global k-means, random support).
    """

    def __init__(self, transport, config: FBOFedGPSettings, dim: int, secagg, seed: int) -> None:
        super().__init__(transport, secagg)
        config.validate()
        self.config = self.settings = config.resolved()
        self.dim = dim
        self.seed = int(seed)
        self.support_size = config.support_size
        self.support: Tensor | None = None
        self._hyper_round: int | None = None
        self.hyper = PITCHyperparameters(*global_modules(dim))  # structure only (and priors)

    def state_dict(self) -> dict:
        r"""Adds the support set, its size, the last hyperparameter refresh and the
        hyperparameters to :meth:`FederatedServer.state_dict`."""
        state = super().state_dict()
        state.update(
            support=None if self.support is None else self.support.clone(),
            support_size=self.support_size,
            hyper_round=self._hyper_round,
            theta=torch.from_numpy(np.array(self.hyper.get_theta(), dtype=np.float64)),
        )
        return state

    def load_state_dict(self, state: dict) -> None:
        own, rest = split_state(
            "Server", state, ("support", "support_size", "hyper_round", "theta")
        )
        super().load_state_dict(rest)
        support = own["support"]
        if support is not None:
            support = check_tensor("Server", "support", support, (None, self.dim)).clone()
        theta = check_tensor("Server", "theta", own["theta"], (self.hyper.size,))
        self.support, self.support_size = support, int(own["support_size"])
        self._hyper_round = None if own["hyper_round"] is None else int(own["hyper_round"])
        self.hyper.set_theta(theta.numpy().copy())

    def select_support(self, t: int) -> None:
        r"""Alg. 1 (or a random support) and its broadcast."""
        cfg = self.config
        # the server's timers cover its own work only; the clients report theirs
        if cfg.support == "random":
            with self.ledger.timer("support"):
                bounds = torch.stack([torch.zeros(self.dim), torch.ones(self.dim)]).double()
                support = random_support(bounds, self.support_size, seed=self.seed + t)
        else:
            replies = self.broadcast(Centers(k=cfg.centers_per_client))
            with self.ledger.timer("support"):
                centers = [
                    torch.as_tensor(replies[c].payload["centers"], dtype=torch.float64)
                    for c in sorted(replies)
                ]
                centers = [c for c in centers if len(c)]  # clients with too few points
                if centers:
                    support = global_support(centers, self.support_size, seed=self.seed + t)
                else:  # no client holds enough data yet
                    bounds = torch.stack([torch.zeros(self.dim), torch.ones(self.dim)]).double()
                    support = random_support(bounds, self.support_size, seed=self.seed + t)
        # k-means centres are means of points of the unit cube: rounding can leave one
        # a few ulps outside, which the clients would refuse
        self.support = support = support.clamp(0.0, 1.0)
        self.broadcast(Support(support=support.numpy()))

    def refresh_hyperparameters(self, t: int) -> None:
        cfg = self.config
        if cfg.hyperparameters == "average":
            self.secure_sum("hyper", self.hyper.size + 1)
        else:
            self._fit_federated()
        self._hyper_round = t

    def _fit_federated(self) -> None:
        r"""Exact PITC type-II ML: a coordinator client runs L-BFGS-B; each evaluation
        is two secure sums (summaries at ``theta``, then vector-Jacobian products with
        the adjoint every client derives from the summed summaries)."""
        coordinator = COORDINATOR
        if coordinator not in self.client_ids:
            raise ProtocolViolation(
                f"Server: a federated fit needs its coordinator, client {coordinator}."
            )
        assert self.support is not None  # selected in initialize()
        length = SparseSummary.packed_length(len(self.support))
        # the server only relays here: all the fit's time is the clients' (their ledger
        # entries) and the secure sums'
        budget = FIT_EVALUATIONS_PER_ITERATION * self.config.federated_maxiter
        reply = self.send({coordinator: HyperStart()})[coordinator].payload
        evaluations = 0
        while not reply["done"]:
            evaluations += 1
            if evaluations > budget:  # the coordinator is another party: not trusted
                raise ProtocolViolation(
                    f"Server: the coordinator (client {coordinator}) asked for more than "
                    f"{budget} evaluations in one fit (`federated_maxiter`="
                    f"{self.config.federated_maxiter})."
                )
            args = PITCSummaryArgs(reply["theta"], reply.get("tag", b""), reply.get("index"))
            self.secure_sum("pitc_summary", length, args.payload())
            self.secure_sum("pitc_vjp", self.hyper.size)
            reply = self.send({coordinator: HyperFeed()})[coordinator].payload
        self.hyper.set_theta(np.asarray(reply["theta"]))
        self.broadcast(ApplyTheta(theta=reply["theta"]))

    def standardize_outcomes(self) -> None:
        r"""Federated outcome standardisation: two secure sums of the clients' outcome
        moments (``[n, sum y]``, then the sums centred at its mean), after which every
        client holds the ``Standardize`` transform of all outcomes pooled."""
        # the moments already are exact small-integer limbs (outcome_moments,
        # centred_moments): exact and within headroom under every backend, so no wide
        # encoding on top
        self.secure_sum("moments", OUTCOME_MOMENTS_LENGTH, wide=0)
        self.secure_sum("centred_moments", CENTRED_MOMENTS_LENGTH, wide=0)

    def global_round(self, t: int, clients: list[int]) -> None:
        cfg = self.config
        self.standardize_outcomes()
        assert cfg.hyper_every is not None  # resolved() sets it
        if self._hyper_round is None or t - self._hyper_round >= cfg.hyper_every:
            self.refresh_hyperparameters(t)
        assert self.support is not None  # selected in initialize()
        self.secure_sum("summary", SparseSummary.packed_length(len(self.support)))
        # no seed: each client derives the search's seed itself (FBOFedGPClient.search_seed)
        self.send(
            {cid: GlobalStep(t=t, rank=r, count=len(clients)) for r, cid in enumerate(clients)}
        )

    def initialize(self) -> None:
        r"""Initial designs, then the first support set (Alg. 2 lines 1-11)."""
        self.broadcast(Init())
        self.select_support(0)

    def run_round(self, t: int) -> None:
        r"""Round ``t``: re-select the support when due, let every client draw its step,
        and run a global round if any client drew a global step (Alg. 2 lines 12-28)."""
        cfg = self.config
        if cfg.support_every and t > 1 and (t - 1) % cfg.support_every == 0:
            self.support_size += cfg.support_growth
            self.select_support(t)
        replies = self.broadcast(Round(t=t))
        global_clients = sorted(c for c, r in replies.items() if r.payload["global"])
        if global_clients:
            self.global_round(t, global_clients)
