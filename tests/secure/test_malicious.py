"""A deviating server or client causes an exception, never a silently wrong sum.

The server/client roles are patched to produce validly framed (authenticated) but
wrong payloads, i.e. the deviation comes from a protocol party, not the network.
"""

from __future__ import annotations

import numpy as np
import pytest
import tenseal as ts

from botorch_fed.secure import (
    KeyMismatchError,
    ProtocolError,
    TamperedMessageError,
    TooFewClientsError,
    get_backend,
)
from botorch_fed.secure.wire import PayloadReader, PayloadWriter
from tests.helpers.secure_roles import (
    drive,
    make_roles,
    masking_keys,
    plain_sum,
    random_inputs,
    write_masking_keys,
)

IDS = [0, 1, 2, 3]


@pytest.fixture(scope="module")
def ckks_backend():
    return get_backend("ckks")


def _parse_aggregate(payload: bytes):
    reader = PayloadReader(payload)
    ids = reader.ids()
    blobs = [reader.blob() for _ in range(reader.u32())]
    return ids, blobs


def _write_aggregate(ids, blobs) -> bytes:
    writer = PayloadWriter().ids(ids).u32(len(blobs))
    for blob in blobs:
        writer.blob(blob)
    return writer.getvalue()


def _first_ciphertext(payload: bytes) -> bytes:
    reader = PayloadReader(payload)
    assert reader.u32() >= 1
    return reader.blob()


# ----------------------------------------------------------------------------- CKKS


def test_ckks_honest_run_passes_the_checks(ckks_backend) -> None:
    server, clients = make_roles(ckks_backend, IDS)
    inputs = random_inputs(4, 50, seed=40)
    assert drive(server, clients, inputs) is None
    for cid in IDS:
        assert np.max(np.abs(clients[cid].result - plain_sum(inputs))) <= 1e-8


@pytest.mark.parametrize("attack", ["substitute", "omit", "foreign", "few", "double", "dup_ids"])
def test_ckks_decryptor_detects_a_forged_aggregate(attack: str, ckks_backend) -> None:
    server, clients = make_roles(ckks_backend, IDS)
    inputs = random_inputs(4, 50, seed=41)
    honest = server._aggregate
    other = ckks_backend.setup(IDS)  # another federation's keys, same parameters
    stranger = ckks_backend.client(0, other.for_client(0))

    def forged(payloads):
        if attack == "omit":  # leave client 3 out but claim it contributed
            out = honest({c: p for c, p in payloads.items() if c != 3})
            ids, blobs = _parse_aggregate(next(iter(out.values())))
            message = _write_aggregate(IDS, blobs)
            return dict.fromkeys(out, message)
        out = honest(payloads)
        ids, blobs = _parse_aggregate(next(iter(out.values())))
        if attack == "substitute":  # hand one client's ciphertext as "the sum"
            blobs = [_first_ciphertext(payloads[2])]
        elif attack == "foreign":  # add a ciphertext under another key
            vec = ts.ckks_vector(stranger._context, [0.0] * ckks_backend.params.slots)
            summed = ts.ckks_vector_from(server.context, blobs[0]) + ts.ckks_vector_from(
                server.context, vec.serialize()
            )
            blobs = [summed.serialize()]
        elif attack == "few":  # decrypt "a sum" of fewer than min_clients
            return dict.fromkeys(out, _write_aggregate((0, 2), [_first_ciphertext(payloads[2])]))
        elif attack in ("double", "dup_ids"):  # count client 2 twice
            vec = ts.ckks_vector_from(server.context, blobs[0])
            vec.add_(ts.ckks_vector_from(server.context, _first_ciphertext(payloads[2])))
            blobs = [vec.serialize()]
            if attack == "dup_ids":
                ids = (0, 1, 2, 2, 3)
        return dict.fromkeys(out, _write_aggregate(ids, blobs))

    server._aggregate = forged
    expected = {"few": TooFewClientsError, "dup_ids": ProtocolError}.get(
        attack, TamperedMessageError
    )
    with pytest.raises(expected) as info:
        drive(server, clients, inputs)
    assert info.value.round == 2 and info.value.client_id in IDS
    assert all(clients[c].result is None for c in IDS)


def test_ckks_server_rejects_undecodable_ciphertext(ckks_backend) -> None:
    server, clients = make_roles(ckks_backend, IDS)
    clients[1]._encrypt = lambda reader, x: PayloadWriter().u32(1).blob(b"\x00" * 100).getvalue()
    with pytest.raises(TamperedMessageError, match="deserialise") as info:
        drive(server, clients, random_inputs(4, 5, seed=42))
    assert info.value.client_id == 1 and info.value.round == 1


def test_ckks_server_rejects_ciphertext_of_other_parameters(ckks_backend) -> None:
    small = get_backend(
        "ckks", poly_modulus_degree=4096, coeff_mod_bit_sizes=(60, 49), scale_bits=40
    )
    alien = small.client(2, small.setup(IDS).for_client(2))
    server, clients = make_roles(ckks_backend, IDS)
    clients[2]._context = alien._context  # same key id, wrong context
    with pytest.raises(TamperedMessageError) as info:  # KeyMismatchError is one
        drive(server, clients, random_inputs(4, 5, seed=43))
    assert info.value.client_id == 2 and info.value.round == 1


