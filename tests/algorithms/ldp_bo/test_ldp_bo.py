r"""LDP-BO on the federation protocol: every variant runs and is scored; users privatise
before a reward leaves them (checked on the wire); privacy is accounted per user; a
server that deviates is refused."""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.stats
import torch

from botorch_fed.algorithms import LDPBOSettings, build_federation, run_federated
from botorch_fed.algorithms.ldp_bo.settings import VARIANTS
from botorch_fed.problems.objectives import CallableObjective, Objective
from botorch_fed.protocol import FederationSetup, Message, ProtocolViolation

pytestmark = pytest.mark.usefixtures("quiet_single_thread")

PRIVATE = [n for n, (_, private) in VARIANTS.items() if private]
SMALL = dict(plays_per_epoch=3, q=5.0, beta_scale=0.05)


def _setup(**kwargs) -> FederationSetup:
    base = dict(problem="ldp-synthetic", num_clients=4, seed=1, crypto_seed=7)
    base.update(kwargs)
    return FederationSetup(**base)


@pytest.mark.parametrize("algorithm", list(VARIANTS))
def test_every_variant_runs_and_scores_cumulative_regret(algorithm):
    T, M = 24, 4
    noise = None if VARIANTS[algorithm][1] or algorithm == "gp-ucb" else "student-t"
    setup = _setup(noise=noise)
    result = run_federated(algorithm, setup, LDPBOSettings(num_rounds=T, **SMALL))
    assert result.steps == {"query": T}
    # independent recomputation of R_t from the points played and f itself
    f = setup.make_objectives()[0]
    values = [
        f.value(torch.tensor([e["x"]], dtype=torch.float64)).item() for e in result.evaluations
    ]
    assert [e["value"] for e in result.evaluations] == pytest.approx(values, abs=1e-12)
    per_round = np.zeros(T + 1)
    for e, v in zip(result.evaluations, values, strict=True):
        per_round[e["round"]] += v - f.optimal_value  # minimisation: value >= optimum
    assert (per_round >= -1e-12).all()
    assert result.cumulative_regret_per_round == pytest.approx(np.cumsum(per_round).tolist())
    # round-robin users: user i answers rounds i+1, i+1+M, ...
    assert [e["client"] for e in sorted(result.evaluations, key=lambda e: e["round"])] == [
        t % M for t in range(T)
    ]
    if VARIANTS[algorithm][1]:
        users = result.privacy["users"]
        assert sorted(users) == ["0", "1", "2", "3"]
        for u in users.values():
            assert u["releases"] == T // M
            assert u["epsilon"] == pytest.approx(T // M * 1.0)  # basic composition
        assert result.privacy["max_epsilon"] == pytest.approx(T // M)
    else:
        assert result.privacy is None
    assert result.recommendation is not None and 0 <= result.recommendation["x_unit"][0] <= 1


class _Recording(Objective):
    r"""Wraps a client's objective and keeps every raw observation (test only)."""

    def __init__(self, inner: Objective) -> None:
        self.inner = inner
        self.bounds = inner.bounds
        self.minimize = inner.minimize
        self.name = inner.name
        self.optimal_value = inner.optimal_value
        for attribute in ("candidates", "reward_bound", "noise_bound", "kernel_hint"):
            setattr(self, attribute, getattr(inner, attribute))
        self.raw: list[float] = []

    def evaluate(self, X):
        observed, reported = self.inner.evaluate(X)
        self.raw.append(float(observed.reshape(())))
        return observed, reported


def _wire(
    algorithm: str, T: int = 400, crypto_seed: int | None = 7, private_randomness: str = "seed"
):
    r"""Run ``algorithm`` with every reply the server receives recorded, and every raw
    observation of the users; returns ``(replies, raw per round, the run's L)``."""
    setup = _setup(crypto_seed=crypto_seed)
    objectives = [_Recording(o) for o in setup.make_objectives()]
    own = FederationSetup(objectives=objectives, seed=setup.seed, crypto_seed=crypto_seed)
    replies = []
    server, clients, _ = build_federation(
        algorithm,
        own,
        LDPBOSettings(num_rounds=T, **SMALL),
        on_receive=lambda cid, reply: replies.append((cid, dict(reply.payload))),
        private_randomness=private_randomness,
    )
    server.run()
    raw = {}
    for client in clients.values():
        rounds = [h["round"] for h in client.history]
        raw.update(zip(rounds, client.objective.raw, strict=True))
    ys = [p["y"] for _, p in replies]
    B, R = objectives[0].reward_bound, objectives[0].noise_bound
    # the users' rewards in the maximisation convention (LDPSynthetic is minimised)
    raw_max = [-raw[t] for t in range(1, T + 1)]
    return np.asarray(ys, dtype=np.float64), np.asarray(raw_max), 2 * (B + R) / 1.0, B + R


@pytest.mark.parametrize("algorithm", PRIVATE)
def test_the_server_never_receives_a_raw_reward(algorithm):
    ys, raw, L, bound = _wire(algorithm)
    assert len(ys) == len(raw) == 400
    assert not np.isclose(ys, raw, rtol=0, atol=1e-9).any()
    # what the server sees is the clipped reward plus Laplace(L) noise: KS against it
    noise = ys - np.clip(raw, -bound, bound)
    assert scipy.stats.kstest(noise, scipy.stats.laplace(scale=L).cdf).pvalue > 1e-3
    # and many replies lie outside what any raw reward can be (|y| <= B + R)
    assert (np.abs(ys) > bound).mean() > 0.2


def test_the_wire_check_fails_without_privatisation():
    r"""Control: the non-private version sends the raw reward, and the checks above
    see it."""
    ys, raw, _, bound = _wire("moma", T=60)
    np.testing.assert_allclose(ys, raw, rtol=0, atol=0)
    assert (np.abs(ys) <= bound).all()


def test_the_noise_is_private_randomness_not_the_public_seed():
    # a deployment's users draw their noise from the OS: the same public seed repeats
    # nothing
    first = _wire("ldp-tgp", T=20, crypto_seed=None, private_randomness="os")[0]
    second = _wire("ldp-tgp", T=20, crypto_seed=None, private_randomness="os")[0]
    assert not np.allclose(first, second)
    seeded = [_wire("ldp-tgp", T=20, crypto_seed=3)[0] for _ in range(2)]
    np.testing.assert_array_equal(*seeded)  # reproducible with the users' seed
    # a simulation derives it from the run's seed: it repeats, and another seed of the
    # users' randomness gives other noise
    simulated = [_wire("ldp-tgp", T=20, crypto_seed=None)[0] for _ in range(2)]
    np.testing.assert_array_equal(*simulated)
    assert not np.allclose(simulated[0], seeded[0])


def _federation(algorithm="ldp-tgp", T=8, **settings):
    return build_federation(algorithm, _setup(), LDPBOSettings(num_rounds=T, **settings))


def test_user_budget_refuses_a_run_that_cannot_fit():
    with pytest.raises(ValueError, match="user_budget"):
        _federation(T=40, user_budget=5.0)  # 4 users x 5 answers < 40 rounds
    _federation(T=20, user_budget=5.0)  # fits exactly


def test_a_user_refuses_queries_beyond_its_budget():
    r"""A malicious server that re-queries one user (to average the noise away) is
    refused once that user's budget is spent."""
    _, clients, _ = _federation(T=12, user_budget=3.0, epsilon=1.0)
    user = clients[0]
    x = user.objective.candidates[5].numpy()
    for t in (1, 5, 9):  # user 0's turns among 4 round-robin users
        user.handle(Message("query", {"x": x, "t": t}))
    with pytest.raises(ProtocolViolation, match="budget"):
        user.handle(Message("query", {"x": x, "t": 13}))
    assert user.privacy_ledger.spent(0)[0] == pytest.approx(3.0)


@pytest.mark.parametrize(
    "payload, match",
    [
        ({"x": np.array([0.123456])}, "finite domain"),
        ({"x": np.array([1.5])}, "unit cube"),
        ({"x": np.array([math.nan])}, "unit cube"),
        ({"x": np.array([0.0, 0.0])}, "dimension"),
        ({}, "`x` is missing"),
    ],
)
def test_a_user_refuses_bad_queries(payload, match):
    _, clients, _ = _federation()
    with pytest.raises(ProtocolViolation, match=match):
        clients[1].handle(Message("query", {"t": 1, **payload}))
    assert clients[1].history == [] and clients[1].privacy_ledger.releases(1) == 0


@pytest.mark.parametrize(
    "reply, match",
    [
        ({"y": math.nan}, r"reward of client 0: its field `y`=nan must be finite"),
        ({"y": 1.0, "raw": 2.0}, "`raw` is not a field"),
        ({}, "`y` is missing"),
    ],
)
def test_the_server_refuses_bad_replies(reply, match):
    server, clients, _ = _federation()
    clients[0].on_query = lambda payload: dict(reply)
    with pytest.raises(ProtocolViolation, match=match):
        server.run()


def test_rewards_beyond_the_declared_bound_are_clipped_and_counted():
    def f(X):
        return 5.0 * X.sum(-1)  # up to 5, declared |f| <= 1

    grid = torch.linspace(0, 1, 11).unsqueeze(-1)
    obj = CallableObjective(
        f, bounds=[[0.0], [1.0]], candidates=grid, reward_bound=1.0, noise_bound=0.0
    )
    result = run_federated(
        "ldp-tgp",
        FederationSetup(objectives=obj, num_clients=3, seed=0, crypto_seed=1),
        LDPBOSettings(num_rounds=30, beta_scale=0.05),
    )
    clipped = sum(u["clipped"] for u in result.privacy["users"].values())
    played = [e["x"][0] for e in result.evaluations]
    assert clipped == sum(1 for x in played if 5.0 * x > 1.0) > 0


def test_own_black_box_on_a_box_domain():
    def f(X):
        return ((X - 0.3) ** 2).sum(-1)

    obj = CallableObjective(f, bounds=[[0.0, 0.0], [1.0, 2.0]], reward_bound=5.0, noise_bound=0.0)
    result = run_federated(
        "ldp-tgp",
        FederationSetup(objectives=obj, num_clients=3, seed=0, crypto_seed=1),
        LDPBOSettings(num_rounds=5, num_restarts=2, raw_samples=32, maxiter=20),
    )
    assert len(result.evaluations) == 5
    for e in result.evaluations:
        assert 0 <= e["x"][0] <= 1 and 0 <= e["x"][1] <= 2


def test_a_failed_evaluation_gives_no_reward_and_the_run_goes_on():
    def f(X):
        return torch.where(X[:, 0] > 0.5, torch.nan, X[:, 0])

    grid = torch.linspace(0, 1, 5).unsqueeze(-1)
    obj = CallableObjective(
        f, bounds=[[0.0], [1.0]], candidates=grid, reward_bound=1.0, noise_bound=0.0
    )
    server, clients, _ = build_federation(
        "ldp-tgp",
        FederationSetup(objectives=obj, num_clients=3, seed=0, crypto_seed=1),
        LDPBOSettings(num_rounds=12, beta=5.0),
    )
    server.run()
    history = [h for c in clients.values() for h in c.history]
    failed = [h for h in history if h.get("failed")]
    assert len(history) == 12 and server.failed == len(failed) > 0
    assert server.learner.t == 12 - len(failed)  # failures bring no reward
    releases = sum(c.privacy_ledger.to_dict()["total_releases"] for c in clients.values())
    assert releases == 12  # a failure is an answer in the clear: it counts against the budget


@pytest.mark.parametrize("private", [True, False])
def test_a_failed_evaluation_counts_against_the_users_budget(private):
    # a failure is an answer in the clear: were it free, a server could map where a
    # black box fails (or, with a noisy one, its value) without spending any budget
    grid = torch.linspace(0, 1, 5).unsqueeze(-1)
    obj = CallableObjective(
        lambda X: torch.full_like(X[:, 0], torch.nan),
        bounds=[[0.0], [1.0]],
        candidates=grid,
        reward_bound=1.0,
        noise_bound=0.0,
    )
    name = "ldp-tgp" if private else "tgp"
    settings = LDPBOSettings(num_rounds=9)
    if private:
        settings = LDPBOSettings(num_rounds=6, epsilon=0.5, user_budget=1.0)
    _, clients, _ = build_federation(
        name, FederationSetup(objectives=obj, num_clients=3, seed=0, crypto_seed=1), settings
    )
    user = clients[0]

    def query(t):  # user 0's turns among 3 round-robin users: rounds 1, 4, 7
        return Message("query", {"x": grid[2].numpy(), "t": t})

    for t in (1, 4):
        assert user.handle(query(t)).payload == {"failed": 1}
    if private:
        assert user.privacy_ledger.spent(0)[0] == pytest.approx(1.0)
        with pytest.raises(ProtocolViolation, match="budget"):
            user.handle(query(7))
    else:
        assert user.handle(query(7)).payload == {"failed": 1}


@pytest.mark.parametrize(
    "settings, match",
    [
        (dict(epsilon=0.0), "epsilon"),
        (dict(epsilon=-1.0), "epsilon"),
        (dict(lam=0.0), "lam"),
        (dict(delta=1.0), "delta"),
        (dict(accuracy=0.0), "accuracy"),
        (dict(plays_per_epoch=0), "plays_per_epoch"),
        (dict(kernel="linear"), "kernel"),
        (dict(users="everyone"), "users"),
        (dict(reward_bound=-1.0), "reward_bound"),
        (dict(user_budget=0.0), "user_budget"),
    ],
)
def test_bad_settings_name_the_setting(settings, match):
    with pytest.raises(ValueError, match=match):
        run_federated("ldp-moma", _setup(), LDPBOSettings(num_rounds=4, **settings))


def test_undeclared_bounds_are_asked_for():
    obj = CallableObjective(lambda X: X.sum(-1), bounds=[[0.0], [1.0]])
    setup = FederationSetup(objectives=obj, num_clients=3)
    with pytest.raises(ValueError, match="reward_bound"):
        run_federated("ldp-moma", setup, LDPBOSettings(num_rounds=4))
    with pytest.raises(ValueError, match="noise_bound"):
        run_federated("ldp-moma", setup, LDPBOSettings(num_rounds=4, reward_bound=1.0))
    # unbounded (Student-t) noise: the private variants need R, the others a moment
    with pytest.raises(ValueError, match="noise_bound"):
        run_federated("ldp-tgp", _setup(noise="student-t"), LDPBOSettings(num_rounds=4))
