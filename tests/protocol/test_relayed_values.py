r"""Clients bind what the server told them into the next secure sum.

The attack: a server that sends different clients different federation values (a
request argument, a broadcast setting, a forwarded sum) can make every client but one
contribute something it knows (here: zero), so that the secure "sum" is one client's
private vector. Every client now chains what it was told since the last session
(:func:`~botorch_fed.protocol.secure_sum.relayed_digest`) into the next session: under
``masking`` the key round's tags cover it (every client checks every peer before any
masked input exists; the consistency round's tags cover it again), under ``ckks``
the guard canaries (the decrypting client refuses the aggregate). ``plaintext`` has no
such protection (the positive control: the attack recovers the victim's vector), nor
has a client whose binding is removed.

The binding also holds against a server that deviates within a session: a contributor
whose consistency reply it discards is checked all the same (in the key round, where
every client checks every peer); an opening it abandons does not restart the chain, so an
equivocation before it is bound into the next session; a round-0 frame without
``request`` does not get it the vector of an earlier, abandoned opening; and under
``ckks`` clients handed aggregates over different contributor lists notice.
"""

from __future__ import annotations

import dataclasses
import types
from typing import Annotated

import numpy as np
import pytest

from botorch_fed.algorithms import FBOFedGPSettings, run_federated
from botorch_fed.algorithms.fbo_fedgp.server import FBOFedGPServer
from botorch_fed.models import OUTCOME_MOMENTS_LENGTH
from botorch_fed.protocol import FederationSetup
from botorch_fed.protocol import client as client_module
from botorch_fed.protocol import server as server_module
from botorch_fed.protocol.checkpoint import CheckpointError
from botorch_fed.protocol.client import FederatedClient
from botorch_fed.protocol.declarations import (
    Declared,
    ProtocolViolation,
    Real,
    contributes,
    declare,
    handles,
)
from botorch_fed.protocol.messages import Message
from botorch_fed.protocol.secure_sum import SECAGG, relayed_digest
from botorch_fed.secure import (
    InputError,
    KeyMismatchError,
    SecureAggregationError,
    TamperedMessageError,
    get_backend,
)
from botorch_fed.secure.wire import PayloadReader, PayloadWriter
from tests.helpers.federation_runs import backend_params
from tests.helpers.secure_roles import make_roles

IDS = [0, 1, 2]


def _secagg(client, payload):
    return client.handle(Message("secagg", payload)).payload


def _result(client, payload):
    return client.handle(Message("secagg_result", payload)).payload


BACKENDS = backend_params("masking", "ckks")


@declare("setting", relayed=True)
class _Setting(Declared):
    scale: Annotated[float, Real()]


@declare("note")  # meant for one client only: not relayed
class _Note(Declared):
    x: Annotated[float | None, Real(optional=True)]


@declare("a:args")
class _AArgs(Declared):
    scale: Annotated[float | None, Real(optional=True)]


class _Client(FederatedClient):
    r"""A client whose next vector depends on what the server told it: its private
    vector times a ``scale`` (an argument, a relayed setting, or 0 when the forwarded
    sum is "too large", as a far-off mean zeroes FBO-FedGP's centred outcome moments)."""

    def __init__(self, cid, role):
        super().__init__(cid, role)
        self.value = np.array([0.25 + cid, -1.5 * cid, 3.0 + 0.125 * cid])
        self.scale = 1.0

    def sum_encoding(self, request):  # raw float vectors (the server sends wide=0)
        return 0

    @handles(_Setting)
    def on_setting(self, message):
        self.scale = message.scale
        return {}

    @handles(_Note)
    def on_note(self, message):
        return {}

    @contributes("a", args=_AArgs)
    def vector_a(self, scale=1.0):
        return self.value * float(scale) * self.scale

    @contributes("b")
    def vector_b(self):
        told = 0.0 if self.last_sum is None else float(np.abs(self.last_sum).max())
        return self.value * (0.0 if told > 1e6 else 1.0)


