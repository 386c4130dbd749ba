r"""Command-line options of ``run <algorithm>``: one per settings field of plain type (int,
float, str, bool, optionally ``| None``: reads ``none``), its flag from the name (and
:data:`SETTING_ALIASES`), help from ``Attributes:``, choices from its ``Choice`` domain."""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import re
import textwrap
import types
import typing
from dataclasses import dataclass
from typing import Any

from botorch_fed.protocol.declarations import Choice, field_domains

# older flag names kept as aliases (the documentation, Makefile, benchmarks use them); ``--support``
# is the support *size*, so the support-selection field is ``--support-selection``
SETTING_ALIASES = dict(num_init=("--init",), num_rounds=("--rounds",), support_size=("--support",))
SETTING_FLAGS = {"support": "--support-selection"}

_METAVARS = {int: "INT", float: "FLOAT", str: "TEXT"}
_BACKQUOTED = re.compile(r"`([A-Za-z_]\w*)`")


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    r"""Keeps the description/epilog layout and shows every default that is set."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        shown = all(action.default is not v for v in (None, False, argparse.SUPPRESS))
        if shown and action.option_strings and "%(default)" not in text:
            text += " (default: %(default)s)"
        return text


@dataclass
class Option:
    r"""One option of ``run <algorithm>`` (its config-file key is ``dest``)."""

    dest: str
    flags: tuple[str, ...]
    kind: type  # int, float, str, bool
    nullable: bool = False
    choices: tuple | None = None
    field: str | None = None  # the settings field

    def label(self, sources: dict[str, str]) -> str:
        r"""The config key of the value (``sources``: dest -> key), else ```--flag`/`--alias```."""
        return sources.get(self.dest, "/".join(f"`{f}`" for f in self.flags))


def attribute_docs(cls: type) -> dict[str, str]:
    r"""``{field: description}`` from the ``Attributes:`` of ``cls`` and its bases."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        doc = inspect.cleandoc(klass.__dict__.get("__doc__") or "") + "\n"
        section = re.search(r"^( *)Attributes:\n((?:\1 +\S.*\n|[ \t]*\n)*)", doc, re.M)
        body = textwrap.dedent(section.group(2)) if section else ""
        for m in re.finditer(r"^(\w+)(?: \([^)]*\))?:(.*(?:\n(?:[ \t]*\n)*[ \t]+.*)*)", body, re.M):
            docs[m.group(1)] = m.group(2)
    return {k: re.sub(r"\s+", " ", v.replace("``", "")).strip() for k, v in docs.items()}


def field_type(hint: Any) -> tuple[type | None, bool]:
    r"""``(kind, nullable)`` of a type hint: int, float, str or bool (else None), ``| None``."""
    union = isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union
    args = typing.get_args(hint) if union else (hint,)
    plain = [a for a in args if a is not type(None)]
    kind = plain[0] if len(plain) == 1 and plain[0] in (int, float, str, bool) else None
    return kind, len(plain) < len(args)


def setting_options(settings_class: type) -> list[Option]:
    r"""One option per ``init`` field of plain type (others: the config's ``[settings]`` only)."""
    hints = typing.get_type_hints(settings_class)
    domains = field_domains(settings_class)
    out = []
    for f in dataclasses.fields(settings_class):
        kind, nullable = field_type(hints.get(f.name))
        if not f.init or kind is None:
            continue
        domain = domains.get(f.name)
        fixed = isinstance(domain, Choice) and isinstance(domain.options, tuple)
        choices = domain.options if fixed else None  # type: ignore[union-attr]
        flags: tuple[str, ...] = (SETTING_FLAGS.get(f.name, "--" + f.name.replace("_", "-")),)
        flags += SETTING_ALIASES.get(f.name, ())
        out.append(Option(f"settings.{f.name}", flags, kind, nullable, choices, f.name))
    return out


def add_settings(group, options: list[Option], settings_class: type) -> None:
    r"""Add the options of :func:`setting_options` to ``group`` and ``options``."""
    docs = attribute_docs(settings_class)
    # the declared defaults, not an instance's: a field left at None may be resolved by
    # another (FBO-FedGP's `preset`), which must still see None from the command line
    instance = settings_class()
    defaults = {
        f.name: getattr(instance, f.name) if f.default is dataclasses.MISSING else f.default
        for f in dataclasses.fields(settings_class)
    }
    taken = {f for o in options for f in o.flags} | {"--help", "-h"}
    for option in setting_options(settings_class):
        assert option.field is not None  # a settings option names its field
        if taken.intersection(option.flags):  # a new field named like a federation option
            name = f"{settings_class.__name__}.{option.field}"
            raise RuntimeError(f"{name}: add its flag to SETTING_FLAGS.")
        taken.update(option.flags)
        text = docs.get(option.field) or option.field.replace("_", " ")
        if option.nullable and defaults[option.field] is None:
            text += " (default: none)"
        add_option(group, options, option, defaults[option.field], text.replace("%", "%%"))


class _ChoicesOrNone(tuple):
    r"""argparse ``choices`` of a nullable option: ``none`` (converted to None) is one."""

    def __contains__(self, value: object) -> bool:
        return value is None or tuple.__contains__(self, value)


def add_option(group, options: list[Option], option: Option, default, help, metavar=None) -> None:
    r"""Add ``option`` to the argparse ``group`` and record it in ``options``."""
    kwargs: dict[str, Any] = {"dest": option.dest, "default": default, "help": help}
    kind, nullable = option.kind, option.nullable
    if kind is bool:
        kwargs["action"] = argparse.BooleanOptionalAction  # shows its default itself
    else:

        def convert(text: str):
            return None if nullable and text.strip().lower() == "none" else kind(text)

        convert.__name__ = kind.__name__  # argparse: "invalid int value: 'x'"
        kwargs["type"] = convert
        if option.choices is None:
            kwargs["metavar"] = metavar or _METAVARS[kind] + ("|none" if nullable else "")
        elif nullable:
            kwargs["choices"] = _ChoicesOrNone(option.choices)
            kwargs["metavar"] = "{" + ",".join(map(str, option.choices)) + ",none}"
        else:
            kwargs["choices"] = option.choices
    group.add_argument(*option.flags, **kwargs)
    options.append(option)


def rename_to_flags(message: str, names: dict[str, str]) -> tuple[str, bool]:
    r"""``(message, whether any name was replaced)`` with the backquoted Python names
    (```support_size```) replaced by what the user typed (``names``: name -> flag or key)."""
    found = any(name in names for name in _BACKQUOTED.findall(message))
    return _BACKQUOTED.sub(lambda m: names.get(m.group(1), m.group(0)), message), found
