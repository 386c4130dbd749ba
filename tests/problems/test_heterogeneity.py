r"""A benchmark federation's objectives (:func:`benchmark_objectives`): what
``FederationSetup(problem=...)`` runs on, built without a setup."""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.linalg
import torch

from botorch_fed.problems.heterogeneity import (
    ClientObjective,
    benchmark_objectives,
    client_rotations,
)
from botorch_fed.protocol.setup import FederationSetup
from botorch_fed.test_functions import get_test_function


@pytest.mark.parametrize(
    "problem, options",
    [("hartmann", {"dim": 6, "noise_std": 0.05, "shift": 0.1}), ("branin", {"noise": "student-t"})],
)
def test_benchmark_objectives_are_the_setups_objectives(problem, options):
    built = benchmark_objectives(problem, 3, seed=4, **options)
    setup = FederationSetup(problem=problem, num_clients=3, seed=4, **options).make_objectives()
    X = torch.rand(5, built[0].dim, dtype=torch.float64)
    for a, b in zip(built, setup, strict=True):
        assert torch.equal(a.shift, b.shift)
        assert torch.equal(a.observe(X), b.observe(X))  # the same noise streams


def test_clients_differ_by_their_shift_only_when_asked():
    same = benchmark_objectives("branin", 3, seed=0)
    assert all(not o.shift.any() for o in same)
    shifted = benchmark_objectives("branin", 3, seed=0, shift=0.2)
    assert len({tuple(o.shift.tolist()) for o in shifted}) == 3
    assert all(o.shift.abs().max() <= 0.2 for o in shifted)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"num_clients": 0}, "`num_clients`=0"),
        ({"num_clients": True}, "`num_clients`=True"),
        ({"shift": 1.0}, r"`shift`=1.0 must lie in \[0, 1\)"),
        ({"problem": "hartman"}, "hartmann"),
    ],
)
def test_bad_benchmark_options_are_refused_by_name(kwargs, match):
    args = {"problem": "branin", "num_clients": 3} | kwargs
    with pytest.raises(ValueError, match=match):
        benchmark_objectives(**args)


# --- rotations (the literature's heterogeneity levels) ----------------------------------
def _plane_rotation(dim: int, angle: float, i: int = 0, j: int = 1) -> torch.Tensor:
    R = torch.eye(dim, dtype=torch.float64)
    c, s = math.cos(angle), math.sin(angle)
    R[i, i], R[i, j], R[j, i], R[j, j] = c, -s, s, c
    return R


@pytest.mark.parametrize("scale", [0.1, 1.0])
def test_client_rotations_are_expm_of_seeded_antisymmetric_matrices(scale):
    rotations = client_rotations(4, 5, scale, seed=3)
    g = torch.Generator().manual_seed(3)
    G = torch.randn(4, 5, 5, generator=g, dtype=torch.float64).triu(1).numpy()
    for R, upper in zip(rotations, G, strict=True):
        A = scale * (upper - upper.T)
        np.testing.assert_allclose(R.numpy(), scipy.linalg.expm(A), rtol=0, atol=1e-12)
        assert abs(float(torch.linalg.det(R)) - 1) < 1e-12
    assert len({tuple(R.reshape(-1).tolist()) for R in rotations}) == 4
    again = client_rotations(4, 5, scale, seed=3)
    assert all(torch.equal(a, b) for a, b in zip(rotations, again, strict=True))
    assert client_rotations(4, 5, 0.0, seed=3) == [None] * 4


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_a_rotated_shifted_client_evaluates_f_at_the_rotated_then_shifted_point(dtype):
    fn = get_test_function("hartmann", dim=6)
    R = client_rotations(1, 6, 0.7, seed=0)[0]
    shift = torch.tensor([0.05, -0.1, 0.02, 0.0, 0.1, -0.03], dtype=torch.float64)
    obj = ClientObjective(fn, shift, rotation=R)
    U = torch.rand(20, 6, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    # numpy, row by row: T(u) = clip(c + R (u - c) - shift), then onto the bounds
    u = U.to(dtype).double().numpy()
    T = np.clip(0.5 + (R.numpy() @ (u - 0.5).T).T - shift.numpy(), 0.0, 1.0)
    lo, hi = fn.bounds.double().numpy()
    expected = fn.evaluate_true(torch.from_numpy(lo + T * (hi - lo)))
    torch.testing.assert_close(obj.value(U.to(dtype)), expected, rtol=1e-12, atol=1e-12)


def test_a_moved_clients_optimum_is_known_exactly_where_its_preimage_is_in_the_cube():
    fn = get_test_function("hartmann", dim=6)
    f_star = float(fn.optimal_value)
    u_star = fn.optimizers[0].double()  # hartmann's domain is the unit cube
    shift = torch.tensor([0.0, 0.0, 0.0, 0.0, 0.0, 0.3], dtype=torch.float64)
    for angle, reachable in ((0.05, True), (math.pi / 4, False)):
        R = _plane_rotation(6, angle, 1, 5)
        obj = ClientObjective(fn, shift, rotation=R)
        pre = 0.5 + R.T @ (u_star + shift - 0.5)  # T(pre) = u*
        inside = bool(((pre >= 0) & (pre <= 1)).all())
        assert inside == reachable
        if reachable:
            assert obj.optimal_value == f_star
            at_optimum = float(fn.evaluate_true(u_star.unsqueeze(0)))
            assert abs(float(obj.value(pre.unsqueeze(0))) - at_optimum) < 1e-12
        else:
            assert obj.optimal_value is None
        # no point of the cube does better than f* (clipping maps into the domain)
        U = torch.rand(4096, 6, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
        assert float(obj.value(U).min()) >= f_star
    # a shift alone: known too (the paper's small shifts keep the optimum inside)
    obj = ClientObjective(fn, torch.full((6,), 0.05, dtype=torch.float64))
    assert obj.optimal_value == f_star


def test_rotation_zero_is_the_shift_only_federation():
    plain = benchmark_objectives("levy", 3, seed=2, dim=4, shift=0.1)
    zero = benchmark_objectives("levy", 3, seed=2, dim=4, shift=0.1, rotation=0.0)
    rotated = benchmark_objectives("levy", 3, seed=2, dim=4, shift=0.1, rotation=0.5)
    X = torch.rand(6, 4, dtype=torch.float64)
    for a, b, c in zip(plain, zero, rotated, strict=True):
        assert b.rotation is None and c.rotation is not None
        assert torch.equal(a.value(X), b.value(X))
        assert torch.equal(a.shift, c.shift)  # the shifts do not depend on the rotations
        assert not torch.equal(a.value(X), c.value(X))


def test_a_run_has_a_regret_only_where_every_clients_optimum_is_known():
    from botorch_fed.algorithms import run_federated
    from botorch_fed.protocol import BOSettings

    settings = BOSettings(num_init=2, num_rounds=1)
    setup = FederationSetup(problem="hartmann", num_clients=3, seed=0, rotation=0.1)
    assert all(o.optimal_value is not None for o in setup.make_objectives())
    result = run_federated("random", setup, settings)
    assert result.optimal_value == pytest.approx(-3.32237)
    assert result.regret_per_round[-1] == abs(result.best_value - result.optimal_value)
    # client 1's optimum rotated out of the cube at this seed: no shared regret
    setup = FederationSetup(problem="hartmann", num_clients=4, seed=1, shift=0.3, rotation=1.0)
    assert [o.optimal_value is None for o in setup.make_objectives()] == [False, True, False, False]
    result = run_federated("random", setup, settings)
    assert result.optimal_value is None and result.regret_per_round is None


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"rotation": -0.1}, r"`rotation`=-0.1 must be a finite number >= 0"),
        ({"rotation": float("nan")}, r"`rotation`=nan must be a finite number >= 0"),
    ],
)
def test_bad_rotation_scales_are_refused_by_name(kwargs, match):
    with pytest.raises(ValueError, match=match):
        benchmark_objectives("branin", 3, **kwargs)


