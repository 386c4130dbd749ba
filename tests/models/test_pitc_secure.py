r"""dPITC models and fits whose sums run through the secure-aggregation backends."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from botorch_fed.models import (
    FederatedPITCGP,
    PITCFitClient,
    PITCHyperparameters,
    fit_federated_pitc,
)
from botorch_fed.secure import make_aggregator
from tests.helpers.dense_pitc import make_modules, random_federation


def _setting(num_clients: int = 4, d: int = 2, m: int = 8):
    clients, support = random_federation(
        3, torch.float64, num_clients, d, m, sizes=[6, 9, 4, 7, 5][:num_clients]
    )
    return clients, support, *make_modules(d, torch.float64, lengthscale=0.4)


@pytest.mark.parametrize(
    "backend, wide", [("ckks", False), ("ckks", True), ("masking", False), ("masking", True)]
)
def test_posterior_from_secure_sums_equals_plaintext(backend, wide):
    clients, support, k, lik, mean = _setting()
    X_test = torch.rand(20, support.shape[-1], dtype=torch.float64)
    stats = []
    with torch.no_grad():
        plain = FederatedPITCGP.from_client_data(clients, support, k, lik, mean).posterior(X_test)
        secure = FederatedPITCGP.from_client_data(
            clients,
            support,
            k,
            lik,
            mean,
            aggregate=make_aggregator(backend, wide=wide, seed=0, stats=stats),
        ).posterior(X_test)
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


def test_federated_fit_through_masking_matches_plaintext():
    clients, support, k, lik, mean = _setting()
    results = []
    for aggregate in (None, make_aggregator("masking", seed=1)):
        kk, ll, mm = make_modules(support.shape[-1], torch.float64, lengthscale=0.4)
        fit_clients = [PITCFitClient(X, Y, support, kk, ll, mm) for X, Y in clients]
        fit_federated_pitc(fit_clients, support, kk, ll, mm, aggregate=aggregate, maxiter=30)
        results.append(PITCHyperparameters(kk, ll, mm).get_theta())
    np.testing.assert_allclose(results[1], results[0], rtol=1e-6, atol=1e-8)


def test_secure_aggregator_needs_three_clients():
    clients, support, k, lik, mean = _setting(num_clients=2)
    from botorch_fed.secure import TooFewClientsError

    with pytest.raises(TooFewClientsError):
        FederatedPITCGP.from_client_data(
            clients, support, k, lik, mean, aggregate=make_aggregator("masking", seed=0)
        )
