r"""Declared messages: each type states its fields' domains once, and a client checks every
message against its declaration before the handler runs (DESIGN: "Messages are declared").
A refusal depends only on what the server sent and on public settings, never on private data.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar, Self, TypeVar, dataclass_transform

import numpy as np

from botorch_fed.protocol.payloads import INT_RANGE

Bound = int | float | str | Callable[[Any], Any] | None


class ProtocolViolation(RuntimeError):
    r"""A message a party cannot handle in its state, or that does not match its declaration."""


def resolve(bound: Bound, party: object) -> Any:
    r"""``bound`` for ``party``: a number or ``None``, an attribute path of ``party``
    (``"settings.num_init"``; a method is called) or a callable ``party -> value``."""
    if isinstance(bound, str):
        value: Any = party
        for name in bound.split("."):
            value = getattr(value, name)
        return value() if callable(value) else value
    return bound(party) if callable(bound) else bound


class FieldError(ValueError):
    r"""A field's value is outside its domain (the message says why)."""


@dataclasses.dataclass(frozen=True)
class Domain:
    r"""Base class of a field's domain (``optional``: the field may be absent, then ``None``)."""

    optional: bool = dataclasses.field(default=False, kw_only=True)

    def check(self, value: object, party: object) -> Any:
        r"""``value`` converted to its Python type, or :class:`FieldError`."""
        raise NotImplementedError


def _integer(value: object) -> int:
    if isinstance(value, bool | np.bool_) or not isinstance(value, int | np.integer):
        raise FieldError(f"must be an integer (not {type(value).__name__})")
    return int(value)


def _show_bound(bound: Any) -> str:
    return str(bound) if isinstance(bound, int | np.integer) else f"{bound:g}"


def _in_range(value: float, low: Any, high: Any, open: bool | str = False) -> None:
    low_open, high_open = open in (True, "low"), open in (True, "high")
    below = low is not None and (value <= low if low_open else value < low)
    above = high is not None and (value >= high if high_open else value > high)
    if not (below or above):
        return
    if high is None:
        raise FieldError(f"must be {'>' if low_open else '>='} {_show_bound(low)}")
    if low is None:
        raise FieldError(f"must be {'<' if high_open else '<='} {_show_bound(high)}")
    if not open:
        raise FieldError(f"lies outside its domain [{_show_bound(low)}, {_show_bound(high)}]")
    left, right = "(" if low_open else "[", ")" if high_open else "]"
    raise FieldError(f"must lie in {left}{_show_bound(low)}, {_show_bound(high)}{right}")


@dataclasses.dataclass(frozen=True)
class Int(Domain):
    r"""An integer in ``[low, high]`` (``bool`` is not one)."""

    low: Bound = None
    high: Bound = None

    def check(self, value: object, party: object) -> int:
        v = _integer(value)
        _in_range(v, resolve(self.low, party), resolve(self.high, party))
        return v


@dataclasses.dataclass(frozen=True)
class Real(Domain):
    r"""A finite real number in ``[low, high]`` (``open``: ``True`` excludes both bounds,
    ``"low"``/``"high"`` one; ints are accepted, ``bool`` is not)."""

    low: Bound = None
    high: Bound = None
    open: bool | str = dataclasses.field(default=False, kw_only=True)

    def check(self, value: object, party: object) -> float:
        if isinstance(value, bool | np.bool_) or not isinstance(
            value, int | float | np.integer | np.floating
        ):
            raise FieldError(f"must be a real number (not {type(value).__name__})")
        try:
            v = float(value)
        except OverflowError:  # an int beyond float64
            raise FieldError("must be finite") from None
        if not math.isfinite(v):
            raise FieldError("must be finite")
        _in_range(v, resolve(self.low, party), resolve(self.high, party), self.open)
        return v


@dataclasses.dataclass(frozen=True)
class Flag(Domain):
    r"""A ``bool``."""

    def check(self, value: object, party: object) -> bool:
        if not isinstance(value, bool | np.bool_):
            raise FieldError(f"must be a bool (not {type(value).__name__})")
        return bool(value)


@dataclasses.dataclass(frozen=True)
class Choice(Domain):
    r"""One of ``options`` (a tuple, or a bound that resolves to a collection)."""

    options: Bound | tuple = ()

    def check(self, value: object, party: object) -> Any:
        options = self.options if isinstance(self.options, tuple) else resolve(self.options, party)
        if isinstance(value, np.generic):
            value = value.item()
        # the option itself, of the value's type: 1.0 is not the option 1, nor True
        match = [o for o in options if type(o) is type(value) and o == value]
        if not match:
            raise FieldError(f"must be one of {sorted(options, key=str)!r:.200}")
        return match[0]


