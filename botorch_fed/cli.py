r"""The ``botorch-fed`` command line.

Subcommands:

- ``botorch-fed run <algorithm>``: a federated optimisation with any registered
  algorithm (:func:`~botorch_fed.federation.available_algorithms`: ``fbo-fedgp`` and
  the baselines ``local``, ``central``, ``fts``, ``random``) on a built-in test
  function (``--problem``) or the user's own black box (``--objective
  module:function --bounds ...``, or per-client functions in a ``--config`` TOML
  file), with a progress bar per round, a result table, ``--out`` JSON, ``--plot``
  convergence curve and ``--checkpoint`` / ``--resume``. Each algorithm has its own
  sub-parser whose options are generated from its settings dataclass (flag names
  from the field names, help from the ``Attributes:`` section of its docstring,
  choices where the field takes a fixed set of strings), so ``botorch-fed run
  local --help`` lists only what ``local`` takes.
- ``botorch-fed list``: the registered algorithms, one line each.
- ``botorch-fed demo``: federated sparse-GP regression on simulated clients; prints
  a table of test RMSE / NLL and timings for each client's own GP, the federated
  dPITC model and an exact GP on pooled data.

Invalid arguments print a message naming the flag (or the config file's key) and
exit with code 2; a run stopped by a failed evaluation (``--fail-on-error``) or by a
black box that returns the wrong shape exits with code 1.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import difflib
import functools
import importlib
import importlib.util
import inspect
import json
import math
import os
import re
import sys
import textwrap
import tomllib
import types
import typing
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

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
from rich.table import Table

from botorch_fed import __version__

DEFAULT_PROBLEM = "cec2005-f1"
DEFAULT_CLIENTS = 10
MAX_FAILURES_SHOWN = 5

# Settings fields whose command-line flags are not just ``--field-name``: older flag
# names kept as aliases (README, Makefile, benchmarks use them). ``--support`` is the
# support *size*, so the support-selection field ``support`` is ``--support-selection``.
SETTING_ALIASES = {
    "num_init": ("--init",),
    "num_rounds": ("--rounds",),
    "support_size": ("--support",),
}
SETTING_FLAGS = {"support": "--support-selection"}
_NOT_A_CHOICE = "\x00not-a-choice"

CONFIG_HELP = """\
config file (--config FILE, TOML; flags given on the command line override it):
  problem = "hartmann"                  a built-in test function, or your own black box:
  objective = "mymod:loss"              one function shared by all `clients`, or
  [[objectives]]                        one table per client (heterogeneous federation):
  function = "mymod:make_loss"          called as function(X, **kwargs)
  kwargs = { client = 0 }               (optional; also `name` for result tables)
  bounds = [[0, 1], [0, 1], [-5, 5]]    one [lower, upper] pair per dimension, or "0,1;0,1;-5,5"
  minimize = true                       (or maximize = true)
  clients = 4                           every option above by its long name with
  seed = 0                              underscores: init_regions = true, fail_on_error, ...
  [settings]                            this algorithm's settings by field name:
  num_rounds = 20                       (num_rounds, not --rounds)
  [settings.fbo-fedgp]                  settings for one algorithm only (others skip it)
  support_size = 8
Python modules are imported from the current directory, then the config file's folder.
Algorithms without secure aggregation ignore `aggregator`; --resume and --config are
command-line only."""


class _Formatter(argparse.RawDescriptionHelpFormatter):
    r"""Keeps the description/epilog layout and shows every default that is set."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if (
            "%(default)" not in text
            and action.option_strings
            and action.default is not None
            and action.default is not False
            and action.default is not argparse.SUPPRESS
        ):
            text += " (default: %(default)s)"
        return text


@dataclass
class _Option:
    r"""One option of ``run <algorithm>``: its flags, its type, its config-file key."""

    dest: str
    flags: tuple[str, ...]
    kind: type  # int, float, str, bool
    nullable: bool = False
    choices: tuple | None = None
    key: str | None = None  # config-file key (None: command line only)
    field: str | None = None  # the settings field

    @property
    def display(self) -> str:
        return "/".join(f"`{f}`" for f in self.flags)


@dataclass(frozen=True)
class _FromConfig:
    r"""A parser default that came from the config file (unwrapped after parsing)."""

    value: Any
    label: str

    def __str__(self) -> str:
        return str(self.value)


class ConfigError(ValueError):
    r"""An invalid ``--config`` file (names the file and the key)."""


@dataclass
class _Config:
    r"""What a ``--config`` file holds besides parser defaults."""

    path: str
    objective_table: dict | None = None  # `objective = { function = ..., kwargs = ... }`
    objectives: list[dict] | None = None  # [[objectives]]
    settings_extra: dict[str, Any] = field(default_factory=dict)  # fields without a flag
    has: set[str] = field(default_factory=set)  # top-level keys present

    def label(self, key: str) -> str:
        return f"`{key}` in {self.path}"


# --------------------------------------------------------------------------- options


