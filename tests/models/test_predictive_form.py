r"""The cached predictive form of the dPITC / PIC posteriors against the factor formulas,
and the caches surviving BoTorch's per-call ``acqf.to(X)`` (but not real conversions)."""

from __future__ import annotations

import math

import pytest
import torch
from botorch.acquisition import UpperConfidenceBound
from gpytorch import settings as gpytorch_settings

from botorch_fed.models import (
    FederatedPICGP,
    FederatedPITCGP,
    HyperparametersChangedError,
    SparseSummary,
    compute_local_summary,
)
from botorch_fed.models.pitc_summary import evaluate64
from botorch_fed.models.predictive_form import PredictiveForm, triangular_inverse
from tests.models.dense_pitc import make_modules, random_federation
from tests.tolerances import assert_close

DTYPES = [torch.float32, torch.float64]
pytestmark = pytest.mark.usefixtures("quiet_seeded")


def _models(dtype, seed=0, d=3, m=7):
    clients, support = random_federation(seed, dtype, 4, d, m, sizes=[6, 9, 4, 7])
    k, lik, mean = make_modules(d, dtype, lengthscale=0.4 * math.sqrt(d))
    with torch.no_grad():
        summary = SparseSummary.sum(
            compute_local_summary(X, Y, support, k, lik, mean) for X, Y in clients
        )
    pitc = FederatedPITCGP(support, summary, k, lik, mean)
    pic = FederatedPICGP.from_pitc(pitc, *clients[1])
    return pitc, pic, d


def _live(model, X):
    r"""The factor formulas: with ``detach_test_caches`` off nothing is read from the
    caches, and the form is not used."""
    with gpytorch_settings.detach_test_caches(False), torch.no_grad():
        return model._predict(model.transform_inputs(X.double()))


def _scales(model, X):
    r"""Magnitudes the form's rounding scales with: ``|K_*Z| |a|`` (mean) and
    ``sum |R K_Z*|^2`` (covariance), not the cancelled results."""
    form = model._predictive_form()
    with torch.no_grad():
        K = evaluate64(model.covar_module, X.double(), form.anchors.expand(*X.shape[:-2], -1, -1))
        Y = K @ form.roots.mT
        return float((K.abs() @ form.weights.abs().unsqueeze(-1)).max()), float(
            (Y.abs() @ Y.abs().mT).max()
        )


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", ["pitc", "pic"])
def test_form_matches_the_factor_formulas(dtype, kind):
    pitc, pic, d = _models(dtype)
    model = pitc if kind == "pitc" else pic
    X = torch.rand(5, 3, d, dtype=torch.float64)
    with torch.no_grad():
        mean, cov = model._predict(X)
    live_mean, live_cov = _live(model, X)
    s_mean, s_cov = _scales(model, X)
    # both run in float64 whatever the model's dtype: the form's error is a dot
    # product's, ~ p eps |K||a| (p <= 16 anchors here), that of the solves alike
    p = model._predictive_form().anchors.shape[-2]
    assert_close(mean, live_mean, dtype=torch.float64, factor=4 * p, scale=s_mean)
    assert_close(cov, live_cov, dtype=torch.float64, factor=4 * p, scale=s_cov)


def test_form_with_a_batched_summary_matches_the_factor_formulas():
    pitc, _, d = _models(torch.float64)
    X_new = torch.rand(2, d, dtype=torch.float64)
    fantasy = pitc.fantasize(X_new, sampler=_sampler(4))  # batch of 4 summaries
    X = torch.rand(3, 2, d, dtype=torch.float64)
    with torch.no_grad():
        mean, cov = fantasy._predict(X.unsqueeze(1))
    live_mean, live_cov = _live(fantasy, X.unsqueeze(1))
    assert mean.shape == live_mean.shape == (3, 4, 2)
    s_mean, s_cov = _scales(fantasy, X.unsqueeze(1))
    assert_close(mean, live_mean, dtype=torch.float64, factor=64, scale=s_mean)
    assert_close(cov, live_cov, dtype=torch.float64, factor=64, scale=s_cov)


def _sampler(n):
    from botorch.sampling import SobolQMCNormalSampler

    return SobolQMCNormalSampler(torch.Size([n]), seed=0)


def test_predictive_form_build_and_predict_on_a_closed_form():
    # an exact GP written as a form: anchors = data, a = K^-1 y, R = L^-1 (sign +1)
    k, _, mean = make_modules(2, torch.float64, lengthscale=0.5)
    Z = torch.rand(6, 2, dtype=torch.float64)
    y = torch.randn(6, dtype=torch.float64)
    with torch.no_grad():
        K = evaluate64(k, Z, Z) + 0.1 * torch.eye(6, dtype=torch.float64)
        L = torch.linalg.cholesky(K)
        form = PredictiveForm.build(
            Z, torch.cholesky_solve(y[:, None], L)[:, 0], [(triangular_inverse(L), 1.0)]
        )
        X = torch.rand(4, 2, dtype=torch.float64)
        got_mean, got_cov = form.predict(k, mean, X)
        K_xz = evaluate64(k, X, Z)
        want_mean = evaluate64(mean, X) + K_xz @ torch.linalg.solve(K, y)
        want_cov = evaluate64(k, X, X) - K_xz @ torch.linalg.solve(K, K_xz.mT)
    assert_close(got_mean, want_mean, dtype=torch.float64, factor=1e3)
    assert_close(got_cov, want_cov, dtype=torch.float64, factor=1e3)
    assert form.signs.tolist() == [1.0] * 6
    with torch.no_grad():
        assert_close(
            triangular_inverse(L) @ L,
            torch.eye(6, dtype=torch.float64),
            dtype=torch.float64,
            factor=100,
        )


@pytest.mark.parametrize("kind", ["pitc", "pic"])
def test_caches_survive_the_acquisitions_per_call_to(kind):
    pitc, pic, d = _models(torch.float64)
    model = pitc if kind == "pitc" else pic
    acqf = UpperConfidenceBound(model, beta=2.0)
    X = torch.rand(4, 1, d, dtype=torch.float64)
    acqf(X)  # UCB runs `self.to(X)` on every call
    form = model._predictive_form()
    acqf(X)
    acqf(torch.rand(4, 1, d, dtype=torch.float64))
    assert model._predictive_form() is form  # not rebuilt


@pytest.mark.parametrize("kind", ["pitc", "pic"])
def test_a_real_conversion_or_change_rebuilds_the_form(kind):
    pitc, pic, d = _models(torch.float64)
    model = pitc if kind == "pitc" else pic
    X = torch.rand(3, d, dtype=torch.float64)
    before = model.posterior(X).mean
    form = model._predictive_form()
    model.float()  # converts the modules (the summary and the block stay float64)
    assert model._predictive_form() is not form
    assert_close(model.posterior(X).mean, before, dtype=torch.float32, factor=64)
    model.double()
    with torch.no_grad():
        model.covar_module.base_kernel.raw_lengthscale.add_(0.1)
    with pytest.raises(HyperparametersChangedError):
        model.posterior(X)
