r"""The ``--config`` TOML file of ``botorch-fed run``: the run's options by long name with
underscores, its black box and ``[settings]`` / ``[settings.<algorithm>]``, checked and
turned into the parser's defaults (flags override them); errors name the key and the file.

A Flower run carries the file's text, not its path (:mod:`botorch_fed.flower.run_options`):
every party and the server read it with :func:`load_config_text`, the reader of the
command line's file, so it means the same there."""

from __future__ import annotations

import dataclasses
import difflib
import os
import tomllib
from dataclasses import dataclass, field
from typing import Any

from botorch_fed.runs.options import Option, setting_options

# top-level keys that are not parser defaults of the same name
_BLACK_BOX_KEYS = {"objectives", "minimize", "maximize", "settings"}
# options whose value may also be a table or a list: (its type, what the key takes)
_STRUCTURED = {
    "objective": (dict, '"module:function" or a table with `function` (and `kwargs`)'),
    "bounds": (list, 'a list of [lower, upper] pairs or a string like "0,1;-5,5"'),
}
_CLI_ONLY = ("config", "resume")
# deepest nesting of lists and tables a config may have (its schema needs 4)
MAX_CONFIG_DEPTH = 16
_KINDS = {int: "an integer", float: "a number", str: "a string", bool: "true or false"}


@dataclass(frozen=True)
class FromConfig:
    r"""A parser default that came from the config file (unwrapped after parsing)."""

    value: Any
    label: str


@dataclass
class Config:
    r"""What a ``--config`` file holds besides parser defaults.

    ``path`` names the file in messages (``"`key` in <path>"``); ``file`` is the file it
    was read from, whose folder the user's modules are imported from too (``None``: a
    text without a file, a Flower run's)."""

    path: str
    objectives: list[dict] | None = None  # [[objectives]], or the `objective` table
    shared: bool = False  # one `objective = { function = ..., kwargs = ... }` for all clients
    settings_extra: dict[str, Any] = field(default_factory=dict)  # fields without a flag
    has: set[str] = field(default_factory=set)  # top-level keys present
    file: str | None = None

    def label(self, key: str) -> str:
        return f"`{key}` in {self.path}"

    @property
    def folder(self) -> str | None:
        r"""The folder of :attr:`file` (``None`` without a file)."""
        return None if self.file is None else os.path.dirname(os.path.abspath(self.file))


def check_value(option: Option, value: Any, label: str) -> Any:
    r"""A config-file value checked against ``option`` (TOML types; ``"none"`` for None)."""
    if option.nullable and isinstance(value, str) and value.strip().lower() == "none":
        return None
    kind = option.kind
    ok = isinstance(value, (int, float) if kind is float else kind)
    ok = ok and (kind is bool or not isinstance(value, bool))
    ok = ok and (option.choices is None or value in option.choices)
    if not ok:
        what = _KINDS[kind] if option.choices is None else f"one of {list(option.choices)}"
        what += ' or "none"' if option.nullable else ""
        raise ValueError(f"{label} must be {what}, got {value!r}.")
    return float(value) if kind is float else value


