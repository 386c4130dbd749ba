"""CKKS at large magnitudes: honest, refused before encryption, or detected as forged.

CKKS's error grows with the magnitudes encrypted (SEAL's double-precision FFT), in
the data slots and in the guard slots alike. The promise (``CKKSBackend`` docstring,
``docs/security.md``): for ``M`` contributors with ``max|x_i| <=
max_abs_supported(M)`` (``2^30 / M`` by default) every value of the sum is within
``error_bound(M, sum_i max|x_i|) = M * 2^(20 - scale_bits) + 2^-46 * sum_i max|x_i|``
of the exact sum, i.e. ``M * 9.3e-10`` absolute plus a relative ``1.4e-14`` of
``sum_i max|x_i|`` at the default scale. Larger inputs raise HeadroomError on the
client before it encrypts; forged aggregates still raise TamperedMessageError.
"""

from __future__ import annotations

import numpy as np
import pytest
import tenseal as ts

from botorch_fed.secure import (
    HeadroomError,
    TamperedMessageError,
    aggregate,
    get_backend,
)
from botorch_fed.secure.ckks_keys import GUARD_BUDGET_BITS, REL_ERROR_BITS
from botorch_fed.secure.wire import PayloadReader, PayloadWriter
from tests.helpers.secure_roles import drive, make_roles, plain_sum

IDS = [0, 1, 2, 3]


@pytest.fixture(scope="module")
def ckks_backend():
    return get_backend("ckks")


def _promised(backend, inputs) -> float:
    """The documented error bound for these inputs."""
    mags = sum(float(np.max(np.abs(x))) for x in inputs.values())
    return backend.error_bound(len(inputs), mags)


def _check_sum(backend, inputs, total) -> None:
    expected = plain_sum(inputs)
    err = float(np.max(np.abs(total - expected)))
    assert err <= _promised(backend, inputs), err
    # The relative form of the promise: 2^-46 of sum_i max|x_i| plus M * 2^-30.
    mags = sum(float(np.max(np.abs(x))) for x in inputs.values())
    assert err <= 1.5e-14 * mags + len(inputs) * 1e-9


# ------------------------------------------------------------------------- the bound


def test_max_abs_supported_values(ckks_backend) -> None:
    assert REL_ERROR_BITS - GUARD_BUDGET_BITS == 30
    for m, approx in [(3, 3.579e8), (10, 1.074e8), (100, 1.074e7)]:
        bound = ckks_backend.max_abs_supported(m)
        assert bound == 2.0**30 / m
        assert bound == pytest.approx(approx, rel=1e-3)
        assert bound < ckks_backend.params.wrap_bound(m)  # precision, not wrap, limits
        # The guard tolerance at the bound stays within the 2^-16 budget.
        tol = ckks_backend.params.guard_tolerance(m, m)
        assert tol <= m * 2.0**-30 + 2.0**-16 * (1 + 1e-12)
    # Parameters with little headroom are still limited by wrap-around.
    small = get_backend(
        "ckks", poly_modulus_degree=4096, coeff_mod_bit_sizes=(60, 49), scale_bits=40
    )
    assert small.max_abs_supported(10) == small.params.wrap_bound(10) < 2.0**30 / 10


def test_honest_inputs_pass_the_guard_check_up_to_the_headroom(ckks_backend) -> None:
    """Honest inputs up to magnitude 8e7 (10 clients) pass the guard check and meet the
    error bound; 8e10 exceeds the headroom: HeadroomError naming client 0 and round 0."""
    for scale in (1.0, 1e3, 1e6):
        inputs = {i: np.array([40.0, -56.0 * scale, 80.0 * scale]) for i in range(10)}
        _check_sum(ckks_backend, inputs, aggregate(ckks_backend, inputs, seed=0))
    inputs = {i: np.array([40.0, -56.0e9, 80.0e9]) for i in range(10)}
    with pytest.raises(HeadroomError, match="exceeds") as info:
        aggregate(ckks_backend, inputs, seed=0)
    assert info.value.client_id == 0 and info.value.round == 0


def _inputs(pattern: str, m: int, length: int, bound: float, seed: int):
    rng = np.random.default_rng(seed)
    if pattern == "constant":  # every value exactly at the bound
        return {i: np.full(length, bound) for i in range(m)}
    if pattern == "random":  # uniform, each client touching +-bound once
        out = {i: bound * rng.uniform(-1.0, 1.0, length) for i in range(m)}
        for i, x in out.items():
            x[rng.integers(length)] = bound * (-1.0) ** i
        return out
    if pattern == "cancelling":  # huge inputs, small sum: the worst case for the guard
        base = (bound - 1.0) * rng.choice([-1.0, 1.0], length)
        return {i: base * (-1.0) ** i + rng.uniform(-1.0, 1.0, length) for i in range(m)}
    if pattern == "mixed":  # one client at the bound, the others ~1
        out = {i: rng.uniform(-1.0, 1.0, length) for i in range(m)}
        out[m - 1] = np.where(np.arange(length) % 2 == 0, bound, -bound)
        return out
    raise AssertionError(pattern)


