"""A malicious server against the masking backend.

Each test mounts the attack with a patched server whose frames are validly sealed,
steps every client by hand and asserts that every honest client refuses with a named
error before it reveals anything the attack needs: the shares of round 1 (peer keys
substituted) or the unmasking shares of round 4 (inconsistent contributor lists).
Without the tag checks or the consistency round these attacks recover a client's input
exactly (for n = 3..10).

A server may also start several sessions with one session id and replay what clients
signed or tagged in one of them into another: a client refuses a session id it has
joined, and survivor-list tags name their sender and recipient and cover the digest of
the key list U1 (every client's fresh keys of the session), so even restarted clients
refuse tags of another session. A run resumed from a checkpoint with ``crypto_seed``
draws fresh masks, so the server cannot subtract a client's two masked inputs.
"""

from __future__ import annotations

import numpy as np
import pytest

from botorch_fed.secure import (
    ConfigurationError,
    KeyMismatchError,
    ProtocolError,
    SecureAggregationError,
    TamperedMessageError,
    TooFewClientsError,
    fixed_point,
    get_backend,
    shamir,
)
from botorch_fed.secure.crypto import (
    RandomSource,
    mac_tag,
    x25519_keypair,
    x25519_private_from_bytes,
    x25519_shared,
)
from botorch_fed.secure.masking import default_threshold
from botorch_fed.secure.masking_derivations import _pair_mask, _self_mask, _survivors_message
from botorch_fed.secure.wire import PayloadReader, PayloadWriter
from tests.helpers.secure_roles import (
    drive,
    make_roles,
    masking_keys,
    masking_reply_tags,
    plain_sum,
    random_inputs,
    recording,
    run_roles,
    write_masking_endorsements,
    write_masking_keys,
)
from tests.helpers.secure_sum_bounds import assert_sum_close


def _step_all(clients, messages, inputs):
    """Every addressed client's reply, or the error it raised."""
    replies, errors = {}, {}
    for cid, msg in sorted(messages.items()):
        try:
            replies[cid] = clients[cid].step(msg, inputs[cid])
        except SecureAggregationError as exc:
            errors[cid] = exc
    return replies, errors


def _run_until_refused(server, clients, inputs, last_round):
    """Drive a session round by round, stepping every client; stop at the first round
    in which some client refuses. Returns ``(round, replies of that round, errors)``."""
    ids = sorted(inputs)
    messages = server.start(ids, len(inputs[ids[0]]))
    for rnd in range(last_round + 1):
        replies, errors = _step_all(clients, messages, inputs)
        if errors or rnd == last_round:
            return rnd, replies, errors
        messages = server.step(replies)
    raise AssertionError("unreachable")


@pytest.mark.parametrize("n", [3, 4, 10])
def test_peer_key_substitution_is_refused_by_every_client(n):
    # the victim gets server-made keys for its peers, every peer a server-made key for
    # the victim; the server cannot tag them (it holds no pairwise MAC key)
    ids = list(range(n))
    server, clients = make_roles(get_backend("masking"), ids, seed=n)
    inputs = random_inputs(n, 6, seed=n)
    victim = 1
    fake = {
        v: (x25519_keypair(RandomSource(7, v))[1], x25519_keypair(RandomSource(8, v))[1])
        for v in ids
    }
    honest = server._route_keys

    def substituting(payloads):
        out = {}
        for r, payload in honest(payloads).items():
            u1, keys = masking_keys(payload, r)
            for v in [v for v in u1 if v != victim] if r == victim else [victim]:
                keys[v][0], keys[v][1] = fake[v]
            out[r] = write_masking_keys(u1, keys)
        return out

    server._route_keys = substituting
    rnd, replies, errors = _run_until_refused(server, clients, inputs, last_round=1)
    assert rnd == 1 and not replies  # no client sent a single share
    assert set(errors) == set(ids)
    for cid, exc in errors.items():
        assert isinstance(exc, KeyMismatchError) and exc.round == 1 and exc.client_id == cid
        named = victim if cid != victim else min(v for v in ids if v != victim)
        assert f"for client {named} carry no valid tag" in str(exc)


