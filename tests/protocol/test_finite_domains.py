r"""Finite domains, declared bounds and observation noises of the clients' objectives.

What the algorithms of [LDP-BO] (paper 002) assume known -- a finite domain ``D``,
``B >= |f|``, ``R >= |noise|`` -- as objectives declare them: candidates map back to
the user's points by the affine map written out here, digests are recomputed with
hashlib, ``ldp-synthetic`` federations share one ``f`` whose values are recomputed
from the function, observations stay within ``R`` of ``f``, and a Gaussian problem's
noise stream is the one of the BoTorch function built directly (and equal to values
recorded below, so that it stays fixed for checkpoints and benchmarks).
"""

from __future__ import annotations

import hashlib
import json
import math

import numpy as np
import pytest
import torch
from scipy import stats

from botorch_fed.algorithms import run_federated
from botorch_fed.problems.heterogeneity import NOISE_SEED_OFFSET, ClientObjective, client_shifts
from botorch_fed.problems.objectives import CallableObjective
from botorch_fed.protocol import BOSettings, FederationSetup
from botorch_fed.protocol.checkpoint import MANIFEST, CheckpointError, load_checkpoint
from botorch_fed.test_functions import LDPSynthetic, ObservationNoise, get_test_function
from tests.helpers.federation_runs import Killed, comparable, kill_after
from tests.helpers.tolerances import assert_close

pytestmark = pytest.mark.usefixtures("quiet_single_thread")

LOWER, UPPER = [-2.0, 10.0], [3.0, 10.5]
BOUNDS = [LOWER, UPPER]
POINTS = [[-2.0, 10.0], [0.5, 10.25], [3.0, 10.5], [1.7, 10.1]]


def _sum(X):
    return X.sum(-1)


def _unit_by_hand(points) -> torch.Tensor:
    return torch.tensor(
        [[(z - lo) / (hi - lo) for z, lo, hi in zip(p, LOWER, UPPER, strict=True)] for p in points],
        dtype=torch.float64,
    )


def _digest(t: torch.Tensor) -> str:
    return hashlib.sha256(np.ascontiguousarray(t.numpy(), dtype=np.float64).tobytes()).hexdigest()[
        :16
    ]


# --- CallableObjective ------------------------------------------------------------


def test_callable_candidates_are_unit_cube_points_of_the_users_domain():
    obj = CallableObjective(_sum, BOUNDS, candidates=POINTS, reward_bound=20.0, noise_bound=0.0)
    assert obj.candidates.dtype == torch.float64 and obj.candidates.shape == (4, 2)
    assert (obj.candidates >= 0).all() and (obj.candidates <= 1).all()
    torch.testing.assert_close(obj.candidates, _unit_by_hand(POINTS), rtol=0, atol=1e-15)
    # and back: the client evaluates the user's points
    back = obj.to_domain(obj.candidates)
    # (p - lo) / (hi - lo) and back, hi - lo exact: four roundings, each at most
    # u (|lo| + |hi|)
    scale = max(abs(lo) + abs(hi) for lo, hi in zip(LOWER, UPPER, strict=True))
    expected = torch.tensor(POINTS, dtype=torch.float64)
    assert_close(back, expected, dtype=torch.float64, factor=2, scale=scale)
    observed, _ = obj.evaluate(obj.candidates)
    torch.testing.assert_close(
        observed, torch.tensor([sum(p) for p in POINTS], dtype=torch.float64)
    )
    assert obj.reward_bound == 20.0 and obj.noise_bound == 0.0 and obj.kernel_hint is None


def test_callable_accepts_tensors_arrays_and_1d_for_one_dimension():
    as_tensor = CallableObjective(
        _sum, BOUNDS, candidates=torch.tensor(POINTS, dtype=torch.float32)
    )
    as_array = CallableObjective(_sum, BOUNDS, candidates=np.array(POINTS))
    torch.testing.assert_close(
        as_tensor.candidates, _unit_by_hand(torch.tensor(POINTS, dtype=torch.float32).tolist())
    )
    torch.testing.assert_close(as_array.candidates, _unit_by_hand(POINTS), rtol=0, atol=1e-15)
    one = CallableObjective(_sum, [[0.0], [4.0]], candidates=[0.0, 1.0, 4.0])
    assert one.candidates.tolist() == [[0.0], [0.25], [1.0]]