@pytest.mark.parametrize(
    "rotation, match",
    [
        (torch.eye(3, dtype=torch.float64), r"must be a 2 x 2 tensor, got \(3, 3\)"),
        (2 * torch.eye(2, dtype=torch.float64), "must be orthogonal"),
        (torch.full((2, 2), float("inf")), "non-finite"),
        ([[1.0, 0.0], [0.0, 1.0]], "got list"),
    ],
)
def test_bad_rotation_matrices_are_refused(rotation, match):
    with pytest.raises(ValueError, match=match):
        ClientObjective(get_test_function("branin"), rotation=rotation)


def test_a_setup_refuses_a_rotation_of_the_users_own_objectives():
    import botorch_fed.algorithms  # noqa: F401  (registers "local")

    own = ClientObjective(get_test_function("branin"))
    with pytest.raises(ValueError, match="`rotation` applies to built-in problems only"):
        FederationSetup(objectives=own, num_clients=2, rotation=0.1).make_objectives()
    with pytest.raises(ValueError, match="rotation"):
        FederationSetup(problem="branin", rotation=-1.0).validate("local")


def test_one_reachable_optimiser_of_several_makes_the_optimum_known():
    fn = get_test_function("branin")  # three optimisers
    U = (fn.optimizers - fn.bounds[0]) / (fn.bounds[1] - fn.bounds[0])
    for shift, reachable in (((0.5, -0.17), 1), ((0.5, 0.19), 0)):
        s = torch.tensor(shift, dtype=torch.float64)
        inside = int((((U + s) >= 0) & ((U + s) <= 1)).all(-1).sum())
        assert inside == reachable  # the preimage of u* under a shift alone: u* + shift
        obj = ClientObjective(fn, s)
        assert (obj.optimal_value is not None) == bool(reachable)
        assert obj.optimum_bound == pytest.approx(0.397887)


def test_moved_discrete_and_constrained_functions():
    from botorch.test_functions.synthetic import ConstrainedGramacy

    with pytest.raises(ValueError, match="discrete or categorical inputs"):
        benchmark_objectives("labs", 2, dim=4, shift=0.1)
    constrained = ClientObjective(
        ConstrainedGramacy(), torch.tensor([0.1, 0.0], dtype=torch.float64)
    )
    assert constrained.optimal_value is None and constrained.optimum_bound is None
    assert ClientObjective(ConstrainedGramacy()).optimal_value is not None  # unmoved: as declared


def test_an_optimiser_outside_the_domain_is_not_reachable():
    fn = get_test_function("hartmann", dim=6)
    fn.optimizers = fn.optimizers + 2.0  # outside the unit cube
    # its preimage u* + shift is inside, but T clips onto the boundary, not onto u*
    obj = ClientObjective(fn, torch.full((6,), -1.999, dtype=torch.float64))
    assert obj.optimal_value is None
