r"""The clients' black box: a built-in ``--problem``, or the user's functions (``--objective
module:function --bounds``, the config file's ``objective`` / ``[[objectives]]``) wrapped in
:class:`~botorch_fed.problems.objectives.CallableObjective`; errors name the flag or key.

On Flower each party imports only its own function and the server none
(:func:`make_objectives`' ``imports``): every other client's objective is a
:class:`RemoteObjective`, its name, domain and direction without its code, which is
all a run needs of the objectives it does not evaluate (the server's program, the
algorithms' checks, the scoring).
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
from torch import Tensor

from botorch_fed.problems.objectives import CallableObjective, Objective, check_bounds
from botorch_fed.runs.config import Config

DEFAULT_PROBLEM = "cec2005-f1"


@contextlib.contextmanager
def import_path(folders: Sequence[str]) -> Iterator[None]:
    r"""``folders[0]`` (the current directory) in front of ``sys.path`` as ``python -m`` puts
    it, the others at the end (never shadowing a library), until the block ends."""
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
    r"""The user's module or callable does not load. Its text holds the module's error,
    the working directory and names from the module: an agent reports it by type only."""


def import_callable(spec: str, where: str):
    r"""The callable ``"package.module:function"`` (may be dotted) named by ``where`` (a flag or
    key); ``ValueError`` if malformed, :class:`ObjectiveImportError` if it does not load."""
    module_name, sep, attr = spec.partition(":")
    module_name, attr = module_name.strip(), attr.strip()
    if not sep or not module_name or not attr:
        raise ValueError(
            f"{where} {spec!r}: expected MODULE:FUNCTION, e.g. mymod:loss or package.module:loss."
        )
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # noqa: BLE001 - the user's module may raise anything
        missing = exc.name if isinstance(exc, ModuleNotFoundError) else None
        if missing and (module_name == missing or module_name.startswith(missing + ".")):
            raise ObjectiveImportError(
                f"{where} {spec!r}: cannot import module {module_name!r} ({exc}); modules are "
                f"found in the current directory ({os.getcwd()}) and on the Python path."
            ) from None
        raise ObjectiveImportError(
            f"{where} {spec!r}: importing module {module_name!r} failed: "
            f"{type(exc).__name__}: {exc}."
        ) from exc
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            close = difflib.get_close_matches(part, [n for n in dir(obj) if n[:1] != "_"], n=3)
            hint = f" Did you mean {', '.join(close)}?" if close else ""
            raise ObjectiveImportError(
                f"{where} {spec!r}: {module_name!r} has no attribute {attr!r}.{hint}"
            )
        obj = getattr(obj, part)
    if not callable(obj):
        raise ObjectiveImportError(
            f"{where} {spec!r}: {module_name}.{attr} is of type {type(obj).__name__}, "
            "not a function."
        )
    return obj


Imports = int | str | None
r"""Which clients' objectives a run imports: ``"all"`` (a run in one process), a client
id (a party's agent: its own only) or ``None`` (none: the server, the submitter)."""


def check_imports(imports: Any) -> Imports:
    r"""``imports`` if it is an :data:`Imports` (``ValueError`` otherwise)."""
    ok = imports is None or imports == "all"
    ok = ok or (isinstance(imports, int) and not isinstance(imports, bool) and imports >= 0)
    if not ok:
        raise ValueError(f'`imports` must be "all", a client id >= 0 or None, got {imports!r}.')
    return imports


class ImportedObjective(CallableObjective):
    r"""A user's function imported from ``source`` (``MODULE:FUNCTION``, as the command
    line or the config file names it): what a party's policy checks."""

    def __init__(self, fn, bounds, source: str, **kwargs) -> None:
        super().__init__(fn, bounds, **kwargs)
        self.source = source


class RemoteObjective(Objective):
    r"""Another client's black box, where it is not evaluated: its name, domain and
    direction (what the server's program, the algorithms' checks and the scoring read
    of the objectives), not its code. A party's agent builds one for every other
    party's objective, the server for every objective, so neither needs the others'
    modules. It describes itself as the imported function does
    (:meth:`~botorch_fed.problems.objectives.Objective.describe`).

    Args:
        source: ``MODULE:FUNCTION`` as the run names it (not imported).
        bounds: ``2 x d`` bounds of the domain.
        minimize: Whether smaller values are better.
        name: A name for result tables.
    """

    def __init__(self, source: str, bounds, minimize: bool, name: str) -> None:
        self.source, self.bounds = source, check_bounds(bounds)
        self.minimize, self.name = bool(minimize), name

    def __repr__(self) -> str:
        sense = "minimize" if self.minimize else "maximize"
        return f"RemoteObjective({self.name}, d={self.dim}, {sense})"

    def evaluate(self, X: Tensor) -> tuple[Tensor, Tensor]:
        raise RuntimeError(
            f"Objective {self.name!r} ({self.source}) is evaluated by its own client only; "
            "this process holds its domain, not its code."
        )


@dataclass(frozen=True)
class ObjectiveTables:
    r"""The config file's objective tables that a run's black box comes from: one per
    client (``[[objectives]]``), or one for every client (``shared``: an ``objective``
    table). Each entry is ``(table with function/kwargs/name, its config key)``."""

    tables: tuple[tuple[dict, str], ...]
    shared: bool

    def imported(self, imports: Imports) -> list[tuple[dict, str]]:
        r"""The tables whose functions a run importing ``imports`` imports.

        Raises:
            ValueError: A client id without a table.
        """
        check_imports(imports)
        if imports is None:
            return []
        if self.shared or imports == "all":
            return list(self.tables[:1] if self.shared else self.tables)
        assert isinstance(imports, int)
        if imports >= len(self.tables):
            raise ValueError(
                f"The run's config has {len(self.tables)} [[objectives]] tables (one per "
                f"client): none for client {imports}."
            )
        return [self.tables[imports]]


def objective_tables(
    args: argparse.Namespace, sources: dict[str, str], config: Config | None
) -> ObjectiveTables | None:
    r"""The config file's objective tables the run's black box comes from
    (:func:`resolve_black_box`'s choice), or ``None``: a built-in problem or an
    ``--objective`` (the command line's or the file's ``objective = "m:f"``)."""
    problem, specs, shared, _ = resolve_black_box(args, sources, config)
    if problem is not None or "objective" in sources or args.objective is not None:
        return None
    return ObjectiveTables(tuple(specs), shared)


def parse_bounds(value: Any, where: str) -> torch.Tensor:
    r"""``"0,1;0,1;-5,5"`` or ``[[0, 1], [0, 1], [-5, 5]]`` as a ``2 x d`` float64
    tensor; ``ValueError`` naming ``where``."""
    example = '"0,1;0,1;-5,5" (lower,upper per dimension, separated by ";")'
    if isinstance(value, str):
        pieces = [p.strip() for p in value.strip().rstrip(";").split(";")]
        if not value.strip() or not all(pieces):
            raise ValueError(f"{where} {value!r}: expected {example}.")
        pairs: list = []
        for i, piece in enumerate(pieces):
            with contextlib.suppress(ValueError):
                pairs.append([float(s) for s in piece.split(",")])
            if len(pairs) == i or len(pairs[i]) != 2:
                raise ValueError(
                    f"{where} {value!r}: dimension {i} is {piece!r}, not two numbers "
                    f"'lower,upper'; expected {example}."
                )
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


def resolve_black_box(
    args: argparse.Namespace, sources: dict[str, str], config: Config | None
) -> tuple[str | None, list[tuple[dict, str]], bool, str]:
    r"""``(problem, specs, shared, label)`` of ``--problem``, ``--objective`` or the config
    file (the command line wins): a built-in problem, else the user's functions as ``(table
    with function/kwargs/name, flag or key)``, whether one serves every client, a label."""
    cli = [k for k in ("problem", "objective") if getattr(args, k) is not None and k not in sources]
    if len(cli) > 1:
        raise ValueError(
            "`--objective` and `--problem` are exclusive: give your own black box or a "
            "built-in test function, not both."
        )
    if cli == ["problem"] or (not cli and "problem" in sources):
        return args.problem, [], False, ""
    if cli == ["objective"] or (not cli and "objective" in sources):
        where = sources.get("objective", "`--objective`")
        return None, [({"function": args.objective}, where)], True, args.objective
    if config is None or config.objectives is None:
        return DEFAULT_PROBLEM, [], False, ""
    tables = config.objectives
    if config.shared:
        where = f"`objective.function` in {config.path}"
        return None, [(tables[0], where)], True, tables[0].get("name") or tables[0]["function"]
    specs = [(t, f"`objectives[{i}].function` in {config.path}") for i, t in enumerate(tables)]
    return None, specs, False, f"{len(specs)} client objectives ({config.path})"


def objective_name(table: dict) -> str:
    r"""The name of the objective of ``table`` (function/kwargs/name) in result tables:
    its ``name``, else ``MODULE:FUNCTION(key=value, ...)``."""
    function, kwargs = table["function"], table.get("kwargs", {})
    if kwargs:
        function += f"({', '.join(f'{k}={v!r}' for k, v in kwargs.items())})"
    return table.get("name") or function


def make_objectives(
    specs: list[tuple[dict, str]],
    args: argparse.Namespace,
    label: str,
    imports: Imports = "all",
    shared: bool = False,
) -> list[Objective]:
    r"""The user's functions (``specs`` of :func:`resolve_black_box`, each callable as
    ``f(X, **kwargs)``) as :class:`ImportedObjective` over ``--bounds`` (named
    ``label``); those of the clients ``imports`` does not name (:data:`Imports`; a
    ``shared`` spec is every client's) as :class:`RemoteObjective`, not imported.

    Raises:
        ValueError: No or invalid bounds; a malformed ``MODULE:FUNCTION``; a client id
            in ``imports`` without a spec.
        ObjectiveImportError: A function that does not load, or cannot be called with
            its ``kwargs`` (the text names the user's code).
    """
    check_imports(imports)
    if args.bounds is None:
        raise ValueError(
            f'{specs[0][1]} needs the domain: `--bounds` (e.g. "0,1;-5,5") or `bounds` '
            "in the config file."
        )
    bounds = parse_bounds(args.bounds, label)
    if isinstance(imports, int) and not shared and imports >= len(specs):
        raise ValueError(f"The run has {len(specs)} client objectives: none for client {imports}.")
    objectives: list[Objective] = []
    for i, (table, where) in enumerate(specs):
        function, kwargs = table["function"], table.get("kwargs", {})
        name = objective_name(table)
        if imports is None or (imports != "all" and imports != i and not shared):
            objectives.append(RemoteObjective(function, bounds, not args.maximize, name))
            continue
        fn = import_callable(function, where)
        signature = None
        with contextlib.suppress(TypeError, ValueError):  # some builtins have none
            signature = inspect.signature(fn)
        try:
            if signature is not None:
                signature.bind(None, **kwargs)
        except TypeError as exc:
            where = where.replace(".function`", ".kwargs`") if kwargs else where
            call = f"({', '.join(['X', *(f'{k}=...' for k in kwargs)])})"
            message = f"{where}: {function} cannot be called as {function}{call}: {exc}."
            raise ObjectiveImportError(message) from None  # the text quotes the user's code
        if kwargs:
            fn = functools.partial(fn, **kwargs)
        objectives.append(
            ImportedObjective(fn, bounds, function, minimize=not args.maximize, name=name)
        )
    return objectives
