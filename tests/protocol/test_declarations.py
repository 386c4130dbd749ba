r"""Declared messages: every field the server sends is checked against its declared domain
before any handler runs, and only declared message types reach a handler.

The domains are checked one by one against values inside and outside them (float32 and
float64 arrays alike); then, for every registered algorithm, every message type its
clients handle is sent with each field out of its domain, and the client must refuse it
with a ``ProtocolViolation`` naming the field -- with the handler replaced by one that
fails the test if it is called.
"""

from __future__ import annotations

import dataclasses
from typing import Annotated

import numpy as np
import pytest

from botorch_fed.algorithms import available_algorithms, build_federation
from botorch_fed.flower.run_options import prepare
from botorch_fed.protocol.client import FederatedClient
from botorch_fed.protocol.declarations import (
    Array,
    Blob,
    Choice,
    Declared,
    Domain,
    FieldError,
    Flag,
    Int,
    ProtocolViolation,
    Real,
    declare,
    handles,
    resolve,
)
from botorch_fed.protocol.messages import Message
from botorch_fed.protocol.round_budget import RoundNumber
from botorch_fed.protocol.secure_sum import Arguments, ForwardedSum
from tests.helpers.flower_runs import short_argv


class _Party:
    dim = 3
    settings = type("S", (), {"num_rounds": 4})()

    def limit(self):
        return 7


@pytest.mark.parametrize(
    "domain, good, bad",
    [
        (Int(1, 5), [1, 5, np.int64(3)], [0, 6, True, 2.0, "3", None]),
        (Int(1, "limit"), [7], [8]),
        (Int(0, "settings.num_rounds"), [4], [5, -1]),
        (Real(0.0, 1.0), [0.0, 1, np.float32(0.5)], [-0.1, 1.1, float("nan"), False, "0.5"]),
        (Real(), [1e300], [float("inf"), -float("inf")]),
        (Flag(), [True, np.bool_(False)], [1, 0, "True"]),
        (Choice(("a", "b")), ["a"], ["c", 1, None]),
        (Choice(lambda p: ("x",)), ["x"], ["a"]),
        (Blob(4), [b"", b"abcd"], [b"abcde", "abc", bytearray(b"a")]),
        (RoundNumber("settings.num_rounds"), [1, 4], [0, 5, True, 1.5]),
    ],
)
def test_a_domain_accepts_what_it_declares_and_refuses_the_rest(domain, good, bad):
    party = _Party()
    for value in good:
        domain.check(value, party)
    for value in bad:
        with pytest.raises(FieldError):
            domain.check(value, party)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_an_array_domain_checks_kind_shape_bounds_and_finiteness(dtype):
    party = _Party()
    domain = Array((None, "dim"), 0.0, 1.0)
    ok = domain.check(np.full((2, 3), 0.5, dtype=dtype), party)
    assert ok.dtype == np.float64 and ok.shape == (2, 3)
    for bad in (
        np.full((2, 4), 0.5, dtype=dtype),  # shape
        np.full((3,), 0.5, dtype=dtype),  # rank
        np.full((2, 3), 1.5, dtype=dtype),  # bound
        np.array([[0.5, np.nan, 0.5]], dtype=dtype),  # not finite
        np.zeros((2, 3), dtype=bool),  # kind
        [[0.5, 0.5, 0.5]],  # not an array
    ):
        with pytest.raises(FieldError):
            domain.check(bad, party)
    per_entry = Array(("dim",), low=lambda p: np.array([0.0, 1.0, 2.0]))
    per_entry.check(np.array([0.0, 1.0, 2.0], dtype=dtype), party)
    with pytest.raises(FieldError):
        per_entry.check(np.array([0.0, 0.5, 2.0], dtype=dtype), party)
    with pytest.raises(FieldError):
        Array(("dim",), kind="int").check(np.zeros(3, dtype=dtype), party)
    assert Array(("dim",), kind="int").check(np.arange(3), party).dtype == np.int64


def test_a_bound_resolves_numbers_paths_methods_and_callables():
    party = _Party()
    assert resolve(None, party) is None
    assert resolve(2.5, party) == 2.5
    assert resolve("dim", party) == 3
    assert resolve("settings.num_rounds", party) == 4
    assert resolve("limit", party) == 7
    assert resolve(lambda p: p.dim + 1, party) == 4


