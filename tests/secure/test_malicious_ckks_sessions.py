"""A malicious server mixing CKKS sessions.

The server chooses session ids. Canaries that depended only on (group key, session id,
client, chunk) would let a reused id mix ciphertexts across sessions or pass a stale
aggregate off as the new sum. A client refuses a session id it has joined before, and
every session is bound to a fresh nonce of each client: clients that restarted (and so
forgot the ids they joined) still refuse a replay. A run resumed from a checkpoint with
``crypto_seed`` draws its roles' per-session randomness from the OS, so it repeats no
session id or nonce of the run before it.

A second session on the same roles is *committed* (the server holds every client's
nonce for it, sent with the client's previous reply: the clients encrypt in round 0);
a server that forgets the commitments (``restore_committed_nonces({})``) opens the
three-round session (nonces, encrypt, decrypt). Each property below is checked in
both.
"""

from __future__ import annotations

import numpy as np
import pytest

import botorch_fed.algorithms  # noqa: F401  (registers fbo-fedgp, which run_roles builds)
from botorch_fed.secure import (
    ProtocolError,
    SecureAggregationError,
    TamperedMessageError,
    get_backend,
)
from botorch_fed.secure.wire import PayloadReader, PayloadWriter
from tests.helpers.secure_roles import make_roles, plain_sum, random_inputs, run_roles

IDS = [0, 1, 2, 3]
CRYPTO_SEED = 5  # secret to the server (experiments only), unlike the run's seed
MODES = pytest.mark.parametrize("committed", [False, True], ids=["three-round", "committed"])


@pytest.fixture(scope="module")
def ckks_backend():
    return get_backend("ckks")


def _roles(backend, seed):
    """Server and client roles as tests/helpers/secure_roles.make_roles builds them,
    plus the key material (``BackendSetup``), which a restart keeps."""
    setup = backend.setup(IDS, seed=seed)
    server = backend.server(setup.server_material, seed=seed)
    clients = {cid: backend.client(cid, setup.for_client(cid), seed=seed) for cid in IDS}
    return server, clients, setup


def _record(store: dict, method):
    """``method`` (the server's ``_route_nonces`` or ``_aggregate``, which a committed
    session calls with ``committed=True``) recording its last input and output."""

    def wrapped(payloads, **kw):
        out = method(payloads, **kw)
        store.update({"in": dict(payloads), "out": dict(out)})
        return out

    return wrapped


def _set_mode(server, committed: bool) -> None:
    """Open the next session committed (the server must hold every client's commitment:
    an honest session ran before) or, forgetting the commitments, in three rounds."""
    if committed:
        assert set(server.committed_nonces()) == set(IDS)
    else:
        server.restore_committed_nonces({})


def _session(server, clients, inputs, *, session_id=None, route=None, aggregate=None):
    """One session driven by hand. ``session_id`` forces the server's id;
    ``route(payloads) -> {cid: payload}`` replaces the nonce broadcast and
    ``aggregate(payloads, **kw) -> {cid: payload}`` the aggregate. Returns the replies
    of every round and, per client, the error it raised (if any)."""
    if session_id is not None:
        real = server._rand.bytes
        server._rand.bytes = lambda n: session_id if n == 16 else real(n)
    honest_route, honest_aggregate = server._route_nonces, server._aggregate
    server._route_nonces = route or honest_route
    server._aggregate = aggregate or honest_aggregate
    seen = {"replies": []}
    errors = {}
    try:
        messages = server.start(IDS, len(inputs[0]))
        while isinstance(messages, dict):
            replies = {}
            for cid, msg in sorted(messages.items()):
                try:
                    replies[cid] = clients[cid].step(msg, inputs[cid])
                except (TamperedMessageError, ProtocolError) as exc:
                    errors[cid] = exc
            seen["replies"].append(replies)
            if errors or not replies:
                break
            messages = server.step(replies)
    finally:
        server._route_nonces, server._aggregate = honest_route, honest_aggregate
        if session_id is not None:
            server._rand.bytes = real
    return seen["replies"], errors