@pytest.mark.parametrize(
    ("pattern", "m", "length"),
    [
        ("constant", 3, 50),
        ("constant", 10, 561),
        ("random", 10, 561),
        ("random", 3, 4093),  # two ciphertexts, the second mostly padding
        ("cancelling", 10, 4092),
        ("cancelling", 4, 30),
        ("mixed", 10, 100),
    ],
)
def test_honest_inputs_up_to_the_bound(ckks_backend, pattern: str, m: int, length: int) -> None:
    bound = ckks_backend.max_abs_supported(m)
    inputs = _inputs(pattern, m, length, bound, seed=m * 7 + length)
    assert max(float(np.max(np.abs(x))) for x in inputs.values()) <= bound
    _check_sum(ckks_backend, inputs, aggregate(ckks_backend, inputs, seed=3))


@pytest.mark.parametrize(
    "options",
    [
        {"encryption": "asymmetric"},  # the larger (public-key) encryption noise
        {"encryption": "symmetric", "n_threads": 2},
    ],
)
def test_honest_inputs_at_the_bound_variants(options: dict) -> None:
    backend = get_backend("ckks", **options)
    inputs = _inputs("cancelling", 5, 300, backend.max_abs_supported(5), seed=11)
    _check_sum(backend, inputs, aggregate(backend, inputs))


def test_hundred_clients_at_the_bound() -> None:
    backend = get_backend("ckks")
    bound = backend.max_abs_supported(100)
    assert bound == pytest.approx(1.074e7, rel=1e-3)
    inputs = _inputs("random", 100, 40, bound, seed=12)
    _check_sum(backend, inputs, aggregate(backend, inputs))


# ----------------------------------------------------------------------- above it


class _CountingTenSEAL:
    """Stands in for the tenseal module of one client and counts its encryptions."""

    def __init__(self) -> None:
        self.encryptions = 0

    def ckks_vector(self, *args, **kwargs):
        self.encryptions += 1
        return ts.ckks_vector(*args, **kwargs)

    def __getattr__(self, name: str):
        return getattr(ts, name)


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_inputs_above_the_bound_raise_before_encryption(ckks_backend, sign: float) -> None:
    m = 10
    ids = list(range(m))
    bound = ckks_backend.max_abs_supported(m)
    server, clients = make_roles(ckks_backend, ids)
    spies = {cid: _CountingTenSEAL() for cid in ids}
    for cid in ids:
        clients[cid]._ts = spies[cid]
    inputs = {cid: np.full(7, bound) for cid in ids}  # at the bound: fine
    inputs[6] = inputs[6].copy()
    inputs[6][3] = sign * np.nextafter(bound, np.inf)  # one ulp above: refused
    messages = server.start(ids, 7)
    replies = {}
    for cid in ids:
        if cid == 6:
            with pytest.raises(HeadroomError, match="exceeds") as info:
                clients[cid].step(messages[cid], inputs[cid])
            assert info.value.client_id == 6 and info.value.round == 0
            assert "nonces" in str(info.value)  # the round's name
        else:
            replies[cid] = clients[cid].step(messages[cid], inputs[cid])
    assert clients[6].session_id is None  # the client abandoned the session
    messages = server.step(replies)  # the others go on without client 6
    assert 6 not in messages
    for cid, msg in messages.items():
        clients[cid].step(msg, inputs[cid])
    assert spies[6].encryptions == 0  # refused before encrypting anything
    assert all(spies[cid].encryptions == 1 for cid in ids if cid != 6)


# ------------------------------------------------------------------------ tampering


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


ATTACKS = ["omit", "double", "substitute", "guard_offset", "plain_mask", "plain_scale"]


@pytest.mark.parametrize("attack", ATTACKS)
def test_tampering_detected_at_large_magnitudes(attack: str) -> None:
    # Asymmetric encryption so the server can also encrypt offsets of its own.
    backend = get_backend("ckks", encryption="asymmetric")
    bound = backend.max_abs_supported(len(IDS))
    d = backend.params.data_slots
    server, clients = make_roles(backend, IDS)
    inputs = _inputs("cancelling", len(IDS), 20, bound, seed=13)
    honest = server._aggregate

    def forged(payloads):
        if attack == "omit":  # leave client 3 out but claim it contributed
            out = honest({c: p for c, p in payloads.items() if c != 3})
            _, blobs = _parse_aggregate(next(iter(out.values())))
            return dict.fromkeys(out, _write_aggregate(IDS, blobs))
        out = honest(payloads)
        ids, blobs = _parse_aggregate(next(iter(out.values())))
        agg = ts.ckks_vector_from(server.context, blobs[0])
        own = ts.ckks_vector_from(server.context, _first_ciphertext(payloads[2]))
        if attack == "double":  # count client 2 twice
            forged_vec = agg + own
        elif attack == "substitute":  # one client's ciphertext as "the sum"
            forged_vec = own
        elif attack == "guard_offset":  # shift the guards by far less than a canary
            offset = [0.0] * d + [2.0**-12] * 4
            forged_vec = agg + ts.ckks_vector(server.context, offset)
        elif attack == "plain_mask":  # client 2's data slots with the sum's guards
            keep = [1.0] * d + [0.0] * 4
            forged_vec = own.mul(keep) + agg.mul([1.0 - w for w in keep])
        else:  # "plain_scale": multiply by ones (changes the scale only)
            forged_vec = agg.mul([1.0] * backend.params.slots)
        return dict.fromkeys(out, _write_aggregate(ids, [forged_vec.serialize()]))

    server._aggregate = forged
    with pytest.raises(TamperedMessageError, match="integrity") as info:
        drive(server, clients, inputs)
    assert info.value.round == 2 and info.value.client_id in IDS
    if attack.startswith("plain_"):
        assert "scale" in str(info.value)
    assert all(clients[c].result is None for c in IDS)


