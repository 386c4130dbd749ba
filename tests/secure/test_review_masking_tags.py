"""Review of the masking backend's pairwise HMAC tags (commits eb2e20f, 681fa58), from
the point of view of a malicious server colluding with fewer than M/3 clients.

What held is kept here as plain tests: every low-order encoding of a static key is
refused (``cryptography`` raises on an all-zero X25519 output), a peer's static key
re-encoded by a colluder passes the byte-level duplicate check but gives the colluder
no key it can use (the pair-MAC labels name both ids and both encodings), the tagged
messages are injective across rounds, directions, sessions and list lengths, tags are
compared in constant time, the endorser count includes the verifying client exactly
(``max(t, min_clients)``, as the t-signature condition did), and the round-4 endorser
list is parsed strictly by the client.
"""

from __future__ import annotations

import hmac

import numpy as np
import pytest

from botorch_fed.secure import (
    ProtocolError,
    SecureAggregationError,
    TamperedMessageError,
    TooFewClientsError,
    crypto,
    get_backend,
)
from botorch_fed.secure.crypto import ed25519_sign, mac_tag, mac_verify
from botorch_fed.secure.masking import _keys_message, _static_key_message, _survivors_message
from botorch_fed.secure.wire import PayloadWriter
from tests.helpers.secure_roles import (
    make_roles,
    masking_material,
    masking_reply_tags,
    plain_sum,
    random_inputs,
    write_masking_endorsements,
    write_masking_material,
)

_P = 2**255 - 19
_LOW_ORDER = [
    0,
    1,
    325606250916557431795983626356110631294008115727848805560023387167927233504,
    39382357235489614581723060781553021112529911719440698176882885853963445705823,
    _P - 1,
    _P,
    _P + 1,
]


def _session(server, clients, inputs):
    ids = sorted(inputs)
    messages = server.start(ids, len(inputs[ids[0]]))
    for rnd in range(len(server.backend.rounds)):
        replies, errors = {}, {}
        for cid, msg in sorted(messages.items()):
            try:
                replies[cid] = clients[cid].step(msg, inputs[cid])
            except SecureAggregationError as exc:
                errors[cid] = exc
        if errors:
            return rnd, errors, None
        out = server.step(replies)
        if not isinstance(out, dict):
            return rnd, {}, out
        messages = out
    raise AssertionError("the session did not finish")


def _directory_with_static(ids, victim_entry: int, static_pk: bytes, seed=31):
    setup = get_backend("masking").setup(ids, seed=seed)
    parts = masking_material(setup.for_client(0))
    signing = masking_material(setup.for_client(victim_entry))["signing"]
    parts["directory"][victim_entry][1] = static_pk
    parts["directory"][victim_entry][2] = ed25519_sign(
        signing, _static_key_message(victim_entry, static_pk)
    )
    return setup, parts


@pytest.mark.parametrize("top_bit", [0, 1])
@pytest.mark.parametrize("u", _LOW_ORDER, ids=range(len(_LOW_ORDER)))
def test_every_low_order_static_key_encoding_is_refused(u, top_bit):
    # a colluder signs a (possibly non-canonical) low-order point as its static key
    low = (u + (top_bit << 255)).to_bytes(32, "little")
    _, parts = _directory_with_static([0, 1, 2, 3], 2, low)
    with pytest.raises(SecureAggregationError, match="not a usable") as info:
        get_backend("masking").client(0, write_masking_material(parts))
    assert info.value.client_id == 2


def test_a_re_encoded_peer_static_key_gives_the_colluder_no_usable_key():
    # colluder 2 lists honest client 1's static key with the top bit set (same point,
    # different bytes): the duplicate check compares bytes, so the directory passes,
    # but the key 0 derives "from 2" is neither 0's key with 1 nor computable by 2
    ids = [0, 1, 2, 3]
    setup = get_backend("masking").setup(ids, seed=32)
    static_1 = masking_material(setup.for_client(0))["directory"][1][1]
    re_encoded = static_1[:31] + bytes([static_1[31] | 0x80])
    assert re_encoded != static_1
    _, parts = _directory_with_static(ids, 2, re_encoded, seed=32)
    role = get_backend("masking").client(0, write_masking_material(parts))
    keys = {*role._receive_keys.values(), *role._send_keys.values()}
    assert len(keys) == 2 * (len(ids) - 1)  # every direction of every pair distinct
    # a tag 1 made for 0 does not verify as 2's tag to 0
    session = bytes(range(16))
    c_pk, s_pk = bytes(32), bytes(range(32))
    honest = masking_material(setup.for_client(1))
    role_1 = get_backend("masking").client(1, setup.for_client(1))
    assert honest["directory"][1][1] == static_1
    tag = mac_tag(role_1._send_keys[0], _keys_message(session, 1, 0, c_pk, s_pk, b""))
    assert mac_verify(role._receive_keys[1], tag, _keys_message(session, 1, 0, c_pk, s_pk, b""))
    assert not mac_verify(role._receive_keys[2], tag, _keys_message(session, 2, 0, c_pk, s_pk, b""))


