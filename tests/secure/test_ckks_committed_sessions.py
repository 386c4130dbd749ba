"""Committed CKKS sessions.

Each client's round-0 reply carries a fresh 16-byte nonce it commits to for its next
session. When the server holds a commitment of every client of a new session, its
opening carries them (mode 1): each client checks its own, uses it up whatever happens
and encrypts at once, so one round of replies precedes the decryption (round 2, whose
replies are empty: the server may end the session without them). Without every
commitment the server opens the three-round session (nonces, encrypt, decrypt).
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from botorch_fed.secure import (
    HeadroomError,
    InputError,
    KeyMismatchError,
    ProtocolError,
    SecureAggregationError,
    TamperedMessageError,
    get_backend,
)
from botorch_fed.secure.wire import PayloadReader, PayloadWriter, parse_frame, seal_frame
from tests.helpers.secure_roles import plain_sum, random_inputs

IDS = [0, 1, 2, 3]
LENGTH = 5
NONCE = 16


@pytest.fixture(scope="module")
def backend():
    # small parameters, as tests/secure/test_fuzz.py: sessions in milliseconds
    return get_backend(
        "ckks", poly_modulus_degree=4096, coeff_mod_bit_sizes=(60, 49), scale_bits=40
    )


def _roles(backend, seed=None):
    """As :func:`tests.helpers.secure_roles.make_roles`, plus the key material (a
    restarted client keeps it)."""
    setup = backend.setup(IDS, seed=seed)
    server = backend.server(setup.server_material, seed=seed)
    clients = {cid: backend.client(cid, setup.for_client(cid), seed=seed) for cid in IDS}
    return server, clients, setup


def _fresh(backend, setup, seed=None):
    """The clients restarted: fresh roles of the same key material."""
    return {cid: backend.client(cid, setup.for_client(cid), seed=seed) for cid in IDS}


def _spy(clients) -> dict[int, int]:
    """Count every client's encryptions (calls of its ``_encrypt_bound``)."""
    counts = dict.fromkeys(clients, 0)
    for cid, client in clients.items():

        def counting(nonces, cid=cid, honest=client._encrypt_bound):
            counts[cid] += 1
            return honest(nonces)

        client._encrypt_bound = counting
    return counts


def _check_sum(backend, clients, inputs) -> None:
    bound = backend.error_bound(len(inputs), sum(np.abs(x).max() for x in inputs.values()))
    for cid in IDS:
        assert clients[cid].result is not None, cid
        assert np.abs(clients[cid].result - plain_sum(inputs)).max() <= bound


def _run(server, clients, inputs, *, tamper_open=None, until=None, answered=None):
    """One session by hand. Every addressed client answers (its error is recorded, not
    raised); the session stops after a round with an error. ``tamper_open(cid, msg)``
    alters the opening frames, ``until(server)`` stops it early when true,
    ``answered()`` is called once the clients answered a round. Returns ``(rounds,
    errors)``: the rounds of the server's messages and each client's error."""
    messages = server.start(IDS, len(inputs[IDS[0]]))
    if tamper_open is not None:
        messages = {cid: tamper_open(cid, msg) for cid, msg in messages.items()}
    rounds, errors = [], {}
    while isinstance(messages, dict) and not (until and until(server)):
        rounds.append(server.round)
        assert {parse_frame(m).round for m in messages.values()} == {server.round}
        replies = {}
        for cid, msg in sorted(messages.items()):
            try:
                replies[cid] = clients[cid].step(msg, inputs[cid])
            except SecureAggregationError as exc:
                errors[cid] = exc
        if answered is not None:
            answered()
        if errors:
            break
        messages = server.step(replies)
    return rounds, errors


# --- the opening frame, as a malicious server may write it ---------------------------
def _parse_opening(msg: bytes) -> dict:
    frame = parse_frame(msg)
    reader = PayloadReader(frame.payload)
    out = {"pk": reader.raw(32), "n": reader.u32(), "length": reader.u32()}
    out["session_ids"] = reader.ids()
    out["key_id"], out["mode"] = reader.raw(16), reader.u32()
    out["nonces"] = {}
    if out["mode"]:
        ids = reader.ids()
        out["nonces"] = {cid: reader.raw(NONCE) for cid in ids}
    reader.done()
    return out


