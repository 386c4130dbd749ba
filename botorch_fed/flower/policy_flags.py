r"""A party's policy on the command line: the flags one party's agent (``python -m
botorch_fed.flower.party``) and ``botorch-fed flower up`` take, parsed into a
:class:`~.policy.PartyPolicy`, and the same policy written back as flags."""

from __future__ import annotations

import math

from botorch_fed.flower.policy import PRIVATE_ALGORITHMS, PartyPolicy

LIMITS = ("max_epsilon", "max_total_epsilon", "min_epsilon", "min_center_noise")

BOOLEAN_FLAGS = {
    "allow_plaintext": "runs with --aggregator plaintext",
    "allow_masking": "runs with --aggregator masking (the server learns every sum, and from "
    "FBO-FedGP's every point the party evaluates: docs/security.md)",
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
        metavar="MODULE:FUNCTION@BOUNDS",
        help="an --objective the party runs (repeatable), only on its domain: pinned here "
        "('mymod:f@0,1;-5,5', one lo,hi per dimension; @max: larger is better) or declared "
        "by the function (attributes `bounds`, `maximize`); runs naming other --bounds, "
        "--dim or --maximize are refused",
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
        ValueError: ``--max-epsilon`` not > 0, a minimum above its maximum, or an
            ``--allow-objective`` that is not ``MODULE:FUNCTION[@lo,hi;...[@max]]``.
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
