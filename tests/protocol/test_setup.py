r"""FederationSetup with the user's objectives, and the results of a run in the user's
convention.

Bad combinations and bad values are refused with a ValueError naming the argument;
every algorithm accepts ``objectives=``; a run that maximises ``f`` makes exactly the
decisions of one that minimises ``-f`` and reports the negated numbers (the convention
is applied once, in the client); results are JSON (strict: no NaN) and carry a regret
only when the optimum is known.
"""

from __future__ import annotations

import json
import math
import re

import pytest
import torch

from botorch_fed.algorithms import FBOFedGPSettings, build_federation, run_federated
from botorch_fed.problems.heterogeneity import ClientObjective
from botorch_fed.problems.objectives import CallableObjective, Objective
from botorch_fed.protocol import BOSettings, FederationSetup
from tests.helpers.federation_runs import ALGORITHMS, IDS

pytestmark = pytest.mark.usefixtures("quiet_single_thread")

BOUNDS = [[-2.0, 0.0], [3.0, 5.0]]
OPTIMUM = (0.5, 2.0)  # in the domain


def score(Z: torch.Tensor) -> torch.Tensor:
    r"""A score to maximise (best 0 at ``OPTIMUM``)."""
    return -((Z[:, 0] - OPTIMUM[0]) ** 2 + (Z[:, 1] - OPTIMUM[1]) ** 2)


def loss(Z: torch.Tensor) -> torch.Tensor:
    return -score(Z)


def _objective(fn=loss, bounds=BOUNDS, minimize=True, name=None) -> CallableObjective:
    return CallableObjective(fn, bounds, minimize=minimize, name=name)


def _settings(algorithm: str, **kwargs):
    base = dict(
        num_init=3, num_rounds=2, raw_samples=16, num_restarts=2, maxiter=20, ts_candidates=64
    )
    base.update(kwargs)
    if algorithm == "fbo-fedgp":
        return FBOFedGPSettings(support_size=4, **base)
    return BOSettings(**base)


# --- bad combinations ---------------------------------------------------------------


def _refused(setup: FederationSetup, argument: str, algorithm: str = "local") -> str:
    pattern = re.escape(f"`{argument}`")
    with pytest.raises(ValueError, match=pattern) as info:
        setup.validate(algorithm)
    # run_federated refuses it too, before any client evaluates anything
    with pytest.raises(ValueError, match=pattern):
        run_federated(algorithm, setup, _settings(algorithm))
    return str(info.value)


def test_both_or_neither_source_is_refused():
    both = FederationSetup(problem="branin", objectives=[_objective()] * 2)
    assert "branin" in _refused(both, "problem")
    with pytest.raises(ValueError, match="`problem=`.*`objectives=`"):
        FederationSetup().validate("local")
    with pytest.raises(ValueError, match="`objectives=`"):
        FederationSetup(num_clients=3).make_objectives()


def test_mismatched_bounds_are_refused():
    other = [[-2.0, 0.0], [3.0, 5.5]]
    message = _refused(
        FederationSetup(objectives=[_objective(), _objective(bounds=other)]), "objectives[1]"
    )
    assert "5.5" in message
    # a different dimension is a different domain as well
    message = _refused(
        FederationSetup(objectives=[_objective(), _objective(bounds=[[0.0], [1.0]])]),
        "objectives[1]",
    )
    # the same bounds written differently are the same domain
    same = _objective(bounds=torch.tensor(BOUNDS, dtype=torch.float32))
    FederationSetup(objectives=[_objective(), same]).validate("local")


def test_mixed_conventions_are_refused():
    setup = FederationSetup(objectives=[_objective(), _objective(score, minimize=False)])
    assert "minimize" in _refused(setup, "objectives[1]")


def test_wrong_count_is_refused():
    setup = FederationSetup(objectives=[_objective()] * 3, num_clients=4)
    message = _refused(setup, "num_clients")
    assert "3 objectives" in message


def test_one_shared_objective():
    shared = _objective()
    _refused(FederationSetup(objectives=shared), "num_clients")
    setup = FederationSetup(objectives=shared, num_clients=3)
    setup.validate("fbo-fedgp")
    assert setup.clients == 3 and setup.make_objectives() == [shared] * 3
    # a list (or tuple) gives the number of clients
    assert FederationSetup(objectives=(shared, shared)).clients == 2
    assert FederationSetup(objectives=[shared] * 4).make_objectives() == [shared] * 4


@pytest.mark.parametrize("argument, value", [("noise_std", 0.1), ("shift", 0.2)])
def test_problem_only_settings_are_refused_with_objectives(argument, value):
    setup = FederationSetup(objectives=[_objective()] * 2, **{argument: value})
    _refused(setup, argument)


