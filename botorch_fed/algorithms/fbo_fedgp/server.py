r"""The FBO-FedGP server (paper 000, Alg. 1 + Alg. 2): support selection, rounds, the relay
of secure sums and of the coordinator's federated fit."""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from botorch_fed.algorithms.fbo_fedgp.domain import clamp_to_domain, theta_domain
from botorch_fed.algorithms.fbo_fedgp.fit import COORDINATOR
from botorch_fed.algorithms.fbo_fedgp.messages import (
    ApplyTheta,
    Centers,
    GlobalStep,
    HyperFeed,
    PITCSummaryArgs,
    Round,
    Support,
)
from botorch_fed.algorithms.fbo_fedgp.settings import FBOFedGPSettings, global_modules
from botorch_fed.inducing import global_support, random_support
from botorch_fed.models import (
    CENTRED_MOMENTS_LENGTH,
    MOMENTS_AROUND_LENGTH,
    OUTCOME_MOMENTS_LENGTH,
    PITCHyperparameters,
    SparseSummary,
)
from botorch_fed.protocol.bo_client import Init
from botorch_fed.protocol.checkpoint import check_tensor, split_state
from botorch_fed.protocol.declarations import ProtocolViolation
from botorch_fed.protocol.server import FederatedServer


class FBOFedGPServer(FederatedServer):
    r"""The FBO-FedGP server.

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
        self.dim, self.seed, self.support_size = dim, int(seed), config.support_size
        self.support: Tensor | None = None
        self._hyper_round: int | None = None
        self._standardized = False  # whether the clients hold a federated standardisation
        self.hyper = PITCHyperparameters(*global_modules(dim))  # structure only (and priors)

    def state_dict(self) -> dict:
        r"""Adds the support set and its size, the last refresh and the hyperparameters."""
        state = super().state_dict()
        state.update(
            support=None if self.support is None else self.support.clone(),
            support_size=self.support_size,
            hyper_round=self._hyper_round,
            standardized=self._standardized,
            theta=torch.from_numpy(np.array(self.hyper.get_theta(), dtype=np.float64)),
        )
        return state

    def load_state_dict(self, state: dict) -> None:
        own, rest = split_state(
            "Server", state, ("support", "support_size", "hyper_round", "standardized", "theta")
        )
        super().load_state_dict(rest)
        support = own["support"]
        if support is not None:
            support = check_tensor("Server", "support", support, (None, self.dim)).clone()
        theta = check_tensor("Server", "theta", own["theta"], (self.hyper.size,))
        self.support, self.support_size = support, int(own["support_size"])
        self._hyper_round = None if own["hyper_round"] is None else int(own["hyper_round"])
        self._standardized = bool(own["standardized"])
        self.hyper.set_theta(theta.numpy().copy())

    def select_support(self, t: int) -> None:
        r"""Alg. 1 (or a random support) and its broadcast."""
        cfg = self.config
        random = cfg.support == "random"
        replies = {} if random else self.broadcast(Centers(k=cfg.centers_per_client))
        with self.ledger.timer("support"):
            payloads = (replies[c].payload["centers"] for c in sorted(replies))
            # clients with too few points send none
            centers = [torch.as_tensor(p, dtype=torch.float64) for p in payloads if len(p)]
            if centers:
                support = global_support(centers, self.support_size, seed=self.seed + t)
            else:  # a random support, or no client holds enough data yet
                bounds = torch.stack([torch.zeros(self.dim), torch.ones(self.dim)]).double()
                support = random_support(bounds, self.support_size, seed=self.seed + t)
        # rounding may leave a k-means centre a few ulps outside the cube (refused)
        self.support = support = support.clamp(0.0, 1.0)
        self.carry(dict.fromkeys(self.client_ids, Support(support=support.numpy())))

    def refresh_hyperparameters(self, t: int) -> None:
        if self.config.hyperparameters == "average":
            self.secure_sum("hyper", self.hyper.size + 1)
        else:
            self._fit_federated()
        self._hyper_round = t

    def _fit_federated(self) -> None:
        r"""Relay the coordinator's fit: per iterate, one secure sum of the clients'
        summaries and Jacobians there (:class:`~botorch_fed.protocol.federated_fit.
        SummaryTrustRegion`), then the coordinator's next iterate."""
        c = COORDINATOR
        if c not in self.client_ids:
            raise ProtocolViolation(f"Server: a federated fit needs its coordinator, client {c}.")
        assert self.support is not None  # selected in initialize()
        length = SparseSummary.packed_length(len(self.support)) * (1 + self.hyper.size)
        budget = self.config.federated_maxiter + 1
        # the first point is the current hyperparameters (clamped), which the clients check
        start = clamp_to_domain(self.hyper.get_theta(), theta_domain(self.hyper))
        args, evaluations = PITCSummaryArgs(start, b"", 0), 0
        while True:
            evaluations += 1
            if evaluations > budget:  # the coordinator is another party: not trusted
                raise ProtocolViolation(
                    f"Server: the coordinator (client {c}) asked for more than {budget} "
                    f"evaluations in one fit (`federated_maxiter`={self.config.federated_maxiter})."
                )
            self.secure_sum("pitc_summary", length, args.payload())
            reply = self.send({c: HyperFeed()})[c].payload
            if reply["done"]:
                break
            args = PITCSummaryArgs(reply["theta"], reply.get("tag", b""), reply.get("index"))
        self.hyper.set_theta(np.asarray(reply["theta"]))
        self.carry(dict.fromkeys(self.client_ids, ApplyTheta(theta=reply["theta"])))

    def standardize_outcomes(self) -> None:
        r"""Secure sums of the outcome moments (exact small-integer limbs: no wide
        encoding), then every client holds the ``Standardize`` of all outcomes pooled:
        one pass around the last standardisation's mean, two passes the first time."""
        if self._standardized:
            self.secure_sum("moments_around", MOMENTS_AROUND_LENGTH, wide=0)
        else:
            self.secure_sum("moments", OUTCOME_MOMENTS_LENGTH, wide=0)
            self.secure_sum("centred_moments", CENTRED_MOMENTS_LENGTH, wide=0)

    def global_round(self, t: int, clients: list[int]) -> None:
        r"""The global part of round ``t`` (its outcome moments summed already)."""
        every = self.config.hyper_every
        assert every is not None  # resolved() sets it
        if self._hyper_round is None or t - self._hyper_round >= every:
            self.refresh_hyperparameters(t)
        assert self.support is not None  # selected in initialize()
        self.secure_sum("summary", SparseSummary.packed_length(len(self.support)))
        # no seed: each client derives the search's seed itself (FBOFedGPClient.search_seed)
        count = len(clients)
        self.send({cid: GlobalStep(t=t, rank=r, count=count) for r, cid in enumerate(clients)})

    def initialize(self) -> None:
        r"""Initial designs, then the first support set (Alg. 2 lines 1-11)."""
        self.broadcast(Init())
        self.select_support(0)

    def run_round(self, t: int) -> None:
        r"""Round ``t`` (Alg. 2 lines 12-28): the support when due, every client's step."""
        cfg = self.config
        if cfg.support_every and t > 1 and (t - 1) % cfg.support_every == 0:
            self.support_size += cfg.support_growth
            self.select_support(t)
        # the round's message travels with the opening of the moments' sum, which the
        # global step needs: a round without one (mixing "sample") has summed them for
        # nothing, but no round waits for the answers to `Round` alone
        self.carry(dict.fromkeys(self.client_ids, Round(t=t)), keep="round")
        self.standardize_outcomes()
        replies = self.carried_replies("round")
        global_clients = sorted(c for c, r in replies.items() if r.payload["global"])
        if global_clients:  # some client holds data: the clients hold a standardisation
            self._standardized = True
            self.global_round(t, global_clients)
