"""A malicious server against the masking backend (issue 14, findings 1 and 2).

Each test mounts the attack with a patched server whose frames are validly sealed,
steps every client by hand and asserts that every honest client refuses with a named
error before it reveals anything the attack needs: the shares of round 1 (finding 1)
or the unmasking shares of round 4 (finding 2). Without the tag checks or the
consistency round these attacks recover a client's input exactly (the review that
filed issue 14 did so for n = 3..10).
"""

from __future__ import annotations

import pytest

from botorch_fed.secure import (
    ConfigurationError,
    KeyMismatchError,
    ProtocolError,
    SecureAggregationError,
    TamperedMessageError,
    TooFewClientsError,
    get_backend,
)
from botorch_fed.secure.crypto import RandomSource, x25519_keypair
from botorch_fed.secure.masking import default_threshold
from botorch_fed.secure.wire import PayloadWriter
from tests.helpers.secure_roles import (
    make_roles,
    masking_keys,
    masking_reply_tags,
    plain_sum,
    random_inputs,
    recording,
    write_masking_endorsements,
    write_masking_keys,
)


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
    # finding 1: the victim gets server-made keys for its peers, every peer a
    # server-made key for the victim; the server cannot tag them (it holds no pairwise
    # MAC key)
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
    # finding 2: the server tells one group that the victim contributed (they would
    # reveal its self-mask seed shares) and the other that it dropped (they would
    # reveal its mask-key shares); honest clients endorse only the list they were shown
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
    assert abs(out - plain_sum(inputs)).max() <= 1e-10