def test_callable_noise_bound_inf_means_unbounded():
    obj = CallableObjective(_sum, BOUNDS, noise_bound=math.inf)
    assert obj.noise_bound is None and obj.candidates is None and obj.reward_bound is None


def test_describe_is_json_with_a_digest():
    obj = CallableObjective(
        _sum, BOUNDS, name="s", candidates=POINTS, reward_bound=3, noise_bound=1
    )
    description = json.loads(json.dumps(obj.describe(), allow_nan=False))
    assert description == {
        "name": "s",
        "dim": 2,
        "bounds": BOUNDS,
        "minimize": True,
        "candidates": {"count": 4, "sha256": _digest(_unit_by_hand(POINTS))},
        "reward_bound": 3.0,
        "noise_bound": 1.0,
    }
    other = CallableObjective(_sum, BOUNDS, name="s", candidates=POINTS[:3])
    assert other.describe()["candidates"]["sha256"] != description["candidates"]["sha256"]
    # without declarations: name, dim, bounds and minimize only
    assert CallableObjective(_sum, BOUNDS, name="s").describe() == {
        "name": "s",
        "dim": 2,
        "bounds": BOUNDS,
        "minimize": True,
    }


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"candidates": []}, "`candidates`: empty domain"),
        ({"candidates": np.zeros((0, 2))}, "`candidates`: empty domain"),
        ({"candidates": [[0.0, 10.0], [3.5, 10.2]]}, r"`candidates` must lie within.*row 1"),
        ({"candidates": [[-2.1, 10.0]]}, r"`candidates` must lie within.*row 0"),
        ({"candidates": [[0.0, math.nan]]}, r"`candidates` must be finite; row 0"),
        ({"candidates": [[0.0, 10.0], [math.inf, 10.0]]}, r"`candidates` must be finite; row 1"),
        ({"candidates": [0.0, 10.0]}, r"`candidates` must have shape n x 2"),
        ({"candidates": [[0.0, 10.0, 1.0]]}, r"`candidates` must have shape n x 2"),
        ({"candidates": [["a", "b"]]}, r"`candidates` must be an n x d array"),
        ({"reward_bound": -1.0}, r"`reward_bound`.*-1.0"),
        ({"reward_bound": math.inf}, r"`reward_bound`.*inf"),
        ({"reward_bound": math.nan}, r"`reward_bound`.*nan"),
        ({"reward_bound": "1"}, r"`reward_bound`"),
        ({"reward_bound": True}, r"`reward_bound`"),
        ({"noise_bound": -0.5}, r"`noise_bound`.*-0.5"),
        ({"noise_bound": math.nan}, r"`noise_bound`.*nan"),
        ({"noise_bound": -math.inf}, r"`noise_bound`"),
    ],
)
def test_bad_declarations_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        CallableObjective(_sum, BOUNDS, **kwargs)


# --- ClientObjective -------------------------------------------------------------------


def test_client_objective_of_ldp_synthetic():
    fn = LDPSynthetic(function_seed=3, bounds=[(-1.0, 4.0)])
    obj = ClientObjective(fn)
    grid = torch.arange(100, dtype=torch.float64) / 99
    # the candidates are (lo + w u - lo) / w of this grid u (w = hi - lo exact): four
    # roundings of values of magnitude <= max(|lo|, |hi|) / w <= 1, at most 2 eps
    assert_close(obj.candidates.squeeze(-1), grid, dtype=torch.float64, factor=2)
    torch.testing.assert_close(
        obj.to_domain(obj.candidates).squeeze(-1), -1.0 + 5.0 * grid, rtol=0, atol=1e-14
    )
    values = obj.value(obj.candidates)
    torch.testing.assert_close(values, fn(fn.candidates, noise=False), rtol=0, atol=1e-12)
    assert obj.reward_bound == fn.reward_bound
    assert math.isclose(obj.reward_bound, values.abs().max().item(), abs_tol=1e-12)
    assert obj.optimal_value == fn.optimal_value
    assert obj.kernel_hint == {"kernel": "se", "lengthscale": 0.2, "nu": 2.5}
    assert obj.noise_bound == 0.0  # no noise at all
    json.dumps(obj.describe(), allow_nan=False)