@pytest.mark.parametrize("delta", [1.0, -3.0, 1e3])
def test_an_offset_on_a_data_slot_is_refused_whatever_the_data(delta: float) -> None:
    # The server may add a plaintext to the aggregate (scale, level and size stay those
    # of a sum of fresh ciphertexts). Were only the canaries checked, the magnitude
    # check would refuse the offset sum where the data are near the bound and accept it
    # elsewhere: one bit of the sum per session (a bisection recovers it). The guard
    # slots' secret linear tag of the data refuses every offset, whatever the data.
    backend = get_backend("ckks", encryption="asymmetric")
    bound = backend.max_abs_supported(len(IDS))
    outcomes = []
    for near_bound in (False, True):
        server, clients = make_roles(backend, IDS, seed=3)
        inputs = {c: np.full(8, 0.25) for c in IDS}
        if near_bound:  # the sum at slot 5 within delta of the magnitude bound
            for c in IDS:
                inputs[c][5] = np.sign(delta) * (bound - abs(delta) / (2 * len(IDS)))
        honest = server._aggregate

        def offset(payloads, honest=honest, context=server.context):
            out = honest(payloads)
            ids, blobs = _parse_aggregate(next(iter(out.values())))
            plain = [0.0] * backend.params.slots
            plain[5] = delta
            vec = ts.ckks_vector_from(context, blobs[0]) + ts.ckks_vector(context, plain)
            return dict.fromkeys(out, _write_aggregate(ids, [vec.serialize()]))

        server._aggregate = offset
        try:
            drive(server, clients, inputs)
            outcomes.append("accepted")
        except TamperedMessageError as exc:
            outcomes.append("tag" if "the data's tag" in str(exc) else str(exc))
    assert outcomes == ["tag", "tag"]


@pytest.mark.parametrize("delta", [1.0, -1.0, 2.0])
def test_a_small_integer_offset_with_guessed_compensation_fails_the_tags(delta: float) -> None:
    # Limb digits are integers: an offset of +-1 on one slot moves a decoded value by a
    # power of two, so it must not pass. The server cannot know the tag weights (in
    # [s, 2s), s = 1/(2 data slots)); it compensates every guard slot by their mean
    # 1.5 s delta. With the declared input bound (limb digits: 2048) the tolerance is
    # ~1e-9 and every trial fails; with the weights themselves (only the group key
    # gives them) the same offset passes: the check is the tag.
    from botorch_fed.secure.ckks_guards import _tag_weights

    backend = get_backend("ckks", encryption="asymmetric")
    d, s = backend.params.data_slots, 1.0 / (2 * backend.params.data_slots)
    outcomes = []
    for trial in range(8):
        for exact in (False, True):
            server, clients = make_roles(backend, IDS, seed=trial)
            for role in clients.values():
                role.input_bound = 2048.0
            rng = np.random.default_rng(trial)
            inputs = {c: rng.integers(-2048, 2049, 16).astype(float) for c in IDS}
            honest = server._aggregate
            victim = clients[IDS[0]]

            def offset(payloads, honest=honest, context=server.context, exact=exact, victim=victim):
                out = honest(payloads)
                ids, blobs = _parse_aggregate(next(iter(out.values())))
                plain = np.zeros(backend.params.slots)
                plain[5] = delta
                if exact:  # what only a holder of the group key can compute
                    w = _tag_weights(victim._group_key, victim._binding, 0, 16, d)
                    plain[d:] = w[:, 5] * delta
                else:
                    plain[d:] = 1.5 * s * delta
                vec = ts.ckks_vector_from(context, blobs[0]) + ts.ckks_vector(
                    context, plain.tolist()
                )
                return dict.fromkeys(out, _write_aggregate(ids, [vec.serialize()]))

            server._aggregate = offset
            try:
                drive(server, clients, inputs)
                outcomes.append((exact, "passed"))
            except TamperedMessageError as exc:
                outcomes.append((exact, "tag" if "the data's tag" in str(exc) else str(exc)))
    assert outcomes == [(False, "tag"), (True, "passed")] * 8
