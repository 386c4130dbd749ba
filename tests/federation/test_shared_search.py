r"""The in-process memo of the global search that every global client of a round runs."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from botorch.acquisition import LogExpectedImprovement, UpperConfidenceBound
from botorch.models import SingleTaskGP

from botorch_fed.acquisition import ranked_step_candidates
from botorch_fed.federation import FBOFedGPConfig, FederationSetup, build_federation, shared_search
from botorch_fed.federation.shared_search import SharedSearchMemo
from botorch_fed.models import FederatedPICGP, FederatedPITCGP, SparseSummary, compute_local_summary
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
    config = FBOFedGPConfig.paper(
        num_init=3, num_rounds=3, support_size=6, raw_samples=16, maxiter=20
    )

    def run():
        shared_search.SHARED_SEARCHES.clear()
        server, clients, _ = build_federation("fbo-fedgp", setup, config)
        server.run()
        return [(h["step"], tuple(h["x"])) for c in clients.values() for h in c.history]

    memo = shared_search.SHARED_SEARCHES
    hits = memo.hits
    with_memo = run()
    assert memo.hits > hits  # round 1 is global for every client (p_1 = 0)
    monkeypatch.setattr(SharedSearchMemo, "supports", staticmethod(lambda acqf: False))
    assert run() == with_memo