def _attribute_docs(cls: type) -> dict[str, str]:
    r"""``{field: description}`` from the ``Attributes:`` sections of ``cls`` and its
    bases (Google style; a subclass's entry wins)."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        doc = inspect.cleandoc(klass.__dict__.get("__doc__") or "")
        lines = doc.splitlines()
        try:
            start = next(i for i, s in enumerate(lines) if s.strip() == "Attributes:")
        except StopIteration:
            continue
        base = len(lines[start]) - len(lines[start].lstrip())
        entry_indent, name = None, None
        for line in lines[start + 1 :]:
            if not line.strip():
                continue
            indent = len(line) - len(line.lstrip())
            if indent <= base:
                break
            m = re.match(r"\s*(\w+)(?: \([^)]*\))?:\s*(.*)$", line)
            if m and (entry_indent is None or indent <= entry_indent):
                entry_indent, name = indent, m.group(1)
                docs[name] = m.group(2).strip()
            elif name is not None:
                docs[name] += " " + line.strip()
    return {k: re.sub(r"\s+", " ", v.replace("``", "")).strip() for k, v in docs.items()}


def _field_type(hint: Any) -> tuple[type | None, bool]:
    r"""``(kind, nullable)`` of a field type: int/float/str/bool, optionally ``| None``."""
    nullable = False
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        nullable = len(args) < len(typing.get_args(hint))
        if len(args) != 1:
            return None, nullable
        hint = args[0]
    return (hint if hint in (int, float, str, bool) else None), nullable


def _probe(cls: type, **values) -> bool:
    r"""Whether ``cls(**values).validate()`` passes (the other fields at defaults)."""
    try:
        cls(**values).validate()
    except (ValueError, TypeError):
        return False
    return True


def _field_choices(cls: type, f: dataclasses.Field, default: Any, doc: str) -> tuple | None:
    r"""The fixed set of strings a field takes: ``field.metadata["choices"]``, or the
    quoted strings of its docstring entry when ``validate()`` accepts each of them and
    refuses anything else."""
    if "choices" in f.metadata:
        return tuple(f.metadata["choices"])
    candidates = tuple(dict.fromkeys(re.findall(r'"([^"\s]+)"', doc)))
    if not candidates or (default is not None and default not in candidates):
        return None
    if _probe(cls, **{f.name: _NOT_A_CHOICE}):
        return None  # any string goes
    accepted = tuple(c for c in candidates if _probe(cls, **{f.name: c}))
    return accepted if default is None or default in accepted else None


def setting_options(settings_class: type) -> list[_Option]:
    r"""One command-line option per field of an algorithm's settings dataclass that
    has a plain type (int, float, str, bool, optionally ``| None``)."""
    hints = typing.get_type_hints(settings_class)
    docs = _attribute_docs(settings_class)
    defaults = settings_class()
    out = []
    for f in dataclasses.fields(settings_class):
        if not f.init:
            continue
        kind, nullable = _field_type(hints.get(f.name))
        if kind is None:
            continue  # only through the config file's [settings]
        default = getattr(defaults, f.name)
        primary = SETTING_FLAGS.get(f.name, "--" + f.name.replace("_", "-"))
        choices = None
        if kind is str:
            choices = _field_choices(settings_class, f, default, docs.get(f.name, ""))
        out.append(
            _Option(
                dest=f"settings.{f.name}",
                flags=(primary, *SETTING_ALIASES.get(f.name, ())),
                kind=kind,
                nullable=nullable,
                choices=choices,
                key=f"settings.{f.name}",
                field=f.name,
            )
        )
    return out


def _converter(kind: type, nullable: bool):
    r"""An argparse ``type`` for ``kind`` that also reads ``none`` for nullable fields."""

    def convert(text: str):
        if nullable and text.strip().lower() == "none":
            return None
        return kind(text)

    convert.__name__ = kind.__name__  # argparse: "invalid int value: 'x'"
    return convert


def _add_option(
    group,
    options: list[_Option],
    option: _Option,
    default: Any,
    help: str,
    metavar=None,
) -> None:
    r"""Add ``option`` to ``group`` and record it in ``options``."""
    kwargs: dict[str, Any] = {"dest": option.dest, "default": default, "help": help}
    if option.kind is bool:
        kwargs["action"] = argparse.BooleanOptionalAction  # shows its default itself
    else:
        kwargs["type"] = _converter(option.kind, option.nullable)
        if option.choices is not None:
            kwargs["choices"] = option.choices
        else:
            name = {int: "INT", float: "FLOAT", str: "TEXT"}[option.kind]
            kwargs["metavar"] = metavar or (f"{name}|none" if option.nullable else name)
    group.add_argument(*option.flags, **kwargs)
    options.append(option)


def _algorithm_parser(
    sub: argparse._SubParsersAction, spec
) -> tuple[argparse.ArgumentParser, list[_Option]]:
    r"""The sub-parser of ``run <spec.name>`` and its options."""
    from botorch_fed.federation.setup import FederationSetup
    from botorch_fed.secure.registry import BACKENDS

    fed = FederationSetup()
    settings_name = spec.settings_class.__name__
    p = sub.add_parser(
        spec.name,
        help=spec.summary,
        formatter_class=_Formatter,
        description="\n\n".join(
            textwrap.fill(text, 88)
            for text in (
                f"{spec.name}: {spec.summary}.",
                "M clients jointly optimise a black box: a built-in test function (--problem) "
                "or your own Python function (--objective module:function --bounds ..., or one "
                "function per client in a --config file).",
            )
        ),
        epilog=CONFIG_HELP,
    )
    options: list[_Option] = []

    def add(
        group,
        flags,
        dest,
        kind,
        default,
        help,
        nullable=False,
        choices=None,
        key=True,
        **kw,
    ):
        option = _Option(dest, tuple(flags), kind, nullable, choices, dest if key else None)
        _add_option(group, options, option, default, help, **kw)

    # fmt: off
    g = p.add_argument_group("black box (one of --problem, --objective, a --config file)")
    add(g, ["--problem"], "problem", str, None,
        f"built-in test function: cec2005-f1 ... cec2005-f20, cokg-f1, cokg-f2 or a BoTorch "
        f"synthetic function by name (hartmann, levy, ...); default {DEFAULT_PROBLEM} when "
        "no --objective is given", metavar="NAME")
    add(g, ["--dim"], "dim", int, None,
        "dimension of --problem (default: the function's own)", nullable=True, metavar="D")
    add(g, ["--noise-std"], "noise_std", float, None,
        "additive observation noise of --problem", nullable=True)
    add(g, ["--shift"], "shift", float, fed.shift,
        "per-client shift of --problem (fraction of the domain; 0: one shared function)")
    add(g, ["--objective"], "objective", str, None,
        "your own black box, shared by all clients: a function of an n x d tensor "
        "returning n values, imported from package.module (the current directory is on "
        "the path)", metavar="MODULE:FUNCTION")
    add(g, ["--bounds"], "bounds", str, None,
        'the domain of --objective: "lower,upper" per dimension, separated by ";", e.g. '
        '"0,1;0,1;-5,5"', metavar="BOUNDS")
    add(g, ["--maximize"], "maximize", bool, False,
        "larger values of --objective are better (default: it is minimised)")
    add(g, ["--fail-on-error"], "fail_on_error", bool, False,
        "stop the run when an evaluation raises or returns NaN/inf (default: record it in "
        "the results and carry on)")

    g = p.add_argument_group("federation")
    add(g, ["--clients"], "clients", int, None,
        f"number of clients M (default: {DEFAULT_CLIENTS}, or one per [[objectives]] table)",
        metavar="M")
    add(g, ["--seed"], "seed", int, fed.seed, "random seed")
    add(g, ["--init-regions"], "init_regions", bool, False,
        "initial designs from a different sub-box per client")
    add(g, ["--region-width"], "region_width", float, fed.region_width,
        "side of those sub-boxes (fraction of the domain)")
    if spec.secure_aggregation:
        add(g, ["--aggregator"], "aggregator", str, fed.aggregator,
            "secure-aggregation backend", choices=tuple(BACKENDS))

    # fmt: on
    g = p.add_argument_group(f"{spec.name} settings ({settings_name})")
    docs = _attribute_docs(spec.settings_class)
    defaults = spec.settings_class()
    taken = {f for o in options for f in o.flags} | {"--help", "-h"}
    for option in setting_options(spec.settings_class):
        clash = taken.intersection(option.flags)
        if clash:  # a new settings field named like a federation option
            raise RuntimeError(
                f"{settings_name}.{option.field}: flag(s) {sorted(clash)} are taken; add it "
                "to botorch_fed.cli.SETTING_FLAGS."
            )
        taken.update(option.flags)
        text = docs.get(option.field) or option.field.replace("_", " ")
        if option.nullable and getattr(defaults, option.field) is None:
            text += " (default: none)"
        _add_option(g, options, option, getattr(defaults, option.field), text.replace("%", "%%"))

    # fmt: off
    g = p.add_argument_group("run")
    add(g, ["--config"], "config", str, None,
        "TOML file with the black box, federation options and [settings] (see below)",
        key=False, metavar="FILE")
    add(g, ["--checkpoint"], "checkpoint", str, None,
        "write the complete state into this folder after every round", metavar="DIR")
    add(g, ["--resume"], "resume", str, None,
        "continue the run checkpointed in this folder (give the same options)", key=False,
        metavar="DIR")
    add(g, ["--threads"], "threads", int, 1,
        "torch threads (BO works on small matrices, where threading costs)")
    add(g, ["--out"], "out", str, None, "write the results as JSON to this file", metavar="FILE")
    add(g, ["--plot"], "plot", str, None,
        "draw the convergence curve (regret or best value) into this PNG file", metavar="FILE")
    # fmt: on
    return p, options


def _run_parser(
    sub: argparse._SubParsersAction,
) -> dict[str, tuple[argparse.ArgumentParser, list[_Option]]]:
    from botorch_fed.federation import available_algorithms, get_algorithm

    p = sub.add_parser(
        "run",
        help="run a federated optimisation (FBO-FedGP or a baseline)",
        description=(
            "Run M clients jointly optimising a black box with one of the registered "
            "algorithms. `botorch-fed run <algorithm> --help` lists its options."
        ),
    )
    algorithms = p.add_subparsers(dest="algorithm", required=True, metavar="ALGORITHM")
    return {
        name: _algorithm_parser(algorithms, get_algorithm(name)) for name in available_algorithms()
    }


def _demo_parser(sub: argparse._SubParsersAction) -> None:
    from botorch_fed.regression_demo import FIT_STRATEGIES, RegressionDemoConfig

    defaults = RegressionDemoConfig()
    p = sub.add_parser(
        "demo",
        help="federated sparse-GP regression on simulated clients",
        description=(
            "M simulated clients hold private noisy samples of a test function from "
            "different regions of the domain. Compares each client's own GP, the "
            "federated dPITC model and an exact GP on the pooled data."
        ),
    )
    p.add_argument("--function", default=defaults.function, help="test function name")
    p.add_argument("--dim", type=int, default=defaults.dim, help="input dimension")
    p.add_argument("--clients", type=int, default=defaults.num_clients, help="number of clients")
    p.add_argument(
        "--points",
        type=int,
        default=defaults.points_per_client,
        help="mean points per client",
    )
    p.add_argument("--support", type=int, default=defaults.support_size, help="support size |S|")
    p.add_argument(
        "--noise",
        type=float,
        default=defaults.noise_std,
        help="noise std (fraction of f's std)",
    )
    p.add_argument("--fit", choices=FIT_STRATEGIES, default=defaults.fit, help="hyperparameters")
    p.add_argument("--test-points", type=int, default=defaults.num_test, help="test-set size")
    p.add_argument("--seed", type=int, default=defaults.seed, help="random seed")
    p.add_argument("--out", help="write the results as JSON to this file")


def build_parser() -> argparse.ArgumentParser:
    r"""The argument parser of ``botorch-fed``.

    ``parser.run_parsers[algorithm]`` is ``(sub-parser, options)`` of ``run
    <algorithm>`` (``--config`` files are checked against the options and become the
    sub-parser's defaults).
    """
    parser = argparse.ArgumentParser(
        prog="botorch-fed",
        description="Federated and privacy-preserving Bayesian optimisation for BoTorch.",
    )
    parser.add_argument("--version", action="version", version=f"botorch-fed {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    parser.run_parsers = _run_parser(sub)
    sub.add_parser("list", help="list the registered algorithms")
    _demo_parser(sub)
    return parser


# --------------------------------------------------------------------------- config file


def _describe_kind(option: _Option) -> str:
    if option.choices is not None:
        text = f"one of {list(option.choices)}"
    else:
        text = {
            int: "an integer",
            float: "a number",
            str: "a string",
            bool: "true or false",
        }[option.kind]
    return text + (' or "none"' if option.nullable else "")


def _check_value(option: _Option, value: Any, label: str) -> Any:
    r"""A config-file value checked against ``option`` (TOML types, no conversions
    from strings except ``"none"``)."""
    if option.nullable and isinstance(value, str) and value.strip().lower() == "none":
        return None
    kind = option.kind
    ok = (
        (kind is bool and isinstance(value, bool))
        or (kind is int and isinstance(value, int) and not isinstance(value, bool))
        or (kind is float and isinstance(value, int | float) and not isinstance(value, bool))
        or (kind is str and isinstance(value, str))
    )
    if ok and option.choices is not None and value not in option.choices:
        ok = False
    if not ok:
        raise ConfigError(f"{label} must be {_describe_kind(option)}, got {value!r}.")
    return float(value) if kind is float else value


def _check_settings_table(
    table: Any, algorithm: str, key: str, path: str, out: dict, extra: dict
) -> None:
    r"""Check a ``[settings]`` table against ``algorithm``'s settings fields."""
    from botorch_fed.federation import get_algorithm

    spec = get_algorithm(algorithm)
    if not isinstance(table, dict):
        raise ConfigError(f"`{key}` in {path} must be a table ([{key}]), got {table!r}.")
    by_field = {o.field: o for o in setting_options(spec.settings_class)}
    names = [f.name for f in dataclasses.fields(spec.settings_class) if f.init]
    for name, value in table.items():
        label = f"`{key}.{name}` in {path}"
        if isinstance(value, dict) and key == "settings":
            from botorch_fed.federation import available_algorithms

            raise ConfigError(
                f"[settings.{name}] in {path}: no algorithm is called {name!r} (tables under "
                f"[settings] are per algorithm: {', '.join(available_algorithms())})."
            )
        if name not in names:
            close = difflib.get_close_matches(name, names, n=3)
            hint = f" Did you mean {', '.join(f'`{c}`' for c in close)}?" if close else ""
            raise ConfigError(
                f"{label}: {algorithm} has no setting `{name}` ({spec.settings_class.__name__} "
                f"fields: {', '.join(names)}).{hint}"
            )
        if name in by_field:
            out[f"settings.{name}"] = _FromConfig(_check_value(by_field[name], value, label), label)
        else:
            extra[name] = value


def load_config(path: str, algorithm: str, options: list[_Option]) -> tuple[dict, _Config]:
    r"""Read a ``--config`` TOML file for ``run <algorithm>``.

    Args:
        path: The file.
        algorithm: The algorithm being run.
        options: Its command-line options.

    Returns:
        ``(defaults, config)``: parser defaults by ``dest`` (wrapped so that the
        values' origin is known after parsing) and what is not a parser default
        (objective tables, settings without a flag).

    Raises:
        ConfigError: Naming the file and the key.
    """
    from botorch_fed.federation import available_algorithms

    try:
        with open(path, "rb") as fh:
            data = tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigError(f"--config {path}: no such file.") from None
    except IsADirectoryError:
        raise ConfigError(f"--config {path} is a folder; give a TOML file.") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"--config {path} is not valid TOML: {exc}.") from None
    except OSError as exc:
        raise ConfigError(f"--config {path}: cannot read it ({exc}).") from None
    config = _Config(path=path, has=set(data))
    defaults: dict[str, _FromConfig] = {}
    by_key = {o.key: o for o in options if o.key is not None and o.field is None}
    special = {"objective", "objectives", "bounds", "minimize", "maximize", "settings"}
    setting_fields = {o.field for o in options if o.field is not None}
    for key, value in data.items():
        label = config.label(key)
        if key in special:
            continue
        if key == "aggregator" and key not in by_key:
            continue  # shared files: algorithms without secure aggregation skip it
        if key not in by_key:
            if key in setting_fields:
                hint = f" Algorithm settings go under [settings]: `settings.{key}`."
            else:
                close = difflib.get_close_matches(key, sorted(by_key) + sorted(special), n=3)
                hint = f" Did you mean {', '.join(f'`{c}`' for c in close)}?" if close else ""
                if key in ("config", "resume"):
                    hint = f" --{key} is a command-line option only."
            raise ConfigError(f"{path}: unknown key `{key}`.{hint}")
        defaults[by_key[key].dest] = _FromConfig(_check_value(by_key[key], value, label), label)
    if "minimize" in data and "maximize" in data:
        raise ConfigError(f"{path}: give `minimize` or `maximize`, not both.")
    for key in ("minimize", "maximize"):
        if key in data:
            if not isinstance(data[key], bool):
                raise ConfigError(f"{config.label(key)} must be true or false, got {data[key]!r}.")
            maximize = data[key] if key == "maximize" else not data[key]
            defaults["maximize"] = _FromConfig(maximize, config.label(key))
    if "bounds" in data:
        bounds = data["bounds"]
        if not isinstance(bounds, str | list):
            raise ConfigError(
                f"{config.label('bounds')} must be a list of [lower, upper] pairs or a string "
                f'like "0,1;-5,5", got {bounds!r}.'
            )
        defaults["bounds"] = _FromConfig(bounds, config.label("bounds"))
    if "objective" in data:
        objective = data["objective"]
        if isinstance(objective, str):
            defaults["objective"] = _FromConfig(objective, config.label("objective"))
        elif isinstance(objective, dict):
            config.objective_table = _check_objective_table(objective, "objective", path)
        else:
            raise ConfigError(
                f'{config.label("objective")} must be "module:function" or a table with '
                f"`function` (and `kwargs`), got {objective!r}."
            )
    if "objectives" in data:
        tables = data["objectives"]
        if (
            not isinstance(tables, list)
            or not tables
            or not all(isinstance(t, dict) for t in tables)
        ):
            raise ConfigError(
                f"{config.label('objectives')} must be one or more [[objectives]] tables (one "
                f"per client), got {tables!r}."
            )
        config.objectives = [
            _check_objective_table(t, f"objectives[{i}]", path) for i, t in enumerate(tables)
        ]
    sources = [k for k in ("problem", "objective", "objectives") if k in data]
    if len(sources) > 1:
        raise ConfigError(
            f"{path}: give one black box: `problem`, `objective` or [[objectives]], not "
            f"{' and '.join(f'`{s}`' for s in sources)}."
        )
    if "settings" in data:
        settings = data["settings"]
        if not isinstance(settings, dict):
            raise ConfigError(f"{config.label('settings')} must be a table ([settings]).")
        plain = {k: v for k, v in settings.items() if k not in available_algorithms()}
        _check_settings_table(plain, algorithm, "settings", path, defaults, config.settings_extra)
        for name in available_algorithms():  # [settings.<algorithm>]: checked for every one
            if name in settings:
                own: dict = {}
                extra: dict = {}
                _check_settings_table(settings[name], name, f"settings.{name}", path, own, extra)
                if name == algorithm:
                    defaults.update(own)
                    config.settings_extra.update(extra)
    return defaults, config


