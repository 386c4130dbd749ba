r"""The clients' black box from the command line or the config file.

``--problem NAME`` names a built-in test function; ``--objective module:function
--bounds "lo,hi;..."`` (or the config file's ``objective`` / ``[[objectives]]`` tables
and ``bounds``) names the user's own Python functions, imported with the current
directory (then the config file's folder) on the path and wrapped in
:class:`~botorch_fed.protocol.objectives.CallableObjective`. Every error names the
flag or the config key it came from.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import functools
import importlib
import inspect
import os
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from botorch_fed.runs.config import Config
from botorch_fed.runs.options import Option

DEFAULT_PROBLEM = "cec2005-f1"


@contextlib.contextmanager
def import_path(folders: Sequence[str]) -> Iterator[None]:
    r"""The first of ``folders`` (the current directory) in front of ``sys.path``, as
    ``python -m`` puts it there, the others (the config file's folder) at the end, so
    that a module there never shadows an installed library; restored afterwards."""
    saved = list(sys.path)
    folders = list(dict.fromkeys(folders))
    sys.path[:0] = folders[:1]
    sys.path.extend(f for f in folders[1:] if f not in sys.path)
    importlib.invalidate_caches()
    try:
        yield
    finally:
        sys.path[:] = saved


class ObjectiveImportError(ValueError):
    r"""The user's module could not be imported, or has no such callable. Its text holds
    the module's own error, the working directory and names from the module: a party's
    agent reports it to the server by type only."""


def import_callable(spec: str, where: str):
    r"""The callable named by ``"package.module:function"`` (``function`` may be a dotted
    attribute path); ``ValueError`` naming ``where`` (a flag or a config key), an
    :class:`ObjectiveImportError` when the module or the callable does not load."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name.strip() or not attr.strip():
        raise ValueError(
            f"{where} {spec!r}: expected MODULE:FUNCTION, e.g. mymod:loss or package.module:loss."
        )
    module_name, attr = module_name.strip(), attr.strip()
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and (module_name == exc.name or module_name.startswith(exc.name + ".")):
            raise ObjectiveImportError(
                f"{where} {spec!r}: cannot import module {module_name!r} ({exc}); modules are "
                f"found in the current directory ({os.getcwd()}) and on the Python path."
            ) from None
        raise ObjectiveImportError(
            f"{where} {spec!r}: importing module {module_name!r} failed: "
            f"{type(exc).__name__}: {exc}."
        ) from exc
    except Exception as exc:  # noqa: BLE001 - the user's module may raise anything
        raise ObjectiveImportError(
            f"{where} {spec!r}: importing module {module_name!r} failed: "
            f"{type(exc).__name__}: {exc}."
        ) from exc
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            names = [n for n in dir(obj) if not n.startswith("_")]
            close = difflib.get_close_matches(part, names, n=3)
            hint = f" Did you mean {', '.join(close)}?" if close else ""
            raise ObjectiveImportError(
                f"{where} {spec!r}: {module_name!r} has no attribute {attr!r}.{hint}"
            )
        obj = getattr(obj, part)
    if not callable(obj):
        raise ObjectiveImportError(
            f"{where} {spec!r}: {module_name}.{attr} is a {type(obj).__name__}, not a function."
        )
    return obj


def parse_bounds(value: Any, where: str) -> torch.Tensor:
    r"""``--bounds`` (``"0,1;0,1;-5,5"``) or a config file's ``bounds`` (that string or
    ``[[0, 1], [0, 1], [-5, 5]]``: one ``[lower, upper]`` pair per dimension) as a
    ``2 x d`` float64 tensor; ``ValueError`` naming ``where``."""
    from botorch_fed.protocol.objectives import check_bounds

    example = '"0,1;0,1;-5,5" (lower,upper per dimension, separated by ";")'
    if isinstance(value, str):
        pieces = [p.strip() for p in value.strip().rstrip(";").split(";")]
        if not value.strip() or any(not p for p in pieces):
            raise ValueError(f"{where} {value!r}: expected {example}.")
        pairs = []
        for i, piece in enumerate(pieces):
            try:
                pair = [float(s.strip()) for s in piece.split(",")]
            except ValueError:
                pair = []
            if len(pair) != 2:
                raise ValueError(
                    f"{where} {value!r}: dimension {i} is {piece!r}, not two numbers "
                    f"'lower,upper'; expected {example}."
                )
            pairs.append(pair)
    else:
        pairs = value
        if not isinstance(pairs, list) or not pairs:
            raise ValueError(
                f"{where}: expected [[lower, upper], ...] or {example}, got {value!r}."
            )
        for i, pair in enumerate(pairs):
            if (
                not isinstance(pair, list)
                or len(pair) != 2
                or not all(isinstance(v, int | float) and not isinstance(v, bool) for v in pair)
            ):
                raise ValueError(
                    f"{where}: entry {i} is {pair!r}; every dimension needs a [lower, upper] "
                    "pair of numbers."
                )
    return check_bounds(torch.tensor(pairs, dtype=torch.float64).T, name=where.strip("`"))


@dataclass
class ObjectiveSpec:
    r"""One user function as named on the command line or in the config file."""

    function: str  # "module:function"
    kwargs: dict
    name: str | None
    where: str  # the flag or config key that named it


@dataclass
class BlackBox:
    r"""Where the clients' objectives come from: a built-in ``problem`` or the user's
    functions (``shared``: one function for every client)."""

    problem: str | None = None
    specs: list[ObjectiveSpec] | None = None
    shared: bool = False
    label: str = ""


def resolve_black_box(
    args: argparse.Namespace, sources: dict[str, str], config: Config | None
) -> BlackBox:
    r"""``--problem``, ``--objective`` or the config file's black box (the command line
    wins over the file)."""
    cli = [k for k in ("problem", "objective") if getattr(args, k) is not None and k not in sources]
    if len(cli) > 1:
        raise ValueError(
            "`--objective` and `--problem` are exclusive: give your own black box or a "
            "built-in test function, not both."
        )
    if cli == ["problem"] or (not cli and "problem" in sources):
        return BlackBox(problem=args.problem)
    if cli == ["objective"] or (not cli and "objective" in sources):
        where = sources.get("objective", "`--objective`")
        spec = ObjectiveSpec(args.objective, {}, None, where)
        return BlackBox(specs=[spec], shared=True, label=args.objective)
    if config is not None and config.objective_table is not None:
        t = config.objective_table
        where = f"`objective.function` in {config.path}"
        spec = ObjectiveSpec(t["function"], t.get("kwargs", {}), t.get("name"), where)
        return BlackBox(specs=[spec], shared=True, label=t.get("name") or t["function"])
    if config is not None and config.objectives is not None:
        specs = [
            ObjectiveSpec(
                t["function"],
                t.get("kwargs", {}),
                t.get("name"),
                f"`objectives[{i}].function` in {config.path}",
            )
            for i, t in enumerate(config.objectives)
        ]
        return BlackBox(specs=specs, label=f"{len(specs)} client objectives ({config.path})")
    return BlackBox(problem=DEFAULT_PROBLEM)


def _load_function(spec: ObjectiveSpec):
    r"""The user's function with its ``kwargs`` bound; refused unless it can be called as
    ``function(X, **kwargs)``."""
    fn = import_callable(spec.function, spec.where)
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # some builtins have none
        signature = None
    if signature is not None:
        try:
            signature.bind(None, **spec.kwargs)
        except TypeError as exc:
            where = spec.where.replace(".function`", ".kwargs`") if spec.kwargs else spec.where
            call = f"({', '.join(['X', *(f'{k}=...' for k in spec.kwargs)])})"
            raise ValueError(
                f"{where}: {spec.function} cannot be called as {spec.function}{call}: {exc}."
            ) from None
    return functools.partial(fn, **spec.kwargs) if spec.kwargs else fn


def make_objectives(
    box: BlackBox, args: argparse.Namespace, sources: dict[str, str], bounds_option: Option
) -> list:
    r"""The user's functions wrapped in :class:`CallableObjective` (one per spec), over
    ``--bounds`` and in the ``--maximize`` convention."""
    from botorch_fed.protocol.objectives import CallableObjective

    assert box.specs is not None  # a black box without a built-in problem has specs
    if args.bounds is None:
        raise ValueError(
            f'{box.specs[0].where} needs the domain: `--bounds` (e.g. "0,1;-5,5") or `bounds` '
            "in the config file."
        )
    bounds = parse_bounds(args.bounds, bounds_option.label(sources))
    objectives = []
    for spec in box.specs:
        name = spec.name
        if name is None and spec.kwargs:
            name = f"{spec.function}({', '.join(f'{k}={v!r}' for k, v in spec.kwargs.items())})"
        objectives.append(
            CallableObjective(
                _load_function(spec),
                bounds,
                minimize=not args.maximize,
                name=name or spec.function,
            )
        )
    return objectives