def _restarted(backend, setup, clients, seed, *, keep_commitments=False):
    """The same clients after a restart: the same key material (``setup``), fresh roles
    (which no longer know the session ids they joined). ``keep_commitments``: each
    restored with the nonce it committed to (as a restarted agent's saved state holds),
    so a committed session opens; a role that keeps neither is
    tests/secure/test_ckks_committed_sessions.py's."""
    fresh = {c: backend.client(c, setup.for_client(c), seed=seed + 100) for c in clients}
    if keep_commitments:
        for c in clients:
            fresh[c].restore_committed_nonce(clients[c].committed_nonce())
    return fresh


def _ciphertexts(payload: bytes, committed: bool) -> bytes:
    """The ciphertext part of a client's reply carrying its input (a committed reply
    starts with the nonce of the client's next session)."""
    return payload[16:] if committed else payload


@MODES
@pytest.mark.parametrize("restart", [False, True])
def test_stale_aggregate_under_a_reused_session_id_is_refused(ckks_backend, restart, committed):
    server, clients, setup = _roles(ckks_backend, seed=1)
    first = random_inputs(4, 6, seed=1)
    recorded: dict = {}
    _, errors = _session(server, clients, first, aggregate=_record(recorded, server._aggregate))
    assert not errors
    old_session = server.session_id
    assert all(np.abs(clients[c].result - plain_sum(first)).max() <= 1e-8 for c in IDS)
    if restart:
        clients = _restarted(ckks_backend, setup, clients, seed=1, keep_commitments=committed)
    _set_mode(server, committed)
    second = random_inputs(4, 6, seed=2)
    # same session id, and the old aggregate handed out as the new sum
    replies, errors = _session(
        server,
        clients,
        second,
        session_id=old_session,
        aggregate=lambda payloads, **kw: recorded["out"],
    )
    assert server.session_id == old_session
    assert set(errors) == set(IDS)
    if restart:  # the binding: the old canaries do not match the new nonces
        assert all(e.round == 2 and "canaries" in str(e) for e in errors.values())
        # the clients did encrypt (in round 0 when committed): the check is the binding's
        assert len(replies) == (2 if committed else 3)
    else:  # the session id itself, before anything is encrypted
        assert all(e.round == 0 and "used before" in str(e) for e in errors.values())
        assert replies == [{}]
    assert all(clients[c].result is None for c in IDS)


@MODES
@pytest.mark.parametrize("restart", [False, True])
def test_a_ciphertext_from_another_session_is_refused(ckks_backend, restart, committed):
    # client 2's ciphertext of the last session in place of its new one (same id)
    server, clients, setup = _roles(ckks_backend, seed=3)
    recorded: dict = {}
    first = random_inputs(4, 6, seed=3)
    _, errors = _session(server, clients, first, aggregate=_record(recorded, server._aggregate))
    assert not errors
    old_session, old_ciphertext = server.session_id, recorded["in"][2]
    if restart:
        clients = _restarted(ckks_backend, setup, clients, seed=3, keep_commitments=committed)
    _set_mode(server, committed)
    honest = server._aggregate
    mixed = []

    def mixing(payloads, committed=False):
        # a committed reply keeps the client's fresh commitment, then the old ciphertexts
        head = payloads[2][:16] if committed else b""
        mixed.append(committed)
        return honest({**payloads, 2: head + old_ciphertext}, committed=committed)

    _, errors = _session(
        server, clients, random_inputs(4, 6, seed=4), session_id=old_session, aggregate=mixing
    )
    assert set(errors) == set(IDS)
    assert all(e.round == (2 if restart else 0) for e in errors.values())
    if restart:  # the old ciphertext reached the aggregate, in the session's mode
        assert mixed == [committed]
        assert all("canaries" in str(e) for e in errors.values())
    else:
        assert all("used before" in str(e) for e in errors.values())
    assert all(clients[c].result is None for c in IDS)


