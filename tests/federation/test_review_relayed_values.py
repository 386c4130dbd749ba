r"""Review of 7f88441 (clients bind what the server told them into the next secure sum)
from the side of an actively malicious server.

Findings (the review's strict xfails, all fixed and plain tests now; 1 by binding the
transcript into masking's key round, where every client checks every peer):

1. ``masking`` checks the transcript only in the consistency round, among the clients
   that reveal shares. A contributor whose consistency reply the server discards (as
   if it dropped after sending its masked input, which the protocol tolerates) is
   still in ``U3``: its input is summed and the others reveal its self-mask shares,
   while nobody checks its transcript. With ``M = 4`` (``t = 3``) a server that told
   the victim another value gets a "sum" that is the victim's private vector, for any
   victim, with no client noticing. (At 7f88441 a client also reads only the first
   ``t`` signatures, so the victim need not even be dropped when its id is last.)
   Binding the transcript where every client checks every contributor before the
   masked input leaves it (e.g. the round-0 key authentication) would fix it.
2. The chain restarts at every opening, whether or not that session ever yields a sum,
   while the state the relayed values set persists: an equivocation followed by an
   opening the server abandons is bound into nothing (``masking``: the victim's vector;
   ``ckks``: the clients accept). A whole FBO-FedGP run whose server sends client 0
   another support and then opens and abandons one session completes undetected.
3. A round-0 frame without ``request`` starts a backend session with no transcript
   (``FederatedClient.on_secagg`` passes ``transcript=`` only with ``request``), on the
   vector computed at the previous, abandoned opening: an equivocated ``arg:`` of that
   opening gets the server the victim's vector.
4. ``ckks``: a client's own decryption (what it uses) is not chained, only the
   server's (empty) result message; the server can hand clients aggregates over
   different contributor lists, and the next session is accepted.
"""

from __future__ import annotations

import dataclasses
import types

import numpy as np
import pytest

from botorch_fed.federation import FBOFedGPConfig, FederationSetup, run_federated
from botorch_fed.federation.fbo_fedgp import OUTCOME_MOMENTS_LENGTH, FBOFedGPServer
from botorch_fed.federation.messages import Message
from botorch_fed.federation.roles import SECAGG, ProtocolViolation
from botorch_fed.secure import (
    SecureAggregationError,
    get_backend,
)
from botorch_fed.secure.wire import PayloadReader, PayloadWriter
from tests.federation.test_relayed_values import _Client
from tests.helpers.federation_runs import backend_params
from tests.helpers.secure_roles import make_roles

pytestmark = pytest.mark.usefixtures("quiet_single_thread")


def _federation(name, ids=(0, 1, 2), seed=5):
    server, roles = make_roles(get_backend(name), list(ids), seed=seed)
    return server, {cid: _Client(cid, roles[cid]) for cid in ids}


def _drive(
    server, clients, request="a", round_=1, args=None, per_client=None, *,
    stop_after=None, opening=True, drop=None,
):  # fmt: skip
    r"""One secure session run by a malicious server: ``per_client[cid]`` replaces
    opening fields of client ``cid``; a client that raises counts as a dropout (the
    server goes on with the others); ``stop_after``: abandon the session after that
    round; ``opening=False``: round-0 frames without the federation's opening fields;
    ``drop[rnd]``: clients whose reply to round ``rnd`` the server discards.
    Returns what the server obtains and the errors."""
    per_client = per_client or {}
    out, rnd, errors = server.start(sorted(clients), 3), 0, {}
    while isinstance(out, dict):
        replies = {}
        for cid, msg in out.items():
            payload = {"data": msg}
            if rnd == 0 and opening:
                payload.update(request=request, wide=0, round=round_)
                payload.update({f"arg:{k}": v for k, v in (args or {}).items()})
                payload.update(per_client.get(cid, {}))
            try:
                replies[cid] = clients[cid].on_secagg(payload)["data"]
            except (SecureAggregationError, ProtocolViolation) as exc:
                errors[cid] = exc
        for cid in (drop or {}).get(rnd, ()):
            replies.pop(cid, None)
        if stop_after == rnd:
            return None, errors
        rnd += 1
        try:
            out = server.step(replies)
        except SecureAggregationError as exc:
            errors["server"] = exc
            return None, errors
    return out, errors


