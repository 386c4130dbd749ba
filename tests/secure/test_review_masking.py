"""Review of the malicious-secure masking protocol (issue 14, findings 1, 2, 10).

Each test mounts an attack by a malicious server (its ``_handle`` replaced, frames
validly sealed by the real ``ServerRole``), drives the clients by hand and asserts
what a correct implementation must do. They were ``xfail(strict=True)`` while the
defect stands.

The common root of the first three was that every signature a client checked (signed
keys of round 0, survivor-list signatures of round 3) was bound only to the
*server-chosen* session id, and a client accepted a session id it had already used:
a server that started several sessions with one id could replay signatures across
them. Now a client refuses a session id it has joined, and survivor-list
authenticators (since then pairwise HMAC tags instead of Ed25519 signatures) name
their sender and recipient and cover the digest of the key list U1 (every client's
fresh keys of the session), so even restarted clients refuse tags of another session.
"""

from __future__ import annotations

import numpy as np
import pytest

from botorch_fed.secure import (
    ConfigurationError,
    ProtocolError,
    SecureAggregationError,
    TamperedMessageError,
    fixed_point,
    get_backend,
    shamir,
)
from botorch_fed.secure.crypto import (
    RandomSource,
    mac_tag,
    x25519_private_from_bytes,
    x25519_shared,
)
from botorch_fed.secure.masking import _pair_mask, _self_mask, _survivors_message
from botorch_fed.secure.wire import PayloadReader, PayloadWriter
from tests.helpers.secure_roles import (
    make_roles,
    masking_keys,
    masking_material,
    masking_reply_tags,
    random_inputs,
    recording,
    write_masking_endorsements,
    write_masking_keys,
    write_masking_material,
)

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
