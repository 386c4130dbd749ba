"""The masking backend's pairwise tags (HMAC-SHA256 under long-term keys from static
X25519 agreements whose public keys the clients' Ed25519 identities sign).

They replaced per-session Ed25519 signatures on the advertised keys (round 0) and on
the consistency message (round 3); the tests check that what signatures stopped, tags
stop too: a server that forges, substitutes, misroutes, reflects or replays a tag, a
colluding client that forges a third client's tag to a fourth, a directory whose static
key is not vouched for by its client's identity, and material of the earlier format
without static keys. Each attack is mounted by a patched server role (frames validly
sealed) and must end with a named error before the victim's secrets are revealed.

Against a server colluding with fewer than M/3 clients: every low-order encoding of a
static key is refused (``cryptography`` raises on an all-zero X25519 output), a peer's
static key re-encoded by a colluder passes the byte-level duplicate check but gives the
colluder no key it can use (the pair-MAC labels name both ids and both encodings), a
directory listing one public key for several clients is refused, the tagged messages
are injective across rounds, directions, sessions and list lengths, tags are compared
in constant time, the endorser count includes the verifying client exactly
(``max(t, min_clients)``, as the t-signature condition did), and the round-4 endorser
list is parsed strictly by the client.
"""

from __future__ import annotations

import hmac

import pytest

from botorch_fed.secure import (
    ConfigurationError,
    KeyMismatchError,
    ProtocolError,
    SecureAggregationError,
    TamperedMessageError,
    TooFewClientsError,
    crypto,
    get_backend,
    masking_identity,
)
from botorch_fed.secure import masking as masking_module
from botorch_fed.secure.crypto import (
    RandomSource,
    ed25519_public,
    ed25519_sign,
    hkdf,
    mac_tag,
    mac_verify,
    x25519_keypair,
    x25519_private_from_bytes,
    x25519_shared,
)
from botorch_fed.secure.masking_derivations import (
    _keys_message,
    _pair_mac_key,
    _static_key_message,
    _survivors_message,
)
from botorch_fed.secure.wire import PayloadReader, PayloadWriter
from tests.helpers.secure_roles import (
    make_roles,
    masking_keys,
    masking_material,
    masking_reply_tags,
    plain_sum,
    random_inputs,
    write_masking_endorsements,
    write_masking_keys,
    write_masking_material,
)
from tests.helpers.secure_sum_bounds import assert_sum_close


def _session(server, clients, inputs, *, dropped=None):
    """Step every addressed client each round (``dropped``: ``{cid: replies before it
    stops}``); stop at the first round in which some client refuses.

    Returns:
        ``(round, {cid: error}, result)``: the result is the sum, or None after an error.
    """
    dropped = dropped or {}
    sent = dict.fromkeys(inputs, 0)
    ids = sorted(inputs)
    messages = server.start(ids, len(inputs[ids[0]]))
    for rnd in range(len(server.backend.rounds)):
        replies, errors = {}, {}
        for cid, msg in sorted(messages.items()):
            if sent[cid] >= dropped.get(cid, 99):
                continue
            try:
                replies[cid] = clients[cid].step(msg, inputs[cid])
                sent[cid] += 1
            except SecureAggregationError as exc:
                errors[cid] = exc
        if errors:
            return rnd, errors, None
        out = server.step(replies)
        if not isinstance(out, dict):
            return rnd, {}, out
        messages = out
    raise AssertionError("the session did not finish")


# --- the honest case ------------------------------------------------------------------
@pytest.mark.parametrize(
    ("n", "dropped"),
    [(3, {}), (5, {}), (10, {}), (7, {1: 2}), (10, {3: 3, 8: 2}), (10, {0: 1})],
)
def test_sums_equal_the_reference_sum(n, dropped):
    ids = list(range(n))
    server, clients = make_roles(get_backend("masking"), ids, seed=n)
    for session in range(2):  # the long-term keys serve every session of the roles
        inputs = random_inputs(n, 17, seed=10 * n + session)
        _, errors, total = _session(server, clients, inputs, dropped=dropped)
        assert not errors
        # a client that dropped after sending its masked input (3 replies) still counts
        contributors = [c for c in ids if dropped.get(c, 99) >= 3]
        assert server.contributors == tuple(contributors)
        assert_sum_close(total, plain_sum(inputs, contributors), "masking", inputs, contributors)


