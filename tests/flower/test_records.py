r"""Payloads on Flower's wire: every kind a protocol message carries survives
:func:`to_records`, Flower's own encoding (tests/helpers/fake_grid.py's :func:`wire`) and
:func:`from_records` unchanged; what the wire cannot carry is refused when the message
is built, naming the key, in process as on Flower; a malformed frame makes
:func:`decode_frame` raise ``ValueError``."""

from __future__ import annotations

import json
import re
import struct

import numpy as np
import pytest

pytest.importorskip("flwr")

from flwr.app import ConfigRecord, Message, RecordDict  # noqa: E402

from botorch_fed.flower.records import decode_frame, from_records, to_records  # noqa: E402
from botorch_fed.protocol.messages import Message as ProtocolMessage  # noqa: E402
from botorch_fed.protocol.payloads import INT_RANGE, validate_payload  # noqa: E402
from tests.helpers.fake_grid import FakeGrid, wire  # noqa: E402


def _travel(payload: dict) -> dict:
    return from_records(wire(Message(to_records(payload), 1, "query.x", group_id="0")).content)


@pytest.fixture
def task_identity(tmp_path):
    FakeGrid(0, str(tmp_path))  # Flower's Message needs the task identity it sets


PAYLOADS = {
    "int bounds": {"lo": INT_RANGE[0], "hi": INT_RANGE[1], "mid": 2**63, "zero": 0},
    "numpy scalars": {"i": np.int64(-3), "u": np.uint64(2**64 - 1), "f": np.float32(0.1)},
    "floats": {"nan": float("nan"), "inf": float("-inf"), "neg0": -0.0, "tiny": 5e-324},
    "bytes and text": {"b": b"", "b2": bytes(range(256)), "s": "naive café ∑", "e": ""},
    "bools": {"t": True, "f": np.bool_(False)},
    "arrays": {
        "f64": np.linspace(-1, 1, 7),
        "f32": np.arange(5, dtype=np.float32),
        "u64": np.array([0, 2**64 - 1], dtype=np.uint64),
        "i8": np.array([-128, 127], dtype=np.int8),
        "bool": np.array([True, False]),
        "empty": np.zeros((0, 3)),
        "scalar": np.array(2.5),
        "fortran": np.asfortranarray(np.arange(6.0).reshape(2, 3)),
        "big-endian": np.arange(4, dtype=">f8"),
    },
    "empty": {},
}


@pytest.mark.parametrize("name", list(PAYLOADS))
def test_every_payload_kind_survives_flowers_wire(name, task_identity):
    payload = PAYLOADS[name]
    out = _travel(payload)
    assert list(out) == list(payload)
    for key, value in payload.items():
        got = out[key]
        if isinstance(value, np.ndarray):
            assert got.shape == value.shape and got.dtype.newbyteorder(
                "="
            ) == value.dtype.newbyteorder("=")
            np.testing.assert_array_equal(got, value)
        elif isinstance(value, float | np.floating) and np.isnan(value):
            assert np.isnan(got)
        else:
            assert got == value and type(got) is type(
                value.item() if hasattr(value, "item") else value
            )
            if isinstance(value, float) and value == 0:
                assert np.copysign(1, got) == np.copysign(1, value)


@pytest.mark.parametrize(
    "payload, match",
    [
        ({"seed": 2**64}, r"'seed' = 18446744073709551616 is outside \[-2\*\*63, 2\*\*64 - 1\]"),
        ({"seed": -(2**63) - 1}, r"'seed' = -9223372036854775809 is outside"),
        ({"name": "bad \udc80"}, "Payload entry 'name' is not valid Unicode text"),
        ({"bad \ud800": 1}, "Payload key 'bad \\\\ud800' is not valid Unicode text"),
        ({"big": np.longdouble("1e400")}, r"Payload entry 'big' = 1e\+400 is beyond float64"),
    ],
)
def test_what_the_wire_cannot_carry_is_refused_naming_the_key(payload, match, task_identity):
    with pytest.raises(ValueError, match=match):
        validate_payload(payload)
    with pytest.raises(ValueError, match=match):
        ProtocolMessage("x", payload)  # in process as on Flower
    with pytest.raises(ValueError, match=match.split(" is ")[0]):
        to_records(payload)


@pytest.mark.parametrize(
    "value",
    [np.array([1 + 2j]), np.array(["a"]), np.array([1], dtype="datetime64[s]"),
     np.array([None], dtype=object)],
)  # fmt: skip
def test_arrays_of_other_than_numbers_are_refused_in_process_as_on_the_wire(value):
    match = f"Payload entry 'v' is a {value.dtype} array"
    with pytest.raises(TypeError, match=re.escape(match)):
        validate_payload({"v": value})
    with pytest.raises(TypeError, match=re.escape(match)):
        to_records({"v": value})


def test_a_long_double_within_float64_travels_as_float(task_identity):
    # only finite values beyond float64 are refused: infinities and NaN are floats too
    payload = {"x": np.longdouble(0.5), "inf": np.longdouble("-inf"), "nan": np.longdouble("nan")}
    got = _travel(validate_payload(payload))
    assert got["x"] == 0.5 and got["inf"] == -np.inf and np.isnan(got["nan"])


def test_the_fake_grid_sends_messages_through_the_wire(task_identity, tmp_path):
    # a record Flower holds in memory but cannot encode: the in-memory grid must fail
    # as a deployment does, so the tests on it cover the wire
    grid = FakeGrid(1, str(tmp_path))
    node = grid.get_node_ids()[0]
    content = RecordDict({"config": ConfigRecord({"x": 2**70})})
    message = Message(content, node, "query.hello", group_id="0")
    with pytest.raises(ValueError, match="out of range"):
        grid.push_messages([message])


def _body(header: bytes) -> bytes:
    return struct.pack("<Q", len(header)) + header


@pytest.mark.usefixtures("quiet_single_thread")
@pytest.mark.parametrize(
    "header",
    [
        json.dumps({"meta": {}, "entries": [["k", "a", "<f8", [2**70]]]}).encode(),
        b"[" * 100_000 + b"]" * 100_000,
    ],
    ids=["shape-beyond-int64", "deeply-nested-header"],
)
def test_a_malformed_frame_raises_value_error(header):
    with pytest.raises(ValueError, match="malformed frame"):
        decode_frame(_body(header))