def test_shifted_client_keeps_the_domain_and_recomputes_its_constants():
    fn = LDPSynthetic(function_seed=1)
    shift = torch.tensor([0.15], dtype=torch.float64)
    obj = ClientObjective(fn, shift)
    plain = ClientObjective(LDPSynthetic(function_seed=1))
    torch.testing.assert_close(obj.candidates, plain.candidates, rtol=0, atol=0)
    # by hand: client value at candidate u is -f(clip(u - 0.15))
    u = plain.candidates.squeeze(-1)
    by_hand = fn((u - 0.15).clamp(0, 1).unsqueeze(-1), noise=False)
    torch.testing.assert_close(obj.value(obj.candidates), by_hand, rtol=0, atol=0)
    assert obj.reward_bound == by_hand.abs().max().item()
    assert obj.optimal_value == by_hand.min().item()
    assert obj.optimal_value != plain.optimal_value


def test_client_objective_noise_bounds():
    hartmann = get_test_function("hartmann", dim=3)
    assert ClientObjective(hartmann).noise_bound == 0.0
    noisy = get_test_function("hartmann", dim=3, noise_std=0.1, seed=0)
    assert ClientObjective(noisy).noise_bound is None
    assert ClientObjective(hartmann).candidates is None
    assert ClientObjective(hartmann).reward_bound is None
    uniform = ClientObjective(hartmann, noise=ObservationNoise("uniform", 0.3, seed=0))
    assert uniform.noise_bound == 0.3
    heavy = ClientObjective(hartmann, noise=ObservationNoise("student-t", 0.3, seed=0))
    assert heavy.noise_bound is None
    with pytest.raises(ValueError, match="noise_std"):
        ClientObjective(noisy, noise=ObservationNoise("uniform", 1.0))
    with pytest.raises(ValueError, match="`noise`"):
        ClientObjective(hartmann, noise="uniform")


