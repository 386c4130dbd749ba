r"""``botorch-fed run <algorithm>``: run a checked run with a progress bar.

:func:`~botorch_fed.runs.prepare.prepare_run` checks everything before the run starts
(exit code 2 on what it refuses). :func:`execute_run` runs it and reports; its
exit codes are 0 (done), 1 (the run was stopped by its black box or failed, or its
results could not be written), 2 (``--resume`` refused: a checkpoint of another run)
and 130 (interrupted; the checkpoint, if any, is complete up to the last round).
"""

from __future__ import annotations

import os

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

from botorch_fed.cli.errors import print_error
from botorch_fed.cli.report import plot_run, print_run
from botorch_fed.runs.black_box import import_path
from botorch_fed.runs.options import rename_to_flags
from botorch_fed.runs.outputs import write_json
from botorch_fed.runs.prepare import PreparedRun, library_warnings_ignored


def _run_with_progress(run: PreparedRun, console: Console):
    r"""``run_federated`` with a progress bar (starting at the resumed round)."""
    from botorch_fed.protocol.runner import run_federated

    with Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("best {task.fields[best]}"),
        TimeElapsedColumn(),
        console=console,
    ) as progress:
        black_box = run.label or run.setup.problem
        assert black_box is not None  # the user's black box is labelled, else a problem
        what = f"{run.algorithm} on {escape(black_box)}"
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
    from botorch_fed.protocol.checkpoint import MANIFEST

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
    from botorch_fed.problems.objectives import EvaluationError, ObjectiveContractError
    from botorch_fed.protocol.checkpoint import CheckpointError

    try:
        # the user's functions may import their own modules lazily: the folders stay on
        # the path for the run, but only when the black box is user code
        folders = run.folders if run.setup.objectives is not None else []
        with import_path(folders), library_warnings_ignored():  # threads: run_federated
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
