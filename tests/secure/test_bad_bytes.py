"""Tampered, truncated, replayed, misrouted and wrongly keyed bytes raise clearly."""

from __future__ import annotations

import os

import pytest

from botorch_fed.secure import (
    KeyMismatchError,
    ProtocolError,
    TamperedMessageError,
    get_backend,
)
from botorch_fed.secure.wire import HEADER_SIZE, TAG_SIZE, parse_frame, seal_frame
from tests.helpers.secure_roles import drive, flip, make_roles, random_inputs

N_ROUNDS = {"plaintext": 1, "masking": 4, "ckks": 2}
ROUND_CASES = [(n, r) for n, k in N_ROUNDS.items() for r in range(k)]
IDS = [0, 1, 2, 3]


@pytest.fixture(scope="module")
def ckks_backend():
    return get_backend("ckks")


def _roles(name: str, ckks_backend):
    backend = ckks_backend if name == "ckks" else get_backend(name)
    return make_roles(backend, IDS)


def _payload_position(msg: bytes) -> int:
    n = len(msg) - HEADER_SIZE - TAG_SIZE
    return HEADER_SIZE + n // 2 if n else len(msg) - 1


def _on_round(round_, change):
    """A tamper_up hook applying ``change(replies)`` in round ``round_`` only."""

    def hook(rnd, replies):
        return change(dict(replies)) if rnd == round_ else replies

    return hook


@pytest.mark.parametrize(("name", "round_"), ROUND_CASES)
def test_flipped_byte_in_reply(name, round_, ckks_backend) -> None:
    server, clients = _roles(name, ckks_backend)

    def change(replies):
        cid = max(replies)
        replies[cid] = flip(replies[cid], _payload_position(replies[cid]))
        return replies

    with pytest.raises(TamperedMessageError) as info:
        drive(server, clients, random_inputs(4, 10), tamper_up=_on_round(round_, change))
    assert info.value.round == round_ and info.value.client_id is not None
    assert f"client {info.value.client_id}" in str(info.value)
    assert f"round {round_}" in str(info.value)


@pytest.mark.parametrize(("name", "round_"), ROUND_CASES)
def test_flipped_byte_in_server_message(name, round_, ckks_backend) -> None:
    server, clients = _roles(name, ckks_backend)

    def tamper(rnd, cid, msg):
        return flip(msg, _payload_position(msg)) if rnd == round_ else msg

    with pytest.raises(TamperedMessageError) as info:
        drive(server, clients, random_inputs(4, 10), tamper_down=tamper)
    assert info.value.round == round_ and info.value.client_id in IDS


@pytest.mark.parametrize("name", list(N_ROUNDS))
@pytest.mark.parametrize("cut", [1, 40, 10_000])
def test_truncated_reply(name, cut, ckks_backend) -> None:
    server, clients = _roles(name, ckks_backend)
    last = N_ROUNDS[name] - 1

    def change(replies):
        replies[1] = replies[1][: max(len(replies[1]) - cut, 3)]
        return replies

    with pytest.raises(TamperedMessageError, match="truncated") as info:
        drive(server, clients, random_inputs(4, 10), tamper_up=_on_round(last, change))
    assert info.value.client_id == 1


@pytest.mark.parametrize("name", list(N_ROUNDS))
def test_truncated_or_extended_server_message(name, ckks_backend) -> None:
    for change in (lambda m: m[:-1], lambda m: m + b"\x00", lambda m: m[:20]):
        server, clients = _roles(name, ckks_backend)
        with pytest.raises(TamperedMessageError) as info:
            drive(
                server,
                clients,
                random_inputs(4, 10),
                tamper_down=lambda rnd, cid, m, change=change: change(m),
            )
        assert info.value.client_id == 0 and info.value.round == 0


@pytest.mark.parametrize("name", ["masking", "ckks"])
def test_reply_replayed_from_earlier_round(name, ckks_backend) -> None:
    server, clients = _roles(name, ckks_backend)
    history: dict = {}

    def hook(rnd, replies):
        history[rnd] = dict(replies)
        if rnd == 1:
            replies = dict(replies)
            replies[2] = history[0][2]
        return replies

    with pytest.raises(ProtocolError, match="replayed") as info:
        drive(server, clients, random_inputs(4, 10), tamper_up=hook)
    assert info.value.client_id == 2 and info.value.round == 1


