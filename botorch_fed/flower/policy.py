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
            preset).
        max_epsilon: The largest LDP ``epsilon`` per answer this party's users accept.
            The budget a user spends over several runs is not tracked across runs.
    """

    allow_plaintext: bool = False
    allow_crypto_seed: bool = False
    objectives: tuple[str, ...] = field(default_factory=tuple)
    share_results: bool = False
    algorithms: tuple[str, ...] = PRIVATE_ALGORITHMS
    allow_exact_centres: bool = False
    max_epsilon: float = 1.0

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
        noise = getattr(settings, "center_noise", None)
        if getattr(settings, "support", None) == "clustered" and not (noise or 0) > 0:
            if not self.allow_exact_centres:
                raise PolicyError(
                    "The run has this party send its exact k-means centres (--center-noise "
                    f"{noise}), points of its own data; this party's agent refuses it "
                    "(--allow-exact-centres allows it)."
                )
        if spec.name.startswith("ldp-"):  # the private LDP-BO learners
            epsilon = getattr(settings, "epsilon", None)
            epsilon = 1.0 if epsilon is None else float(epsilon)
            if epsilon > self.max_epsilon:
                raise PolicyError(
                    f"The run asks for epsilon = {epsilon:g} per answer, above this party's "
                    f"{self.max_epsilon:g} (--max-epsilon)."
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
