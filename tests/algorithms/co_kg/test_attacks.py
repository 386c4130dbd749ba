r"""Attacks on the Co-KG federation protocol by a malicious server (and agent).

The attacker runs the server: actively malicious, it knows the run's public seeds
(the agents' seeds, hence their warm-up designs) and runs its own code, so it calls
``secure_sum`` / ``broadcast`` with arguments of its choosing and reads whatever its
secure-aggregation role receives; no agent colludes with it unless a test says so.
Section 3 turns it around: a malicious or broken *agent* against an honest server.

Each test is an attack the code resists and names the code whose removal makes it
fail, except one that pins a documented limit of the secure mean (two rounds of secure
sums reveal the outcomes on a small support).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import botorch_fed.algorithms.co_kg.server as co_kg_server
from botorch_fed.algorithms import build_federation
from botorch_fed.algorithms.co_kg import BarycenterQKGSettings, CoKGClient, CoKGSettings
from botorch_fed.algorithms.co_kg.messages import WeightedMean
from botorch_fed.algorithms.co_kg.settings import MAX_SUPPORT_SIZE
from botorch_fed.inducing import grid_support, sobol_support
from botorch_fed.models import bures_wasserstein_barycenter
from botorch_fed.models.rbf_prior import shared_kernel
from botorch_fed.problems.heterogeneity import initial_design
from botorch_fed.protocol import FederationSetup, ProtocolViolation
from botorch_fed.protocol.declarations import Refused
from botorch_fed.protocol.messages import Message
from tests.helpers.bundles import parts, reply_parts_of

pytestmark = pytest.mark.usefixtures("quiet_single_thread")

SEED = 0
SMALL = dict(
    num_init=3,
    num_rounds=1,
    points_per_dim=4,
    num_restarts=2,
    raw_samples=8,
    maxiter=5,
    local_refit_every=2,
    fit_maxiter=20,
    num_fantasies=2,
)


def _qkg(**kwargs) -> BarycenterQKGSettings:
    return BarycenterQKGSettings(**{**SMALL, **kwargs})


def _cokg(**kwargs) -> CoKGSettings:
    return CoKGSettings(**{**SMALL, "beta0": 0.5, **kwargs})


def _setup(num_clients: int = 3, aggregator: str = "masking", **kwargs) -> FederationSetup:
    return FederationSetup(
        problem="cokg-f1",
        num_clients=num_clients,
        seed=SEED,
        crypto_seed=0,
        aggregator=aggregator,
        **kwargs,
    )


def _agent(settings=None, dim: int = 2) -> CoKGClient:
    r"""One agent (of a federation of 3) after its warm-up (3 points), without a
    support yet."""
    if dim == 2:
        objective = _setup(num_clients=1, aggregator="plaintext").make_objectives()[0]
    else:
        objective = FederationSetup(problem="hartmann", dim=dim, num_clients=1).make_objectives()[0]
    client = CoKGClient(0, objective, settings or _cokg(), seed=1, support_seed=SEED, num_agents=3)
    client.handle(Message("init"))
    return client


def _true_mean(client: CoKGClient, X: torch.Tensor) -> np.ndarray:
    r"""The agent's private posterior mean at ``X`` (test-side ground truth)."""
    model = client.local_model()  # fitted outside no_grad
    with torch.no_grad():
        return model.posterior(X).mean.reshape(-1).numpy()


def _secure_round(aggregator: str = "masking", **kwargs):
    r"""A ``barycenter-qkg --mean-aggregation secure`` federation of 3 agents after the
    warm-up and round 1's posterior requests: each agent holds its hidden mean and
    waits for the server's secure sum."""
    server, clients, _ = build_federation(
        "barycenter-qkg", _setup(aggregator=aggregator), _qkg(mean_aggregation="secure", **kwargs)
    )
    server.initialize()
    server.ledger.round = 1
    replies = server.broadcast("posterior", {"t": 1})
    assert all("mean" not in r.payload for r in replies.values())  # hidden, as documented
    means = {cid: _true_mean(c, server.support) for cid, c in clients.items()}
    return server, clients, means


def _weighted_sum(server, weights) -> np.ndarray:
    r"""The malicious server's secure sum of ``w_n mu_n`` with weights of its choosing."""
    ids = sorted(server.client_ids)
    return server.secure_sum(
        "weighted_mean",
        len(server.support),
        args={"weights": np.asarray(weights, dtype=np.float64), "clients": np.asarray(ids)},
        clients=ids,
    )


