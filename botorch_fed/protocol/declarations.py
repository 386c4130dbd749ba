r"""Declared messages: what may arrive, stated once per message type and checked once.

Every message a server sends a client is a :class:`Declared` subclass next to its
algorithm: a frozen dataclass whose fields are annotated with their domain::

    @declare("round")
    class Round(Declared):
        t: Annotated[int, Int(1, "round_limit")]

A domain (:class:`Int`, :class:`Real`, :class:`Flag`, :class:`Choice`, :class:`Blob`,
:class:`Array`) may name its bounds, choices and shapes in terms of the run: a number,
``None`` (unbounded), the name of an attribute of the receiving party (``"dim"``,
``"settings.num_init"``; a method is called) or a callable ``party -> value``. A client
registers a handler per declaration with :func:`handles`; the protocol
(:meth:`~botorch_fed.protocol.client.FederatedClient.handle`) decodes each message
against its declaration before the handler runs, so the handler gets a typed object and
every value the server chose lies in its declared domain (DESIGN: "Messages are
declared, and server-chosen values are bounded"). A message of an undeclared type, a
missing or extra field, or a value outside its domain is refused with a
:class:`ProtocolViolation` naming the client, the message type, the round and the field.

What a check refuses depends only on what the server sent and on public settings,
never on private data: a refusal tells the server nothing it did not know.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar, Self, TypeVar, dataclass_transform

import numpy as np

from botorch_fed.protocol.payloads import INT_RANGE

Bound = int | float | str | Callable[[Any], Any] | None


class ProtocolViolation(RuntimeError):
    r"""A party received a message it cannot handle in its current state, or one that
    does not match its declaration."""


def resolve(bound: Bound, party: object) -> Any:
    r"""The value of a declared bound for ``party``: numbers and ``None`` as they are, an
    attribute path (``"settings.num_rounds"``; a method is called) or a callable."""
    if isinstance(bound, str):
        value: Any = party
        for name in bound.split("."):
            value = getattr(value, name)
        return value() if callable(value) else value
    if callable(bound):
        return bound(party)
    return bound


class FieldError(ValueError):
    r"""A field's value is outside its domain (the message says why)."""


@dataclasses.dataclass(frozen=True)
class Domain:
    r"""Base class of a field's domain. ``optional``: the field may be absent (the
    handler then gets ``None``)."""

    optional: bool = dataclasses.field(default=False, kw_only=True)

    def check(self, value: object, party: object) -> Any:
        r"""``value`` converted to its Python type, or :class:`FieldError`."""
        raise NotImplementedError


def _integer(value: object) -> int:
    if isinstance(value, bool | np.bool_) or not isinstance(value, int | np.integer):
        raise FieldError(f"must be an integer (not {type(value).__name__})")
    return int(value)


def _in_range(value: float, low: Any, high: Any) -> None:
    if (low is not None and value < low) or (high is not None and value > high):
        if high is None:
            raise FieldError(f"must be >= {low:g}")
        if low is None:
            raise FieldError(f"must be <= {high:g}")
        raise FieldError(f"lies outside its domain [{low:g}, {high:g}]")


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
    r"""A finite real number in ``[low, high]`` (ints are accepted; ``bool`` is not)."""

    low: Bound = None
    high: Bound = None

    def check(self, value: object, party: object) -> float:
        if isinstance(value, bool | np.bool_) or not isinstance(
            value, int | float | np.integer | np.floating
        ):
            raise FieldError(f"must be a real number (not {type(value).__name__})")
        v = float(value)
        if not math.isfinite(v):
            raise FieldError("must be finite")
        _in_range(v, resolve(self.low, party), resolve(self.high, party))
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
        if not isinstance(value, str | int) or isinstance(value, bool) or value not in options:
            raise FieldError(f"must be one of {sorted(options)!r:.200}")
        return value


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


