r"""The dPITC / PIC factor caches survive BoTorch's per-call ``acqf.to(X)`` (a no-op
conversion), and are rebuilt by real conversions and changes.

Predictions from the cached factors (``FederatedPITCGP._predict`` /
``FederatedPICGP._predict``) are checked next to the factor formulas recomputed without
caches (``detach_test_caches(False)``), on the same inputs and tolerance: accuracy on
an ill-conditioned support (against a 40-digit reference), exact joint marginals for
``q > 1`` with a Matern-1/2 kernel, and a PIC model with a batched kernel.
"""

from __future__ import annotations

import math

import mpmath
import pytest
import torch
from botorch.acquisition import UpperConfidenceBound
from gpytorch import settings as gpytorch_settings
from gpytorch.constraints import GreaterThan
from gpytorch.kernels import MaternKernel, RBFKernel, ScaleKernel
from gpytorch.likelihoods import GaussianLikelihood

from botorch_fed.models import (
    FederatedPICGP,
    FederatedPITCGP,
    HyperparametersChangedError,
    SparseSummary,
    compute_local_summary,
)
from tests.helpers.dense_pitc import make_modules, random_federation
from tests.helpers.tolerances import assert_close, assert_within, eps, reordering_factor

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


def _solve_factor(model) -> float:
    r"""``reordering_factor(n, cond)`` of the model's prediction from its factors: two
    evaluations of the same formulas in other shapes or from recomputed factors round
    their sums in other orders; triangular solves chained through ``L_S = chol(K_SS)``,
    ``L_B = chol(I + A~)`` (and PIC's ``L_Lam``) amplify by the product of their
    condition numbers; ``n`` the support (plus block) size."""
    with torch.no_grad():
        factors = model._factors()
        L_S, L_B = factors[1], factors[2]
        n, cond = L_S.shape[-1], torch.linalg.cond(L_S) * torch.linalg.cond(L_B)
        if isinstance(model, FederatedPICGP):
            L_Lam = factors[6]
            n, cond = n + L_Lam.shape[-1], cond * torch.linalg.cond(L_Lam)
    return reordering_factor(n, float(cond.max()))


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
    after = model.posterior(X).mean
    # float64 maths on the float32-rounded hyperparameters: each raw value moved by
    # <= eps32 / 2 of itself, the mean by the first-order sum of those moves (slack 2),
    # plus both float64 evaluations' reordering (_solve_factor)
    params = list(model.parameters())
    with gpytorch_settings.detach_test_caches(False):
        m = model.posterior(X).mean.squeeze(-1)
        grads = [
            torch.autograd.grad(m[i], params, retain_graph=True, allow_unused=True)
            for i in range(len(m))
        ]  # (the noise enters through the float64 summary only: no gradient)
    moved = torch.stack(
        [sum((g.abs() * p.detach().abs()).sum()
             for g, p in zip(gi, params, strict=True) if g is not None)
         for gi in grads]
    )  # fmt: skip
    f64 = _solve_factor(model) * eps(torch.float64)
    bound = eps(torch.float32) * moved + f64 * before.detach().abs().squeeze(-1).clamp_min(1)
    assert_within(after.squeeze(-1), before.squeeze(-1), bound)
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


# --- predictions from the cached factors and from the formulas recomputed --------------
def _predict(model, X, live: bool):
    r"""Latent float64 mean and covariance at (transformed) ``X``: from the cached
    factors, or from the factor formulas recomputed (``live``)."""
    with torch.no_grad(), gpytorch_settings.detach_test_caches(not live):
        return model._predict(X)