def _check_objective_table(table: dict, key: str, path: str) -> dict:
    allowed = {"function", "kwargs", "name"}
    for name in table:
        if name not in allowed:
            raise ConfigError(
                f"`{key}.{name}` in {path}: unknown key (an objective table takes "
                "`function`, `kwargs` and `name`)."
            )
    if not isinstance(table.get("function"), str):
        raise ConfigError(
            f'`{key}.function` in {path} must be "module:function", got '
            f"{table.get('function', 'nothing')!r}."
        )
    if not isinstance(table.get("kwargs", {}), dict):
        raise ConfigError(f"`{key}.kwargs` in {path} must be a table, got {table['kwargs']!r}.")
    if "name" in table and (not isinstance(table["name"], str) or not table["name"]):
        raise ConfigError(f"`{key}.name` in {path} must be a non-empty string.")
    return table


# --------------------------------------------------------------------------- black boxes


@contextlib.contextmanager
def _import_path(folders: Sequence[str]) -> Iterator[None]:
    r"""``folders`` in front of ``sys.path`` (as ``python -m`` puts the current
    directory there), restored afterwards."""
    saved = list(sys.path)
    sys.path[:0] = list(dict.fromkeys(folders))
    importlib.invalidate_caches()
    try:
        yield
    finally:
        sys.path[:] = saved


