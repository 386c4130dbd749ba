r"""FBO-FedGP's default for a batched grid: ``R`` federations' rounds as one program.

Each replication is the federation the protocol runner builds (its clients' seeds,
private generators, objectives and initial designs), and each round does what the
protocol round of :class:`~botorch_fed.algorithms.fbo_fedgp.FBOFedGPServer` and its
clients do (paper 000, Alg. 1 + Alg. 2, with the default preset's choices), every secure
sum simulated in plaintext (each replication's clients' vectors added in client order,
as the ``plaintext`` backend adds them):

1. the support (Alg. 1), at round 0 and every ``support_every`` rounds: each client's
   noisy k-means centres (its private generator's noise seed), the server's global
   k-means (seed ``run seed + t``); or a random support;
2. the federated standardisation of the outcomes (two passes the first time, then one
   around the last mean; the protocol's exact moment sums);
3. every ``hyper_every`` rounds the federated fit: each replication's coordinator's
   :class:`~botorch_fed.protocol.federated_fit.SummaryTrustRegion`, in lockstep, every
   evaluation one batched summary-and-Jacobian of all ``R M`` clients
   (:func:`~botorch_fed.experiments.batched_pic.batched_summary_and_jacobian`);
4. the summed summaries, every client's PIC model (:class:`~botorch_fed.experiments.
   batched_pic.BatchedPICGP`) and one batched UCB search with each client's step seed.

Only the default's choices run batched (``mixing="global"``, ``global_model="pic"``,
``hyperparameters="federated"``, UCB); other settings are refused.

At ``R = 1`` on the CPU the points are the protocol clients' to about 1e-9: the models agree
to float64 rounding (so do a replication's models alone and among other replications, whose
batches round a little differently). A refit can amplify such differences where the
trust region's inner L-BFGS-B stops abnormally (rare); regret distributions are compared in
``benchmarks/batched_grid_equivalence.py``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from botorch.acquisition import UpperConfidenceBound
from torch import Tensor

from botorch_fed.algorithms.fbo_fedgp.domain import clamp_to_domain, outcome_bound, theta_domain
from botorch_fed.algorithms.fbo_fedgp.settings import FBOFedGPSettings, global_modules
from botorch_fed.experiments.batched_gp import maximize_batched
from botorch_fed.experiments.batched_pic import (
    BatchedPICGP,
    batched_summaries,
    batched_summary_and_jacobian,
)
from botorch_fed.inducing import global_support, local_centers, random_support
from botorch_fed.models import (
    PITCHyperparameters,
    SparseSummary,
    center_from_moments,
    centred_moments,
    moments_around,
    outcome_moments,
    standardize_around,
    standardize_from_moments,
)
from botorch_fed.protocol.bo_client import private_generator
from botorch_fed.protocol.federated_fit import SummaryTrustRegion, fit_loss
from botorch_fed.protocol.round_budget import round_seed

#: what the batched runner takes from FBO-FedGP's resolved settings (the default's)
BATCHED_CHOICES = {"mixing": "global", "global_model": "pic", "hyperparameters": "federated",
                   "acquisition": "ucb"}  # fmt: skip


def check_batched_settings(settings: FBOFedGPSettings) -> FBOFedGPSettings:
    r"""The resolved settings, or ``ValueError`` naming the first setting the batched
    runner does not run (it runs :data:`BATCHED_CHOICES`)."""
    resolved = settings.resolved()
    for name, value in BATCHED_CHOICES.items():
        if getattr(resolved, name) != value:
            raise ValueError(
                f"`settings.{name}`={getattr(resolved, name)!r}: the batched runner runs "
                f"FBO-FedGP's default choices ({name}={value!r})."
            )
    return resolved


def _sum(vectors: Sequence[np.ndarray]) -> np.ndarray:
    r"""The plaintext backend's sum: float64 additions in client order, from zeros."""
    total = np.zeros_like(vectors[0], dtype=np.float64)
    for v in vectors:
        total += v
    return total


