r"""The in-process memo of the global search that every global client of a round runs:
identical searches run once, anything that differs (the acquisition's ``maximize``
included) is searched again, and a hit checks the model as the client's own search
would; FBO-FedGP's ``global_step`` checks the server's ``rank`` and ``count`` before any
search and takes no seed from the server."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from botorch.acquisition import LogExpectedImprovement, UpperConfidenceBound
from botorch.models import SingleTaskGP
from gpytorch.kernels import MaternKernel, ScaleKernel

from botorch_fed.acquisition import ranked_step_candidates
from botorch_fed.algorithms import FBOFedGPSettings, build_federation
from botorch_fed.algorithms.fbo_fedgp.seeds import global_step_seed, secret_step_seed
from botorch_fed.models import (
    FederatedPICGP,
    FederatedPITCGP,
    HyperparametersChangedError,
    SparseSummary,
    compute_local_summary,
)
from botorch_fed.problems.objectives import CallableObjective
from botorch_fed.protocol import FederationSetup, ProtocolViolation, bo_client
from botorch_fed.protocol.bo_client import BOClient, BOSettings
from botorch_fed.protocol.messages import Message
from botorch_fed.protocol.shared_search import SharedSearchMemo
from tests.helpers.dense_pitc import make_modules, random_federation

pytestmark = pytest.mark.usefixtures("quiet_single_thread")
SEARCH = {"num_restarts": 2, "raw_samples": 16, "maxiter": 10}


def _pitc(nudge: bool = False) -> FederatedPITCGP:
    r"""A fresh model from fresh modules (what each client builds from the broadcast)."""
    clients, support = random_federation(0, torch.float64, 3, 2, 5, sizes=[5, 6, 4])
    k, lik, mean = make_modules(2, torch.float64, lengthscale=0.4 * math.sqrt(2))
    with torch.no_grad():
        summary = SparseSummary.sum(
            compute_local_summary(X, Y, support, k, lik, mean) for X, Y in clients
        )
    if nudge:  # the next float64 after one entry of b: one ulp
        b = summary.b.clone()
        b[0] = torch.nextafter(b[0], torch.tensor(math.inf, dtype=b.dtype))
        summary = dataclasses.replace(summary, b=b)
    return FederatedPITCGP(support, summary, k, lik, mean)


def _search(acqf, memo, seed=3):
    bounds = torch.tensor([[0.0, 0.0], [1.0, 1.0]], dtype=torch.float64)
    return memo(
        acqf,
        bounds,
        {"seed": seed, "min_distance": 0.05, **SEARCH},
        lambda: ranked_step_candidates(acqf, bounds, seed=seed, min_distance=0.05, **SEARCH),
    )


def test_identical_searches_run_once_and_return_the_search_result():
    memo = SharedSearchMemo()
    a = _search(UpperConfidenceBound(_pitc(), beta=2.0), memo)
    b = _search(UpperConfidenceBound(_pitc(), beta=2.0), memo)  # another client's copy
    assert (memo.misses, memo.hits) == (1, 1)
    direct = _search(UpperConfidenceBound(_pitc(), beta=2.0), SharedSearchMemo())
    assert torch.equal(a, direct) and torch.equal(b, direct)
    b.add_(1.0)  # a caller's in-place edit does not reach the memo
    assert torch.equal(_search(UpperConfidenceBound(_pitc(), beta=2.0), memo), direct)


@pytest.mark.parametrize(
    "other",
    [
        lambda: UpperConfidenceBound(_pitc(nudge=True), beta=2.0),  # the summary, by 1 ulp
        lambda: UpperConfidenceBound(_pitc(), beta=2.001),  # the acquisition
        lambda: LogExpectedImprovement(_pitc(), best_f=0.0),  # another acquisition
    ],
)
def test_anything_that_differs_is_searched_again(other):
    memo = SharedSearchMemo()
    _search(UpperConfidenceBound(_pitc(), beta=2.0), memo)
    _search(other(), memo)
    assert (memo.misses, memo.hits) == (2, 0)
    _search(UpperConfidenceBound(_pitc(), beta=2.0), memo, seed=4)  # another seed
    assert memo.hits == 0


def test_models_whose_state_does_not_determine_them_are_never_memoised():
    X = torch.rand(6, 2, dtype=torch.float64)
    gp = SingleTaskGP(X, X.sum(-1, keepdim=True))  # its training data are not state
    pitc = _pitc()
    pic = FederatedPICGP.from_pitc(pitc, X[:2], torch.zeros(2, 1, dtype=torch.float64))
    for acqf in (UpperConfidenceBound(gp, beta=1.0), UpperConfidenceBound(pic, beta=1.0)):
        memo = SharedSearchMemo()
        assert not memo.supports(acqf)
        _search(acqf, memo)
        _search(acqf, memo)
        assert (memo.misses, memo.hits) == (0, 0)


def test_bad_maxsize_is_refused():
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="maxsize"):
            SharedSearchMemo(bad)


def test_paper_preset_decisions_do_not_depend_on_the_memo(monkeypatch):
    setup = FederationSetup(problem="branin", dim=2, num_clients=4, seed=0, crypto_seed=0)
    config = FBOFedGPSettings.paper(
        num_init=3, num_rounds=3, support_size=6, raw_samples=16, maxiter=20
    )

    def run():
        server, clients, _ = build_federation("fbo-fedgp", setup, config)
        server.run()
        history = [(h["step"], tuple(h["x"])) for c in clients.values() for h in c.history]
        return history, clients[0].search_memo.hits

    with_memo, hits = run()
    assert hits > 0  # round 1 is global for every client (p_1 = 0)
    monkeypatch.setattr(SharedSearchMemo, "supports", staticmethod(lambda acqf: False))
    assert run() == (with_memo, 0)


# --- a client's searches through the memo, and the server's `global_step` fields -------
SETTINGS = dict(num_init=2, num_rounds=2, num_restarts=2, raw_samples=16, maxiter=10)


def _client(i: int) -> BOClient:
    objective = CallableObjective(lambda X: X.sum(-1), bounds=[[0.0, 0.0], [1.0, 1.0]])
    return BOClient(i, objective, BOSettings(**SETTINGS), seed=i, private_seed=i)


def test_maximize_is_part_of_the_memo_key(monkeypatch):
    # BOClient.acquire is public and memoises any given UCB/LogEI on a PITC model when
    # count > 1: two clients, same model, same seed, opposite `maximize`.
    model = _pitc()
    a, b = _client(0), _client(1)
    a.search_memo = b.search_memo = SharedSearchMemo()
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


def test_a_memo_hit_still_checks_the_model_structure():
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
    config = FBOFedGPSettings.paper(
        num_init=3, num_rounds=2, support_size=6, raw_samples=16, maxiter=10
    )
    server, clients, _ = build_federation("fbo-fedgp", setup, config)
    server.initialize()
    server.broadcast("round", {"t": 1})
    server.standardize_outcomes()
    server.refresh_hyperparameters(1)
    server.secure_sum("summary", SparseSummary.packed_length(len(server.support)))
    server.flush()  # the summary's result goes alone: a refused step would leave it queued
    victim = server.client_ids[0]
    return server, victim, clients[victim]


@pytest.mark.parametrize("rank, count", [(40, 2), (-1, 2), (0, 10**9)])
def test_global_step_rank_and_count_are_validated(rank, count, monkeypatch):
    server, victim, client = _victim_at_a_global_step()
    # never run the (possibly huge) search: the client must refuse before it
    monkeypatch.setattr(
        bo_client, "ranked_step_candidates", lambda *a, **k: torch.zeros(1, 2).double()
    )
    payload = {"t": 1, "rank": rank, "count": count}
    with pytest.raises(ProtocolViolation, match="`rank`|`count`"):
        server.send({victim: Message("global_step", payload)})


@pytest.mark.parametrize("aggregator", ["plaintext", "masking"])
def test_global_step_seed_is_not_the_servers(aggregator, monkeypatch):
    # The server may not grind seeds for a point of its choosing: it sends no seed, a
    # global step that carries one is refused, and the search runs under the seed the
    # client derives itself (the public one under plaintext, the secret one under
    # masking).
    server, victim, client = _victim_at_a_global_step(aggregator)
    seeds = []

    def search(*args, seed, **kwargs):
        seeds.append(seed)
        return torch.zeros(1, 2).double()

    monkeypatch.setattr(bo_client, "ranked_step_candidates", search)
    payload = {"t": 1, "rank": 0, "count": 2, "seed": global_step_seed(server.seed, 1) + 1}
    with pytest.raises(ProtocolViolation, match=r"`seed` is not a field of this message"):
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