def test_ckks_client_encrypting_under_another_key_is_caught(ckks_backend) -> None:
    server, clients = make_roles(ckks_backend, IDS)
    rogue = ckks_backend.client(3, ckks_backend.setup(IDS).for_client(3))
    clients[3]._context = rogue._context  # right key id and parameters, wrong key
    with pytest.raises(TamperedMessageError, match="integrity") as info:
        drive(server, clients, random_inputs(4, 5, seed=44))
    assert info.value.round == 2


# -------------------------------------------------------------------------- masking


def test_masking_server_substituting_a_clients_own_key() -> None:
    server, clients = make_roles(get_backend("masking"), IDS)
    honest = server._route_keys

    def forged(payloads):
        out = {}
        for r, payload in honest(payloads).items():
            ids, keys = masking_keys(payload, r)
            keys[1][1] = keys[2][0][::-1]  # a key client 1 never made
            out[r] = write_masking_keys(ids, keys)
        return out

    server._route_keys = forged
    with pytest.raises(KeyMismatchError, match="for client 1 carry no valid tag") as info:
        drive(server, clients, random_inputs(4, 5, seed=45))
    # the first client to read the list (0) refuses it: client 1 did not tag that key
    assert info.value.client_id == 0 and info.value.round == 1


def test_masking_share_swapped_by_server_fails_authentication() -> None:
    server, clients = make_roles(get_backend("masking"), IDS)
    honest = server._route_shares

    def forged(payloads):
        out = honest(payloads)
        out[0], out[1] = out[1], out[0]  # client 0 gets client 1's inbox
        return out

    server._route_shares = forged
    with pytest.raises((TamperedMessageError, ProtocolError)) as info:
        drive(server, clients, random_inputs(4, 5, seed=46))
    assert info.value.round == 2


def test_masking_altered_share_ciphertext_names_the_sender() -> None:
    server, clients = make_roles(get_backend("masking"), IDS)
    honest = server._route_shares

    def forged(payloads):
        out = honest(payloads)
        reader = PayloadReader(out[0])
        ids, n = reader.ids(), reader.u32()
        entries = [(reader.u32(), bytearray(reader.blob())) for _ in range(n)]
        entries[1][1][10] ^= 1
        writer = PayloadWriter().ids(ids).u32(n)
        for sender, ct in entries:
            writer.u32(sender).blob(bytes(ct))
        out[0] = writer.getvalue()
        return out

    server._route_shares = forged
    with pytest.raises(TamperedMessageError, match="from client 2") as info:
        drive(server, clients, random_inputs(4, 5, seed=47))
    assert info.value.client_id == 0 and info.value.round == 2


@pytest.mark.parametrize("which", ["self_mask_seed", "dropped_key"])
def test_masking_wrong_share_at_unmasking_is_caught(which: str) -> None:
    backend = get_backend("masking")
    ids = [0, 1, 2, 3, 4]
    server, clients = make_roles(backend, ids)
    inputs = random_inputs(5, 8, seed=48)
    victim = 1 if which == "self_mask_seed" else 4

    def tamper(rnd, cid, msg):
        if rnd == 3 and cid == 0:  # client 0 lies about its share of `victim`
            s_share, b_share = clients[0]._received[victim]
            clients[0]._received[victim] = (s_share + 1, b_share + 1)
        return msg

    holder = {}

    def drop_four(rnd, replies):
        holder[rnd] = replies
        if which == "dropped_key" and rnd == 2:
            replies = {c: r for c, r in replies.items() if c != 4}
        return replies

    with pytest.raises(TamperedMessageError, match=f"client {victim}") as info:
        drive(server, clients, inputs, tamper_down=tamper, tamper_up=drop_four)
    assert info.value.round == 4


def test_masking_client_refuses_inconsistent_views() -> None:
    backend = get_backend("masking")
    # U3 not a subset of U2.
    server, clients = make_roles(backend, IDS)
    honest = server._collect_masked
    server._collect_masked = lambda p: dict.fromkeys(
        honest(p), PayloadWriter().ids((0, 1, 2, 3, 7)).getvalue()
    )
    with pytest.raises(ProtocolError, match="subset"):
        drive(server, clients, random_inputs(4, 5, seed=49))
    # U3 smaller than the threshold: survivors refuse to send shares.
    server, clients = make_roles(backend, IDS)
    honest = server._collect_masked
    server._collect_masked = lambda p: dict.fromkeys(
        honest(p), PayloadWriter().ids((0, 1)).getvalue()
    )
    with pytest.raises(TooFewClientsError, match="refusing"):
        drive(server, clients, random_inputs(4, 5, seed=50))


def test_masking_client_refuses_a_lowered_threshold() -> None:
    server, clients = make_roles(get_backend("masking"), IDS)
    server._begin = lambda: dict.fromkeys(IDS, PayloadWriter().u32(1).u32(40).getvalue())
    with pytest.raises(ProtocolError, match="threshold 1"):
        drive(server, clients, random_inputs(4, 5, seed=51))
