r"""What a party accepts from a run: its own policy, not the server's.

On Flower the run's options (the run config) come from whoever submits the run -- the
server's operator, whom a party need not trust. Options decide how much a party
reveals: ``--aggregator plaintext`` sends its summaries in the clear, ``--aggregator
masking`` lets the server solve every point a client evaluates out of the summed
FBO-FedGP summaries (docs/security.md, "Summaries under `masking`"), ``--crypto-seed``
makes its private randomness (key material, masks, centre noise, LDP noise) computable
by anyone who knows the seed, ``--objective`` names code the party imports and runs
(``--bounds`` where it runs it), and the final report hands the server the party's every
evaluation. The algorithm itself decides what the server sees (``central`` takes raw
data). The options' sizes decide what a run costs the party (``--dim``, ``--num-init``,
``--raw-samples``, ...). Each party's agent therefore refuses a run that asks for more
than its policy allows (:class:`PartyPolicy`, set by the party on its own command line);
the defaults allow none of it.

A party's agent decides on the run's parsed options (:meth:`PartyPolicy.check_options`)
before anything of the run is built, so a refused run costs it milliseconds, and checks
the built run again (:meth:`PartyPolicy.check`).

A run's config file (``flower run --config``, its text in the run config) is part of its
options: its values are the parsed options' defaults, and the objective of every
``[[objectives]]`` table the party would import (its own) is checked as an
``--objective`` is, before any is imported. A table's ``kwargs`` are values the server
chooses for the party's code, which no ``--allow-objective`` pins: a party refuses
them (its own module gives its function its arguments).
"""

from __future__ import annotations

import functools
import math
import os
from dataclasses import dataclass, field

PRIVATE_ALGORITHMS = ("fbo-fedgp", "ldp-tgp", "ldp-ata", "ldp-moma", "local", "random")
r"""The algorithms a party joins by default: those whose messages do not show the
server the party's data, outcomes or posterior (docs/algorithms/index.md, "server sees")."""

MAX_DIM = 1_000
r"""The largest ``--dim`` (and the most dimensions of ``--bounds``) a party's agent takes:
BO beyond a few hundred dimensions is rare, and a run of 2e7 dimensions took 99 s and
7 GB to build."""

SIZE_CAPS: dict[str, int] = {
    "clients": 10_000,  # each party builds every client's objective
    "dim": MAX_DIM,
    "threads": 256,  # the run's (the ServerApp's) torch threads
    "settings.num_rounds": 100_000,  # every algorithm: rounds T (LDP-BO: one answer each)
    "settings.num_init": 5_000,  # initial design per client: the local GP's data
    "settings.raw_samples": 100_000,  # optimize_acqf's raw samples: points x d per round
    "settings.num_restarts": 1_000,  # optimize_acqf's restarts
    "settings.maxiter": 10_000,  # L-BFGS-B iterations of the acquisition
    "settings.fit_maxiter": 10_000,  # L-BFGS-B iterations of a local GP fit
    "settings.federated_maxiter": 10_000,  # FBO-FedGP: trust-region steps of a federated fit
    "settings.ts_candidates": 100_000,  # discrete Thompson sampling's candidates
    "settings.num_fantasies": 1_024,  # knowledge gradient's fantasies
    "settings.num_mv_samples": 1_024,  # Co-ES: max-value samples
    "settings.support_size": 4_096,  # the clients' own protocol cap on a support
    "settings.support_growth": 4_096,  # FBO-FedGP: points added per re-selection
    "settings.centers_per_client": 4_096,  # k of a client's k-means
    "settings.points_per_dim": 4_096,  # Co-KG family: grid points per axis
    "settings.plays_per_epoch": 100_000,  # LDP MoMA's k (at most the rounds)
}
r"""The largest value a party's agent takes for each size-like option of a run (keys:
the option's ``dest`` in the run's parser), checked on the parsed options before the
run is built. Each is far above the library's defaults and the papers' settings (e.g.
``--raw-samples`` 64-256, ``--num-init`` 4-10, ``--ts-candidates`` 512); a party that
needs more edits these constants (no agent flag raises them). Not capped: the integer
options of :data:`NOT_SIZE_LIKE` and the float options (none sizes a tensor or a loop;
LDP-BO's Nystrom rate ``--q`` only scales a probability clamped at 1)."""