@dataclasses.dataclass(frozen=True)
class Array(Domain):
    r"""A numpy array of ``kind`` (``"float"``: finite float64 values; ``"int"``:
    int64; ``"bool"``) whose shape matches ``shape`` (each entry a bound; ``None``: any
    length) and whose values lie in ``[low, high]`` (elementwise; a bound may resolve to
    an array that broadcasts against the value).

    ``rows``: ``(low, high)`` bounds on the length of the first axis; ``distinct``: the
    entries (of a 1-D array) are pairwise distinct; ``note``: what the field must be, in
    words, appended to every refusal (a string, taken as it is, or a callable
    ``party -> str``)."""

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
        if self.kind == "bool":
            if value.dtype.kind != "b":
                raise FieldError(f"must be a bool array (not {value.dtype})")
            array = value.astype(bool)
        elif self.kind == "int":
            if value.dtype.kind not in "iu" or (value.size and value.max() > INT_RANGE[1] // 2):
                raise FieldError(f"must be an int64 array (not {value.dtype})")
            array = value.astype(np.int64)
        else:
            if value.dtype.kind == "b":
                raise FieldError("must be a float array (not bool)")
            array = value.astype(np.float64)
            if not np.isfinite(array).all():
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
    r"""Base class of a declared message: subclasses are frozen dataclasses (made so by
    :func:`declare`) whose fields are ``Annotated[type, Domain]``.

    Attributes:
        TYPE: The message type on the wire.
        RELAYED: Whether the server sends every client the same value (bound into the
            next secure sum: :func:`~botorch_fed.protocol.secure_sum.relayed_digest`).
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
            Refused: Naming the field that is missing, extra or outside its domain
                (:meth:`~botorch_fed.protocol.client.FederatedClient.handle` turns it into
                the :class:`ProtocolViolation` a party raises).
        """
        extra = sorted(set(payload) - set(cls.DOMAINS))
        if extra:
            raise Refused(extra[0], "is not a field of this message")
        values: dict[str, Any] = {}
        for name, domain in cls.DOMAINS.items():
            if name not in payload:
                if not domain.optional:
                    raise Refused(name, "is missing")
                values[name] = None
                continue
            try:
                values[name] = domain.check(payload[name], party)
            except FieldError as exc:
                raise Refused(name, str(exc), payload[name]) from None
        return cls(**values)

    def payload(self) -> dict:
        r"""The message's fields (those that are ``None`` left out)."""
        return {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)
            if getattr(self, f.name) is not None
        }

    def wire(self) -> dict:
        r"""The message's payload as it travels (:meth:`payload`, unless a subclass
        lays its fields out otherwise)."""
        return self.payload()


class Refused(Exception):
    r"""A message that does not match its declaration: the field and what is wrong."""

    def __init__(self, name: str, problem: str, value: object = dataclasses.MISSING) -> None:
        super().__init__(name, problem)
        self.name, self.problem, self.value = name, problem, value

    def describe(self) -> str:
        shown = "" if self.value is dataclasses.MISSING else f"={_brief(self.value)}"
        return f"the server's field `{self.name}`{shown} {self.problem}"


def _brief(value: object) -> str:
    if isinstance(value, np.ndarray):
        return f"<{value.dtype} array of shape {value.shape}>"
    if isinstance(value, bytes):
        return f"<{len(value)} bytes>"
    return f"{value!r:.40}"


_D = TypeVar("_D", bound=Declared)


@dataclass_transform(frozen_default=True)
def declare(type_: str, relayed: bool = False) -> Callable[[type[_D]], type[_D]]:
    r"""Class decorator: ``cls`` becomes a frozen dataclass declaring message ``type_``.

    Args:
        type_: The message type on the wire.
        relayed: Whether the server sends every client the same value (see
            :attr:`Declared.RELAYED`).
    """

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
        meta = [m for m in getattr(hints[f.name], "__metadata__", ()) if isinstance(m, Domain)]
        if len(meta) > 1 or (every and not meta):
            raise TypeError(f"{cls.__name__}.{f.name} must be annotated with exactly one Domain.")
        if meta:
            domains[f.name] = meta[0]
    return domains


def check_settings(settings: object) -> None:
    r"""Raise ``ValueError`` naming the first field of the settings dataclass
    ``settings`` that lies outside its declared domain (bounds resolve against
    ``settings``, so a bound may name another setting; ``None`` passes an ``optional``
    domain)."""
    for name, domain in field_domains(type(settings)).items():
        value = getattr(settings, name)
        if value is None and domain.optional:
            continue
        try:
            domain.check(value, settings)
        except FieldError as exc:
            raise ValueError(f"`{name}`={_brief(value)} {exc}.") from None


_M = TypeVar("_M", bound=Declared)
_Handler = Callable[[Any, _M], Any]


def handles(declaration: type[_M]) -> Callable[[_Handler[_M]], _Handler[_M]]:
    r"""Method decorator: the method handles messages of ``declaration``'s type; it is
    called with the decoded message (``self.on_x(message: Declaration) -> dict``; a type
    checker refuses a method annotated with another declaration). A subclass that
    overrides the method (without the decorator) keeps the declaration."""

    def wrap(method: _Handler[_M]) -> _Handler[_M]:
        method.__handles__ = declaration  # type: ignore[attr-defined]
        return method

    return wrap


def contributes(request: str, args: type[Declared] | None = None) -> Callable[[Callable], Callable]:
    r"""Method decorator: the method computes this client's vector for secure sums of
    ``request``; ``args`` declares the arguments the server may send with the request
    (none if ``None``), which the method gets as keyword arguments once checked."""

    def wrap(method: Callable) -> Callable:
        method.__contributes__ = (request, args)  # type: ignore[attr-defined]
        return method

    return wrap


def handler_table(cls: type, marker: str = "__handles__") -> dict[str, tuple[Any, str]]:
    r"""``{message type: (declaration, method name)}`` of ``cls`` and its bases (a
    subclass's declaration of a type replaces its base's); with ``marker=
    "__contributes__"``: ``{request: ((request, args declaration), method name)}``."""
    table: dict[str, tuple[Any, str]] = {}
    for klass in reversed(cls.__mro__):
        for name, attr in vars(klass).items():
            declared = getattr(attr, marker, None)
            if declared is not None:
                key = declared.TYPE if marker == "__handles__" else declared[0]
                table[key] = (declared, name)
    return table