def test_tagged_keys_replayed_from_another_session_are_refused():
    # the tag binds the session: last session's tagged keys do not verify now
    ids = [0, 1, 2, 3]
    server, clients = make_roles(get_backend("masking"), ids, seed=1)
    inputs = random_inputs(4, 3, seed=1)
    messages = server.start(ids, 3)
    replies, _ = _step_all(clients, messages, inputs)
    recorded: dict = {}
    honest = server._route_keys
    server._route_keys = recording(recorded, honest)
    server.step(replies)
    old = {r: masking_keys(p, r) for r, p in recorded["out"].items()}
    server._route_keys = honest
    replies, errors = _step_all(clients, server.start(ids, 3), inputs)
    assert not errors

    def replaying(payloads):
        out = {}
        for r, payload in honest(payloads).items():
            u1, keys = masking_keys(payload, r)
            if r != 2:
                keys[2] = old[r][1][2]  # client 2's keys and tag to r of the last session
            out[r] = write_masking_keys(u1, keys)
        return out

    server._route_keys = replaying
    _, errors = _step_all(clients, server.step(replies), inputs)
    assert set(errors) == {0, 1, 3}
    assert all(isinstance(e, KeyMismatchError) for e in errors.values())
    assert all(u1 == tuple(ids) for u1, _ in old.values())


