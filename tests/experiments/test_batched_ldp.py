r"""LDP-BO on a batched grid (``botorch_fed.experiments.batched_ldp``): the batched exact
posterior against a dense GP of the plays, the grid's decisions against the protocol
runner's, replications that do not depend on their grid, seeds, bad input."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from botorch_fed.algorithms import get_algorithm, run_federated
from botorch_fed.algorithms.ldp_bo import LDPBOSettings
from botorch_fed.experiments import GRID_ALGORITHMS, run_grid
from botorch_fed.experiments.batched_ldp import (
    LDP_ALGORITHMS,
    LDPGrid,
    build_replications,
    exact_posterior,
)
from botorch_fed.ldp import make_kernel
from botorch_fed.protocol import FederationSetup
from botorch_fed.protocol.runner import build_context

SETUP = FederationSetup(problem="ldp-synthetic", num_clients=4, seed=3)


def _settings(name: str, rounds: int = 20, **changes) -> LDPBOSettings:
    k = 4 if "moma" in name else None
    return LDPBOSettings(num_rounds=rounds, plays_per_epoch=k, **changes)


@pytest.mark.parametrize("lengthscale", [0.3, 3.0])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_batched_exact_posterior_is_the_dense_gp_of_the_plays(dtype, lengthscale):
    g = torch.Generator().manual_seed(0)
    D = torch.rand(15, 2, generator=g, dtype=torch.float64)
    D[7] = D[2]  # a domain point twice: K singular, A still >= lam
    K = make_kernel("se", lengthscale, 2.5, 2)(D).to_dense().detach()
    lam, means, variances = 0.5, [], []
    counts = torch.zeros(3, 15, dtype=torch.float64)
    sums = torch.zeros(3, 15, dtype=torch.float64)
    for b in range(3):  # plays with repetitions, and points never played
        plays = torch.randint(0, 10, (12,), generator=g)
        y = torch.randn(12, generator=g, dtype=torch.float64)
        counts[b] = torch.bincount(plays, minlength=15).double()
        sums[b] = torch.zeros(15, dtype=torch.float64).index_add(0, plays, y)
        # the dense posterior of the 12 plays: K_xX (K_XX + lam I)^-1 y
        Kxx = K[plays][:, plays] + lam * torch.eye(12, dtype=torch.float64)
        KxX = K[:, plays]
        means.append(KxX @ torch.linalg.solve(Kxx, y))
        variances.append(K.diagonal() - (KxX * torch.linalg.solve(Kxx, KxX.mT).mT).sum(-1))
    mean, var = exact_posterior(K.to(dtype), counts.to(dtype), sums.to(dtype), lam)
    assert mean.dtype == var.dtype == dtype and mean.shape == var.shape == (3, 15)
    # A = C^1/2 K_PP C^1/2 + lam I: its condition number bounds the solves' relative error
    kappa = (counts.max() * torch.linalg.matrix_norm(K, 2) + lam).item() / lam
    tol = 2 * 15 * kappa * torch.finfo(dtype).eps * max(1.0, sums.abs().max().item())
    torch.testing.assert_close(mean, torch.stack(means).to(dtype), rtol=0, atol=tol)
    torch.testing.assert_close(var, torch.stack(variances).to(dtype), rtol=0, atol=tol)
    assert (var >= 0).all()
    prior_mean, prior_var = exact_posterior(K, torch.zeros(2, 15), torch.zeros(2, 15), lam)
    assert (prior_mean == 0).all() and torch.equal(prior_var, K.diagonal().expand(2, 15))


def test_the_batched_posterior_is_the_learners_own_after_many_plays():
    spec = get_algorithm("tgp")
    ctx = build_context(spec, SETUP, _settings("tgp", rounds=60), "seed")
    servers, clients = build_replications(spec, [ctx])
    grid = LDPGrid(servers, clients, torch.device("cpu"))
    for t in range(1, 61):
        grid.step(t)
    learner = servers[0].learner
    counts, sums = grid.plays()
    assert counts.sum() == 60 and counts.max() > 1  # repeated plays
    mean, var = exact_posterior(grid.K, counts, sums, learner.lam)
    own_mean, own_var = learner.model.mean_and_variance(learner.candidates)  # refitted here
    # the learner's Nystrom map drops eigenvalues below 1e-10 of the largest
    n = len(learner.candidates)
    tol = 1e-10 * n * max(1.0, sums.abs().max().item()) / learner.lam
    torch.testing.assert_close(mean[0], own_mean, rtol=0, atol=tol)
    torch.testing.assert_close(var[0], own_var, rtol=0, atol=tol)


@pytest.mark.parametrize("changes", [{}, {"users": "random"}], ids=["round-robin", "random"])
@pytest.mark.parametrize("name", ["gp-ucb", "ldp-tgp"])
def test_an_exact_grid_leaves_the_learner_and_server_as_the_protocol_round_does(name, changes):
    settings = _settings(name, **changes)
    spec = get_algorithm(name)
    contexts = [build_context(spec, SETUP, settings, "seed") for _ in range(2)]  # twins
    (grid_server, protocol_server), clients = build_replications(spec, contexts)
    grid = LDPGrid([grid_server], clients[:1], torch.device("cpu"))
    for t in range(1, settings.num_rounds + 1):
        grid.step(t)
        protocol_server.run_round(t)  # the protocol's own round, over its transport
    a, b = grid_server.learner, protocol_server.learner
    assert torch.equal(a.X, b.X) and torch.equal(a.y, b.y)
    assert a.gamma == pytest.approx(b.gamma, rel=1e-9)
    assert getattr(a, "truncated", 0) == getattr(b, "truncated", 0)
    assert a._bias_sq == pytest.approx(b._bias_sq, rel=1e-12)
    assert grid_server.queries == protocol_server.queries
    assert a.generator.get_state().equal(b.generator.get_state())
    ours, theirs = grid_server.recommendation, protocol_server.recommendation
    assert ours["x_unit"] == theirs["x_unit"]
    assert ours["predicted_value"] == pytest.approx(theirs["predicted_value"], abs=1e-9)


@pytest.mark.parametrize("name", LDP_ALGORITHMS)
def test_a_one_replication_grid_plays_the_protocol_runners_points(name):
    settings = _settings(name)
    protocol = run_federated(name, SETUP, settings)
    spec = get_algorithm(name)
    ctx = build_context(spec, SETUP, settings, "seed")
    servers, clients = build_replications(spec, [ctx])
    grid = LDPGrid(servers, clients, torch.device("cpu"))
    for t in range(1, settings.num_rounds + 1):
        grid.step(t)
    batched = [
        {"client": cid, **h} for cid, user in sorted(clients[0].items()) for h in user.history
    ]
    assert batched == protocol.evaluations  # every query: its user, round, point and value
    assert len(batched) == settings.num_rounds


@pytest.mark.parametrize("name", ["ldp-tgp", "ata", "ldp-moma"])
def test_a_replications_result_does_not_depend_on_the_grid_it_ran_in(name):
    settings = _settings(name)
    together = run_grid(name, SETUP, settings, seeds=[3, 8, 11])
    for result in together:
        (alone,) = run_grid(name, SETUP, settings, seeds=[result.seed])
        assert dataclasses.replace(alone, time_s=0) == dataclasses.replace(result, time_s=0)
    again = run_grid(name, SETUP, settings, seeds=[3, 8, 11])  # seeds give identical grids
    assert [dataclasses.replace(r, time_s=0) for r in again] == [
        dataclasses.replace(r, time_s=0) for r in together
    ]
    assert len({tuple(r.best_per_client.values()) for r in together}) > 1  # seeds differ


def test_every_ldp_algorithm_is_a_grid_algorithm_and_its_records_match_the_protocols():
    assert set(LDP_ALGORITHMS) <= set(GRID_ALGORITHMS)
    settings = _settings("ldp-ata", rounds=12)
    (grid,) = run_grid("ldp-ata", SETUP, settings, seeds=[5])
    protocol = run_federated("ldp-ata", dataclasses.replace(SETUP, seed=5), settings)
    assert grid.best_per_round == protocol.best_per_round
    assert grid.best_per_round[0] is None  # round 0 asks nothing
    assert grid.best_per_client == {int(c): v for c, v in protocol.best_per_client.items()}
    assert grid.best_value == protocol.best_value and grid.optimal_value == protocol.optimal_value


def test_ldp_grids_need_a_finite_domain_and_answers():
    box = FederationSetup(problem="branin", num_clients=2, seed=0)
    settings = LDPBOSettings(num_rounds=3, reward_bound=300.0, noise_bound=1.0)
    with pytest.raises(ValueError, match="finite domain"):
        run_grid("ldp-tgp", box, settings, seeds=2)
    spec = get_algorithm("gp-ucb")
    ctx = build_context(spec, SETUP, _settings("gp-ucb"), "seed")
    servers, clients = build_replications(spec, [ctx])
    for user in clients[0].values():  # a user whose evaluation fails returns no reward
        user.on_query = lambda message: {"failed": 1}
    with pytest.raises(ValueError, match="user 0 of replication 0 returned no reward in round 1"):
        LDPGrid(servers, clients, torch.device("cpu")).step(1)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_an_exact_ldp_grid_on_cuda_plays_the_cpus_points():
    settings = _settings("ldp-tgp")
    cpu = run_grid("ldp-tgp", SETUP, settings, seeds=2)
    gpu = run_grid("ldp-tgp", SETUP, settings, seeds=2, device="cuda")
    # the same posteriors to float64 rounding: the same argmax unless two UCB values tie
    # to the last bits (round 1's flat prior ties exactly, broken by the same generator)
    assert [r.best_per_round for r in gpu] == [r.best_per_round for r in cpu]