def _write_opening(msg: bytes, parts: dict) -> bytes:
    """``msg`` (an opening) with ``parts`` (:func:`_parse_opening`), sealed again (an
    opening carries a checksum only: the server can write any)."""
    frame = parse_frame(msg)
    writer = PayloadWriter().raw(parts["pk"]).u32(parts["n"]).u32(parts["length"])
    writer.ids(parts["session_ids"]).raw(parts["key_id"]).u32(parts["mode"])
    if parts["mode"]:
        writer.ids(tuple(parts["nonces"]))
        for nonce in parts["nonces"].values():
            writer.raw(nonce)
    return seal_frame(
        backend=frame.backend,
        direction=frame.direction,
        round=0,
        session=frame.session,
        client_id=frame.client_id,
        payload=writer.getvalue(),
        key=None,
    )


def _editing(edit, who=None):
    """A ``tamper_open`` that applies ``edit(parts)`` to the openings of ``who`` (all)."""

    def tamper(cid, msg):
        if who is not None and cid not in who:
            return msg
        parts = _parse_opening(msg)
        edit(parts)
        return _write_opening(msg, parts)

    return tamper


def _committed_ready(server, clients) -> None:
    """The next session opens committed: the server holds every client's commitment."""
    held = server.committed_nonces()
    assert set(held) == set(IDS)
    assert all(held[c] == clients[c].committed_nonce() for c in IDS)


# --- (a) -----------------------------------------------------------------------------
def test_a_committed_session_sums_with_one_round_before_the_decryption(backend):
    server, clients, _ = _roles(backend, seed=1)
    assert server.committed_nonces() == {}
    counts = _spy(clients)
    sessions = [
        ([0, 1, 2], False),  # the first session: no commitments yet
        ([0, 2], False),  # committed: the clients encrypt in round 0
        ([0, 1, 2], True),  # the server forgot the commitments: three rounds again
        ([0, 2], False),  # and committed after it
    ]
    for n, (expected_rounds, forget) in enumerate(sessions):
        if forget:
            server.restore_committed_nonces({})
        elif n:
            _committed_ready(server, clients)
        inputs = random_inputs(4, LENGTH, seed=n, scale=10.0 ** (n - 1))
        before = dict(counts)
        encrypted = []  # encryptions per client, after each round's replies
        rounds, errors = _run(
            server,
            clients,
            inputs,
            answered=lambda encrypted=encrypted, before=before: encrypted.append(
                {c: counts[c] - before[c] for c in IDS}
            ),
        )
        assert not errors
        assert rounds == expected_rounds
        # committed: the round-0 replies carry the ciphertexts, and the next round is
        # the decryption; three-round: round 0 encrypts nothing, round 1 does
        committed = len(expected_rounds) == 2
        assert encrypted[0] == dict.fromkeys(IDS, int(committed))
        assert encrypted[-1] == dict.fromkeys(IDS, 1)
        assert server.finished and server.contributors == tuple(IDS)
        _check_sum(backend, clients, inputs)
        _committed_ready(server, clients)


# --- (b) -----------------------------------------------------------------------------
def _replace_own(parts):  # a fresh nonce in place of client 1's commitment
    parts["nonces"][1] = bytes(x ^ 0xFF for x in parts["nonces"][1])


def _swap_own(parts):  # client 2's commitment in place of client 1's
    nonces = parts["nonces"]
    nonces[1], nonces[2] = nonces[2], nonces[1]


def _drop_one(parts):  # client 3 left out of the committed list
    del parts["nonces"][3]


def _add_one(parts):  # a client that is not in the session
    parts["nonces"][9] = bytes(range(NONCE))


