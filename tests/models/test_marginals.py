r"""Marginal predictors and the cached-factor UCB / log-EI: drop-in replacements for
BoTorch's ``UpperConfidenceBound`` / ``LogExpectedImprovement`` (the same values and
gradients to rounding, never a stale cache, BoTorch's own path where not covered).

Checked against an independent dense computation (the exact GP written out), against
BoTorch's own classes on the same model (values and gradients), and for staleness:
every change of the model after the predictor was built must reach the next value.
The staleness references are BoTorch's plain classes on the same model after
``model.train(); model.eval()`` (which clears gpytorch's prediction caches and
re-transforms the training inputs), so they see the model's state now.
"""

from __future__ import annotations

import copy
import pickle

import pytest
import torch
from botorch import settings as botorch_settings
from botorch.acquisition import LogExpectedImprovement, UpperConfidenceBound
from botorch.acquisition.objective import ScalarizedPosteriorTransform
from botorch.fit import fit_gpytorch_mll
from botorch.models import ModelListGP, SingleTaskGP
from botorch.models.transforms import Normalize, Standardize
from botorch.models.transforms.input import InputPerturbation
from botorch.optim import optimize_acqf
from gpytorch import settings as gpytorch_settings
from gpytorch.distributions import MultivariateNormal
from gpytorch.kernels import MaternKernel, ScaleKernel
from gpytorch.mlls import ExactMarginalLogLikelihood

from botorch_fed.acquisition import CachedLogExpectedImprovement, CachedUpperConfidenceBound
from botorch_fed.models import (
    ExactGPMarginals,
    FederatedPICGP,
    FederatedPITCGP,
    FederatedPITCMarginals,
    marginal_predictor,
)
from botorch_fed.models.float64 import prior_variance64
from tests.helpers.tolerances import (
    assert_close,
    assert_within,
    eps,
    reordering_factor,
    sqrt_error,
)
from tests.helpers.toy_models import (
    dense_gp_posterior,
    make_kernel,
    make_likelihood,
    make_pitc,
    make_stgp,
    toy_data,
    ucb_error_bound,
)

DTYPES = [torch.float32, torch.float64]
D = 3
BETA = 2.25  # exact in float32, the dtype BoTorch keeps beta in


