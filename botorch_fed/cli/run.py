r"""``botorch-fed run <algorithm>``: check everything, then run with a progress bar.

:func:`prepare_run` turns the parsed arguments into a :class:`PreparedRun` and refuses
anything invalid before the run starts (``ValueError`` / ``ImportError``, exit code 2):
settings, federation, the user's modules, ``--out`` / ``--plot`` paths, the
``--checkpoint`` / ``--resume`` folders. :func:`execute_run` runs it and reports; its
exit codes are 0 (done), 1 (the run was stopped by its black box or failed, or its
results could not be written), 2 (``--resume`` refused: a checkpoint of another run)
and 130 (interrupted; the checkpoint, if any, is complete up to the last round).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch
from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)

from botorch_fed.cli.arguments import build_settings, build_setup
from botorch_fed.cli.black_box import import_path
from botorch_fed.cli.config import Config
from botorch_fed.cli.options import Option, rename_to_flags
from botorch_fed.cli.report import check_output_paths, plot_run, print_run, write_json

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


def print_error(console: Console, message: str, title: str = "error:") -> None:
    r"""``message`` in red after ``title``, verbatim (not read as markup)."""
    console.print(f"[bold red]{title}[/] {escape(message)}", soft_wrap=True)


@dataclass
class PreparedRun:
    r"""A checked ``run``: what :func:`run_federated` takes and where the results go."""

    algorithm: str
    setup: object
    settings: object
    label: str | None  # the user's black box's name (None: a built-in problem)
    folders: list[str]  # where the user's modules are imported from
    threads: int
    checkpoint: str | None
    resume: str | None
    out: str | None
    plot: str | None
    names: dict[str, str] = field(default_factory=dict)  # Python name -> flag or key


def _check_checkpoint_folders(args: argparse.Namespace, label) -> None:
    r"""``--resume`` is a folder; ``--checkpoint`` can be written and does not overwrite
    another run's checkpoint."""
    from botorch_fed.federation.checkpoint import MANIFEST

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
    from botorch_fed.federation import get_algorithm

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
            from botorch_fed.cli.arguments import SETUP_DESTS
            from botorch_fed.federation.runner import build_context

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
        threads=args.threads,
        checkpoint=args.checkpoint,
        resume=args.resume,
        out=args.out,
        plot=args.plot,
        names={o.field: o.label(sources) for o in options if o.field is not None},
    )


def _run_with_progress(run: PreparedRun, console: Console):
    r"""``run_federated`` with a progress bar (starting at the resumed round)."""
    from botorch_fed.federation.runner import run_federated

    with Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("best {task.fields[best]}"),
        TimeElapsedColumn(),
        console=console,
    ) as progress:
        what = f"{run.algorithm} on {escape(run.label or run.setup.problem)}"
        task = progress.add_task(what, total=run.settings.num_rounds, best="-")
        first: list[int] = []

        def on_round(t: int, best: float | None) -> None:
            if not first:  # a resumed run: the bar starts where the first round lands
                first.append(t)
                if t > 1:
                    progress.update(task, description=f"{what} (resumed at round {t})")
            progress.update(task, completed=t, best="-" if best is None else f"{best:.6g}")

        result = run_federated(
            run.algorithm,
            run.setup,
            run.settings,
            on_round=on_round,
            checkpoint=run.checkpoint,
            resume=run.resume,
        )
        if not first and run.resume:  # a finished run resumed: nothing was left to run
            progress.update(task, description=f"{what} (already complete)")
        best = result.best_value
        progress.update(
            task,
            completed=len(result.best_per_round) - 1,
            best="-" if best is None else f"{best:.6g}",
        )
    return result


def _interrupted(run: PreparedRun, console: Console) -> int:
    from botorch_fed.federation.checkpoint import MANIFEST

    folder = run.checkpoint or run.resume
    if folder and os.path.isfile(os.path.join(folder, MANIFEST)):
        text = (
            f"every completed round is checkpointed in {folder}: continue with "
            f"--resume {folder} and the same options."
        )
    else:
        text = "nothing was saved (--checkpoint DIR keeps the state after every round)."
    print_error(console, text, "interrupted:")
    return 130


def execute_run(run: PreparedRun, console: Console) -> int:
    r"""Run a :class:`PreparedRun`, print its tables, write ``--out`` and ``--plot``;
    returns the exit code (module docstring)."""
    from botorch_fed.federation.checkpoint import CheckpointError
    from botorch_fed.federation.objectives import EvaluationError, ObjectiveContractError

    threads = torch.get_num_threads()
    torch.set_num_threads(run.threads)
    try:
        # the user's functions may import their own modules lazily: the folders stay on
        # the path for the run, but only when the black box is user code
        folders = run.folders if run.setup.objectives is not None else []
        with import_path(folders), library_warnings_ignored():
            result = _run_with_progress(run, console)
    except KeyboardInterrupt:
        return _interrupted(run, console)
    except CheckpointError as exc:  # --resume: another run's, or a corrupt one
        print_error(console, rename_to_flags(str(exc), run.names)[0])
        return 2
    except (EvaluationError, ObjectiveContractError) as exc:
        print_error(console, str(exc), "the run stopped:")
        return 1
    except (ValueError, ImportError, OSError) as exc:  # the arguments were fine
        print_error(console, f"{type(exc).__name__}: {exc}", "the run failed:")
        return 1
    finally:
        torch.set_num_threads(threads)
    code = 0
    data = result.to_dict()
    failure = None
    if run.out:  # before the tables: the results are safe whatever happens next
        try:
            write_json(data, run.out)
        except (OSError, TypeError, ValueError) as exc:
            failure = f"--out {run.out}: the results could not be written ({exc})."
    print_run(result, console, run.label)
    if failure is not None:
        print_error(console, failure)
        code = 1
    elif run.out:
        console.print(f"results written to {escape(run.out)}", soft_wrap=True)
    if run.plot:
        try:
            plot_run(data, run.plot, console)
        except (OSError, ValueError) as exc:
            print_error(console, f"--plot {run.plot}: the plot could not be drawn ({exc}).")
            code = 1
    if result.best_value is None:  # a broken black box (or bounds that do not fit it)
        first = result.failures[0]["error"] if result.failures else "?"
        print_error(
            console,
            f"every evaluation failed (the first: {first}); check the black box and "
            "--bounds (one lower,upper pair per dimension of the function).",
        )
        code = 1
    return code