def _session(server, clients, request, round_, args=None, per_client=None):
    r"""One secure sum driven by a (possibly equivocating) server: ``per_client[cid]``
    replaces fields of the opening message of client ``cid``. Returns the sum the
    server obtains (None under ckks) and the clients' errors."""
    per_client = per_client or {}
    out, first, errors = server.start(IDS, 3), True, {}
    while isinstance(out, dict):
        replies = {}
        for cid, msg in out.items():
            payload = {"data": msg}
            if first:
                payload.update(request=request, wide=0, round=round_)
                payload.update({f"arg:{k}": v for k, v in (args or {}).items()})
                payload.update(per_client.get(cid, {}))
            try:
                replies[cid] = _secagg(clients[cid], payload)["data"]
            except TamperedMessageError as exc:
                errors[cid] = exc
        first = False
        if errors or len(replies) < len(IDS):
            return None, errors
        out = server.step(replies)
    return out, errors


def _finish(clients, forwarded=None, per_client=None):
    for cid, client in clients.items():
        payload = {} if forwarded is None else {"sum": forwarded}
        payload.update((per_client or {}).get(cid, {}))
        _result(client, payload)


def _federation(name, ids=None, seed=5):
    r"""A secure-aggregation server and ``_Client`` parties ``ids`` (default ``IDS``)."""
    ids = IDS if ids is None else list(ids)
    server, roles = make_roles(get_backend(name), ids, seed=seed)
    return server, {cid: _Client(cid, roles[cid]) for cid in ids}


def _unbind(monkeypatch):
    r"""Remove the protection: every client hands its backend a constant transcript."""
    monkeypatch.setattr(client_module, "relayed_digest", lambda *args: bytes(32))


# --- the attacks -------------------------------------------------------------------
ATTACKS = ["argument", "relayed setting", "forwarded sum"]


def _mount(name, attack, server, clients):
    r"""Equivocate so that clients 1 and 2 contribute zeros to request ``b``/``a``:
    the server's "sum" is then client 0's private vector. Returns the session's
    outcome ``(sum, errors)``."""
    if attack == "argument":
        per_client = {1: {"arg:scale": 0.0}, 2: {"arg:scale": 0.0}}
        return _session(server, clients, "a", 1, args={"scale": 1.0}, per_client=per_client)
    if attack == "relayed setting":
        for cid, client in clients.items():
            client.handle(Message("setting", {"scale": 1.0 if cid == 0 else 0.0}))
        return _session(server, clients, "a", 1)
    # forwarded sum (masking, plaintext: the server holds the sum): an honest first
    # session, then clients 1 and 2 are told a huge sum
    forwarded, _ = _session(server, clients, "a", 1)
    huge = {cid: {"sum": forwarded * 1e9} for cid in (1, 2)}
    _finish(clients, forwarded, per_client=huge)
    return _session(server, clients, "b", 2)


@pytest.mark.parametrize("attack", ATTACKS)
def test_masking_equivocation_yields_no_sum(attack):
    server, clients = _federation("masking")
    total, errors = _mount("masking", attack, server, clients)
    assert total is None
    assert errors, "no client detected the equivocation"
    for exc in errors.values():  # in the key round, before any masked input exists
        assert isinstance(exc, KeyMismatchError)
        assert "told the two clients different values" in str(exc)


@pytest.mark.parametrize("attack", ["argument", "relayed setting"])
def test_ckks_equivocation_fails_the_guard_check(attack):
    server, clients = _federation("ckks")
    total, errors = _mount("ckks", attack, server, clients)
    assert total is None
    assert set(errors) == set(IDS)  # every decrypting client refuses the aggregate
    for exc in errors.values():
        assert "guard slots" in str(exc) and "transcripts differ" in str(exc)
    assert all(c.secagg.result is None for c in clients.values())


