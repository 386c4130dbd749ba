"""A malicious server mixing CKKS sessions.

The server chooses session ids. Canaries that depended only on (group key, session id,
client, chunk) would let a reused id mix ciphertexts across sessions or pass a stale
aggregate off as the new sum. A client refuses a session id it has joined before, and
every session is bound to a fresh nonce of each client: clients that restarted (and so
forgot the ids they joined) still refuse a replay. A run resumed from a checkpoint with
``crypto_seed`` draws its roles' per-session randomness from the OS, so it repeats no
session id or nonce of the run before it.
"""

from __future__ import annotations

import numpy as np
import pytest

from botorch_fed.secure import (
    ProtocolError,
    SecureAggregationError,
    TamperedMessageError,
    get_backend,
)
from botorch_fed.secure.wire import PayloadReader
from tests.helpers.secure_roles import make_roles, plain_sum, random_inputs, recording, run_roles

IDS = [0, 1, 2, 3]
CRYPTO_SEED = 5  # secret to the server (experiments only), unlike the run's seed


@pytest.fixture(scope="module")
def ckks_backend():
    return get_backend("ckks")


def _session(server, clients, inputs, *, session_id=None, route=None, aggregate=None):
    """One session driven by hand. ``session_id`` forces the server's id;
    ``route(payloads) -> {cid: payload}`` replaces the nonce broadcast and
    ``aggregate(payloads) -> {cid: payload}`` the aggregate. Returns the replies of
    every round and, per client, the error it raised (if any)."""
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


def _restarted(backend, clients, seed):
    """The same clients after a restart: the same key material, fresh roles (which
    no longer know the session ids they joined)."""
    setup = backend.setup(IDS, seed=seed)
    return {c: backend.client(c, setup.for_client(c), seed=seed + 100) for c in clients}


@pytest.mark.parametrize("restart", [False, True])
def test_stale_aggregate_under_a_reused_session_id_is_refused(ckks_backend, restart):
    server, clients = make_roles(ckks_backend, IDS, seed=1)
    first = random_inputs(4, 6, seed=1)
    recorded: dict = {}
    _session(server, clients, first, aggregate=recording(recorded, server._aggregate))
    old_session = server.session_id
    assert all(np.abs(clients[c].result - plain_sum(first)).max() <= 1e-8 for c in IDS)
    if restart:
        clients = _restarted(ckks_backend, clients, seed=1)
    second = random_inputs(4, 6, seed=2)
    # same session id, and the old aggregate handed out as the new sum
    _, errors = _session(
        server,
        clients,
        second,
        session_id=old_session,
        aggregate=lambda payloads: recorded["out"],
    )
    assert set(errors) == set(IDS)
    if restart:  # the binding: the old canaries do not match the new nonces
        assert all(e.round == 2 and "canaries" in str(e) for e in errors.values())
    else:  # the session id itself
        assert all(e.round == 0 and "used before" in str(e) for e in errors.values())
    assert all(clients[c].result is None for c in IDS)


@pytest.mark.parametrize("restart", [False, True])
def test_a_ciphertext_from_another_session_is_refused(ckks_backend, restart):
    # client 2's ciphertext of the last session in place of its new one (same id)
    server, clients = make_roles(ckks_backend, IDS, seed=3)
    recorded: dict = {}
    first = random_inputs(4, 6, seed=3)
    _session(server, clients, first, aggregate=recording(recorded, server._aggregate))
    old_session, old_ciphertext = server.session_id, recorded["in"][2]
    if restart:
        clients = _restarted(ckks_backend, clients, seed=3)
    honest = server._aggregate

    def mixing(payloads):
        return honest({**payloads, 2: old_ciphertext})

    _, errors = _session(
        server, clients, random_inputs(4, 6, seed=4), session_id=old_session, aggregate=mixing
    )
    assert set(errors) == set(IDS)
    assert all(e.round == (2 if restart else 0) for e in errors.values())


def test_a_replaced_nonce_is_refused(ckks_backend):
    # the server gives client 1 last session's nonce list, to repeat its binding
    server, clients = make_roles(ckks_backend, IDS, seed=5)
    recorded: dict = {}
    _session(
        server,
        clients,
        random_inputs(4, 6, seed=5),
        route=recording(recorded, server._route_nonces),
    )
    old_broadcast = recorded["out"][1]
    honest = server._route_nonces

    def replaying(payloads):
        out = honest(payloads)
        out[1] = old_broadcast
        return out

    _, errors = _session(server, clients, random_inputs(4, 6, seed=6), route=replaying)
    assert set(errors) == {1}
    assert errors[1].round == 1 and "replaced this client's session nonce" in str(errors[1])


def test_nonces_differ_between_sessions_and_clients(ckks_backend):
    server, clients = make_roles(ckks_backend, IDS)  # OS randomness
    seen = []
    for seed in (7, 8):
        recorded: dict = {}
        _session(
            server,
            clients,
            random_inputs(4, 3, seed=seed),
            route=recording(recorded, server._route_nonces),
        )
        reader = PayloadReader(recorded["out"][0])
        ids = reader.ids()
        seen += [reader.raw(16) for _ in ids]
    assert len(set(seen)) == len(seen) == 8


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
        def wrapped(payloads):
            recorded[name + "_in"] = dict(payloads)
            out = (replacement or honest)(payloads)
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


def test_resumed_seeded_roles_refuse_a_stale_aggregate_under_the_old_session_id(ckks_backend):
    from botorch_fed.protocol.setup import FederationSetup

    setup = FederationSetup(
        problem="hartmann", dim=3, num_clients=4, aggregator="ckks", crypto_seed=CRYPTO_SEED
    )
    server, clients, material = run_roles(setup)
    first = random_inputs(4, 6, seed=11)
    recorded, errors = _drive(server, clients, first)
    assert not errors
    old_session, old_aggregate = server.session_id, recorded["aggregate_out"]
    # the run is interrupted and resumed: the checkpoint holds the same key material; the
    # server reuses the old session id on purpose and hands out the old aggregate
    server, clients, _ = run_roles(setup, material)
    real = server._rand.bytes
    server._rand.bytes = lambda n: old_session if n == 16 else real(n)
    second = random_inputs(4, 6, seed=12)
    _, errors = _drive(server, clients, second, aggregate=lambda payloads: old_aggregate)
    assert server.session_id == old_session
    stale = [c for c in IDS if c not in errors and clients[c].result is not None]
    accepted_stale = [
        c for c in stale if np.abs(clients[c].result - plain_sum(first)).max() <= 1e-8
    ]
    assert accepted_stale == [], f"clients {accepted_stale} accepted the old sum as new"


def test_nonces_are_fresh_across_a_restart_with_crypto_seed(ckks_backend):
    from botorch_fed.protocol.setup import FederationSetup

    setup = FederationSetup(
        problem="hartmann", dim=3, num_clients=4, aggregator="ckks", crypto_seed=CRYPTO_SEED
    )
    seen = []
    server, clients, material = run_roles(setup)
    for restart in range(2):
        if restart:
            server, clients, _ = run_roles(setup, material)
        recorded, errors = _drive(server, clients, random_inputs(4, 3, seed=restart))
        assert not errors
        seen += [bytes(p) for p in recorded["route_in"].values()]
    assert len(set(seen)) == len(seen)
