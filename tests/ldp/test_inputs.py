r"""Bad inputs to the learners raise ``ValueError`` naming the argument, and leave the
learner as it was."""

from __future__ import annotations

import math

import pytest
import torch

from botorch_fed.ldp import ATAGPUCB, GPUCB, TGPUCB, MoMAGPUCB, RewardModel, run_learner
from tests.helpers.ldp_learners import LEARNER_CLASSES, PRIVATE, kernel, make

F64 = torch.float64


@pytest.mark.parametrize(
    "candidates",
    [
        torch.empty(0, 1, dtype=F64),  # empty domain
        torch.tensor([[0.5], [1.5]], dtype=F64),  # outside the unit cube
        torch.tensor([[-0.1]], dtype=F64),
        torch.tensor([[0.5], [math.nan]], dtype=F64),
        torch.tensor([[0.5], [math.inf]], dtype=F64),
        torch.rand(4, 2, dtype=F64),  # wrong dimension
        torch.rand(4, dtype=F64),  # not n x d
    ],
    ids=["empty", "above-1", "below-0", "nan", "inf", "wrong-dim", "1-d"],
)
@pytest.mark.parametrize("cls", LEARNER_CLASSES, ids=lambda c: c.name)
def test_bad_candidates(cls, candidates):
    with pytest.raises(ValueError, match="`candidates`"):
        make(cls, candidates=candidates)


@pytest.mark.parametrize("cls", LEARNER_CLASSES, ids=lambda c: c.name)
def test_bad_observations_are_rejected_without_a_trace(cls):
    learner = make(cls, beta=1.0)
    with pytest.raises(ValueError, match="`y`"):  # at the very first play
        learner.observe(learner.propose(), math.nan)
    assert learner.t == 0 and learner.model.embedding.dim == 0
    x = learner.propose()
    learner.observe(x, 0.25)
    state = learner.state_dict()
    model = learner.model
    x = learner.propose()
    for y in [math.nan, math.inf, -math.inf, torch.tensor(math.nan), torch.tensor([math.inf])]:
        with pytest.raises(ValueError, match="`y`"):
            learner.observe(x, y)
    outside = torch.tensor([[0.123]], dtype=F64)  # in [0, 1] but not a candidate
    for bad_x in [outside, torch.tensor([[0.5, 0.5]], dtype=F64), torch.tensor([[math.nan]])]:
        with pytest.raises(ValueError, match="`x`"):
            learner.observe(bad_x, 0.1)
    assert learner.t == 1 and learner.model is model
    after = learner.state_dict()
    assert torch.equal(after["X"], state["X"]) and torch.equal(after["y"], state["y"])
    assert after["gamma"] == state["gamma"]
    learner.observe(x, 0.1)  # still usable
    assert learner.t == 2


def test_reward_model():
    with pytest.raises(ValueError, match="`R`"):
        RewardModel(B=1.0, epsilon=2.0)  # private without R
    with pytest.raises(ValueError, match="`R`.*`noise_moment`"):
        RewardModel(B=1.0)  # non-private without R and noise_moment
    for kwargs, name in [
        (dict(B=-1.0, R=0.5), "B"),
        (dict(B=math.nan, R=0.5), "B"),
        (dict(B=1.0, R=-0.5), "R"),
        (dict(B=1.0, R=0.5, epsilon=0.0), "epsilon"),
        (dict(B=1.0, R=0.5, epsilon=-2.0), "epsilon"),
        (dict(B=1.0, noise_moment=-1.0), "noise_moment"),
    ]:
        with pytest.raises(ValueError, match=f"`{name}`"):
            RewardModel(**kwargs)
    rw = RewardModel(B=1.0, R=0.5, epsilon=2.0)
    assert rw.private and rw.laplace_scale == 1.5
    assert math.isclose(rw.noise_second_moment, 0.25 + 2 * 1.5**2)
    assert math.isclose(rw.reward_second_moment, 1.0 + 0.25 + 2 * 1.5**2)
    heavy = RewardModel(B=1.0, noise_moment=3.0)
    assert not heavy.private and heavy.laplace_scale == 0.0 and heavy.noise_second_moment == 3.0
    assert RewardModel(B=2.0, R=0.5).noise_second_moment == 0.25


