r"""The Co-KG server (Alg. 1 of Co-KG, paper 001, lines 2-10).

Each round it checks every agent's posterior (:meth:`CoKGServer._parse`), forms the
central :class:`~botorch_fed.models.BarycenterGP` -- the barycenter of the agents'
discretised posteriors, warm-started from the previous round's, with the shared prior
off the support -- and maximises the acquisition over the batch ``x_1..x_N``
(:func:`~botorch_fed.acquisition.optimize_co_acquisition`): agent ``n`` gets ``x_n``.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from gpytorch.kernels import RBFKernel, ScaleKernel
from torch import Tensor

from botorch_fed.acquisition import (
    optimize_co_acquisition,
    qCoExpectedImprovement,
    qCoKnowledgeGradient,
    qCoMaxValueEntropy,
)
from botorch_fed.algorithms.co_kg.messages import (
    WEIGHTED_MEAN,
    Centers,
    Evaluate,
    Init,
    Optimum,
    Posterior,
    Support,
)
from botorch_fed.algorithms.co_kg.settings import (
    BarycenterQKGSettings,
    CoEISettings,
    CoESSettings,
    CoKGSettings,
    CollaborativeSettings,
    public_support,
    support_kind,
)
from botorch_fed.inducing import global_support, sobol_support
from botorch_fed.models import BarycenterGP, agent_weights
from botorch_fed.protocol.checkpoint import CheckpointError, check_tensor, split_state
from botorch_fed.protocol.declarations import Array, FieldError, Int, ProtocolViolation, Real
from botorch_fed.protocol.round_budget import round_seed
from botorch_fed.protocol.server import FederatedServer

# What the server accepts of an agent's GP: wide ranges that every honest fit lies far
# inside; they keep the server's numerics finite and name an agent that sends the impossible.
LENGTHSCALE_RANGE = (1e-3, 1e4)  # in the unit cube
OUTPUTSCALE_RANGE = (1e-40, 1e40)  # outcome standard deviations 1e-20..1e20, squared
NOISE_RATIO_RANGE = (1e-10, 1e3)  # noise variance / signal variance
MAX_MEAN_DEVIATION = 100.0  # |mean - prior mean| in signal standard deviations
PRIOR_VARIANCE_TOL = 1e-3  # diag(C) <= outputscale (1 + this)
# as in the barycenter: asymmetry and negative eigenvalues beyond this times the largest
# variance are refused
COVARIANCE_TOL = 1e3 * torch.finfo(torch.float64).eps
# the barycenter iteration's stopping rule: it converges only linearly on the numerically
# singular covariances of a grid, and 1e-6 is far below the acquisitions' Monte Carlo error
BARYCENTER_TOL = 1e-6


def shared_kernel(lengthscale: Tensor, outputscale: Tensor) -> ScaleKernel:
    r"""``outputscale * RBF(lengthscale)`` as a float64 gpytorch kernel (no priors).

    Args:
        lengthscale: ``d`` lengthscales.
        outputscale: The signal variance.

    Returns:
        The kernel.
    """
    d = lengthscale.numel()
    kernel = ScaleKernel(RBFKernel(ard_num_dims=d)).to(torch.float64)
    kernel.base_kernel.lengthscale = lengthscale.reshape(1, d).to(torch.float64)
    kernel.outputscale = outputscale.to(torch.float64).reshape(())
    return kernel


def _count(payload: dict, bad, bound: int) -> int:
    r"""An agent's ``num_data``: an int in ``0..bound`` (else ``bad(...)`` is raised)."""
    n = payload.get("num_data")
    if isinstance(n, bool) or not isinstance(n, int | np.integer) or not 0 <= n <= bound:
        raise bad(f"has `num_data`={n!r:.40} (expected an int in 0..{bound})")
    return int(n)


def _optimum(payload: dict, bad, size: int) -> tuple[int, float]:
    r"""An agent's local optimum: ``best_index`` an int in ``0..size - 1`` and
    ``best_value`` a finite number (else ``bad(...)`` is raised)."""
    try:
        best = Int(0, size - 1).check(payload.get("best_index"), None)
        return best, Real().check(payload.get("best_value"), None)
    except FieldError:
        raise bad("has no valid local optimum (`best_index`, `best_value`)") from None


