r"""The Co-KG server (Zhan et al., "Collaborative Bayesian optimization via Wasserstein
barycenters", paper 001, Alg. 1 lines 2-10): the agents' posteriors in, their
barycenter GP and the acquisition's batch ``x_1..x_N`` out, ``x_n`` to agent ``n``.
"""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import TypeVar

import numpy as np
import torch
from torch import Tensor

from botorch_fed.acquisition import (
    optimize_co_acquisition,
    qCoExpectedImprovement,
    qCoKnowledgeGradient,
    qCoMaxValueEntropy,
)
from botorch_fed.algorithms.co_kg import messages as msg
from botorch_fed.algorithms.co_kg.settings import (
    CoEISettings,
    CoESSettings,
    CollaborativeSettings,
    KGFields,
)
from botorch_fed.inducing import global_support, sobol_support
from botorch_fed.models import BarycenterGP, agent_weights
from botorch_fed.models.rbf_prior import shared_kernel
from botorch_fed.protocol.bo_client import Init
from botorch_fed.protocol.checkpoint import CheckpointError, check_tensor, split_state
from botorch_fed.protocol.declarations import Declared, ProtocolViolation
from botorch_fed.protocol.round_budget import round_seed
from botorch_fed.protocol.server import FederatedServer

# What the server accepts of an agent's posterior beyond its declaration: wide ranges
# that every honest fit lies far inside (they keep the server's numerics finite).
NOISE_RATIO_RANGE = (1e-10, 1e3)  # noise variance / signal variance
MAX_MEAN_DEVIATION = 100.0  # |mean - prior mean| in signal standard deviations
PRIOR_VARIANCE_TOL = 1e-3  # diag(C) <= outputscale (1 + this)
# as in the barycenter: asymmetry and negative eigenvalues beyond this times the largest
# variance are refused
COVARIANCE_TOL = 1e3 * torch.finfo(torch.float64).eps
# the barycenter iteration's stopping rule (far below the acquisitions' Monte Carlo error)
BARYCENTER_TOL = 1e-6

_R = TypeVar("_R", bound=Declared)


