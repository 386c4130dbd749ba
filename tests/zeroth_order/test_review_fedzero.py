r"""Review of the FedZero contribution: each test exposes a defect and is expected to
fail (strict xfail) until it is fixed. Tolerances are a few ulps of the dtype under
test (the quantities are single roundings away from exact)."""

from __future__ import annotations

import math

import pytest
import torch

from botorch_fed.federation import (
    CallableObjective,
    FederationSetup,
    FedZeroSettings,
    ProtocolViolation,
    build_federation,
    run_federated,
)
from botorch_fed.zeroth_order import Box, L1Ball, L2Ball

pytestmark = pytest.mark.usefixtures("quiet_single_thread")

F64 = torch.float64
EPS64 = torch.finfo(F64).eps


def test_float_radius_keeps_float64_precision():
    ball = L1Ball(torch.zeros(3, dtype=F64), 0.1)
    p = ball.project(torch.tensor([[5.0, 0.0, 0.0]], dtype=F64))
    assert abs(p[0, 0].item() - 0.1) <= 4 * EPS64  # one rounding; now off by 1.5e-9


def test_box_shrink_by_float_h_keeps_queries_inside():
    box = Box(-torch.ones(2, dtype=F64), torch.ones(2, dtype=F64))
    s = box.shrink(0.7)
    assert bool(((s.lower - 0.7) >= -1.0).all()) and bool(((s.upper + 0.7) <= 1.0).all())


def _linear_run(lower: float, h: float, domain: str = "box"):
    d = 3
    obj = CallableObjective(lambda X: X.sum(-1), bounds=[[lower] * d, [lower + 2.0] * d])
    setup = FederationSetup(objectives=obj, num_clients=2, seed=0)
    # f increasing in every coordinate, large eta: the iterate sits on the lower face
    return run_federated(
        "fedzero", setup, FedZeroSettings(num_rounds=10, eta=1.0, h=h, domain=domain)
    )


@pytest.mark.parametrize("domain", ["box", "l1-ball"])
def test_protocol_survives_iterate_on_shrunk_face_float32_h(domain):
    res = _linear_run(-1.0, 0.7, domain)
    assert res.recommendation is not None


def test_protocol_survives_float64_rounding_at_face():
    res = _linear_run(-0.085, 0.25)
    assert res.recommendation is not None


@pytest.mark.parametrize("kw", [dict(noise_std=1.0), dict(shift=0.2)])
def test_context_problem_honours_noise_and_shift(kw):
    settings = FedZeroSettings(num_rounds=5)
    base = run_federated(
        "fedzero", FederationSetup(problem="l1-regression", dim=5, num_clients=2, seed=0), settings
    )
    try:
        other = run_federated(
            "fedzero",
            FederationSetup(problem="l1-regression", dim=5, num_clients=2, seed=0, **kw),
            settings,
        )
    except ValueError:
        return  # refusing the unsupported setting is an acceptable fix
    assert other.recommendation["x"] != base.recommendation["x"]


def test_sign_message_of_wrong_length_is_refused():
    d = 4
    obj = CallableObjective(lambda X: X.sum(-1), bounds=[[-1.0] * d, [1.0] * d])
    server, clients, _ = build_federation(
        "fedzero",
        FederationSetup(objectives=obj, num_clients=2, seed=0),
        FedZeroSettings(num_rounds=2, eta=0.1, h=0.1, message="sign"),
    )
    clients[1].on_round = lambda payload: {"scale": 1.0, "signs": b"\xff\x00\x00"}
    with pytest.raises(ProtocolViolation):
        server.run()


def test_l2_ball_projection_of_large_float32_point():
    p = L2Ball(torch.zeros(3), 1.0).project(torch.full((1, 3), 1e20))
    expected = torch.full((1, 3), 1 / math.sqrt(3))
    assert (p - expected).abs().max().item() <= 8 * torch.finfo(torch.float32).eps


def test_l1_ball_batched_radius_unbatched_point():
    ball = L1Ball(torch.zeros(3, dtype=F64), torch.tensor([1.0, 2.0], dtype=F64))
    try:
        p = ball.project(torch.full((3,), 5.0, dtype=F64))
    except ValueError:
        return
    assert p.shape == (2, 3)


def test_an_optimum_outside_theta_is_flagged():
    r"""l1-regression's planted x* (||x*||_1 = 1.43 at dim 10) lies outside the shrunk
    l1 ball: the regrets are against an optimum Theta does not contain, which the run
    says (a warning) instead of reporting regrets that silently cannot vanish."""
    setup = FederationSetup(problem="l1-regression", dim=10, num_clients=4, seed=0)
    with pytest.warns(UserWarning, match="outside Theta"):
        run_federated("fedzero", setup, FedZeroSettings(num_rounds=50, domain="l1-ball"))
