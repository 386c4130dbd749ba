r"""A checked run: :func:`prepare_run` turns the parsed options of ``run <algorithm>`` into
the settings and :class:`~botorch_fed.protocol.setup.FederationSetup`, refusing anything
invalid before the run starts with an error naming the flag or the config key."""

from __future__ import annotations

import argparse
import contextlib
import os
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from botorch_fed.runs.black_box import (
    Imports,
    check_imports,
    import_path,
    make_objectives,
    resolve_black_box,
)
from botorch_fed.runs.config import Config
from botorch_fed.runs.options import Option, rename_to_flags
from botorch_fed.runs.outputs import check_checkpoint_folders, check_output_paths

if TYPE_CHECKING:
    from botorch_fed.protocol.setup import FederationSetup

# packages whose warnings are advice about the library's own linear algebra (not the user's)
LIBRARY_MODULES = (
    r"(botorch|botorch_fed|botorch_community|gpytorch|linear_operator|torch|numpy|scipy|"
    r"sklearn|ot|tenseal)(\.|$)"
)
# FederationSetup field -> the option's dest (_SAME: the option of the same name)
_SAME = (
    "dim seed crypto_seed init_regions region_width noise_std noise shift rotation threads".split()
)
SETUP_DESTS = {n: n for n in ("problem", "aggregator", *_SAME)}
SETUP_DESTS.update(num_clients="clients", evaluation_errors="fail_on_error")


@contextlib.contextmanager
def library_warnings_ignored() -> Iterator[None]:
    r"""Ignore warnings raised in :data:`LIBRARY_MODULES`, not in the user's modules."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", module=LIBRARY_MODULES)
        yield


@dataclass
class PreparedRun:
    r"""A checked ``run``: what :func:`run_federated` takes and where the results go."""

    algorithm: str
    setup: FederationSetup
    settings: Any  # an instance of the algorithm's ``settings_class``
    label: str | None  # the user's black box's name (None: a built-in problem)
    folders: list[str]  # where the user's modules are imported from
    checkpoint: str | None
    resume: str | None
    out: str | None
    plot: str | None
    names: dict[str, str]  # settings field -> flag or key


def _fails_alone(cls: Any, name: str, value) -> bool:
    try:
        cls(**{name: value}).validate()
    except (ValueError, TypeError):
        return True
    return False


def _build_settings(cls: Any, args, options: list[Option], names: dict, config: Config | None):
    r"""The algorithm's settings from the flags and the config file, validated."""
    values = {o.field: getattr(args, o.dest) for o in options if o.field is not None}
    labels = dict(names)
    if config is not None:
        values.update(config.settings_extra)
        labels.update({k: f"`settings.{k}` in {config.path}" for k in config.settings_extra})
    try:
        settings = cls(**values)
        settings.validate()
        return settings
    except (ValueError, TypeError) as exc:
        message, found = rename_to_flags(str(exc), labels)
    if not found:  # in another object's words (MixingSchedule's `c`): name the culprits
        defaults = cls()
        culprits = [
            f"{labels[k]} {v!r}"
            for k, v in values.items()
            if v != getattr(defaults, k) and _fails_alone(cls, k, v)
        ]
        if culprits:
            message = f"{', '.join(culprits)}: {message}"
    raise ValueError(message)