@pytest.mark.parametrize(
    ("name", "stale", "at", "refused_in", "match"),
    [("masking", 1, 2, 2, "round"), ("ckks", 0, 1, 0, "used before")],
)
def test_server_message_replayed_from_earlier_round(
    name, stale, at, refused_in, match, ckks_backend
) -> None:
    """A stale later-round message is refused by the client; so is a stale round-0
    message (its session id was joined before: it cannot restart the session)."""
    server, clients = _roles(name, ckks_backend)
    history: dict = {}

    def tamper(rnd, cid, msg):
        history[(rnd, cid)] = msg
        return history[(stale, cid)] if rnd == at and cid == 3 else msg

    with pytest.raises(ProtocolError, match=match) as info:
        drive(server, clients, random_inputs(4, 10), tamper_down=tamper)
    assert info.value.client_id == 3 and info.value.round == refused_in


@pytest.mark.parametrize("name", list(N_ROUNDS))
def test_reply_replayed_from_earlier_session(name, ckks_backend) -> None:
    server, clients = _roles(name, ckks_backend)
    old: dict = {}
    drive(server, clients, random_inputs(4, 10), tamper_up=lambda r, rep: old.setdefault(r, rep))

    def change(replies):
        replies[0] = old[0][0]
        return replies

    with pytest.raises(ProtocolError, match="session") as info:
        drive(server, clients, random_inputs(4, 10), tamper_up=_on_round(0, change))
    assert info.value.client_id == 0


def test_server_message_from_earlier_session_is_refused(ckks_backend) -> None:
    server, clients = _roles("masking", ckks_backend)
    old: dict = {}
    drive(
        server, clients, random_inputs(4, 10), tamper_down=lambda r, c, m: old.setdefault((r, c), m)
    )

    def tamper(rnd, cid, msg):
        return old[(1, cid)] if rnd == 1 else msg

    with pytest.raises(ProtocolError, match="session"):
        drive(server, clients, random_inputs(4, 10), tamper_down=tamper)


@pytest.mark.parametrize("name", list(N_ROUNDS))
def test_reply_under_wrong_client_id(name, ckks_backend) -> None:
    server, clients = _roles(name, ckks_backend)

    def change(replies):
        replies[1], replies[2] = replies[2], replies[1]
        return replies

    with pytest.raises(ProtocolError, match="client 2") as info:
        drive(server, clients, random_inputs(4, 10), tamper_up=_on_round(0, change))
    assert info.value.client_id == 1


@pytest.mark.parametrize("name", list(N_ROUNDS))
def test_reply_from_client_not_asked(name, ckks_backend) -> None:
    server, clients = _roles(name, ckks_backend)

    def change(replies):
        replies[99] = replies[0]
        return replies

    with pytest.raises(ProtocolError, match="not asked") as info:
        drive(server, clients, random_inputs(4, 10), tamper_up=_on_round(0, change))
    assert info.value.client_id == 99


@pytest.mark.parametrize(("name", "round_"), ROUND_CASES)
def test_reply_under_wrong_channel_key(name, round_, ckks_backend) -> None:
    server, clients = _roles(name, ckks_backend)

    def change(replies):
        frame = parse_frame(replies[3])
        replies[3] = seal_frame(
            backend=frame.backend,
            direction=frame.direction,
            round=frame.round,
            session=frame.session,
            client_id=frame.client_id,
            payload=frame.payload,
            key=os.urandom(32),
        )
        return replies

    with pytest.raises(TamperedMessageError, match="authentication") as info:
        drive(server, clients, random_inputs(4, 10), tamper_up=_on_round(round_, change))
    assert info.value.client_id == 3 and info.value.round == round_


def test_ckks_client_with_another_federations_key(ckks_backend) -> None:
    server, clients = make_roles(ckks_backend, IDS)
    other = ckks_backend.setup(IDS)
    clients[2] = ckks_backend.client(2, other.for_client(2))
    with pytest.raises(KeyMismatchError) as info:
        drive(server, clients, random_inputs(4, 10))
    assert info.value.client_id == 2 and info.value.round == 0


def test_not_bytes_and_out_of_order_calls(ckks_backend) -> None:
    server, clients = _roles("masking", ckks_backend)
    with pytest.raises(ProtocolError, match="no session"):
        server.step({})
    msgs = server.start(IDS, 3)
    with pytest.raises(ProtocolError, match="bytes"):
        clients[0].step("not bytes", [0.0, 0.0, 0.0])
    with pytest.raises(ProtocolError, match="mapping"):
        server.step([msgs[0]])
    masking = get_backend("masking")
    fresh = masking.client(0, masking.setup(IDS).for_client(0))
    with pytest.raises(TamperedMessageError, match="truncated"):
        fresh.step(b"")
    plain_server, plain_clients = _roles("plaintext", ckks_backend)
    inputs = random_inputs(4, 3)
    drive(plain_server, plain_clients, inputs)
    with pytest.raises(ProtocolError, match="no session"):
        plain_server.step({})
