"""Seeded fuzzing of every backend's deserialisers: 2,000 mutations per backend.

Each mutation alters exactly one frame of one session, in one of two ways:

- **wire** (a third party on the network): the sealed frame's bytes are changed
  (a bit flipped, a byte replaced, the frame truncated or extended);
- **insider** (the sending party itself, server or client): the payload is changed
  *before* the frame is sealed, so the tag is valid and only the protocol's own
  parsing and checks stand in the way.

Every session must then end in a named error (:class:`SecureAggregationError`), or in
the correct sum. One exception: a client that alters the payload carrying its own
input (the masked vector, its ciphertexts, its plaintext vector) merely contributes
another input, which no aggregation protocol can tell from an honest one (input
poisoning is out of scope, docs/security.md): there the sum may differ, but nothing
may raise anything other than a named error. The roles are created once per backend
and reused: after an error they start the next session (fail closed, then recover).

``ckks`` sessions are three-round (the server forgets the clients' commitments first),
committed (the clients encrypt in round 0; the decryption is round 2), committed,
three-round, and so on; wire and insider mutations alternate, their order flipping
every four sessions, so each kind of mutation in each kind of session is followed by
a committed session. A mutation may reach the next session through a commitment (the
nonce a client sends for its next session): before a committed session whose
commitments do not match, an unmutated session shows what the last mutation left
behind, which must again be a named error or the right sum, and an honest three-round
session then makes new ones.
"""

from __future__ import annotations

import numpy as np
import pytest

from botorch_fed.secure import SecureAggregationError, client_role, get_backend, server_role
from botorch_fed.secure.wire import CLIENT_TO_SERVER
from tests.helpers.secure_roles import make_roles, plain_sum, random_inputs
from tests.helpers.secure_sum_bounds import sum_bound

IDS = [0, 1, 2, 3]
LENGTH = 3
MUTATIONS = 2000
# the round in which each backend's client reply carries its input (ckks: a three-round
# session; a committed one encrypts in round 0)
INPUT_ROUND = {"plaintext": 0, "masking": 2, "ckks": 1}
COMMITTED_ROUNDS = (0, 2)  # a committed ckks session has no round 1
# the right sum: plaintext and masking within the bound their roundings give
# (tests/helpers/secure_sum_bounds.py); CKKS (scale 2^40 here) within its encryption noise,
# measured <= 1e-9 (not rounding: a statistical bound)
CKKS_NOISE = 1e-6
OPTIONS = {
    "plaintext": {},
    "masking": {},
    # small CKKS parameters: 2,000 sessions in seconds
    "ckks": {"poly_modulus_degree": 4096, "coeff_mod_bit_sizes": (60, 49), "scale_bits": 40},
}


def _mutate(data: bytes, rng: np.random.Generator) -> bytes:
    buf = bytearray(data)
    op = rng.integers(4) if buf else 3
    if op == 0:  # flip one bit
        i = int(rng.integers(len(buf)))
        buf[i] ^= 1 << int(rng.integers(8))
    elif op == 1:  # replace one byte by a different one
        i = int(rng.integers(len(buf)))
        buf[i] = (buf[i] + 1 + int(rng.integers(255))) % 256
    elif op == 2:  # truncate
        del buf[int(rng.integers(len(buf))) :]
    else:  # extend
        buf += rng.bytes(int(rng.integers(1, 17)))
    return bytes(buf)


def _session(server, clients, inputs, wire):
    """One session; ``wire(direction, round, cid, frame) -> frame``. Returns the
    server's result, or raises the first error."""
    messages = server.start(IDS, LENGTH)
    while True:
        rnd = server.round  # that of the messages (a committed ckks session skips 1)
        replies = {}
        for cid, msg in sorted(messages.items()):
            replies[cid] = clients[cid].step(wire("down", rnd, cid, msg), inputs[cid])
        replies = {cid: wire("up", rnd, cid, r) for cid, r in replies.items()}
        out = server.step(replies)
        if not isinstance(out, dict):
            return out
        messages = out


def _in_step(server, clients) -> bool:
    """Whether the server holds exactly the nonce every client committed to (the next
    session is committed, and no client refuses its opening)."""
    held = server.committed_nonces()
    return all(
        clients[c].committed_nonce() is not None and held.get(c) == clients[c].committed_nonce()
        for c in IDS
    )