@dataclasses.dataclass(frozen=True)
class Blob(Domain):
    r"""Bytes, at most ``max_bytes`` long."""

    max_bytes: Bound = None

    def check(self, value: object, party: object) -> bytes:
        if not isinstance(value, bytes):
            raise FieldError(f"must be bytes (not {type(value).__name__})")
        limit = resolve(self.max_bytes, party)
        if limit is not None and len(value) > limit:
            raise FieldError(f"holds {len(value)} bytes, more than {limit}")
        return value


_KINDS: dict[str, tuple[str, type, str]] = {"bool": ("b", bool, "a bool")}
_KINDS |= {"int": ("iu", np.int64, "an int64"), "float": ("iuf", np.float64, "a float")}


@dataclasses.dataclass(frozen=True)
class Array(Domain):
    r"""A numpy array of ``kind`` (``"float"``: finite float64; ``"int"``: int64; ``"bool"``).

    ``shape``: one bound per axis (``None``: any length); ``low``/``high``: elementwise
    bounds (may resolve to arrays that broadcast); ``rows``: ``(low, high)`` bounds on the
    first axis' length; ``distinct``: 1-D entries pairwise distinct; ``note``: a string
    or callable ``party -> str`` appended to every refusal."""

    shape: tuple = ()
    low: Bound = None
    high: Bound = None
    kind: str = "float"
    rows: tuple | None = None
    distinct: bool = False
    note: Bound = None

    def check(self, value: object, party: object) -> np.ndarray:
        try:
            return self._check(value, party)
        except FieldError as exc:
            note = self.note if isinstance(self.note, str) else resolve(self.note, party)
            raise FieldError(str(exc) if note is None else f"{exc}: {note}") from None

    def _check(self, value: object, party: object) -> np.ndarray:
        if not isinstance(value, np.ndarray) or value.dtype.kind not in "biuf":
            raise FieldError(f"must be a numeric array (not {type(value).__name__})")
        kinds, dtype, name = _KINDS[self.kind]
        too_large = self.kind == "int" and value.size and value.max() > INT_RANGE[1] // 2
        if value.dtype.kind not in kinds or too_large:
            raise FieldError(f"must be {name} array (not {value.dtype})")
        array: np.ndarray = value.astype(dtype)
        if self.kind == "float" and not np.isfinite(array).all():
            raise FieldError("must hold finite values only")
        expected = tuple(resolve(n, party) for n in self.shape)
        if array.ndim != len(expected) or any(
            n is not None and int(n) != m for n, m in zip(expected, array.shape, strict=True)
        ):
            raise FieldError(f"has shape {array.shape}, expected {expected}")
        if self.rows is not None:
            low, high = (resolve(b, party) for b in self.rows)
            if not low <= len(array) <= high:
                raise FieldError(f"has {len(array)} rows, expected {low}..{high}")
        if self.distinct and len(np.unique(array)) != len(array):
            raise FieldError("holds repeated entries")
        low, high = resolve(self.low, party), resolve(self.high, party)
        if array.size and self.kind != "bool":
            if (low is not None and not (array >= low).all()) or (
                high is not None and not (array <= high).all()
            ):
                raise FieldError(f"has values outside its domain [{_show(low)}, {_show(high)}]")
        return array


def _show(bound: Any) -> str:
    if bound is None:
        return "unbounded"
    return f"{bound:g}" if isinstance(bound, int | float) else "per entry"


class Declared:
    r"""Base class of a declared message (a frozen dataclass made by :func:`declare`).

    Attributes:
        TYPE: The message type on the wire.
        RELAYED: Whether the server sends every client the same value (bound into the
            next secure sum).
        DOMAINS: Field name -> domain.
    """

    TYPE: ClassVar[str] = ""
    RELAYED: ClassVar[bool] = False
    DOMAINS: ClassVar[dict[str, Domain]] = {}
    if TYPE_CHECKING:  # every subclass is a dataclass (:func:`declare`)
        __dataclass_fields__: ClassVar[dict[str, dataclasses.Field[Any]]]

    @classmethod
    def decode(cls, payload: Mapping[str, object], party: object) -> Self:
        r"""The message as a typed object, every field checked against its domain.

        Raises:
            Refused: Naming the field that is missing, extra or outside its domain.
        """
        extra = sorted(set(payload) - set(cls.DOMAINS))
        if extra:
            raise Refused(extra[0], "is not a field of this message")
        values: dict[str, Any] = {}
        for name, domain in cls.DOMAINS.items():
            if name not in payload and not domain.optional:
                raise Refused(name, "is missing")
            try:
                values[name] = domain.check(payload[name], party) if name in payload else None
            except FieldError as exc:
                raise Refused(name, str(exc), payload[name]) from None
        return cls(**values)

    def payload(self) -> dict:
        r"""The message's fields (those that are ``None`` left out)."""
        fields = ((f.name, getattr(self, f.name)) for f in dataclasses.fields(self))
        return {name: value for name, value in fields if value is not None}

    def wire(self) -> dict:
        r"""The payload as it travels (subclasses may lay it out otherwise)."""
        return self.payload()