def _reorder(parts):  # the same clients, out of order
    parts["nonces"] = dict(reversed(parts["nonces"].items()))


@pytest.mark.parametrize(
    "edit",
    [_replace_own, _swap_own, _drop_one, _add_one, _reorder],
    ids=["replaced", "swapped", "one-left-out", "one-added", "reordered"],
)
def test_a_tampered_committed_opening_is_refused_before_encrypting(backend, edit):
    server, clients, _ = _roles(backend, seed=2)
    _run(server, clients, random_inputs(4, LENGTH, seed=2))
    _committed_ready(server, clients)
    counts = _spy(clients)
    rounds, errors = _run(
        server, clients, random_inputs(4, LENGTH, seed=3), tamper_open=_editing(edit, who={1})
    )
    assert rounds == [0] and set(errors) == {1}
    error = errors[1]
    assert isinstance(error, TamperedMessageError) and not isinstance(error, KeyMismatchError)
    assert error.round == 0 and error.client_id == 1
    assert counts[1] == 0 and clients[1].result is None  # nothing was encrypted
    assert clients[1].committed_nonce() is None  # and the commitment is used up
    assert all(counts[c] == 1 for c in IDS if c != 1)  # the others' openings were intact


# --- (c) -----------------------------------------------------------------------------
def _wrong_key_id(parts):
    parts["key_id"] = bytes(x ^ 0x01 for x in parts["key_id"])


@pytest.mark.parametrize("first", ["completed", "abandoned", "wrong-key-id", "headroom"])
def test_a_commitment_opens_one_session_only(backend, first):
    server, clients, _ = _roles(backend, seed=4)
    _run(server, clients, random_inputs(4, LENGTH, seed=4))
    _committed_ready(server, clients)
    held = server.committed_nonces()
    inputs = random_inputs(4, LENGTH, seed=5)
    tamper, until = None, None
    if first == "wrong-key-id":
        tamper = _editing(_wrong_key_id)
    elif first == "headroom":
        inputs = {c: x * 4 * backend.max_abs_supported(4) for c, x in inputs.items()}
    elif first == "abandoned":  # the server stops after the round-0 replies
        until = lambda server: server.round > 0  # noqa: E731
    rounds, errors = _run(server, clients, inputs, tamper_open=tamper, until=until)
    if first == "wrong-key-id":
        assert set(errors) == set(IDS)
        assert all(isinstance(e, KeyMismatchError) for e in errors.values())
    elif first == "headroom":
        assert set(errors) == set(IDS)
        assert all(isinstance(e, HeadroomError) for e in errors.values())
    elif first == "completed":
        assert not errors and rounds == [0, 2]
        _check_sum(backend, clients, inputs)
    else:
        assert not errors and rounds == [0]
    if errors:  # used up, and no new commitment made
        assert all(clients[c].committed_nonce() is None for c in IDS)
    # the server opens a second session with the same commitments
    server.restore_committed_nonces(held)
    counts = _spy(clients)
    rounds, errors = _run(server, clients, random_inputs(4, LENGTH, seed=6))
    assert rounds == [0] and set(errors) == set(IDS)
    for error in errors.values():
        assert isinstance(error, TamperedMessageError) and error.round == 0
        assert "committed" in str(error)
    assert counts == dict.fromkeys(IDS, 0)
    assert all(clients[c].result is None for c in IDS)


# --- (d) -----------------------------------------------------------------------------
def test_restarted_clients_without_a_commitment_refuse_a_committed_opening(backend):
    server, clients, setup = _roles(backend, seed=7)
    _run(server, clients, random_inputs(4, LENGTH, seed=7))
    _committed_ready(server, clients)
    restarted = _fresh(backend, setup, seed=107)  # same material, no commitment
    assert all(restarted[c].committed_nonce() is None for c in IDS)
    counts = _spy(restarted)
    rounds, errors = _run(server, restarted, random_inputs(4, LENGTH, seed=8))
    assert rounds == [0] and set(errors) == set(IDS)
    assert all(isinstance(e, TamperedMessageError) and e.round == 0 for e in errors.values())
    assert counts == dict.fromkeys(IDS, 0)
    # the same roles join a three-round session: the refusal was the commitment's
    server.restore_committed_nonces({})
    inputs = random_inputs(4, LENGTH, seed=9)
    rounds, errors = _run(server, restarted, inputs)
    assert not errors and rounds == [0, 1, 2]
    _check_sum(backend, restarted, inputs)