@pytest.mark.parametrize("attack", ATTACKS)
def test_the_attack_recovers_the_victim_without_the_binding(attack, monkeypatch):
    r"""The positive control: with the binding removed (masking) the same attack gives
    the server client 0's private vector; under plaintext it always does."""
    _unbind(monkeypatch)
    server, clients = _federation("masking")
    total, errors = _mount("masking", attack, server, clients)
    assert not errors
    np.testing.assert_allclose(total, clients[0].value, rtol=0, atol=1e-9)


@pytest.mark.parametrize("attack", ATTACKS)
def test_plaintext_offers_no_protection(attack):
    server, clients = _federation("plaintext")
    total, errors = _mount("plaintext", attack, server, clients)
    assert not errors
    np.testing.assert_allclose(total, clients[0].value, rtol=0, atol=1e-9)


@pytest.mark.parametrize("name", BACKENDS)
def test_honest_sessions_still_sum(name):
    server, clients = _federation(name)
    for client in clients.values():
        client.handle(Message("setting", {"scale": 2.0}))
    expected = 2.0 * sum(c.value for c in clients.values())
    for t in (1, 2, 3):  # each session binds the previous one's forwarded sum
        total, errors = _session(server, clients, "a", t)
        assert not errors
        _finish(clients, total)
        for client in clients.values():
            np.testing.assert_allclose(client.last_sum, expected, rtol=0, atol=1e-6)


# --- the digest --------------------------------------------------------------------
def _digest(payload, type="m", previous=b""):
    return relayed_digest(previous, type, payload)


def test_the_digest_tells_apart_what_an_honest_server_never_mixes_up():
    base = {"k": 4, "x": np.array([0.5, 0.25]), "s": "pitc", "b": b"\x01"}
    digests = {
        "base": _digest(base),
        "type": _digest(base, type="n"),
        "previous": _digest(base, previous=bytes(32)),
        "int": _digest({**base, "k": 5}),
        "int as float": _digest({**base, "k": 4.0}),
        "int as bool": _digest({**base, "k": True}),
        "array value": _digest({**base, "x": np.array([0.5, 0.25 + 2**-52])}),
        "array shape": _digest({**base, "x": np.array([[0.5, 0.25]])}),
        "array as ints": _digest({**base, "x": np.array([0, 0])}),
        "str": _digest({**base, "s": "pic"}),
        "str as bytes": _digest({**base, "s": b"pitc"}),
        "key": _digest({**{k: v for k, v in base.items() if k != "s"}, "t": "pitc"}),
        "missing key": _digest({k: v for k, v in base.items() if k != "b"}),
        "extra key": _digest({**base, "e": 0}),
        # a field boundary moved: the lengths are encoded, so this differs too
        "boundary": _digest({"ab": "c"}),
        "boundary 2": _digest({"a": "bc"}),
    }
    assert len(set(digests.values())) == len(digests)
    # equal values: equal digests, whatever the key order, the array's memory layout
    # or integer width
    same = {"b": b"\x01", "s": "pitc", "x": np.array([0.5, 0.25]), "k": np.int32(4)}
    assert _digest(same) == digests["base"]
    wide = np.asfortranarray(np.arange(6, dtype=np.int16).reshape(2, 3))
    assert _digest({"a": wide}) == _digest({"a": np.arange(6).reshape(2, 3)})


def test_the_digest_refuses_what_is_not_a_payload_value():
    with pytest.raises(TypeError, match="'o'"):
        _digest({"o": [1, 2]})
    with pytest.raises(TypeError, match="'o'"):
        _digest({"o": np.array(["a"])})


def test_a_transcript_must_be_a_digest():
    server, clients = _federation("masking")
    out = server.start(IDS, 3)
    for bad, match in [(b"short", "32-byte digest, got 5 bytes"), ("x" * 32, "got str")]:
        with pytest.raises(InputError, match=match):
            clients[0].secagg.step(out[0], clients[0].value, transcript=bad)


def test_only_relayed_types_and_secure_sums_enter_the_transcript():
    _, clients = _federation("plaintext")
    client = clients[0]
    client.handle(Message("setting", {"scale": 1.0}))
    told = client.relayed
    assert told == relayed_digest(b"", "setting", {"scale": 1.0})
    client.handle(Message("note", {"x": 1.0}))
    assert client.relayed == told


