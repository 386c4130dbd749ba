r"""The ``--config`` TOML file of ``botorch-fed run``.

The file's top-level keys are the run's options by their long names with underscores
(``clients``, ``init_regions``, ...), its black box (``problem``, ``objective`` or
``[[objectives]]`` tables, ``bounds``, ``minimize``/``maximize``) and the algorithm's
settings under ``[settings]`` and ``[settings.<algorithm>]``. :func:`load_config`
checks every key and value (TOML types, choices) and returns them as the parser's
defaults, so flags on the command line override the file; every error names the key
and the file (:class:`ConfigError`).
"""

from __future__ import annotations

import dataclasses
import difflib
import tomllib
from dataclasses import dataclass, field
from typing import Any

from botorch_fed.runs.options import Option, setting_options

# top-level keys that are not parser defaults of the same name
_BLACK_BOX_KEYS = {"objective", "objectives", "bounds", "minimize", "maximize", "settings"}
_OBJECTIVE_TABLE_KEYS = ("function", "kwargs", "name")


class ConfigError(ValueError):
    r"""An invalid ``--config`` file (names the file and the key)."""


@dataclass(frozen=True)
class FromConfig:
    r"""A parser default that came from the config file (unwrapped after parsing)."""

    value: Any
    label: str

    def __str__(self) -> str:
        return str(self.value)


@dataclass
class Config:
    r"""What a ``--config`` file holds besides parser defaults."""

    path: str
    objective_table: dict | None = None  # `objective = { function = ..., kwargs = ... }`
    objectives: list[dict] | None = None  # [[objectives]]
    settings_extra: dict[str, Any] = field(default_factory=dict)  # fields without a flag
    has: set[str] = field(default_factory=set)  # top-level keys present

    def label(self, key: str) -> str:
        return f"`{key}` in {self.path}"


def describe_kind(option: Option) -> str:
    r"""What ``option`` takes, in words (for error messages)."""
    if option.choices is not None:
        text = f"one of {list(option.choices)}"
    else:
        text = {int: "an integer", float: "a number", str: "a string", bool: "true or false"}[
            option.kind
        ]
    return text + (' or "none"' if option.nullable else "")


def check_value(option: Option, value: Any, label: str) -> Any:
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
        raise ConfigError(f"{label} must be {describe_kind(option)}, got {value!r}.")
    return float(value) if kind is float else value


def _did_you_mean(name: str, names) -> str:
    close = difflib.get_close_matches(name, list(dict.fromkeys(names)), n=3)
    return f" Did you mean {', '.join(f'`{c}`' for c in close)}?" if close else ""


def _check_settings_table(
    table: Any, algorithm: str, key: str, path: str, out: dict, extra: dict
) -> None:
    r"""Check a ``[settings]`` table against ``algorithm``'s settings fields; values
    with a flag go into ``out`` (parser defaults), the others into ``extra``."""
    from botorch_fed.algorithms import available_algorithms, get_algorithm

    spec = get_algorithm(algorithm)
    if not isinstance(table, dict):
        raise ConfigError(f"`{key}` in {path} must be a table ([{key}]), got {table!r}.")
    by_field = {o.field: o for o in setting_options(spec.settings_class)}
    names = [f.name for f in dataclasses.fields(spec.settings_class) if f.init]
    for name, value in table.items():
        label = f"`{key}.{name}` in {path}"
        if isinstance(value, dict) and key == "settings":
            raise ConfigError(
                f"[settings.{name}] in {path}: no algorithm is called {name!r} (tables under "
                f"[settings] are per algorithm: {', '.join(available_algorithms())})."
            )
        if name not in names:
            raise ConfigError(
                f"{label}: {algorithm} has no setting `{name}` ({spec.settings_class.__name__} "
                f"fields: {', '.join(names)}).{_did_you_mean(name, names)}"
            )
        if name in by_field:
            out[f"settings.{name}"] = FromConfig(check_value(by_field[name], value, label), label)
        else:
            extra[name] = value


def _check_objective_table(table: dict, key: str, path: str) -> dict:
    r"""An ``objective`` table or one of the ``[[objectives]]``: ``function``,
    optional ``kwargs`` and ``name``."""
    for name in table:
        if name not in _OBJECTIVE_TABLE_KEYS:
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


def _read_toml(path: str) -> dict:
    try:
        with open(path, "rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigError(f"--config {path}: no such file.") from None
    except IsADirectoryError:
        raise ConfigError(f"--config {path} is a folder; give a TOML file.") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"--config {path} is not valid TOML: {exc}.") from None
    except OSError as exc:
        raise ConfigError(f"--config {path}: cannot read it ({exc}).") from None


def load_config(path: str, algorithm: str, options: list[Option]) -> tuple[dict, Config]:
    r"""Read a ``--config`` TOML file for ``run <algorithm>``.

    Args:
        path: The file.
        algorithm: The algorithm being run.
        options: Its command-line options.

    Returns:
        ``(defaults, config)``: parser defaults by ``dest`` (wrapped in
        :class:`FromConfig` so that the values' origin is known after parsing) and
        what is not a parser default (objective tables, settings without a flag).

    Raises:
        ConfigError: Naming the file and the key.
    """
    from botorch_fed.algorithms import available_algorithms

    data = _read_toml(path)
    config = Config(path=path, has=set(data))
    defaults: dict[str, FromConfig] = {}
    by_key = {o.key: o for o in options if o.key is not None and o.field is None}
    setting_fields = {o.field for o in options if o.field is not None}
    for key, value in data.items():
        if key in _BLACK_BOX_KEYS:
            continue
        if key == "aggregator" and key not in by_key:
            continue  # shared files: algorithms without secure aggregation skip it
        if key not in by_key:
            if key in setting_fields:
                hint = f" Algorithm settings go under [settings]: `settings.{key}`."
            elif key in ("config", "resume"):
                hint = f" --{key} is a command-line option only."
            else:
                hint = _did_you_mean(key, sorted(by_key) + sorted(_BLACK_BOX_KEYS))
            raise ConfigError(f"{path}: unknown key `{key}`.{hint}")
        label = config.label(key)
        defaults[by_key[key].dest] = FromConfig(check_value(by_key[key], value, label), label)
    if "minimize" in data and "maximize" in data:
        raise ConfigError(f"{path}: give `minimize` or `maximize`, not both.")
    for key in ("minimize", "maximize"):
        if key in data:
            if not isinstance(data[key], bool):
                raise ConfigError(f"{config.label(key)} must be true or false, got {data[key]!r}.")
            maximize = data[key] if key == "maximize" else not data[key]
            defaults["maximize"] = FromConfig(maximize, config.label(key))
    if "bounds" in data:
        bounds = data["bounds"]
        if not isinstance(bounds, str | list):
            raise ConfigError(
                f"{config.label('bounds')} must be a list of [lower, upper] pairs or a string "
                f'like "0,1;-5,5", got {bounds!r}.'
            )
        defaults["bounds"] = FromConfig(bounds, config.label("bounds"))
    if "objective" in data:
        objective = data["objective"]
        if isinstance(objective, str):
            defaults["objective"] = FromConfig(objective, config.label("objective"))
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