def _contribute(agent: CoKGClient, weights, clients) -> np.ndarray:
    r"""``agent``'s ``weighted_mean`` vector for the server's arguments, checked against
    their declaration first, as a secure-sum session checks them."""
    try:
        args = WeightedMean.decode({"weights": weights, "clients": clients}, agent)
    except Refused as exc:
        raise agent.violation(exc.describe(), "weighted_mean") from None
    return agent.vector_weighted_mean(**args.payload())


class _Reached(Exception):
    r"""Raised instead of the server's acquisition optimisation (keeps tests fast)."""


@pytest.fixture
def no_acquisition(monkeypatch):
    def stop(*args, **kwargs):
        raise _Reached

    monkeypatch.setattr(co_kg_server, "optimize_co_acquisition", stop)


# === 1. the secure mean (barycenter-qkg --mean-aggregation secure) ==================


def test_server_chosen_weights_isolate_one_agents_mean():
    # was a defect: the server picked the weights and weights (1, 0, 0) made the masked
    # sum agent 0's mean. Fixed: an agent weighs its own mean by 1/M and refuses any
    # other weights (the UNIFORM_WEIGHTS domain of WeightedMean)
    server, clients, means = _secure_round()
    with pytest.raises(ProtocolViolation, match="the secure mean is uniform"):
        _weighted_sum(server, [1.0, 0.0, 0.0])


def test_one_posterior_request_answers_many_secure_sums():
    # was a defect: N sums with independent weights per posterior request solved for
    # every agent's mean. Fixed: one posterior request answers one secure sum (the
    # hidden mean is consumed by the first attempt), and only uniform weights
    server, clients, means = _secure_round(num_rounds=2)
    uniform = np.full(3, 1 / 3)
    total = _weighted_sum(server, uniform)  # the honest sum: the uniform mean
    # masking: each agent's mu_n / 3 (two roundings) on the grid 2^-40 (2^-41 each),
    # summed exactly, converted to float64 once; numpy's mean: two additions and a
    # division: within 3 2^-41 + eps sum_n |mu_n| of each other
    mus = np.stack([means[c] for c in clients])
    bound = 3 * 2.0**-41 + np.finfo(np.float64).eps * np.abs(mus).sum(0)
    assert np.all(np.abs(total - mus.mean(0)) <= bound)
    W = np.array([uniform, [0.5, 0.25, 0.25], [0.25, 0.5, 0.25]])
    for row in W:
        with pytest.raises(ProtocolViolation, match="without a posterior request"):
            _weighted_sum(server, row)
    # the next round's request arms the next sum, with uniform weights only
    for agent in clients.values():
        agent.handle(Message("posterior", {"t": 2}))
    server.ledger.round = 2
    with pytest.raises(ProtocolViolation, match="the secure mean is uniform"):
        _weighted_sum(server, W[1])


def test_hidden_mean_is_dropped_after_the_round_as_after_a_resume():
    # was a defect: an agent kept its hidden mean after the round. Fixed: the secure sum
    # consumes it, the evaluation ends the round, and it is never checkpoint state
    server, clients, means = _secure_round()
    ids = sorted(clients)
    weights = np.full(3, 1 / 3)
    # the server skips the round's sum: the evaluation still ends the round
    victim = clients[0]
    victim.handle(Message("evaluate", {"x": np.full(2, 0.5), "t": 1}))
    state = victim.state_dict()
    assert not any(torch.is_tensor(v) and v.shape == means[0].shape for v in state.values())
    resumed = build_federation("barycenter-qkg", _setup(), _qkg(mean_aggregation="secure"))[1][0]
    resumed.load_state_dict(state)
    for agent in (resumed, victim):  # the uninterrupted agent answers as the resumed one
        with pytest.raises(ProtocolViolation, match="without a posterior request"):
            agent.vector_weighted_mean(weights, np.asarray(ids))


def test_secure_mean_with_the_plaintext_aggregator_hides_nothing():
    # was a defect: the plaintext backend handed every w_n mu_n to the server. Fixed:
    # the secure mean runs on masking only (the builders refuse the rest, and an agent
    # refuses a weighted_mean session of another backend)
    for aggregator in ("plaintext", "ckks"):
        with pytest.raises(ValueError, match=f"`aggregator`='{aggregator}'.*use masking"):
            _secure_round(aggregator=aggregator)
    server, clients, _ = build_federation("barycenter-qkg", _setup(aggregator="plaintext"), _qkg())
    server.initialize()
    plaintext_role = clients[0].secagg
    agent = _agent(_qkg(mean_aggregation="secure"))
    agent.secagg = plaintext_role
    agent.handle(Message("support", {"support": grid_support(2, 4).numpy()}))
    agent.handle(Message("posterior", {"t": 1}))
    with pytest.raises(ProtocolViolation, match="'plaintext' backend"):
        agent.handle(Message("secagg", {"request": "weighted_mean", "data": b""}))


