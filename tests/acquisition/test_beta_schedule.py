r"""Tests for :class:`botorch_fed.acquisition.BetaSchedule` (Co-KG's ``beta_t``)."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest

from botorch_fed.acquisition import BETA_KINDS, BetaSchedule


@pytest.mark.parametrize("t", [1, 2, 7, 100])
def test_values_are_the_closed_forms(t: int) -> None:
    assert BetaSchedule()(t) == 1.0  # default: constant 1
    assert BetaSchedule("constant", beta0=0.25)(t) == 0.25
    assert BetaSchedule("linear", beta0=0.5, rate=0.125)(t) == 0.5 + 0.125 * (t - 1)
    assert BetaSchedule("linear", beta0=0.0, rate=0.0)(t) == 0.0
    # beta0 * t ** power: libm's pow errs by < 1 ulp, sqrt, division and the products by
    # 1/2 ulp each: < 2.5 eps apart
    assert BetaSchedule("power", beta0=0.3, power=0.5)(t) == pytest.approx(
        0.3 * math.sqrt(t), rel=4 * np.finfo(float).eps
    )
    assert BetaSchedule("power", beta0=2.0, power=-1.0)(t) == pytest.approx(
        2.0 / t, rel=4 * np.finfo(float).eps
    )
    assert BetaSchedule("power", beta0=0.0, power=3.0)(t) == 0.0


def test_first_round_is_beta0_and_types() -> None:
    for schedule in (
        BetaSchedule("constant", beta0=0.7),
        BetaSchedule("linear", beta0=0.7, rate=2.0),
        BetaSchedule("power", beta0=0.7, power=1.5),
    ):
        assert schedule(1) == 0.7
        assert type(schedule(3)) is float
        assert type(schedule.beta0) is float
    # integer arguments are stored as floats (the state is plain floats)
    s = BetaSchedule("linear", beta0=1, rate=2)
    assert type(s.rate) is float and s(3) == 5.0
    # numpy integers are valid rounds
    assert BetaSchedule("linear", beta0=0.0, rate=1.0)(np.int64(4)) == 3.0
    assert set(BETA_KINDS) == {"constant", "linear", "power"}


def test_monotone_families() -> None:
    grow = BetaSchedule("power", beta0=0.1, power=1.0)
    decay = BetaSchedule("power", beta0=1.0, power=-0.5)
    lin = BetaSchedule("linear", beta0=0.0, rate=0.1)
    ts = range(1, 50)
    assert all(grow(t) < grow(t + 1) for t in ts)
    assert all(decay(t) > decay(t + 1) > 0 for t in ts)
    assert all(lin(t) < lin(t + 1) for t in ts)


def test_round_trip_and_immutable() -> None:
    for schedule in (
        BetaSchedule(),
        BetaSchedule("linear", beta0=0.0, rate=0.5),
        BetaSchedule("power", beta0=0.2, power=0.75),
    ):
        state = json.loads(json.dumps(schedule.to_dict()))
        again = BetaSchedule.from_dict(state)
        assert again == schedule
        assert [again(t) for t in range(1, 6)] == [schedule(t) for t in range(1, 6)]
    with pytest.raises(dataclasses.FrozenInstanceError):
        BetaSchedule().beta0 = 2.0  # type: ignore[misc]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"kind": "exp"}, "kind"),
        ({"kind": "Linear", "rate": 1.0}, "kind"),
        ({"beta0": -0.1}, "beta0"),
        ({"beta0": float("nan")}, "beta0"),
        ({"beta0": float("inf")}, "beta0"),
        ({"beta0": True}, "beta0"),
        ({"beta0": "1"}, "beta0"),
        ({"kind": "linear"}, "needs `rate`"),
        ({"kind": "linear", "rate": -0.5}, "rate"),
        ({"kind": "linear", "rate": float("nan")}, "rate"),
        ({"kind": "power"}, "needs `power`"),
        ({"kind": "power", "power": float("inf")}, "power"),
        ({"kind": "power", "power": None, "rate": 1.0}, "rate"),
        ({"kind": "constant", "rate": 1.0}, "rate"),
        ({"kind": "constant", "power": 1.0}, "power"),
        ({"kind": "linear", "rate": 1.0, "power": 1.0}, "power"),
    ],
)
def test_bad_parameters(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        BetaSchedule(**kwargs)


@pytest.mark.parametrize("t", [0, -1, 1.0, 1.5, True, "2", None])
def test_bad_rounds(t: object) -> None:
    with pytest.raises(ValueError, match="`t`"):
        BetaSchedule()(t)  # type: ignore[arg-type]


def test_overflow_is_an_error() -> None:
    with pytest.raises(ValueError, match="overflows"):
        BetaSchedule("power", beta0=1.0, power=400.0)(10)
    with pytest.raises(ValueError, match="overflows"):
        BetaSchedule("linear", beta0=1.0, rate=1e308)(10)


def test_bad_state() -> None:
    with pytest.raises(ValueError, match="unknown keys"):
        BetaSchedule.from_dict({"kind": "constant", "beta0": 1.0, "gamma": 2.0})
    with pytest.raises(ValueError, match="dict"):
        BetaSchedule.from_dict([("kind", "constant")])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="rate"):
        BetaSchedule.from_dict({"kind": "linear", "beta0": 1.0, "rate": -1.0})