def _build_setup(
    spec, args, by_dest: dict, sources: dict, config: Config | None, names: dict, imports: Imports
):
    r"""The validated setup (the user modules of ``imports`` imported, a problem built
    once) and its label."""
    from botorch_fed.protocol.setup import DEFAULT_NUM_CLIENTS, FederationSetup

    problem, specs, shared, label = resolve_black_box(args, sources, config)
    common = {n: getattr(args, n) for n in _SAME}
    common["evaluation_errors"] = "raise" if args.fail_on_error else "record"
    if spec.secure_aggregation:
        common["aggregator"] = args.aggregator
    if problem is not None:
        file_problem = config is not None and "problem" in config.has
        for dest in ("bounds", "maximize"):  # a file's are dropped when --problem overrides it
            if getattr(args, dest) not in (None, False) and (dest not in sources or file_problem):
                raise ValueError(
                    f"{by_dest[dest].label(sources)} applies to your own objective "
                    f"(`--objective`); the built-in problem {problem!r} has its own domain "
                    "and is minimised."
                )
        source: dict[str, Any] = {"problem": problem}
    else:
        objectives = make_objectives(specs, args, by_dest["bounds"].label(sources), imports, shared)
        if not shared and args.clients not in (None, len(objectives)):
            assert config is not None  # per-client objectives come from the config file
            raise ValueError(
                f"{names['num_clients']} {args.clients} but {config.path} has "
                f"{len(objectives)} [[objectives]] tables (one per client)."
            )
        source = {"objectives": objectives[0] if shared else objectives}
    clients = DEFAULT_NUM_CLIENTS if shared and args.clients is None else args.clients
    setup = FederationSetup(**source, num_clients=clients, **common)
    try:
        setup.validate(spec.name)
    except ValueError as exc:
        raise ValueError(rename_to_flags(str(exc), names)[0]) from None
    if problem is not None:
        try:
            setup.make_objectives()  # an unknown name or a wrong --dim, before the run
        except ValueError as exc:
            message, found = rename_to_flags(str(exc), names)
            where = f"{names['problem']} {problem}"
            where += f", {names['dim']} {args.dim}" if args.dim is not None else ""
            raise ValueError(message if found else f"{where}: {message}") from None
    return setup, label or None


def prepare_run(
    args: argparse.Namespace,
    options: list[Option],
    sources: dict[str, str],
    config: Config | None,
    imports: Imports = "all",
) -> PreparedRun:
    r"""Check the parsed ``args`` of ``run <algorithm>`` (its ``options``; ``sources``:
    ``dest`` -> config key of the values from the ``config`` file) and build the run;
    ``ValueError`` / ``ImportError`` name the flag or the config key.

    ``imports`` says whose of the user's functions are imported
    (:data:`~botorch_fed.runs.black_box.Imports`: ``"all"`` in one process, a party's
    own on Flower, none on the server); the others are
    :class:`~botorch_fed.runs.black_box.RemoteObjective`."""
    from botorch_fed.algorithms import get_algorithm

    check_imports(imports)
    by_dest = {o.dest: o for o in options}
    label = lambda dest: sources.get(dest, f"--{dest}")  # paths: as typed, no backquotes
    for dest in ("out", "plot", "checkpoint", "resume"):  # one config file, many algorithms
        if getattr(args, dest, None):
            setattr(args, dest, getattr(args, dest).replace("{algorithm}", args.algorithm))
    check_output_paths(
        {dest: (label(dest), getattr(args, dest)) for dest in ("out", "plot")},
        config_path=config.file if config is not None else None,
    )
    check_checkpoint_folders(args.checkpoint, args.resume, label("checkpoint"))
    spec = get_algorithm(args.algorithm)
    names = {o.field: o.label(sources) for o in options if o.field is not None}
    settings = _build_settings(spec.settings_class, args, options, names, config)
    setup_names = {py: by_dest[d].label(sources) for py, d in SETUP_DESTS.items() if d in by_dest}
    folders = [os.getcwd(), *([config.folder] if config is not None and config.folder else [])]
    with import_path(folders):
        setup, name = _build_setup(spec, args, by_dest, sources, config, setup_names, imports)
        if spec.check is not None:  # the algorithm's own checks, before the run starts
            from botorch_fed.protocol.runner import build_context

            try:
                build_context(spec, setup, settings)
            except ValueError as exc:
                raise ValueError(rename_to_flags(str(exc), names | setup_names)[0]) from None
    return PreparedRun(args.algorithm, setup, settings, name, folders, args.checkpoint,
                       args.resume, args.out, args.plot, names)  # fmt: skip