def test_a_kmeans_support_is_refused_with_the_secure_mean():
    # was a defect: with a k-means support (only range-checked) the server sent a
    # one-point support and read the hidden mean there from the local optimum's
    # best_value -- a mean oracle anywhere in the cube. Fixed: the settings refuse
    # mean_aggregation="secure" with support="kmeans", and an agent validates its own
    # settings, so no agent of such a run exists
    settings = _qkg(mean_aggregation="secure", support="kmeans", support_size=4)
    with pytest.raises(ValueError, match="`support`='kmeans' with `mean_aggregation`='secure'"):
        build_federation("barycenter-qkg", _setup(), settings)
    with pytest.raises(ValueError, match="`support`='kmeans'"):
        _agent(settings)


def test_secure_weights_other_than_uniform_are_refused_in_the_settings():
    for weights in ("data", "precision"):
        with pytest.raises(ValueError, match=f"`weights`='{weights}' with `mean_aggregation`"):
            _qkg(mean_aggregation="secure", weights=weights).validate()
    _qkg(mean_aggregation="secure", weights="uniform").validate()
    _qkg(mean_aggregation="clear", weights="data", support="kmeans").validate()


def test_two_rounds_of_secure_sums_reveal_outcomes_with_a_small_support():
    # A property of the secure mean, documented in docs/security.md, "Co-KG": an
    # honest-but-curious server stacks the sums of two rounds (inputs: public warm-up
    # seeds + its own assignments) and solves for all outcomes with 16 support points
    # and 18 data points (no noise is added). Hiding the outcomes would need noise
    # (differential privacy) or aggregated covariances and hyperparameters, which the
    # secure mean does not add. This test pins the documented claim: two rounds
    # suffice on a small support.
    N, NI = 3, 6
    setup = _setup()
    settings = _qkg(mean_aggregation="secure", num_init=NI, num_rounds=2, local_refit_every=1)
    posteriors, assigned, sums = [], {c: [] for c in range(N)}, []
    server, clients, _ = build_federation(
        "barycenter-qkg",
        setup,
        settings,
        on_receive=lambda c, r: posteriors.extend(
            dict(p.payload) for p in reply_parts_of(r) if p.type == "posterior"
        ),
    )
    send, secure_sum = server.transport.send, server.secure_sum

    def spy_send(messages):
        for cid, message in messages.items():
            for m in parts(message):  # a bundle's parts too
                if m.type == "evaluate":
                    assigned[cid].append(m.payload["x"])
        return send(messages)

    def spy_sum(*args, **kwargs):
        total = secure_sum(*args, **kwargs)
        sums.append((total, kwargs["args"]["weights"].copy()))
        return total

    server.transport.send, server.secure_sum = spy_send, spy_sum
    server.run()  # an honest run; the server only records what it receives
    S = server.support
    assert len(S) < N * NI  # the support is smaller than the data of round 1 alone
    seeds = [SEED * 1_000 + 101 * i + 1 for i in range(N)]  # public (runner.build_context)
    per = NI + 1  # unknown outcomes per agent: the warm-up and round 1's point
    rows, rhs = [], []
    for r, (total, w) in enumerate(sums):
        row, offset = torch.zeros(len(S), N * per, dtype=torch.double), torch.as_tensor(total)
        for n in range(N):
            h = {k: torch.as_tensor(np.asarray(v)) for k, v in posteriors[r * N + n].items()}
            X = initial_design(NI, 2, seeds[n])  # no reconstruction needed
            if r:
                X = torch.cat([X, torch.as_tensor(np.stack(assigned[n][:r]))])
            assert int(h["num_data"]) == len(X)
            kernel = shared_kernel(h["lengthscale"], h["outputscale"])
            with torch.no_grad():
                A = kernel(X).to_dense() + h["noise"] * torch.eye(len(X), dtype=torch.double)
                B = w[n] * torch.linalg.solve(A, kernel(S, X).to_dense().T).T
            m = h["mean_constant"]
            offset = offset - (w[n] * m - B.sum(-1) * m)
            row[:, n * per : n * per + len(X)] = B
        rows.append(row)
        rhs.append(offset)
    y = torch.linalg.lstsq(torch.cat(rows), torch.cat(rhs).unsqueeze(-1)).solution.squeeze(-1)
    truth = torch.cat([clients[c].Y[:per].squeeze(-1) for c in sorted(clients)])
    torch.testing.assert_close(y, truth, rtol=0, atol=1e-6)  # measured: ~1e-10