class Refused(Exception):
    r"""A message that does not match its declaration: the field and what is wrong."""

    def __init__(self, name: str, problem: str, value: object = dataclasses.MISSING) -> None:
        super().__init__(name, problem)
        self.name, self.problem, self.value = name, problem, value

    def describe(self, whose: str = "the server's") -> str:
        r"""The refusal as ``"<whose> field `name`=value problem"``."""
        shown = "" if self.value is dataclasses.MISSING else f"={_brief(self.value)}"
        return f"{whose} field `{self.name}`{shown} {self.problem}"


def _brief(value: object) -> str:
    if isinstance(value, np.ndarray):
        return f"<{value.dtype} array of shape {value.shape}>"
    if isinstance(value, bytes):
        return f"<{len(value)} bytes>"
    return f"{value!r:.40}"


_D = TypeVar("_D", bound=Declared)


@dataclass_transform(frozen_default=True)
def declare(type_: str, relayed: bool = False) -> Callable[[type[_D]], type[_D]]:
    r"""Class decorator: ``cls`` becomes a frozen dataclass declaring message ``type_``
    (``relayed``: see :attr:`Declared.RELAYED`)."""

    def wrap(cls: type[_D]) -> type[_D]:
        if not issubclass(cls, Declared):
            raise TypeError(f"{cls.__name__} must subclass Declared.")
        cls = dataclasses.dataclass(frozen=True)(cls)
        cls.TYPE, cls.RELAYED, cls.DOMAINS = type_, relayed, field_domains(cls, every=True)
        return cls

    return wrap


def field_domains(cls: type, every: bool = False) -> dict[str, Domain]:
    r"""``{field: domain}`` of the dataclass ``cls``'s fields annotated
    ``Annotated[type, Domain]`` (``every``: each field must have exactly one)."""
    hints = typing.get_type_hints(cls, include_extras=True)
    domains = {}
    for f in dataclasses.fields(cls):
        nested = typing.get_args(hints[f.name]) if _is_union(hints[f.name]) else ()
        if any(isinstance(m, Domain) for a in nested for m in getattr(a, "__metadata__", ())):
            raise TypeError(
                f"{cls.__name__}.{f.name}: a Domain inside a union is not checked; write "
                "`Annotated[int | None, Int(..., optional=True)]`."
            )
        meta = [m for m in getattr(hints[f.name], "__metadata__", ()) if isinstance(m, Domain)]
        if len(meta) > 1 or (every and not meta):
            raise TypeError(f"{cls.__name__}.{f.name} must be annotated with exactly one Domain.")
        if meta:
            domains[f.name] = meta[0]
    return domains


def _is_union(hint: Any) -> bool:
    return typing.get_origin(hint) in (typing.Union, types.UnionType)


def check_value(name: str, value: Any, domain: Domain, party: object = None) -> Any:
    r"""``value`` checked by ``domain`` (``None`` passes ``optional``), or a ``ValueError``
    naming ``name``."""
    if value is None and domain.optional:
        return None
    try:
        return domain.check(value, party)
    except FieldError as exc:
        raise ValueError(f"`{name}`={_brief(value)} {exc}.") from None


def check_settings(settings: object) -> None:
    r"""Raise ``ValueError`` naming the first field of the settings dataclass outside its
    declared domain (bounds resolve against ``settings``; ``None`` passes ``optional``);
    a numpy scalar that passes is replaced by its Python value."""
    for name, domain in field_domains(type(settings)).items():
        value = getattr(settings, name)
        checked = check_value(name, value, domain, settings)
        if isinstance(value, np.generic):  # recorded settings hold Python numbers
            object.__setattr__(settings, name, checked)


_Handler = Callable[[Any, _D], Any]


def _mark(marker: str, value: object) -> Callable[[Any], Any]:
    def wrap(method: Any) -> Any:
        setattr(method, marker, value)
        return method

    return wrap


def handles(declaration: type[_D]) -> Callable[[_Handler[_D]], _Handler[_D]]:
    r"""Method decorator: the method handles ``declaration``'s messages, decoded (an
    override without the decorator keeps the declaration)."""
    return _mark("__handles__", declaration)


def contributes(request: str, args: type[Declared] | None = None) -> Callable[[Callable], Callable]:
    r"""Method decorator: the method computes this client's vector for secure sums of
    ``request``, called with the checked arguments ``args`` declares (none if ``None``)."""
    return _mark("__contributes__", (request, args))


def handler_table(cls: type, marker: str = "__handles__") -> dict[str, tuple[Any, str]]:
    r"""``{message type: (declaration, method name)}`` of ``cls`` and its bases (subclasses
    win); with ``marker="__contributes__"``: ``{request: ((request, args), method name)}``."""
    table: dict[str, tuple[Any, str]] = {}
    for klass in reversed(cls.__mro__):
        for name, attr in vars(klass).items():
            declared = getattr(attr, marker, None)
            if declared is not None:
                table[declared.TYPE if marker == "__handles__" else declared[0]] = (declared, name)
    return table