class FBOGrid:
    r"""The state of ``R`` FBO-FedGP federations of ``M`` clients between rounds.

    Args:
        contexts: Each replication's :class:`~botorch_fed.protocol.registry.BuildContext`
            (built with ``private_randomness="seed"`` as the protocol runner builds a
            simulation's, or with a crypto seed).
        settings: FBO-FedGP's settings (:func:`check_batched_settings`).
        device: Where the models and the search run.
    """

    def __init__(self, contexts, settings: FBOFedGPSettings, device: torch.device) -> None:
        settings.validate()
        if any(ctx.private_randomness == "os" for ctx in contexts):
            raise ValueError(
                "`contexts` must be built with private_randomness='seed' or a crypto seed "
                "(the clients' private generators of a simulation, reproducible)."
            )
        self.cfg = check_batched_settings(settings)
        self.R, self.M, self.d = len(contexts), len(contexts[0].objectives), contexts[0].dim
        self.device = device
        self.run_seeds = [int(ctx.setup.seed) for ctx in contexts]
        self.client_seeds = [s for ctx in contexts for s in ctx.client_seeds]
        self.private = [
            private_generator(ctx.private_seed(cid)) for ctx in contexts for cid in range(self.M)
        ]
        hyper = PITCHyperparameters(*global_modules(self.d))
        self.domain = theta_domain(hyper)
        self.thetas = [hyper.get_theta() for _ in contexts]  # every client's, per replication
        self.support_size = self.cfg.support_size
        self.supports: list[Tensor] = []  # each replication's m_r x d
        self._centers: list[tuple[int, Tensor] | None] = [None] * (self.R * self.M)
        self.standardize: list | None = None  # each replication's Standardize
        self._hyper_round: int | None = None
        self.bound = outcome_bound(self.M, self.cfg.num_init, self.cfg.num_rounds)

    # --- the server's steps ---------------------------------------------------------------
    def select_support(self, t: int, X: Tensor) -> None:
        r"""Alg. 1 (or a random support) for every replication, from ``B x n x d`` data."""
        c, supports = self.cfg, []
        if t > 0:
            self.support_size += c.support_growth
        for r, seed in enumerate(self.run_seeds):
            if c.support == "random":
                bounds = torch.stack([torch.zeros(self.d), torch.ones(self.d)]).double()
                support = random_support(bounds, self.support_size, seed=seed + t)
            else:
                centers = [self._client_centers(r * self.M + i, X) for i in range(self.M)]
                centers = [x for x in centers if len(x)]
                if centers:
                    support = global_support(centers, self.support_size, seed=seed + t)
                else:  # no client holds enough data yet
                    bounds = torch.stack([torch.zeros(self.d), torch.ones(self.d)]).double()
                    support = random_support(bounds, self.support_size, seed=seed + t)
            supports.append(support.clamp(0.0, 1.0))
        self.supports = supports

    def _client_centers(self, b: int, X: Tensor) -> Tensor:
        r"""Member ``b``'s answer to ``Centers`` (``FBOFedGPClient.on_centers``)."""
        c, Xb = self.cfg, X[b]
        if len(Xb) < c.min_cluster_size:
            return torch.empty(0, self.d, dtype=torch.float64)
        cached = self._centers[b]
        if cached is not None and cached[0] == len(Xb):
            return cached[1]
        noise = c.center_noise
        assert noise is not None  # resolved() sets it
        noise_seed = None
        if noise > 0:
            draws = torch.randint(2**62, (4,), generator=self.private[b]).tolist()
            noise_seed = sum(int(v) << (62 * i) for i, v in enumerate(draws))
        centers = local_centers(
            Xb, c.centers_per_client, noise_seed=noise_seed, seed=self.client_seeds[b],
            noise_std=noise, min_cluster_size=c.min_cluster_size,
        ).clamp(0.0, 1.0)  # fmt: skip
        self._centers[b] = (len(Xb), centers)
        return centers

    def standardize_outcomes(self, Y: Tensor) -> None:
        r"""Every replication's federated standardisation of its ``M`` clients' outcomes."""
        out = []
        for r in range(self.R):
            Ys = Y[r * self.M : (r + 1) * self.M]
            if self.standardize is None:  # two passes
                first = _sum([outcome_moments(y) for y in Ys])
                _, center = center_from_moments(first, max_contributors=self.M)
                second = _sum([centred_moments(y, center) for y in Ys])
                out.append(standardize_from_moments(first, second, max_contributors=self.M))
            else:  # one pass around the last mean
                around = float(self.standardize[r].means.reshape(-1)[0])
                total = _sum([moments_around(y, around) for y in Ys])
                out.append(standardize_around(total, around, max_contributors=self.M))
        self.standardize = out

    def transformed_Y(self, Y: Tensor) -> Tensor:
        r"""Every member's outcomes standardised by its replication's transform and clamped
        into ``[-Z, Z]`` (``FBOFedGPClient._transformed_Y``): ``B x n x 1``."""
        assert self.standardize is not None
        parts = [tf(Y[r * self.M : (r + 1) * self.M])[0] for r, tf in enumerate(self.standardize)]
        return torch.cat(parts).clamp(-self.bound, self.bound)

    def hyper_due(self, t: int) -> bool:
        every = self.cfg.hyper_every
        assert every is not None  # resolved() sets it
        return self._hyper_round is None or t - self._hyper_round >= every

    def fit(self, t: int, X: Tensor, Yt: Tensor) -> None:
        r"""Every replication's federated fit (its coordinator's trust region from the
        current hyperparameters clamped into the domain), in lockstep."""
        regions: list[SummaryTrustRegion] = []
        pending: list[np.ndarray | None] = []
        for theta, support in zip(self.thetas, self.supports, strict=True):
            hyper = PITCHyperparameters(*global_modules(self.d))  # fresh modules: the loss's own

            def loss(summary: np.ndarray, th: np.ndarray, hyper=hyper, m=support.shape[0]):
                hyper.set_theta(th)
                return fit_loss(summary, m, hyper)

            x0 = clamp_to_domain(theta, self.domain)
            region = SummaryTrustRegion(x0, self.domain, self.cfg.federated_maxiter, loss)
            regions.append(region)
            pending.append(region.start())
        supports = self._member_supports()
        X, Yt = X.to(self.device), Yt.to(self.device)
        while any(p is not None for p in pending):
            thetas = [self.thetas[r] if p is None else p for r, p in enumerate(pending)]
            vectors = batched_summary_and_jacobian(X, Yt, supports, self._members(thetas))
            for r, region in enumerate(regions):
                if pending[r] is None:
                    continue
                length = SparseSummary.packed_length(len(self.supports[r]))
                total = _sum(vectors[r * self.M : (r + 1) * self.M])
                pending[r] = region.feed(total[:length], total[length:].reshape(length, -1))
                if pending[r] is None:
                    assert region.result is not None
                    self.thetas[r] = np.asarray(region.result.x, dtype=np.float64)
        self._hyper_round = t

    def _member_supports(self) -> list[Tensor]:
        return [S.to(self.device) for S in self.supports for _ in range(self.M)]

    def _members(self, per_replication: list) -> list:
        return [z for z in per_replication for _ in range(self.M)]

    # --- the clients' global step ---------------------------------------------------------
    def model(self, X: Tensor, Yt: Tensor) -> BatchedPICGP:
        r"""Every client's PIC model from its replication's summed summary."""
        assert self.standardize is not None
        supports, thetas = self._member_supports(), self._members(self.thetas)
        X, Yt = X.to(self.device), Yt.to(self.device)
        own = batched_summaries(X, Yt, supports, thetas)
        summaries = [
            SparseSummary.from_numpy(_sum(own[r * self.M : (r + 1) * self.M]), len(S),
                                     device=self.device)
            for r, S in enumerate(self.supports)
        ]  # fmt: skip
        means = torch.cat([tf.means.reshape(1) for tf in self.standardize])
        stdvs = torch.cat([tf.stdvs.reshape(1) for tf in self.standardize])
        means, stdvs = (z.repeat_interleave(self.M).to(self.device) for z in (means, stdvs))
        return BatchedPICGP(supports, self._members(summaries), thetas, X, Yt, means, stdvs)

    def step(self, t: int, X: Tensor, Y: Tensor) -> Tensor:
        r"""Round ``t`` of every replication: ``B x d`` points, one per client."""
        c = self.cfg
        if c.support_every and t > 1 and (t - 1) % c.support_every == 0:
            self.select_support(t, X)
        self.standardize_outcomes(Y)
        Yt = self.transformed_Y(Y)
        if self.hyper_due(t):
            self.fit(t, X, Yt)
        model = self.model(X, Yt)
        restarts = c.num_restarts
        x, _ = maximize_batched(
            UpperConfidenceBound(model, beta=c.beta_at(t, self.d)), model,
            seeds=[round_seed(s, t) for s in self.client_seeds], num_restarts=restarts,
            raw_samples=max(c.raw_samples, 4 * restarts), maxiter=c.maxiter,
        )  # fmt: skip
        return x.detach().to(device="cpu", dtype=torch.float64).clamp(0.0, 1.0)