NOT_SIZE_LIKE = (
    "seed",  # a seed
    "crypto_seed",  # a seed (refused unless --allow-crypto-seed)
    "settings.local_refit_every",  # a period: larger means fewer refits
    "settings.support_every",  # a period: larger means fewer re-selections
    "settings.hyper_every",  # a period: larger means fewer hyperparameter refreshes
    "settings.min_cluster_size",  # larger means fewer centres sent
)
r"""The integer options of a run that are not sizes (a large value costs a party
nothing), hence not in :data:`SIZE_CAPS`."""


class PolicyError(PermissionError):
    r"""A run asks a party for something its policy does not allow."""


def parse_domain(text: str, where: str) -> tuple[tuple[float, float], ...]:
    r"""``"lo,hi;lo,hi"`` (one pair per dimension, as ``--bounds``) as a tuple of
    ``(lo, hi)`` pairs, finite with ``lo < hi``.

    Raises:
        ValueError: Naming ``where``.
    """
    if not isinstance(text, str):
        raise ValueError(f"{where}: expected 'lo,hi;lo,hi;...' (a str), got {text!r:.80}.")
    pieces = [p.strip() for p in text.strip().rstrip(";").split(";")]
    if not text.strip() or any(not p for p in pieces):
        raise ValueError(f"{where}: expected 'lo,hi;lo,hi;...' (one pair per dimension).")
    pairs = []
    for i, piece in enumerate(pieces):
        try:
            pair = tuple(float(v.strip()) for v in piece.split(","))
        except ValueError:
            pair = ()
        if len(pair) != 2 or not all(math.isfinite(v) for v in pair) or not pair[0] < pair[1]:
            raise ValueError(
                f"{where}: dimension {i} is {piece!r}, not two finite numbers 'lo,hi' with lo < hi."
            )
        pairs.append(pair)
    return tuple(pairs)


def _declared_domain(value, where: str) -> tuple[tuple[float, float], ...]:
    r"""A module's declared ``bounds``: ``"lo,hi;..."`` or ``[[lo, hi], ...]``."""
    if isinstance(value, str):
        return parse_domain(value, where)
    if hasattr(value, "shape"):  # a 2 x d tensor would read as pairs when d = 2
        raise ValueError(f"{where}: give 'lo,hi;...' or [[lo, hi], ...], not an array.")
    try:
        pairs = [tuple(float(v) for v in pair) for pair in value]
    except (TypeError, ValueError):
        pairs = []
    if not pairs or any(len(p) != 2 for p in pairs):
        raise ValueError(f"{where}: expected 'lo,hi;...' or [[lo, hi], ...], got {value!r:.80}.")
    return parse_domain(";".join(f"{lo!r},{hi!r}" for lo, hi in pairs), where)


@dataclass(frozen=True)
class AllowedObjective:
    r"""One ``--allow-objective`` of a party: ``MODULE:FUNCTION`` with the domain the
    party pins (``@lo,hi;lo,hi``, and ``@max`` when larger values are better), or
    without one: then the function must declare it (attributes ``bounds``, in either
    form of ``--bounds`` or a config file's ``bounds``, and optionally ``maximize``)."""

    name: str
    bounds: tuple[tuple[float, float], ...] | None = None
    maximize: bool = False

    @classmethod
    def parse(cls, text: str) -> AllowedObjective:
        r"""``MODULE:FUNCTION[@lo,hi;lo,hi[@max|@min]]``.

        Raises:
            ValueError: Naming ``--allow-objective``.
        """
        where = f"--allow-objective {text!r}"
        name, *rest = text.split("@")
        module, sep, function = name.partition(":")
        if not sep or not module.strip() or not function.strip() or len(rest) > 2:
            raise ValueError(
                f"{where}: expected MODULE:FUNCTION, optionally with its domain, "
                "MODULE:FUNCTION@lo,hi;lo,hi (one pair per dimension) and @max when larger "
                "values are better."
            )
        if not rest:
            return cls(name)
        if len(rest) == 2 and rest[1] not in ("max", "min"):
            raise ValueError(f"{where}: the last part must be @max or @min, got @{rest[1]}.")
        return cls(name, parse_domain(rest[0], where), rest[1:] == ["max"])