def _depth(value: object) -> int:
    r"""How deeply the lists and tables inside ``value`` (a parsed document) nest: a key
    holding a list of scalars is 1; computed without recursing."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            deepest = max(deepest, depth)
            children = item.values() if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in children)
    return deepest


def _did_you_mean(name: str, names) -> str:
    close = difflib.get_close_matches(name, list(dict.fromkeys(names)), n=3)
    return f" Did you mean {', '.join(f'`{c}`' for c in close)}?" if close else ""


def _check_settings_table(table: Any, algorithm: str, key: str, path: str) -> tuple[dict, dict]:
    r"""``(parser defaults, values without a flag)`` of a ``[settings]`` table, checked."""
    from botorch_fed.algorithms import available_algorithms, get_algorithm

    cls = get_algorithm(algorithm).settings_class
    if not isinstance(table, dict):
        raise ValueError(f"`{key}` in {path} must be a table ([{key}]), got {table!r}.")
    by_field = {o.field: o for o in setting_options(cls)}
    names = [f.name for f in dataclasses.fields(cls) if f.init]
    out: dict = {}
    extra: dict = {}
    for name, value in table.items():
        label = f"`{key}.{name}` in {path}"
        if isinstance(value, dict) and key == "settings":
            raise ValueError(
                f"[settings.{name}] in {path}: no algorithm is called {name!r} (tables under "
                f"[settings] are per algorithm: {', '.join(available_algorithms())})."
            )
        if name not in names:
            raise ValueError(
                f"{label}: {algorithm} has no setting `{name}` ({cls.__name__} "
                f"fields: {', '.join(names)}).{_did_you_mean(name, names)}"
            )
        if name in by_field:
            out[f"settings.{name}"] = FromConfig(check_value(by_field[name], value, label), label)
        else:
            extra[name] = value
    return out, extra


def _check_objective_table(table: dict, key: str, path: str) -> dict:
    r"""An ``objective`` table or one of the ``[[objectives]]``."""
    for name in table:
        if name not in ("function", "kwargs", "name"):
            raise ValueError(
                f"`{key}.{name}` in {path}: unknown key (an objective table takes "
                "`function`, `kwargs` and `name`)."
            )
    if not isinstance(table.get("function"), str):
        raise ValueError(
            f'`{key}.function` in {path} must be "module:function", got '
            f"{table.get('function', 'nothing')!r}."
        )
    if not isinstance(table.get("kwargs", {}), dict):
        raise ValueError(f"`{key}.kwargs` in {path} must be a table, got {table['kwargs']!r}.")
    if "name" in table and (not isinstance(table["name"], str) or not table["name"]):
        raise ValueError(f"`{key}.name` in {path} must be a non-empty string.")
    return table


def read_config(path: str, max_bytes: int | None = None) -> str:
    r"""The text of the ``--config`` file ``path`` (UTF-8, as TOML is).

    Args:
        path: The file, as the command line gives it.
        max_bytes: The largest file taken (``None``: any).

    Raises:
        ValueError: Naming ``--config`` and the file: missing, unreadable, larger
            than ``max_bytes`` or not UTF-8.
    """
    try:
        with open(path, "rb") as fh:
            data = fh.read() if max_bytes is None else fh.read(max_bytes + 1)
    except FileNotFoundError:
        raise ValueError(f"--config {path}: no such file.") from None
    except OSError as exc:
        raise ValueError(f"--config {path}: cannot read it ({exc}).") from None
    if max_bytes is not None and len(data) > max_bytes:
        raise ValueError(
            f"--config {path} is larger than the {max_bytes} bytes a run's config may have."
        )
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"--config {path} is not valid TOML: not UTF-8 ({exc}).") from None


def load_config(path: str, algorithm: str, options: list[Option]) -> tuple[dict, Config]:
    r"""The ``--config`` file ``path`` of ``run <algorithm>`` (``options``), checked
    (``ValueError`` naming the file and the key): ``(parser defaults by dest as
    :class:`FromConfig`, the rest of the file)``."""
    return load_config_text(read_config(path), algorithm, options, path, file=path)


def load_config_text(
    text: str, algorithm: str, options: list[Option], path: str, file: str | None = None
) -> tuple[dict, Config]:
    r""":func:`load_config` of a config file's ``text``.

    Args:
        text: The TOML text.
        algorithm: The run's algorithm.
        options: Its options (the run parser's).
        path: How messages name the text (``"`key` in <path>"``): the file's path, or
            e.g. ``"the run's config"``.
        file: The file the text was read from (its folder is an import folder of the
            run), or ``None``.

    Raises:
        ValueError: Naming ``path`` and the key.
    """
    from botorch_fed.algorithms import available_algorithms

    whole = f"--config {path}" if file is not None else path
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"{whole} is not valid TOML: {exc}.") from None
    except RecursionError:  # tomllib recurses on nested arrays and tables
        raise ValueError(f"{whole} is not valid TOML: nested too deeply.") from None
    except ValueError as exc:  # e.g. an integer of more digits than Python converts
        raise ValueError(f"{whole} is not valid TOML: {exc}.") from None
    if _depth(data) > MAX_CONFIG_DEPTH:  # whether tomllib recursed that far depends on
        # the interpreter's recursion limit, which other libraries may have raised
        raise ValueError(f"{whole} is not valid TOML: nested too deeply.")
    config = Config(path=path, has=set(data), file=file)
    defaults: dict[str, FromConfig] = {}
    by_key = {o.dest: o for o in options if o.field is None and o.dest not in _CLI_ONLY}
    setting_fields = {o.field for o in options if o.field is not None}
    for key, value in data.items():
        if key in _STRUCTURED and not isinstance(value, str):
            kind, what = _STRUCTURED[key]
            if not isinstance(value, kind):
                raise ValueError(f"{config.label(key)} must be {what}, got {value!r}.")
            continue  # below
        if key in _BLACK_BOX_KEYS or (key == "aggregator" and key not in by_key):
            continue  # `aggregator` in shared files: algorithms that do not aggregate skip it
        if key not in by_key:
            if key in setting_fields:
                hint = f" Algorithm settings go under [settings]: `settings.{key}`."
            elif key in _CLI_ONLY:
                hint = f" --{key} is a command-line option only."
            else:
                hint = _did_you_mean(key, sorted(by_key) + sorted(_BLACK_BOX_KEYS))
            raise ValueError(f"{path}: unknown key `{key}`.{hint}")
        label = config.label(key)
        defaults[by_key[key].dest] = FromConfig(check_value(by_key[key], value, label), label)
    given = {k: data[k] for k in ("minimize", "maximize") if k in data}
    if len(given) > 1:
        raise ValueError(f"{path}: give `minimize` or `maximize`, not both.")
    for key, value in given.items():
        if not isinstance(value, bool):
            raise ValueError(f"{config.label(key)} must be true or false, got {value!r}.")
        defaults["maximize"] = FromConfig(value == (key == "maximize"), config.label(key))
    if isinstance(data.get("bounds"), list):  # checked when used (parse_bounds)
        defaults["bounds"] = FromConfig(data["bounds"], config.label("bounds"))
    if isinstance(data.get("objective"), dict):
        config.objectives = [_check_objective_table(data["objective"], "objective", path)]
        config.shared = True
    tables = data.get("objectives")
    if "objectives" in data:
        if not tables or not isinstance(tables, list) or any(type(t) is not dict for t in tables):
            raise ValueError(
                f"{config.label('objectives')} must be one or more [[objectives]] tables (one "
                f"per client), got {tables!r}."
            )
        config.objectives = [
            _check_objective_table(t, f"objectives[{i}]", path) for i, t in enumerate(tables)
        ]
    sources = [k for k in ("problem", "objective", "objectives") if k in data]
    if len(sources) > 1:
        raise ValueError(
            f"{path}: give one black box: `problem`, `objective` or [[objectives]], not "
            f"{' and '.join(f'`{s}`' for s in sources)}."
        )
    settings = data.get("settings", {})
    if not isinstance(settings, dict):
        raise ValueError(f"{config.label('settings')} must be a table ([settings]).")
    plain = {k: v for k, v in settings.items() if k not in available_algorithms()}
    parts = [("settings", algorithm, plain)]  # then [settings.<algorithm>], checked for each
    parts += [(f"settings.{n}", n, settings[n]) for n in available_algorithms() if n in settings]
    for key, name, table in parts:
        own, extra = _check_settings_table(table, name, key, path)
        if name == algorithm:
            defaults.update(own)
            config.settings_extra.update(extra)
    return defaults, config


def config_sources(args) -> dict[str, str]:
    r"""Unwrap the values of ``args`` (parsed with :func:`load_config`'s defaults) that
    came from the config file; returns ``{dest: config key}`` of those values."""
    sources: dict[str, str] = {}
    for dest, value in vars(args).items():
        if isinstance(value, FromConfig):
            setattr(args, dest, value.value)
            sources[dest] = value.label
    return sources