# --- checkpoints -------------------------------------------------------------------
def test_the_transcript_survives_a_checkpoint():
    _, clients = _federation("plaintext")
    clients[0].handle(Message("setting", {"scale": 3.0}))
    state = clients[0].state_dict()
    _, fresh = _federation("plaintext")
    fresh[0].load_state_dict(state)
    assert fresh[0].relayed == clients[0].relayed != b""
    with pytest.raises(CheckpointError, match="relayed"):  # a state without the digest
        fresh[0].load_state_dict({k: v for k, v in state.items() if k != "relayed"})
    for bad in ("zz", "00" * 31, 7):
        with pytest.raises(CheckpointError, match="`relayed`"):
            fresh[0].load_state_dict({**state, "relayed": bad})


# --- a whole run -------------------------------------------------------------------
_HONEST_CARRY = server_module.FederatedServer.carry


def _equivocating_carry(self, messages, keep=None):
    r"""``FederatedServer.carry`` that sends client 0 another support than the others (any
    relayed value would do; FBO-FedGP's support goes with the server's next message)."""
    told = {}
    for cid, message in messages.items():
        message = server_module.as_message(message) if not isinstance(message, Message) else message
        if message.type == "support" and cid == 0:
            moved = np.clip(np.asarray(message.payload["support"]) + 0.01, 0.0, 1.0)
            message = Message(message.type, {**message.payload, "support": moved})
        told[cid] = message
    return _HONEST_CARRY(self, told, keep)


@pytest.mark.parametrize("name", BACKENDS)
def test_an_fbo_fedgp_run_stops_when_the_server_equivocates(name, monkeypatch):
    setup = FederationSetup(
        problem="branin", dim=2, num_clients=3, seed=0, crypto_seed=0, aggregator=name
    )
    config = FBOFedGPSettings.paper(
        num_init=4, support_size=6, num_restarts=2, raw_samples=16, maxiter=20,
        mixing="global", num_rounds=1,
    )  # fmt: skip
    honest = run_federated("fbo-fedgp", dataclasses.replace(setup), config)
    assert len(honest.best_per_round) == 2  # with an honest server the run completes
    monkeypatch.setattr(FBOFedGPServer, "carry", _equivocating_carry)
    refused = "told the two clients different values|transcripts differ"
    with pytest.raises(TamperedMessageError, match=refused):
        run_federated("fbo-fedgp", setup, config)


# --- a malicious server against the binding: dropped replies, abandoned openings ------
# (a session driven by hand: a client's refusal counts as a dropout, the server may
# discard replies, abandon a session or open one without the federation's fields)
def _drive(
    server, clients, request="a", round_=1, args=None, per_client=None, *,
    stop_after=None, opening=True, drop=None,
):  # fmt: skip
    r"""One secure session run by a malicious server: ``per_client[cid]`` replaces
    opening fields of client ``cid``; a client that raises counts as a dropout (the
    server goes on with the others); ``stop_after``: abandon the session after that
    round; ``opening=False``: round-0 frames without the federation's opening fields;
    ``drop[rnd]``: clients whose reply to round ``rnd`` the server discards.
    Returns what the server obtains and the errors."""
    per_client = per_client or {}
    out, rnd, errors = server.start(sorted(clients), 3), 0, {}
    while isinstance(out, dict):
        replies = {}
        for cid, msg in out.items():
            payload = {"data": msg}
            if rnd == 0 and opening:
                payload.update(request=request, wide=0, round=round_)
                payload.update({f"arg:{k}": v for k, v in (args or {}).items()})
                payload.update(per_client.get(cid, {}))
            try:
                replies[cid] = _secagg(clients[cid], payload)["data"]
            except (SecureAggregationError, ProtocolViolation) as exc:
                errors[cid] = exc
        for cid in (drop or {}).get(rnd, ()):
            replies.pop(cid, None)
        if stop_after == rnd:
            return None, errors
        rnd += 1
        try:
            out = server.step(replies)
        except SecureAggregationError as exc:
            errors["server"] = exc
            return None, errors
    return out, errors