def test_identities_are_checked_once_per_role_not_per_session(monkeypatch):
    """No Ed25519 operation and no static agreement in a session: the directory's
    signatures are verified (and the MAC keys derived) when a role is created."""
    calls = {"verify": 0}
    honest = masking_identity.ed25519_verify

    def counting(*args):
        calls["verify"] += 1
        return honest(*args)

    monkeypatch.setattr(masking_identity, "ed25519_verify", counting)
    ids = list(range(6))
    server, clients = make_roles(get_backend("masking"), ids, seed=1)
    assert calls["verify"] == len(ids) ** 2  # every role checks every directory entry
    assert all(set(c._receive_keys) == set(ids) - {c.client_id} for c in clients.values())
    calls["verify"] = 0
    monkeypatch.setattr(masking_module, "ed25519_sign", None)  # would fail if called
    for session in range(2):
        _, errors, total = _session(server, clients, random_inputs(6, 4, seed=session))
        assert not errors and total is not None
    assert calls["verify"] == 0


def test_both_directions_of_a_pair_have_their_own_key():
    ids = [0, 1, 2]
    _, clients = make_roles(get_backend("masking"), ids, seed=2)
    a, b = clients[0], clients[1]
    assert a._send_keys[1] == b._receive_keys[0] and b._send_keys[0] == a._receive_keys[1]
    assert a._send_keys[1] != a._receive_keys[1]
    keys = [k for c in clients.values() for k in c._send_keys.values()]
    assert len(set(keys)) == len(ids) * (len(ids) - 1)


# --- what is tagged, and how tags are compared ----------------------------------------
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


# --- the server forges or moves tags ------------------------------------------------------
VICTIM = 2


def _forge_keys(server, clients, mode):
    """Patch the server's round-1 routing: every recipient but the victim gets the
    victim's keys with a tag the victim did not make for it."""
    honest = server._route_keys
    fake = (x25519_keypair(RandomSource(9, 1))[1], x25519_keypair(RandomSource(9, 2))[1])

    def route(payloads):
        sent = {u: masking_reply_tags(p, skip_keys=True) for u, p in payloads.items()}
        out = {}
        for r, payload in honest(payloads).items():
            u1, keys = masking_keys(payload, r)
            if r != VICTIM:
                if mode == "random tag":
                    keys[VICTIM][2] = RandomSource(9, 3, r).bytes(32)
                elif mode == "substituted keys, server's own tag":
                    keys[VICTIM][:2] = fake
                    # over the recipient's own transcript (the server knows what it told)
                    transcript = clients[r]._transcript
                    message = _keys_message(server.session_id, VICTIM, r, *fake, transcript)
                    keys[VICTIM][2] = mac_tag(RandomSource(9, 4).bytes(32), message)
                elif mode == "substituted keys, victim's tag":
                    keys[VICTIM][:2] = fake
                elif mode == "tag addressed to another client":
                    other = next(w for w in u1 if w not in (r, VICTIM))
                    keys[VICTIM][2] = sent[VICTIM][other]
                elif mode == "recipient's own tag reflected":
                    # the recipient's own keys and its own tag to the victim, presented
                    # as the victim's keys and tag to it
                    keys[VICTIM][:2] = keys[r][:2]
                    keys[VICTIM][2] = sent[r][VICTIM]
            out[r] = write_masking_keys(u1, keys)
        return out

    server._route_keys = route


@pytest.mark.parametrize(
    "mode",
    [
        "random tag",
        "substituted keys, server's own tag",
        "substituted keys, victim's tag",
        "tag addressed to another client",
        "recipient's own tag reflected",
    ],
)
def test_server_forged_key_tags_are_refused(mode):
    ids = list(range(5))
    server, clients = make_roles(get_backend("masking"), ids, seed=3)
    _forge_keys(server, clients, mode)
    rnd, errors, _ = _session(server, clients, random_inputs(5, 4, seed=3))
    assert rnd == 1 and set(errors) == set(ids) - {VICTIM}
    for cid, exc in errors.items():
        assert isinstance(exc, KeyMismatchError), exc
        assert exc.client_id == cid and exc.round == 1
        assert f"for client {VICTIM} carry no valid tag" in str(exc)


