r"""The federated hyperparameter fit: its stepped L-BFGS-B, its loss at forged sums, and
the in-process fits and standardisation."""

from __future__ import annotations

import warnings
from copy import deepcopy

import numpy as np
import pytest
import torch
from botorch.exceptions.warnings import InputDataWarning
from botorch.fit import fit_gpytorch_mll
from botorch.models import SingleTaskGP
from botorch.models.transforms.input import Normalize
from botorch.models.utils.gpytorch_modules import (
    get_covar_module_with_dim_scaled_prior,
    get_gaussian_likelihood_with_lognormal_prior,
)
from gpytorch.kernels import RBFKernel
from gpytorch.means import ConstantMean, ZeroMean
from gpytorch.mlls import ExactMarginalLogLikelihood
from scipy.optimize import minimize

from botorch_fed.inducing import global_support, local_centers
from botorch_fed.models import (
    FederatedPITCGP,
    HyperparametersChangedError,
    PITCFitClient,
    PITCHyperparameters,
    PITCMarginalLogLikelihood,
    SparseSummary,
    center_from_moments,
    centred_moments,
    compute_local_summary,
    outcome_moments,
    pitc_loss_and_adjoint,
    standardize_from_moments,
)
from botorch_fed.protocol.federated_fit import (
    ADJOINT_LIMIT,
    FAILED_LOSS,
    SteppedMinimizer,
    SummaryTrustRegion,
    fit_federated_pitc,
    fit_local_average,
    fit_loss,
    plain_sum,
    standardize_outcomes,
)
from botorch_fed.secure import make_aggregator
from tests.helpers.dense_pitc import make_modules, overlapping_federation, random_federation


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", InputDataWarning)
        yield


def _fit_setup(dtype=torch.float64, seed=0):
    d = 2
    clients, support = random_federation(seed, dtype, num_clients=4, d=d, m=9, sizes=[7, 3, 12, 5])
    k = get_covar_module_with_dim_scaled_prior(d).to(dtype)
    lik = get_gaussian_likelihood_with_lognormal_prior().to(dtype)
    return clients, support, k, lik, ConstantMean().to(dtype)


# --- SteppedMinimizer ---------------------------------------------------------------------
def _quadratic(x: np.ndarray) -> tuple[float, np.ndarray]:
    target = np.array([1.0, -2.0, 0.5])
    return float(((x - target) ** 2).sum()), 2 * (x - target)


def test_stepped_minimizer_equals_scipy_calling_the_objective_itself():
    x0, bounds = np.zeros(3), np.array([[-5.0, 5.0], [-1.0, 5.0], [-5.0, 5.0]])
    ref = minimize(_quadratic, x0, jac=True, method="L-BFGS-B", bounds=bounds)
    m = SteppedMinimizer(x0, bounds, maxiter=100)
    x = m.start()
    while x is not None:
        x = m.feed(*_quadratic(x))
    np.testing.assert_array_equal(m.result.x, ref.x)  # -1 bound active on x[1]
    assert m.num_evaluations == ref.nfev


def test_non_finite_feed_aborts_the_worker():
    m = SteppedMinimizer(np.zeros(3), None, maxiter=10)
    m.start()
    worker = m._thread
    with pytest.raises(ValueError, match="not finite"):
        m.feed(float("nan"), np.zeros(3))
    assert not worker.is_alive()
    with pytest.raises(RuntimeError, match="no minimisation is running"):
        m.feed(1.0, np.zeros(3))


def test_close_ends_an_abandoned_minimisation():
    m = SteppedMinimizer(np.zeros(3), None, maxiter=10)
    m.start()
    worker = m._thread
    m.close()
    assert not worker.is_alive()
    m.close()  # idempotent
    assert m.start() is not None  # can run again
    m.close()


def _rosenbrock(x: np.ndarray) -> tuple[float, np.ndarray]:
    a, b = x
    value = (1 - a) ** 2 + 100 * (b - a * a) ** 2
    grad = np.array([-2 * (1 - a) - 400 * a * (b - a * a), 200 * (b - a * a)])
    return float(value), grad


