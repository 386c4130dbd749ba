r"""What a party accepts from a run: its own policy, not the server's.

On Flower the run's options (the run config) come from whoever submits the run -- the
server's operator, whom a party need not trust. Options decide how much a party
reveals: ``--aggregator plaintext`` sends its summaries in the clear,
``--crypto-seed`` makes its private randomness (key material, masks, centre noise, LDP
noise) computable by anyone who knows the seed, ``--objective`` names code the party
imports and runs, and the final report hands the server the party's every evaluation.
The algorithm itself decides what the server sees (``central`` takes raw data). Each
party's agent therefore refuses a run that asks for more than its policy allows
(:class:`PartyPolicy`, set by the party on its own command line); the defaults allow
none of it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

PRIVATE_ALGORITHMS = ("fbo-fedgp", "ldp-tgp", "ldp-ata", "ldp-moma", "local", "random")
r"""The algorithms a party joins by default: those whose messages do not show the
server the party's data, outcomes or posterior (README's table, "server sees")."""


class PolicyError(PermissionError):
    r"""A run asks a party for something its policy does not allow."""


@dataclass(frozen=True)
class PartyPolicy:
    r"""A party's policy.

    Attributes:
        allow_plaintext: Take part in runs whose secure sums use the ``plaintext``
            backend (the server sees every summary).
        allow_crypto_seed: Take part in runs with ``--crypto-seed`` (reproducible
            experiments: whoever knows the seed can undo the protection).
        objectives: The ``--objective MODULE:FUNCTION`` values this party runs (its own
            black box); a run naming another is refused. Built-in problems are always
            allowed.
        share_results: Answer the server's final report with this party's evaluation
            history and privacy ledger (what the run's JSON scores). Without it the
            party keeps them: the server's results then hold no evaluations of it.
        algorithms: The algorithms this party joins (``"all"``: every one); by default
            :data:`PRIVATE_ALGORITHMS` (``central``, the Co-KG family, ``fts``,
            ``fedzero`` and the non-private LDP-BO learners show the server raw data,
            posteriors or function values).
        allow_exact_centres: Take part in FBO-FedGP runs whose clustered support set
            takes the clients' exact k-means centres (``--center-noise 0``, the paper's
            preset), centres with less noise than ``min_center_noise`` or of clusters
            of fewer than 2 points (``--min-cluster-size 1``).
        min_center_noise: The least std of the noise on the centres this party sends.
        max_epsilon: The largest LDP ``epsilon`` per answer this party's users accept.
        min_epsilon: The smallest (a failed evaluation is answered in the clear and
            counts as an answer at the run's epsilon: a tiny epsilon would otherwise buy
            many such bits from ``max_total_epsilon``).
        max_total_epsilon: The most LDP ``epsilon`` this party's agent spends over all
            the runs it answers, under basic composition (``inf``: no cap). A run's own
            ``--user-budget`` is the server's to set; this cap is the party's, so a
            server that starts new runs to ask again (and average the noise away)
            gets at most ``max_total_epsilon / epsilon`` answers in all.
    """

    allow_plaintext: bool = False
    allow_crypto_seed: bool = False
    objectives: tuple[str, ...] = field(default_factory=tuple)
    share_results: bool = False
    algorithms: tuple[str, ...] = PRIVATE_ALGORITHMS
    allow_exact_centres: bool = False
    max_epsilon: float = 1.0
    max_total_epsilon: float = 10.0
    min_epsilon: float = 0.1
    min_center_noise: float = 0.1

    def check(self, spec, setup, settings=None) -> None:
        r"""Refuse a run (``spec``, ``setup``, its ``settings``) this policy does not
        allow.

        Raises:
            PolicyError: Naming the option and the agent flag that would allow it.
        """
        if spec.name not in self.algorithms and "all" not in self.algorithms:
            raise PolicyError(
                f"The run is of {spec.name!r}, which this party does not join: its messages "
                "show the server what this party's agent keeps (README's table, 'server "
                f"sees'); --allow-algorithm {spec.name} allows it."
            )
        resolved = getattr(settings, "resolved", None)
        settings = resolved() if resolved is not None else settings
        if getattr(settings, "support", None) == "clustered" and not self.allow_exact_centres:
            noise = float(getattr(settings, "center_noise", None) or 0.0)
            if not noise >= self.min_center_noise:
                raise PolicyError(
                    f"The run has this party send its k-means centres with noise of std "
                    f"{noise:g} (--center-noise), below this party's {self.min_center_noise:g} "
                    "(--min-center-noise): nearly points of its own data; "
                    "--allow-exact-centres allows it."
                )
            size = int(getattr(settings, "min_cluster_size", 2))
            if size < 2:
                raise PolicyError(
                    f"The run has this party send centres of clusters of {size} point "
                    "(--min-cluster-size): its own data points, up to the noise; "
                    "--allow-exact-centres allows it."
                )
        if spec.name.startswith("ldp-"):  # the private LDP-BO learners
            epsilon = getattr(settings, "epsilon", None)
            epsilon = 1.0 if epsilon is None else float(epsilon)
            if epsilon > self.max_epsilon:
                raise PolicyError(
                    f"The run asks for epsilon = {epsilon:g} per answer, above this party's "
                    f"{self.max_epsilon:g} (--max-epsilon)."
                )
            if not epsilon >= self.min_epsilon:
                raise PolicyError(
                    f"The run asks for epsilon = {epsilon:g} per answer, below this party's "
                    f"{self.min_epsilon:g} (--min-epsilon): every answer, and every failed "
                    "evaluation, costs at least that much of --max-total-epsilon."
                )
        if spec.secure_aggregation and setup.aggregator == "plaintext" and not self.allow_plaintext:
            raise PolicyError(
                "The run asks for --aggregator plaintext, which shows this party's summaries "
                "to the server; this party's agent refuses it (--allow-plaintext allows it)."
            )
        if setup.crypto_seed is not None and not self.allow_crypto_seed:
            raise PolicyError(
                "The run sets --crypto-seed, which makes this party's private randomness "
                "known to whoever knows the seed; this party's agent refuses it "
                "(--allow-crypto-seed allows it, for experiments)."
            )

    def check_options(self, args) -> None:
        r"""Refuse a run whose ``--objective`` this party does not run; ``args`` are the
        run's parsed options, checked before anything they name is imported.

        Raises:
            PolicyError: Naming the objective.
        """
        name = getattr(args, "objective", None)
        if name is not None and name not in self.objectives:
            raise PolicyError(
                f"The run names the objective {name!r}, which this party does not run "
                "(its agent's --allow-objective lists the ones it does)."
            )


LIMITS = ("max_epsilon", "max_total_epsilon", "min_epsilon", "min_center_noise")

BOOLEAN_FLAGS = {
    "allow_plaintext": "runs with --aggregator plaintext",
    "allow_crypto_seed": "runs with --crypto-seed (experiments)",
    "share_results": "send the server the party's evaluations at the end (the run's tables "
    "and JSON)",
    "allow_exact_centres": "FBO-FedGP runs whose clients send exact k-means centres "
    "(--center-noise 0)",
}


def add_policy_arguments(group) -> None:
    r"""The policy's flags on an argparse parser or group: one party's agent
    (``python -m botorch_fed.flower.party``) and ``botorch-fed flower up`` (for every
    party it starts) take the same ones."""
    for name, help_ in BOOLEAN_FLAGS.items():
        group.add_argument(f"--{name.replace('_', '-')}", action="store_true", help=help_)
    group.add_argument(
        "--allow-objective",
        action="append",
        default=[],
        metavar="MODULE:FUNCTION",
        help="an --objective the party runs (repeatable)",
    )
    group.add_argument(
        "--allow-algorithm",
        action="append",
        default=[],
        metavar="NAME",
        help="an algorithm the party joins too (repeatable; 'all': every one); by default "
        "only " + ", ".join(PRIVATE_ALGORITHMS),
    )
    group.add_argument(
        "--max-epsilon",
        type=float,
        default=None,
        help=f"the largest LDP epsilon per answer (default {PartyPolicy.max_epsilon:g})",
    )
    group.add_argument(
        "--min-epsilon",
        type=float,
        default=None,
        help=f"the smallest LDP epsilon per answer (default {PartyPolicy.min_epsilon:g})",
    )
    group.add_argument(
        "--min-center-noise",
        type=float,
        default=None,
        help="the least noise std on the k-means centres the party sends (default "
        f"{PartyPolicy.min_center_noise:g})",
    )
    group.add_argument(
        "--max-total-epsilon",
        type=float,
        default=None,
        help="the most LDP epsilon the party spends over all runs ('inf': no cap; default "
        f"{PartyPolicy.max_total_epsilon:g})",
    )


def policy_from_arguments(args) -> PartyPolicy:
    r"""The :class:`PartyPolicy` of flags parsed with :func:`add_policy_arguments`.

    Raises:
        ValueError: ``--max-epsilon`` not > 0.
    """
    caps = {}
    for name in LIMITS:
        value = getattr(args, name)
        caps[name] = getattr(PartyPolicy, name) if value is None else value
        if name == "min_center_noise" and not (0 <= caps[name] < math.inf):
            raise ValueError(f"--min-center-noise must be >= 0 and finite, got {value}.")
        if name != "min_center_noise" and not caps[name] > 0:
            raise ValueError(f"--{name.replace('_', '-')} must be > 0, got {value}.")
    if caps["min_epsilon"] > caps["max_epsilon"]:
        raise ValueError(
            f"--min-epsilon {caps['min_epsilon']:g} is above --max-epsilon {caps['max_epsilon']:g}."
        )
    return PartyPolicy(
        **{name: getattr(args, name) for name in BOOLEAN_FLAGS},
        objectives=tuple(args.allow_objective),
        algorithms=PRIVATE_ALGORITHMS + tuple(args.allow_algorithm),
        **caps,
    )


def policy_flags(args) -> list[str]:
    r"""The flags of :func:`add_policy_arguments` that ``args`` set, as an agent's command
    line takes them (checked by :func:`policy_from_arguments` first)."""
    policy_from_arguments(args)
    flags = [f"--allow-objective={name}" for name in args.allow_objective]
    flags += [f"--allow-algorithm={name}" for name in args.allow_algorithm]
    flags += [f"--{name.replace('_', '-')}" for name in BOOLEAN_FLAGS if getattr(args, name)]
    for name in LIMITS:
        if getattr(args, name) is not None:
            flags.append(f"--{name.replace('_', '-')}={getattr(args, name)!r}")
    return flags
