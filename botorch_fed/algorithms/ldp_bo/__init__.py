r"""LDP-BO on the federation protocol: a learner (the server) and its users (the clients).

[LDP-BO]'s setting, as a round-based program: in round ``t`` the server's learner
proposes ``x_t`` and sends it to one user; the user evaluates its black box, privatises
the reward with Curator 1 (:class:`~botorch_fed.privacy.LaplaceMechanism`: clip to
``[-(B + R), B + R]``, add ``Laplace(2 (B + R) / epsilon)``) and returns only that; the
learner updates. The raw reward never leaves the user: the server sees ``x_t`` (it
chose it) and the privatised value. Users answer in turn (``users="round-robin"``) or
drawn at random.

Registered algorithms (``botorch-fed run <name>``):

=============  ===============================================  =========
name           learner                                          rewards
=============  ===============================================  =========
``ldp-tgp``    :class:`~botorch_fed.ldp.TGPUCB` (Alg. 2)        private
``ldp-ata``    :class:`~botorch_fed.ldp.ATAGPUCB` (Alg. 1)      private
``ldp-moma``   :class:`~botorch_fed.ldp.MoMAGPUCB` (Alg. 3)     private
``tgp``        TGP-UCB (heavy-tailed noise)                      raw
``ata``        ATA-GP-UCB (heavy-tailed noise)                   raw
``moma``       MoMA-GP-UCB (heavy-tailed noise)                  raw
``gp-ucb``     :class:`~botorch_fed.ldp.GPUCB` (IGP-UCB)         raw
=============  ===============================================  =========

Privacy accounting is the users' own: each keeps a
:class:`~botorch_fed.privacy.PrivacyLedger` of its releases; the run's result merges
them (``RunResult.privacy``). Under basic composition a user who answers ``k`` queries
has spent ``k epsilon``: with ``M`` users and ``T`` rounds that is about
``(T / M) epsilon`` each. ``user_budget`` caps it: a user refuses any query beyond its
budget (a server that re-queries one user to average the noise away is refused), and a
run whose rounds cannot fit the users' budgets is refused before it starts.

What a user accepts (the query of :mod:`.messages`; its turns, budget and private
noise) is :mod:`.client`; the learner's side is :mod:`.server`, the settings and the
learners they define :mod:`.settings`.

References:

.. [LDP-BO] X. Zhou, J. Tan. Local differential privacy for Bayesian optimization
   (paper 002 in ``shared/papers``).
"""

from __future__ import annotations

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


def _check_privacy_settings(name: str, ctx) -> None:
    r"""Privacy settings of a non-private variant are refused (not silently ignored),
    and a private run must fit the users' budgets."""
    s = ctx.settings
    if not VARIANTS[name][1]:
        given = [n for n in ("epsilon", "user_budget") if getattr(s, n) is not None]
        if given:
            private = f"; ldp-{name} privatises them" if name != "gp-ucb" else ""
            raise ValueError(
                f"{name} sends raw rewards (no privacy): "
                + " and ".join(f"`{n}`" for n in given)
                + (" does" if len(given) == 1 else " do")
                + f" not apply{private}."
            )
        return
    if s.user_budget is None:
        return
    per_user = answers_per_user(s)
    assert per_user is not None  # a user_budget: a number of answers
    M = len(ctx.objectives)
    if per_user * M < s.num_rounds:
        raise ValueError(
            f"`user_budget`={s.user_budget:g} allows {per_user} answer(s) of `epsilon`="
            f"{1.0 if s.epsilon is None else s.epsilon:g} per user: {M} users can answer "
            f"{per_user * M} of the `num_rounds`={s.num_rounds} queries. Add users, raise "
            "the budget or lower `num_rounds`."
        )


def _check(name: str):
    def check(ctx) -> None:
        _check_privacy_settings(name, ctx)
        make_learner(name, ctx.settings, ctx.objectives[0], seed=ctx.setup.seed)

    return check


def _make_client(name: str):
    private = VARIANTS[name][1]

    def build(ctx, cid: int) -> LDPUserClient:
        s = ctx.settings
        mechanism = None
        if private:
            rewards = reward_model(name, s, ctx.objectives[cid])
            # a private variant's reward model has both
            assert rewards.epsilon is not None and rewards.R is not None
            mechanism = LaplaceMechanism(
                rewards.epsilon,
                rewards.B,
                rewards.R,
                seed=ctx.private_seed(cid),  # private randomness: never the public seed
                ledger=PrivacyLedger(),
                user=cid,
            )
        return LDPUserClient(
            cid,
            ctx.objectives[cid],
            mechanism,
            budget=s.user_budget if private else None,
            evaluation_errors=ctx.setup.evaluation_errors,
            num_rounds=s.num_rounds,
            num_users=len(ctx.objectives),
            users=s.users,
        )

    return build


def _make_server(name: str):
    def build(ctx, transport) -> LDPServer:
        _check_privacy_settings(name, ctx)
        learner = make_learner(name, ctx.settings, ctx.objectives[0], seed=ctx.setup.seed)
        objective = ctx.objectives[0]
        return LDPServer(
            transport,
            ctx.settings,
            learner,
            seed=ctx.setup.seed,
            bounds=objective.bounds,
            minimize=objective.minimize,
        )

    return build


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
            make_client=_make_client(_name),
            make_server=_make_server(_name),
            check=_check(_name),
            cumulative_regret=True,
        )
    )