def test_agents_refuse_malformed_secure_weights():
    # resisted; each case needs its domain in the WeightedMean declaration (the
    # uniform weights, the whole federation); each case gets a fresh round
    server, clients, _ = _secure_round(num_rounds=9)
    agent = clients[0]
    ids = np.array([0, 1, 2])
    uniform = "the secure mean is uniform"
    whole = "not the whole federation"
    for t, (weights, clients_arg, problem) in enumerate(
        [
            ([np.nan, 0.5, 0.5], ids, uniform),
            ([-1.0, 1.0, 1.0], ids, uniform),
            ([2.0, 0.0, 0.0], ids, uniform),
            ([1.0, 0.0, 0.0], ids, uniform),  # sums to one, singles out agent 0
            ([0.5, 0.5], ids, uniform),  # one weight missing
            ([0.5, 0.5], np.array([1, 2]), whole),  # does not name this agent
            ([1 / 3] * 3, np.array([0, 1, 1]), whole),
            ([1 / 3] * 3, np.array(["a", "b", "c"]), whole),
        ],
        start=2,
    ):
        agent.handle(Message("posterior", {"t": t}))
        with pytest.raises(ProtocolViolation, match=problem):
            _contribute(agent, np.asarray(weights), clients_arg)


def test_a_secure_mean_needs_a_posterior_request():
    # resisted: an agent contributes no mean it was not asked a posterior for, and one
    # sum per request; fails without the `armed` check of vector_weighted_mean
    agent = _agent(_qkg(mean_aggregation="secure"))
    agent.handle(Message("support", {"support": grid_support(2, 4).numpy()}))
    with pytest.raises(ProtocolViolation, match="without a posterior request"):
        agent.vector_weighted_mean(np.full(3, 1 / 3), np.array([0, 1, 2]))
    agent.handle(Message("posterior", {"t": 1}))
    expected = _true_mean(agent, agent.support) / 3
    # the agent's (1 / 3) * mu against mu / 3: three roundings (1 / 3, the product, the
    # division), within 1.5 eps relative
    np.testing.assert_allclose(
        agent.vector_weighted_mean(np.full(3, 1 / 3), np.array([2, 0, 1])),
        expected,
        rtol=1.5 * np.finfo(np.float64).eps,
        atol=0,
    )
    with pytest.raises(ProtocolViolation, match="without a posterior request"):
        agent.vector_weighted_mean(np.full(3, 1 / 3), np.array([0, 1, 2]))


def test_a_secure_mean_session_must_span_the_whole_federation():
    # the `clients` argument is the server's claim; the masking session's own client
    # list (authenticated in its header) must be all M agents too: fails without the
    # session check of CoKGClient.on_secagg
    server, clients, _ = build_federation(
        "barycenter-qkg", _setup(num_clients=4), _qkg(mean_aggregation="secure")
    )
    server.initialize()
    server.ledger.round = 1
    server.broadcast("posterior", {"t": 1})
    with pytest.raises(ProtocolViolation, match=r"session runs over clients \[0, 1, 2\]"):
        server.secure_sum(
            "weighted_mean",
            len(server.support),
            args={"weights": np.full(4, 1 / 4), "clients": np.arange(4)},
            clients=[0, 1, 2],  # claims all four, masks with three
        )
    assert clients[0]._pending is None  # nothing of agent 0's input left it


def test_a_secure_agent_needs_the_federation_size():
    objective = _setup(num_clients=1, aggregator="plaintext").make_objectives()[0]
    settings = _qkg(mean_aggregation="secure")
    for M in (None, 2):
        with pytest.raises(ValueError, match="`num_agents`"):
            CoKGClient(0, objective, settings, seed=1, num_agents=M)
    with pytest.raises(ValueError, match="`client_id`=3"):
        CoKGClient(3, objective, settings, seed=1, num_agents=3)
    assert build_federation("barycenter-qkg", _setup(num_clients=4), settings)[1][3].num_agents == 4


# === 2. a malicious server against an agent ===========================================


def test_the_server_cannot_spend_more_than_the_agents_budget():
    # was a defect: nothing bounded the posterior requests, so repeated, negative or
    # huge rounds gave the server any number of evaluations. Fixed: rounds 1..num_rounds,
    # each once, in increasing order (RoundNumber, CoKGClient.accept_round)
    agent = _agent()  # num_init 3, num_rounds 1: at most 4 evaluations
    agent.handle(Message("support", {"support": grid_support(2, 4).numpy()}))
    refused = []
    for k, t in enumerate([1, 1, -7, 10**6, 0, 2]):
        try:
            agent.handle(Message("posterior", {"t": t}))
            agent.handle(Message("evaluate", {"x": np.full(2, 0.1 + 0.2 * k), "t": t}))
        except ProtocolViolation as exc:
            refused.append((t, str(exc)))
    assert len(agent.X) == SMALL["num_init"] + SMALL["num_rounds"]
    assert [t for t, _ in refused] == [1, -7, 10**6, 0, 2]
    assert "already answered round 1" in refused[0][1]
    assert all("rounds 1..1" in problem for _, problem in refused[1:])