def _stop_before_reveal(server, forge):
    """Patch the server's round-4 routing: ``forge(r, tags_to_r, tags)`` returns what
    recipient ``r`` gets (``tags``: every round-3 reply, ``{sender: {recipient: tag}}``)."""

    def route(payloads):
        tags = {u: masking_reply_tags(p) for u, p in payloads.items()}
        out = {}
        for r in payloads:
            to_r = forge(r, {u: tags[u][r] for u in payloads if r in tags[u]}, tags)
            out[r] = write_masking_endorsements(r, to_r)
        return out

    server._route_tags = route


@pytest.mark.parametrize("mode", ["random tag", "tag addressed to another client", "reflected"])
def test_server_forged_consistency_tags_are_refused(mode):
    ids = list(range(5))
    server, clients = make_roles(get_backend("masking"), ids, seed=4)

    def forge(r, to_r, tags):
        if r == VICTIM:
            return to_r
        if mode == "random tag":
            to_r[VICTIM] = RandomSource(4, r).bytes(32)
        elif mode == "tag addressed to another client":
            other = next(w for w in ids if w not in (r, VICTIM))
            to_r[VICTIM] = tags[VICTIM][other]
        else:  # r's own endorsement to the victim, as the victim's to r
            to_r[VICTIM] = tags[r][VICTIM]
        return to_r

    _stop_before_reveal(server, forge)
    rnd, errors, _ = _session(server, clients, random_inputs(5, 4, seed=5))
    assert rnd == 4 and set(errors) == set(ids) - {VICTIM}
    for cid, exc in errors.items():
        assert isinstance(exc, TamperedMessageError), exc
        assert exc.client_id == cid and exc.round == 4
        assert f"consistency check failed: client {VICTIM}'s tag" in str(exc)


# --- tags of another session or round ---------------------------------------------------
def test_consistency_tags_of_an_earlier_session_are_refused():
    ids = list(range(5))
    server, clients = make_roles(get_backend("masking"), ids, seed=6)
    old: dict[int, dict[int, bytes]] = {}
    honest = server._route_tags

    def keep(payloads):
        old.update({u: masking_reply_tags(p) for u, p in payloads.items()})
        return honest(payloads)

    server._route_tags = keep
    _, errors, _ = _session(server, clients, random_inputs(5, 4, seed=6))
    assert not errors
    server._route_tags = honest
    _stop_before_reveal(server, lambda r, to_r, tags: {u: old[u][r] for u in to_r})
    rnd, errors, _ = _session(server, clients, random_inputs(5, 4, seed=7))
    assert rnd == 4 and set(errors) == set(ids)
    assert all("consistency check failed" in str(e) for e in errors.values())


def test_key_tag_presented_as_a_consistency_tag_is_refused():
    # the same pair, the same session: only the round's purpose label differs
    ids = list(range(5))
    server, clients = make_roles(get_backend("masking"), ids, seed=8)
    key_tags: dict[int, dict[int, bytes]] = {}
    honest_keys = server._route_keys

    def keep(payloads):
        key_tags.update({u: masking_reply_tags(p, skip_keys=True) for u, p in payloads.items()})
        return honest_keys(payloads)

    server._route_keys = keep
    _stop_before_reveal(
        server, lambda r, to_r, tags: to_r if r == VICTIM else {**to_r, VICTIM: key_tags[VICTIM][r]}
    )
    rnd, errors, _ = _session(server, clients, random_inputs(5, 4, seed=8))
    assert rnd == 4 and set(errors) == set(ids) - {VICTIM}
    assert all(f"client {VICTIM}'s tag" in str(e) for e in errors.values())


def test_consistency_tag_presented_as_a_key_tag_is_refused():
    # last session's round-3 tag of the victim, offered with its keys of this session
    ids = list(range(5))
    server, clients = make_roles(get_backend("masking"), ids, seed=9)
    old: dict[int, dict[int, bytes]] = {}
    honest_tags = server._route_tags

    def keep(payloads):
        old.update({u: masking_reply_tags(p) for u, p in payloads.items()})
        return honest_tags(payloads)

    server._route_tags = keep
    assert not _session(server, clients, random_inputs(5, 4, seed=9))[1]
    honest_keys = server._route_keys

    def route(payloads):
        out = {}
        for r, payload in honest_keys(payloads).items():
            u1, keys = masking_keys(payload, r)
            if r != VICTIM:
                keys[VICTIM][2] = old[VICTIM][r]
            out[r] = write_masking_keys(u1, keys)
        return out

    server._route_keys = route
    rnd, errors, _ = _session(server, clients, random_inputs(5, 4, seed=10))
    assert rnd == 1 and set(errors) == set(ids) - {VICTIM}
    assert all(isinstance(e, KeyMismatchError) for e in errors.values())


