"""Structural privacy: what the server receives never contains a client's input."""

from __future__ import annotations

import numpy as np
import pytest
import tenseal as ts

from botorch_fed.secure import fixed_point as fp
from botorch_fed.secure import get_backend
from botorch_fed.secure.wire import HEADER_SIZE, TAG_SIZE, PayloadReader, parse_frame
from tests.helpers.secure_roles import drive, make_roles, plain_sum, random_inputs


def _all_bytes(obj, seen=None):
    """Every bytes value reachable from an object's attributes / containers."""
    seen = set() if seen is None else seen
    if id(obj) in seen:
        return []
    seen.add(id(obj))
    if isinstance(obj, bytes | bytearray):
        return [bytes(obj)]
    out = []
    if isinstance(obj, dict):
        for k, v in obj.items():
            out += _all_bytes(k, seen) + _all_bytes(v, seen)
    elif isinstance(obj, list | tuple | set | frozenset):
        for v in obj:
            out += _all_bytes(v, seen)
    elif hasattr(obj, "__dict__") and not isinstance(obj, type):
        out += _all_bytes(vars(obj), seen)
    return out


def _assert_no_plaintext(received: list[bytes], inputs: dict[int, np.ndarray]) -> None:
    n = len(inputs)
    for x in inputs.values():
        encoded = fp.encode(x, n)
        for blob in received:
            assert x.tobytes() not in blob
            assert encoded.tobytes() not in blob
            # Not even a single float64 of the input (8-byte patterns: a chance match in
            # ~3 MB of random ciphertext has probability ~1e-11; 4-byte float32 patterns
            # would match by chance, so they are not checked).
            for value in x[:32]:
                assert value.tobytes() not in blob


@pytest.mark.parametrize("name", ["masking", "ckks"])
def test_server_never_receives_a_plaintext_input(name: str) -> None:
    inputs = random_inputs(5, 64, seed=20)
    server, clients = make_roles(get_backend(name), sorted(inputs))
    received: list[bytes] = []
    drive(server, clients, inputs, received=received)
    assert len(received) >= len(inputs)
    _assert_no_plaintext(received, inputs)
    # Sanity of the check itself: the plaintext backend does leak, and it is caught.
    server, clients = make_roles(get_backend("plaintext"), sorted(inputs))
    leaked: list[bytes] = []
    drive(server, clients, inputs, received=leaked)
    with pytest.raises(AssertionError):
        _assert_no_plaintext(leaked, inputs)


def test_masked_inputs_decode_to_noise() -> None:
    inputs = random_inputs(5, 64, seed=21)
    server, clients = make_roles(get_backend("masking"), sorted(inputs))
    received: list[bytes] = []
    drive(server, clients, inputs, received=received)
    masked = []
    for blob in received:
        frame = parse_frame(blob)
        if frame.round == 2:  # masked_input
            masked.append(PayloadReader(frame.payload).array("u", 64))
    assert len(masked) == 5
    for y in masked:
        decoded = fp.decode(y)
        for x in inputs.values():
            assert np.max(np.abs(decoded - x)) > 1e3  # uniform mod 2^64, not x
    # ... while their sum (what the masks are designed to reveal) is not noise-free
    # without unmasking: the self masks are still in it.
    total = np.zeros(64, dtype=np.uint64)
    for y in masked:
        total += y
    assert np.max(np.abs(fp.decode(total) - plain_sum(inputs))) > 1e3


def test_masking_server_holds_no_client_secret() -> None:
    inputs = random_inputs(5, 16, seed=22)
    server, clients = make_roles(get_backend("masking"), sorted(inputs))
    drive(server, clients, inputs)
    secrets = []
    for c in clients.values():
        secrets += [c._c_private.private_bytes_raw(), c._s_private.private_bytes_raw(), c._b]
    server_bytes = set(_all_bytes(server))
    assert server_bytes  # the walk found the server's state
    for s in secrets:
        assert s not in server_bytes
        assert all(s not in b for b in server_bytes)


def test_ckks_server_cannot_decrypt() -> None:
    inputs = random_inputs(3, 32, seed=23)
    backend = get_backend("ckks")
    server, clients = make_roles(backend, sorted(inputs))
    assert not server.context.is_private()
    received: list[bytes] = []
    out = drive(server, clients, inputs, received=received)
    assert out is None  # release="clients": the server gets no decryption at all
    total = clients[0].result
    assert np.max(np.abs(total - plain_sum(inputs))) <= 1e-8
    # Round-2 replies are empty acknowledgements: no sum travels to the server.
    acks = [parse_frame(b) for b in received if parse_frame(b).round == 2]
    assert acks and all(len(f.payload) == 0 for f in acks)
    assert all(len(b) == HEADER_SIZE + TAG_SIZE for b in received if parse_frame(b).round == 2)
    # Take a client's ciphertext (its round-1 reply) as the server saw it; decrypt it.
    frame = next(parse_frame(b) for b in received if parse_frame(b).round == 1)
    assert frame.client_id == 0
    reader = PayloadReader(frame.payload)
    assert reader.u32() == 1
    blob = reader.blob()
    vec = ts.ckks_vector_from(server.context, blob)
    with pytest.raises(ValueError, match="secret"):
        vec.decrypt()
    # A client's context does decrypt it (so the check above is meaningful).
    values = ts.ckks_vector_from(clients[1]._context, blob).decrypt()
    assert np.max(np.abs(np.asarray(values[:32]) - inputs[0])) <= 1e-8


def test_ckks_server_material_has_no_secret_key() -> None:
    backend = get_backend("ckks", encryption="asymmetric")
    setup = backend.setup([0, 1, 2])
    from botorch_fed.secure.ckks_keys import ClientKeyMaterial, ServerKeyMaterial

    public = ServerKeyMaterial.from_bytes(setup.server_material)
    assert not ts.context_from(public.context).is_private()
    secret = ClientKeyMaterial.from_bytes(setup.for_client(1))
    assert ts.context_from(secret.context).is_private()
    assert secret.group_key not in setup.server_material