class CoKGServer(FederatedServer):
    r"""The Co-KG server: support, barycenter, acquisition, assignments.

    Args:
        transport: Reaches the agents.
        settings: The algorithm's settings; their class is the algorithm (its
            acquisition): :class:`CoKGSettings`, :class:`CoEISettings`,
            :class:`CoESSettings` or :class:`BarycenterQKGSettings`.
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
        if not isinstance(
            settings, CoKGSettings | CoEISettings | CoESSettings | BarycenterQKGSettings
        ):
            raise TypeError(
                "`settings` must be the settings of a Co-KG algorithm, got "
                f"{type(settings).__name__}."
            )
        if settings.hides_means() and secagg is None:
            raise ValueError(
                "`mean_aggregation`='secure' needs a secure-aggregation backend (`aggregator`)."
            )
        self.settings = settings
        self.dim = int(dim)
        self.seed = int(seed)
        self.schedule = settings.make_beta_schedule()
        self.bounds = bounds
        self.minimize = bool(minimize)
        self.support: Tensor | None = public_support(settings, self.dim, self.seed)
        self.barycenter_covariance: Tensor | None = None  # warm start of the next round
        self.recommendations: list[dict] = []
        self.recommendation: dict | None = None
        # this round's central model (not state: rebuilt each round)
        self.last_central: BarycenterGP | None = None

    # --- checkpoints ---------------------------------------------------------------------
    def state_dict(self) -> dict:
        r"""Adds the support, the barycenter warm start and the recommendations to
        :meth:`FederatedServer.state_dict`."""
        state = super().state_dict()
        cov = self.barycenter_covariance
        state.update(
            support=None if self.support is None else self.support.clone(),
            barycenter_covariance=None if cov is None else cov.clone(),
            recommendations=[dict(r) for r in self.recommendations],
        )
        return state

    def load_state_dict(self, state: dict) -> None:
        own, rest = split_state(
            "Server", state, ("support", "barycenter_covariance", "recommendations")
        )
        super().load_state_dict(rest)
        support = own["support"]
        if support is not None:
            support = check_tensor("Server", "support", support, (None, self.dim)).clone()
        cov = own["barycenter_covariance"]
        if cov is not None:
            s = None if support is None else len(support)
            cov = check_tensor("Server", "barycenter_covariance", cov, (s, s)).clone()
        recs = own["recommendations"]
        if not isinstance(recs, list) or not all(isinstance(r, dict) for r in recs):
            raise CheckpointError("Server: `recommendations` must be a list of dicts.")
        self.support, self.barycenter_covariance = support, cov
        self.recommendations = [dict(r) for r in recs]
        self.recommendation = self.recommendations[-1] if self.recommendations else None

    # --- support ---------------------------------------------------------------------------
    def select_support(self, t: int) -> None:
        r"""The k-means support from the agents' centres (or the public grid/Sobol
        support) and its broadcast; a new support drops the barycenter warm start."""
        if support_kind(self.settings, self.dim) == "kmeans":
            k = self.settings.centers_per_client
            replies = self.broadcast(Centers(k=k))
            with self.ledger.timer("support"):
                centers = [self._centers(c, replies[c].payload, k) for c in sorted(replies)]
                centers = [c for c in centers if len(c)]
                if centers:
                    support = global_support(
                        centers, self.settings.support_size, seed=self.seed + t
                    )
                else:  # no agent holds enough data yet: a data-independent support
                    support = sobol_support(self.dim, self.settings.support_size, seed=self.seed)
            if self.support is None or not torch.equal(support, self.support):
                self.barycenter_covariance = None
            self.support = support
        assert self.support is not None  # k-means (just set) or the public support
        self.broadcast(Support(support=self.support.numpy()))

    def _centers(self, cid: int, payload: dict, k: int) -> Tensor:
        r"""Agent ``cid``'s k-means centres: at most ``k`` finite points of the unit
        cube (else a :class:`ProtocolViolation` naming the agent)."""
        try:
            centers = Array((None, self.dim), 0.0, 1.0).check(
                np.asarray(payload.get("centers")), self
            )
            if len(centers) > k:
                raise FieldError(f"holds {len(centers)}")
        except FieldError as exc:
            raise ProtocolViolation(
                f"Server: the k-means centres of client {cid} must be at most {k} finite points "
                f"of [0, 1]^{self.dim}: the reply {exc}."
            ) from None
        return torch.as_tensor(centers)

    def initialize(self) -> None:
        r"""Warm-up (Alg. 1 line 2), then the shared support."""
        self.broadcast(Init())
        self.select_support(0)

    # --- the round -----------------------------------------------------------------------
    def round_seed(self, t: int) -> int:
        r"""The seed of round ``t``'s acquisition (samplers and search)."""
        return round_seed(self.seed, t)

    def run_round(self, t: int) -> None:
        r"""Round ``t`` (Alg. 1 lines 4-8): posteriors in, barycenter, acquisition,
        one point out to every agent."""
        cfg = self.settings
        kmeans = support_kind(cfg, self.dim) == "kmeans"
        if kmeans and cfg.support_every and t > 1 and (t - 1) % cfg.support_every == 0:
            self.select_support(t)
        replies = self.broadcast(Posterior(t=t))
        ids = sorted(replies)
        posteriors = {cid: self._parse(cid, replies[cid].payload, t) for cid in ids}
        self._recommend(t, posteriors)
        if all(p is None for p in posteriors.values()):
            # every evaluation failed so far: a seeded random batch
            g = torch.Generator().manual_seed(self.round_seed(t))
            X = torch.rand(len(ids), self.dim, generator=g, dtype=torch.float64)
        else:
            X = self._batch(t, ids, posteriors)
        self.send({cid: Evaluate(x=X[i].numpy(), t=t) for i, cid in enumerate(ids)})

    def _parse(self, cid: int, payload: dict, t: int) -> dict | None:
        r"""Agent ``cid``'s posterior reply of round ``t``, every field checked: shapes,
        finiteness and the ranges above; ``num_data`` at most ``num_init + t - 1``; the
        covariance symmetric, positive semi-definite and at most the prior variance; the
        means (clear) or the local optimum (secure) near the prior mean; in clear mode
        ``best_value`` the largest mean, at ``best_index``.

        Returns:
            The parsed posterior, or ``None`` for an agent without data.

        Raises:
            ProtocolViolation: A field an honest agent cannot send, naming the agent.
        """
        assert self.support is not None  # initialize() sends it before round 1
        s, d = len(self.support), self.dim

        def bad(problem: str) -> ProtocolViolation:
            return ProtocolViolation(f"Server: the posterior of client {cid} {problem}.")

        n = _count(payload, bad, self.settings.num_init + t - 1)
        if n == 0:
            return None
        domains = {
            "covariance": Array((s, s)),
            "lengthscale": Array((d,), *LENGTHSCALE_RANGE),
            "outputscale": Array((), *OUTPUTSCALE_RANGE),
            "noise": Array(()),
            "mean_constant": Array(()),
        }
        if not self.settings.hides_means():
            domains["mean"] = Array((s,))
        out: dict = {"num_data": n}
        for key, domain in domains.items():
            try:
                out[key] = torch.as_tensor(domain.check(np.asarray(payload.get(key)), self))
            except FieldError as exc:
                raise bad(f"has a `{key}` that {exc}") from None
        outputscale = float(out["outputscale"])
        ratio = float(out["noise"]) / outputscale
        low, high = NOISE_RATIO_RANGE
        if not low <= ratio <= high:
            raise bad(f"has `noise` {ratio:.3g} x `outputscale`, outside [{low}, {high}] x")
        C = out["covariance"]
        scale = C.diagonal().abs().max().clamp_min(1e-300)
        if (C - C.T).abs().max() > COVARIANCE_TOL * scale:
            raise bad("has a `covariance` that is not symmetric")
        eye = torch.eye(s, dtype=torch.float64)
        if torch.linalg.cholesky_ex(0.5 * (C + C.T) + COVARIANCE_TOL * scale * eye).info != 0:
            raise bad("has a `covariance` that is not positive semi-definite")
        if C.diagonal().max() > outputscale * (1 + PRIOR_VARIANCE_TOL):
            raise bad(
                f"has posterior variances up to {float(C.diagonal().max()):.6g}, above its prior "
                f"variance `outputscale`={outputscale:.6g}"
            )
        out["best_index"], out["best_value"] = _optimum(payload, bad, s)
        sd, m = math.sqrt(outputscale), float(out["mean_constant"])
        R = MAX_MEAN_DEVIATION
        if self.settings.hides_means():
            if abs(out["best_value"] - m) > R * sd:
                raise bad(
                    f"has `best_value`={out['best_value']:.6g} more than {R:g} signal standard "
                    f"deviations ({sd:.3g}) from `mean_constant`={m:.6g}"
                )
        else:
            mean = out["mean"]
            if float((mean - m).abs().max()) > R * sd:
                raise bad(
                    f"has `mean_constant`={m:.6g} more than {R:g} signal standard deviations "
                    f"({sd:.3g}) from its means on the support"
                )
            best = out["best_index"]
            if out["best_value"] != float(mean[best]) or float(mean[best]) != float(mean.max()):
                raise bad(
                    f"has `best_value`={out['best_value']!r} at `best_index`={best}, but its "
                    f"mean there is {float(mean[best])!r} and its largest {float(mean.max())!r}"
                )
        return out

    def _recommend(self, t: int, optima: dict[int, dict | None]) -> None:
        r"""``x^``: the largest of the agents' local optima (Alg. 1 line 10)."""
        known = {cid: o for cid, o in optima.items() if o is not None}
        if not known:
            return
        cid = max(sorted(known), key=lambda c: known[c]["best_value"])  # first of ties
        assert self.support is not None  # the optima are indices into it
        x = self.support[known[cid]["best_index"]]
        value = known[cid]["best_value"]
        domain = (
            x if self.bounds is None else self.bounds[0] + x * (self.bounds[1] - self.bounds[0])
        )
        self.recommendation = {
            "round": int(t),
            "client": int(cid),
            "x": domain.tolist(),
            "x_unit": x.tolist(),
            "predicted_value": -value if self.minimize else value,
        }
        self.recommendations.append(self.recommendation)

    def _shared_prior(self, posteriors: dict[int, dict | None]) -> dict[str, Tensor]:
        r"""The shared prior off the support: data-size-weighted geometric means of the
        agents' lengthscales, signal and noise variances; weighted mean of their prior
        means."""
        known = [p for p in posteriors.values() if p is not None]
        n = torch.tensor([p["num_data"] for p in known], dtype=torch.float64)
        w = n / n.sum()

        def geometric(key: str) -> Tensor:
            logs = torch.stack([p[key].log() for p in known])
            return (w.reshape(-1, *[1] * (logs.ndim - 1)) * logs).sum(0).exp()

        return {
            "lengthscale": geometric("lengthscale"),
            "outputscale": geometric("outputscale"),
            "noise": geometric("noise"),
            "mean_constant": (w * torch.stack([p["mean_constant"] for p in known])).sum(),
        }

    def _batch(self, t: int, ids: list[int], posteriors: dict[int, dict | None]) -> Tensor:
        r"""Round ``t``'s batch: the barycenter of the agents' posteriors, their local
        models (``beta_t > 0``) and the acquisition's maximiser, one row per agent."""
        cfg = self.settings
        S = self.support
        assert S is not None  # initialize() sends it before round 1
        with self.ledger.timer("barycenter"):
            prior = self._shared_prior(posteriors)
            kernel = shared_kernel(prior["lengthscale"], prior["outputscale"])
            with torch.no_grad():
                K_SS = kernel(S).to_dense().to(torch.float64)
            m0 = prior["mean_constant"]
            # an agent without data counts with the shared prior as its posterior
            stand_in = {**prior, "num_data": 0, "mean": m0.expand(len(S)), "covariance": K_SS}
            # (a parsed posterior each; mypy does not narrow `posteriors[c]`)
            own: dict[int, Any] = {
                c: stand_in if posteriors[c] is None else posteriors[c] for c in ids
            }
            covs = torch.stack([own[c]["covariance"] for c in ids])
            counts = [own[c]["num_data"] for c in ids]
            weights = agent_weights(cfg.weights, covariances=covs, num_data=counts)
            if cfg.hides_means():
                mean = self._secure_mean(ids, weights, posteriors, m0)
                means = mean.expand(len(ids), -1)  # a weighted mean of N copies is itself
            else:
                means = torch.stack([own[c]["mean"] for c in ids])
            central = BarycenterGP(
                S,
                means,
                covs,
                kernel,
                weights=weights,
                noise=prior["noise"],
                mean_constant=m0,
                barycenter_init=self.barycenter_covariance,
                tol=BARYCENTER_TOL,
            )
            self.barycenter_covariance = central.barycenter_covariance.detach().clone()
            self.last_central = central
            beta = float(self.schedule(t))
            if cfg.hides_means() or beta == 0:
                locals_ = [central] * len(ids)  # placeholders: not evaluated at beta = 0
            else:
                locals_ = [self._local_model(own[c]) for c in ids]
        with self.ledger.timer("acquisition"):
            acqf = self._acquisition(central, locals_, beta, t)
            bounds = torch.stack([torch.zeros(self.dim), torch.ones(self.dim)]).double()
            X = optimize_co_acquisition(
                acqf,
                bounds,
                num_restarts=cfg.num_restarts,
                raw_samples=cfg.raw_samples,
                seed=self.round_seed(t),
                options={"maxiter": cfg.maxiter},
            )
        return X.detach().reshape(len(ids), self.dim).clamp(0.0, 1.0)

    def _local_model(self, posterior: dict) -> BarycenterGP:
        r"""An agent's discretised posterior as a one-agent ``BarycenterGP`` (its own
        hyperparameters off the support)."""
        assert self.support is not None  # _batch's
        return BarycenterGP(
            self.support,
            posterior["mean"].unsqueeze(0),
            posterior["covariance"].unsqueeze(0),
            shared_kernel(posterior["lengthscale"], posterior["outputscale"]),
            noise=posterior["noise"],
            mean_constant=posterior["mean_constant"],
        )

    def _secure_mean(self, ids, weights: Tensor, posteriors, m0: Tensor) -> Tensor:
        r"""``sum_n w_n mu_n`` by a secure sum (agents without data add zeros; their
        share ``w_n m0`` of the prior is added here)."""
        assert self.support is not None  # _batch's
        total = self.secure_sum(
            WEIGHTED_MEAN,
            len(self.support),
            args={"weights": weights.numpy(), "clients": np.asarray(ids, dtype=np.int64)},
            clients=ids,
        )
        if total is None:
            raise ProtocolViolation(
                "Server: the secure sum of the agents' means did not reach the server (the "
                "backend keeps sums on the clients); use `aggregator` plaintext or masking."
            )
        mean = torch.as_tensor(np.asarray(total, dtype=np.float64))
        missing = sum(float(weights[i]) for i, c in enumerate(ids) if posteriors[c] is None)
        return mean + missing * m0

    def _acquisition(self, central, locals_, beta: float, t: int):
        r"""Round ``t``'s acquisition on the central and the local models."""
        cfg = self.settings
        seed = self.round_seed(t)
        S = self.support
        if isinstance(cfg, CoKGSettings | BarycenterQKGSettings):
            return qCoKnowledgeGradient(
                central,
                locals_,
                beta=beta,
                num_fantasies=cfg.num_fantasies,
                discrete_support=S if cfg.discrete else None,
                seed=seed,
            )
        if isinstance(cfg, CoEISettings):
            return qCoExpectedImprovement(central, locals_, beta=beta, seed=seed, support=S)
        assert isinstance(cfg, CoESSettings)  # checked at construction
        return qCoMaxValueEntropy(
            central,
            locals_,
            beta=beta,
            candidate_set=S,
            num_mv_samples=cfg.num_mv_samples,
            seed=seed,
        )

    def run(self, on_round=None, start_round=None) -> None:
        r"""Rounds as :meth:`FederatedServer.run`, then Alg. 1's output: every agent's
        local optimum after the last round, and ``x^`` (:attr:`recommendation`).

        Raises:
            ProtocolViolation: An agent's final local optimum fails a check
                (``num_data`` an int in ``0..num_init + num_rounds``, ``best_index`` an
                int on the support, ``best_value`` finite), naming the agent.
        """
        super().run(on_round=on_round, start_round=start_round)
        replies = self.broadcast(Optimum())
        bound = self.settings.num_init + self.settings.num_rounds
        optima: dict[int, dict | None] = {}
        for cid in sorted(replies):
            payload = replies[cid].payload

            def bad(problem: str, cid=cid) -> ProtocolViolation:
                return ProtocolViolation(f"Server: the local optimum of client {cid} {problem}.")

            if _count(payload, bad, bound) == 0:
                optima[cid] = None
                continue
            assert self.support is not None  # initialize() sent it
            index, value = _optimum(payload, bad, len(self.support))
            optima[cid] = {"best_index": index, "best_value": value}
        self._recommend(self.settings.num_rounds, optima)