@pytest.mark.parametrize("maxfun", [1, 5, 17])
def test_maxfun_is_a_hard_cap_and_the_result_is_the_best_point_evaluated(maxfun):
    # SciPy checks its own maxfun between iterations only (a line search may exceed
    # it); a federated fit's evaluations are secure sums, so the cap is exact here
    m = SteppedMinimizer(np.array([-1.2, 1.0]), None, maxiter=1000, maxfun=maxfun)
    seen = []
    x = m.start()
    while x is not None:
        seen.append((_rosenbrock(x)[0], x.copy()))
        x = m.feed(*_rosenbrock(x))
    assert len(seen) == maxfun == m.num_evaluations
    best = min(seen, key=lambda pair: pair[0])
    np.testing.assert_array_equal(m.result.x, best[1])
    assert m.result.fun == best[0] and not m.result.success


# --- the loss at summed summaries ---------------------------------------------------------
def test_fit_loss_is_pitc_loss_and_adjoint_at_an_honest_sum():
    clients, support, k, lik, mean = _fit_setup()
    hyper = PITCHyperparameters(k, lik, mean)
    with torch.no_grad():
        packed = SparseSummary.sum(
            compute_local_summary(X, Y, support, k, lik, mean) for X, Y in clients
        ).to_numpy()
    loss, adjoint, prior_grad, failure = fit_loss(packed, len(support), hyper)
    ref = pitc_loss_and_adjoint(packed, len(support), hyper)
    assert failure is None and loss == ref[0]
    np.testing.assert_array_equal(adjoint, ref[1])
    np.testing.assert_array_equal(prior_grad, ref[2])


def test_fit_loss_never_refuses_a_forged_sum():
    clients, support, k, lik, mean = _fit_setup()
    hyper = PITCHyperparameters(k, lik, mean)
    length = SparseSummary.packed_length(len(support))
    for forged, why in ((np.zeros(length), "ValueError"), (np.full(length, 1e300), None)):
        loss, adjoint, _, failure = fit_loss(forged, len(support), hyper)
        assert np.isfinite(loss) and np.isfinite(adjoint).all()
        assert (np.abs(adjoint) <= ADJOINT_LIMIT).all()
        if failure is not None:
            assert loss == FAILED_LOSS and not adjoint.any()
        if why is not None:
            assert failure == why


