r"""A checked run: :func:`prepare_run` turns the parsed options of ``run <algorithm>``
into a :class:`PreparedRun` and refuses anything invalid before the run starts
(``ValueError`` / ``ImportError`` naming the flag or the config key): settings,
federation, the user's modules, ``--out`` / ``--plot`` paths, the ``--checkpoint`` /
``--resume`` folders.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from botorch_fed.runs.arguments import SETUP_DESTS, build_settings, build_setup
from botorch_fed.runs.black_box import import_path
from botorch_fed.runs.config import Config
from botorch_fed.runs.options import Option, rename_to_flags
from botorch_fed.runs.outputs import check_output_paths

if TYPE_CHECKING:
    from botorch_fed.protocol.setup import FederationSetup

# warnings of these packages are advice about the library's own small linear algebra
# (BoTorch's input scaling, GPyTorch's jitter, ...); the user's black box's are shown
LIBRARY_MODULES = (
    r"(botorch|botorch_fed|botorch_community|gpytorch|linear_operator|torch|numpy|scipy|"
    r"sklearn|ot|tenseal)(\.|$)"
)


@contextlib.contextmanager
def library_warnings_ignored() -> Iterator[None]:
    r"""Ignore warnings raised in the libraries a run uses (:data:`LIBRARY_MODULES`),
    not those of the user's own modules."""
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
    names: dict[str, str] = field(default_factory=dict)  # Python name -> flag or key


def _check_checkpoint_folders(args: argparse.Namespace, label) -> None:
    r"""``--resume`` is a folder; ``--checkpoint`` can be written and does not overwrite
    another run's checkpoint."""
    from botorch_fed.protocol.checkpoint import MANIFEST

    checkpoint, resume = args.checkpoint, args.resume
    if resume and not os.path.isdir(resume):
        raise ValueError(f"--resume {resume}: no such checkpoint folder.")
    if resume and not os.access(resume, os.W_OK):
        raise ValueError(
            f"--resume {resume}: the folder is not writable (the resumed run checkpoints into it)."
        )
    if not checkpoint:
        return
    where = label("checkpoint")
    if os.path.exists(checkpoint) and not os.path.isdir(checkpoint):
        raise ValueError(f"{where} {checkpoint} is a file; give a folder.")
    parent = os.path.dirname(os.path.abspath(checkpoint))
    if not os.path.isdir(parent):
        raise ValueError(f"{where} {checkpoint}: the folder {parent} does not exist.")
    folder = checkpoint if os.path.isdir(checkpoint) else parent
    if not os.access(folder, os.W_OK):
        raise ValueError(f"{where} {checkpoint}: the folder {folder} is not writable.")
    if os.path.isfile(os.path.join(checkpoint, MANIFEST)) and not (
        resume and os.path.samefile(resume, checkpoint)
    ):
        raise ValueError(
            f"{where} {checkpoint} already holds a checkpoint, which this run would "
            f"overwrite: continue that run with --resume {checkpoint}, or give another folder."
        )


def prepare_run(
    args: argparse.Namespace,
    options: list[Option],
    sources: dict[str, str],
    config: Config | None,
) -> PreparedRun:
    r"""Check the arguments of ``run <algorithm>`` and build what the run takes.

    Raises:
        ValueError, ImportError: Naming the flag or the config key.
    """
    from botorch_fed.algorithms import get_algorithm

    by_dest = {o.dest: o for o in options}

    def label(dest: str) -> str:  # paths: as typed, without backquotes
        return sources.get(dest, f"--{dest}")

    for dest in ("out", "plot", "checkpoint", "resume"):  # one config file, many algorithms
        if getattr(args, dest, None):
            setattr(args, dest, getattr(args, dest).replace("{algorithm}", args.algorithm))

    check_output_paths(
        {dest: (label(dest), getattr(args, dest)) for dest in ("out", "plot")},
        config_path=config.path if config is not None else None,
    )
    _check_checkpoint_folders(args, label)
    spec = get_algorithm(args.algorithm)
    settings = build_settings(spec, args, options, sources, config)
    if args.threads < 1:
        raise ValueError(f"{by_dest['threads'].label(sources)} must be >= 1, got {args.threads}.")
    folders = [os.getcwd()]
    if config is not None:
        folders.append(os.path.dirname(os.path.abspath(config.path)))
    with import_path(folders):
        setup, name = build_setup(spec, args, options, sources, config)
        if spec.check is not None:  # the algorithm's own checks, before the run starts
            from botorch_fed.protocol.runner import build_context

            names = {o.field: o.label(sources) for o in options if o.field is not None}
            names.update(
                {py: by_dest[d].label(sources) for py, d in SETUP_DESTS.items() if d in by_dest}
            )
            try:
                build_context(spec, setup, settings)
            except ValueError as exc:
                raise ValueError(rename_to_flags(str(exc), names)[0]) from None
    return PreparedRun(
        algorithm=args.algorithm,
        setup=setup,
        settings=settings,
        label=name,
        folders=folders,
        checkpoint=args.checkpoint,
        resume=args.resume,
        out=args.out,
        plot=args.plot,
        names={o.field: o.label(sources) for o in options if o.field is not None},
    )