def test_key_tags_of_an_earlier_session_are_refused():
    ids = list(range(5))
    server, clients = make_roles(get_backend("masking"), ids, seed=12)
    old: dict = {}
    honest = server._route_keys

    def keep(payloads):
        out = honest(payloads)
        old.update({r: masking_keys(p, r)[1] for r, p in out.items()})
        return out

    server._route_keys = keep
    assert not _session(server, clients, random_inputs(5, 4, seed=12))[1]

    def replay(payloads):
        out = {}
        for r, payload in honest(payloads).items():
            u1, keys = masking_keys(payload, r)
            if r != VICTIM:
                keys[VICTIM] = old[r][VICTIM]  # keys and tag of the last session
            out[r] = write_masking_keys(u1, keys)
        return out

    server._route_keys = replay
    rnd, errors, _ = _session(server, clients, random_inputs(5, 4, seed=13))
    assert rnd == 1 and set(errors) == set(ids) - {VICTIM}
    assert all(isinstance(e, KeyMismatchError) for e in errors.values())


# --- a client colluding with the server ------------------------------------------------
COLLUDER, TARGET = 6, 0


def _colluding_roles(n=7, seed=14):
    """Roles of ``n`` clients; the server also holds everything ``COLLUDER`` holds."""
    backend = get_backend("masking")
    setup = backend.setup(list(range(n)), seed=seed)
    server = backend.server(setup.server_material, seed=seed)
    clients = {c: backend.client(c, setup.for_client(c), seed=seed) for c in range(n)}
    return server, clients, masking_material(setup.for_client(COLLUDER))


def _forgeries(colluder, material: dict, u: int, v: int, message: bytes) -> list[bytes]:
    """Tags from ``u`` to ``v`` over ``message`` that the colluder can compute from all
    it holds: each of its own pairwise keys, and the key derivation applied to its own
    static agreements, its federation key and the (public) static keys."""
    assert colluder.client_id not in (u, v)
    pk = {w: static for w, (_, static) in colluder._directory.items()}
    static_private = x25519_private_from_bytes(material["static"])
    keys = [*colluder._send_keys.values(), *colluder._receive_keys.values()]
    for secret in (
        x25519_shared(static_private, pk[u]),
        x25519_shared(static_private, pk[v]),
        material["federation"],
        hkdf(pk[u] + pk[v], b"public data only"),
    ):
        keys.append(_pair_mac_key(secret, u, v, pk[u], pk[v]))
    return [mac_tag(k, message) for k in keys]


N_FORGERIES = 2 * 6 + 4


def test_a_colluding_client_cannot_forge_a_key_tag_of_a_third_client():
    server, clients, material = _colluding_roles()
    honest = server._route_keys
    fake = (x25519_keypair(RandomSource(15, 1))[1], x25519_keypair(RandomSource(15, 2))[1])
    outcomes = []
    for index in range(N_FORGERIES):

        def route(payloads, index=index):
            out = honest(payloads)
            u1, keys = masking_keys(out[TARGET], TARGET)
            transcript = clients[TARGET]._transcript
            message = _keys_message(server.session_id, VICTIM, TARGET, *fake, transcript)
            forgeries = _forgeries(clients[COLLUDER], material, VICTIM, TARGET, message)
            assert len(forgeries) == N_FORGERIES
            keys[VICTIM] = [*fake, forgeries[index]]
            out[TARGET] = write_masking_keys(u1, keys)
            return out

        server._route_keys = route
        outcomes.append(_session(server, clients, random_inputs(7, 4, seed=index)))
    for rnd, errors, _ in outcomes:
        assert rnd == 1 and set(errors) == {TARGET}
        assert isinstance(errors[TARGET], KeyMismatchError)
        assert f"for client {VICTIM} carry no valid tag" in str(errors[TARGET])