def import_callable(spec: str, where: str):
    r"""The callable named by ``"package.module:function"`` (``function`` may be a dotted
    attribute path); ``ValueError`` naming ``where`` (a flag or a config key)."""
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
            raise ValueError(
                f"{where} {spec!r}: cannot import module {module_name!r} ({exc}); modules are "
                f"found in the current directory ({os.getcwd()}) and on the Python path."
            ) from None
        raise ValueError(
            f"{where} {spec!r}: importing module {module_name!r} failed: "
            f"{type(exc).__name__}: {exc}."
        ) from exc
    except Exception as exc:  # noqa: BLE001 - the user's module may raise anything
        raise ValueError(
            f"{where} {spec!r}: importing module {module_name!r} failed: "
            f"{type(exc).__name__}: {exc}."
        ) from exc
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            names = [n for n in dir(obj) if not n.startswith("_")]
            close = difflib.get_close_matches(part, names, n=3)
            hint = f" Did you mean {', '.join(close)}?" if close else ""
            raise ValueError(f"{where} {spec!r}: {module_name!r} has no attribute {attr!r}.{hint}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise ValueError(
            f"{where} {spec!r}: {module_name}.{attr} is a {type(obj).__name__}, not a function."
        )
    return obj


def parse_bounds(value: Any, where: str) -> torch.Tensor:
    r"""``--bounds`` (``"0,1;0,1;-5,5"``) or a config file's ``bounds`` (that string or
    ``[[0, 1], [0, 1], [-5, 5]]``: one ``[lower, upper]`` pair per dimension) as a
    ``2 x d`` float64 tensor; ``ValueError`` naming ``where``."""
    from botorch_fed.federation.objectives import check_bounds

    example = '"0,1;0,1;-5,5" (lower,upper per dimension, separated by ";")'
    if isinstance(value, str):
        pieces = [p.strip() for p in value.strip().rstrip(";").split(";")]
        if not value.strip() or any(not p for p in pieces):
            raise ValueError(f"{where} {value!r}: expected {example}.")
        pairs = []
        for i, piece in enumerate(pieces):
            numbers = [s.strip() for s in piece.split(",")]
            try:
                pair = [float(s) for s in numbers]
            except ValueError:
                pair = []
            if len(pair) != 2:
                raise ValueError(
                    f"{where} {value!r}: dimension {i} is {piece!r}, not two numbers "
                    f"'lower,upper'; expected {example}."
                ) from None
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
class _BlackBox:
    r"""Where the clients' objectives come from."""

    problem: str | None = None
    specs: list[tuple[str, dict, str | None, str]] | None = None  # function, kwargs, name, where
    shared: bool = False
    label: str = ""


