r"""The PITC marginal likelihood at summed summaries and its federated gradient."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch
from botorch.exceptions.warnings import InputDataWarning
from botorch.models.utils.gpytorch_modules import (
    get_covar_module_with_dim_scaled_prior,
    get_gaussian_likelihood_with_lognormal_prior,
)
from gpytorch.kernels import MaternKernel, ScaleKernel
from gpytorch.means import ConstantMean

from botorch_fed.models import (
    PITCFitClient,
    PITCHyperparameters,
    SparseSummary,
    compute_local_summary,
    default_jitter,
    pitc_log_marginal_likelihood,
    pitc_loss_and_adjoint,
)
from tests.helpers.dense_pitc import (
    dense_pitc_covariance,
    dense_pitc_log_likelihood,
    jittered_kss,
    make_modules,
    random_federation,
)
from tests.helpers.tolerances import assert_close


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", InputDataWarning)
        yield


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("seed", range(4))
def test_log_marginal_likelihood_matches_dense(seed, dtype):
    rng = np.random.default_rng(seed)
    M, d = int(rng.integers(1, 9)), int(rng.integers(1, 7))
    clients, support = random_federation(seed, dtype, M, d, m=int(rng.integers(2, 3 + 2 * d)))
    k, lik, mean = make_modules(d, dtype, 0.3 * math.sqrt(d))
    with torch.no_grad():
        total = SparseSummary.sum(
            compute_local_summary(X, Y, support, k, lik, mean) for X, Y in clients
        )
        mll = pitc_log_marginal_likelihood(total)
        c64 = [(X.double(), Y.double()) for X, Y in clients]
        k64, lik64, mean64 = k.double(), lik.double(), mean.double()
        ref = dense_pitc_log_likelihood(
            c64, support.double(), k64, lik64, mean64, default_jitter(dtype)
        )
    assert total.num_data.item() == sum(len(X) for X, _ in clients)
    # log N(y; mu, C) = -(quad + logdet + n log 2 pi) / 2 is formed by cancellation:
    # errors are relative to the terms' magnitude. A Cholesky-based evaluation has
    # forward error ~ cond(C) eps (rule of thumb: cond x backward error); K_SS's own
    # factorisation adds m cond(K_SS) eps (entries of Q_ff), the n-term sums n eps.
    with torch.no_grad():
        jitter = default_jitter(dtype)
        C = dense_pitc_covariance(c64, support.double(), k64, lik64.noise, jitter)
        K_SS = jittered_kss(support.double(), k64, jitter)
        X64, y64 = torch.cat([c[0] for c in c64]), torch.cat([c[1] for c in c64]).squeeze(-1)
        r = y64 - mean64(X64)
        n, m = len(y64), len(support)
        quad = r @ torch.linalg.solve(C, r)
        terms = quad.abs() + torch.logdet(C).abs() + n * math.log(2 * math.pi)
    factor = float(torch.linalg.cond(C)) + m * float(torch.linalg.cond(K_SS)) + n
    assert_close(mll, ref, dtype=dtype, factor=factor, scale=terms / 2)


def _fit_setup(dtype=torch.float64, seed=0, kernel="rbf"):
    d = 2
    clients, support = random_federation(seed, dtype, num_clients=4, d=d, m=9, sizes=[7, 3, 12, 5])
    if kernel == "rbf":
        k = get_covar_module_with_dim_scaled_prior(d).to(dtype)
    else:
        k = ScaleKernel(MaternKernel(nu=2.5, ard_num_dims=d)).to(dtype)
    lik = get_gaussian_likelihood_with_lognormal_prior().to(dtype)
    mean = ConstantMean().to(dtype)
    return clients, support, k, lik, mean


@pytest.mark.parametrize("kernel", ["rbf", "matern"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_federated_gradient_equals_dense_autograd(dtype, kernel):
    clients, support, k, lik, mean = _fit_setup(dtype, seed=1, kernel=kernel)
    fit_clients = [PITCFitClient(X, Y, support, k, lik, mean) for X, Y in clients]
    hyper = PITCHyperparameters(k, lik, mean)
    theta = hyper.get_theta() + np.linspace(-0.2, 0.3, hyper.size)
    # the federated protocol: two aggregation rounds
    hyper.set_theta(theta)
    packed = sum(c.summary(theta) for c in fit_clients)
    loss, adjoint, prior_grad = pitc_loss_and_adjoint(packed, len(support), hyper)
    grad = prior_grad + sum(c.vjp(adjoint) for c in fit_clients)
    # the dense reference, differentiated by autograd
    n = sum(len(X) for X, _ in clients)
    ll = dense_pitc_log_likelihood(clients, support, k, lik, mean, default_jitter(dtype))
    dense_loss = -(ll + hyper.log_prior()) / n
    params = list(hyper.parameters.values())
    dense_grad = hyper.flat_grad(torch.autograd.grad(dense_loss, params))
    # The reference is itself a dense Cholesky + autograd in ``dtype``. Loss and gradient
    # are sums of terms that cancel: (quad + logdet) / 2n and 0.5 (a' dC a - tr(C^-1 dC)) / n
    # (a = C^-1 r), two solves deep and accumulated over n^2 products: factor n cond(C),
    # relative to the magnitude of the terms.
    cond_C, loss_scale, grad_scales = _loss_terms(clients, support, k, lik, mean, n)
    factor = n * cond_C
    loss_t = torch.tensor(loss, dtype=torch.float64)
    assert_close(loss_t, dense_loss, dtype=dtype, factor=factor, scale=loss_scale)
    assert_close(
        torch.from_numpy(grad),
        torch.from_numpy(dense_grad),
        dtype=dtype,
        factor=factor,
        scale=grad_scales.max(),
    )
    assert np.abs(grad).max() > 1e-4  # the point is not a stationary one by accident


def _loss_terms(clients, support, k, lik, mean, n):
    r"""``cond(C)`` and the magnitudes of the loss's terms, in float64.

    Returns ``cond(C)``, ``(|quad| + |logdet| + n log 2 pi + 2 |log prior|) / 2n`` and,
    per parameter, ``(|d quad| + |d logdet| + 2 |d log prior|) / 2n``.
    """
    import copy

    k64, lik64, mean64 = (copy.deepcopy(m).double() for m in (k, lik, mean))
    hyper64 = PITCHyperparameters(k64, lik64, mean64)
    clients64 = [(X.detach().double(), Y.detach().double()) for X, Y in clients]
    jitter = default_jitter(support.dtype)
    C = dense_pitc_covariance(clients64, support.double(), k64, lik64.noise, jitter)
    X = torch.cat([c[0] for c in clients64])
    r = torch.cat([c[1] for c in clients64]).squeeze(-1) - mean64(X)
    parts = [r @ torch.linalg.solve(C, r), torch.logdet(C), 2 * hyper64.log_prior()]
    params = list(hyper64.parameters.values())
    grads = [
        np.abs(
            hyper64.flat_grad(torch.autograd.grad(p, params, retain_graph=True, allow_unused=True))
        )
        for p in parts
    ]
    loss_scale = (sum(abs(p.item()) for p in parts) + n * math.log(2 * math.pi)) / (2 * n)
    return float(torch.linalg.cond(C.detach())), loss_scale, sum(grads) / (2 * n)


def test_fit_bad_inputs():
    clients, support, k, lik, mean = _fit_setup()
    c = PITCFitClient(*clients[0], support, k, lik, mean)
    with pytest.raises(RuntimeError, match="before `summary`"):
        c.vjp(np.zeros(SparseSummary.packed_length(len(support))))
    with pytest.raises(ValueError, match="theta"):
        c.summary(np.zeros(2))
    with pytest.raises(ValueError, match="theta"):
        c.summary(np.full(PITCHyperparameters(k, lik, mean).size, np.nan))
    c.summary(PITCHyperparameters(k, lik, mean).get_theta())
    with pytest.raises(ValueError, match="adjoint"):
        c.vjp(np.zeros(3))
    hyper = PITCHyperparameters(k, lik, mean)
    with pytest.raises(ValueError, match="length"):
        pitc_loss_and_adjoint(np.zeros(5), len(support), hyper)


@pytest.mark.parametrize("kernel", ["rbf", "matern"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_summed_jacobians_give_the_dense_gradient_and_match_every_product(dtype, kernel):
    # one sum of summaries and Jacobians carries what the summary sum and the product
    # sum carried: J' adjoint is the gradient, against the dense reference of the test above
    clients, support, k, lik, mean = _fit_setup(dtype, seed=2, kernel=kernel)
    fit_clients = [PITCFitClient(X, Y, support, k, lik, mean) for X, Y in clients]
    hyper = PITCHyperparameters(k, lik, mean)
    theta = hyper.get_theta() + np.linspace(-0.2, 0.3, hyper.size)
    parts = [c.summary_and_jacobian(theta) for c in fit_clients]
    packed, jacobian = sum(p[0] for p in parts), sum(p[1] for p in parts)
    length = SparseSummary.packed_length(len(support))
    assert packed.shape == (length,) and jacobian.shape == (length, hyper.size)
    assert np.array_equal(packed, sum(c.summary(theta) for c in fit_clients))
    hyper.set_theta(theta)
    loss, adjoint, prior_grad = pitc_loss_and_adjoint(packed, len(support), hyper)
    grad = prior_grad + jacobian.T @ adjoint
    n = sum(len(X) for X, _ in clients)
    ll = dense_pitc_log_likelihood(clients, support, k, lik, mean, default_jitter(dtype))
    dense_loss = -(ll + hyper.log_prior()) / n
    dense_grad = hyper.flat_grad(torch.autograd.grad(dense_loss, list(hyper.parameters.values())))
    cond_C, _, grad_scales = _loss_terms(clients, support, k, lik, mean, n)
    assert_close(
        torch.from_numpy(grad),
        torch.from_numpy(dense_grad),
        dtype=dtype,
        factor=n * cond_C,
        scale=grad_scales.max(),
    )
    # every client's Jacobian is its products: J' a == vjp(a) for any a (two backward
    # passes through the same graph, in the data's dtype, in different orders: the
    # support's Cholesky conditions both, then a sum over L rows)
    rng = np.random.default_rng(0)
    for c, (_, J) in zip(fit_clients, parts, strict=True):
        a = rng.normal(size=length)
        c.summary(theta)
        v = c.vjp(a)
        assert_close(
            torch.from_numpy(J.T @ a),
            torch.from_numpy(v),
            dtype=dtype,
            factor=length * cond_C,
            scale=np.abs(J).max() * np.abs(a).max(),
        )


def test_the_jacobian_is_the_summarys_derivative():
    # central differences of the summary itself (float64): O(h^2) + rounding / h
    clients, support, k, lik, mean = _fit_setup(torch.float64, seed=3)
    c = PITCFitClient(*clients[0], support, k, lik, mean)
    theta = PITCHyperparameters(k, lik, mean).get_theta() + 0.1
    packed, J = c.summary_and_jacobian(theta)
    h = 1e-5
    for i in range(len(theta)):
        e = np.zeros_like(theta)
        e[i] = h * max(1.0, abs(theta[i]))
        fd = (c.summary(theta + e) - c.summary(theta - e)) / (2 * e[i])
        scale = np.abs(packed).max() + np.abs(J[:, i]).max()
        assert np.abs(fd - J[:, i]).max() <= 1e-6 * scale, i


def test_both_ways_of_forming_the_jacobian_agree():
    # by columns (double backward; RBF) and by rows (batched products; the fallback for
    # kernels without a double backward, e.g. Matern's cdist): the same derivatives
    from botorch_fed.models.pitc_fit import _jacobian_by_columns, _jacobian_by_rows

    clients, support, k, lik, mean = _fit_setup(torch.float64, seed=5)
    c = PITCFitClient(*clients[0], support, k, lik, mean)
    c.set_theta(PITCHyperparameters(k, lik, mean).get_theta() + 0.05)
    packed = c._summary().pack()
    params = list(c._hyper.parameters.values())
    by_columns = _jacobian_by_columns(packed, params)
    by_rows = _jacobian_by_rows(packed, params, chunk=7)  # several chunks, a partial last
    scale = by_rows.abs().max().item()
    assert torch.allclose(by_columns, by_rows, rtol=0, atol=1e-12 * scale * packed.numel())
