"""Clients fail closed: after a malformed, misrouted or unauthenticated frame of a
session, even the genuine frame is refused."""

from __future__ import annotations

import pytest

from botorch_fed.secure import ProtocolError, SecureAggregationError, get_backend
from tests.helpers.secure_roles import flip, make_roles, random_inputs

IDS = [0, 1, 2, 3]
SEED = 11


@pytest.fixture(scope="module")
def ckks_backend():
    return get_backend("ckks")


def _round_one(name, ckks_backend):
    backend = ckks_backend if name == "ckks" else get_backend(name)
    server, clients = make_roles(backend, IDS, seed=5)
    inputs = random_inputs(4, 3, seed=5)
    replies = {
        cid: clients[cid].step(msg, inputs[cid]) for cid, msg in server.start(IDS, 3).items()
    }
    out = server.step(replies)
    return clients, inputs, out


@pytest.mark.parametrize("name", ["masking", "ckks"])
@pytest.mark.parametrize(
    "damage",
    [
        lambda msg: flip(msg, -1),  # the MAC tag
        lambda msg: flip(msg, len(msg) // 2),  # the payload
        lambda msg: msg[:10],  # truncated: does not parse
        lambda msg: b"",  # nothing
    ],
    ids=["tag", "payload", "truncated", "empty"],
)
def test_a_genuine_frame_after_a_damaged_one_is_refused(name, damage, ckks_backend):
    clients, inputs, out = _round_one(name, ckks_backend)
    assert isinstance(out, dict), f"{name} has a second round"
    genuine = out[0]
    with pytest.raises(SecureAggregationError):
        clients[0].step(damage(genuine), inputs[0])
    with pytest.raises(ProtocolError, match="never joined"):
        clients[0].step(genuine, inputs[0])
    # the other clients, whose frames were intact, carry on
    assert clients[1].step(out[1], inputs[1])


@pytest.mark.parametrize("name", ["masking", "ckks"])
def test_a_frame_for_another_client_ends_the_session(name, ckks_backend):
    clients, inputs, out = _round_one(name, ckks_backend)
    assert isinstance(out, dict), f"{name} has a second round"
    with pytest.raises(SecureAggregationError):
        clients[0].step(out[1], inputs[0])  # client 1's frame, misrouted to client 0
    with pytest.raises(ProtocolError, match="never joined"):
        clients[0].step(out[0], inputs[0])


@pytest.mark.parametrize("name", ["plaintext", "masking", "ckks"])
@pytest.mark.parametrize("damage", ["payload", "misrouted"])
def test_a_damaged_opening_frame_spoils_its_session(name, damage, ckks_backend):
    # the first frame of a session fails a check: its genuine version is refused
    # afterwards too, and the sum of the client's previous session is gone
    backend = ckks_backend if name == "ckks" else get_backend(name)
    server, clients = make_roles(backend, IDS, seed=6)
    inputs = random_inputs(4, 3, seed=6)
    messages = server.start(IDS, 3)
    bad = flip(messages[0], len(messages[0]) // 2) if damage == "payload" else messages[1]
    with pytest.raises(SecureAggregationError):
        clients[0].step(bad, inputs[0])
    with pytest.raises(ProtocolError, match="used before"):
        clients[0].step(messages[0], inputs[0])
    assert clients[0].result is None


def _step(clients, messages, inputs):
    return {cid: clients[cid].step(msg, inputs[cid]) for cid, msg in sorted(messages.items())}


def test_a_bad_round0_frame_mid_session_ends_the_session():
    ids = [0, 1, 2, 3]
    server, clients = make_roles(get_backend("masking"), ids, seed=SEED)
    inputs = random_inputs(4, 3, seed=SEED)
    first = server.start(ids, 3)
    out = server.step(_step(clients, first, inputs))
    with pytest.raises(ProtocolError, match="addressed|used before"):
        clients[0].step(first[1], inputs[0])  # client 1's round-0 frame, misrouted
    with pytest.raises(ProtocolError, match="never joined"):
        clients[0].step(out[0], inputs[0])