# --- covariance accuracy on an ill-conditioned support -----------------------------------
def _ill_conditioned(kind: str):
    r"""1-d RBF, 20 equispaced support points at lengthscale 0.5 (cond(L) ~ 4e4 after the
    1e-8 relative jitter), noise 1e-8; q = 6 test points, 3 of them data points."""
    g = torch.Generator().manual_seed(0)
    k = ScaleKernel(RBFKernel()).double()
    k.base_kernel.lengthscale = 0.5
    k.outputscale = 1.0
    lik = GaussianLikelihood(noise_constraint=GreaterThan(1e-12)).double()
    lik.noise = 1e-8
    S = torch.linspace(0, 1, 20, dtype=torch.float64).unsqueeze(-1)
    clients = []
    for _ in range(3):
        X = torch.rand(10, 1, generator=g, dtype=torch.float64)
        clients.append((X, torch.sin(6 * X)))
    model = FederatedPITCGP.from_client_data(clients, S, k, lik)
    if kind == "pic":
        model = FederatedPICGP.from_pitc(model, *clients[0])
    X = torch.cat([clients[0][0][:3], torch.rand(3, 1, generator=g, dtype=torch.float64)])
    return model, X


def _mp(t: torch.Tensor) -> mpmath.matrix:
    return mpmath.matrix(t.tolist())


def _forward(L: mpmath.matrix, B: mpmath.matrix) -> mpmath.matrix:
    r"""``L^-1 B`` by forward substitution in mpmath."""
    out = mpmath.matrix(L.rows, B.cols)
    for c in range(B.cols):
        for i in range(L.rows):
            s = B[i, c]
            for j in range(i):
                s -= L[i, j] * out[j, c]
            out[i, c] = s / L[i, i]
    return out


def _reference_covariance(model, X: torch.Tensor) -> torch.Tensor:
    r"""The posterior covariance of ``model``'s own float64 factors (L, L_B, and for PIC
    Phi_B, L_Lam, H, all taken as exact) with the exact RBF kernel, in 40 digits."""
    with mpmath.workdps(40), torch.no_grad():
        ell = mpmath.mpf(float(model.covar_module.base_kernel.lengthscale))
        scale = mpmath.mpf(float(model.covar_module.outputscale))

        def kern(A, B):
            return mpmath.matrix(
                [
                    [
                        scale * mpmath.exp(-((mpmath.mpf(a) - mpmath.mpf(b)) ** 2) / (2 * ell**2))
                        for b in B
                    ]
                    for a in A
                ]
            )

        S, L = model._support_factor()
        L_B, _ = model._summary_factor()
        xs = X[:, 0].tolist()
        W = _forward(_mp(L), kern(S[:, 0].tolist(), xs))
        C = _forward(_mp(L_B), W)
        cov = kern(xs, xs) - W.T * W + C.T * C
        if isinstance(model, FederatedPICGP):
            X_B, Phi, L_Lam, _, H = model._block_factor(S, L, L_B)
            R = kern(xs, X_B[:, 0].tolist()) - W.T * _mp(Phi)
            T = _forward(_mp(L_Lam), R.T)
            E = C - _mp(H) * T
            cov = kern(xs, xs) - W.T * W - T.T * T + E.T * E
        q = len(xs)
        return torch.tensor([[float(cov[i, j]) for j in range(q)] for i in range(q)])


def _check_covariance(kind: str, live: bool) -> None:
    model, X = _ill_conditioned(kind)
    _, cov = _predict(model, X, live)
    p = model.support.shape[-2] + (model.block_X.shape[-2] if kind == "pic" else 0)
    # 4 p eps (a dot product's rounding over the p support / block points), at the
    # prior's scale (outputscale 1): the squares are formed from L^-1 k, which the
    # triangular solves compute backward-stably
    assert_close(cov, _reference_covariance(model, X), dtype=torch.float64, factor=4 * p, scale=1.0)


@pytest.mark.parametrize("live", [False, True], ids=["cached", "recomputed"])
@pytest.mark.parametrize("kind", KINDS)
def test_covariance_is_accurate_on_an_ill_conditioned_support(kind, live):
    _check_covariance(kind, live=live)