@pytest.mark.parametrize("cls", LEARNER_CLASSES, ids=lambda c: c.name)
def test_bad_learner_arguments(cls):
    cases = [
        (dict(lam=0.0), "lam"),
        (dict(lam=-1.0), "lam"),
        (dict(lam=math.nan), "lam"),
        (dict(delta=0.0), "delta"),
        (dict(delta=1.0), "delta"),
        (dict(delta=1.5), "delta"),
        (dict(delta=-0.1), "delta"),
        (dict(horizon=0), "horizon"),
        (dict(beta=-1.0), "beta"),
        (dict(beta_scale=-0.5), "beta_scale"),
        (dict(rewards="private"), "rewards"),
    ]
    if cls in (ATAGPUCB, MoMAGPUCB):
        cases += [
            (dict(accuracy=0.0), "accuracy"),
            (dict(accuracy=1.0), "accuracy"),
            (dict(accuracy=1.5), "accuracy"),
            (dict(q=0.0), "q"),
            (dict(q=-3.0), "q"),
        ]
    if cls is MoMAGPUCB:
        cases += [(dict(k=0), "k"), (dict(k=-2), "k"), (dict(k=2.5), "k"), (dict(k=True), "k")]
    if cls in (TGPUCB, ATAGPUCB):
        cases += [(dict(truncation_scale=0.0), "truncation_scale")]
    for kwargs, name in cases:
        with pytest.raises(ValueError, match=f"`{name}`"):
            make(cls, **kwargs)
    with pytest.raises(ValueError, match="`dim`"):
        cls(kernel(), 0, 10, PRIVATE)


def test_run_learner_rounds():
    learner = make(GPUCB, beta=1.0)
    for rounds in [0, -1, 2.0, True]:
        with pytest.raises(ValueError, match="`rounds`"):
            run_learner(learner, lambda x: torch.zeros(()), rounds)
    assert learner.t == 0


def test_run_learner_records_the_rounds():
    learner = make(GPUCB, beta=1.0, rewards=RewardModel(B=1.0, R=0.5))

    def f(x):
        return torch.sin(6 * x).sum()

    trace = run_learner(
        learner, lambda x: f(x) + 0.1, 6, privatise=lambda y: 2 * y, f=f, optimum=1.0
    )
    assert torch.equal(trace.X, learner.X) and torch.equal(trace.rewards, learner.y)
    fx = torch.stack([f(x) for x in learner.X])
    assert torch.allclose(trace.rewards, 2 * (fx + 0.1)) and torch.allclose(trace.values, fx)
    assert torch.allclose(trace.cumulative_regret, torch.cumsum(1.0 - fx, 0))
    assert len(trace.round_times) == 6


def test_the_domain_is_the_learners_own_copy():
    C = torch.linspace(0.05, 0.95, 10, dtype=F64).unsqueeze(-1)
    learner = make(GPUCB, candidates=C, beta=1.0)  # the base class's constructor
    C[0] = 0.777  # the caller reuses its tensor
    assert float(learner.candidates[0]) == 0.05
    with pytest.raises(ValueError, match="`x`"):
        learner.observe(torch.tensor([[0.777]], dtype=F64), 0.1)


def test_box_learner_rejects_points_outside_the_unit_cube():
    learner = make(GPUCB, candidates=None)
    with pytest.raises(ValueError):
        learner.observe(torch.tensor([[1.7]], dtype=F64), 0.0)


def test_observe_rejects_a_vector_reward_with_value_error():
    learner = make(GPUCB)
    with pytest.raises(ValueError):
        learner.observe(learner.propose(), torch.tensor([1.0, 2.0], dtype=F64))