def test_rounds_must_increase_and_survive_a_checkpoint():
    agent = _agent(_cokg(num_rounds=5))
    agent.handle(Message("support", {"support": grid_support(2, 4).numpy()}))
    with pytest.raises(ProtocolViolation, match="no round is skipped"):
        agent.handle(Message("posterior", {"t": 2}))
    agent.handle(Message("posterior", {"t": 1}))
    with pytest.raises(ProtocolViolation, match="already answered round 1"):
        agent.handle(Message("posterior", {"t": 1}))  # ... nor is going back
    agent.handle(Message("evaluate", {"x": np.full(2, 0.5), "t": 1}))
    resumed = _agent(_cokg(num_rounds=5))
    resumed.load_state_dict(agent.state_dict())
    with pytest.raises(ProtocolViolation, match="already answered round 1"):
        resumed.handle(Message("posterior", {"t": 1}))
    resumed.handle(Message("posterior", {"t": 2}))


def test_a_replayed_init_does_not_evaluate_again():
    # was a defect: every `init` evaluated the whole initial design again. Fixed in
    # BOClient.on_init (every algorithm): a client that holds evaluations refuses
    agent = _agent()
    with pytest.raises(ProtocolViolation, match="a second `init`"):
        agent.handle(Message("init"))
    assert len(agent.X) == SMALL["num_init"]


def test_a_refused_posterior_request_arms_no_evaluation():
    # was a defect: on_posterior armed the evaluation before building its reply. Fixed:
    # the round is spent and the evaluation armed only once the reply is built
    agent = _agent()
    with pytest.raises(ProtocolViolation, match="no support"):
        agent.handle(Message("posterior", {"t": 1}))
    with pytest.raises(ProtocolViolation, match="last posterior was for round None"):
        agent.handle(Message("evaluate", {"x": np.full(2, 0.5), "t": 1}))
    assert len(agent.X) == SMALL["num_init"]


def test_a_grid_agent_sends_no_centres():
    # was a defect: a grid (or Sobol) agent answered `centers` with k-means centres of
    # its data. Fixed: only agents of a k-means run answer them
    agent = _agent()  # support "auto" in 2-D: the grid
    with pytest.raises(ProtocolViolation, match="public grid support: no centres"):
        agent.handle(Message("centers", {"k": 1}))
    sobol = _agent(_cokg(support_size=16), dim=3)
    with pytest.raises(ProtocolViolation, match="public sobol support: no centres"):
        sobol.handle(Message("centers", {"k": 1}))


@pytest.mark.parametrize(
    "type_, payload",
    [
        ("posterior", {}),
        ("posterior", {"t": "one"}),
        ("posterior", {"t": math.nan}),
        ("posterior", {"t": math.inf}),
        ("posterior", {"t": 1.5}),
        ("posterior", {"t": True}),
        ("evaluate", {"t": 1}),
        ("evaluate", {"t": 1.0, "x": np.full(2, 0.5)}),
        ("evaluate", {"t": 1, "x": "0.5,0.5"}),
        # text arrays do not travel (validate_payload, as Flower's wire); bools do
        ("evaluate", {"t": 1, "x": np.array([True, False])}),
        ("evaluate", {"t": 1, "x": np.array([True, True])}),
        ("support", {}),
        ("support", {"support": b"\x00" * 32}),
        ("support", {"support": "grid"}),
        ("centers", {}),
        ("centers", {"k": "many"}),
        ("centers", {"k": 2.0}),
    ],
)
def test_malformed_server_fields_raise_protocol_violations(type_, payload):
    # was a defect: malformed fields escaped as KeyError / ValueError / OverflowError
    # naming neither the agent nor the request, or were silently truncated (t=1.5 was
    # round 1). Fixed: the declarations of co_kg.messages, checked before any handler
    agent = _agent(_cokg(support="kmeans"))
    agent.handle(Message("support", {"support": grid_support(2, 4).numpy()}))
    if type_ == "evaluate":
        agent.handle(Message("posterior", {"t": 1}))
    with pytest.raises(ProtocolViolation, match=f"Client 0, request '{type_}'"):
        agent.handle(Message(type_, payload))
    assert len(agent.X) == SMALL["num_init"]


