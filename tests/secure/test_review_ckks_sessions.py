"""Review (issue 14, CKKS sessions bound to client nonces): a malicious server.

The server knows every public seed (the run's ``seed``), not ``crypto_seed``, and
colludes with no client. These were strict xfails while a resumed run rebuilt its
roles from ``crypto_seed`` and so repeated its session ids, nonces and masks; a
resume now draws the roles' per-session randomness from the OS.
"""

from __future__ import annotations

import numpy as np
import pytest

from botorch_fed.secure import get_backend
from botorch_fed.secure.errors import SecureAggregationError
from tests.helpers.secure_roles import plain_sum, random_inputs

IDS = [0, 1, 2, 3]
CRYPTO_SEED = 5  # secret to the server (experiments only), unlike the run's seed


@pytest.fixture(scope="module")
def ckks_backend():
    return get_backend("ckks")


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


def test_resumed_seeded_roles_repeat_nonces_and_accept_a_stale_aggregate(ckks_backend):
    from botorch_fed.federation.runner import _secagg_roles
    from botorch_fed.federation.setup import FederationSetup

    setup = FederationSetup(
        problem="hartmann", dim=3, num_clients=4, aggregator="ckks", crypto_seed=CRYPTO_SEED
    )
    server, clients, material = _secagg_roles(setup, IDS)
    first = random_inputs(4, 6, seed=11)
    recorded, errors = _drive(server, clients, first)
    assert not errors
    old_session, old_aggregate = server.session_id, recorded["aggregate_out"]
    # the run is interrupted and resumed: the checkpoint holds the same key material; the
    # server reuses the old session id on purpose and hands out the old aggregate
    server, clients, _ = _secagg_roles(setup, IDS, material)
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
    from botorch_fed.federation.runner import _secagg_roles
    from botorch_fed.federation.setup import FederationSetup

    setup = FederationSetup(
        problem="hartmann", dim=3, num_clients=4, aggregator="ckks", crypto_seed=CRYPTO_SEED
    )
    seen = []
    server, clients, material = _secagg_roles(setup, IDS)
    for restart in range(2):
        if restart:
            server, clients, _ = _secagg_roles(setup, IDS, material)
        recorded, errors = _drive(server, clients, random_inputs(4, 3, seed=restart))
        assert not errors
        seen += [bytes(p) for p in recorded["route_in"].values()]
    assert len(set(seen)) == len(seen)


def test_masking_resumed_seeded_roles_reuse_their_masks():
    from botorch_fed.federation.runner import _secagg_roles
    from botorch_fed.federation.setup import FederationSetup
    from botorch_fed.secure import fixed_point

    from .helpers import drive

    ids = [0, 1, 2, 3, 4]
    setup = FederationSetup(
        problem="hartmann", dim=3, num_clients=5, aggregator="masking", crypto_seed=CRYPTO_SEED
    )

    def run(server, clients, inputs):
        store = {}
        honest = server._collect_masked

        def collect(payloads):
            store.update(payloads)
            return honest(payloads)

        server._collect_masked = collect
        drive(server, clients, inputs)
        from botorch_fed.secure.wire import PayloadReader

        return {c: PayloadReader(p).array("u", len(inputs[c])) for c, p in store.items()}

    server, clients, material = _secagg_roles(setup, ids)
    first = random_inputs(5, 6, seed=21)
    masked_first = run(server, clients, first)
    server, clients, _ = _secagg_roles(setup, ids, material)  # resumed
    second = random_inputs(5, 6, seed=22)
    masked_second = run(server, clients, second)
    victim = 2
    bits = clients[victim].backend.fraction_bits
    diff = masked_second[victim] - masked_first[victim]  # uint64, wraps
    expected = fixed_point.encode(second[victim], 5, bits) - fixed_point.encode(
        first[victim], 5, bits
    )
    assert not np.array_equal(diff, expected), "the server learnt x'_V - x_V exactly"
