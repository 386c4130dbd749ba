r"""The dPITC / PIC factor caches survive BoTorch's per-call ``acqf.to(X)`` (a no-op
conversion), and are rebuilt by real conversions and changes."""

from __future__ import annotations

import math

import pytest
import torch
from botorch.acquisition import UpperConfidenceBound

from botorch_fed.models import (
    FederatedPICGP,
    FederatedPITCGP,
    HyperparametersChangedError,
    SparseSummary,
    compute_local_summary,
)
from tests.helpers.dense_pitc import make_modules, random_federation
from tests.helpers.tolerances import assert_close

pytestmark = pytest.mark.usefixtures("quiet_seeded")
KINDS = ["pitc", "pic"]


def _model(kind: str, d: int = 3, m: int = 7):
    clients, support = random_federation(0, torch.float64, 4, d, m, sizes=[6, 9, 4, 7])
    k, lik, mean = make_modules(d, torch.float64, lengthscale=0.4 * math.sqrt(d))
    with torch.no_grad():
        summary = SparseSummary.sum(
            compute_local_summary(X, Y, support, k, lik, mean) for X, Y in clients
        )
    pitc = FederatedPITCGP(support, summary, k, lik, mean)
    return (pitc if kind == "pitc" else FederatedPICGP.from_pitc(pitc, *clients[1])), d


def _entries(model) -> dict:
    return {k: v for k, v in model._cache.items() if k in ("support", "summary", "block")}


@pytest.mark.parametrize("kind", KINDS)
def test_caches_survive_the_acquisitions_per_call_to(kind):
    model, d = _model(kind)
    acqf = UpperConfidenceBound(model, beta=2.0)
    acqf(torch.rand(4, 1, d, dtype=torch.float64))  # UCB runs `self.to(X)` on every call
    entries = _entries(model)
    assert set(entries) == {"support", "summary"} | ({"block"} if kind == "pic" else set())
    acqf(torch.rand(4, 1, d, dtype=torch.float64))
    acqf(torch.rand(2, 1, d, dtype=torch.float64).requires_grad_(True)).sum().backward()
    after = _entries(model)
    assert all(after[k] is v for k, v in entries.items())  # not rebuilt


@pytest.mark.parametrize("kind", KINDS)
def test_a_real_conversion_or_change_rebuilds_the_caches(kind):
    model, d = _model(kind)
    X = torch.rand(3, d, dtype=torch.float64)
    before = model.posterior(X).mean
    entries = _entries(model)
    model.float()  # converts the modules (the summary and the block stay float64)
    assert_close(model.posterior(X).mean, before, dtype=torch.float32, factor=64)
    assert all(_entries(model)[k] is not v for k, v in entries.items())
    model.double()
    with torch.no_grad():
        model.covar_module.base_kernel.raw_lengthscale.add_(0.1)
    with pytest.raises(HyperparametersChangedError):
        model.posterior(X)


def test_a_no_op_to_keeps_the_record_of_changed_modules():
    # a module changed behind the model's back stays detected after a no-op `.to`:
    # the record of the summary's state is not re-taken from the changed modules
    model, d = _model("pitc")
    X = torch.rand(2, d, dtype=torch.float64)
    model.posterior(X)
    model.covar_module.base_kernel.lengthscale = 0.9  # a gpytorch setter (a .data write)
    model.to(X)
    with pytest.raises(HyperparametersChangedError):
        model.posterior(X)