def test_dim_mismatch_is_refused():
    _refused(FederationSetup(objectives=[_objective()] * 2, dim=3), "dim")
    FederationSetup(objectives=[_objective()] * 2, dim=2).validate("local")


def test_dim_mismatch_is_refused_for_a_shared_objective():
    with pytest.raises(ValueError, match="`dim`"):
        FederationSetup(objectives=_objective(), num_clients=2, dim=5).validate("local")


@pytest.mark.parametrize(
    "entry",
    [loss, None, "loss", ClientObjective],
    ids=["bare function", "None", "str", "a class"],
)
def test_entries_that_are_not_objectives_are_refused(entry):
    message = _refused(FederationSetup(objectives=[_objective(), entry]), "objectives[1]")
    assert "CallableObjective" in message


@pytest.mark.parametrize("objectives", [[], (), loss, "loss", 3])
def test_objectives_that_are_not_a_list_are_refused(objectives):
    with pytest.raises(ValueError, match="`objectives`|`num_clients`"):
        FederationSetup(objectives=objectives, num_clients=2).validate("local")


def test_too_few_clients_for_the_algorithm_are_refused():
    one = FederationSetup(objectives=[_objective()])
    one.validate("local")  # independent BO runs with one client
    assert "fbo-fedgp" in _refused(one, "num_clients", "fbo-fedgp")
    two = FederationSetup(objectives=[_objective()] * 2, aggregator="masking")
    assert "masking" in _refused(two, "num_clients", "fbo-fedgp")
    with pytest.raises(ValueError, match="`num_clients`=2.0 must be an integer"):
        FederationSetup(objectives=_objective(), num_clients=2.0).validate("local")


def test_bad_evaluation_errors_setting_is_refused():
    setup = FederationSetup(objectives=[_objective()] * 2, evaluation_errors="ignore")
    assert "record" in _refused(setup, "evaluation_errors")


def _problem_setup(seed: int = 2, **kwargs) -> FederationSetup:
    return FederationSetup(problem="branin", num_clients=3, seed=seed, **kwargs)


@pytest.mark.parametrize(
    "algorithm, field, value",
    [
        ("fbo-fedgp", "crypto_seed", -1),
        ("fbo-fedgp", "crypto_seed", 1.5),
        ("local", "init_regions", "no"),
        ("local", "noise_std", math.inf),
        ("local", "noise_std", "0.1"),
        ("local", "shift", "0.1"),
        ("local", "beta", "1"),
    ],
)
def test_bad_setup_values_are_named(algorithm, field, value):
    if field == "beta":
        with pytest.raises(ValueError, match=f"`{field}`"):
            BOSettings(beta=value).validate()
        return
    setup = _problem_setup(**{field: value})
    with pytest.raises(ValueError, match=f"`{field}`"):
        setup.validate(algorithm)


def test_describe_is_json():
    for setup in (
        FederationSetup(problem="branin", num_clients=2, noise_std=0.1),
        FederationSetup(objectives=[_objective(name="a"), _objective(name="b")], seed=3),
        FederationSetup(objectives=_objective(name="shared"), num_clients=3),
    ):
        description = json.loads(json.dumps(setup.describe(), allow_nan=False))
        assert description["num_clients"] == setup.clients
    assert description["objectives"] == [
        {"name": "shared", "dim": 2, "bounds": BOUNDS, "minimize": True}
    ]
    assert description["objectives_shared"] is True
    two = FederationSetup(objectives=[_objective(name="a"), _objective(name="b")]).describe()
    assert [o["name"] for o in two["objectives"]] == ["a", "b"]
    assert two["objectives_shared"] is False and two["num_clients"] == 2


# --- runs in the user's convention ----------------------------------------------------


def _run(algorithm, aggregator, fn, minimize, seed=1, **kwargs):
    objectives = [_objective(fn, minimize=minimize, name="bench") for _ in range(3)]
    setup = FederationSetup(objectives=objectives, seed=seed, crypto_seed=0, aggregator=aggregator)
    return run_federated(algorithm, setup, _settings(algorithm, **kwargs))