def _accepted(name, clients, total):
    r"""The sum the attack produced: the server's (masking) or the one every client
    accepted (ckks), else None."""
    if name == "masking":
        return total
    results = [c.secagg.result for c in clients.values()]
    return None if any(r is None for r in results) else results[0]


# --- masking checks every contributor's transcript, dropped replies or not ---------
@pytest.mark.usefixtures("quiet_single_thread")
@pytest.mark.parametrize("victim", [0, 3])
def test_masking_does_not_sum_a_victim_whose_consistency_reply_is_dropped(victim):
    server, clients = _federation("masking", (0, 1, 2, 3))
    zero = {cid: {"arg:scale": 0.0} for cid in (0, 1, 2, 3) if cid != victim}
    total, errors = _drive(
        server, clients, args={"scale": 1.0}, per_client=zero, drop={3: {victim}}
    )
    # refused in the key round: every client checks every peer's transcript there
    assert total is None, (
        f"the server unmasked {total}: client {victim}'s private vector is {clients[victim].value}"
    )


# --- an opening that never yields a sum does not restart the chain ----------------
def _tell_apart(clients):
    r"""The relayed-setting equivocation of ``_mount``: client 0 keeps its vector, the
    others will contribute zeros."""
    for cid, client in clients.items():
        client.handle(Message("setting", {"scale": 1.0 if cid == 0 else 0.0}))


@pytest.mark.usefixtures("quiet_single_thread")
@pytest.mark.parametrize("name", backend_params("masking", "ckks"))
def test_an_abandoned_opening_does_not_launder_an_equivocation(name):
    server, clients = _federation(name)
    _tell_apart(clients)
    _drive(server, clients, stop_after=0)  # opened (every chain restarts), abandoned
    total, errors = _drive(server, clients)
    leaked = _accepted(name, clients, total)
    assert leaked is None, f"{name}: {leaked} is client 0's vector {clients[0].value}"


def _laundering_carry(self, messages, keep=None):
    r"""``FederatedServer.carry`` that sends client 0 another support, delivers it, then
    opens a secure session (the round-0 frames of a ``moments`` sum) and abandons it."""
    kinds = {server_module.as_message(m).type if not isinstance(m, Message) else m.type
             for m in messages.values()}  # fmt: skip
    _equivocating_carry(self, messages, keep)
    if "support" not in kinds:
        return
    self.flush()
    ids = self.client_ids
    frames = self.secagg.start(ids, OUTCOME_MOMENTS_LENGTH)
    opening = {"request": "moments", "wide": 0, "round": int(self.ledger.round)}
    self.send({cid: Message(SECAGG, {"data": d, **opening}) for cid, d in frames.items()})


@pytest.mark.usefixtures("quiet_single_thread")
@pytest.mark.parametrize("name", backend_params("masking", "ckks"))
def test_an_fbo_fedgp_run_with_a_laundering_opening_stops(name, monkeypatch):
    setup = FederationSetup(
        problem="branin", dim=2, num_clients=3, seed=0, crypto_seed=0, aggregator=name
    )
    config = FBOFedGPSettings.paper(
        num_init=4, support_size=6, num_restarts=2, raw_samples=16, maxiter=20,
        mixing="global", num_rounds=1,
    )  # fmt: skip
    monkeypatch.setattr(FBOFedGPServer, "carry", _laundering_carry)
    with pytest.raises((SecureAggregationError, ProtocolViolation)):
        run_federated("fbo-fedgp", setup, config)