def test_tagged_messages_are_injective():
    s1, s2 = bytes(16), bytes([1]) * 16
    pk_a, pk_b, t = bytes([2]) * 32, bytes([3]) * 32, bytes([4]) * 32
    d = bytes([5]) * 32
    messages = [
        _keys_message(s1, 1, 2, pk_a, pk_b, t),
        _keys_message(s1, 2, 1, pk_a, pk_b, t),  # reflection
        _keys_message(s2, 1, 2, pk_a, pk_b, t),  # other session
        _keys_message(s1, 1, 2, pk_b, pk_a, t),  # swapped keys
        _keys_message(s1, 1, 2, pk_a, pk_b, b""),  # no transcript
        _survivors_message(s1, 1, 2, (1, 2, 3), d, t),
        _survivors_message(s1, 2, 1, (1, 2, 3), d, t),
        _survivors_message(s1, 1, 2, (1, 2), d, t),
        _survivors_message(s1, 1, 2, (1, 2, 3), d, b""),
        _survivors_message(s1, 1, 2, (1, 2, 3, 4), d[:28], t),  # length shift
    ]
    assert len(set(messages)) == len(messages)
    # round-0 and round-3 messages carry different purposes from their first bytes on
    assert all(k.startswith(b"botorch-fed/masking/r0/keys\x00") for k in messages[:5])
    assert all(m.startswith(b"botorch-fed/masking/r3/survivors\x00") for m in messages[5:])


def test_tags_are_compared_in_constant_time(monkeypatch):
    calls = []
    original = hmac.compare_digest

    def spy(a, b):
        calls.append((a, b))
        return original(a, b)

    monkeypatch.setattr(crypto.hmac, "compare_digest", spy)
    key = bytes(32)
    assert mac_verify(key, mac_tag(key, b"m"), b"m")
    assert not mac_verify(key, bytes(32), b"m")
    assert not mac_verify(key, bytes(31), b"m")  # wrong length: refused, no compare
    assert len(calls) == 2


def _route_u4(server, build):
    def route(payloads):
        tags = {u: masking_reply_tags(payloads[u]) for u in payloads}
        u4, out = build(sorted(payloads), tags)
        server.u4 = u4
        return out

    server._route_tags = route


@pytest.mark.parametrize("size_offset", [-1, 0])
def test_endorser_count_includes_the_client_itself_exactly(size_offset):
    ids = list(range(7))  # t = 5
    server, clients = make_roles(get_backend("masking"), ids, seed=33)
    inputs = random_inputs(7, 3, seed=33)
    need = 5

    def build(senders, tags):
        u4 = senders[: need + size_offset]
        out = {v: write_masking_endorsements(v, {u: tags[u][v] for u in u4 if u != v}) for v in u4}
        return tuple(u4), out

    _route_u4(server, build)
    rnd, errors, result = _session(server, clients, inputs)
    if size_offset < 0:
        assert (
            rnd == 4 and errors and all(isinstance(e, TooFewClientsError) for e in errors.values())
        )
    else:
        assert not errors
        np.testing.assert_allclose(result, plain_sum(inputs), atol=1e-8)


@pytest.mark.parametrize("change", ["duplicate member", "outsider", "extra tag"])
def test_client_parses_the_endorser_list_strictly(change):
    ids = list(range(5))
    server, clients = make_roles(get_backend("masking"), ids, seed=34)
    inputs = random_inputs(5, 3, seed=34)

    def build(senders, tags):
        out = {}
        for v in senders:
            others = [u for u in senders if u != v]
            u4 = list(senders)
            pairs = [(u, tags[u][v]) for u in others]
            if change == "duplicate member":
                u4 = sorted([*u4, others[0]])
                pairs = [(others[0], tags[others[0]][v]), *pairs]
                pairs.sort()
            elif change == "outsider":
                u4 = sorted([*u4, 99])
                pairs = sorted([*pairs, (99, bytes(32))])
            w = PayloadWriter().ids(tuple(u4))
            for _, tag in pairs:
                w.raw(tag)
            if change == "extra tag":
                w.raw(bytes(32))
            out[v] = w.getvalue()
        return tuple(senders), out

    _route_u4(server, build)
    rnd, errors, _ = _session(server, clients, inputs)
    assert rnd == 4 and set(errors) == set(ids)
    assert all(isinstance(e, ProtocolError | TamperedMessageError) for e in errors.values())