@declare("probe")
class _Probe(Declared):
    k: Annotated[int, Int(1, 3)]
    note: Annotated[str | None, Choice(("x",), optional=True)]


class _Client(FederatedClient):
    called = 0

    @handles(_Probe)
    def on_probe(self, message):
        self.called += 1
        return {"k": message.k}

    def on_undeclared(self, payload):  # not registered: unreachable
        self.called += 1
        return {}


def test_a_message_is_decoded_into_its_declaration_before_the_handler_runs():
    client = _Client(0)
    assert client.handle(Message("probe", {"k": np.int64(2)})).payload == {"k": 2}
    for payload, field in (
        ({"k": 4}, "k"),
        ({"k": 1, "note": "y"}, "note"),
        ({}, "k"),
        ({"k": 1, "extra": 1}, "extra"),
    ):
        with pytest.raises(ProtocolViolation, match=f"Client 0, request 'probe'.*`{field}`"):
            client.handle(Message("probe", payload))
    assert client.called == 1


def test_a_handler_is_unreachable_for_an_undeclared_type():
    client = _Client(0)
    with pytest.raises(ProtocolViolation, match="cannot handle messages of type 'undeclared'"):
        client.handle(Message("undeclared", {}))
    assert client.called == 0


def test_declaring_a_field_without_a_domain_fails():
    with pytest.raises(TypeError, match="exactly one Domain"):

        @declare("broken")
        class _Broken(Declared):
            k: int


def _valid(domain: Domain, party) -> object:
    r"""A value inside ``domain`` for ``party`` (bounds resolved)."""
    if isinstance(domain, RoundNumber):
        return 1
    if isinstance(domain, Int):
        low, high = resolve(domain.low, party), resolve(domain.high, party)
        return int(low if low is not None else (high if high is not None else 0))
    if isinstance(domain, Real):
        low, high = resolve(domain.low, party), resolve(domain.high, party)
        return float(low if low is not None else (high if high is not None else 0.0))
    if isinstance(domain, Choice):
        options = (
            domain.options if isinstance(domain.options, tuple) else resolve(domain.options, party)
        )
        return sorted(options)[0] if options else None  # none: no message of it passes
    if isinstance(domain, Flag):
        return False
    if isinstance(domain, Blob):
        return b""
    if isinstance(domain, Array):
        shape = tuple(1 if n is None else int(resolve(n, party)) for n in domain.shape)
        if domain.kind == "bool":
            return np.zeros(shape, dtype=bool)
        low = resolve(domain.low, party)
        value = np.zeros(shape) if low is None else np.broadcast_to(low, shape).astype(float)
        if domain.distinct:
            value = value + np.arange(shape[0])
        return value.astype(np.int64) if domain.kind == "int" else value
    raise AssertionError(f"no valid value for {domain}")


def _invalid(domain: Domain, party) -> list:
    r"""Values outside ``domain`` for ``party``: the wrong type, and beyond each bound."""
    out: list = [b"\x00"] if not isinstance(domain, Blob) else []  # bytes: a wrong type
    if isinstance(domain, Int | Real):
        low, high = resolve(domain.low, party), resolve(domain.high, party)
        out += [True, "1"]
        out += [] if low is None else [low - 1]
        out += [] if high is None else [high + 1]
        if isinstance(domain, Real):
            out.append(float("nan"))
    elif isinstance(domain, RoundNumber):
        out += [0, True, 1.5, int(resolve(domain.limit, party)) + 1]
    elif isinstance(domain, Choice):
        out += ["not-an-option"]
    elif isinstance(domain, Flag):
        out += [1]
    elif isinstance(domain, Blob):
        out += ["text"]
    elif isinstance(domain, Array):
        good = np.asarray(_valid(domain, party))
        out += [good.reshape(-1, 1, 1), good.astype(str).tolist()]
        if domain.rows is not None:  # too few rows, too many
            low, high = (int(resolve(b, party)) for b in domain.rows)
            out += [np.repeat(good[:1], n, axis=0) for n in (low - 1, high + 1) if n >= 0]
        if domain.distinct and len(good) > 1:
            out += [np.repeat(good[:1], len(good), axis=0)]
        if domain.kind == "float":
            out += [np.full(good.shape, np.nan)]
            low, high = resolve(domain.low, party), resolve(domain.high, party)
            if low is not None:
                out.append(np.broadcast_to(np.asarray(low, dtype=float) - 1.0, good.shape).copy())
            if high is not None:
                out.append(np.broadcast_to(np.asarray(high, dtype=float) + 1.0, good.shape).copy())
    return out