def test_an_agent_refuses_points_off_the_unit_cube():
    # resisted; fails without the unit_points() domain of `x` in the Evaluate declaration
    agent = _agent()
    agent.handle(Message("support", {"support": grid_support(2, 4).numpy()}))
    agent.handle(Message("posterior", {"t": 1}))
    for x in [
        [0.5, math.nan],
        [0.5, math.inf],
        [1.0 + 1e-12, 0.5],
        [-1e-300, 0.5],
        [0.5, 0.5, 0.5],
        [[0.5, 0.5]],
    ]:
        with pytest.raises(ProtocolViolation, match=r"finite values in \[0, 1\]"):
            agent.handle(Message("evaluate", {"x": np.asarray(x), "t": 1}))
    assert len(agent.X) == SMALL["num_init"]
    agent.handle(Message("evaluate", {"x": np.zeros(2), "t": 1}))  # the corner is fine
    assert len(agent.X) == SMALL["num_init"] + 1


def test_an_agent_refuses_replayed_and_foreign_round_evaluations():
    # resisted; fails without `if self._assigned_round != t` (or without
    # `self._assigned_round = None` after the evaluation) in CoKGClient.on_evaluate
    agent = _agent(_cokg(num_rounds=2))
    agent.handle(Message("support", {"support": grid_support(2, 4).numpy()}))
    agent.handle(Message("posterior", {"t": 1}))
    agent.handle(Message("evaluate", {"x": np.full(2, 0.2), "t": 1}))
    with pytest.raises(ProtocolViolation, match="evaluate"):
        agent.handle(Message("evaluate", {"x": np.full(2, 0.2), "t": 1}))  # replay
    agent.handle(Message("posterior", {"t": 2}))
    with pytest.raises(ProtocolViolation, match="round 1"):
        agent.handle(Message("evaluate", {"x": np.full(2, 0.3), "t": 1}))  # old round
    assert len(agent.X) == SMALL["num_init"] + 1


def test_an_agent_refuses_any_sobol_support_but_the_public_one():
    # resisted; fails without `if expected is not None and not torch.equal(support,
    # expected)` in CoKGClient.on_support (the grid case is in test_co_kg.py)
    agent = _agent(_cokg(support_size=16), dim=3)  # "auto" in 3-D: Sobol
    public = sobol_support(3, 16, seed=SEED)
    for forged in [
        sobol_support(3, 16, seed=SEED + 1),  # another scrambling
        torch.nextafter(public, torch.ones_like(public)),  # one ulp off
        public[:8],  # a subset
        (0.9 * agent.X[:1] + 0.1 * public).clamp(0, 1),  # around the agent's data
    ]:
        with pytest.raises(ProtocolViolation, match="differs from the sobol support"):
            agent.handle(Message("support", {"support": forged.numpy()}))
    agent.handle(Message("support", {"support": public.numpy()}))
    assert torch.equal(agent.support, public)


def test_an_agent_range_checks_a_kmeans_support_and_k():
    # resisted; fails without the unit_points(rows=True) domain (rows 1..MAX_SUPPORT_SIZE) of the
    # Support declaration, or the Int(1, MAX_SUPPORT_SIZE) domain of `k` in Centers
    agent = _agent(_cokg(support="kmeans"))
    for support in [
        np.full((MAX_SUPPORT_SIZE + 1, 2), 0.5),
        np.empty((0, 2)),
        np.array([[0.5, math.nan]]),
        np.array([[0.5, 1.5]]),
        np.full((3, 3), 0.5),
        np.full(2, 0.5),
    ]:
        with pytest.raises(ProtocolViolation, match="finite points"):
            agent.handle(Message("support", {"support": support}))
    for k in (0, -1, MAX_SUPPORT_SIZE + 1):
        with pytest.raises(ProtocolViolation, match="`k`"):
            agent.handle(Message("centers", {"k": k}))


def test_a_clustered_support_still_gets_a_psd_summary():
    # resisted: on a server-chosen k-means support of 200 points within 1e-4 of one of
    # the agent's inputs, the raw posterior covariance is indefinite beyond the
    # barycenter's tolerance; what the agent sends passes. Fails without `nearest_psd(...)` in
    # CoKGClient.posterior_summary
    agent = _agent(_cokg(support="kmeans"))
    g = torch.Generator().manual_seed(0)
    support = (agent.X[0] + 1e-4 * torch.randn(200, 2, generator=g, dtype=torch.double)).clamp(0, 1)
    agent.handle(Message("support", {"support": support.numpy()}))
    model = agent.local_model()
    with torch.no_grad():
        raw = model.posterior(agent.support).covariance_matrix.unsqueeze(0)
    mean = torch.zeros(1, len(support), dtype=torch.double)
    with pytest.raises(ValueError, match="positive semi-definite"):
        bures_wasserstein_barycenter(mean, raw)
    sent = agent.posterior_summary()["covariance"]
    assert torch.isfinite(sent).all() and torch.equal(sent, sent.T)
    bures_wasserstein_barycenter(mean, sent.unsqueeze(0), max_iter=2)