def _resolve_black_box(args: argparse.Namespace, sources: dict, config: _Config | None):
    r"""``--problem``, ``--objective`` or the config file's black box (the command line
    wins over the file)."""
    cli = [k for k in ("problem", "objective") if getattr(args, k) is not None and k not in sources]
    if len(cli) > 1:
        raise ValueError(
            "`--objective` and `--problem` are exclusive: give your own black box or a "
            "built-in test function, not both."
        )
    if cli == ["problem"] or (not cli and "problem" in sources):
        return _BlackBox(problem=args.problem)
    if cli == ["objective"] or (not cli and "objective" in sources):
        where = sources.get("objective", "`--objective`")
        return _BlackBox(
            specs=[(args.objective, {}, None, where)], shared=True, label=args.objective
        )
    if config is not None and config.objective_table is not None:
        t = config.objective_table
        where = f"`objective.function` in {config.path}"
        return _BlackBox(
            specs=[(t["function"], t.get("kwargs", {}), t.get("name"), where)],
            shared=True,
            label=t.get("name") or t["function"],
        )
    if config is not None and config.objectives is not None:
        specs = [
            (
                t["function"],
                t.get("kwargs", {}),
                t.get("name"),
                f"`objectives[{i}].function` in {config.path}",
            )
            for i, t in enumerate(config.objectives)
        ]
        return _BlackBox(specs=specs, label=f"{len(specs)} client objectives ({config.path})")
    return _BlackBox(problem=DEFAULT_PROBLEM)


def _display(option: _Option, sources: dict) -> str:
    return sources.get(option.dest, option.display)


def _make_objectives(box: _BlackBox, args, sources: dict, by_dest: dict) -> list:
    r"""The user's callables wrapped in :class:`CallableObjective` (one per spec)."""
    from botorch_fed.federation.objectives import CallableObjective

    if args.bounds is None:
        raise ValueError(
            f'{box.specs[0][3]} needs the domain: `--bounds` (e.g. "0,1;-5,5") or `bounds` in '
            "the config file."
        )
    bounds = parse_bounds(args.bounds, _display(by_dest["bounds"], sources))
    objectives = []
    for function, kwargs, name, where in box.specs:
        fn = import_callable(function, where)
        try:
            signature = inspect.signature(fn)
        except (TypeError, ValueError):  # some builtins have none
            signature = None
        if signature is not None:
            try:
                signature.bind(None, **kwargs)
            except TypeError as exc:
                where = where.replace(".function`", ".kwargs`") if kwargs else where
                call = f"({', '.join(['X', *(f'{k}=...' for k in kwargs)])})"
                raise ValueError(
                    f"{where}: {function} cannot be called as {function}{call}: {exc}."
                ) from None
        if kwargs:
            fn = functools.partial(fn, **kwargs)
            args_text = ", ".join(f"{k}={v!r}" for k, v in kwargs.items())
            name = name or f"{function}({args_text})"
        objectives.append(
            CallableObjective(fn, bounds, minimize=not args.maximize, name=name or function)
        )
    return objectives


