r"""Command-line options generated from an algorithm's settings dataclass.

Every field of a settings dataclass with a plain type (``int``, ``float``, ``str``,
``bool``, optionally ``| None``) becomes one option of ``botorch-fed run
<algorithm>``: the flag from the field name (``num_rounds`` -> ``--num-rounds``, with
the aliases of :data:`SETTING_ALIASES`), the help from the ``Attributes:`` section of
the class docstring, the default from the dataclass, and the choices from the field's
``metadata["choices"]`` (``dataclasses.field(metadata={"choices": (...)})``). Nullable
fields read ``none``.

:class:`Option` is also how the rest of the command line names an option to the user:
its flags, or the config-file key its value came from.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import re
import types
import typing
from dataclasses import dataclass
from typing import Any

from botorch_fed.protocol.declarations import Choice, field_domains

# Settings fields whose command-line flags are not just ``--field-name``: older flag
# names kept as aliases (README, Makefile, benchmarks use them). ``--support`` is the
# support *size*, so the support-selection field ``support`` is ``--support-selection``.
SETTING_ALIASES = {
    "num_init": ("--init",),
    "num_rounds": ("--rounds",),
    "support_size": ("--support",),
}
SETTING_FLAGS = {"support": "--support-selection"}

_METAVARS = {int: "INT", float: "FLOAT", str: "TEXT"}


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
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
class Option:
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
        r"""The flags as the user types them: ```--num-rounds`/`--rounds```."""
        return "/".join(f"`{f}`" for f in self.flags)

    def label(self, sources: dict[str, str]) -> str:
        r"""Where this option's value came from: the config file's key (``sources``
        maps ``dest`` to it) or the flags."""
        return sources.get(self.dest, self.display)


def attribute_docs(cls: type) -> dict[str, str]:
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


def field_type(hint: Any) -> tuple[type | None, bool]:
    r"""``(kind, nullable)`` of a field type: int/float/str/bool, optionally ``| None``
    (``kind`` is ``None`` for any other type)."""
    nullable = False
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        nullable = len(args) < len(typing.get_args(hint))
        if len(args) != 1:
            return None, nullable
        hint = args[0]
    return (hint if hint in (int, float, str, bool) else None), nullable


def setting_options(settings_class: type) -> list[Option]:
    r"""One command-line option per field of an algorithm's settings dataclass that
    has a plain type (int, float, str, bool, optionally ``| None``); a field's fixed
    set of values is its declared :class:`~botorch_fed.protocol.declarations.Choice`
    (or ``field.metadata["choices"]``)."""
    hints = typing.get_type_hints(settings_class)
    domains = field_domains(settings_class)
    out = []
    for f in dataclasses.fields(settings_class):
        if not f.init:
            continue
        kind, nullable = field_type(hints.get(f.name))
        if kind is None:
            continue  # only through the config file's [settings]
        domain = domains.get(f.name)
        choices = f.metadata.get("choices")
        if isinstance(domain, Choice) and isinstance(domain.options, tuple):
            choices = domain.options
        out.append(
            Option(
                dest=f"settings.{f.name}",
                flags=(SETTING_FLAGS.get(f.name, "--" + f.name.replace("_", "-")),)
                + SETTING_ALIASES.get(f.name, ()),
                kind=kind,
                nullable=nullable,
                choices=None if choices is None else tuple(choices),
                key=f"settings.{f.name}",
                field=f.name,
            )
        )
    return out


def converter(kind: type, nullable: bool):
    r"""An argparse ``type`` for ``kind`` that also reads ``none`` for nullable fields."""

    def convert(text: str):
        if nullable and text.strip().lower() == "none":
            return None
        return kind(text)

    convert.__name__ = kind.__name__  # argparse: "invalid int value: 'x'"
    return convert


class _ChoicesOrNone(tuple):
    r"""argparse ``choices`` of a nullable option: ``none`` (converted to None) is one."""

    def __contains__(self, value: object) -> bool:
        return value is None or tuple.__contains__(self, value)


def add_option(
    group,
    options: list[Option],
    option: Option,
    default: Any,
    help: str,
    metavar: str | None = None,
) -> None:
    r"""Add ``option`` to the argparse ``group`` and record it in ``options``."""
    kwargs: dict[str, Any] = {"dest": option.dest, "default": default, "help": help}
    if option.kind is bool:
        kwargs["action"] = argparse.BooleanOptionalAction  # shows its default itself
    else:
        kwargs["type"] = converter(option.kind, option.nullable)
        if option.choices is not None:
            kwargs["choices"] = (
                _ChoicesOrNone(option.choices) if option.nullable else option.choices
            )
            if option.nullable:
                kwargs["metavar"] = "{" + ",".join(map(str, option.choices)) + ",none}"
        else:
            name = _METAVARS[option.kind]
            kwargs["metavar"] = metavar or (f"{name}|none" if option.nullable else name)
    group.add_argument(*option.flags, **kwargs)
    options.append(option)


def rename_to_flags(message: str, names: dict[str, str]) -> tuple[str, bool]:
    r"""Replace the backquoted Python names of ``message`` (```support_size```) by what
    the user typed (``names``: Python name -> flag or config key); returns ``(message,
    whether any name was replaced)``."""
    found = False

    def sub(m: re.Match) -> str:
        nonlocal found
        if m.group(1) in names:
            found = True
            return names[m.group(1)]
        return m.group(0)

    return re.sub(r"`([A-Za-z_]\w*)`", sub, message), found