def test_an_agent_refuses_unknown_message_types():
    # resisted: handle dispatches to `on_<type>` only; fails if it dispatched on the bare
    # name (a server could call state_dict / load_state_dict / local_model)
    agent = _agent()
    for type_ in ("state_dict", "load_state_dict", "local_model", "evaluate_", "fit"):
        with pytest.raises(ProtocolViolation, match="cannot handle"):
            agent.handle(Message(type_, {}))


# === 3. a malicious agent against the server ==========================================


def _poisoned(mutate, algorithm="co-kg", method="on_posterior", **kwargs):
    r"""A 2-agent federation whose agent 1 alters its ``method`` replies with ``mutate``."""
    settings = _cokg(**kwargs) if algorithm == "co-kg" else _qkg(**kwargs)
    server, clients, _ = build_federation(
        algorithm, _setup(num_clients=2, aggregator="plaintext"), settings
    )
    bad = clients[1]
    honest = getattr(bad, method)

    def altered(payload):
        reply = honest(payload)
        mutate(reply)
        return reply

    setattr(bad, method, altered)
    return server, clients


def _set(key, fn):
    def mutate(reply):
        reply[key] = fn(np.asarray(reply[key]))

    return mutate


@pytest.mark.parametrize(
    "mutate, problem",
    [
        (
            _set(
                "covariance", lambda C: C + np.triu(np.full_like(C, 1e-2 * C.diagonal().max()), 1)
            ),
            "not symmetric",
        ),
        (
            _set("covariance", lambda C: C - 10 * C.diagonal().max() * np.eye(len(C))),
            "not positive semi-definite",
        ),
        (_set("covariance", lambda C: 1e6 * C), "above its prior variance"),
        (_set("lengthscale", lambda v: np.full_like(v, 1e-300)), "`lengthscale`"),
        (_set("lengthscale", lambda v: np.full_like(v, 1e300)), "`lengthscale`"),
        (_set("outputscale", lambda v: np.full_like(v, 1e300)), "`outputscale`"),
        (_set("noise", lambda v: 1e-300 * v), "`noise`"),
        # the largest int a message carries (10**400 does not travel: validate_payload)
        (lambda r: r.__setitem__("num_data", 2**64 - 1), "`num_data`"),
        (lambda r: r.__setitem__("num_data", 4), r"`num_data`=4 \(expected an int in 0..3\)"),
        (_set("mean_constant", lambda v: np.full_like(v, 1e8)), "`mean_constant`"),
        (_set("mean", lambda m: m + 1e8), "`mean_constant`"),
    ],
    ids=[
        "asymmetric",
        "indefinite",
        "above_prior",
        "lengthscale_small",
        "lengthscale_large",
        "outputscale",
        "noise",
        "num_data",
        "num_data_beyond_round",
        "mean_constant",
        "mean",
    ],
)
def test_the_server_names_an_agent_with_an_impossible_posterior(mutate, problem, no_acquisition):
    # was a defect: _parse checked shapes, finiteness and signs only -- an asymmetric or
    # indefinite covariance failed in the barycenter and num_data 10**400 in the weights
    # naming no agent, extreme hyperparameters killed the acquisition's optimiser, a
    # far-off prior mean stalled it. Fixed: every field is checked in CoKGServer._parse
    server, _ = _poisoned(mutate)
    server.initialize()
    with pytest.raises(ProtocolViolation, match=rf"the posterior of client 1\b.*{problem}"):
        server.run_round(1)


def test_a_secure_local_optimum_stays_near_the_agents_prior_mean(no_acquisition):
    # under the secure mean the server cannot check best_value against the mean; it
    # must lie within MAX_MEAN_DEVIATION signal standard deviations of the prior mean
    server, clients, _ = build_federation(
        "barycenter-qkg", _setup(), _qkg(mean_aggregation="secure")
    )
    honest = clients[1].on_posterior

    def altered(payload):
        reply = honest(payload)
        reply["best_value"] = 1e300
        return reply

    clients[1].on_posterior = altered
    server.initialize()
    with pytest.raises(ProtocolViolation, match=r"client 1\b.*`best_value`=1e\+300"):
        server.run_round(1)


