r"""From the parsed arguments of ``botorch-fed run <algorithm>`` to what
:func:`~botorch_fed.protocol.runner.run_federated` takes: the algorithm's settings
and the :class:`~botorch_fed.protocol.setup.FederationSetup`.

Both are validated here, before the run, and their errors are put in the user's
words: the library names Python fields (```support_size```, ```num_clients```), the
messages name the flag (```--support-size`/`--support```) or the config file's key
the value came from.
"""

from __future__ import annotations

import argparse

from botorch_fed.runs.black_box import make_objectives, resolve_black_box
from botorch_fed.runs.config import Config
from botorch_fed.runs.options import Option, rename_to_flags

# FederationSetup field -> the option's dest
SETUP_DESTS = {
    "problem": "problem",
    "dim": "dim",
    "num_clients": "clients",
    "seed": "seed",
    "crypto_seed": "crypto_seed",
    "aggregator": "aggregator",
    "noise_std": "noise_std",
    "noise": "noise",
    "init_regions": "init_regions",
    "region_width": "region_width",
    "shift": "shift",
    "evaluation_errors": "fail_on_error",
    "threads": "threads",
}


def _fails_alone(cls: type, name: str, value) -> bool:
    r"""Whether ``cls(name=value).validate()`` fails with every other field at its
    default."""
    try:
        cls(**{name: value}).validate()
    except (ValueError, TypeError):
        return True
    return False


def build_settings(
    spec,
    args: argparse.Namespace,
    options: list[Option],
    sources: dict[str, str],
    config: Config | None,
):
    r"""The algorithm's settings from the flags and the config file, validated; errors
    name the flag or the key."""
    cls = spec.settings_class
    values = {o.field: getattr(args, o.dest) for o in options if o.field is not None}
    labels = {o.field: o.label(sources) for o in options if o.field is not None}
    if config is not None:
        values.update(config.settings_extra)
        labels.update({k: f"`settings.{k}` in {config.path}" for k in config.settings_extra})
    try:
        settings = cls(**values)
        settings.validate()
    except (ValueError, TypeError) as exc:
        message, found = rename_to_flags(str(exc), labels)
        if not found:
            # a message in another object's words (MixingSchedule's `c`): name the
            # settings that fail on their own
            defaults = cls()
            culprits = [
                f"{labels[k]} {v!r}"
                for k, v in values.items()
                if v != getattr(defaults, k) and _fails_alone(cls, k, v)
            ]
            if culprits:
                message = f"{', '.join(culprits)}: {message}"
        raise ValueError(message) from None
    return settings


def _refuse_objective_options(args, by_dest, sources, config, problem: str) -> None:
    r"""``--bounds`` and ``--maximize`` describe the user's own objective: refused with
    a built-in problem (a file's are dropped when ``--problem`` overrides the file)."""
    file_problem = config is not None and "problem" in config.has
    for dest in ("bounds", "maximize"):
        if getattr(args, dest) in (None, False) or (dest in sources and not file_problem):
            continue
        raise ValueError(
            f"{by_dest[dest].label(sources)} applies to your own objective (`--objective`); "
            f"the built-in problem {problem!r} has its own domain and is minimised."
        )


def build_setup(
    spec,
    args: argparse.Namespace,
    options: list[Option],
    sources: dict[str, str],
    config: Config | None,
):
    r"""The :class:`FederationSetup` from the flags and the config file, validated (the
    user's modules imported, a built-in problem built once); returns ``(setup,
    label)`` where ``label`` names the user's black box (``None`` for a problem)."""
    from botorch_fed.protocol.setup import DEFAULT_NUM_CLIENTS, FederationSetup

    by_dest = {o.dest: o for o in options}
    names = {py: by_dest[d].label(sources) for py, d in SETUP_DESTS.items() if d in by_dest}
    box = resolve_black_box(args, sources, config)
    common = dict(
        dim=args.dim,
        seed=args.seed,
        crypto_seed=args.crypto_seed,
        init_regions=args.init_regions,
        region_width=args.region_width,
        noise_std=args.noise_std,
        noise=args.noise,
        shift=args.shift,
        evaluation_errors="raise" if args.fail_on_error else "record",
        threads=args.threads,
    )
    if spec.secure_aggregation:
        common["aggregator"] = args.aggregator
    if box.problem is not None:
        _refuse_objective_options(args, by_dest, sources, config, box.problem)
        setup = FederationSetup(problem=box.problem, num_clients=args.clients, **common)
    else:
        objectives = make_objectives(box, args, sources, by_dest["bounds"])
        if args.dim is not None and args.dim != objectives[0].dim:
            raise ValueError(
                f"{names['dim']}={args.dim} but the objectives have d={objectives[0].dim} "
                f"(from {by_dest['bounds'].label(sources)})."
            )
        if box.shared:
            clients = DEFAULT_NUM_CLIENTS if args.clients is None else args.clients
            setup = FederationSetup(objectives=objectives[0], num_clients=clients, **common)
        else:
            assert config is not None  # per-client objectives come from the config file
            if args.clients is not None and args.clients != len(objectives):
                raise ValueError(
                    f"{names['num_clients']} {args.clients} but {config.path} has "
                    f"{len(objectives)} [[objectives]] tables (one per client)."
                )
            setup = FederationSetup(objectives=objectives, num_clients=args.clients, **common)
    try:
        setup.validate(spec.name)
    except ValueError as exc:
        raise ValueError(rename_to_flags(str(exc), names)[0]) from None
    if box.problem is not None:
        try:
            setup.make_objectives()  # an unknown name or a wrong --dim, before the run
        except ValueError as exc:
            message, found = rename_to_flags(str(exc), names)
            if not found:
                where = f"{names['problem']} {box.problem}"
                if args.dim is not None:
                    where += f", {names['dim']} {args.dim}"
                message = f"{where}: {message}"
            raise ValueError(message) from None
    return setup, box.label or None