def test_a_colluding_client_cannot_forge_an_endorsement_of_a_third_client():
    """The inconsistent-survivor-list attack with one colluder: the target is shown a list
    without the victim (it would reveal the victim's mask-key share) and every
    endorsement of that list it lacks is forged from what the colluder holds (the
    colluder endorses it as itself, which it may)."""
    server, clients, material = _colluding_roles()
    ids = list(range(7))
    without = tuple(v for v in ids if v != VICTIM)
    honest_collect = server._collect_masked

    def split(payloads):
        honest_collect(payloads)
        out = {v: PayloadWriter().ids(tuple(ids)).getvalue() for v in ids if v != TARGET}
        out[TARGET] = PayloadWriter().ids(without).getvalue()
        return out

    outcomes = []
    for index in range(N_FORGERIES):

        def forge(r, to_r, tags, index=index):
            if r != TARGET:
                return to_r
            target, out = clients[TARGET], {}
            for u in without:
                if u == TARGET:
                    continue
                message = _survivors_message(
                    server.session_id, u, TARGET, without, target._u1_digest, target._transcript
                )
                if u == COLLUDER:
                    out[u] = mac_tag(clients[COLLUDER]._send_keys[TARGET], message)
                else:
                    out[u] = _forgeries(clients[COLLUDER], material, u, TARGET, message)[index]
            return out

        server._collect_masked = split
        _stop_before_reveal(server, forge)
        outcomes.append(_session(server, clients, random_inputs(7, 4, seed=index)))
        del server._route_tags, server._collect_masked
    for rnd, errors, _ in outcomes:
        assert rnd == 4 and TARGET in errors
        assert isinstance(errors[TARGET], TamperedMessageError)
        assert "consistency check failed" in str(errors[TARGET])


# --- the directory and the material --------------------------------------------------------
def _material(ids, seed=16):
    setup = get_backend("masking").setup(ids, seed=seed)
    return setup, masking_material(setup.for_client(0))


@pytest.mark.parametrize(
    "change", ["flipped signature", "substituted static key", "signed by another identity"]
)
def test_directory_with_a_bad_static_key_signature_is_refused(change):
    ids = [0, 1, 2, 3]
    setup, parts = _material(ids)
    entry = parts["directory"][2]
    if change == "flipped signature":
        entry[2] = entry[2][:5] + bytes([entry[2][5] ^ 1]) + entry[2][6:]
    elif change == "substituted static key":  # the server's key, client 2's old signature
        entry[1] = x25519_keypair(RandomSource(17, 0))[1]
    else:  # client 3's identity vouches for the key listed for client 2
        signing_3 = masking_material(setup.for_client(3))["signing"]
        entry[2] = ed25519_sign(signing_3, _static_key_message(2, entry[1]))
    with pytest.raises(KeyMismatchError, match="static key of client 2 carries no valid") as info:
        get_backend("masking").client(0, write_masking_material(parts))
    assert info.value.client_id == 2


def test_directory_with_an_unusable_static_key_is_refused():
    # client 2 itself signed a low-order point: no key agreement with it is secret
    ids = [0, 1, 2, 3]
    setup, parts = _material(ids)
    signing_2 = masking_material(setup.for_client(2))["signing"]
    low_order = bytes(32)
    parts["directory"][2][1] = low_order
    parts["directory"][2][2] = ed25519_sign(signing_2, _static_key_message(2, low_order))
    with pytest.raises(KeyMismatchError, match="static key of client 2 is not a usable") as info:
        get_backend("masking").client(0, write_masking_material(parts))
    assert info.value.client_id == 2


def test_directory_whose_own_static_key_is_not_this_clients_is_refused():
    _, parts = _material([0, 1, 2])
    parts["static"] = RandomSource(18, 0).bytes(32)
    with pytest.raises(ConfigurationError, match="static key is not this client's"):
        get_backend("masking").client(0, write_masking_material(parts))


def test_material_without_static_keys_is_refused_by_name():
    ids = [0, 1, 2]
    _, parts = _material(ids)
    # the earlier format: signing key, ids, one Ed25519 public key each, federation key
    writer = PayloadWriter().raw(parts["signing"]).ids(tuple(ids))
    for entry in parts["directory"].values():
        writer.raw(entry[0])
    old = writer.raw(parts["federation"]).getvalue()
    assert ed25519_public(parts["signing"]) == parts["directory"][0][0]
    with pytest.raises(ConfigurationError, match="earlier format, without static key"):
        get_backend("masking").client(0, old)
    # the new tag in front of the old layout is not accepted either
    with pytest.raises(ConfigurationError, match="malformed identity material"):
        get_backend("masking").client(0, parts["tag"] + old)
    with pytest.raises(ConfigurationError, match="malformed identity material"):
        get_backend("masking").client(0, old[:-1])