# --------------------------------------------------------------------------- errors


def _rename(message: str, names: dict[str, str]) -> tuple[str, bool]:
    r"""Replace backquoted Python names (```support_size```) by their flags."""
    found = False

    def sub(m: re.Match) -> str:
        nonlocal found
        if m.group(1) in names:
            found = True
            return names[m.group(1)]
        return m.group(0)

    return re.sub(r"`([A-Za-z_]\w*)`", sub, message), found


SETUP_DESTS = {
    "problem": "problem",
    "dim": "dim",
    "num_clients": "clients",
    "seed": "seed",
    "aggregator": "aggregator",
    "noise_std": "noise_std",
    "init_regions": "init_regions",
    "region_width": "region_width",
    "shift": "shift",
    "evaluation_errors": "fail_on_error",
}


def _build_settings(spec, args, options: list[_Option], sources: dict, config: _Config | None):
    r"""The algorithm's settings from the flags; errors name the flag or the key."""
    cls = spec.settings_class
    values = {o.field: getattr(args, o.dest) for o in options if o.field is not None}
    if config is not None:
        values.update(config.settings_extra)
    displays = {o.field: _display(o, sources) for o in options if o.field is not None}
    for name in config.settings_extra if config is not None else ():
        displays[name] = f"`settings.{name}` in {config.path}"
    try:
        settings = cls(**values)
        settings.validate()
    except (ValueError, TypeError) as exc:
        message, found = _rename(str(exc), displays)
        if not found:  # a message in another object's words: find the setting
            defaults = cls()
            culprits = [
                f"{displays[k]} {v!r}"
                for k, v in values.items()
                if v != getattr(defaults, k) and not _probe(cls, **{k: v})
            ]
            if culprits:
                message = f"{', '.join(culprits)}: {message}"
        raise ValueError(message) from None
    return settings


def _build_setup(spec, args, options: list[_Option], sources: dict, config: _Config | None):
    r"""The :class:`FederationSetup` from the flags and the config file; returns
    ``(setup, label)``."""
    from botorch_fed.federation.setup import FederationSetup

    by_dest = {o.dest: o for o in options}
    names = {py: _display(by_dest[d], sources) for py, d in SETUP_DESTS.items() if d in by_dest}
    box = _resolve_black_box(args, sources, config)
    common = dict(
        dim=args.dim,
        seed=args.seed,
        init_regions=args.init_regions,
        region_width=args.region_width,
        evaluation_errors="raise" if args.fail_on_error else "record",
    )
    if spec.secure_aggregation:
        common["aggregator"] = args.aggregator
    if box.problem is not None:
        # the domain and the convention of your own objective: refused with a problem
        # (a file's objective options are dropped when --problem overrides the file)
        file_problem = config is not None and "problem" in config.has
        for dest in ("bounds", "maximize"):
            if getattr(args, dest) in (None, False) or (dest in sources and not file_problem):
                continue
            raise ValueError(
                f"{_display(by_dest[dest], sources)} applies to your own objective "
                f"(`--objective`); the built-in problem {box.problem!r} has its own domain and "
                "is minimised."
            )
        setup = FederationSetup(
            problem=box.problem,
            num_clients=args.clients,
            noise_std=args.noise_std,
            shift=args.shift,
            **common,
        )
        label = None
    else:
        objectives = _make_objectives(box, args, sources, by_dest)
        if args.dim is not None and args.dim != objectives[0].dim:
            raise ValueError(
                f"{names['dim']}={args.dim} but the objectives have d={objectives[0].dim} "
                f"(from {_display(by_dest['bounds'], sources)})."
            )
        if box.shared:
            clients = DEFAULT_CLIENTS if args.clients is None else args.clients
            setup_objectives = objectives[0]
        else:
            clients = args.clients
            if clients is not None and clients != len(objectives):
                raise ValueError(
                    f"{_display(by_dest['clients'], sources)} {clients} but {config.path} has "
                    f"{len(objectives)} [[objectives]] tables (one per client)."
                )
            setup_objectives = objectives
        setup = FederationSetup(
            objectives=setup_objectives,
            num_clients=clients,
            noise_std=args.noise_std,
            shift=args.shift,
            **common,
        )
        label = box.label
    try:
        setup.validate(spec.name)
    except ValueError as exc:
        raise ValueError(_rename(str(exc), names)[0]) from None
    if box.problem is not None:
        try:
            setup.make_objectives()  # an unknown name or a wrong --dim, before the run
        except ValueError as exc:
            message, found = _rename(str(exc), names)
            if not found:
                where = _display(by_dest["problem"], sources) + f" {box.problem}"
                if args.dim is not None:
                    where += f", {_display(by_dest['dim'], sources)} {args.dim}"
                message = f"{where}: {message}"
            raise ValueError(message) from None
    return setup, label


# --------------------------------------------------------------------------- run


def _check_outputs(args: argparse.Namespace) -> None:
    r"""Refuse unwritable ``--out`` / ``--plot`` / ``--checkpoint`` paths and a missing
    ``--resume`` folder before a run, not after it."""
    for flag in ("out", "plot"):
        path = getattr(args, flag, None)
        if not path:
            continue
        folder = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(folder):
            raise ValueError(f"--{flag} {path}: the folder {folder} does not exist.")
        if not os.access(folder, os.W_OK):
            raise ValueError(f"--{flag} {path}: the folder {folder} is not writable.")
        if os.path.isdir(path):
            raise ValueError(f"--{flag} {path} is a folder; give a file name.")
    if getattr(args, "plot", None) and importlib.util.find_spec("matplotlib") is None:
        raise ImportError(
            "--plot needs matplotlib, which is not installed: pip install 'botorch-fed[plot]'."
        )
    checkpoint = getattr(args, "checkpoint", None)
    if checkpoint:
        parent = os.path.dirname(os.path.abspath(checkpoint))
        if os.path.exists(checkpoint) and not os.path.isdir(checkpoint):
            raise ValueError(f"--checkpoint {checkpoint} is a file; give a folder.")
        if not os.path.isdir(parent):
            raise ValueError(f"--checkpoint {checkpoint}: the folder {parent} does not exist.")
    resume = getattr(args, "resume", None)
    if resume and not os.path.isdir(resume):
        raise ValueError(f"--resume {resume}: no such checkpoint folder.")