@pytest.mark.parametrize("algorithm, aggregator", ALGORITHMS, ids=IDS)
def test_maximising_f_is_minimising_minus_f(algorithm, aggregator):
    up = _run(algorithm, aggregator, score, minimize=False)
    down = _run(algorithm, aggregator, loss, minimize=True)
    assert up.minimize is False and down.minimize is True
    # the same decisions (bit for bit), the numbers negated
    assert up.best_point == down.best_point
    assert up.best_value == -down.best_value
    assert up.best_per_round == [-v for v in down.best_per_round]
    assert up.best_per_client == {c: -v for c, v in down.best_per_client.items()}
    # the best is the max of a score, the min of a loss, and improves monotonically
    assert up.best_per_round == sorted(up.best_per_round)
    assert down.best_per_round == sorted(down.best_per_round, reverse=True)
    assert up.best_value == max(up.best_per_client.values()) == up.best_per_round[-1]
    assert down.best_value == min(down.best_per_client.values())
    # best_point is in the user's domain and has the reported value
    z = torch.tensor([up.best_point], dtype=torch.float64)
    lower, upper = torch.tensor(BOUNDS, dtype=torch.float64)
    assert ((z >= lower) & (z <= upper)).all()
    assert score(z).item() == pytest.approx(up.best_value, rel=1e-12, abs=1e-12)
    # each client's best point has that client's best value
    assert up.best_point_per_client == down.best_point_per_client
    for c, point in up.best_point_per_client.items():
        value = score(torch.tensor([point], dtype=torch.float64)).item()
        assert value == pytest.approx(up.best_per_client[c], rel=1e-12, abs=1e-12)
    assert up.problem == "bench" and up.dim == 2 and up.failures == []
    # unknown optimum: no regret
    assert up.optimal_value is None and up.regret_per_round is None
    # strict JSON (no NaN), round trip
    back = json.loads(json.dumps(up.to_dict(), allow_nan=False))
    assert back["best_point"] == up.best_point and back["minimize"] is False
    assert back["best_per_client"] == {str(c): v for c, v in up.best_per_client.items()}
    assert back["config"]["setup"]["objectives"][0]["minimize"] is False


def test_clients_of_a_maximisation_learn_plus_values():
    objectives = [_objective(score, minimize=False) for _ in range(2)]
    setup = FederationSetup(objectives=objectives, seed=0)
    server, clients, objs = build_federation("local", setup, _settings("local"))
    server.run()
    for client in clients.values():
        values = torch.tensor([h["value"] for h in client.history], dtype=torch.float64)
        assert torch.equal(client.Y.squeeze(-1), values)
        assert torch.equal(values, score(objs[0].to_domain(client.X)))


def test_easy_maximisation_beats_random_search():
    # a 1-D concave score: a handful of BO steps find the top, random points do not
    def peak(Z):
        return 1.0 - (Z[:, 0] - 0.37) ** 2

    results = {}
    for algorithm in ("local", "random"):
        setup = FederationSetup(
            objectives=CallableObjective(peak, [[0.0], [1.0]], minimize=False),
            num_clients=2,
            seed=0,
        )
        settings = BOSettings(num_init=2, num_rounds=4, raw_samples=16, maxiter=30)
        results[algorithm] = run_federated(algorithm, setup, settings)
    bo, rnd = results["local"], results["random"]
    assert bo.best_value > rnd.best_value
    assert bo.best_value > 1.0 - 1e-4  # x within 0.01 of the peak
    assert abs(bo.best_point[0] - 0.37) < 0.01
    assert bo.best_value <= 1.0


def test_regret_only_with_a_known_optimum():
    settings = _settings("local")
    known = run_federated("local", FederationSetup(problem="branin", num_clients=2), settings)
    assert known.optimal_value == pytest.approx(0.397887, abs=1e-6)
    assert known.regret_per_round == [abs(b - known.optimal_value) for b in known.best_per_round]
    json.dumps(known.to_dict(), allow_nan=False)

    class KnownScore(Objective):
        r"""A user's objective with a known best score (maximisation)."""

        def __init__(self):
            self.bounds = torch.tensor(BOUNDS, dtype=torch.float64)
            self.minimize = False
            self.name = "known"
            self.optimal_value = 0.0

        def evaluate(self, X):
            values = score(self.to_domain(X))
            return values, values

    result = run_federated(
        "local", FederationSetup(objectives=KnownScore(), num_clients=2), settings
    )
    assert result.optimal_value == 0.0 and result.minimize is False
    assert all(b <= 0 for b in result.best_per_round)
    assert result.regret_per_round == [-b for b in result.best_per_round]
    assert result.regret_per_round == sorted(result.regret_per_round, reverse=True)


def test_on_round_reports_the_users_values():
    seen = []
    setup = FederationSetup(objectives=[_objective(score, minimize=False)] * 2, seed=2)
    result = run_federated(
        "random", setup, _settings("random"), on_round=lambda t, b: seen.append((t, b))
    )
    assert seen == list(enumerate(result.best_per_round))
    assert len(seen) == 3 and all(math.isfinite(b) for _, b in seen)