class CoKGServer(FederatedServer):
    r"""The Co-KG server: support, barycenter, acquisition, assignments.

    Args:
        transport: Reaches the agents.
        settings: The algorithm's settings; their class is the algorithm:
            :class:`CoKGSettings`, :class:`CoEISettings`, :class:`CoESSettings` or
            :class:`BarycenterQKGSettings`.
        dim: Problem dimension.
        seed: The run's seed (Sobol support, k-means, acquisition seeds).
        secagg: The server role of the secure-aggregation backend (the secure mean).
        bounds: ``2 x d`` bounds of the objectives' domain (public), of ``x^``.
        minimize: The objectives' convention (public), of ``x^``'s value.
    """

    def __init__(
        self,
        transport,
        settings: CollaborativeSettings,
        dim: int,
        seed: int,
        secagg=None,
        bounds: Tensor | None = None,
        minimize: bool = False,
    ) -> None:
        super().__init__(transport, secagg)
        settings.validate()
        if not isinstance(settings, KGFields | CoEISettings | CoESSettings):
            name = type(settings).__name__
            raise TypeError(f"`settings` must be the settings of a Co-KG algorithm, got {name}.")
        if settings.hides_means() and secagg is None:
            raise ValueError("`mean_aggregation`='secure' needs a secure-aggregation backend.")
        self.settings, self.dim, self.seed = settings, int(dim), int(seed)
        self.schedule = settings.make_beta_schedule()
        self.bounds, self.minimize = bounds, bool(minimize)
        self.support: Tensor | None = settings.public_support(self.dim, self.seed)
        self.barycenter_covariance: Tensor | None = None  # warm start of the next round
        self.recommendations: list[dict] = []
        self.last_central: BarycenterGP | None = None  # this round's (not state)

    @property
    def recommendation(self) -> dict | None:
        r"""The latest ``x^`` (Alg. 1 line 10), ``None`` before any."""
        return self.recommendations[-1] if self.recommendations else None

    def state_dict(self) -> dict:
        r"""Adds the support, the barycenter warm start and the recommendations."""
        return {
            **super().state_dict(),
            "support": self.support,
            "barycenter_covariance": self.barycenter_covariance,
            "recommendations": [dict(r) for r in self.recommendations],
        }

    def load_state_dict(self, state: dict) -> None:
        own, rest = split_state(
            "Server", state, ("support", "barycenter_covariance", "recommendations")
        )
        super().load_state_dict(rest)
        support, cov, recs = own["support"], own["barycenter_covariance"], own["recommendations"]
        if support is not None:
            support = check_tensor("Server", "support", support, (None, self.dim)).clone()
        if cov is not None:
            s = None if support is None else len(support)
            cov = check_tensor("Server", "barycenter_covariance", cov, (s, s)).clone()
        if not isinstance(recs, list) or not all(isinstance(r, dict) for r in recs):
            raise CheckpointError("Server: `recommendations` must be a list of dicts.")
        self.support, self.barycenter_covariance = support, cov
        self.recommendations = [dict(r) for r in recs]

    def _decode(self, cls: type[_R], cid: int, what: str, payload: dict, max_data: int = 0) -> _R:
        r"""Agent ``cid``'s reply decoded (:meth:`FederatedServer.decode_reply`)."""
        party = SimpleNamespace(dim=self.dim, k=self.settings.centers_per_client, max_data=max_data)
        party.size = 0 if self.support is None else len(self.support)
        party.hides_means = self.settings.hides_means()
        return self.decode_reply(cls, cid, what, payload, party)

    def select_support(self, t: int) -> None:
        r"""The k-means support from the agents' centres (or the public grid/Sobol
        support) and its broadcast; a new support drops the barycenter warm start."""
        if self.settings.support_kind(self.dim) == "kmeans":
            replies = self.broadcast(msg.Centers(k=self.settings.centers_per_client))
            with self.ledger.timer("support"):
                decoded = [
                    self._decode(msg.CentersReply, c, "k-means centres", replies[c].payload).centers
                    for c in sorted(replies)
                ]
                centers = [torch.as_tensor(c) for c in decoded if len(c)]
                size = self.settings.support_size
                if centers:
                    support = global_support(centers, size, seed=self.seed + t)
                else:  # no agent holds enough data yet: a data-independent support
                    support = sobol_support(self.dim, size, seed=self.seed)
            if self.support is None or not torch.equal(support, self.support):
                self.barycenter_covariance = None
            self.support = support
        assert self.support is not None  # k-means (just set) or the public support
        self.broadcast(msg.Support(support=self.support.numpy()))

    def initialize(self) -> None:
        r"""Warm-up (Alg. 1 line 2), then the shared support."""
        self.broadcast(Init())
        self.select_support(0)

    def run_round(self, t: int) -> None:
        r"""Round ``t`` (Alg. 1 lines 4-8): posteriors in, barycenter, acquisition,
        one point out to every agent."""
        cfg = self.settings
        kmeans = cfg.support_kind(self.dim) == "kmeans"
        if kmeans and cfg.support_every and t > 1 and (t - 1) % cfg.support_every == 0:
            self.select_support(t)
        replies = self.broadcast(msg.Posterior(t=t))
        ids = sorted(replies)
        posteriors = {cid: self._parse(cid, replies[cid].payload, t) for cid in ids}
        self._recommend(t, posteriors)
        if all(p is None for p in posteriors.values()):
            # every evaluation failed so far: a seeded random batch
            g = torch.Generator().manual_seed(round_seed(self.seed, t))
            X = torch.rand(len(ids), self.dim, generator=g, dtype=torch.float64)
        else:
            X = self._batch(t, ids, posteriors)
        self.send({cid: msg.Evaluate(x=X[i].numpy(), t=t) for i, cid in enumerate(ids)})

    def _parse(self, cid: int, payload: dict, t: int) -> dict | None:
        r"""Agent ``cid``'s posterior of round ``t`` as tensors (``None`` without data),
        decoded and checked against what an honest agent can send."""
        max_data = self.settings.num_init + t - 1
        reply = self._decode(msg.PosteriorReply, cid, "posterior", payload, max_data)
        if reply.num_data == 0:
            return None
        out = {
            k: torch.as_tensor(v) if isinstance(v, np.ndarray) else v
            for k, v in reply.payload().items()
        }

        def bad(problem: str) -> ProtocolViolation:
            return ProtocolViolation(f"Server: the posterior of client {cid} {problem}.")

        outputscale = float(out["outputscale"])
        ratio, (low, high) = float(out["noise"]) / outputscale, NOISE_RATIO_RANGE
        if not low <= ratio <= high:
            raise bad(f"has `noise` {ratio:.3g} x `outputscale`, outside [{low}, {high}] x")
        C = out["covariance"]
        scale = C.diagonal().abs().max().clamp_min(1e-300)
        if (C - C.T).abs().max() > COVARIANCE_TOL * scale:
            raise bad("has a `covariance` that is not symmetric")
        eye = torch.eye(len(C), dtype=torch.float64)
        if torch.linalg.cholesky_ex(0.5 * (C + C.T) + COVARIANCE_TOL * scale * eye).info != 0:
            raise bad("has a `covariance` that is not positive semi-definite")
        if C.diagonal().max() > outputscale * (1 + PRIOR_VARIANCE_TOL):
            raise bad(f"has posterior variances above its prior variance {outputscale:.6g}")
        sd, m, R = math.sqrt(outputscale), float(out["mean_constant"]), MAX_MEAN_DEVIATION
        value, best = out["best_value"], out["best_index"]
        if self.settings.hides_means():
            if abs(value - m) > R * sd:
                raise bad(f"has `best_value`={value:.6g} more than {R:g} sd from its prior mean")
        elif float((out["mean"] - m).abs().max()) > R * sd:
            raise bad(f"has `mean_constant`={m:.6g} more than {R:g} sd from its means")
        elif value != float(out["mean"][best]) or value != float(out["mean"].max()):
            raise bad(f"has `best_value`={value!r}, not its largest mean, at `best_index`={best}")
        return out

    def _recommend(self, t: int, optima: dict[int, dict | None]) -> None:
        r"""``x^``: the largest of the agents' local optima (Alg. 1 line 10)."""
        known = {cid: o for cid, o in optima.items() if o is not None}
        if not known:
            return
        cid = max(sorted(known), key=lambda c: known[c]["best_value"])  # first of ties
        assert self.support is not None  # the optima are indices into it
        x, value = self.support[known[cid]["best_index"]], known[cid]["best_value"]
        b = self.bounds
        domain = x if b is None else b[0] + x * (b[1] - b[0])
        rec = dict(round=int(t), client=int(cid), x=domain.tolist(), x_unit=x.tolist())
        self.recommendations.append({**rec, "predicted_value": -value if self.minimize else value})

    @staticmethod
    def _shared_prior(known: list[dict]) -> dict[str, Tensor]:
        r"""The shared prior off the support: data-size-weighted (geometric) means of
        the agents' hyperparameters."""
        n = torch.tensor([p["num_data"] for p in known], dtype=torch.float64)
        w = n / n.sum()

        def mean(values: list[Tensor]) -> Tensor:
            v = torch.stack(values)
            return (w.reshape(-1, *[1] * (v.ndim - 1)) * v).sum(0)

        keys = ("lengthscale", "outputscale", "noise")
        prior = {k: mean([p[k].log() for p in known]).exp() for k in keys}
        return {**prior, "mean_constant": mean([p["mean_constant"] for p in known])}

    @staticmethod
    def _model(S: Tensor, means: Tensor, covs: Tensor, h: dict, **kwargs) -> BarycenterGP:
        r"""A ``BarycenterGP`` on the support ``S`` under the hyperparameters ``h``."""
        kwargs.update(noise=h["noise"], mean_constant=h["mean_constant"])
        return BarycenterGP(
            S, means, covs, shared_kernel(h["lengthscale"], h["outputscale"]), **kwargs
        )

    def _batch(self, t: int, ids: list[int], posteriors: dict[int, dict | None]) -> Tensor:
        r"""Round ``t``'s batch (``N x d``, one row per agent): the barycenter, the
        agents' local models (``beta_t > 0``) and the acquisition's maximiser."""
        cfg, S = self.settings, self.support
        assert S is not None  # initialize() sends it before round 1
        with self.ledger.timer("barycenter"):
            prior = self._shared_prior([p for p in posteriors.values() if p is not None])
            with torch.no_grad():
                K_SS = shared_kernel(prior["lengthscale"], prior["outputscale"])(S)
                K_SS = K_SS.to_dense().to(torch.float64)
            m0 = prior["mean_constant"]
            # an agent without data counts with the shared prior as its posterior
            stand_in = {**prior, "num_data": 0, "mean": m0.expand(len(S)), "covariance": K_SS}
            own = [posteriors[c] or stand_in for c in ids]
            covs = torch.stack([p["covariance"] for p in own])
            counts = [p["num_data"] for p in own]
            weights = agent_weights(cfg.weights, covariances=covs, num_data=counts)
            if cfg.hides_means():  # sum_n w_n mu_n; agents without data add zeros, w_n m0 here
                args = {"weights": weights.numpy(), "clients": np.asarray(ids, dtype=np.int64)}
                total = self.secure_sum(msg.WEIGHTED_MEAN, len(S), args=args, clients=ids)
                if total is None:  # the backend keeps sums on the clients
                    raise ProtocolViolation("Server: the secure mean needs the masking backend.")
                mean = torch.as_tensor(np.asarray(total, dtype=np.float64))
                missing = sum(float(weights[i]) for i, c in enumerate(ids) if posteriors[c] is None)
                # a weighted mean of N copies is itself
                means = (mean + missing * m0).expand(len(ids), -1)
            else:
                means = torch.stack([p["mean"] for p in own])
            init = self.barycenter_covariance
            central = self._model(
                S, means, covs, prior, weights=weights, barycenter_init=init, tol=BARYCENTER_TOL
            )
            self.barycenter_covariance = central.barycenter_covariance.detach().clone()
            self.last_central = central
            beta = float(self.schedule(t))
            if cfg.hides_means() or beta == 0:
                locals_ = [central] * len(ids)  # placeholders: not evaluated at beta = 0
            else:
                locals_ = [self._model(S, p["mean"][None], p["covariance"][None], p) for p in own]
        with self.ledger.timer("acquisition"):
            a, seed = (central, locals_, beta), round_seed(self.seed, t)
            acqf: qCoKnowledgeGradient | qCoExpectedImprovement | qCoMaxValueEntropy
            if isinstance(cfg, KGFields):
                n, inner = cfg.num_fantasies, S if cfg.discrete else None
                acqf = qCoKnowledgeGradient(*a, n, discrete_support=inner, seed=seed)
            elif isinstance(cfg, CoEISettings):
                acqf = qCoExpectedImprovement(*a, seed=seed, support=S)
            else:
                assert isinstance(cfg, CoESSettings)  # checked at construction
                acqf = qCoMaxValueEntropy(*a, S, cfg.num_mv_samples, seed=seed)
            bounds = torch.stack([torch.zeros(self.dim), torch.ones(self.dim)]).double()
            X = optimize_co_acquisition(
                acqf, bounds, cfg.num_restarts, cfg.raw_samples, seed, {"maxiter": cfg.maxiter}
            )
        return X.detach().reshape(len(ids), self.dim).clamp(0.0, 1.0)

    def run(self, on_round=None, start_round=None) -> None:
        r"""Rounds as :meth:`FederatedServer.run`, then Alg. 1's output: the agents'
        local optima and ``x^`` (:attr:`recommendation`)."""
        super().run(on_round=on_round, start_round=start_round)
        replies = self.broadcast(msg.Optimum())
        max_data = self.settings.num_init + self.settings.num_rounds
        optima: dict[int, dict | None] = {}
        for cid in sorted(replies):
            reply = self._decode(
                msg.OptimumReply, cid, "local optimum", replies[cid].payload, max_data
            )
            optima[cid] = reply.payload() if reply.num_data else None
        self._recommend(self.settings.num_rounds, optima)