def test_federation_secret_is_unchanged_by_the_static_keys():
    ids = [0, 1, 2]
    setup, parts = _material(ids)
    roles = [get_backend("masking").client(c, setup.for_client(c)) for c in ids]
    expected = hkdf(parts["federation"], crypto.label("masking/federation-secret", b""))
    assert {r.federation_secret() for r in roles} == {expected}


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


def test_directory_with_a_duplicated_public_key_is_refused():
    backend = get_backend("masking")
    ids = [0, 1, 2, 3]
    parts = masking_material(backend.setup(ids, seed=5).for_client(0))
    parts["directory"][3][0] = parts["directory"][2][0]  # client 3 registered 2's identity
    with pytest.raises(ConfigurationError, match="one public key for several"):
        backend.client(0, write_masking_material(parts))
    parts = masking_material(backend.setup(ids, seed=5).for_client(0))
    parts["directory"][3][1] = parts["directory"][2][1]  # ... or 2's static key
    with pytest.raises(ConfigurationError, match="one static key for several"):
        backend.client(0, write_masking_material(parts))


# --- strict wire parsing of the tags -----------------------------------------------------------
def _reply_of_round(server, clients, inputs, rnd, change):
    """Run honestly up to round ``rnd``'s replies, alter client 1's reply payload there
    with ``change`` (sealed with its channel key) and hand them to the server."""
    from botorch_fed.secure.wire import parse_frame, seal_frame

    ids = sorted(inputs)
    messages = server.start(ids, len(inputs[ids[0]]))
    for r in range(rnd + 1):
        replies = {c: clients[c].step(m, inputs[c]) for c, m in sorted(messages.items())}
        if r < rnd:
            messages = server.step(replies)
    frame = parse_frame(replies[1])
    key = clients[1]._key
    payload = frame.payload
    if rnd == 0:  # the channel key rides in front of the round-0 payload
        payload = payload[:32] + change(payload[32:])
    else:
        payload = change(payload)
    replies[1] = seal_frame(
        backend=frame.backend,
        direction=frame.direction,
        round=frame.round,
        session=frame.session,
        client_id=1,
        payload=payload,
        key=key,
    )
    return server.step(replies)


def _drop_last_tag(payload: bytes, offset: int) -> bytes:
    reader = PayloadReader(payload[offset:])
    n = reader.u32()
    return payload[:offset] + PayloadWriter().u32(n - 1).getvalue() + payload[offset + 4 : -36]


@pytest.mark.parametrize(
    ("rnd", "change", "error", "match"),
    [
        (0, lambda p: _drop_last_tag(p, 64), ProtocolError, "key tags must address"),
        (0, lambda p: p + bytes(3), TamperedMessageError, "trailing"),
        (0, lambda p: p[:-1], TamperedMessageError, "truncated"),
        (3, lambda p: _drop_last_tag(p, 0), ProtocolError, "consistency tags must address"),
        (3, lambda p: p[:4] + p[40:76] + p[4:40] + p[76:], ProtocolError, "in order"),
    ],
)
def test_server_parses_tag_replies_strictly(rnd, change, error, match):
    ids = list(range(5))
    server, clients = make_roles(get_backend("masking"), ids, seed=19)
    with pytest.raises(error, match=match) as info:
        _reply_of_round(server, clients, random_inputs(5, 3, seed=19), rnd, change)
    assert info.value.client_id == 1 and info.value.round == rnd


@pytest.mark.parametrize("rnd", [1, 4])
def test_client_refuses_a_message_missing_a_tag(rnd):
    ids = list(range(5))
    server, clients = make_roles(get_backend("masking"), ids, seed=20)
    inputs = random_inputs(5, 3, seed=20)
    if rnd == 1:
        honest = server._route_keys
        server._route_keys = lambda p: {r: m[:-32] for r, m in honest(p).items()}
    else:
        _stop_before_reveal(server, lambda r, to_r, tags: to_r)
        honest = server._route_tags
        server._route_tags = lambda p: {r: m[:-32] for r, m in honest(p).items()}
    got, errors, _ = _session(server, clients, inputs)
    assert got == rnd and set(errors) == set(ids)
    assert all(isinstance(e, TamperedMessageError) and e.round == rnd for e in errors.values())


# --- the round-4 endorser list ----------------------------------------------------------
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
        assert_sum_close(result, plain_sum(inputs), "masking", inputs)


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