def test_client_objective_adds_the_noise_and_round_trips_its_state():
    fn = LDPSynthetic(function_seed=2, seed=5)
    obj = ClientObjective(fn, noise=ObservationNoise("uniform", 1.0, seed=8))
    X = torch.rand(6, 1, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    state = obj.state_dict()
    assert set(state) == {"noise_generator", "observation_noise"}
    observed, reported = obj.evaluate(X)
    # noise = the documented uniform draws of seed 8
    u = torch.rand(6, generator=torch.Generator().manual_seed(8), dtype=torch.float64)
    # (reported + noise) - reported: two roundings (u |observed|, u |noise|), and one ulp
    # for the noise's own formula
    scale = max(observed.abs().max().item(), 1.0)
    assert_close(observed - reported, 2 * u - 1, dtype=torch.float64, factor=2, scale=scale)
    torch.testing.assert_close(reported, fn(X, noise=False), rtol=0, atol=0)
    obj.load_state_dict(state)
    again, _ = obj.evaluate(X)
    torch.testing.assert_close(again, observed, rtol=0, atol=0)
    with pytest.raises(ValueError, match="observation_noise"):
        obj.load_state_dict({"noise_generator": state["noise_generator"]})


# --- FederationSetup ----------------------------------------------------------------


@pytest.mark.parametrize(
    "problem, kernel", [("ldp-synthetic", "se"), ("ldp-synthetic-matern", "matern")]
)
@pytest.mark.parametrize("seed", [0, 4])
def test_ldp_federation_shares_one_function(problem, kernel, seed):
    objectives = FederationSetup(problem=problem, num_clients=3, seed=seed).make_objectives()
    reference = LDPSynthetic(kernel=kernel, function_seed=seed)  # function_seed = seed
    f_grid = reference(reference.candidates, noise=False)
    for obj in objectives:
        assert obj.kernel_hint["kernel"] == kernel
        torch.testing.assert_close(obj.candidates, reference.candidates, rtol=0, atol=0)
        torch.testing.assert_close(obj.value(obj.candidates), f_grid, rtol=0, atol=0)
        assert obj.reward_bound == reference.reward_bound == f_grid.abs().max().item()
        assert obj.optimal_value == f_grid.min().item()
        assert obj.noise_bound == 1.0  # the paper's U[-1, 1]
        observed, reported = obj.evaluate(obj.candidates)
        torch.testing.assert_close(reported, f_grid, rtol=0, atol=0)
        noise = observed - reported
        assert noise.abs().max() <= 1.0 and noise.abs().max() > 0.9
        assert stats.kstest(noise.numpy(), stats.uniform(loc=-1, scale=2).cdf).pvalue > 1e-3
    # clients draw different noise
    a, b = (o.evaluate(o.candidates)[0] for o in objectives[:2])
    assert not torch.equal(a, b)


def test_different_seeds_draw_different_functions():
    one, two = (
        FederationSetup(problem="ldp-synthetic", num_clients=2, seed=s).make_objectives()[0]
        for s in (1, 2)
    )
    assert (one.value(one.candidates) - two.value(two.candidates)).abs().max() > 0.1


def test_ldp_noise_seeds_follow_the_documented_offset():
    seed = 2
    obj = FederationSetup(problem="ldp-synthetic", num_clients=3, seed=seed).make_objectives()[1]
    expected = ObservationNoise("uniform", 1.0, seed=seed * 7919 + 1 + NOISE_SEED_OFFSET)
    X = torch.linspace(0, 1, 5, dtype=torch.float64).unsqueeze(-1)
    observed, reported = obj.evaluate(X)
    # (reported + noise) - reported: two roundings, as above
    scale = max(observed.abs().max().item(), 1.0)
    noise = expected.sample((5,), reported)
    assert_close(observed - reported, noise, dtype=torch.float64, factor=2, scale=scale)


@pytest.mark.parametrize(
    "noise, noise_std, bound",
    [
        (None, 0.25, 0.25),  # the default uniform noise, scaled
        ("uniform", None, 1.0),
        ("uniform", 2.0, 2.0),
        ("student-t", None, None),
        ("pareto", 0.5, None),
        ("gaussian", 0.1, None),
        ("gaussian", None, 0.0),
        ("none", None, 0.0),
    ],
)
def test_noise_kinds(noise, noise_std, bound):
    setup = FederationSetup(
        problem="ldp-synthetic", num_clients=2, seed=1, noise=noise, noise_std=noise_std
    )
    setup.validate("random")
    for obj in setup.make_objectives():
        assert obj.noise_bound == bound
        observed, reported = obj.evaluate(obj.candidates)
        if bound == 0.0:
            torch.testing.assert_close(observed, reported, rtol=0, atol=0)
        else:
            assert not torch.equal(observed, reported)
        if bound is not None:
            assert (observed - reported).abs().max() <= bound
        uses_function_noise = noise == "gaussian"
        assert (
            (obj.function.noise_std == noise_std)
            if uses_function_noise
            else obj.function.noise_std is None
        )
    assert json.loads(json.dumps(setup.describe()))["noise"] == noise


def test_heavy_tailed_noise_on_another_problem():
    objectives = FederationSetup(
        problem="branin", num_clients=2, seed=0, noise="student-t", noise_std=0.5
    ).make_objectives()
    X = torch.rand(4000, 2, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    observed, reported = objectives[0].evaluate(X)
    eta = ((observed - reported) / 0.5).numpy()
    assert stats.kstest(eta, stats.t(3).cdf).pvalue > 1e-3
    assert objectives[0].noise_bound is None and objectives[0].candidates is None


# The Gaussian noise_std path must keep its random stream (checkpoints, benchmarks).
# Recorded values, produced by:
#   objs = FederationSetup(problem="hartmann", dim=6, num_clients=2, noise_std=0.1,
#                          seed=3, shift=0.1).make_objectives()
#   X = torch.linspace(0.05, 0.95, 18, dtype=torch.float64).reshape(3, 6)
#   [o.observe(X).squeeze(-1).tolist() for o in objs]
RECORDED = [
    [0.5621590833242337, 0.3763990784320885, -0.008201796081837421],
    [0.8208426693972686, 0.41935808484469017, -0.055490768296430126],
]


@pytest.mark.parametrize("noise", [None, "gaussian"])
def test_gaussian_stream_is_unchanged(noise):
    setup = FederationSetup(
        problem="hartmann", dim=6, num_clients=2, noise_std=0.1, seed=3, shift=0.1, noise=noise
    )
    X = torch.linspace(0.05, 0.95, 18, dtype=torch.float64).reshape(3, 6)
    objectives = setup.make_objectives()
    shifts = client_shifts(2, 6, 0.1, seed=3 + 17)
    for i, obj in enumerate(objectives):
        assert obj.noise is None and set(obj.state_dict()) == {"noise_generator"}
        observed = obj.observe(X).squeeze(-1)
        assert observed.tolist() == RECORDED[i]
        # the BoTorch function built directly with the client's seed, shifted by hand
        direct = get_test_function("hartmann", dim=6, noise_std=0.1, seed=3 * 7919 + i)
        Z = (X - shifts[i]).clamp(0, 1)
        torch.testing.assert_close(observed, -direct(Z), rtol=0, atol=0)


def test_gaussian_stream_comparison_can_fail():
    r"""Control: another seed gives other observations."""
    objectives = FederationSetup(
        problem="hartmann", dim=6, num_clients=2, noise_std=0.1, seed=4, shift=0.1
    ).make_objectives()
    X = torch.linspace(0.05, 0.95, 18, dtype=torch.float64).reshape(3, 6)
    assert objectives[0].observe(X).squeeze(-1).tolist() != RECORDED[0]


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"noise": "laplace"}, r"`noise`='laplace' must be"),
        ({"noise": "Uniform"}, r"`noise`='Uniform' must be"),
        ({"noise": 1.0}, r"`noise`=1.0 must be"),
        ({"noise": "none", "noise_std": 0.1}, r"`noise`='none' is noise-free"),
    ],
)
def test_bad_noise_settings(kwargs, match):
    setup = FederationSetup(problem="ldp-synthetic", num_clients=2, **kwargs)
    with pytest.raises(ValueError, match=match):
        setup.validate("random")
    with pytest.raises(ValueError, match=match):
        setup.make_objectives()


