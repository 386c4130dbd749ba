r"""Small shared set-ups for the LDP-BO learner tests (domains, learners, rewards)."""

from __future__ import annotations

import torch

from botorch_fed.ldp import ATAGPUCB, GPUCB, TGPUCB, MoMAGPUCB, RewardModel, make_kernel
from tests.helpers.ldp_dense import F64, LENGTHSCALE

#: 10 points, spacing 0.1: cond(K_D) ~ 6e4 for the SE kernel with l = 0.2, so the
#: exact learners' Nystrom map on all distinct plays keeps every eigenvalue (rtol 1e-10).
DOMAIN = torch.linspace(0.05, 0.95, 10, dtype=F64).unsqueeze(-1)

PRIVATE = RewardModel(B=1.0, R=0.5, epsilon=2.0)  # L = 1.5
LEARNER_CLASSES = [GPUCB, TGPUCB, ATAGPUCB, MoMAGPUCB]


def kernel(dim: int = 1):
    return make_kernel("se", LENGTHSCALE, dim=dim)


def make(cls, horizon: int = 100, rewards: RewardModel = PRIVATE, candidates=DOMAIN, dim=1, **kw):
    r"""A learner with the SE kernel (l = 0.2) and small, test-friendly defaults
    (MoMA: ``k = 4``, ``q = 50``; box domains: a cheap ``optimize_acqf``)."""
    if cls is MoMAGPUCB:
        kw.setdefault("k", 4)
        kw.setdefault("q", 50.0)
    if candidates is None:
        kw.setdefault("num_restarts", 2)
        kw.setdefault("raw_samples", 32)
        kw.setdefault("maxiter", 20)
    return cls(kernel(dim), dim, horizon, rewards, candidates=candidates, **kw)


def rewards(n: int, seed: int, scale: float = 1.0) -> torch.Tensor:
    r"""``n`` heavy-tailed rewards (Laplace, scale ``scale``), reproducible."""
    g = torch.Generator().manual_seed(seed)
    u = torch.rand(n, generator=g, dtype=F64) - 0.5
    return -scale * torch.sign(u) * torch.log1p(-2 * u.abs())


def play(learner, ys, points=None):
    r"""Observe ``ys`` in turn, at the learner's proposals or at ``points`` (indices into
    its candidates, cycled)."""
    for i, y in enumerate(ys):
        if points is None:
            x = learner.propose()
        else:
            j = points[i % len(points)]
            x = learner.candidates[j : j + 1]
        learner.observe(x, y)