def _checkpoint_arguments(args: argparse.Namespace, run_federated) -> dict:
    r"""``checkpoint=`` / ``resume=`` for :func:`run_federated` (only those given)."""
    wanted = {k: getattr(args, k) for k in ("checkpoint", "resume") if getattr(args, k)}
    if wanted:
        accepted = inspect.signature(run_federated).parameters
        missing = [k for k in wanted if k not in accepted]
        if missing:
            raise ValueError(
                f"{', '.join('--' + k for k in missing)}: this botorch-fed's run_federated "
                "does not support checkpoints yet."
            )
    return wanted


def _run_run(
    args: argparse.Namespace,
    console: Console,
    options: list[_Option],
    sources: dict,
    config: _Config | None,
) -> int:
    from botorch_fed.federation import get_algorithm
    from botorch_fed.federation.runner import run_federated

    spec = get_algorithm(args.algorithm)
    folders = [os.getcwd()]
    if config is not None:
        folders.append(os.path.dirname(os.path.abspath(config.path)))
    settings = _build_settings(spec, args, options, sources, config)
    if args.threads < 1:
        raise ValueError(f"`--threads` must be >= 1, got {args.threads}.")
    run_kwargs = _checkpoint_arguments(args, run_federated)
    with _import_path(folders):
        setup, label = _build_setup(spec, args, options, sources, config)
        torch.set_num_threads(args.threads)
        with Progress(
            SpinnerColumn(),
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("best {task.fields[best]}"),
            TimeElapsedColumn(),
            console=console,
        ) as progress:
            what = label or setup.problem
            task = progress.add_task(
                f"{args.algorithm} on {what}", total=settings.num_rounds, best="-"
            )
            first: list[int] = []

            def on_round(t: int, best: float | None) -> None:
                if not first:  # a resumed run: the bar starts where the first round lands
                    first.append(t)
                    if t > 1:
                        progress.update(
                            task,
                            description=f"{args.algorithm} on {what} (resumed at round {t})",
                        )
                progress.update(task, completed=t, best="-" if best is None else f"{best:.6g}")

            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # BoTorch's numerical advice on tiny data sets
                result = run_federated(
                    args.algorithm, setup, settings, on_round=on_round, **run_kwargs
                )
            if not first and args.resume:  # a finished run resumed: nothing was left to run
                progress.update(task, description=f"{args.algorithm} on {what} (already complete)")
            best = result.best_value
            progress.update(
                task,
                completed=len(result.best_per_round) - 1,
                best="-" if best is None else f"{best:.6g}",
            )
    _print_run(result, console, label)
    data = result.to_dict()
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(data, fh, indent=2)
        console.print(f"results written to {args.out}", soft_wrap=True)
    if args.plot:
        _plot(data, args.plot, console)
    return 0


def _plot(data: dict, path: str, console: Console) -> None:
    r"""The convergence curve, when there is one (None entries drawn as gaps)."""
    from botorch_fed.plotting import plot_convergence

    def gaps(values):
        return None if values is None else [math.nan if v is None else v for v in values]

    regret = data.get("regret_per_round")
    if not any(v is not None for v in data["best_per_round"]):
        console.print(f"no plot written to {path}: every evaluation failed", soft_wrap=True)
        return
    curve = dict(data, best_per_round=gaps(data["best_per_round"]), regret_per_round=gaps(regret))
    ylabel = None
    if not curve["regret_per_round"]:
        curve["regret_per_round"] = None
        ylabel = "best value (%s is better)" % ("lower" if data.get("minimize", True) else "higher")
    plot_convergence([curve], path, ylabel=ylabel)
    console.print(
        f"{'regret' if curve['regret_per_round'] else 'convergence'} curve written to {path}",
        soft_wrap=True,
    )


def _number(value: float | None, empty: str = "none") -> str:
    return empty if value is None else f"{value:.6g}"


def _point(x: Sequence[float] | None) -> str:
    return "-" if x is None else "[" + ", ".join(f"{v:.4g}" for v in x) + "]"


def _print_run(result, console: Console, label: str | None = None) -> None:
    r"""The result tables: federation, stages, clients, failed evaluations."""
    rounds = len(result.best_per_round) - 1
    goal = "minimised" if result.minimize else "maximised"
    console.print(
        f"[bold]{escape(result.algorithm)} on {escape(label or result.problem)} "
        f"({result.dim}-D, {goal}), {len(result.best_per_client)} clients, {rounds} rounds[/]",
        soft_wrap=True,
    )
    head = Table()
    head.add_column("quantity")
    head.add_column("value", justify="right")
    head.add_row(
        "best value (federation)",
        _number(result.best_value, "none (every evaluation failed)"),
    )
    if result.best_point is not None:
        head.add_row("best point", _point(result.best_point))
    if result.optimal_value is not None:
        head.add_row("optimal value", f"{result.optimal_value:.6g}")
        if result.best_value is not None:
            head.add_row("simple regret", f"{abs(result.best_value - result.optimal_value):.6g}")
    head.add_row("steps", ", ".join(f"{k} {v}" for k, v in sorted(result.steps.items())))
    head.add_row("failed evaluations", str(len(result.failures)))
    head.add_row("wall time (s)", f"{result.time_s:.2f}")
    ledger = result.ledger
    head.add_row(
        "bytes to / from clients",
        f"{ledger['total_bytes_down']:,} / {ledger['total_bytes_up']:,}",
    )
    console.print(head)
    stages = Table(title="time per stage (s, summed over parties)")
    for name in ("stage", "seconds"):
        stages.add_column(name, justify="right" if name == "seconds" else "left")
    for stage, seconds in sorted(ledger["stage_s"].items(), key=lambda kv: -kv[1]):
        stages.add_row(stage, f"{seconds:.3f}")
    console.print(stages)
    objectives = result.config.get("setup", {}).get("objectives")
    per_client_names = objectives if objectives and len(objectives) > 1 else None
    clients = Table(title="best value per client")
    clients.add_column("client", justify="right")
    if per_client_names:
        clients.add_column("objective")
    clients.add_column("best value", justify="right")
    for cid, best in result.best_per_client.items():
        row = [str(cid)]
        if per_client_names:
            row.append(per_client_names[int(cid)]["name"])
        clients.add_row(*row, _number(best, "none (all failed)"))
    console.print(clients)
    if result.failures:
        shown = result.failures[:MAX_FAILURES_SHOWN]
        failed = Table(
            title=f"failed evaluations (first {len(shown)} of {len(result.failures)}; all in --out)"
        )
        for name in ("client", "round", "step", "point", "error"):
            failed.add_column(name, justify="right" if name in ("client", "round") else "left")
        for f in shown:
            failed.add_row(
                str(f["client"]),
                str(f["round"]),
                str(f["step"]),
                _point(f["x"]),
                str(f["error"]),
            )
        console.print(failed)


