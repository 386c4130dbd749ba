r"""dPITC models built from summaries summed by the secure-aggregation backends."""

from __future__ import annotations

import pytest
import torch

from botorch_fed.models import (
    FederatedPITCGP,
    SparseSummary,
    compute_local_summary,
)
from botorch_fed.secure import make_aggregator
from tests.helpers.dense_pitc import make_modules, random_federation


def _setting(num_clients: int = 4, d: int = 2, m: int = 8):
    clients, support = random_federation(
        3, torch.float64, num_clients, d, m, sizes=[6, 9, 4, 7, 5][:num_clients]
    )
    return clients, support, *make_modules(d, torch.float64, lengthscale=0.4)


def _model(clients, support, k, lik, mean, aggregate):
    with torch.no_grad():
        summaries = [
            compute_local_summary(X, Y, support, k, lik, mean).to_numpy() for X, Y in clients
        ]
    total = SparseSummary.from_numpy(aggregate(summaries), len(support))
    return FederatedPITCGP(support, total, k, lik, mean)


@pytest.mark.parametrize(
    "backend, wide", [("ckks", False), ("ckks", True), ("masking", False), ("masking", True)]
)
def test_posterior_from_secure_sums_equals_plaintext(backend, wide):
    clients, support, k, lik, mean = _setting()
    X_test = torch.rand(20, support.shape[-1], dtype=torch.float64)
    stats = []
    with torch.no_grad():
        plain = FederatedPITCGP.from_client_data(clients, support, k, lik, mean).posterior(X_test)
        aggregate = make_aggregator(backend, wide=wide, seed=0, stats=stats)
        secure = _model(clients, support, k, lik, mean, aggregate).posterior(X_test)
    assert len(stats) == 1 and stats[0]["backend"] == backend
    assert stats[0]["n_clients"] == len(clients)
    err_mean = (secure.mean - plain.mean).abs().max().item()
    err_cov = (
        (secure.distribution.covariance_matrix - plain.distribution.covariance_matrix)
        .abs()
        .max()
        .item()
    )
    assert err_mean <= 1e-8 and err_cov <= 1e-8, (err_mean, err_cov)


def test_secure_aggregator_needs_three_clients():
    clients, support, k, lik, mean = _setting(num_clients=2)
    from botorch_fed.secure import TooFewClientsError

    with pytest.raises(TooFewClientsError):
        _model(clients, support, k, lik, mean, make_aggregator("masking", seed=0))
