r"""LDP-BO [LDP-BO]: a learner (the server) queries one user (a client) per round; the
user returns its reward, privatised by the private variants with Curator 1
(:class:`~botorch_fed.privacy.LaplaceMechanism`) within its ``user_budget``. Registered:
``ldp-tgp``, ``ldp-ata``, ``ldp-moma`` (Alg. 2, 1, 3, private), ``tgp``, ``ata``, ``moma``
(raw heavy-tailed rewards), ``gp-ucb`` (IGP-UCB on raw rewards).

.. [LDP-BO] X. Zhou, J. Tan. Local differential privacy for Bayesian optimization
   (paper 002 in ``shared/papers``).
"""

from __future__ import annotations

from functools import partial

from botorch_fed.algorithms.ldp_bo.client import LDPUserClient
from botorch_fed.algorithms.ldp_bo.server import LDPServer
from botorch_fed.algorithms.ldp_bo.settings import (
    VARIANTS,
    LDPBOSettings,
    answers_per_user,
    make_learner,
    reward_model,
)
from botorch_fed.privacy import LaplaceMechanism, PrivacyLedger
from botorch_fed.protocol.registry import AlgorithmSpec, register_algorithm

__all__ = ["LDPBOSettings", "LDPServer", "LDPUserClient"]


def _check(name: str, ctx) -> None:
    r"""Privacy settings of a non-private variant are refused (not ignored); a private
    run must fit the users' budgets; the learner must be buildable."""
    s = ctx.settings
    given = [n for n in ("epsilon", "user_budget") if getattr(s, n) is not None]
    if not VARIANTS[name][1] and given:
        names = " and ".join(f"`{n}`" for n in given)
        raise ValueError(f"{name} sends raw rewards: remove {names} (ldp-* variants privatise).")
    per_user, M = answers_per_user(s), len(ctx.objectives)
    if per_user is not None and per_user * M < s.num_rounds:
        raise ValueError(
            f"`user_budget`={s.user_budget:g} allows {per_user} answer(s) of `epsilon`="
            f"{1.0 if s.epsilon is None else s.epsilon:g} per user: {M} users can answer "
            f"{per_user * M} of the `num_rounds`={s.num_rounds} queries. Add users, raise "
            "the budget or lower `num_rounds`."
        )
    make_learner(name, s, ctx.objectives[0], seed=ctx.setup.seed)


def _make_client(name: str, ctx, cid: int) -> LDPUserClient:
    s, objective, mechanism = ctx.settings, ctx.objectives[cid], None
    if VARIANTS[name][1]:  # private randomness: never the public seed
        r = reward_model(name, s, objective)
        assert r.epsilon is not None and r.R is not None
        seed, ledger = ctx.private_seed(cid), PrivacyLedger()
        mechanism = LaplaceMechanism(r.epsilon, r.B, r.R, seed=seed, ledger=ledger, user=cid)
    M = len(ctx.objectives)
    return LDPUserClient(cid, objective, mechanism, s, M, ctx.setup.evaluation_errors)


def _make_server(name: str, ctx, transport) -> LDPServer:
    s, objective, seed = ctx.settings, ctx.objectives[0], ctx.setup.seed
    return LDPServer(transport, s, make_learner(name, s, objective, seed=seed), seed, objective)


_SUMMARIES = {
    "ldp-tgp": "LDP-TGP-UCB: users privatise rewards (Laplace); exact GP on truncated rewards",
    "ldp-ata": "LDP-ATA-GP-UCB: users privatise rewards; Nystrom features, adaptive truncation",
    "ldp-moma": "LDP-MoMA-GP-UCB: users privatise rewards; epochs, median of means, Nystrom",
    "tgp": "TGP-UCB for heavy-tailed noise (no privacy): exact GP on truncated rewards",
    "ata": "ATA-GP-UCB for heavy-tailed noise (no privacy): Nystrom, adaptive truncation",
    "moma": "MoMA-GP-UCB for heavy-tailed noise (no privacy): epochs, median of means",
    "gp-ucb": "GP-UCB (IGP-UCB) on raw rewards, one query per round (baseline)",
}

for _name in VARIANTS:
    register_algorithm(
        AlgorithmSpec(
            name=_name,
            summary=_SUMMARIES[_name],
            settings_class=LDPBOSettings,
            make_client=partial(_make_client, _name),
            make_server=partial(_make_server, _name),
            check=partial(_check, _name),
            cumulative_regret=True,
        )
    )