# checked by the secure-sum session, not by the declaration: a request's arguments by
# the request's own declaration (tested below), a forwarded sum by the session it ends
SESSION_CHECKED = (Arguments, ForwardedSum)


def _clients(name: str) -> list:
    run = prepare(short_argv(name, aggregator="masking"))
    _, clients, _ = build_federation(run.algorithm, run.setup, run.settings)
    return list(clients.values()) if isinstance(clients, dict) else list(clients)


@pytest.mark.parametrize("name", available_algorithms())
def test_every_field_out_of_its_domain_is_refused_before_any_handler_runs(name, monkeypatch):
    client = _clients(name)[0]
    assert client.HANDLERS, name
    checked = 0
    for type_, (declaration, method) in client.HANDLERS.items():

        def _must_not_run(*args, _type=type_, **kwargs):
            raise AssertionError(f"{name}: the handler of {_type!r} ran on a refused message")

        monkeypatch.setattr(client, method, _must_not_run)
        valid = {
            f: _valid(d, client)
            for f, d in declaration.DOMAINS.items()
            if not isinstance(d, SESSION_CHECKED)
        }
        valid = {f: v for f, v in valid.items() if v is not None}
        for field, domain in declaration.DOMAINS.items():
            if isinstance(domain, SESSION_CHECKED):
                continue
            for bad in _invalid(domain, client):
                payload = {**valid, field: bad}
                try:
                    message = Message(type_, payload)
                except (TypeError, ValueError):
                    continue  # no transport carries it: refused before any party sees it
                with pytest.raises(ProtocolViolation, match=f"`{field}`"):
                    client.handle(message)
                checked += 1
        with pytest.raises(ProtocolViolation, match="is not a field"):
            client.handle(Message(type_, {**valid, "undeclared_field": 1}))
    assert checked > 0


@pytest.mark.parametrize("name", available_algorithms())
def test_only_declared_message_types_reach_a_handler(name):
    r"""Every handler of every client class is registered under its declaration's type,
    and a message named after a method (``on_<type>``) that is not registered, or after
    nothing at all, is refused before anything runs."""
    client = _clients(name)[0]
    for type_, (declaration, method) in client.HANDLERS.items():
        assert issubclass(declaration, Declared) and dataclasses.is_dataclass(declaration)
        assert declaration.TYPE == type_ and callable(getattr(client, method))
    registered = {method for _, method in client.HANDLERS.values()}
    unregistered = {m for m in dir(type(client)) if m.startswith("on_")} - registered
    assert not unregistered, unregistered  # a method no message type can reach
    for type_ in ("state_dict", "handle", "violation", "undeclared"):
        with pytest.raises(ProtocolViolation, match=f"cannot handle messages of type '{type_}'"):
            client.handle(Message(type_, {}))


def _opening_frame(name: str):
    r"""A client of ``name``'s federation and the opening frame of a fresh secure-sum
    session for it (masking)."""
    run = prepare(short_argv(name, aggregator="masking"))
    server, clients, _ = build_federation(run.algorithm, run.setup, run.settings)
    frames = server.secagg.start(tuple(clients), 4)
    return clients[0], frames[0]