# --- K(x, x) on gpytorch's x1_eq_x2 path: exact joint marginals -------------------------
def _matern12(kind: str):
    r"""Matern-1/2 kernel (distance through a square root), lengthscale 0.1 in d=6,
    noise 1e-6; q = 5 test points, 4 of them the own block's inputs."""
    g = torch.Generator().manual_seed(0)
    d = 6
    k = ScaleKernel(MaternKernel(nu=0.5, ard_num_dims=d)).double()
    k.base_kernel.lengthscale = 0.1
    lik = GaussianLikelihood(noise_constraint=GreaterThan(1e-9)).double()
    lik.noise = 1e-6
    clients = [
        (
            torch.rand(20, d, generator=g, dtype=torch.float64),
            torch.randn(20, 1, generator=g, dtype=torch.float64),
        )
        for _ in range(3)
    ]
    S = torch.rand(30, d, generator=g, dtype=torch.float64)
    model = FederatedPITCGP.from_client_data(clients, S, k, lik)
    if kind == "pic":
        model = FederatedPICGP.from_pitc(model, *clients[0])
    X = torch.cat([clients[0][0][:4], torch.rand(1, d, generator=g, dtype=torch.float64)])
    return model, X


def _check_joint_marginals(kind: str, live: bool) -> None:
    model, X = _matern12(kind)
    _, joint = _predict(model, X, live)  # q = 5 jointly
    _, single = _predict(model, X.unsqueeze(-2), live)  # 5 batches of q = 1
    # marginals of a joint posterior are the single-point posteriors: the same
    # formulas in other shapes, the variance formed by cancellation of terms of the
    # prior's scale (outputscale) down to ~noise: relative to the outputscale,
    # _solve_factor (the support and block sizes, the factors' conditioning)
    scale = float(model.covar_module.outputscale)
    assert_close(
        joint.diagonal(dim1=-2, dim2=-1),
        single.reshape(-1),
        dtype=torch.float64,
        factor=_solve_factor(model),
        scale=scale,
    )


@pytest.mark.parametrize("live", [False, True], ids=["cached", "recomputed"])
@pytest.mark.parametrize("kind", KINDS)
def test_joint_marginals_match_single_points(kind, live):
    _check_joint_marginals(kind, live=live)


# --- PIC with a batched kernel ------------------------------------------------------------
def _batched_kernel_pic():
    d = 3
    clients, support = random_federation(0, torch.float64, 3, d, 7, sizes=[6, 9, 4])
    _, lik, mean = make_modules(d, torch.float64, lengthscale=0.5)
    k = ScaleKernel(
        RBFKernel(ard_num_dims=d, batch_shape=torch.Size([2])), batch_shape=torch.Size([2])
    ).double()
    k.base_kernel.lengthscale = torch.tensor([[[0.5] * d], [[0.8] * d]], dtype=torch.float64)
    pitc = FederatedPITCGP.from_client_data(clients, support, k, lik, mean)
    return FederatedPICGP.from_pitc(pitc, *clients[1]), d


def test_pic_with_a_batched_kernel_predicts_from_the_factor_formulas():
    model, d = _batched_kernel_pic()
    X = torch.rand(4, 1, 3, d, dtype=torch.float64)
    with torch.no_grad(), gpytorch_settings.detach_test_caches(False):
        assert model.posterior(X).mean.shape == (4, 2, 3, 1)


def test_pic_with_a_batched_kernel_predicts_from_the_cached_factors():
    model, d = _batched_kernel_pic()
    X = torch.rand(4, 1, 3, d, dtype=torch.float64)
    with torch.no_grad():
        mean = model.posterior(X).mean
        with gpytorch_settings.detach_test_caches(False):
            live = model.posterior(X).mean
    # exact: the cached factors are the factor formulas run once on the model's tensors;
    # the live path runs the same ops on the same tensors again, then the same prediction
    assert torch.equal(mean, live)