# --------------------------------------------------------------------------- demo, list


def _run_demo(args: argparse.Namespace, console: Console) -> int:
    from botorch_fed.regression_demo import RegressionDemoConfig, run_regression_demo

    config = RegressionDemoConfig(
        function=args.function,
        dim=args.dim,
        num_clients=args.clients,
        points_per_client=args.points,
        support_size=args.support,
        noise_std=args.noise,
        fit=args.fit,
        num_test=args.test_points,
        seed=args.seed,
    )
    config.validate()
    with Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        TimeElapsedColumn(),
        console=console,
    ) as progress:
        task = progress.add_task("starting", total=None)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # BoTorch's input-scaling advice on tiny clients
            results = run_regression_demo(
                config, on_stage=lambda s: progress.update(task, description=s)
            )
        progress.update(task, description="done")
    cfg = results["config"]
    table = Table(
        title=(
            f"Federated GP regression: {cfg['function']} ({cfg['dim']}-D), "
            f"{cfg['num_clients']} clients, seed {cfg['seed']}"
        )
    )
    for col in ("model", "n", "test RMSE", "test NLL", "fit (s)", "predict (s)"):
        table.add_column(col, justify="left" if col == "model" else "right")
    for r in results["rows"]:
        table.add_row(
            r["method"],
            str(r["num_data"]),
            f"{r['rmse']:.4f}",
            f"{r['nll']:.3f}",
            f"{r['fit_s']:.2f}",
            f"{r['predict_s']:.3f}",
        )
    console.print(table)
    fed = next(r for r in results["rows"] if r["method"].startswith("federated"))
    console.print(
        f"federated: {fed['extra']['aggregation_rounds']} aggregation rounds; the server saw "
        "only summed outcome moments, client centres and summed summaries/gradients."
    )
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(results, fh, indent=2)
        console.print(f"results written to {args.out}")
    return 0


def _run_list(console: Console) -> int:
    from botorch_fed.federation import available_algorithms, get_algorithm

    names = available_algorithms()
    width = max(len(n) for n in (*names, "algorithm"))
    secure = {
        n: "yes (--aggregator)" if get_algorithm(n).secure_aggregation else "no" for n in names
    }
    swidth = max(len(s) for s in (*secure.values(), "secure aggregation"))

    def line(text: str) -> None:
        console.print(text, markup=False, highlight=False, soft_wrap=True)

    line(f"{'algorithm':<{width}}  {'secure aggregation':<{swidth}}  summary")
    for name in names:
        line(f"{name:<{width}}  {secure[name]:<{swidth}}  {get_algorithm(name).summary}")
    line("`botorch-fed run <algorithm> --help` lists an algorithm's options.")
    return 0


# --------------------------------------------------------------------------- main


def _parse(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace | int:
    r"""``parser.parse_args(argv)``, or the exit code argparse asked for (``--help``,
    ``--version``: 0; invalid arguments: 2, with its message on stderr)."""
    try:
        return parser.parse_args(argv)
    except SystemExit as exc:
        code = exc.code
        return code if isinstance(code, int) else (0 if code is None else 2)


def _parse_with_config(
    parser: argparse.ArgumentParser, argv: list[str], args: argparse.Namespace
) -> tuple[argparse.Namespace | int, dict, _Config | None]:
    r"""Parse again with the ``--config`` file's values as defaults; returns
    ``(args, sources, config)`` where ``sources`` maps each ``dest`` whose value came
    from the file to its key."""
    algorithm_parser, options = parser.run_parsers[args.algorithm]
    defaults, config = load_config(args.config, args.algorithm, options)
    algorithm_parser.set_defaults(**defaults)
    args = _parse(parser, argv)
    sources: dict[str, str] = {}
    if isinstance(args, argparse.Namespace):
        for dest, value in vars(args).items():
            if isinstance(value, _FromConfig):
                setattr(args, dest, value.value)
                sources[dest] = value.label
    return args, sources, config


def main(argv: Sequence[str] | None = None) -> int:
    r"""Entry point of the ``botorch-fed`` console script.

    Args:
        argv: Arguments (default: ``sys.argv[1:]``).

    Returns:
        The exit code: 0 success, 1 a run stopped by its black box, 2 invalid
        arguments (argparse's own errors included).
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = _parse(parser, argv)
    if not isinstance(args, argparse.Namespace):
        return args
    console = Console()
    from botorch_fed.federation.objectives import (
        EvaluationError,
        ObjectiveContractError,
    )

    try:
        if args.command == "list":
            return _run_list(console)
        if args.command == "demo":
            _check_outputs(args)
            return _run_demo(args, console)
        if args.command == "run":
            sources: dict[str, str] = {}
            config = None
            if args.config:
                args, sources, config = _parse_with_config(parser, argv, args)
                if not isinstance(args, argparse.Namespace):
                    return args
            _check_outputs(args)
            options = parser.run_parsers[args.algorithm][1]
            return _run_run(args, console, options, sources, config)
    except (ValueError, ImportError) as e:
        # escape: messages hold brackets (``botorch-fed[secure]``) that are not markup
        console.print(f"[bold red]error:[/] {escape(str(e))}", soft_wrap=True)
        return 2
    except (EvaluationError, ObjectiveContractError) as e:
        console.print(f"[bold red]the run stopped:[/] {escape(str(e))}", soft_wrap=True)
        return 1
    parser.error(f"unknown command {args.command!r}")
    return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
