r"""LDP-BO on a finite domain for a batched grid: ``R`` replications in lockstep, the exact
learners' surrogates as one program.

Each replication is the federation the protocol runner builds: its learner (the server's,
:func:`~botorch_fed.algorithms.ldp_bo.settings.make_learner`, whose seeded generator
breaks the ties), its users (the protocol's clients, with their noise streams and, for a
private variant, their Laplace mechanisms and budgets) and the server's choice of user
each round (:class:`~botorch_fed.algorithms.ldp_bo.LDPServer`). A round of every
replication is what the protocol round does ([LDP-BO] Alg. 2; IGP-UCB for ``gp-ucb``):

1. the posterior mean and variance of the exact GP of every replication on the whole
   finite domain ``D`` at once, from the counts and sums of the (truncated) rewards per
   point (:func:`exact_posterior`, one batched Cholesky factorisation over the points
   played). The learner computes the same posterior in the feature space of the Nystrom
   map on its distinct played points, which drops the kernel matrix's eigenvalues below
   ``1e-10`` of the largest: the two agree to about that relative size (more where
   ``lam`` is small), not to the last bits;
2. each replication's UCB maximiser over ``D`` with its learner's ``beta_t`` (ties broken by
   the learner's generator, as :meth:`~botorch_fed.ldp.ucb_learner.UCBLearner.propose`), so
   the points are the protocol's unless two UCB values lie within that difference;
3. the query to the user the server picks, answered by the protocol client's own handler
   (evaluation, clipping and privatisation), and the learner's own bookkeeping
   (:meth:`~botorch_fed.ldp.exact_learners.GPUCB.observe_with_variance`: the information
   gain ``gamma`` from the batched variance, the truncation of the reward for ``tgp`` and
   ``ldp-tgp``, the counts and sums); its surrogate is refitted only when read.

Only the users' answers stay per replication (a few Python calls each); the posteriors and
the searches are batched, on ``device``. ATA's and MoMA's learners (``ata``, ``ldp-ata``,
``moma``, ``ldp-moma``), whose Nystrom dictionaries are random subsets of a different size
in every replication, run one replication at a time in the same lockstep
(:class:`LDPGrid`).

.. [LDP-BO] X. Zhou, J. Tan. Local differential privacy for Bayesian optimization
   (paper 002 in ``shared/papers``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from botorch_fed.algorithms.ldp_bo import LDPServer
from botorch_fed.algorithms.ldp_bo.messages import Query
from botorch_fed.ldp.exact_learners import GPUCB, TGPUCB

#: the LDP-BO algorithms whose posteriors run batched (the exact GP, on a finite domain)
EXACT_LEARNERS = ("gp-ucb", "tgp", "ldp-tgp")
#: the LDP-BO algorithms a grid runs (the Nystrom learners one replication at a time)
LDP_ALGORITHMS = (*EXACT_LEARNERS, "ata", "ldp-ata", "moma", "ldp-moma")


def exact_posterior(K: Tensor, counts: Tensor, sums: Tensor, lam: float) -> tuple[Tensor, Tensor]:
    r"""The exact GP posterior on a finite domain from repeated plays.

    With ``P`` the points played (``m`` of them, padded to the batch's largest ``m`` with
    unplayed points, which add nothing), ``C = diag(counts_P)`` and
    ``A = C^{1/2} K_PP C^{1/2} + lam I``: ``mu = K_DP C^{1/2} A^{-1} C^{-1/2} s_P`` and
    ``sigma^2 = diag(K) - diag(K_DP C^{1/2} A^{-1} C^{1/2} K_PD)``, the posterior of the
    plays with their repetitions (``K_xX (K_XX + lam I)^{-1} y`` by the push-through
    identity). ``A``'s eigenvalues are at least ``lam``: duplicate domain points and a
    singular ``K`` are harmless. ``O(batch (m^3 + m^2 n))`` time, ``O(batch m n)`` memory.

    Args:
        K: ``n x n`` kernel matrix of the domain (its dtype and device are the result's).
        counts: ``batch x n`` plays of each point (``>= 0``).
        sums: ``batch x n`` sums of the targets received at each point (0 where unplayed).
        lam: The noise variance (ridge) ``lambda > 0``.

    Returns:
        ``(mean, variance)``, each ``batch x n``; variances clamped at 0.
    """
    n = K.shape[-1]
    if K.shape != (n, n):
        raise ValueError(f"`K` must be n x n, got shape {tuple(K.shape)}.")
    if counts.shape[-1:] != (n,) or counts.shape != sums.shape or counts.ndim != 2:
        raise ValueError(
            f"`counts` and `sums` must both be batch x {n}, got {tuple(counts.shape)} and "
            f"{tuple(sums.shape)}."
        )
    if (counts < 0).any():
        raise ValueError("`counts` must be >= 0.")
    if not (isinstance(lam, int | float) and math.isfinite(lam) and lam > 0):
        raise ValueError(f"`lam`={lam!r} must be a finite number > 0.")
    counts, sums = counts.to(K), sums.to(K)
    played = counts > 0
    m = int(played.sum(-1).max())
    if m == 0:  # the prior
        return torch.zeros_like(counts), K.diagonal().expand_as(counts).clone()
    # the played points first (stable: in domain order), then unplayed padding
    index = torch.argsort((~played).to(torch.int8), dim=-1, stable=True)[:, :m]
    c, s = counts.gather(-1, index), sums.gather(-1, index)
    root = c.sqrt()
    K_P = K[index]  # batch x m x n
    A = root.unsqueeze(-1) * K_P.gather(-1, index.unsqueeze(-2).expand(-1, m, -1))
    A = A * root.unsqueeze(-2) + lam * torch.eye(m, dtype=K.dtype, device=K.device)
    L = torch.linalg.cholesky(A)
    W = torch.linalg.solve_triangular(L, root.unsqueeze(-1) * K_P, upper=False)
    u = torch.where(c > 0, s / torch.where(c > 0, root, torch.ones_like(root)), 0.0)
    z = torch.linalg.solve_triangular(L, u.unsqueeze(-1), upper=False)
    mean = (W.mT @ z).squeeze(-1)
    variance = K.diagonal() - W.square().sum(-2)
    return mean, variance.clamp_min(0.0)


def build_replications(spec, contexts) -> tuple[list[LDPServer], list[dict]]:
    r"""Each replication's server and users (``client id -> client``), built as the
    protocol runner builds them (:func:`~botorch_fed.protocol.runner.make_client`, the
    spec's server over an in-process transport the grid does not use)."""
    from botorch_fed.protocol.runner import make_client
    from botorch_fed.protocol.transport import InProcessTransport

    servers, clients = [], []
    for ctx in contexts:
        users = {cid: make_client(spec, ctx, cid) for cid in ctx.client_ids}
        servers.append(spec.make_server(ctx, InProcessTransport(users)))
        clients.append(users)
    return servers, clients


class LDPGrid:
    r"""``R`` replications of an LDP-BO learner and its users in lockstep.

    The exact learners (:data:`EXACT_LEARNERS`) share one batched posterior a round
    (:func:`exact_posterior`); ATA's and MoMA's learners, whose Nystrom dictionaries are
    random subsets of a different size in each replication, propose and observe one
    replication at a time (their work is a small part of a round: MoMA's once an epoch).
    Every replication's users answer through their own handlers.

    Args:
        servers: Each replication's :class:`~botorch_fed.algorithms.ldp_bo.LDPServer`
            (its learner, its choice of users), as the protocol runner builds it.
        clients: Each replication's users (``client id -> client``).
        device: Where the batched posteriors and searches run.
    """

    def __init__(
        self,
        servers: Sequence[LDPServer],
        clients: Sequence[dict],
        device: torch.device,
    ) -> None:
        if len(servers) != len(clients) or not servers:
            raise ValueError(
                f"`servers` and `clients` must hold the same replications, got "
                f"{len(servers)} and {len(clients)}."
            )
        learners = [s.learner for s in servers]
        first = learners[0]
        if any(type(lr) is not type(first) for lr in learners):
            raise ValueError("Every replication must run the same learner.")
        if first.candidates is None:
            raise ValueError(
                "The batched runner runs LDP-BO on a finite domain (an objective with "
                "`candidates`, e.g. ldp-synthetic)."
            )
        self.servers, self.clients, self.learners = list(servers), list(clients), learners
        self.device = device
        self.exact = type(first) in (GPUCB, TGPUCB)
        if not self.exact:
            return
        with torch.no_grad():
            K = first.kernel(first.candidates).to_dense().to(torch.float64)
            for lr in learners[1:]:
                if lr.candidates is None or not torch.equal(lr.candidates, first.candidates):
                    raise ValueError("Every replication must share the finite domain.")
                if not torch.equal(lr.kernel(lr.candidates).to_dense(), K):
                    raise ValueError("Every replication must share the kernel.")
                if lr.lam != first.lam:
                    raise ValueError("Every replication must share `lam`.")
        self.K = K.to(device)

    def plays(self) -> tuple[Tensor, Tensor]:
        r"""Every replication's plays per domain point and the sums of their targets
        (``R x n`` each, on ``device``), read from the learners' own counts and sums."""
        assert self.exact  # the exact learners' state only
        n = len(self.K)
        counts = torch.zeros(len(self.learners), n, dtype=torch.float64)
        sums = torch.zeros(len(self.learners), n, dtype=torch.float64)
        for r, learner in enumerate(self.learners):
            points, domain = learner._points, learner.candidates
            # the domain index of each distinct point played (every one is in the domain)
            index = (points.unsqueeze(-2) == domain).all(-1).long().argmax(-1)
            counts[r, index], sums[r, index] = learner._counts, learner._sums
        return counts.to(self.device), sums.to(self.device)

    def _ask(self, r: int, x: Tensor, t: int) -> float:
        r"""The reward replication ``r``'s server receives for ``x`` in round ``t``."""
        server = self.servers[r]
        user = server._user(t)
        server.queries[user] = server.queries.get(user, 0) + 1
        reply = self.clients[r][user].on_query(Query(x=x.reshape(-1).numpy(), t=t))
        if "y" not in reply:
            raise ValueError(
                f"user {user} of replication {r} returned no reward in round {t}: the "
                "batched runner needs evaluations that do not fail."
            )
        return float(reply["y"])

    def step(self, t: int) -> None:
        r"""Round ``t`` of every replication: propose, query, observe."""
        if not self.exact:
            for r, learner in enumerate(self.learners):
                x = learner.propose()
                learner.observe(x, self._ask(r, x, t))
            return
        counts, sums = self.plays()
        mean, var = exact_posterior(self.K, counts, sums, self.learners[0].lam)
        betas = torch.tensor([lr.beta() for lr in self.learners], dtype=torch.float64)
        ucb = (mean + betas.to(self.device).unsqueeze(-1) * var.sqrt()).cpu()
        var = var.cpu()
        for r, learner in enumerate(self.learners):
            row = ucb[r]
            # UCBLearner.propose's tie rule and its generator's draw
            best = (row >= row.max() - 1e-12 * max(1.0, float(row.abs().max()))).nonzero()
            pick = int(best[int(torch.randint(len(best), (1,), generator=learner.generator))])
            x = learner.candidates[pick].unsqueeze(0)
            y = self._ask(r, x, t)
            # the learner's own bookkeeping, with the variance of the batched posterior
            learner.observe_with_variance(x, y, float(var[r, pick]))