@pytest.mark.parametrize("replayed", ["stale-aggregate", "foreign-ciphertext"])
def test_a_reused_session_id_is_refused_by_live_clients_in_committed_mode(backend, replayed):
    server, clients, _ = _roles(backend, seed=10)
    _run(server, clients, random_inputs(4, LENGTH, seed=10))
    # a committed session, recorded
    recorded: dict = {}
    honest = server._aggregate

    def record(payloads, **kw):
        out = honest(payloads, **kw)
        recorded.update(ins=dict(payloads), out=dict(out), kw=kw)
        return out

    server._aggregate = record
    rounds, errors = _run(server, clients, random_inputs(4, LENGTH, seed=11))
    assert not errors and rounds == [0, 2] and recorded["kw"] == {"committed": True}
    old_session = server.session_id

    # the next session under the same id, with the old aggregate, or client 2's old
    # ciphertexts (behind its fresh commitment) in the new one
    def replay(payloads, **kw):
        if replayed == "stale-aggregate":
            return recorded["out"]
        return honest({**payloads, 2: payloads[2][:NONCE] + recorded["ins"][2][NONCE:]}, **kw)

    server._aggregate = replay
    real = server._rand.bytes
    server._rand.bytes = lambda n: old_session if n == 16 else real(n)
    _committed_ready(server, clients)
    counts = _spy(clients)
    rounds, errors = _run(server, clients, random_inputs(4, LENGTH, seed=12))
    assert server.session_id == old_session
    assert rounds == [0] and set(errors) == set(IDS)
    assert all(e.round == 0 and "used before" in str(e) for e in errors.values())
    assert counts == dict.fromkeys(IDS, 0)
    assert all(clients[c].result is None for c in IDS)


# --- (e) -----------------------------------------------------------------------------
def test_commitments_differ_across_sessions_and_clients(backend):
    server, clients, setup = _roles(backend)  # OS randomness
    seen: list[bytes] = []
    honest = server._route_nonces

    def route(payloads):  # the three-round sessions' nonces (and commitments)
        seen.extend(p[:NONCE] for p in payloads.values())
        return honest(payloads)

    server._route_nonces = route
    for n, forget in enumerate([False, False, False, True, False]):
        if forget:
            server.restore_committed_nonces({})
        inputs = random_inputs(4, LENGTH, seed=n)
        rounds, errors = _run(server, clients, inputs)
        assert not errors and rounds == ([0, 1, 2] if n in (0, 3) else [0, 2])
        _check_sum(backend, clients, inputs)
        _committed_ready(server, clients)
        commitments = [clients[c].committed_nonce() for c in IDS]
        assert all(isinstance(c, bytes) and len(c) == NONCE for c in commitments)
        seen += commitments
    # a second federation of the same key material (OS randomness, not the key's)
    other_server = backend.server(setup.server_material)
    other = _fresh(backend, setup)
    other_server._route_nonces = route
    assert not _run(other_server, other, random_inputs(4, LENGTH, seed=9))[1]
    seen += [other[c].committed_nonce() for c in IDS]
    assert len(seen) == 4 * (3 + 6)  # nonces of 3 sessions, commitments of 6
    assert len(set(seen)) == len(seen)


# --- (f) -----------------------------------------------------------------------------
def _unanswered(server) -> bool:
    flagged = server.last_round_unanswered()
    if not flagged:
        with pytest.raises(ProtocolError):
            server.finish_unanswered()
    return flagged