# --- a round-0 frame without `request` leaks nothing -------------------------------
@pytest.mark.usefixtures("quiet_single_thread")
@pytest.mark.parametrize("name", backend_params("masking", "ckks"))
def test_an_opening_without_request_leaks_no_vector(name):
    server, clients = _federation(name)
    zero = {1: {"arg:scale": 0.0}, 2: {"arg:scale": 0.0}}
    _drive(server, clients, args={"scale": 1.0}, per_client=zero, stop_after=0)
    total, errors = _drive(server, clients, opening=False)
    leaked = _accepted(name, clients, total)
    assert leaked is None, f"{name}: {leaked} is client 0's vector {clients[0].value}"


# --- ckks: what a client decrypted is bound ----------------------------------------
def _per_client_aggregates(views):
    r"""``_CKKSServer._aggregate`` that hands client ``cid`` the (genuine) aggregate of
    ``views[cid]`` (each holds the client and >= min_clients contributors)."""

    def aggregate(self, payloads):
        n = self.backend.n_chunks(self.length)
        cts = {}
        for cid, data in payloads.items():
            reader = PayloadReader(data)
            assert reader.u32() == n
            cts[cid] = [self._ts.ckks_vector_from(self.context, reader.blob()) for _ in range(n)]
        self._contributors = tuple(sorted(payloads))
        out = {}
        for cid, view in views.items():
            writer = PayloadWriter().ids(view).u32(n)
            for k in range(n):
                acc = cts[view[0]][k] + cts[view[1]][k]
                for v in view[2:]:
                    acc = acc + cts[v][k]
                writer.blob(acc.serialize())
            out[cid] = writer.getvalue()
        return out

    return aggregate


@pytest.mark.usefixtures("quiet_single_thread")
@pytest.mark.parametrize("name", backend_params("ckks"))
def test_ckks_clients_told_different_sums_detect_it(name):
    server, clients = _federation(name, (0, 1, 2, 3))
    views = {0: (0, 1, 2, 3), 1: (0, 1, 2, 3), 2: (0, 1, 2), 3: (0, 1, 3)}
    server._aggregate = types.MethodType(_per_client_aggregates(views), server)
    _, errors = _drive(server, clients)
    detected = bool(errors)
    sums = {}
    if not detected:
        for cid, client in clients.items():
            try:
                _result(client, {})
            except ProtocolViolation:
                detected = True
            sums[cid] = client.last_sum
        del server._aggregate
        _, errors = _drive(server, clients, request="b", round_=2)  # uses last_sum
        detected = bool(errors)
    assert detected, f"clients accepted different sums {sums} and then the next session"


# --- relayed values mid-session, and an honest run of four clients ----------------
@pytest.mark.usefixtures("quiet_single_thread")
def test_a_relayed_value_sent_to_one_client_mid_session_is_bound_into_the_next():
    r"""A relayed message after a session's last backend round, before its result, to
    one client only: the next masking session yields no sum (M = 3, t = 3)."""
    server, clients = _federation("masking")
    total, errors = _drive(server, clients)
    assert not errors and total is not None
    clients[1].handle(Message("setting", {"scale": 0.0}))
    for client in clients.values():
        _result(client, {"sum": total})
    total, errors = _drive(server, clients, round_=2)
    assert total is None and errors
    refusals = [e for cid, e in errors.items() if cid != "server"]
    assert refusals and all("told the two clients different values" in str(e) for e in refusals)


@pytest.mark.usefixtures("quiet_single_thread")
@pytest.mark.parametrize("name", backend_params("masking", "ckks"))
def test_honest_four_client_run_with_federated_fit_and_support_reselection(name):
    r"""M = 4 (masking t = 3 < M: a contributor's consistency reply may be dropped): an
    honest FBO-FedGP run with the federated fit and support re-selection completes."""
    setup = FederationSetup(
        problem="branin", dim=2, num_clients=4, seed=1, crypto_seed=0, aggregator=name
    )
    config = FBOFedGPSettings.paper(
        num_init=4, support_size=6, num_restarts=2, raw_samples=16, maxiter=20,
        mixing="global", num_rounds=2, support_every=1, hyperparameters="federated",
    )  # fmt: skip
    result = run_federated("fbo-fedgp", dataclasses.replace(setup), config)
    assert len(result.best_per_round) == 3