def _X_test(dtype: torch.dtype, n: int = 6, requires_grad: bool = False) -> torch.Tensor:
    X = torch.rand(n, 1, D, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    return X.to(dtype).requires_grad_(requires_grad)


def _value_and_grad(acqf, X: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    X = X.detach().clone().requires_grad_(True)
    value = acqf(X)
    (grad,) = torch.autograd.grad(value.sum(), X)
    return value.detach(), grad


def _X(dtype: torch.dtype, shape: tuple[int, ...] = (6,), seed: int = 5) -> torch.Tensor:
    r"""Test points ``shape x 1 x D`` (for the default shape, those of ``_X_test``)."""
    g = torch.Generator().manual_seed(seed)
    return torch.rand(*shape, 1, D, generator=g, dtype=torch.float64).to(dtype)


def _fresh(model, cls=UpperConfidenceBound, **kw):
    r"""BoTorch's plain class on the model's state now (gpytorch caches cleared)."""
    model.train()
    model.eval()
    return cls(model, **kw)


def _solve_factor(model) -> float:
    r"""``reordering_factor(n, cond)`` of the solves behind ``model``'s posterior.

    The cached predictor and BoTorch compute the same moments from the same train
    covariance or factors, with sums in other orders (variances from sums of squares
    vs ``q x q`` products, other shapes). Exact GP: ``n`` training points and
    ``cond(K + sigma^2 I)`` (two triangular solves with its Cholesky factor). dPITC /
    PIC: triangular solves chained through ``L_S = chol(K_SS)``, ``L_B = chol(I + A~)``
    (and PIC's ``L_Lam``): ``n`` the support (plus block) size, ``cond`` the product of
    the factors' condition numbers.
    """
    with torch.no_grad():
        if isinstance(model, FederatedPITCGP):
            factors = model._factors()
            L_S, L_B = factors[1], factors[2]
            n, cond = L_S.shape[-1], torch.linalg.cond(L_S) * torch.linalg.cond(L_B)
            if isinstance(model, FederatedPICGP):
                L_Lam = factors[6]
                n, cond = n + L_Lam.shape[-1], cond * torch.linalg.cond(L_Lam)
            return reordering_factor(n, float(cond.max()))
        X = model.train_inputs[0]
        K = model.covar_module(X).to_dense().double()
        K = K + model.likelihood.noise.double() * torch.eye(X.shape[-2], dtype=torch.float64)
        return reordering_factor(X.shape[-2], float(torch.linalg.cond(K).max()))


def _moment_errors(model, X):
    r"""``(m, v, dm, dv)`` at ``X`` (``batch x 1 x d``): the posterior moments (in the
    model's output space) and bounds on how far two evaluations of them in other
    orders may differ: :func:`_solve_factor` ``eps`` relative to the scale the mean is
    formed at (``std max(|m~|, 1) + |shift|`` with a ``Standardize`` transform's shift
    and std, ``m~`` the latent mean) and to the prior variance ``k(x, x) std^2`` (the
    variance is formed from it by cancellation)."""
    f, e = _solve_factor(model), eps(X.dtype)
    with torch.no_grad():
        post = model.posterior(X)
        m = post.mean.reshape(X.shape[:-2]).double()
        v = post.variance.reshape(X.shape[:-2]).double().clamp_min(0)
        if isinstance(model, FederatedPITCGP):
            prior = prior_variance64(model.covar_module, model._support_factor()[0][:1])
        else:
            x0 = model.train_inputs[0][..., :1, :]
            prior = model.covar_module(x0, x0, diag=True)
    shift, std = 0.0, 1.0
    transform = getattr(model, "outcome_transform", None)
    if transform is not None:
        shift, std = float(transform.means), float(transform.stdvs)
    scale_m = std * max(float(((m - shift) / std).abs().max()), 1.0) + abs(shift)
    return m, v, f * e * scale_m, f * e * float(prior.max()) * std**2


def _value_bound(plain, X) -> torch.Tensor:
    r"""Per-point bound on ``|cached - plain|`` of the UCB or log EI ``plain`` (BoTorch's
    acquisition, its parameters) at ``X``: the moments' errors of
    :func:`_moment_errors` carried through the acquisition to first order, sigma's by
    ``sqrt_error`` (``1 / (2 sigma)``), plus its own evaluation. UCB ``m + sqrt(beta)
    sigma`` (2 roundings); ``log EI = log sigma + log h(u)``, ``u = +-(m - best_f) /
    sigma``, ``h = phi(u) + u Phi(u)``, moves by ``(Phi dm + phi dsigma) / (sigma h)``,
    and rounds ``h`` by a few eps relative to ``phi + |u| Phi`` (cancellation for
    ``u < 0``) and adds ``log sigma`` (as ``tests/acquisition``' log-EI bound)."""
    e = eps(X.dtype)
    m, v, dm, dv = _moment_errors(plain.model, X)
    sigma = v.sqrt()
    ds = sqrt_error(v, dv) + e * sigma
    if isinstance(plain, UpperConfidenceBound):
        b = float(plain.beta) ** 0.5
        return dm + b * ds + 2 * e * (m.abs() + b * sigma)
    u = (m - float(plain.best_f)) / sigma
    u = u if plain.maximize else -u
    normal = torch.distributions.Normal(torch.tensor(0.0, dtype=torch.float64), 1.0)
    Phi, phi = normal.cdf(u), normal.log_prob(u).exp()
    h = phi + u * Phi
    own = 4 * e * ((phi + u.abs() * Phi) / h + sigma.log().abs())
    return (Phi * dm + phi * ds) / (sigma * h) + own


def _compare(cached, plain, X, dtype):
    va, ga = _value_and_grad(cached, X)
    vb, gb = _value_and_grad(plain, X)
    bound = _value_bound(plain, X)
    assert_within(va, vb, bound)
    # the gradients: the same solves and the same 1 / sigma and log-EI factors, so their
    # rounding is amplified as the values' (the largest amplification of the value
    # bound over the solve factor, relative to the value), relative to their magnitude
    f = _solve_factor(plain.model)
    amp = (bound / (f * eps(dtype) * vb.double().abs().clamp_min(1))).max().clamp_min(1)
    scale = gb.abs().max().clamp_min(1)
    assert_close(ga, gb, dtype=dtype, factor=f * float(amp), scale=scale)


def _pitc_models(dtype: torch.dtype, standardize: bool = False) -> dict:
    clients = [toy_data(seed, 12, D, dtype) for seed in range(3)]
    support = toy_data(9, 8, D, dtype)[0]
    with torch.no_grad():
        if standardize:  # raw outcomes, the transform trained on them
            clients = [(X, 3 * Y + 1) for X, Y in clients]
            pitc = FederatedPITCGP.from_client_data(
                clients, support, make_kernel(D, dtype), make_likelihood(dtype),
                outcome_transform=Standardize(m=1),
            )  # fmt: skip
            X_own, Y_own = clients[0]
            pic = FederatedPICGP.from_pitc(pitc, X_own, pitc.outcome_transform(Y_own)[0])
        else:
            pitc = make_pitc(clients, support)
            pic = FederatedPICGP.from_pitc(pitc, *clients[0])
    return {"pitc": pitc, "pic": pic}


# --- against an independent computation and BoTorch's own classes ------------------------
@pytest.mark.parametrize("dtype", DTYPES)
def test_exact_gp_marginals_match_the_dense_posterior(dtype):
    X, Y = toy_data(0, 15, D, dtype)
    model = make_stgp(X, Y)
    X_test = _X_test(dtype)
    predictor = marginal_predictor(model)
    assert isinstance(predictor, ExactGPMarginals)
    with torch.no_grad():
        mean, variance = predictor(X_test)
    assert mean.shape == variance.shape == (6, 1) and mean.dtype == dtype
    ref_mean, ref_cov = dense_gp_posterior(X, Y, X_test.squeeze(-2))
    # the UCB's first-order rounding bound of the posterior in ``dtype`` (toy_models)
    bound = ucb_error_bound(X, Y, X_test.squeeze(-2), BETA, dtype)
    assert_within(mean.squeeze(-1), ref_mean, bound)
    ucb = mean.squeeze(-1) + BETA**0.5 * variance.squeeze(-1).sqrt()
    assert_within(ucb, ref_mean + BETA**0.5 * ref_cov.diagonal().sqrt(), bound)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("transforms", ["none", "standardize", "normalize+standardize"])
def test_exact_gp_cached_acquisitions_equal_botorchs(dtype, transforms):
    X, Y = toy_data(1, 20, D, dtype)
    kwargs = {"outcome_transform": None}
    if "standardize" in transforms:
        kwargs["outcome_transform"] = Standardize(m=1)
    if "normalize" in transforms:
        kwargs["input_transform"] = Normalize(d=D)
    model = SingleTaskGP(X, 3 * Y + 1, **kwargs).eval()
    X_test = _X_test(dtype)
    for cached, plain, kw in [
        # beta = 2.1 is not a float32 number: BoTorch moves it to X's dtype first
        (CachedUpperConfidenceBound, UpperConfidenceBound, {"beta": 2.1}),
        (CachedLogExpectedImprovement, LogExpectedImprovement, {"best_f": 3 * Y.max() + 1}),
    ]:
        for maximize in (True, False):
            a = cached(model, maximize=maximize, **kw)
            b = plain(model, maximize=maximize, **kw)
            # the same quantities formed in a different order (see _compare)
            _compare(a, b, X_test, dtype)
            assert isinstance(a._predictor, ExactGPMarginals)  # the cached path ran


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", ["pitc", "pic"])
def test_federated_marginals_equal_the_posterior(dtype, kind):
    model = _pitc_models(dtype, standardize=True)[kind]
    assert isinstance(model.outcome_transform, Standardize)
    X_test = _X_test(dtype)
    predictor = marginal_predictor(model)
    assert isinstance(predictor, FederatedPITCMarginals)
    with torch.no_grad():
        mean, variance = predictor(X_test)
        posterior = model.posterior(X_test)
    assert mean.dtype == variance.dtype == dtype
    # the model's own formulas on the same factors; the diagonal path forms the
    # variance as k(x, x) - |W|^2 + |C|^2 instead of the q x q matrix products, the
    # mean with other shapes (_moment_errors), then both round to dtype
    _, _, dm, dv = _moment_errors(model, X_test)
    e = eps(dtype)
    m_ref, v_ref = posterior.mean.squeeze(-1), posterior.variance.squeeze(-1)
    assert_within(mean, m_ref, dm + e * m_ref.double().abs())
    assert_within(variance, v_ref, dv + e * v_ref.double().abs())
    a, b = CachedUpperConfidenceBound(model, beta=BETA), UpperConfidenceBound(model, beta=BETA)
    _compare(a, b, X_test, dtype)
    assert isinstance(a._predictor, FederatedPITCMarginals)


def test_optimize_acqf_finds_the_same_point():
    X, Y = toy_data(3, 25, D, torch.float64)
    model = make_stgp(X, Y, standardize=True)
    bounds = torch.stack([torch.zeros(D), torch.ones(D)]).double()
    found = []
    for cls in (CachedUpperConfidenceBound, UpperConfidenceBound):
        torch.manual_seed(0)
        x, _ = optimize_acqf(cls(model, beta=BETA), bounds, q=1, num_restarts=4, raw_samples=64)
        found.append(x)
    # first order: an interior maximiser moves by |H^-1| sqrt(D) dg, dg _compare's gradient bound
    plain = UpperConfidenceBound(model, beta=BETA)
    x = found[1].reshape(1, 1, D)
    assert ((x > 0) & (x < 1)).all()  # interior: no bound holds a coordinate
    value, grad = _value_and_grad(plain, x)
    f, e = _solve_factor(model), eps(torch.float64)
    amp = (_value_bound(plain, x) / (f * e * value.double().abs().clamp_min(1))).max().clamp_min(1)
    dg = f * float(amp) * e * float(grad.abs().max().clamp_min(1))
    H = torch.autograd.functional.hessian(lambda z: plain(z.reshape(1, 1, D)).sum(), x.flatten())
    H_inv = float(torch.linalg.matrix_norm(torch.linalg.inv(H), ord=2))
    assert_within(found[0], found[1], H_inv * D**0.5 * dg)


@pytest.mark.parametrize(
    ("dtype", "scale"),
    [
        (torch.float32, 1e-3),
        (torch.float64, 1e-6),
        (torch.float32, 1.0),
        (torch.float64, 1.0),
    ],
)
def test_standardize_small_outcomes_match_botorch(dtype, scale):
    X, Y = toy_data(1, 20, D, dtype)
    model = SingleTaskGP(X, scale * Y, outcome_transform=Standardize(m=1)).eval()
    X_test = _X(dtype)
    with torch.no_grad():
        value = CachedUpperConfidenceBound(model, beta=BETA)(X_test)
        plain = _fresh(model, beta=BETA)
        expected = plain(X_test)
    assert_within(value, expected, _value_bound(plain, X_test))


def test_federated_standardize_small_outcomes_match_botorch():
    dtype = torch.float32
    clients = [(X, 1e-3 * Y) for X, Y in (toy_data(s, 12, D, dtype) for s in range(3))]
    support = toy_data(9, 8, D, dtype)[0]
    with torch.no_grad():
        model = FederatedPITCGP.from_client_data(
            clients, support, make_kernel(D, dtype), make_likelihood(dtype),
            outcome_transform=Standardize(m=1),
        )  # fmt: skip
        X_test = _X(dtype)
        value = CachedUpperConfidenceBound(model, beta=BETA)(X_test)
        plain = UpperConfidenceBound(model, beta=BETA)
        expected = plain(X_test)
    assert_within(value, expected, _value_bound(plain, X_test))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("maximize", [True, False])
def test_batched_X_with_transforms_match_botorch(dtype, maximize):
    X, Y = toy_data(2, 20, D, dtype)
    X = 4 * X - 1  # Normalize does something
    model = SingleTaskGP(
        X, 3 * Y + 1, outcome_transform=Standardize(m=1), input_transform=Normalize(d=D)
    ).eval()
    X_test = 4 * _X(dtype, shape=(2, 3)) - 1
    for cached, plain, kw in [
        (CachedUpperConfidenceBound, UpperConfidenceBound, {"beta": 2.1}),
        (CachedLogExpectedImprovement, LogExpectedImprovement, {"best_f": 3 * Y.max() + 1}),
    ]:
        a = cached(model, maximize=maximize, **kw)
        b = plain(model, maximize=maximize, **kw)
        _compare(a, b, X_test, dtype)
        assert a._predictor is not None
        assert a(X_test).shape == (2, 3)


@pytest.mark.parametrize("dtype", DTYPES)
def test_fitted_model_matches_botorch(dtype):
    X, Y = toy_data(3, 20, D, dtype)
    model = SingleTaskGP(X, Y)
    fit_gpytorch_mll(ExactMarginalLogLikelihood(model.likelihood, model))
    model.eval()
    a = CachedLogExpectedImprovement(model, best_f=Y.max())
    b = LogExpectedImprovement(model, best_f=Y.max())
    _compare(a, b, _X(dtype), dtype)
    assert a._predictor is not None


def test_standardize_trained_in_float32_then_double():
    X, Y = toy_data(0, 15, D, torch.float32)
    model = make_stgp(X, Y, standardize=True).double()
    X_test = _X(torch.float64)
    with torch.no_grad():
        value = CachedUpperConfidenceBound(model, beta=BETA)(X_test)
        plain = _fresh(model, beta=BETA)
        expected = plain(X_test)
    assert_within(value, expected, _value_bound(plain, X_test))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", ["pitc", "pic"])
def test_federated_with_input_and_outcome_transforms(dtype, kind):
    clients = [toy_data(seed, 12, D, dtype) for seed in range(3)]
    clients = [(4 * X - 1, 3 * Y + 1) for X, Y in clients]
    support = 4 * toy_data(9, 8, D, dtype)[0] - 1
    bounds = torch.tensor([[-1.0] * D, [3.0] * D], dtype=dtype)
    with torch.no_grad():
        model = FederatedPITCGP.from_client_data(
            clients, support, make_kernel(D, dtype), make_likelihood(dtype),
            outcome_transform=Standardize(m=1), input_transform=Normalize(d=D, bounds=bounds),
        )  # fmt: skip
        if kind == "pic":
            X_own, Y_own = clients[0]
            model = FederatedPICGP.from_pitc(model, X_own, model.outcome_transform(Y_own)[0])
    assert marginal_predictor(model) is not None
    X_test = 4 * _X(dtype, shape=(2, 3)) - 1
    for maximize in (True, False):
        a = CachedLogExpectedImprovement(model, best_f=4.0, maximize=maximize)
        b = LogExpectedImprovement(model, best_f=4.0, maximize=maximize)
        _compare(a, b, X_test, dtype)


# --- staleness: every change of the model reaches the next value ------------------------
def _changes():
    def lengthscale(model):
        model.covar_module.base_kernel.lengthscale = 0.5

    def in_place(model):
        with torch.no_grad():
            model.likelihood.noise_covar.raw_noise.add_(1.0)

    def train_data(model):
        X, Y = toy_data(7, 9, D, torch.float64)
        model.set_train_data(X, Y.squeeze(-1), strict=False)

    def load(model):
        other = make_stgp(*toy_data(0, 15, D, torch.float64), lengthscale=0.2)
        model.load_state_dict(other.state_dict())

    def mean(model):
        with torch.no_grad():
            model.mean_module.constant.fill_(-2.0)

    return {"lengthscale": lengthscale, "in_place": in_place, "train_data": train_data,
            "load_state_dict": load, "mean": mean}  # fmt: skip


@pytest.mark.parametrize("change", list(_changes()))
def test_a_changed_exact_gp_rebuilds_the_predictor(change):
    X, Y = toy_data(0, 15, D, torch.float64)
    model = make_stgp(X, Y)
    cached = CachedUpperConfidenceBound(model, beta=BETA)
    X_test = _X_test(torch.float64)
    with torch.no_grad():
        before = cached(X_test)
        _changes()[change](model)
        after = cached(X_test)
        model.train()  # gpytorch's own prediction caches are cleared in train mode
        model.eval()
        plain = UpperConfidenceBound(model, beta=BETA)
        fresh = plain(X_test)
    assert (after - before).abs().max() > 1e-3  # the change matters
    assert_within(after, fresh, _value_bound(plain, X_test))


@pytest.mark.parametrize("kind", ["pitc", "pic"])
def test_a_changed_federated_model_is_refused_or_rebuilt(kind):
    model = _pitc_models(torch.float64)[kind]
    cached = CachedUpperConfidenceBound(model, beta=BETA)
    X_test = _X_test(torch.float64)
    with torch.no_grad():
        cached(X_test)
        model.covar_module.base_kernel.lengthscale = 0.5  # the summary is now stale
    # as model.posterior does: the predictor is rebuilt and its check refuses
    with pytest.raises(Exception, match="hyperparameters"), torch.no_grad():
        cached(X_test)
    with pytest.raises(Exception, match="hyperparameters"), torch.no_grad():
        model.posterior(X_test)


def test_matern_nu_change_reaches_the_exact_gp_acquisition():
    X, Y = toy_data(0, 15, D, torch.float64)
    kernel = ScaleKernel(MaternKernel(nu=2.5, ard_num_dims=D)).double()
    model = SingleTaskGP(X, Y, covar_module=kernel, outcome_transform=None).eval()
    cached = CachedUpperConfidenceBound(model, beta=BETA)
    X_test = _X(torch.float64)
    with torch.no_grad():
        before = cached(X_test)
        model.covar_module.base_kernel.nu = 0.5
        after = cached(X_test)
        plain = _fresh(model, beta=BETA)
        fresh = plain(X_test)
    assert (fresh - before).abs().max() > 1e-2  # the change matters
    assert_within(after, fresh, _value_bound(plain, X_test))


def test_reassigned_model_is_used():
    X, Y = toy_data(0, 15, D, torch.float64)
    first = make_stgp(X, Y)
    second = make_stgp(X, -3 * Y, lengthscale=0.2)
    cached = CachedUpperConfidenceBound(first, beta=BETA)
    X_test = _X(torch.float64)
    with torch.no_grad():
        cached(X_test)
        cached.model = second
        value = cached(X_test)
        plain = _fresh(second, beta=BETA)
        expected = plain(X_test)
    assert_within(value, expected, _value_bound(plain, X_test))


def test_model_changes_reach_the_acquisition():
    X, Y = toy_data(0, 15, D, torch.float64)
    model = make_stgp(X, Y, standardize=True)
    cached = CachedUpperConfidenceBound(model, beta=BETA)
    X_test = _X(torch.float64)

    def swap_transform(m):
        m.outcome_transform = Standardize(m=1).double()
        m.outcome_transform(3 * Y + 2)  # trained on other outcomes
        m.outcome_transform.eval()

    def noise_setter(m):
        m.likelihood.noise = 0.05

    for change in (swap_transform, noise_setter):
        with torch.no_grad():
            before = cached(X_test)
            change(model)
            after = cached(X_test)
            plain = _fresh(model, beta=BETA)
            fresh = plain(X_test)
        assert (fresh - before).abs().max() > 1e-4, change.__name__
        assert_within(after, fresh, _value_bound(plain, X_test), msg=change.__name__)


def test_dtype_round_trip_reaches_the_acquisition():
    X, Y = toy_data(0, 15, D, torch.float64)
    model = make_stgp(X + 1e-3 * torch.pi, Y)  # inputs not float32 numbers
    cached = CachedUpperConfidenceBound(model, beta=BETA)
    X_test = _X(torch.float64)
    with torch.no_grad():
        before = cached(X_test)
        model.to(torch.float32)
        model.to(torch.float64)  # the same tensors, rounded
        after = cached(X_test)
        plain = _fresh(model, beta=BETA)
        fresh = plain(X_test)
    assert (fresh - before).abs().max() > 1e-8
    assert_within(after, fresh, _value_bound(plain, X_test))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_setter_reaches_the_acquisition():
    X, Y = toy_data(0, 15, D, torch.float64)
    model = make_stgp(X, Y).to("cuda")
    cached = CachedUpperConfidenceBound(model, beta=BETA)
    X_test = _X(torch.float64).cuda()
    with torch.no_grad():
        before = cached(X_test)
        model.covar_module.base_kernel.lengthscale = 0.5
        after = cached(X_test)
        plain = _fresh(model, beta=BETA)
        fresh = plain(X_test)
    assert (fresh - before).abs().max() > 1e-3
    assert_within(after.cpu(), fresh.cpu(), _value_bound(plain, X_test).cpu())


def test_setter_reaches_the_predictor_on_any_device():
    # the recorded values are compared on every device (a device other than the CPU can
    # only be emulated here: the copies of the values exist whatever the device)
    X, Y = toy_data(0, 15, D, torch.float64)
    model = make_stgp(X, Y)
    predictor = marginal_predictor(model)
    assert len(predictor._values) == len(predictor._tensors)
    model.covar_module.base_kernel.lengthscale = 0.5
    assert not predictor.is_current()


def test_deepcopy_and_pickle_of_the_acquisition():
    X, Y = toy_data(0, 15, D, torch.float64)
    model = make_stgp(X, Y, standardize=True)
    acqf = CachedUpperConfidenceBound(model, beta=BETA)
    X_test = _X(torch.float64)
    with torch.no_grad():
        ref = acqf(X_test)
        for other in (copy.deepcopy(acqf), pickle.loads(pickle.dumps(acqf))):
            # exact: the copy holds the same tensors and runs the same ops on them
            assert torch.equal(other(X_test), ref)
            other.model.covar_module.base_kernel.lengthscale = 0.5
            plain = _fresh(other.model, beta=BETA)
            expected = plain(X_test)
            assert_within(other(X_test), expected, _value_bound(plain, X_test))
        assert torch.equal(acqf(X_test), ref)  # untouched: the same ops on the same tensors


# --- where the cached path does not apply ------------------------------------------------
def test_fallbacks_take_botorchs_path():
    X, Y = toy_data(0, 15, D, torch.float64)
    model = make_stgp(X, Y)
    X_test = _X_test(torch.float64)
    # unsupported models and settings: no predictor
    assert marginal_predictor(ModelListGP(model)) is None
    noisy = SingleTaskGP(X, Y, train_Yvar=torch.full_like(Y, 1e-3))
    assert marginal_predictor(noisy) is None  # a fixed-noise likelihood
    with botorch_settings.propagate_grads(True):
        assert marginal_predictor(model) is None
    with gpytorch_settings.detach_test_caches(False):
        assert marginal_predictor(model) is None
    # a posterior transform: BoTorch's path, the same values
    transform = ScalarizedPosteriorTransform(weights=torch.tensor([-2.0], dtype=torch.float64))
    a = CachedUpperConfidenceBound(model, beta=BETA, posterior_transform=transform)
    b = UpperConfidenceBound(model, beta=BETA, posterior_transform=transform)
    with torch.no_grad():
        assert torch.equal(a(X_test), b(X_test))
    assert a._predictor is None
    # inputs of another dtype than the model's go to BoTorch's path (which first moves
    # the model to them), as q > 1 inputs would
    c = CachedUpperConfidenceBound(model, beta=BETA)
    with torch.no_grad():
        c(X_test)
    assert c._predictor.accepts(X_test)
    assert not c._predictor.accepts(X_test.float())
    assert not c._predictor.accepts(X_test.expand(-1, 2, -1))


def test_a_federated_kernel_setting_change_reaches_the_acquisition():
    # a setting that is no tensor (Matern nu) after the predictor was built: refused
    # as model.posterior refuses it, not answered from the old factors
    from gpytorch.kernels import MaternKernel, ScaleKernel

    clients = [toy_data(seed, 12, D, torch.float64) for seed in range(3)]
    support = toy_data(9, 8, D, torch.float64)[0]
    kernel = ScaleKernel(MaternKernel(nu=2.5, ard_num_dims=D)).double()
    with torch.no_grad():
        model = FederatedPITCGP.from_client_data(
            clients, support, kernel, make_likelihood(torch.float64)
        )
        cached = CachedUpperConfidenceBound(model, beta=BETA)
        cached(_X_test(torch.float64))
        kernel.base_kernel.nu = 0.5
        with pytest.raises(Exception, match="structure"):
            cached(_X_test(torch.float64))


def test_singletaskgp_subclass_with_own_forward_falls_back():
    class ShiftedGP(SingleTaskGP):
        def forward(self, x):
            mvn = super().forward(x)
            return MultivariateNormal(mvn.mean + 5.0 * x[..., 0], mvn.lazy_covariance_matrix)

    X, Y = toy_data(0, 15, D, torch.float64)
    model = ShiftedGP(
        X, Y, covar_module=make_kernel(D, torch.float64), likelihood=make_likelihood(torch.float64),
        outcome_transform=None,
    ).eval()  # fmt: skip
    X_test = _X(torch.float64)
    with torch.no_grad():
        value = CachedUpperConfidenceBound(model, beta=BETA)(X_test)
        plain = _fresh(model, beta=BETA)
        expected = plain(X_test)
    assert_within(value, expected, _value_bound(plain, X_test))


@pytest.mark.parametrize(
    "setting",
    [
        pytest.param(lambda: gpytorch_settings.prior_mode(True), id="prior_mode"),
        pytest.param(lambda: gpytorch_settings.skip_posterior_variances(True), id="skip_variances"),
    ],
)
def test_gpytorch_posterior_settings_fall_back(setting):
    X, Y = toy_data(0, 15, D, torch.float64)
    model = make_stgp(X, Y)
    X_test = _X(torch.float64)
    with setting(), torch.no_grad():
        value = CachedUpperConfidenceBound(model, beta=BETA)(X_test)
        plain = _fresh(model, beta=BETA)
        expected = plain(X_test)
        bound = _value_bound(plain, X_test)
    assert_within(value, expected, bound)


def test_fallback_models_equal_botorch():
    X, Y = toy_data(0, 15, D, torch.float64)
    X_test = _X(torch.float64)
    fixed = SingleTaskGP(X, Y, train_Yvar=torch.full_like(Y, 1e-3)).eval()
    batched = SingleTaskGP(X.expand(2, -1, -1), torch.stack([Y, -Y])).eval()
    listgp = ModelListGP(make_stgp(X, Y))
    for model, Xm in ((fixed, X_test), (batched, X_test.unsqueeze(1)), (listgp, X_test)):
        a = CachedUpperConfidenceBound(model, beta=BETA)
        b = UpperConfidenceBound(model, beta=BETA)
        with torch.no_grad():
            assert torch.equal(a(Xm), b(Xm))
        assert a._predictor is None


def test_input_perturbation_behaves_as_botorch():
    # BoTorch's analytic classes refuse the n_p perturbed outputs per point; so must
    # the cached ones (the same error, not a silently different shape)
    X, Y = toy_data(0, 15, D, torch.float64)
    perturb = InputPerturbation(0.01 * torch.randn(4, D, dtype=torch.float64))
    model = SingleTaskGP(X, Y, input_transform=perturb, outcome_transform=None).eval()
    errors = []
    for cls in (CachedUpperConfidenceBound, UpperConfidenceBound):
        with pytest.raises(AssertionError) as info, torch.no_grad():
            cls(model, beta=BETA)(_X(torch.float64))
        errors.append(str(info.value))
    assert errors[0] == errors[1]


def test_float32_inputs_on_a_float64_model_take_botorchs_path():
    X, Y = toy_data(0, 15, D, torch.float64)
    model = make_stgp(X, Y)
    a = CachedUpperConfidenceBound(model, beta=BETA)
    with torch.no_grad():
        a(_X(torch.float64))
        value = a(_X(torch.float32))
    model_b = make_stgp(X, Y)
    with torch.no_grad():
        expected = UpperConfidenceBound(model_b, beta=BETA)(_X(torch.float32))
    assert value.dtype == expected.dtype == torch.float32
    assert torch.equal(value, expected)