def test_plain_sum():
    np.testing.assert_array_equal(plain_sum([np.ones(3), np.arange(3.0)]), [1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match="empty"):
        plain_sum([])


# --- fit_federated_pitc, fit_local_average ------------------------------------------------
def test_fit_recovers_known_lengthscales():
    # data drawn from a GP with known hyperparameters, spread over 5 clients
    torch.manual_seed(0)
    d, n = 2, 400
    true_ls = torch.tensor([0.12, 0.5], dtype=torch.float64)
    g = torch.Generator().manual_seed(0)
    X = torch.rand(n, d, generator=g, dtype=torch.float64)
    kern = RBFKernel(ard_num_dims=d).double()
    kern.lengthscale = true_ls
    with torch.no_grad():
        K = kern(X).to_dense() + 1e-4 * torch.eye(n, dtype=torch.float64)
        f = torch.linalg.cholesky(K) @ torch.randn(n, generator=g, dtype=torch.float64)
    Y = (f + 0.05 * torch.randn(n, generator=g, dtype=torch.float64)).unsqueeze(-1)
    order = X[:, 0].argsort()  # clients own vertical strips of the domain
    parts = order.chunk(5)

    centers = [local_centers(X[p], k=20, seed=i, min_cluster_size=1) for i, p in enumerate(parts)]
    support = global_support(centers, 60, seed=0)
    k = RBFKernel(ard_num_dims=d).double()
    lik = get_gaussian_likelihood_with_lognormal_prior().double()
    clients = [PITCFitClient(X[p], Y[p], support, k, lik) for p in parts]
    result = fit_federated_pitc(clients, support, k, lik, include_prior=False)
    assert result.success, result.message
    assert result.num_rounds == 2 * result.num_evaluations
    ls = k.lengthscale.detach().squeeze()
    assert torch.allclose(ls, true_ls, rtol=0.2), ls
    assert 0.05**2 / 3 < lik.noise.item() < 3 * 0.05**2


def test_fit_matches_exact_gp_fit_when_support_holds_all_inputs():
    # With S = all inputs, PITC is the exact GP: the federated fit must land on
    # BoTorch's exact-GP MAP estimate (same priors, same objective).
    clients, _, k, lik, mean = _fit_setup(torch.float64, seed=3)
    X = torch.cat([c[0] for c in clients])
    Y = torch.cat([c[1] for c in clients])
    import copy

    k2, lik2, mean2 = copy.deepcopy(k), copy.deepcopy(lik), copy.deepcopy(mean)
    fit_clients = [PITCFitClient(Xi, Yi, X, k, lik, mean, jitter=1e-12) for Xi, Yi in clients]
    fit_federated_pitc(fit_clients, X, k, lik, mean, maxiter=500, gtol=1e-9)
    gp = SingleTaskGP(
        X, Y, covar_module=k2, likelihood=lik2, mean_module=mean2, outcome_transform=None
    )
    fit_gpytorch_mll(ExactMarginalLogLikelihood(gp.likelihood, gp))
    fed = PITCHyperparameters(k, lik, mean).get_values()
    exact = PITCHyperparameters(k2, lik2, mean2).get_values()
    np.testing.assert_allclose(fed, exact, rtol=2e-3, atol=2e-4)


def test_fit_through_an_instrumented_aggregate_only_sees_summaries_and_gradients():
    clients, support, k, lik, mean = _fit_setup(torch.float64, seed=2)
    fit_clients = [PITCFitClient(X, Y, support, k, lik, mean) for X, Y in clients]
    seen = []

    def aggregate(arrays):
        seen.append([np.array(a) for a in arrays])
        return np.sum(arrays, axis=0)

    hyper_size = PITCHyperparameters(k, lik, mean).size
    result = fit_federated_pitc(fit_clients, support, k, lik, mean, aggregate=aggregate, maxiter=5)
    assert len(seen) == result.num_rounds
    packed_len = SparseSummary.packed_length(len(support))
    raw = {float(v) for X, Y in clients for v in torch.cat([X.flatten(), Y.flatten()])}
    for arrays in seen:
        assert len(arrays) == len(clients)
        for a in arrays:
            assert a.shape in ((packed_len,), (hyper_size,))
            assert not raw & set(a.tolist())  # no raw input/output value is sent


@pytest.mark.parametrize("zero_mean", [False, True])
def test_fit_local_average_equals_mean_of_local_fits(zero_mean):
    clients, support, k, lik, mean = _fit_setup(torch.float64, seed=4)
    import copy

    mean = None if zero_mean else mean
    fit_clients = [PITCFitClient(X, Y, support, k, lik, mean) for X, Y in clients]
    expected, weights = [], []
    for X, Y in clients:
        ki, li = copy.deepcopy(k), copy.deepcopy(lik)
        mi = ZeroMean() if mean is None else copy.deepcopy(mean)
        gp = SingleTaskGP(
            X, Y, covar_module=ki, likelihood=li, mean_module=mi, outcome_transform=None
        )
        fit_gpytorch_mll(ExactMarginalLogLikelihood(gp.likelihood, gp))
        expected.append(PITCHyperparameters(ki, li, None if mean is None else mi).get_values())
        weights.append(len(X))
    values = fit_local_average(fit_clients, k, lik, mean)
    ref = np.average(np.stack(expected), axis=0, weights=weights)
    np.testing.assert_allclose(values, ref, rtol=1e-6)
    np.testing.assert_allclose(PITCHyperparameters(k, lik, mean).get_values(), ref, rtol=1e-6)


def test_fit_on_the_same_modules_raises_instead_of_mixing():
    d = 2
    clients, support = overlapping_federation(scale=1.5)
    covar = get_covar_module_with_dim_scaled_prior(d).double()
    lik = get_gaussian_likelihood_with_lognormal_prior().double()
    model = FederatedPITCGP.from_client_data(clients, support, covar, lik)
    X_test = torch.rand(50, d, dtype=torch.float64)
    model.posterior(X_test)  # caches built at the initial hyperparameters
    fit_clients = [PITCFitClient(X, Y, support, covar, lik) for X, Y in clients]
    fit_federated_pitc(fit_clients, support, covar, lik, maxiter=20)
    with pytest.raises(HyperparametersChangedError, match="update_summary"):
        model.posterior(X_test)
    # the documented remedy: summaries at the new values
    with torch.no_grad():
        fresh = SparseSummary.sum(
            compute_local_summary(X, Y, support, covar, lik) for X, Y in clients
        )
    model.update_summary(fresh)
    rebuilt = FederatedPITCGP.from_client_data(clients, support, covar, lik)
    with torch.no_grad():
        p, q = model.posterior(X_test), rebuilt.posterior(X_test)
    torch.testing.assert_close(p.mean, q.mean, atol=1e-12, rtol=0)
    torch.testing.assert_close(p.variance, q.variance, atol=1e-12, rtol=0)
    assert (p.variance > 0).all()


def test_fit_gpytorch_mll_matches_fit_federated_pitc_and_refreshes_the_model():
    clients, support, covar, lik, mean = _fit_setup()
    covar2, lik2, mean2 = (
        get_covar_module_with_dim_scaled_prior(2).double(),
        get_gaussian_likelihood_with_lognormal_prior().double(),
        ConstantMean().double(),
    )
    model = FederatedPITCGP.from_client_data(clients, support, covar, lik, mean)
    fit_gpytorch_mll(
        PITCMarginalLogLikelihood(model.likelihood, model, clients),
        optimizer_kwargs={"options": {"maxiter": 200}},
    )
    fit_clients = [PITCFitClient(X, Y, support, covar2, lik2, mean2) for X, Y in clients]
    fit_federated_pitc(fit_clients, support, covar2, lik2, mean2)
    a = PITCHyperparameters(covar, lik, mean).get_values()
    b = PITCHyperparameters(covar2, lik2, mean2).get_values()
    # two L-BFGS-B runs on the same objective from the same start: same optimum
    assert abs(a - b).max() < 1e-3 * max(1.0, abs(b).max())
    X_test = torch.rand(6, 2, dtype=torch.float64)
    with torch.no_grad():
        p = model.posterior(X_test)  # refreshed: no HyperparametersChangedError
        q = FederatedPITCGP.from_client_data(clients, support, covar, lik, mean).posterior(X_test)
    torch.testing.assert_close(p.mean, q.mean, atol=1e-12, rtol=0)
    torch.testing.assert_close(p.variance, q.variance, atol=1e-12, rtol=0)


def test_federated_fits_take_the_shared_input_transform():
    clients, support, covar, lik, mean = _fit_setup()
    d = support.shape[-1]
    lo = torch.tensor([10.0, -100.0], dtype=torch.float64)
    span = torch.tensor([20.0, 200.0], dtype=torch.float64)
    raw = [(lo + span * X, Y) for X, Y in clients]  # a user's own domain
    tf = Normalize(d, bounds=torch.stack([lo, lo + span]))
    fitted = {}
    for name, data, S, transform in (
        ("transform", raw, lo + span * support, tf),
        ("by hand", clients, support, None),
    ):
        modules = [deepcopy(covar), deepcopy(lik), deepcopy(mean)]
        fit_clients = [PITCFitClient(X, Y, S, *modules, input_transform=transform) for X, Y in data]
        fit_federated_pitc(fit_clients, S, *modules, maxiter=15)
        averaged = fit_local_average(fit_clients, *[deepcopy(m) for m in modules])
        fitted[name] = (PITCHyperparameters(*modules).get_values(), averaged)
    # the same computations up to the rounding of the transformed inputs
    for a, b in zip(fitted["transform"], fitted["by hand"], strict=True):
        assert abs(a - b).max() <= 1e-6 * max(1.0, abs(b).max())
    with pytest.raises(ValueError, match="input_transform.*learns"):
        PITCFitClient(*raw[0], lo + span * support, covar, lik, mean, input_transform=Normalize(d))


def test_federated_fit_through_masking_matches_plaintext():
    clients, support = random_federation(3, torch.float64, 4, 2, 8, sizes=[6, 9, 4, 7])
    results = []
    for aggregate in (None, make_aggregator("masking", seed=1)):
        kk, ll, mm = make_modules(support.shape[-1], torch.float64, lengthscale=0.4)
        fit_clients = [PITCFitClient(X, Y, support, kk, ll, mm) for X, Y in clients]
        fit_federated_pitc(fit_clients, support, kk, ll, mm, aggregate=aggregate, maxiter=30)
        results.append(PITCHyperparameters(kk, ll, mm).get_theta())
    np.testing.assert_allclose(results[1], results[0], rtol=1e-6, atol=1e-8)


def test_fits_bad_inputs():
    clients, support, k, lik, mean = _fit_setup()
    c = PITCFitClient(*clients[0], support, k, lik, mean)
    with pytest.raises(ValueError, match="empty"):
        fit_federated_pitc([], support, k, lik, mean)
    with pytest.raises(ValueError, match="hyperparameters"):
        fit_federated_pitc([c], support, k, lik)  # server has no mean module
    with pytest.raises(ValueError, match="empty"):
        fit_local_average([], k, lik, mean)


# --- standardize_outcomes -----------------------------------------------------------------
@pytest.mark.parametrize(
    "aggregate",
    [
        None,
        make_aggregator("masking", wide=False, seed=1),
        make_aggregator("ckks", wide=False, seed=1),
    ],
)
def test_standardize_outcomes_runs_the_two_passes(aggregate):
    Y = 1e5 + 1e-3 * torch.randn(40, 1, generator=torch.Generator().manual_seed(0)).double()
    parts = Y.tensor_split(4)
    first = plain_sum([outcome_moments(y) for y in parts])
    _, center = center_from_moments(first)
    second = plain_sum([centred_moments(y, center) for y in parts])
    ref = standardize_from_moments(first, second, min_stdv=0)
    tf = standardize_outcomes(parts, aggregate, min_stdv=0)
    assert (tf.means, tf.stdvs) == (ref.means, ref.stdvs)


# --- SummaryTrustRegion --------------------------------------------------------------
def _linear_problem(bounds):
    r"""A summary linear in theta, ``S = M theta + c``, and the loss ``|S - s*|^2 / 2``:
    the linearised model is exact, so the trust region's step is the model's minimiser."""
    rng = np.random.default_rng(0)
    M, c = rng.normal(size=(7, 3)), rng.normal(size=7)
    target = M @ np.array([0.7, 2.0, 1.3]) + c  # optimum inside every box below

    def loss(S, theta):
        r = S - target
        return 0.5 * float(r @ r), r, np.zeros(3), None

    return M, c, loss


@pytest.mark.parametrize("log_space", [False, True])
def test_the_trust_region_solves_an_exactly_linear_summary_in_two_evaluations(log_space):
    lower = 0.01 if log_space else -5.0
    bounds = np.array([[lower, 5.0]] * 3)
    M, c, loss = _linear_problem(bounds)
    tr = SummaryTrustRegion(np.array([1.0, 1.0, 1.0]), bounds, maxiter=5, loss=loss, radius=8.0)
    theta, seen = tr.start(), []
    while theta is not None:
        seen.append(theta)
        theta = tr.feed(M @ theta + c, M)
    assert len(seen) == 2 == tr.num_evaluations and tr.result.message == "converged"
    assert np.allclose(tr.result.x, [0.7, 2.0, 1.3], atol=1e-5)
    assert tr.result.fun == pytest.approx(0.0, abs=1e-9)


def test_the_trust_region_never_steps_beyond_its_radius_or_the_bounds():
    bounds = np.array([[0.01, 5.0], [-5.0, 5.0], [-5.0, 5.0]])
    M, c, loss = _linear_problem(bounds)
    radius = 0.2
    tr = SummaryTrustRegion(np.array([4.0, -4.0, 4.5]), bounds, maxiter=3, loss=loss, radius=radius)
    theta = tr.start()
    previous = theta
    theta = tr.feed(M @ theta + c, M)
    # log space for the positive entry, plain units for the others
    assert abs(np.log(theta[0]) - np.log(previous[0])) <= radius * (1 + 1e-9)
    assert np.abs(theta[1:] - previous[1:]).max() <= radius * (1 + 1e-9)
    assert (theta >= bounds[:, 0]).all() and (theta <= bounds[:, 1]).all()


def test_the_trust_region_keeps_the_best_point_and_stops_at_its_budget():
    clients, support, k, lik, mean = _fit_setup(seed=4)
    fit_clients = [PITCFitClient(X, Y, support, k, lik, mean) for X, Y in clients]
    hyper = PITCHyperparameters(k, lik, mean)

    def loss(S, theta):
        hyper.set_theta(theta)
        return fit_loss(S, len(support), hyper)

    bounds = np.array([[0.025, 1e4]] * (hyper.size - 1) + [[-10.0, 10.0]])
    x0 = np.clip(hyper.get_theta(), bounds[:, 0], bounds[:, 1])
    tr = SummaryTrustRegion(x0, bounds, maxiter=3, loss=loss)
    theta, values = tr.start(), []
    while theta is not None:
        parts = [c.summary_and_jacobian(theta) for c in fit_clients]
        S, J = sum(p[0] for p in parts), sum(p[1] for p in parts)
        values.append((loss(S, theta)[0], theta))
        theta = tr.feed(S, J)
    assert 2 <= tr.num_evaluations == len(values) <= 4
    best = min(values, key=lambda v: v[0])
    assert tr.result.fun == best[0] and np.array_equal(tr.result.x, best[1])
    assert tr.result.fun < values[0][0]  # the fit improved on its start
    # and the value is the loss at that point, recomputed from the sums
    exact = sum(c.summary(tr.result.x) for c in fit_clients)
    assert loss(exact, tr.result.x)[0] == pytest.approx(tr.result.fun, rel=1e-12)


def test_the_trust_region_refuses_bad_input():
    bounds = np.array([[0.1, 2.0], [-1.0, 1.0]])
    loss = lambda S, t: (0.0, np.zeros(len(S)), np.zeros(2), None)  # noqa: E731
    for kwargs, match in (
        ({"bounds": np.zeros(3)}, "`bounds` must be n x 2"),
        ({"bounds": np.array([[1.0, 0.0], [0.0, 1.0]])}, "lower < upper"),
        ({"bounds": np.array([[0.0, np.inf], [0.0, 1.0]])}, "finite"),
        ({"x0": np.zeros(3)}, "`x0`"),
        ({"x0": np.array([np.nan, 0.0])}, "`x0`"),
        ({"maxiter": -1}, "`maxiter`"),
        ({"maxiter": 1.5}, "`maxiter`"),
        ({"radius": 0.0}, "`radius`"),
        ({"radius": np.inf}, "`radius`"),
    ):
        args = {"x0": np.array([1.0, 0.0]), "bounds": bounds, "maxiter": 2, "loss": loss}
        with pytest.raises(ValueError, match=match):
            SummaryTrustRegion(**{**args, **kwargs})
    tr = SummaryTrustRegion(np.array([1.0, 0.0]), bounds, 2, loss)
    with pytest.raises(RuntimeError, match="no point is pending"):
        tr.feed(np.zeros(3), np.zeros((3, 2)))
    tr.start()
    with pytest.raises(RuntimeError, match="already started"):
        tr.start()
    with pytest.raises(ValueError, match="`jacobian` must be 3 x 2"):
        tr.feed(np.zeros(3), np.zeros((2, 3)))
    # a sum without a loss (forged) ends a fit at its start rather than raising
    assert tr.feed(np.array([0.0, np.nan, 0.0]), np.zeros((3, 2))) is None
    assert tr.result.message == "the first evaluation gives no loss"
    assert np.array_equal(tr.result.x, [1.0, 0.0])


def test_a_failed_evaluation_after_the_start_is_never_the_result():
    bounds = np.array([[-5.0, 5.0]] * 3)
    M, c, loss = _linear_problem(bounds)
    tr = SummaryTrustRegion(np.array([1.0, 1.0, 1.0]), bounds, maxiter=3, loss=loss, radius=0.1)
    start = tr.start()
    step = tr.feed(M @ start + c, M)
    step = tr.feed(np.full(7, np.nan), M)  # the step's sum is forged: not finite
    assert step is not None  # a shorter step from the start
    assert np.abs(step - start).max() <= 0.1 * 0.3 * (1 + 1e-9)
    while step is not None:
        step = tr.feed(M @ step + c, M)
    assert tr.result.fun < loss(M @ start + c, start)[0]