def test_the_server_refuses_malformed_posteriors_naming_the_agent():
    # resisted; each case fails without its check in CoKGServer._parse (num_data type and
    # sign; shape and finiteness per key; positivity; the local optimum's range)
    cases = [
        lambda r: r.__setitem__("num_data", -1),
        lambda r: r.__setitem__("num_data", True),
        lambda r: r.__setitem__("num_data", 3.0),
        lambda r: r.pop("num_data"),
        _set("covariance", lambda C: np.where(np.eye(len(C)) > 0, np.nan, C)),
        _set("covariance", lambda C: C[:-1, :-1]),
        lambda r: r.__setitem__("covariance", "big"),
        _set("mean", lambda m: m[:-1]),
        lambda r: r.pop("mean"),
        _set("lengthscale", lambda v: np.zeros_like(v)),
        _set("noise", lambda v: -v),
        _set("outputscale", lambda v: np.full_like(v, math.inf)),
        lambda r: r.__setitem__("best_index", 16),
        lambda r: r.__setitem__("best_index", -1),
        lambda r: r.__setitem__("best_index", True),
        lambda r: r.__setitem__("best_index", (r["best_index"] + 1) % 16),
        lambda r: r.__setitem__("best_value", math.nan),
        lambda r: r.__setitem__("best_value", 2**64 - 1),
    ]
    # one round per case: an agent answers each round's posterior request once
    server, clients = _poisoned(lambda reply: None, num_rounds=len(cases))
    server.initialize()
    honest = type(clients[1]).on_posterior.__get__(clients[1])
    for t, mutate in enumerate(cases, start=1):

        def altered(payload, mutate=mutate):
            reply = honest(payload)
            mutate(reply)
            return reply

        clients[1].on_posterior = altered  # the round stops at the parse: nothing evaluated
        with pytest.raises(ProtocolViolation, match="the posterior of client 1"):
            server.run_round(t)
    assert all(len(c.X) == SMALL["num_init"] for c in clients.values())


@pytest.mark.parametrize(
    "mutate",
    [
        lambda r: r.pop("best_index"),
        lambda r: r.__setitem__("best_index", 2.9),
        lambda r: r.__setitem__("best_index", 16),
        lambda r: r.__setitem__("num_data", -3),
        lambda r: r.__setitem__("num_data", 5),  # num_init 3 + num_rounds 1 at most
        lambda r: r.__setitem__("best_value", "high"),
        lambda r: r.__setitem__("best_value", math.inf),
    ],
    ids=["missing", "fractional", "out_of_range", "negative_count", "count", "string", "inf"],
)
def test_the_server_checks_the_final_local_optima(mutate):
    # was a defect: the final `optimum` replies skipped _parse's checks (a missing
    # best_index was a KeyError, 2.9 was truncated to 2, num_data -3 counted as data).
    # Fixed: they go through the same _count / _optimum checks
    server, _ = _poisoned(mutate, method="on_optimum")
    server.initialize()
    with pytest.raises(ProtocolViolation, match=r"the local optimum of client 1\b"):
        server.run(start_round=server.settings.num_rounds)  # only Alg. 1's output step


def test_a_claimed_local_optimum_must_match_the_agents_mean(no_acquisition):
    # was a defect: in clear mode an agent claiming a local optimum of 1e300 became x^.
    # Fixed: best_value must be the mean it sent at best_index, and its maximum
    server, _ = _poisoned(lambda r: r.__setitem__("best_value", 1e300))
    server.initialize()
    with pytest.raises(ProtocolViolation, match=r"client 1\b.*`best_value`=1e\+300"):
        server.run_round(1)
    assert server.recommendation is None


@pytest.mark.parametrize(
    "centers",
    [
        np.array([[5.0, 5.0], [6.0, -3.0]]),
        np.array([[math.nan, 0.5]]),
        np.full((3, 2), 0.5),  # more than centers_per_client
        np.full(2, 0.5),
        "centres",
        b"\x00" * 16,
    ],
)
def test_the_server_names_an_agent_with_bad_centres(centers):
    # was a defect: centres outside the cube from agent 1 made the server broadcast a
    # support honest agent 0 refused (blaming agent 0); NaN centres raised naming a list
    # index. Fixed: CoKGServer._centers
    server, clients = _poisoned(
        lambda r: r.__setitem__("centers", centers),
        method="on_centers",
        support="kmeans",
        support_size=4,
        centers_per_client=2,
    )
    with pytest.raises(ProtocolViolation, match=r"the k-means centres of client 1\b"):
        server.initialize()