def _accepted(name, clients, total):
    r"""The sum the attack produced: the server's (masking) or the one every client
    accepted (ckks), else None."""
    if name == "masking":
        return total
    results = [c.secagg.result for c in clients.values()]
    return None if any(r is None for r in results) else results[0]


# --- finding 1: masking checks the transcript only among the revealing clients ------
@pytest.mark.parametrize("victim", [0, 3])
def test_masking_sums_a_victim_whose_consistency_reply_is_dropped(victim):
    server, clients = _federation("masking", (0, 1, 2, 3))
    zero = {cid: {"arg:scale": 0.0} for cid in (0, 1, 2, 3) if cid != victim}
    total, errors = _drive(
        server, clients, args={"scale": 1.0}, per_client=zero, drop={3: {victim}}
    )
    # refused in the key round: every client checks every peer's transcript there
    assert total is None, (
        f"the server unmasked {total}: client {victim}'s private vector is {clients[victim].value}"
    )


# --- finding 2: the chain restarts at an opening that never yields a sum ------------
def _tell_apart(clients):
    r"""The relayed-setting equivocation of test_relayed_values: client 0 keeps its
    vector, the others will contribute zeros."""
    for cid, client in clients.items():
        client.handle(Message("setting", {"scale": 1.0 if cid == 0 else 0.0}))


@pytest.mark.parametrize("name", backend_params("masking", "ckks"))
def test_an_abandoned_opening_launders_an_equivocation(name):
    server, clients = _federation(name)
    _tell_apart(clients)
    _drive(server, clients, stop_after=0)  # opened (every chain restarts), abandoned
    total, errors = _drive(server, clients)
    leaked = _accepted(name, clients, total)
    assert leaked is None, f"{name}: {leaked} is client 0's vector {clients[0].value}"


def _laundering_broadcast(self, type, payload=None, clients=None):
    r"""``FBOFedGPServer.broadcast`` that sends client 0 another support, then opens a
    secure session (the round-0 frames of a ``moments`` sum) and abandons it."""
    ids = self.client_ids if clients is None else tuple(clients)
    payload = dict(payload or {})
    if type != "support":
        return self.send(dict.fromkeys(ids, Message(type, payload)))
    moved = np.clip(np.asarray(payload["support"]) + 0.01, 0.0, 1.0)
    replies = self.send(
        {cid: Message(type, {**payload, "support": moved} if cid == 0 else payload) for cid in ids}
    )
    frames = self.secagg.start(ids, OUTCOME_MOMENTS_LENGTH)
    opening = {"request": "moments", "wide": 0, "round": int(self.ledger.round)}
    self.send({cid: Message(SECAGG, {"data": d, **opening}) for cid, d in frames.items()})
    return replies


@pytest.mark.parametrize("name", backend_params("masking", "ckks"))
def test_an_fbo_fedgp_run_with_a_laundering_opening_completes(name, monkeypatch):
    setup = FederationSetup(
        problem="branin", dim=2, num_clients=3, seed=0, crypto_seed=0, aggregator=name
    )
    config = FBOFedGPConfig.paper(
        num_init=4, support_size=6, num_restarts=2, raw_samples=16, maxiter=20,
        mixing="global", num_rounds=1,
    )  # fmt: skip
    monkeypatch.setattr(FBOFedGPServer, "broadcast", _laundering_broadcast)
    with pytest.raises((SecureAggregationError, ProtocolViolation)):
        run_federated("fbo-fedgp", setup, config)


