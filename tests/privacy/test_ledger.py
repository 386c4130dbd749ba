r"""PrivacyLedger: per-user basic composition (Dwork & Roth 2014, Thm 3.16), reports,
merging and checkpoints."""

from __future__ import annotations

import io
import json
import math

import numpy as np
import pytest
import torch

from botorch_fed.privacy import LaplaceMechanism, PrivacyLedger


def test_k_calls_of_one_value():
    ledger = PrivacyLedger()
    mech = LaplaceMechanism(0.1, 1.0, 0.5, seed=0, ledger=ledger, user="alice")
    k = 7
    for _ in range(k):
        mech(torch.tensor([0.3]))
    assert ledger.releases("alice") == k
    eps, delta = ledger.spent("alice")
    assert eps == pytest.approx(math.fsum([0.1] * k), rel=1e-15)
    assert delta == 0.0
    assert ledger.users == ["alice"]


def test_vector_counts_each_value():
    ledger = PrivacyLedger()
    LaplaceMechanism(0.5, 1.0, 0.5, seed=0, ledger=ledger, user=3)(torch.zeros(4, 3))
    assert ledger.releases(3) == 12
    assert ledger.spent(3) == pytest.approx((6.0, 0.0))


def test_mixed_parameters_sum():
    ledger = PrivacyLedger()
    ledger.record("u", epsilon=0.5, count=3)
    ledger.record("u", epsilon=0.25, delta=1e-3, count=4, clipped=2)
    ledger.record("u", epsilon=0.5)
    eps, delta = ledger.spent("u")
    assert eps == pytest.approx(4 * 0.5 + 4 * 0.25)
    assert delta == pytest.approx(4e-3)
    assert ledger.releases("u") == 8
    assert ledger.clipped("u") == 2
    assert ledger.breakdown("u") == [(0.5, 0.0, 4), (0.25, 1e-3, 4)]


def test_users_are_separate_and_unknown_users_spent_nothing():
    ledger = PrivacyLedger()
    a = LaplaceMechanism(1.0, 1.0, 0.5, seed=0, ledger=ledger, user=0)
    b = LaplaceMechanism(0.5, 1.0, 0.5, seed=1, ledger=ledger, user=1)
    a(torch.zeros(2))
    b(torch.tensor([10.0]))
    b(torch.tensor([0.0]))
    assert ledger.users == [0, 1]
    assert (ledger.releases(0), ledger.spent(0), ledger.clipped(0)) == (2, (2.0, 0.0), 0)
    assert (ledger.releases(1), ledger.spent(1), ledger.clipped(1)) == (2, (1.0, 0.0), 1)
    assert (ledger.releases(2), ledger.spent(2), ledger.clipped(2)) == (0, (0.0, 0.0), 0)
    assert ledger.releases(np.int64(0)) == 2  # numpy integers name the same user
    assert len(ledger) == 2


def test_merge_sums_and_leaves_inputs_alone():
    x, y = PrivacyLedger(), PrivacyLedger()
    x.record("a", epsilon=1.0, count=2, clipped=1)
    x.record("b", epsilon=0.5)
    y.record("a", epsilon=1.0, count=3)
    y.record("c", epsilon=0.2, delta=0.01, count=5, clipped=5)
    x_before, y_before = x.state_dict(), y.state_dict()
    z = x.merge(y)
    assert z is not x and z is not y
    assert x.state_dict() == x_before and y.state_dict() == y_before
    assert z.users == ["a", "b", "c"]
    assert (z.releases("a"), z.spent("a"), z.clipped("a")) == (5, (5.0, 0.0), 1)
    assert z.spent("b") == (0.5, 0.0)
    assert z.spent("c") == pytest.approx((1.0, 0.05))
    assert z.clipped("c") == 5
    with pytest.raises(TypeError, match="other"):
        x.merge({"a": 1})


def test_to_dict_is_json_and_correct():
    ledger = PrivacyLedger()
    ledger.record("a", epsilon=0.5, count=4, clipped=1)
    ledger.record(7, epsilon=1.0, delta=0.01, count=2)
    ledger.record(None, epsilon=0.1)
    d = json.loads(json.dumps(ledger.to_dict()))
    assert d["composition"] == "basic"
    assert d["users"] == {
        "a": {"releases": 4, "epsilon": 2.0, "delta": 0.0, "clipped": 1},
        "7": {"releases": 2, "epsilon": 2.0, "delta": 0.02, "clipped": 0},
        "None": {"releases": 1, "epsilon": 0.1, "delta": 0.0, "clipped": 0},
    }
    assert d["max_epsilon"] == 2.0 and d["max_delta"] == 0.02
    assert d["total_releases"] == 7
    assert "k*epsilon" in d["note"]
    empty = PrivacyLedger().to_dict()
    assert (empty["max_epsilon"], empty["max_delta"], empty["total_releases"]) == (0.0, 0.0, 0)
    assert empty["users"] == {}