def test_a_replaced_nonce_is_refused(ckks_backend):
    # the server gives client 1 last session's nonce list, to repeat its binding
    server, clients, _ = _roles(ckks_backend, seed=5)
    recorded: dict = {}
    _, errors = _session(
        server,
        clients,
        random_inputs(4, 6, seed=5),
        route=_record(recorded, server._route_nonces),
    )
    assert not errors
    old_broadcast = recorded["out"][1]
    honest = server._route_nonces

    def replaying(payloads):
        out = honest(payloads)
        out[1] = old_broadcast
        return out

    # the nonce broadcast exists only in a three-round session: forget the commitments
    _set_mode(server, committed=False)
    _, errors = _session(server, clients, random_inputs(4, 6, seed=6), route=replaying)
    assert set(errors) == {1}
    assert errors[1].round == 1 and "replaced this client's session nonce" in str(errors[1])


def test_a_replaced_committed_nonce_is_refused(ckks_backend):
    # the committed counterpart: the opening gives client 1 last session's nonce in
    # place of the one it committed to, to repeat its binding
    server, clients, _ = _roles(ckks_backend, seed=5)
    recorded: dict = {}
    _, errors = _session(
        server,
        clients,
        random_inputs(4, 6, seed=5),
        route=_record(recorded, server._route_nonces),
    )
    assert not errors
    reader = PayloadReader(recorded["out"][1])
    old_nonces = {cid: reader.raw(16) for cid in reader.ids()}
    honest_begin = server._begin

    def replacing():
        tails = honest_begin()
        reader = PayloadReader(tails[1])
        key_id, mode, ids = reader.raw(16), reader.u32(), reader.ids()
        nonces = {cid: reader.raw(16) for cid in ids}
        reader.done()
        assert mode == 1  # a committed opening
        nonces[1] = old_nonces[1]
        writer = PayloadWriter().raw(key_id).u32(mode).ids(ids)
        for cid in ids:
            writer.raw(nonces[cid])
        return {**tails, 1: writer.getvalue()}

    _set_mode(server, committed=True)
    server._begin = replacing
    try:
        replies, errors = _session(server, clients, random_inputs(4, 6, seed=6))
    finally:
        del server._begin
    assert set(errors) == {1}
    assert errors[1].round == 0 and "committed" in str(errors[1])
    assert 1 not in replies[0] and clients[1].result is None


def _recording_openings(server, store: dict) -> None:
    """Make ``server``'s next openings land in ``store`` (``{cid: backend part}``)."""
    honest = server._begin

    def begin():
        tails = honest()
        store.update(tails)
        return tails

    server._begin = begin


@MODES
def test_nonces_differ_between_sessions_and_clients(ckks_backend, committed):
    # three-round: the nonces the server broadcasts; committed: the nonces the opening
    # carries (committed to in the session before)
    server, clients = make_roles(ckks_backend, IDS)  # OS randomness
    seen = []
    for seed in (7, 8, 9):
        if seed > 7:  # the first session has no commitments to use
            _set_mode(server, committed)
        recorded: dict = {}
        openings: dict = {}
        _recording_openings(server, openings)
        try:
            _, errors = _session(
                server,
                clients,
                random_inputs(4, 3, seed=seed),
                route=_record(recorded, server._route_nonces),
            )
        finally:
            del server._begin
        assert not errors
        if committed and seed > 7:
            assert "out" not in recorded  # no nonce round
            reader = PayloadReader(openings[0])
            reader.raw(16)  # the key id
            assert reader.u32() == 1  # committed
        else:
            reader = PayloadReader(recorded["out"][0])
        ids = reader.ids()
        seen += [reader.raw(16) for _ in ids]
    assert len(set(seen)) == len(seen) == 12


# --- a run resumed from a checkpoint with crypto_seed ---------------------------------
# The server knows every public seed (the run's ``seed``), not ``crypto_seed``, and
# colludes with no client; the resumed roles keep the checkpoint's key material.