@pytest.mark.parametrize("name", ["plaintext", "masking", "ckks"])
def test_every_mutation_ends_in_a_named_error_or_the_right_sum(name, monkeypatch):
    backend = get_backend(name, **OPTIONS[name])
    server, clients = make_roles(backend, IDS, seed=5)
    inputs = random_inputs(len(IDS), LENGTH, seed=5)
    expected = plain_sum(inputs)
    tol = CKKS_NOISE if name == "ckks" else sum_bound(name, inputs)
    rng = np.random.default_rng(["plaintext", "masking", "ckks"].index(name))
    real_seal = server_role.seal_frame
    target: dict = {}

    def seal(**kw):  # the insider: alters its payload, then seals it correctly
        up = kw["direction"] == CLIENT_TO_SERVER
        if (
            target["kind"] == "insider"
            and target["up"] == up
            and target["round"] == kw["round"]
            and target["cid"] == kw["client_id"]
        ):
            kw["payload"] = _mutate(kw["payload"], rng)
            target["hit"] = True
        return real_seal(**kw)

    def wire(direction, rnd, cid, frame):  # the third party: alters the sealed bytes
        if (
            target["kind"] == "wire"
            and target["up"] == (direction == "up")
            and target["round"] == rnd
            and target["cid"] == cid
        ):
            target["hit"] = True
            return _mutate(frame, rng)
        return frame

    def right(sums) -> bool:
        return bool(sums) and all(np.all(np.abs(s - expected) <= tol) for s in sums)

    def unmutated(previous: dict) -> None:
        """Before a committed session whose commitments do not match: what the last
        mutation (``previous``) left behind ends in a named error or the right sum;
        then an honest three-round session makes new commitments."""
        assert previous.get("hit"), f"commitments out of step without a mutation: {previous}"
        target.update(kind=None, hit=False)
        try:
            out = _session(server, clients, inputs, wire)
        except SecureAggregationError:
            outcomes["carried error"] += 1
        else:
            sums = [s for s in [out, *(clients[c].result for c in IDS)] if s is not None]
            assert right(sums), f"after {previous}: a wrong sum {sums} went unnoticed"
            outcomes["carried sum"] += 1
        if not _in_step(server, clients):
            server.restore_committed_nonces({})
            _session(server, clients, inputs, wire)
            assert right([clients[c].result for c in IDS])
        assert _in_step(server, clients)

    monkeypatch.setattr(server_role, "seal_frame", seal)
    monkeypatch.setattr(client_role, "seal_frame", seal)
    outcomes = {"error": 0, "sum": 0, "other input": 0, "missed": 0}
    outcomes.update({"carried error": 0, "carried sum": 0, "committed": 0, "three-round": 0})
    for i in range(MUTATIONS):
        committed = name == "ckks" and i % 4 in (1, 2)
        if committed:
            if not _in_step(server, clients):
                unmutated(dict(target))
            assert set(server.committed_nonces()) == set(IDS)
        elif name == "ckks":  # the three-round session: forget the commitments
            server.restore_committed_nonces({})
        rounds = COMMITTED_ROUNDS if committed else range(len(backend.rounds))
        target.clear()
        target.update(
            kind="wire" if (i + i // 4) % 2 else "insider",
            up=bool(rng.integers(2)),
            round=int(rounds[int(rng.integers(len(rounds)))]),
            cid=IDS[int(rng.integers(len(IDS)))],
            hit=False,
        )
        try:
            out = _session(server, clients, inputs, wire)
        except SecureAggregationError:
            assert target["hit"], f"mutation {i}: an error without a mutation"
            outcomes["error"] += 1
            outcomes["committed" if committed else "three-round"] += 1
            continue
        if not target["hit"]:  # that client was not addressed in that round
            outcomes["missed"] += 1
            continue
        outcomes["committed" if committed else "three-round"] += 1
        sums = [out] if out is not None else [clients[c].result for c in IDS]
        sums = [s for s in sums if s is not None]
        assert sums, f"mutation {i} ({target}): no party holds a sum"
        input_round = 0 if committed else INPUT_ROUND[name]
        own_input = target["kind"] == "insider" and target["up"] and target["round"] == input_round
        if right(sums):
            outcomes["sum"] += 1
        elif own_input:  # another input from that client: not detectable, not a crash
            assert all(s.shape == expected.shape and np.isfinite(s).all() for s in sums)
            outcomes["other input"] += 1
        else:
            raise AssertionError(f"mutation {i} ({target}): a wrong sum {sums} went unnoticed")
    # the mutations reached the protocol: almost all of them were caught
    assert outcomes["missed"] < MUTATIONS // 4, outcomes
    assert outcomes["error"] > MUTATIONS // 2, outcomes
    if name == "ckks":  # both kinds of session were fuzzed, and mutated commitments met
        assert min(outcomes["committed"], outcomes["three-round"]) > MUTATIONS // 3, outcomes
        assert outcomes["carried error"] > 0, outcomes
