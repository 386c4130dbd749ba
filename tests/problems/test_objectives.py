r"""CallableObjective: the user's own black box, in the user's domain and convention.

Checked against computations written out here: the unit cube is mapped to the
domain by hand (``lower + u (upper - lower)``), the values a client learns from are
the user's values (``maximize``) or their negatives (``minimize``), and what the
callable returns is read as one float64 number per point or refused with an error
naming the objective.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from botorch_fed.problems.objectives import (
    CallableObjective,
    Objective,
    ObjectiveContractError,
    check_bounds,
)
from botorch_fed.protocol import BOClient, BOSettings

pytestmark = pytest.mark.usefixtures("quiet_single_thread")

LOWER = [-2.0, 1e-3, 10.0]
UPPER = [3.0, 1.0, 10.5]
BOUNDS = [LOWER, UPPER]


def _unit_points(n: int, dtype=torch.float64, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.rand(n, len(LOWER), generator=g, dtype=torch.float64).to(dtype)


def _by_hand(U: torch.Tensor) -> torch.Tensor:
    r"""``lower + u (upper - lower)`` per coordinate, in float64, written out."""
    rows = []
    for u in U.to(torch.float64).tolist():
        rows.append([lo + ui * (hi - lo) for ui, lo, hi in zip(u, LOWER, UPPER, strict=True)])
    return torch.tensor(rows, dtype=torch.float64)


class Recorder:
    r"""A black box that records what it was called with."""

    def __init__(self, fn):
        self.fn = fn
        self.calls: list[torch.Tensor] = []

    def __call__(self, X):
        self.calls.append(X)
        return self.fn(X)


# --- domain mapping -----------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_callable_sees_the_users_domain(dtype):
    rec = Recorder(lambda X: X.sum(-1))
    obj = CallableObjective(rec, BOUNDS)
    U = _unit_points(5, dtype=dtype)
    observed, reported = obj.evaluate(U)
    (Z,) = rec.calls
    assert Z.dtype == torch.float64 and Z.shape == (5, 3) and Z.device.type == "cpu"
    torch.testing.assert_close(Z, _by_hand(U), rtol=1e-15, atol=1e-15)
    torch.testing.assert_close(obj.to_domain(U), _by_hand(U), rtol=1e-15, atol=1e-15)
    # corners of the cube land on the bounds exactly
    corners = torch.tensor([[0.0, 0.0, 0.0], [1.0, 1.0, 1.0]], dtype=dtype)
    assert obj.to_domain(corners).tolist() == [LOWER, UPPER]
    # the values are the callable's, as float64, the same for learning and reporting
    assert observed.dtype == reported.dtype == torch.float64
    torch.testing.assert_close(observed, _by_hand(U).sum(-1), rtol=1e-15, atol=1e-14)
    assert torch.equal(observed, reported)


def test_callable_gets_its_own_copy_of_the_points():
    def mutate(X):
        out = X.sum(-1).clone()
        X.zero_()  # a careless callable must not change the client's data
        return out

    obj = CallableObjective(mutate, BOUNDS)
    U = _unit_points(3)
    U_before = U.clone()
    obj.evaluate(U)
    assert torch.equal(U, U_before)


def test_to_domain_refuses_points_outside_the_cube():
    obj = CallableObjective(lambda X: X.sum(-1), BOUNDS)
    for bad in (
        torch.full((1, 3), 1.5, dtype=torch.float64),
        torch.full((1, 3), -0.1, dtype=torch.float64),
        torch.full((1, 3), float("nan"), dtype=torch.float64),
        torch.zeros(1, 2, dtype=torch.float64),  # wrong d
        torch.zeros(3, dtype=torch.float64),  # not n x d
    ):
        with pytest.raises(ValueError, match="`X`"):
            obj.to_domain(bad)


# --- what the callable may return ---------------------------------------------------


def _values(U):
    return _by_hand(U)[:, 0] ** 2 - _by_hand(U)[:, 1]


RETURNS = {
    "tensor n": lambda Z: Z[:, 0] ** 2 - Z[:, 1],
    "tensor n x 1": lambda Z: (Z[:, 0] ** 2 - Z[:, 1]).unsqueeze(-1),
    "numpy n": lambda Z: (Z[:, 0] ** 2 - Z[:, 1]).numpy(),
    "numpy n x 1": lambda Z: (Z[:, 0] ** 2 - Z[:, 1]).numpy()[:, None],
    "list": lambda Z: [float(v) for v in Z[:, 0] ** 2 - Z[:, 1]],
    "list of lists": lambda Z: [[float(v)] for v in Z[:, 0] ** 2 - Z[:, 1]],
    "float32 tensor": lambda Z: (Z[:, 0] ** 2 - Z[:, 1]).float(),
    "requires grad": lambda Z: (Z[:, 0] ** 2 - Z[:, 1]).requires_grad_(),
}


@pytest.mark.parametrize("kind", list(RETURNS))
@pytest.mark.parametrize("n", [1, 4])
def test_return_types(kind, n):
    obj = CallableObjective(RETURNS[kind], BOUNDS)
    U = _unit_points(n)
    observed, reported = obj.evaluate(U)
    expected = _values(U)
    if kind == "float32 tensor":
        expected = expected.float().double()  # the callable rounded them
    assert observed.shape == (n,) and observed.dtype == torch.float64
    assert not observed.requires_grad
    torch.testing.assert_close(observed, expected, rtol=1e-14, atol=1e-14)
    assert torch.equal(observed, reported)


SCALARS = {
    "float": lambda Z: float(Z[0, 0] ** 2 - Z[0, 1]),
    "int": lambda Z: 7,
    "0-d tensor": lambda Z: Z[0, 0] ** 2 - Z[0, 1],
    "numpy scalar": lambda Z: np.float64(Z[0, 0] ** 2 - Z[0, 1]),
    "1 x 1 tensor": lambda Z: (Z[0, 0] ** 2 - Z[0, 1]).reshape(1, 1),
}


@pytest.mark.parametrize("kind", list(SCALARS))
def test_a_single_point_may_return_a_number(kind):
    obj = CallableObjective(SCALARS[kind], BOUNDS)
    U = _unit_points(1)
    observed, _ = obj.evaluate(U)
    expected = torch.tensor([7.0], dtype=torch.float64) if kind == "int" else _values(U)
    assert observed.shape == (1,) and observed.dtype == torch.float64
    torch.testing.assert_close(observed, expected, rtol=1e-14, atol=1e-14)


WRONG_SHAPES = {
    "n x 2": lambda Z: Z[:, :2],
    "1 x n": lambda Z: Z[:, 0].unsqueeze(0),
    "n + 1": lambda Z: torch.zeros(len(Z) + 1),
    "a number for n points": lambda Z: 1.0,
    "empty": lambda Z: [],
    "n x 1 x 1": lambda Z: Z[:, :1].unsqueeze(-1),
}


@pytest.mark.parametrize("kind", list(WRONG_SHAPES))
def test_wrong_shapes_name_the_objective(kind):
    obj = CallableObjective(WRONG_SHAPES[kind], BOUNDS, name="hospital-loss")
    with pytest.raises(ObjectiveContractError, match="hospital-loss") as info:
        obj.evaluate(_unit_points(3))
    assert "(3,)" in str(info.value)  # says what was expected
    assert isinstance(info.value, TypeError)


NON_NUMERIC = {
    "str": lambda Z: "abc",
    "dict": lambda Z: {"loss": 1.0},
    "object": lambda Z: object(),
    "list of str": lambda Z: ["a"] * len(Z),
}


@pytest.mark.parametrize("kind", list(NON_NUMERIC))
def test_non_numeric_returns_name_the_objective(kind):
    obj = CallableObjective(NON_NUMERIC[kind], BOUNDS, name="lab-experiment")
    with pytest.raises(ObjectiveContractError, match="lab-experiment"):
        obj.evaluate(_unit_points(3))


def test_returning_none_for_one_point_is_a_contract_error():
    obj = CallableObjective(lambda Z: None, BOUNDS, name="forgot-return")
    with pytest.raises(ObjectiveContractError, match="forgot-return"):
        obj.evaluate(_unit_points(1))


def test_returning_none_for_several_points_is_a_contract_error():
    obj = CallableObjective(lambda Z: None, BOUNDS, name="forgot-return")
    with pytest.raises(ObjectiveContractError, match="forgot-return"):
        obj.evaluate(_unit_points(3))


@pytest.mark.parametrize(
    "out",
    [["0.5", "1.5"], [None, 1.0], torch.tensor([1 + 1j, 2 + 0j])],
    ids=["strings", "None entry", "complex"],
)
def test_non_numeric_entries_are_contract_errors(out):
    obj = CallableObjective(lambda Z: out, BOUNDS, name="odd")
    with pytest.raises(ObjectiveContractError, match="odd"):
        obj.evaluate(_unit_points(2))


def test_failed_values_pass_through_as_non_finite():
    # NaN/inf are a failed evaluation (the client's business), not a contract error
    obj = CallableObjective(lambda Z: [float("nan"), float("inf"), 1.0], BOUNDS)
    observed, _ = obj.evaluate(_unit_points(3))
    assert observed[0].isnan() and observed[1].isinf() and observed[2] == 1.0


def test_callable_may_use_autograd():
    def validation_loss(Z):
        # one gradient step on a tiny model: what a tuning objective does
        w = torch.zeros(1, dtype=torch.float64, requires_grad=True)
        loss = ((w - Z[:, 0]) ** 2).sum()
        loss.backward()
        return (w - w.grad * Z[:, 1]).detach().expand(len(Z)).clone()

    obj = CallableObjective(validation_loss, BOUNDS)
    observed, _ = obj.evaluate(_unit_points(1))
    assert torch.isfinite(observed).all()


def test_a_list_of_tensors_that_require_grad_is_accepted():
    w = torch.tensor([1.0, -2.0], dtype=torch.float64, requires_grad=True)

    def loss(Z):  # e.g. a torch model's loss per point, returned as a list
        return [(z * w).sum() ** 2 for z in Z]

    objective = CallableObjective(loss, [[0.0, 0.0], [1.0, 1.0]])
    X = torch.tensor([[0.25, 0.5], [1.0, 0.0]], dtype=torch.float64)
    observed, reported = objective.evaluate(X)
    expected = torch.stack([v.detach() for v in loss(X)])
    assert torch.equal(observed, expected) and torch.equal(reported, expected)


def test_a_ragged_return_value_is_a_contract_error():
    objective = CallableObjective(lambda Z: [1.0, [2.0]], [[0.0, 0.0], [1.0, 1.0]])
    with pytest.raises(ObjectiveContractError, match="<lambda>"):
        objective.evaluate(torch.rand(2, 2, dtype=torch.float64))


@pytest.mark.parametrize(
    "value",
    [np.ma.masked, np.ma.array([5.0], mask=[True])],
    ids=["masked-constant", "masked-array"],
)
def test_masked_values_are_not_reported_as_numbers(value):
    objective = CallableObjective(lambda Z: value, [[0.0, 0.0], [1.0, 1.0]])
    X = torch.rand(1, 2, dtype=torch.float64)
    try:
        observed, reported = objective.evaluate(X)
    except ObjectiveContractError:
        return
    assert not torch.isfinite(observed).any() and not torch.isfinite(reported).any()


# --- argument checks ----------------------------------------------------------------


BAD_BOUNDS = {
    "1-d": [0.0, 1.0],
    "3 x d": [[0.0], [1.0], [2.0]],
    "2 x 0": np.zeros((2, 0)),
    "d x 2 x 1": np.zeros((2, 2, 1)),
    "nan": [[0.0, float("nan")], [1.0, 1.0]],
    "inf": [[0.0, 0.0], [1.0, float("inf")]],
    "lower == upper": [[0.0, 1.0], [1.0, 1.0]],
    "lower > upper": [[0.0, 2.0], [1.0, 1.0]],
    "strings": [["a", "b"], ["c", "d"]],
    "ragged": [[0.0, 0.0], [1.0]],
    "None": None,
}


@pytest.mark.parametrize("kind", list(BAD_BOUNDS))
def test_bad_bounds_name_the_argument(kind):
    with pytest.raises(ValueError, match="`bounds`"):
        CallableObjective(lambda X: X.sum(-1), BAD_BOUNDS[kind])


def test_bounds_name_the_offending_dimension():
    with pytest.raises(ValueError, match=r"dimension\(s\) \[1\]"):
        check_bounds([[0.0, 3.0, 0.0], [1.0, 2.0, 1.0]])


@pytest.mark.parametrize(
    "bounds",
    [
        torch.tensor(BOUNDS),  # float32
        torch.tensor(BOUNDS, dtype=torch.float64),
        np.asarray(BOUNDS),
        ((-2, 1e-3, 10), (3, 1, 10.5)),
    ],
    ids=["float32 tensor", "float64 tensor", "array", "tuples"],
)
def test_bounds_as_tensor_array_or_nested_sequences(bounds):
    obj = CallableObjective(lambda X: X.sum(-1), bounds)
    assert obj.bounds.dtype == torch.float64 and obj.bounds.shape == (2, 3) and obj.dim == 3
    torch.testing.assert_close(
        obj.bounds, torch.tensor(bounds, dtype=torch.float64), rtol=0, atol=0
    )


def test_bounds_that_require_grad_are_accepted():
    bounds = torch.tensor(BOUNDS, dtype=torch.float64, requires_grad=True)
    obj = CallableObjective(lambda X: X.sum(-1), bounds)
    assert obj.bounds.tolist() == BOUNDS


@pytest.mark.parametrize(
    "kwargs, argument",
    [
        (dict(fn=3.0), "fn"),
        (dict(fn=None), "fn"),
        (dict(minimize=1), "minimize"),
        (dict(minimize="yes"), "minimize"),
        (dict(minimize=None), "minimize"),
        (dict(name=""), "name"),
        (dict(name=3), "name"),
    ],
)
def test_bad_arguments_name_the_argument(kwargs, argument):
    args = dict(fn=lambda X: X.sum(-1), bounds=BOUNDS)
    args.update(kwargs)
    with pytest.raises(ValueError, match=f"`{argument}`"):
        CallableObjective(**args)


def test_names_and_description():
    def validation_loss(X):
        return X.sum(-1)

    class Latency:
        def __call__(self, X):
            return X.sum(-1)

    assert CallableObjective(validation_loss, BOUNDS).name.endswith("validation_loss")
    assert CallableObjective(Latency(), BOUNDS).name == "Latency"
    obj = CallableObjective(validation_loss, BOUNDS, minimize=False, name="acc")
    assert isinstance(obj, Objective) and obj.optimal_value is None
    description = obj.describe()
    assert description == {"name": "acc", "dim": 3, "bounds": BOUNDS, "minimize": False}
    json.dumps(description)
    assert "acc" in repr(obj) and "maximize" in repr(obj)
    assert obj.state_dict() == {}
    obj.load_state_dict({})
    with pytest.raises(ValueError, match="no state"):
        obj.load_state_dict({"x": 1})


# --- the client's convention --------------------------------------------------------


def _settings(**kwargs) -> BOSettings:
    base = dict(num_init=4, num_rounds=2, raw_samples=16, num_restarts=2, maxiter=20)
    base.update(kwargs)
    return BOSettings(**base)


@pytest.mark.parametrize("minimize", [True, False])
def test_client_learns_in_botorchs_maximisation_convention(minimize):
    rec = Recorder(lambda Z: Z[:, 0] ** 2 - Z[:, 1] + Z[:, 2])
    client = BOClient(0, CallableObjective(rec, BOUNDS, minimize=minimize), _settings(), seed=5)
    client.on_init({})
    values = torch.cat([rec.fn(Z) for Z in rec.calls])
    assert len(rec.calls) == 4 and all(Z.shape == (1, 3) for Z in rec.calls)
    # Y is what BoTorch maximises: -values for a loss, +values for a score
    expected = -values if minimize else values
    assert torch.equal(client.Y.squeeze(-1), expected)
    # the history holds the user's own values and points (in the user's domain)
    assert [h["value"] for h in client.history] == values.tolist()
    assert [h["x"] for h in client.history] == [Z.squeeze(0).tolist() for Z in rec.calls]
    torch.testing.assert_close(_by_hand(client.X), torch.cat(rec.calls), rtol=1e-15, atol=1e-15)
    assert client.failures == []