@pytest.mark.parametrize("name", ["fbo-fedgp"])
def test_a_secure_sum_argument_out_of_its_domain_is_refused_before_the_vector(name, monkeypatch):
    r"""The arguments of a secure sum's request (FBO-FedGP's ``pitc_summary``), each out
    of its domain, are refused before the vector is computed. (Co-KG's ``weighted_mean``
    is refused earlier still unless a posterior request armed it; its arguments:
    tests/algorithms/co_kg/test_attacks.py.)"""
    client, _ = _opening_frame(name)
    with_args = {r: (a, m) for r, ((_, a), m) in client.CONTRIBUTIONS.items() if a is not None}
    assert with_args, name
    checked = 0
    for request, (arguments, method) in with_args.items():

        def _must_not_run(*args, _request=request, **kwargs):
            raise AssertionError(f"{name}: the {_request!r} vector ran on refused arguments")

        monkeypatch.setattr(client, method, _must_not_run)
        valid = {f: _valid(d, client) for f, d in arguments.DOMAINS.items()}
        valid = {f: v for f, v in valid.items() if v is not None}
        for field, domain in arguments.DOMAINS.items():
            for bad in _invalid(domain, client):
                client, frame = _opening_frame(name)
                monkeypatch.setattr(client, method, _must_not_run)
                payload = {"data": frame, "request": request, "round": 1}
                payload["wide"] = client.sum_encoding(request)
                payload.update({f"arg:{k}": v for k, v in {**valid, field: bad}.items()})
                try:
                    message = Message("secagg", payload)
                except (TypeError, ValueError):
                    continue
                with pytest.raises(ProtocolViolation, match=f"`{field}`"):
                    client.handle(message)
                checked += 1
    assert checked > 0


def test_secure_sum_arguments_travel_only_as_arg_fields():
    client = _Client(0)
    for bad in (5, b"xy", "ab", np.zeros((0, 2))):
        with pytest.raises(ProtocolViolation, match="`args`"):
            client.handle(Message("secagg", {"data": b"frame", "args": bad}))


def test_a_refused_secure_sum_result_ends_its_session():
    client = _Client(0)
    client._pending, client._request = np.zeros(3), "a"  # a session in progress
    with pytest.raises(ProtocolViolation, match="`extra` is not a field"):
        client.handle(Message("secagg_result", {"extra": 1}))
    assert client._pending is None and client._request is None
    client.state_dict()  # between sessions again: it checkpoints
    with pytest.raises(ProtocolViolation, match="no session pending"):  # no second result
        client.handle(Message("secagg_result", {}))


def test_a_note_is_literal_text_or_a_callable():
    party = _Party()
    with pytest.raises(FieldError, match="has shape.*: one point of the unit cube$"):
        Array(("dim",), 0.0, 1.0, note="one point of the unit cube").check(np.zeros(2), party)
    with pytest.raises(FieldError, match=": 3 values$"):
        Array(("dim",), note=lambda p: f"{p.dim} values").check(np.zeros(2), party)


@pytest.mark.parametrize(
    "domain, bad, message",
    [
        (Real(0, open=True), 0.0, "must be > 0"),
        (Real(None, 1, open=True), 1.0, "must be < 1"),
        (Real(0, 1, open=True), 0.0, r"must lie in \(0, 1\)"),
        (Real(0, 1, open="low"), 0.0, r"must lie in \(0, 1\]"),
        (Real(0, 1, open="high"), 1.0, r"must lie in \[0, 1\)"),
    ],
)
def test_open_real_bounds_exclude_the_bound(domain, bad, message):
    with pytest.raises(FieldError, match=message):
        domain.check(bad, None)
    assert domain.check(0.5, None) == 0.5


def test_check_history_copies_a_list_of_dicts():
    from botorch_fed.protocol.checkpoint import CheckpointError, check_history

    saved = [{"round": 0}]
    assert (
        check_history("Client 0", saved) == saved and check_history("c", saved)[0] is not saved[0]
    )
    for bad in ({"round": 0}, [1], None):
        with pytest.raises(CheckpointError, match="Client 0: `history` must be a list of dicts"):
            check_history("Client 0", bad)


def test_a_choice_of_integers_refuses_floats_and_returns_the_option():
    r"""``1.0 == 1`` in Python, but a declared integer choice is not a float: a server's
    ``1.0`` is refused, a numpy integer arrives as the option itself."""
    from botorch_fed.protocol.declarations import Choice, FieldError

    domain = Choice((1, 2, 4))
    for value in (1.0, np.float64(2.0), True, "1", 3):
        with pytest.raises(FieldError, match="must be one of"):
            domain.check(value, None)
    checked = domain.check(np.int64(2), None)
    assert checked == 2 and type(checked) is int
