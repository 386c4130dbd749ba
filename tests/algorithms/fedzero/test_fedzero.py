r"""FedZero on the federation protocol: the server's step is Alg. 1's (checked against an
independent recomputation), the three message forms give the same run at different
sizes, the averaged iterate improves, bad settings and bad messages are refused."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from botorch_fed.algorithms import FedZeroSettings, build_federation, run_federated
from botorch_fed.problems.objectives import CallableObjective
from botorch_fed.protocol import FederationSetup, Message, ProtocolViolation
from botorch_fed.zeroth_order import l1_sign, sample_l1_sphere
from tests.helpers.tolerances import assert_close, reordering_factor

EPS = torch.finfo(torch.float64).eps

pytestmark = pytest.mark.usefixtures("quiet_single_thread")

A = torch.tensor([0.3, -0.7, 0.2, 0.5], dtype=torch.float64)


def _linear(X):
    return X @ A  # f(x) = a'x: the l1 estimate is exactly d (a'z) sign(z)


def _linear_setup(M: int = 3) -> FederationSetup:
    obj = CallableObjective(_linear, bounds=[[-1.0] * 4, [1.0] * 4])
    return FederationSetup(objectives=obj, num_clients=M, seed=3)


def test_the_server_step_is_alg1_recomputed_independently():
    eta, h, M = 0.05, 0.1, 3
    replies = []
    server, clients, _ = build_federation(
        "fedzero",
        _linear_setup(M),
        FedZeroSettings(num_rounds=6, eta=eta, h=h, message="seed"),
        on_receive=lambda cid, reply: replies.append(dict(reply.payload)),
    )
    xs = []
    original = server.broadcast

    def recording_broadcast(message):  # the declared `round`
        xs.append(torch.as_tensor(message.x).clone())
        return original(message)

    server.broadcast = recording_broadcast
    server.run()
    d = 4
    for t in range(5):  # x_{t+1} = Proj_[-1+h, 1-h](x_t - eta mean_j g_j), g_j from the seed
        gs = []
        for r in replies[t * M : (t + 1) * M]:
            z = sample_l1_sphere(
                d=d, generator=torch.Generator().manual_seed(int(r["seed"])), dtype=torch.float64
            )
            # the two values are f at x_t +- h z: f linear, so their difference is 2h a'z,
            # to rounding. With m_i = |x_i| + h |z_i|: a point x +- h z (2 roundings)
            # through the unit cube and back (2 more, one of them of |P_i - lo_i|) errs
            # by u (4 m_i + |lo_i|) per coordinate; the 4-term dot products
            # (gamma_4 ~ 2 eps), their difference (u) and 2 h (A z) (gamma_4, u) add
            # up to 14 eps sum_i |a_i| m_i + eps sum_i |a_i| |lo_i|
            magnitude = float((A.abs() * (xs[t].abs() + h * z.abs())).sum())
            bound = EPS * (14 * magnitude + float(A.abs().sum()))  # lo_i = -1
            difference = r["y_plus"] - r["y_minus"]
            assert abs(difference - 2 * h * float(A @ z)) <= bound
            gs.append(d / (2 * h) * (r["y_plus"] - r["y_minus"]) * l1_sign(z))
        expected = (xs[t] - eta * torch.stack(gs).mean(0)).clamp(-1 + h, 1 - h)
        torch.testing.assert_close(xs[t + 1], expected, rtol=0, atol=1e-12)
    # the recommendation is the average of the iterates: the server's running sum
    # divided by their number, here torch's mean, two float64 evaluations of one mean
    rec = torch.tensor(server.recommendation["x"], dtype=torch.float64)
    scale = torch.stack(xs).abs().max()
    factor = reordering_factor(len(xs))
    assert_close(rec, torch.stack(xs).mean(0), dtype=torch.float64, factor=factor, scale=scale)


def test_the_three_messages_give_one_run_at_three_sizes():
    d = 64
    a = torch.linspace(-1, 1, d, dtype=torch.float64)
    obj = CallableObjective(lambda X: X @ a, bounds=[[-1.0] * d, [1.0] * d])
    setup = FederationSetup(objectives=obj, num_clients=3, seed=3)
    runs = {
        mode: run_federated(
            "fedzero", setup, FedZeroSettings(num_rounds=5, eta=0.01, h=0.1, message=mode)
        )
        for mode in ("vector", "seed", "sign")
    }
    ref = runs["vector"].recommendation["x"]
    for mode in ("seed", "sign"):
        assert runs[mode].recommendation["x"] == pytest.approx(ref, abs=1e-12)
    # bytes per message (the ledger counts 8 per number, the bytes of arrays and keys):
    # vector 8d + |"g"|, seed 3 x 8 + |"y_plus" "y_minus" "seed"|, sign d/8 + 8 + |keys|
    per_message = {m: r.ledger["total_bytes_up"] / 15 for m, r in runs.items()}
    assert per_message == {"vector": 8 * d + 1, "seed": 24 + 17, "sign": d // 8 + 8 + 10}


def test_the_averaged_iterate_improves_on_l1_regression():
    setup = FederationSetup(problem="l1-regression", dim=10, num_clients=4, seed=0)
    result = run_federated("fedzero", setup, FedZeroSettings(num_rounds=300))
    values = result.iterate_values_per_round
    assert len(values) == 300 and result.optimal_value == 0.0
    assert np.mean(values[-50:]) < 0.5 * values[0]
    assert result.recommendation["value"] < values[0]
    # R_t = sum_s f(x_s) - f*, from the iterates
    assert result.cumulative_regret_per_round[-1] == pytest.approx(sum(values))


def test_workers_sample_contexts_from_their_own_shard():
    setup = FederationSetup(problem="l1-regression", dim=5, num_clients=3, seed=0)
    _, clients, _ = build_federation("fedzero", setup, FedZeroSettings(num_rounds=2))
    shards = [set(c.shard.tolist()) for c in clients.values()]
    assert not (shards[0] & shards[1]) and sum(map(len, shards)) == 1000


@pytest.mark.parametrize(
    "settings, match",
    [
        (dict(message="sign", estimator="l2", eta=0.1, h=0.1), "estimator"),
        (dict(eta=0.1, h=1.5), "h"),
        (dict(eta=-1.0, h=0.1), "eta"),
        (dict(eta=0.1, h=0.1, domain="l2-ball", radius=2.0), "radius"),
        (dict(estimator="l3"), "estimator"),
        (dict(eta=0.1, h=0.1, radius=0.5), "radius"),  # a radius for the box: ignored before
        (dict(), "lipschitz"),  # a user's black box declares no L
    ],
)
def test_bad_settings_name_the_setting(settings, match):
    with pytest.raises(ValueError, match=match):
        run_federated("fedzero", _linear_setup(), FedZeroSettings(num_rounds=3, **settings))


@pytest.mark.parametrize(
    "reply, match",
    [
        ({"g": np.array([math.nan, 0.0, 0.0, 0.0])}, "not finite"),
        ({"g": np.zeros(3)}, "decode"),
        ({"g": np.zeros(4), "y": 1.0}, "fields"),
    ],
)
def test_the_server_refuses_bad_estimates(reply, match):
    server, clients, _ = build_federation(
        "fedzero", _linear_setup(), FedZeroSettings(num_rounds=2, eta=0.1, h=0.1)
    )
    clients[1].on_round = lambda payload: dict(reply)
    with pytest.raises(ProtocolViolation, match=match):
        server.run()


@pytest.mark.parametrize(
    "payload, match",
    [
        ({"t": 1, "x": np.zeros(4), "h": 1.5}, "bounds"),
        ({"t": 1, "x": np.full(4, 0.95), "h": 0.1}, "bounds"),
        ({"t": 1, "x": np.zeros(3), "h": 0.1}, "dimension"),
        ({"t": 1, "x": np.zeros(4), "h": -0.1}, "must be > 0"),
    ],
)
def test_a_worker_refuses_bad_rounds(payload, match):
    _, clients, _ = build_federation(
        "fedzero", _linear_setup(), FedZeroSettings(num_rounds=2, eta=0.1, h=0.1)
    )
    with pytest.raises(ProtocolViolation, match=match):
        clients[0].handle(Message("round", payload))


def test_the_averaged_iterates_values_and_a_resumed_run_keeps_its_steps(tmp_path):
    setup = FederationSetup(problem="l1-regression", dim=10, num_clients=3, seed=1)
    short = run_federated("fedzero", setup, FedZeroSettings(num_rounds=30), checkpoint=tmp_path)
    # f at the running average after the last round is the recommendation's value
    assert short.average_values_per_round[-1] == pytest.approx(short.recommendation["value"])
    extended = run_federated("fedzero", setup, FedZeroSettings(num_rounds=60), resume=tmp_path)
    # Cor. 3.2's defaults of the first horizon, not of the extended one
    assert extended.recommendation["eta"] == short.recommendation["eta"]
    assert extended.recommendation["h"] == short.recommendation["h"]
    assert len(extended.iterate_values_per_round) == 60
