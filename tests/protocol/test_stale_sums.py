"""A client never passes an earlier session's sum off as the result of a new request:
a new request and any integrity error clear the backend's last sum."""

from __future__ import annotations

import numpy as np
import pytest

from botorch_fed.protocol.client import FederatedClient
from botorch_fed.protocol.declarations import ProtocolViolation, contributes
from botorch_fed.protocol.messages import Message
from botorch_fed.secure import SecureAggregationError, get_backend
from tests.helpers.secure_roles import make_roles

IDS = [0, 1, 2]


def _secagg(client, payload):
    return client.handle(Message("secagg", payload)).payload


def _result(client, payload):
    return client.handle(Message("secagg_result", payload)).payload


class _Client(FederatedClient):
    def __init__(self, cid, role):
        super().__init__(cid, role)
        self.value = np.array([1.0 + cid, 2.0, 3.0])

    def sum_encoding(self, request):  # raw float vectors (the server sends wide=0)
        return 0

    @contributes("a")
    def vector_a(self):
        return self.value

    @contributes("b")
    def vector_b(self):
        return self.value + 100.0


def _honest_request(server, clients, request, round_):
    out, first = server.start(IDS, 3), True
    while isinstance(out, dict):
        replies = {}
        for cid, msg in out.items():
            payload = {"data": msg}
            if first:
                payload.update(request=request, wide=0, round=round_)
            replies[cid] = _secagg(clients[cid], payload)["data"]
        first = False
        out = server.step(replies)
    for cid in IDS:
        _result(clients[cid], {})


@pytest.fixture(scope="module")
def ckks_backend():
    return get_backend("ckks")


@pytest.mark.parametrize("damage", ["truncated", "garbage", "none at all"])
def test_an_earlier_sum_is_not_the_result_of_a_new_request(ckks_backend, damage):
    server, roles = make_roles(ckks_backend, IDS, seed=3)
    clients = {cid: _Client(cid, roles[cid]) for cid in IDS}
    _honest_request(server, clients, "a", 1)
    first = clients[0].last_sum.copy()
    np.testing.assert_allclose(first, [6.0, 6.0, 9.0], atol=1e-8)
    # request "b": the server sends client 0 a damaged opening frame (or nothing the
    # secure protocol can use), then claims the session is over
    out = server.start(IDS, 3)
    data = {"truncated": out[0][:20], "garbage": b"\x00" * 64, "none at all": b""}[damage]
    with pytest.raises(SecureAggregationError):
        _secagg(clients[0], {"data": data, "request": "b", "wide": 0, "round": 2})
    with pytest.raises(ProtocolViolation, match="no session pending|holds no decrypted sum"):
        _result(clients[0], {})
    # request b was never accepted: the last sum is still a's, not delivered again as b's
    np.testing.assert_array_equal(clients[0].last_sum, first)


def test_a_new_request_clears_the_backend_sum_before_its_session(ckks_backend):
    server, roles = make_roles(ckks_backend, IDS, seed=4)
    clients = {cid: _Client(cid, roles[cid]) for cid in IDS}
    _honest_request(server, clients, "a", 1)
    assert roles[0].result is not None
    out = server.start(IDS, 3)
    _secagg(clients[0], {"data": out[0], "request": "b", "wide": 0, "round": 2})
    assert roles[0].result is None  # only request b's own session can set it again


def test_a_request_must_open_a_new_session(ckks_backend):
    # request "b" arriving with a later frame of request "a"'s session would finish
    # that session and deliver a's sum as b's
    server, roles = make_roles(ckks_backend, IDS, seed=5)
    clients = {cid: _Client(cid, roles[cid]) for cid in IDS}
    out = server.start(IDS, 3)
    replies = {
        cid: _secagg(clients[cid], {"data": out[cid], "request": "a", "wide": 0, "round": 1})[
            "data"
        ]
        for cid in IDS
    }
    later = server.step(replies)  # round 1 of request a's session
    with pytest.raises(ProtocolViolation, match="opening frame of a new secure session"):
        _secagg(clients[0], {"data": later[0], "request": "b", "wide": 0, "round": 2})