def test_only_the_decryption_round_is_unanswered(backend):
    server, clients, _ = _roles(backend, seed=13)
    assert not _unanswered(server)  # no session yet
    for n, expected in enumerate([[0, 1, 2], [0, 2], [0, 2]]):
        inputs = random_inputs(4, LENGTH, seed=13 + n)
        messages = server.start(IDS, LENGTH)
        flags = []
        while True:
            flags.append((server.round, _unanswered(server)))
            if server.last_round_unanswered():
                break
            messages = server.step({c: clients[c].step(m, inputs[c]) for c, m in messages.items()})
        assert flags == [(r, r == 2) for r in expected]
        server.finish_unanswered()
        assert server.finished and not _unanswered(server)
        # the clients answer the decryption afterwards and hold the sum; the server
        # takes no more replies
        acks = {c: clients[c].step(m, inputs[c]) for c, m in messages.items()}
        _check_sum(backend, clients, inputs)
        with pytest.raises(ProtocolError):
            server.step(acks)
    # a session that failed is not in its last round either
    inputs = random_inputs(4, LENGTH, seed=20)
    messages = server.start(IDS, LENGTH)
    replies = {c: clients[c].step(m, inputs[c]) for c, m in messages.items()}
    replies[1] = replies[1][:-1]
    with pytest.raises(SecureAggregationError):
        server.step(replies)
    assert not _unanswered(server)


# --- (g) -----------------------------------------------------------------------------
def test_a_restored_client_role_keeps_its_commitment(backend):
    server, clients, setup = _roles(backend, seed=14)
    empty = _fresh(backend, setup)[0].saved_state()
    assert empty["committed"] is None
    first = random_inputs(4, LENGTH, seed=14)
    _run(server, clients, first)
    old_session = server.session_id
    _committed_ready(server, clients)
    # a restarted agent: fresh roles of the same material, its saved state (JSON)
    states = {c: json.loads(json.dumps(clients[c].saved_state())) for c in IDS}
    restarted = _fresh(backend, setup, seed=114)
    for c in IDS:
        restarted[c].restore_state(states[c])
        assert restarted[c].committed_nonce() == clients[c].committed_nonce()
    inputs = random_inputs(4, LENGTH, seed=15)
    rounds, errors = _run(server, restarted, inputs)
    assert not errors and rounds == [0, 2]  # committed
    _check_sum(backend, restarted, inputs)
    # a state without a commitment restores none
    blank = _fresh(backend, setup)[0]
    blank.restore_committed_nonce(b"\x01" * NONCE)
    blank.restore_state(empty)
    assert blank.committed_nonce() is None
    # and the restored roles still refuse the session ids they had joined
    real = server._rand.bytes
    server._rand.bytes = lambda n: old_session if n == 16 else real(n)
    try:
        rounds, errors = _run(server, restarted, random_inputs(4, LENGTH, seed=16))
    finally:
        server._rand.bytes = real
    assert set(errors) == set(IDS) and all("used before" in str(e) for e in errors.values())


@pytest.mark.parametrize(
    "committed",
    ["zz" * NONCE, "ab" * (NONCE - 1), "ab" * (NONCE + 1), "", 123, ["ab" * NONCE]],
    ids=["not-hex", "short", "long", "empty", "int", "list"],
)
def test_a_malformed_saved_commitment_is_refused(backend, committed):
    server, clients, setup = _roles(backend, seed=17)
    _run(server, clients, random_inputs(4, LENGTH, seed=17))
    # without the random state (a role drawing from the OS takes none): only the
    # commitment is wrong
    saved = {**clients[0].saved_state(), "rng": None}
    role = _fresh(backend, setup)[0]
    with pytest.raises(InputError):
        role.restore_state({**saved, "committed": committed})
    if isinstance(committed, str) and all(ch in "0123456789abcdef" for ch in committed):
        with pytest.raises(InputError):
            role.restore_committed_nonce(bytes.fromhex(committed))
    role.restore_state(saved)  # the state as saved is restored
    assert role.committed_nonce() == clients[0].committed_nonce() is not None
