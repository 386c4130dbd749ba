r"""Review of the shared-search memo and FBO-FedGP's ``global_step``: hits that return
what the client's own search would not have returned, and the server's unchecked
``rank``/``count`` (each test a defect found in review, now fixed). The server no
longer sends the search's seed at all (issue 14, finding 7: each client derives it,
see ``test_secret_global_seed.py``); the seed test below says what became of it."""

from __future__ import annotations

import math

import pytest
import torch
from botorch.acquisition import UpperConfidenceBound
from gpytorch.kernels import MaternKernel, ScaleKernel

from botorch_fed.federation import (
    FBOFedGPConfig,
    FederationSetup,
    ProtocolViolation,
    bo_client,
    build_federation,
)
from botorch_fed.federation.bo_client import BOClient, BOSettings
from botorch_fed.federation.fbo_fedgp import global_step_seed, secret_step_seed
from botorch_fed.federation.messages import Message
from botorch_fed.federation.objectives import CallableObjective
from botorch_fed.federation.shared_search import SharedSearchMemo
from botorch_fed.models import (
    FederatedPITCGP,
    HyperparametersChangedError,
    SparseSummary,
    compute_local_summary,
)
from tests.federation.test_shared_search import _pitc, _search
from tests.helpers.dense_pitc import make_modules, random_federation

pytestmark = pytest.mark.usefixtures("quiet_single_thread")
SETTINGS = dict(num_init=2, num_rounds=2, num_restarts=2, raw_samples=16, maxiter=10)


def _client(i: int) -> BOClient:
    objective = CallableObjective(lambda X: X.sum(-1), bounds=[[0.0, 0.0], [1.0, 1.0]])
    return BOClient(i, objective, BOSettings(**SETTINGS), seed=i, private_seed=i)


def test_review_maximize_is_not_in_the_key(monkeypatch):
    # BOClient.acquire is public and memoises any given UCB/LogEI on a PITC model when
    # count > 1: two clients, same model, same seed, opposite `maximize`.
    monkeypatch.setattr(bo_client, "SHARED_SEARCHES", SharedSearchMemo())
    model = _pitc()
    a, b = _client(0), _client(1)
    a.acquire(model, 1, acqf=UpperConfidenceBound(model, beta=2.0), rank=0, count=2, seed=5)
    got = b.acquire(
        model, 1, acqf=UpperConfidenceBound(model, beta=2.0, maximize=False), count=2, seed=5
    )
    monkeypatch.setattr(SharedSearchMemo, "supports", staticmethod(lambda acqf: False))
    own = _client(1).acquire(
        model, 1, acqf=UpperConfidenceBound(model, beta=2.0, maximize=False), count=2, seed=5
    )
    assert torch.equal(got, own)


def _matern_pitc() -> FederatedPITCGP:
    clients, support = random_federation(0, torch.float64, 3, 2, 5, sizes=[5, 6, 4])
    _, lik, mean = make_modules(2, torch.float64, lengthscale=0.5)
    k = ScaleKernel(MaternKernel(nu=2.5, ard_num_dims=2)).double()
    with torch.no_grad():
        k.base_kernel.lengthscale = torch.full((1, 2), 0.4 * math.sqrt(2), dtype=torch.float64)
        summary = SparseSummary.sum(
            compute_local_summary(X, Y, support, k, lik, mean) for X, Y in clients
        )
    return FederatedPITCGP(support, summary, k, lik, mean)


def test_review_hit_bypasses_the_structure_check():
    memo = SharedSearchMemo()
    _search(UpperConfidenceBound(_matern_pitc(), beta=2.0), memo)
    stale = _matern_pitc()
    stale.covar_module.base_kernel.nu = 0.5  # the summary was computed with nu = 2.5
    with pytest.raises(HyperparametersChangedError, match="structure"):  # what its own search does
        _search(UpperConfidenceBound(stale, beta=2.0), SharedSearchMemo())
    with pytest.raises(HyperparametersChangedError, match="structure"):
        _search(UpperConfidenceBound(stale, beta=2.0), memo)


def _victim_at_a_global_step(aggregator: str = "plaintext"):
    r"""A paper-preset federation up to round 1's ``global_step`` (``p_1 = 0``: every
    client drew a global step), the summary sum delivered; returns the server, the
    victim's id and its client object."""
    setup = FederationSetup(
        problem="branin", dim=2, num_clients=3, seed=0, crypto_seed=0, aggregator=aggregator
    )
    config = FBOFedGPConfig.paper(
        num_init=3, num_rounds=2, support_size=6, raw_samples=16, maxiter=10
    )
    server, clients, _ = build_federation("fbo-fedgp", setup, config)
    server.initialize()
    server.broadcast("round", {"t": 1})
    server.standardize_outcomes()
    server.refresh_hyperparameters(1)
    server.secure_sum("summary", SparseSummary.packed_length(len(server.support)))
    victim = server.client_ids[0]
    return server, victim, clients[victim]


@pytest.mark.parametrize("rank, count", [(40, 2), (-1, 2), (0, 10**9)])
def test_review_global_step_rank_and_count_are_not_validated(rank, count, monkeypatch):
    server, victim, client = _victim_at_a_global_step()
    # never run the (possibly huge) search: the client must refuse before it
    monkeypatch.setattr(
        bo_client, "ranked_step_candidates", lambda *a, **k: torch.zeros(1, 2).double()
    )
    payload = {"t": 1, "rank": rank, "count": count}
    with pytest.raises(ProtocolViolation, match="rank"):
        server.send({victim: Message("global_step", payload)})


@pytest.mark.parametrize("aggregator", ["plaintext", "masking"])
def test_review_global_step_seed_is_not_the_servers(aggregator, monkeypatch):
    # The server may not grind seeds for a point of its choosing. This test used to
    # send the public seed + 1 and expect "not the round's public seed"; the server
    # now sends no seed: a global step that carries one is refused, and the search
    # runs under the seed the client derives itself (the public one under plaintext,
    # the secret one under masking).
    server, victim, client = _victim_at_a_global_step(aggregator)
    seeds = []

    def search(*args, seed, **kwargs):
        seeds.append(seed)
        return torch.zeros(1, 2).double()

    monkeypatch.setattr(bo_client, "ranked_step_candidates", search)
    monkeypatch.setattr(bo_client, "SHARED_SEARCHES", SharedSearchMemo())  # no earlier hit
    payload = {"t": 1, "rank": 0, "count": 2, "seed": global_step_seed(server.seed, 1) + 1}
    with pytest.raises(ProtocolViolation, match="unexpected fields"):
        server.send({victim: Message("global_step", payload)})
    assert seeds == []
    client._global_round = 1  # the refused step consumed the draw; a well-formed one
    server.send({victim: Message("global_step", {"t": 1, "rank": 0, "count": 2})})
    secret = client.federation_secret()
    expected = (
        global_step_seed(server.seed, 1)
        if secret is None
        else secret_step_seed(secret, server.seed, 1)
    )
    assert seeds == [expected] and (secret is None) == (aggregator == "plaintext")