def test_to_dict_refuses_colliding_user_names():
    ledger = PrivacyLedger()
    ledger.record(1, epsilon=1.0)
    ledger.record("1", epsilon=1.0)
    assert ledger.releases(1) == 1 and ledger.releases("1") == 1
    with pytest.raises(ValueError, match="string form"):
        ledger.to_dict()


def test_state_round_trip_is_exact():
    ledger = PrivacyLedger()
    ledger.record("a", epsilon=0.1, count=3, clipped=2)
    ledger.record("a", epsilon=1 / 3, delta=1e-7, count=2)
    ledger.record(5, epsilon=math.pi)
    ledger.record(None, epsilon=2.0)
    state = ledger.state_dict()
    # plain python: through json and through torch.save
    via_json = PrivacyLedger()
    via_json.load_state_dict(json.loads(json.dumps(state)))
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    via_torch = PrivacyLedger()
    via_torch.load_state_dict(torch.load(buf))
    for other in (via_json, via_torch):
        assert other.state_dict() == state
        assert other.to_dict() == ledger.to_dict()
        assert other.users == ["a", 5, None]
        for u in ledger.users:
            assert other.spent(u) == ledger.spent(u)  # bit-exact
    # loading replaces the content; recording afterwards continues the account
    via_json.record("a", epsilon=0.1)
    assert via_json.releases("a") == 6


@pytest.mark.parametrize(
    ("state", "exc", "match"),
    [
        ([], TypeError, "state"),
        ({"version": 2, "users": []}, ValueError, "version"),
        ({"version": 1, "users": None}, TypeError, "users"),
        ({"version": 1, "users": [{"user": "a"}]}, ValueError, "users"),
        (
            {"version": 1, "users": [{"user": "a", "clipped": 0, "releases": []}]},
            ValueError,
            "releases",
        ),
        (
            {"version": 1, "users": [{"user": "a", "clipped": 0, "releases": [[0.0, 0.0, 1]]}]},
            ValueError,
            "epsilon",
        ),
        (
            {"version": 1, "users": [{"user": "a", "clipped": 0, "releases": [[1.0, 1.0, 1]]}]},
            ValueError,
            "delta",
        ),
        (
            {"version": 1, "users": [{"user": "a", "clipped": 0, "releases": [[1.0, 0.0, 0]]}]},
            ValueError,
            "count",
        ),
        (
            {"version": 1, "users": [{"user": "a", "clipped": 2, "releases": [[1.0, 0.0, 1]]}]},
            ValueError,
            "clipped",
        ),
        (
            {
                "version": 1,
                "users": [
                    {"user": "a", "clipped": 0, "releases": [[1.0, 0.0, 1]]},
                    {"user": "a", "clipped": 0, "releases": [[1.0, 0.0, 1]]},
                ],
            },
            ValueError,
            "twice",
        ),
        (
            {"version": 1, "users": [{"user": 1.5, "clipped": 0, "releases": [[1.0, 0.0, 1]]}]},
            TypeError,
            "user",
        ),
    ],
)
def test_load_state_dict_rejects_bad_states(state, exc, match):
    ledger = PrivacyLedger()
    ledger.record("keep", epsilon=1.0)
    before = ledger.state_dict()
    with pytest.raises(exc, match=match):
        ledger.load_state_dict(state)
    assert ledger.state_dict() == before  # unchanged on error


@pytest.mark.parametrize(
    ("kwargs", "exc", "name"),
    [
        ({"epsilon": 0.0}, ValueError, "epsilon"),
        ({"epsilon": -1.0}, ValueError, "epsilon"),
        ({"epsilon": math.inf}, ValueError, "epsilon"),
        ({"epsilon": math.nan}, ValueError, "epsilon"),
        ({"epsilon": "1"}, TypeError, "epsilon"),
        ({"delta": -0.1}, ValueError, "delta"),
        ({"delta": 1.0}, ValueError, "delta"),
        ({"delta": math.nan}, ValueError, "delta"),
        ({"count": 0}, ValueError, "count"),
        ({"count": 1.0}, TypeError, "count"),
        ({"count": True}, TypeError, "count"),
        ({"clipped": -1}, ValueError, "clipped"),
        ({"count": 2, "clipped": 3}, ValueError, "clipped"),
        ({"clipped": 0.5}, TypeError, "clipped"),
        ({"user": 2.5}, TypeError, "user"),
        ({"user": True}, TypeError, "user"),
    ],
)
def test_record_rejects_bad_arguments(kwargs, exc, name):
    ledger = PrivacyLedger()
    args = {"user": "u", "epsilon": 1.0, **kwargs}
    with pytest.raises(exc, match=rf"\b{name}\b"):
        ledger.record(**args)
    assert ledger.users == []


def test_queries_reject_bad_users():
    ledger = PrivacyLedger()
    for query in (ledger.releases, ledger.spent, ledger.clipped, ledger.breakdown):
        with pytest.raises(TypeError, match="user"):
            query([1])