def _drive(server, clients, inputs, *, route=None, aggregate=None, ids=IDS):
    """One session by hand; ``route``/``aggregate`` replace the server's handlers.
    Returns ``(recorded, errors)``: the honest handlers' inputs and outputs and each
    client's error."""
    recorded: dict = {}
    honest_route, honest_aggregate = server._route_nonces, server._aggregate

    def rec(name, honest, replacement):
        def wrapped(payloads, **kw):  # a committed session: ``committed=True``
            recorded[name + "_in"] = dict(payloads)
            out = (replacement or honest)(payloads, **kw)
            recorded[name + "_out"] = dict(out)
            return out

        return wrapped

    server._route_nonces = rec("route", honest_route, route)
    server._aggregate = rec("aggregate", honest_aggregate, aggregate)
    errors = {}
    try:
        messages = server.start(ids, len(inputs[ids[0]]))
        while isinstance(messages, dict):
            replies = {}
            for cid, msg in sorted(messages.items()):
                try:
                    replies[cid] = clients[cid].step(msg, inputs[cid])
                except SecureAggregationError as exc:
                    errors[cid] = exc
            if errors or not replies:
                break
            messages = server.step(replies)
    finally:
        server._route_nonces, server._aggregate = honest_route, honest_aggregate
    return recorded, errors


@pytest.mark.parametrize("committed", [False, True], ids=["three-round", "committed"])
def test_resumed_seeded_roles_refuse_a_stale_aggregate_under_the_old_session_id(
    ckks_backend, committed
):
    # committed: the session replayed is the run's second one, a committed session
    from botorch_fed.protocol.setup import FederationSetup

    setup = FederationSetup(
        problem="hartmann", dim=3, num_clients=4, aggregator="ckks", crypto_seed=CRYPTO_SEED
    )
    server, clients, material = run_roles(setup)
    first = random_inputs(4, 6, seed=11)
    recorded, errors = _drive(server, clients, first)
    assert not errors and "route_in" in recorded
    if committed:
        first = random_inputs(4, 6, seed=13)
        recorded, errors = _drive(server, clients, first)
        assert not errors and "route_in" not in recorded  # no nonce round
    old_session, old_aggregate = server.session_id, recorded["aggregate_out"]
    # the run is interrupted and resumed: the checkpoint holds the same key material; the
    # server reuses the old session id on purpose and hands out the old aggregate
    server, clients, _ = run_roles(setup, material)
    # resumed roles are fresh: no commitments on either side, a three-round session
    assert server.committed_nonces() == {}
    assert all(clients[c].committed_nonce() is None for c in IDS)
    real = server._rand.bytes
    server._rand.bytes = lambda n: old_session if n == 16 else real(n)
    second = random_inputs(4, 6, seed=12)
    _, errors = _drive(server, clients, second, aggregate=lambda payloads, **kw: old_aggregate)
    assert server.session_id == old_session
    stale = [c for c in IDS if c not in errors and clients[c].result is not None]
    accepted_stale = [
        c for c in stale if np.abs(clients[c].result - plain_sum(first)).max() <= 1e-8
    ]
    assert accepted_stale == [], f"clients {accepted_stale} accepted the old sum as new"


def test_nonces_are_fresh_across_a_restart_with_crypto_seed(ckks_backend):
    # every 16-byte value a client draws for a binding: the nonces of three-round
    # sessions and the commitments (of three-round and committed sessions)
    from botorch_fed.protocol.setup import FederationSetup

    setup = FederationSetup(
        problem="hartmann", dim=3, num_clients=4, aggregator="ckks", crypto_seed=CRYPTO_SEED
    )
    seen = []
    server, clients, material = run_roles(setup)
    for restart in range(2):
        if restart:
            server, clients, _ = run_roles(setup, material)
        for n in range(2):  # a three-round session, then a committed one
            recorded, errors = _drive(server, clients, random_inputs(4, 3, seed=2 * restart + n))
            assert not errors
            if n == 0:
                for p in recorded["route_in"].values():
                    seen += [bytes(p[:16]), bytes(p[16:])]  # nonce, commitment
            else:
                assert "route_in" not in recorded
                seen += [bytes(p[:16]) for p in recorded["aggregate_in"].values()]
    assert len(seen) == 24 and len(set(seen)) == len(seen)