@pytest.mark.parametrize("forward", ["all tags", "matching tags"])
@pytest.mark.parametrize("n", [5, 7, 10])
def test_inconsistent_contributor_lists_reveal_no_shares(n, forward):
    # the server tells one group that the victim contributed (they would reveal its
    # self-mask seed shares) and the other that it dropped (they would reveal its
    # mask-key shares); honest clients endorse only the list they were shown
    ids = list(range(n))
    t = default_threshold(n)
    server, clients = make_roles(get_backend("masking"), ids, seed=n)
    inputs = random_inputs(n, 5, seed=n)
    victim = n - 1
    with_victim = tuple(ids)
    without_victim = tuple(v for v in ids if v != victim)
    group_a = set(ids[: n // 2])  # shown U3 with the victim
    views = {v: with_victim if v in group_a else without_victim for v in ids}
    honest_collect = server._collect_masked

    def split_views(payloads):
        honest_collect(payloads)
        return {v: PayloadWriter().ids(views[v]).getvalue() for v in ids if v in views[v]}

    tags: dict[int, dict[int, bytes]] = {}

    def route(payloads):
        for u, payload in payloads.items():
            tags[u] = masking_reply_tags(payload)
        out = {}
        for r in payloads:
            signers = (
                sorted(payloads)
                if forward == "all tags"
                else sorted(u for u in payloads if views[u] == views[r])
            )
            out[r] = write_masking_endorsements(r, {u: tags[u][r] for u in signers if u != r})
        return out

    server._collect_masked = split_views
    server._route_tags = route
    rnd, replies, errors = _run_until_refused(server, clients, inputs, last_round=4)
    assert rnd == 4 and not replies  # nobody revealed an unmasking share
    refusing = set(errors)
    assert refusing == {v for v in ids if v in views[v]}
    for cid, exc in errors.items():
        assert exc.round == 4 and exc.client_id == cid
        assert isinstance(exc, TamperedMessageError | TooFewClientsError | ProtocolError)
        if forward == "matching tags":  # fewer than t endorsements of either list
            assert isinstance(exc, TooFewClientsError), exc
    assert t > n / 2


@pytest.mark.parametrize("n", [3, 4, 5, 7, 10, 20])
def test_default_threshold_is_above_two_thirds(n):
    t = default_threshold(n)
    assert 2 * n / 3 < t <= n
    assert get_backend("masking").session_threshold(n) == t


def test_threshold_at_or_below_half_is_refused():
    with pytest.raises(ConfigurationError, match="threshold"):
        get_backend("masking", threshold=5).session_threshold(10)


def test_missing_or_foreign_identity_material_is_refused():
    backend = get_backend("masking")
    setup = backend.setup([0, 1, 2])
    with pytest.raises(ConfigurationError, match="identity material"):
        backend.client(0)
    with pytest.raises(ConfigurationError, match="not this client's"):
        backend.client(0, setup.for_client(1))
    with pytest.raises(ConfigurationError, match="malformed"):
        backend.client(0, setup.for_client(0)[:-3])
    with pytest.raises(ConfigurationError, match="not in the directory"):
        backend.client(5, setup.for_client(0))


def test_session_with_a_client_outside_the_directory_is_refused():
    backend = get_backend("masking")
    server, clients = make_roles(backend, [0, 1, 2])
    msgs = server.start([0, 1, 2, 3], 2)  # client 3 has no identity the others know
    with pytest.raises(ProtocolError, match=r"clients \[3\] whose identities"):
        clients[0].step(msgs[0], [0.0, 0.0])


def test_honest_session_still_sums():
    ids = list(range(7))
    server, clients = make_roles(get_backend("masking"), ids, seed=3)
    inputs = random_inputs(7, 9, seed=3)
    messages = server.start(ids, 9)
    while True:
        replies, errors = _step_all(clients, messages, inputs)
        assert not errors
        out = server.step(replies)
        if not isinstance(out, dict):
            break
        messages = out
    assert_sum_close(out, plain_sum(inputs), "masking", inputs)


# --- sessions that share one session id --------------------------------------------------
SEED = 11


def _restart(server, ids, length):
    """``server.start`` with the session id of this server's first session (the
    server chooses session ids; nothing stops it from reusing one)."""
    server._rand = RandomSource(SEED, 0)
    return server.start(ids, length)


def _step(clients, messages, inputs):
    return {cid: clients[cid].step(msg, inputs[cid]) for cid, msg in sorted(messages.items())}


def _share_cts(payload: bytes) -> dict[int, bytes]:
    reader = PayloadReader(payload)
    reader.raw(32)
    cts = {}
    for _ in range(reader.u32()):
        v = reader.u32()
        cts[v] = reader.blob()
    reader.done()
    return cts


def _route_shares(u2_of: dict[int, tuple[int, ...]], payloads) -> dict[int, bytes]:
    """Round-1 routing with a per-recipient share-holder list ``U2`` (unbound)."""
    cts = {u: _share_cts(p) for u, p in payloads.items()}
    out = {}
    for v, u2 in u2_of.items():
        senders = [u for u in u2 if u != v]
        writer = PayloadWriter().ids(tuple(u2)).u32(len(senders))
        for u in senders:
            writer.u32(u).blob(cts[u][v])
        out[v] = writer.getvalue()
    return out


def _replay_attack(n: int = 10):
    """A server colluding with ``c = 3 < n / 3`` clients recovers an honest client's
    input exactly by replaying survivor-list tags across sessions that share one
    session id.

    Clients: victim 0; D = {1, 2, 3} honest, in the victim's U2; E = {4, 5, 6} honest;
    C = {7, 8, 9} colluding (the server holds their roles). t = 2n // 3 + 1 = 7.
    The victim masks only with U2(0) = {0} | D | C. E is shown U3 = {0} | E | C (reveals
    b_0 and s_1, s_2, s_3); d in D is shown U3 = {0, d} | E | C (reveals b_0 and the s of
    the other two members of D). Within one session these views cannot each gather 7
    endorsements (the consistency round works); the missing tags of 0, 4, 5, 6 are
    replayed from four earlier sessions with the same session id, each stopped
    after round 3, in which those clients were honestly shown the list in question.
    """
    ids = list(range(n))
    backend = get_backend("masking")
    t = 2 * n // 3 + 1
    victim, D, E, C = 0, (1, 2, 3), (4, 5, 6), (7, 8, 9)
    server, clients = make_roles(backend, ids, seed=SEED)
    inputs = random_inputs(n, 4, seed=SEED)
    length = 4
    views = {e: tuple(sorted((victim, *E, *C))) for e in E}
    views.update({d: tuple(sorted((victim, d, *E, *C))) for d in D})
    lists = sorted(set(views.values()))
    honest_route_keys = server._route_keys

    # earlier sessions, same id: collect honest tags on each list
    replay: dict[tuple[int, tuple[int, ...]], dict[int, bytes]] = {}
    for listed in lists:
        messages = _restart(server, ids, length)

        def handle(rnd, payloads, listed=listed):
            if rnd == 0:
                return honest_route_keys(payloads)
            if rnd == 1:
                return _route_shares({v: tuple(ids) for v in ids}, payloads)
            if rnd == 2:
                return {v: PayloadWriter().ids(listed).getvalue() for v in listed}
            for u, p in payloads.items():  # rnd == 3: tags; stop here
                replay[(u, listed)] = masking_reply_tags(p)
            return {}

        server._handle = handle
        for _ in range(4):
            messages = server.step(_step(clients, messages, inputs))
        assert messages == {}

    # the attack session, same id again
    messages = _restart(server, ids, length)
    sid = server.session_id
    u2_of = {v: tuple(ids) for v in ids}
    u2_of[victim] = tuple(sorted((victim, *D, *C)))
    masked: dict[int, np.ndarray] = {}
    fresh: dict[int, dict[int, bytes]] = {}
    revealed: dict[int, bytes] = {}

    def attack(rnd, payloads):
        if rnd == 0:
            return honest_route_keys(payloads)
        if rnd == 1:
            return _route_shares(u2_of, payloads)
        if rnd == 2:
            for u, p in payloads.items():
                masked[u] = PayloadReader(p).array("u", length)
            return {r: PayloadWriter().ids(views[r]).getvalue() for r in views}
        if rnd == 3:
            for u, p in payloads.items():
                fresh[u] = masking_reply_tags(p)
            out = {}
            for r, view in views.items():
                tags = {}
                for s in view:
                    if s == r:
                        continue
                    if s in fresh and views.get(s) == view:
                        tags[s] = fresh[s][r]
                    elif s in C:  # a colluder endorses whatever r was shown
                        message = _survivors_message(
                            sid, s, r, view, clients[r]._u1_digest, clients[r]._transcript
                        )
                        tags[s] = mac_tag(clients[s]._send_keys[r], message)
                    elif (s, view) in replay:
                        tags[s] = replay[(s, view)][r]
                assert len(tags) + 1 >= t
                out[r] = write_masking_endorsements(r, tags)
            return out
        revealed.update(payloads)
        return {}

    server._handle = attack
    for _ in range(5):
        messages = server.step(_step(clients, messages, inputs))

    # reconstruct b_0 and s_1, s_2, s_3 from the honest reveals and the colluders' shares
    b_shares: dict[int, int] = {}
    s_shares: dict[int, dict[int, int]] = {d: {} for d in D}
    for r, payload in revealed.items():
        reader = PayloadReader(payload)
        for v in ids:
            assert reader.u32() == v
            share = shamir.share_from_bytes(reader.raw(shamir.SHARE_SIZE))
            if v == victim:
                b_shares[r + 1] = share
            elif v in D and v not in views[r]:
                s_shares[v][r + 1] = share
        reader.done()
    for c in C:
        b_shares[c + 1] = clients[c]._received[victim][1]
        for d in D:
            s_shares[d][c + 1] = clients[c]._received[d][0]

    def rebuild(shares):
        xs = sorted(shares)[:t]
        return shamir.reconstruct({x: shares[x] for x in xs}, 32, shamir.lagrange_at_zero(xs))

    total = masked[victim] - _self_mask(rebuild(b_shares), sid, victim, length)
    victim_s_pk = server.keys[victim][1]
    for w in u2_of[victim]:
        if w == victim:
            continue
        private = (
            clients[w]._s_private if w in C else x25519_private_from_bytes(rebuild(s_shares[w]))
        )
        total -= _pair_mask(x25519_shared(private, victim_s_pk), sid, victim, w, length)
    return fixed_point.decode(total), inputs[victim]


def test_replayed_survivor_tags_do_not_leak_an_input():
    try:
        recovered, truth = _replay_attack()
    except SecureAggregationError:
        return  # some honest client refused: the attack is stopped
    assert not np.allclose(recovered, truth, atol=1e-9), (
        f"server recovered the victim's input {recovered} (true {truth})"
    )


def test_survivor_tags_from_an_earlier_session_are_refused():
    ids = [0, 1, 2, 3, 4]
    server, clients = make_roles(get_backend("masking"), ids, seed=SEED)
    inputs = random_inputs(5, 3, seed=SEED)
    honest = {
        r: getattr(server, f)
        for r, f in enumerate(["_route_keys", "_route_shares", "_collect_masked", "_route_tags"])
    }
    # session 1: honest up to the tags on U3 = all, then abandoned
    messages = _restart(server, ids, 3)
    for _ in range(3):
        messages = server.step(_step(clients, messages, inputs))
    old = {}
    replies = _step(clients, messages, inputs)

    def record(rnd, payloads):
        old.update({u: masking_reply_tags(p) for u, p in payloads.items()})
        return {}

    server._handle = record
    server.step(replies)
    # session 2, same id: client 0 is shown U3 = all, the others U3 = all but 0 ... and
    # client 0 gets last session's tags of the others
    del server._handle
    with pytest.raises(ProtocolError, match="used before"):  # the reuse itself
        _step(clients, _restart(server, ids, 3), inputs)
    # the same clients restarted (same identities, roles that forgot the ids they
    # joined): the tags of session 1 cover session 1's key list U1, not this one
    backend = get_backend("masking")
    setup = backend.setup(ids, seed=SEED)
    clients = {c: backend.client(c, setup.for_client(c), seed=SEED + 1) for c in ids}
    messages = _restart(server, ids, 3)
    for _ in range(2):
        messages = server.step(_step(clients, messages, inputs))
    others = (1, 2, 3, 4)

    def split(rnd, payloads):
        honest[2](payloads)
        out = {0: PayloadWriter().ids(tuple(ids)).getvalue()}
        out.update({v: PayloadWriter().ids(others).getvalue() for v in others})
        return out

    server._handle = split
    messages = server.step(_step(clients, messages, inputs))
    fresh = {}

    def forward(rnd, payloads):
        fresh.update({u: masking_reply_tags(p) for u, p in payloads.items()})
        # the others endorsed U3 = all in session 1; in this session they endorsed
        # U3 = others
        return {0: write_masking_endorsements(0, {v: old[v][0] for v in others})}

    server._handle = forward
    messages = server.step(_step(clients, messages, inputs))
    with pytest.raises(TamperedMessageError, match="consistency check failed"):
        clients[0].step(messages[0], inputs[0])


def test_tagged_keys_replayed_into_a_session_with_the_same_id_are_refused():
    ids = [0, 1, 2, 3]
    server, clients = make_roles(get_backend("masking"), ids, seed=SEED)
    inputs = random_inputs(4, 3, seed=SEED)
    recorded: dict = {}
    honest = server._route_keys
    server._route_keys = recording(recorded, honest)
    messages = _restart(server, ids, 3)
    server.step(_step(clients, messages, inputs))
    _, old = masking_keys(recorded["out"][0], 0)

    def replaying(payloads):
        out = honest(payloads)
        u1, keys = masking_keys(out[0], 0)
        assert keys[2][:2] != old[2][:2]  # fresh keys this session
        keys[2] = list(old[2])  # client 2's keys (and tag to 0) from the last session
        out[0] = write_masking_keys(u1, keys)
        return out

    # the same roles refuse the reused session id before any key is shown
    with pytest.raises(ProtocolError, match="used before"):
        _step(clients, _restart(server, ids, 3), inputs)
    # restarted roles (same identities) cannot tell client 2's old tagged keys from new
    # ones in round 1; but client 2 (online) encrypts its shares for client 0 under its
    # fresh key: client 0 refuses in round 2, before it sends its masked input (had
    # client 2 been offline, the consistency round would stop the reveal)
    backend = get_backend("masking")
    setup = backend.setup(ids, seed=SEED)
    clients = {c: backend.client(c, setup.for_client(c), seed=SEED + 1) for c in ids}
    server._route_keys = replaying
    messages = _restart(server, ids, 3)
    with pytest.raises(TamperedMessageError, match="share from client 2 failed") as info:
        for _ in range(5):
            messages = server.step(_step(clients, messages, inputs))
    assert info.value.client_id == 0 and info.value.round == 2


# --- a run resumed from a checkpoint with crypto_seed ---------------------------------
CRYPTO_SEED = 5  # secret to the server (experiments only), unlike the run's seed


def test_resumed_seeded_roles_draw_fresh_masks():
    from botorch_fed.protocol.setup import FederationSetup
    from botorch_fed.secure import fixed_point

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

    server, clients, material = run_roles(setup)
    first = random_inputs(5, 6, seed=21)
    masked_first = run(server, clients, first)
    server, clients, _ = run_roles(setup, material)  # resumed
    second = random_inputs(5, 6, seed=22)
    masked_second = run(server, clients, second)
    victim = 2
    bits = clients[victim].backend.fraction_bits
    diff = masked_second[victim] - masked_first[victim]  # uint64, wraps
    expected = fixed_point.encode(second[victim], 5, bits) - fixed_point.encode(
        first[victim], 5, bits
    )
    assert not np.array_equal(diff, expected), "the server learnt x'_V - x_V exactly"