# --- finding 3: a round-0 frame without `request` binds no transcript ----------------
@pytest.mark.parametrize("name", backend_params("masking", "ckks"))
def test_an_opening_without_request_binds_no_transcript(name):
    server, clients = _federation(name)
    zero = {1: {"arg:scale": 0.0}, 2: {"arg:scale": 0.0}}
    _drive(server, clients, args={"scale": 1.0}, per_client=zero, stop_after=0)
    total, errors = _drive(server, clients, opening=False)
    leaked = _accepted(name, clients, total)
    assert leaked is None, f"{name}: {leaked} is client 0's vector {clients[0].value}"


# --- finding 4: ckks, what a client decrypted is not bound ---------------------------
def _per_client_aggregates(views):
    r"""``_CKKSServer._aggregate`` that hands client ``cid`` the (genuine) aggregate of
    ``views[cid]`` (each holds the client and >= min_clients contributors)."""

    def aggregate(self, payloads):
        n = self.backend.n_chunks(self.length)
        cts = {}
        for cid, data in payloads.items():
            reader = PayloadReader(data)
            assert reader.u32() == n
            cts[cid] = [self._ts.ckks_vector_from(self.context, reader.blob()) for _ in range(n)]
        self._contributors = tuple(sorted(payloads))
        out = {}
        for cid, view in views.items():
            writer = PayloadWriter().ids(view).u32(n)
            for k in range(n):
                acc = cts[view[0]][k] + cts[view[1]][k]
                for v in view[2:]:
                    acc = acc + cts[v][k]
                writer.blob(acc.serialize())
            out[cid] = writer.getvalue()
        return out

    return aggregate


@pytest.mark.parametrize("name", backend_params("ckks"))
def test_ckks_clients_told_different_sums_go_undetected(name):
    server, clients = _federation(name, (0, 1, 2, 3))
    views = {0: (0, 1, 2, 3), 1: (0, 1, 2, 3), 2: (0, 1, 2), 3: (0, 1, 3)}
    server._aggregate = types.MethodType(_per_client_aggregates(views), server)
    _, errors = _drive(server, clients)
    detected = bool(errors)
    sums = {}
    if not detected:
        for cid, client in clients.items():
            try:
                client.on_secagg_result({})
            except ProtocolViolation:
                detected = True
            sums[cid] = client.last_sum
        del server._aggregate
        _, errors = _drive(server, clients, request="b", round_=2)  # uses last_sum
        detected = bool(errors)
    assert detected, f"clients accepted different sums {sums} and then the next session"


# --- what held -----------------------------------------------------------------------
def test_a_relayed_value_sent_to_one_client_mid_session_is_bound_into_the_next():
    r"""A relayed message after a session's last backend round, before its result, to
    one client only: the next masking session yields no sum (M = 3, t = 3)."""
    server, clients = _federation("masking")
    total, errors = _drive(server, clients)
    assert not errors and total is not None
    clients[1].handle(Message("setting", {"scale": 0.0}))
    for client in clients.values():
        client.on_secagg_result({"sum": total})
    total, errors = _drive(server, clients, round_=2)
    assert total is None and errors
    refusals = [e for cid, e in errors.items() if cid != "server"]
    assert refusals and all("told the two clients different values" in str(e) for e in refusals)


@pytest.mark.parametrize("name", backend_params("masking", "ckks"))
def test_honest_four_client_run_with_federated_fit_and_support_reselection(name):
    r"""M = 4 (masking t = 3 < M, where finding 1 lives): an honest FBO-FedGP run with the
    federated fit and support re-selection completes (a fix must keep it so)."""
    setup = FederationSetup(
        problem="branin", dim=2, num_clients=4, seed=1, crypto_seed=0, aggregator=name
    )
    config = FBOFedGPConfig.paper(
        num_init=4, support_size=6, num_restarts=2, raw_samples=16, maxiter=20,
        mixing="global", num_rounds=2, support_every=1, hyperparameters="federated",
    )  # fmt: skip
    result = run_federated("fbo-fedgp", dataclasses.replace(setup), config)
    assert len(result.best_per_round) == 3