@dataclass(frozen=True)
class PartyPolicy:
    r"""A party's policy.

    Attributes:
        allow_plaintext: Take part in runs whose secure sums use the ``plaintext``
            backend (the server sees every summary).
        allow_masking: Take part in runs whose secure sums use the ``masking`` backend:
            the server learns every sum, and under FBO-FedGP every point a client
            evaluates after the next global round (docs/security.md, "Summaries under
            `masking`"). ``ckks`` (the server holds no sum) needs no permission.
        allow_crypto_seed: Take part in runs with ``--crypto-seed`` (reproducible
            experiments: whoever knows the seed can undo the protection).
        objectives: The ``--objective`` values this party runs (its own black box), as
            its agent's ``--allow-objective`` takes them (:class:`AllowedObjective`:
            ``MODULE:FUNCTION`` with its pinned domain ``@lo,hi;...[@max]``, or one whose
            function declares ``bounds``); a run naming another objective, or other
            ``--bounds``, ``--dim`` or ``--maximize``, is refused. Built-in problems are
            always allowed.
        share_results: Answer the server's final report with this party's evaluation
            history and privacy ledger (what the run's JSON scores), and send the
            per-stage timings of its work with every answer (the ledger's ``stage_s``).
            Without it the party keeps them: the server's results then hold no
            evaluations of it, and its answers carry no timings (how long a stage took
            depends on the party's data and shows which branch its code took).
        algorithms: The algorithms this party joins (``"all"``: every one); by default
            :data:`PRIVATE_ALGORITHMS` (``central``, the Co-KG family, ``fts``,
            ``fedzero`` and the non-private LDP-BO learners show the server raw data,
            posteriors or function values).
        allow_exact_centres: Take part in FBO-FedGP runs whose clustered support takes
            the clients' exact k-means centres (``--center-noise 0``, the paper's
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

    Every run's size-like options are capped too (:data:`SIZE_CAPS`).

    Raises:
        ValueError: An ``objectives`` entry that :meth:`AllowedObjective.parse` refuses.
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
    allow_masking: bool = False

    def __post_init__(self) -> None:
        for text in self.objectives:
            AllowedObjective.parse(text)  # malformed: refused when the agent starts

    def check(self, spec, setup, settings=None) -> None:
        r"""Refuse a run (``spec``, ``setup``, its ``settings``) this policy does not
        allow: what :meth:`check_options` decided on its options, checked again on the
        built run.

        Raises:
            PolicyError: Naming the option and the agent flag that would allow it.
        """
        resolved = _resolved(settings)
        sizes = {} if resolved is None else {f"settings.{k}": v for k, v in vars(resolved).items()}
        sizes.update(clients=setup.clients, dim=setup.dim, threads=setup.threads)
        self._check_run(spec, setup.aggregator, setup.crypto_seed, settings)
        _check_sizes(sizes)
        _check_costs(resolved, setup.dim)
        objectives = setup.objectives
        for objective in objectives if isinstance(objectives, list | tuple) else [objectives]:
            fn = getattr(objective, "fn", None)  # a CallableObjective: the user's function
            if fn is not None:  # (not a RemoteObjective: another party's, not imported)
                if isinstance(fn, functools.partial) and fn.keywords:
                    raise PolicyError(f"The run's objective {objective.name!r}: {_KWARGS}")
                name = getattr(objective, "source", None) or objective.name
                domain = tuple((lo, hi) for lo, hi in objective.bounds.T.tolist())
                what = f"the domain {';'.join(f'{lo:g},{hi:g}' for lo, hi in domain)!r}"
                self._check_domain(name, domain, what, not objective.minimize, None, fn)

    def check_options(self, args, client: int | None = None) -> None:
        r"""Refuse a run from its parsed options alone (``args``, the run parser's
        ``argparse.Namespace``), before anything they name is imported or built:
        the algorithm, the secure-sum backend, ``--crypto-seed``, LDP ``--epsilon``,
        FBO-FedGP's centre noise, every size-like option (:data:`SIZE_CAPS`), and the
        ``--objective`` with its ``--bounds``, ``--dim`` and ``--maximize``. An
        allowed objective without a pinned domain is imported (the party's own code) to
        read the domain its function declares.

        With a config file (:func:`botorch_fed.flower.run_options.prepare` sets
        ``args.objective_tables`` and ``args.imports``), the objective of every config
        table the run imports (``args.imports``), or of client ``client``'s table, is
        checked too, with its domain and direction, and refused with ``kwargs``.

        Args:
            args: The parsed options.
            client: Check this client's config table (``None``: the tables the run
                imports).

        Raises:
            PolicyError: Naming the option and the agent flag that would allow it.
            ValueError: The run's options name an unknown algorithm, the objective
                cannot be imported, or ``client`` has no table.
        """
        from botorch_fed.protocol.registry import get_algorithm

        spec = get_algorithm(args.algorithm)
        values = {k.split(".", 1)[1]: v for k, v in vars(args).items() if k.startswith("settings.")}
        try:
            settings = spec.settings_class(**values)
            _resolved(settings)
        except (TypeError, ValueError):  # invalid: the run's own checks refuse it, by flag
            settings = None
        self._check_run(spec, getattr(args, "aggregator", None), args.crypto_seed, settings)
        _check_sizes(vars(args))
        dim = getattr(args, "dim", None)
        _check_costs(_resolved(settings) if settings is not None else None, dim)
        bounds = getattr(args, "bounds", None)
        dims = 0
        if isinstance(bounds, str):  # counted, not split: a huge --bounds costs nothing
            dims = bounds.strip().rstrip(";").count(";") + 1
        elif isinstance(bounds, list):  # a config file's [[lo, hi], ...]
            dims = len(bounds)
        if dims > MAX_DIM:
            raise PolicyError(
                f"The run's --bounds has {dims} dimensions, above the {MAX_DIM} this "
                "party's agent takes (botorch_fed.flower.policy.MAX_DIM; no agent flag "
                "raises it)."
            )
        self._check_objective(args)
        tables = getattr(args, "objective_tables", None)
        if tables is not None:
            imports = getattr(args, "imports", "all") if client is None else client
            entries = tables.imported(imports)
            for table, where in entries:  # every one before any is imported
                self._check_table(args, table, where)

    def _check_table(self, args, table: dict, where: str) -> None:
        r"""A config table's objective (``where``: its key) is one this party runs,
        without ``kwargs``, on its domain, in its direction."""
        if table.get("kwargs"):
            raise PolicyError(f"{where.replace('.function`', '.kwargs`')}: {_KWARGS}")
        domain, what = _run_domain(args)
        maximize = bool(getattr(args, "maximize", False))
        dim = getattr(args, "dim", None)
        try:
            self._check_domain(table["function"], domain, what, maximize, dim)
        except PolicyError as exc:  # which table
            raise PolicyError(f"{where}: {exc}") from None

    def _check_run(self, spec, aggregator, crypto_seed, settings) -> None:
        r"""The checks both :meth:`check` and :meth:`check_options` make."""
        if spec.name not in self.algorithms and "all" not in self.algorithms:
            raise PolicyError(
                f"The run is of {spec.name!r}, which this party does not join: its messages "
                "show the server what this party's agent keeps (the documentation's "
                f"algorithm table, 'server sees'); --allow-algorithm {spec.name} allows it."
            )
        settings = _resolved(settings)
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
        if spec.secure_aggregation and aggregator == "plaintext" and not self.allow_plaintext:
            raise PolicyError(
                "The run asks for --aggregator plaintext, which shows this party's summaries "
                "to the server; this party's agent refuses it (--allow-plaintext allows it)."
            )
        if spec.secure_aggregation and aggregator == "masking" and not self.allow_masking:
            raise PolicyError(
                "The run asks for --aggregator masking, under which the server learns every "
                "sum, and from FBO-FedGP's summed summaries every point this party evaluates "
                "(docs/security.md, 'Summaries under `masking`'); this party's agent refuses "
                "it (--allow-masking allows it; --aggregator ckks needs no permission)."
            )
        if crypto_seed is not None and not self.allow_crypto_seed:
            raise PolicyError(
                "The run sets --crypto-seed, which makes this party's private randomness "
                "known to whoever knows the seed; this party's agent refuses it "
                "(--allow-crypto-seed allows it, for experiments)."
            )

    def _check_objective(self, args) -> None:
        r"""The run's ``--objective`` is one this party runs, on the domain the party
        pinned or its function declares, in the same direction."""
        name = getattr(args, "objective", None)
        if name is None:
            return
        domain, what = _run_domain(args)
        maximize = bool(getattr(args, "maximize", False))
        self._check_domain(name, domain, what, maximize, getattr(args, "dim", None))

    def _check_domain(self, name, domain, what, maximize, dim=None, function=None) -> None:
        r"""Refuse the objective ``name`` on ``domain`` (``(lo, hi)`` pairs; ``what``:
        how the run gave it), ``maximize``-d, unless this party runs it there; the
        declared domain is read from ``function`` (else imported)."""
        allowed = [AllowedObjective.parse(t) for t in self.objectives]
        allowed = [a for a in allowed if a.name == name]
        if not allowed:
            raise PolicyError(
                f"The run names the objective {name!r}, which this party does not run "
                "(its agent's --allow-objective lists the ones it does)."
            )
        pinned = [a for a in allowed if a.bounds is not None] or [_declared(name, function)]
        for entry in pinned:
            if domain == entry.bounds and maximize == entry.maximize and dim in (None, len(domain)):
                return
        entry = pinned[0]
        assert entry.bounds is not None  # pinned: a domain given or declared
        expected = ";".join(f"{lo:g},{hi:g}" for lo, hi in entry.bounds)
        if dim is not None and dim != len(entry.bounds):
            what = f"--dim {dim}"
        elif domain == entry.bounds:
            what = "--maximize" if maximize else "--no-maximize (the default)"
        direction = "maximised" if entry.maximize else "minimised"
        raise PolicyError(
            f"The run names {what} for the objective {name!r}, which this party runs only on "
            f"its own domain {expected!r} ({len(entry.bounds)} dimensions), {direction}; "
            f"--allow-objective '{name}@<lo,hi;...>[@max]' with the run's domain allows it."
        )


_KWARGS = (
    "the run gives this party's function arguments (`kwargs`), values the server chooses "
    "for the party's code, which no --allow-objective allows; the party's own module "
    "gives its function its arguments (a function of X alone)."
)


def _run_domain(args) -> tuple[tuple[tuple[float, float], ...] | None, str]:
    r"""``(domain, how the run gives it)`` of the run's ``--bounds`` (or a config file's
    ``bounds``, a string or ``[[lo, hi], ...]``); the domain is ``None`` when there is
    none or it does not parse (no party's)."""
    bounds = getattr(args, "bounds", None)
    if bounds is None:
        return None, "no --bounds"
    try:
        domain = (
            parse_domain(bounds, "--bounds")
            if isinstance(bounds, str)
            else _declared_domain(bounds, "bounds")
        )
    except ValueError:
        domain = None
    what = f"--bounds {bounds!r:.80}" if isinstance(bounds, str) else f"bounds {bounds!r:.80}"
    return domain, what


def _declared(name: str, function=None) -> AllowedObjective:
    r"""The domain the function ``name`` declares (its attributes ``bounds`` and
    ``maximize``): ``function``'s, else imported as the run imports it."""
    if function is None:
        from botorch_fed.runs.black_box import import_callable, import_path

        with import_path([os.getcwd()]):
            function = import_callable(name, "--objective")
    bounds = getattr(function, "bounds", None)
    if bounds is None:
        raise PolicyError(
            f"The run names the objective {name!r}: this party's agent allows it "
            f"(--allow-objective {name}) but pins no domain, and {name} declares none "
            "(an attribute `bounds`), so it runs it on no domain the server chooses. Pin "
            f"one on the agent: --allow-objective '{name}@lo,hi;lo,hi' (one pair per "
            f"dimension, @max when larger values are better), or set {name}.bounds."
        )
    from botorch_fed.runs.black_box import ObjectiveImportError

    # the party's own code: what is wrong with it stays in its agent's log
    maximize = getattr(function, "maximize", False)
    if not isinstance(maximize, bool):
        raise ObjectiveImportError(f"{name}.maximize must be True or False, got {maximize!r:.80}.")
    try:
        return AllowedObjective(name, _declared_domain(bounds, f"{name}.bounds"), maximize)
    except ValueError as exc:
        raise ObjectiveImportError(str(exc)) from None


def _resolved(settings):
    r"""FBO-FedGP's settings with the preset's choices made (others as they are)."""
    resolved = getattr(settings, "resolved", None)
    return resolved() if resolved is not None else settings


def _flag(dest: str) -> str:
    from botorch_fed.runs.options import SETTING_FLAGS

    name = dest.removeprefix("settings.")
    return SETTING_FLAGS.get(name, "--" + name.replace("_", "-"))


COST_CAPS: tuple[tuple[str, str, float], ...] = (
    # an exact GP fit per round: (points)^3 per L-BFGS-B iteration of the fit
    ("(--num-init + --num-rounds)^3 x --fit-maxiter", "gp_fit", 1e12),
    # the acquisition's raw samples: one batch of raw_samples points of dimension d
    ("--raw-samples x --dim", "raw", 1e7),
    ("--ts-candidates x --dim", "candidates", 1e7),
    # the acquisition's restarts: num_restarts L-BFGS-B runs of maxiter iterations
    ("--num-restarts x --maxiter", "restarts", 1e6),
    # FBO-FedGP's federated fit: per evaluation (maxiter + 1 at most) about 3 products
    # per hyperparameter with a support_size^3 solve each, and the coordinator's local step
    ("--support-size^3 x --federated-maxiter", "fit_support", 1e11),
    # FBO-FedGP's summaries: ~support_size^2 / 2 limb-encoded entries a round
    ("--support-size^2 x --num-rounds", "summaries", 1e9),
)
r"""Caps on products of size-like options (:data:`SIZE_CAPS` caps each alone): each
within its cap, ``--num-init 2000 --fit-maxiter 10000`` cost 47 s per round of
``local``, the caps together hours. At 1e12 a fit of 1,000 points per client with
BoTorch's default iterations passes; the defaults and the papers' settings are
orders of magnitude below every cap."""


def _costs(settings, dim: int) -> dict[str, float]:
    def get(name: str, default: int = 0) -> int:
        value = getattr(settings, name, None)
        return value if isinstance(value, int) and not isinstance(value, bool) else default

    points = get("num_init") + get("num_rounds")  # a client's data, fitted every round
    fits = hasattr(settings, "fit_maxiter")  # the algorithms that fit an exact GP on them
    return {
        "gp_fit": float(points) ** 3 * get("fit_maxiter") if fits else 0.0,
        "raw": float(get("raw_samples")) * dim,
        "candidates": float(get("ts_candidates")) * dim,
        "restarts": float(get("num_restarts")) * get("maxiter"),
        "fit_support": float(get("support_size")) ** 3 * get("federated_maxiter")
        if getattr(settings, "hyperparameters", None) == "federated"
        else 0.0,
        "summaries": float(get("support_size")) ** 2 * get("num_rounds"),
    }


def _check_costs(settings, dim) -> None:
    r"""Refuse a run whose products of sizes exceed :data:`COST_CAPS` (``settings``
    resolved; ``dim`` the run's dimension, or ``None``: 1)."""
    if settings is None:
        return
    dim = dim if isinstance(dim, int) and not isinstance(dim, bool) and dim > 0 else 1
    costs = _costs(settings, dim)
    for what, key, cap in COST_CAPS:
        if costs[key] > cap:
            raise PolicyError(
                f"The run's {what} is {costs[key]:.3g}, above the {cap:g} this party's agent "
                "takes (botorch_fed.flower.policy.COST_CAPS, for what a run may cost the "
                "party; no agent flag raises it)."
            )


def _check_sizes(values: dict) -> None:
    r"""Refuse a value of ``values`` (``dest -> value``) above its :data:`SIZE_CAPS`."""
    for dest, cap in SIZE_CAPS.items():
        value = values.get(dest)
        if isinstance(value, int) and not isinstance(value, bool) and value > cap:
            raise PolicyError(
                f"The run asks for {_flag(dest)} {value}, above the {cap} this party's agent "
                f"takes (botorch_fed.flower.policy.SIZE_CAPS[{dest!r}], for what a run may "
                "cost the party; no agent flag raises it)."
            )