def test_noise_with_user_objectives_is_refused():
    setup = FederationSetup(objectives=[CallableObjective(_sum, BOUNDS)] * 2, noise="uniform")
    with pytest.raises(ValueError, match="`noise` applies to built-in problems only"):
        setup.validate("random")


def test_describe_keeps_its_old_entries():
    description = FederationSetup(problem="branin", num_clients=2, noise_std=0.1).describe()
    assert description["noise"] is None and description["noise_std"] == 0.1


# --- a run ---------------------------------------------------------------------------


def _ldp_setup():
    return FederationSetup(problem="ldp-synthetic", num_clients=2, seed=1, noise="student-t")


SETTINGS = BOSettings(num_init=3, num_rounds=4, num_restarts=2, raw_samples=16, maxiter=15)


def _checkpoint_after(folder, k):
    with pytest.raises(Killed):
        run_federated("local", _ldp_setup(), SETTINGS, checkpoint=folder, on_round=kill_after(k))


def test_a_run_resumes_with_the_noise_state(tmp_path):
    full = run_federated("local", _ldp_setup(), SETTINGS)
    assert full.optimal_value == LDPSynthetic(function_seed=1).optimal_value
    _checkpoint_after(tmp_path, 2)
    resumed = run_federated("local", _ldp_setup(), SETTINGS, resume=tmp_path)
    assert comparable(resumed) == comparable(full)


def test_the_resumed_run_depends_on_the_saved_noise_state(tmp_path):
    r"""Control: resuming with client 0's observation-noise state replaced gives
    another run (local BO learns from the noisy observations)."""
    full = run_federated("local", _ldp_setup(), SETTINGS)
    _checkpoint_after(tmp_path, 1)
    manifest, states = load_checkpoint(tmp_path)
    entry = manifest["files"]["client-0"]
    state = states["client-0"]
    saved = state["state"]["objective"]["observation_noise"]
    saved["generator"] = torch.Generator().manual_seed(12345).get_state()
    path = tmp_path / entry["file"]
    torch.save(state, path)
    entry["sha256"] = hashlib.sha256(path.read_bytes()).hexdigest()
    (tmp_path / MANIFEST).write_text(json.dumps(manifest))
    resumed = run_federated("local", _ldp_setup(), SETTINGS, resume=tmp_path)
    assert comparable(resumed) != comparable(full)


def test_resume_with_another_noise_is_refused(tmp_path):
    plain = FederationSetup(problem="ldp-synthetic", num_clients=2, seed=1)
    with pytest.raises(Killed):
        run_federated("local", plain, SETTINGS, checkpoint=tmp_path, on_round=kill_after(1))
    other = FederationSetup(problem="ldp-synthetic", num_clients=2, seed=1, noise="pareto")
    with pytest.raises(CheckpointError, match="setup noise: None -> 'pareto'"):
        run_federated("local", other, SETTINGS, resume=tmp_path)
