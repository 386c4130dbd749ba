r"""FederatedPITCGP as a drop-in BoTorch model: no stale state, transforms, forward,
fitting through fit_gpytorch_mll, BoTorch's error conventions, float32 numerics.

References are BoTorch's SingleTaskGP (when the support holds every training input the
dPITC posterior is the exact GP posterior) and dense computations.
"""

from __future__ import annotations

import hashlib
import math
import warnings
from copy import deepcopy

import pytest
import torch
from botorch.acquisition import qLowerBoundMaxValueEntropy
from botorch.exceptions.errors import (
    BotorchTensorDimensionError,
    InputDataError,
    UnsupportedError,
)
from botorch.fit import fit_gpytorch_mll
from botorch.models import SingleTaskGP
from botorch.models.transforms.input import (
    ChainedInputTransform,
    InputPerturbation,
    Normalize,
    Warp,
)
from botorch.models.transforms.outcome import ChainedOutcomeTransform, Log, Standardize
from botorch.models.utils.gpytorch_modules import (
    get_covar_module_with_dim_scaled_prior,
    get_gaussian_likelihood_with_lognormal_prior,
)
from botorch.sampling import SobolQMCNormalSampler
from gpytorch.kernels import MaternKernel, PolynomialKernel, RBFKernel, ScaleKernel
from gpytorch.likelihoods import GaussianLikelihood
from gpytorch.means import ConstantMean, LinearMean
from gpytorch.mlls import ExactMarginalLogLikelihood

import botorch_fed.models.pitc as pitc_module
import botorch_fed.models.pitc_snapshot as pitc_snapshot_module
from botorch_fed.models import (
    FederatedPITCGP,
    HyperparametersChangedError,
    PITCHyperparameters,
    PITCMarginalLogLikelihood,
    SparseSummary,
    compute_local_summary,
    pitc_loss_and_adjoint,
)
from botorch_fed.models.module_state import _SCALARS, _structure, _structure_key, _summary_modules
from botorch_fed.models.sparse_summary import summary_factor
from tests.helpers.dense_pitc import make_modules, overlapping_federation, random_federation
from tests.helpers.tolerances import assert_close, eps, reordering_factor, tol

DTYPES = [torch.float32, torch.float64]


pytestmark = pytest.mark.usefixtures("quiet_seeded")


def _setting(dtype=torch.float64, seed=0, d=2, m=7):
    clients, support = random_federation(seed, dtype, num_clients=3, d=d, m=m, sizes=[5, 7, 4])
    k, lik, mean = make_modules(d, dtype, lengthscale=0.4)
    return clients, support, k, lik, mean


def _pooled(clients):
    return torch.cat([X for X, _ in clients]), torch.cat([Y for _, Y in clients])


# --- no stale state ---------------------------------------------------------------------
@pytest.mark.parametrize(
    "change",
    ["setter", "optimizer_step", "module_load_state_dict", "outcome_transform", "likelihood"],
)
def test_every_kind_of_hyperparameter_change_is_detected(change):
    clients, support, k, lik, mean = _setting()
    tf = Standardize(m=1)
    model = FederatedPITCGP.from_client_data(clients, support, k, lik, mean, outcome_transform=tf)
    X_test = torch.rand(5, support.shape[-1], dtype=torch.float64)
    model.posterior(X_test)
    if change == "setter":  # gpytorch's setters write through .data (no version bump)
        k.base_kernel.lengthscale = 0.9
    elif change == "optimizer_step":
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        model.covar_module.outputscale.sum().backward()
        opt.step()
    elif change == "module_load_state_dict":
        other, _, _ = make_modules(support.shape[-1], torch.float64, lengthscale=0.7)
        k.load_state_dict(other.state_dict())
    elif change == "outcome_transform":
        tf.means = tf.means + 1.0
    else:
        lik.noise = 0.5
    with pytest.raises(HyperparametersChangedError):
        model.posterior(X_test)
    with pytest.raises(HyperparametersChangedError):
        model.condition_on_observations(X_test[:1], torch.zeros(1, 1, dtype=torch.float64))


def test_load_state_dict_from_another_model_predicts_as_that_model():
    clients, support, k, lik, mean = _setting()
    X_test = torch.rand(9, support.shape[-1], dtype=torch.float64)
    target = FederatedPITCGP.from_client_data(clients[:2], support, k, lik, mean)
    target.posterior(X_test)  # build caches that the load must invalidate
    k2, lik2, mean2 = make_modules(support.shape[-1], torch.float64, lengthscale=0.8, noise=0.05)
    source = FederatedPITCGP.from_client_data(clients, support, k2, lik2, mean2)
    target.load_state_dict(source.state_dict())
    with torch.no_grad():
        p, q = target.posterior(X_test), source.posterior(X_test)
    torch.testing.assert_close(p.mean, q.mean, atol=1e-12, rtol=0)
    torch.testing.assert_close(
        p.distribution.covariance_matrix, q.distribution.covariance_matrix, atol=1e-12, rtol=0
    )


class _AcceleratorLike(FederatedPITCGP):
    r"""Behaves as on an accelerator: tensor values are read only when metadata changed."""

    def _reads_are_free(self) -> bool:
        return False


def test_without_free_reads_values_are_checked_only_after_metadata_changes(monkeypatch):
    clients, support, k, lik, mean = _setting()
    model = FederatedPITCGP.from_client_data(clients, support, k, lik, mean)
    model.__class__ = _AcceleratorLike
    X_test = torch.rand(4, support.shape[-1], dtype=torch.float64)
    reads = []
    original = FederatedPITCGP._check_values
    monkeypatch.setattr(
        FederatedPITCGP, "_check_values", lambda self, t: (reads.append(1), original(self, t))
    )
    model.posterior(X_test)
    first = len(reads)
    for _ in range(3):
        model.posterior(X_test)
    assert len(reads) == first  # no value read (host sync) on unchanged state
    with torch.no_grad():
        model.covar_module.raw_outputscale.add_(0.3)  # in place: version bump
    with pytest.raises(HyperparametersChangedError):
        model.posterior(X_test)


# --- transforms ---------------------------------------------------------------------------
def _exact_setting(dtype=torch.float64):
    clients, support, k, lik, mean = _setting(dtype)
    X, Y = _pooled(clients)
    return clients, X, Y, k, lik, mean


@pytest.mark.parametrize("dtype", DTYPES)
def test_input_and_outcome_transforms_as_single_task_gp(dtype):
    clients, X, Y, k, lik, mean = _exact_setting(dtype)
    clients = [(4 * Xc - 1, 3 * Yc + 10) for Xc, Yc in clients]  # not in the unit cube
    X, Y = 4 * X - 1, 3 * Y + 10
    d = X.shape[-1]
    X_test = (4 * torch.rand(6, d, dtype=torch.float64) - 1).to(dtype)
    with torch.no_grad():
        model = FederatedPITCGP.from_client_data(
            clients,
            X,  # support = every training input: dPITC is the exact GP
            k,
            lik,
            mean,
            outcome_transform=Standardize(m=1),
            input_transform=Normalize(d),
            jitter=1e-12,
        )
        to64 = lambda t: t.to(torch.float64)  # noqa: E731
        k64, lik64, mean64 = (mm.to(torch.float64) for mm in make_modules(d, dtype, 1.0))
        for m64, mm in ((k64, k), (lik64, lik), (mean64, mean)):
            m64.load_state_dict(mm.state_dict())
        stgp = SingleTaskGP(
            to64(X),
            to64(Y),
            covar_module=k64,
            likelihood=lik64,
            mean_module=mean64,
            outcome_transform=Standardize(m=1),
            input_transform=Normalize(d),
        ).eval()
        p, q = model.posterior(X_test), stgp.posterior(to64(X_test))
        # model(X) takes transformed inputs, as BoTorch's exact GPs in eval mode
        X_tf = stgp.input_transform(to64(X_test))
        f, g = model(X_tf.to(dtype)), stgp(X_tf)
    # jitter 1e-12 on K_SS is the only modelling difference; float32 adds output rounding
    scale = max(q.mean.abs().max().item(), q.variance.max().item(), 1.0)
    atol = 1e-7 + (tol(dtype, 4) * scale if dtype != torch.float64 else 0.0)
    assert p.mean.dtype == dtype
    torch.testing.assert_close(p.mean.double(), q.mean, atol=atol, rtol=0)
    torch.testing.assert_close(
        p.distribution.covariance_matrix.double(),
        q.distribution.covariance_matrix,
        atol=atol,
        rtol=0,
    )
    torch.testing.assert_close(f.mean.double(), g.mean, atol=atol, rtol=0)
    torch.testing.assert_close(
        f.covariance_matrix.double(), g.covariance_matrix.to_dense(), atol=atol, rtol=0
    )
    assert isinstance(model.input_transform, Normalize)
    assert not model.input_transform.learn_coefficients  # learnt from the pooled inputs, frozen


def test_fixed_input_transform_equals_transforming_everything_by_hand():
    clients, support, k, lik, mean = _setting()
    d = support.shape[-1]
    bounds = torch.tensor([[-1.0] * d, [3.0] * d], dtype=torch.float64)
    raw = [(4 * X - 1, Y) for X, Y in clients]
    S_raw = 4 * support - 1
    tf = Normalize(d, bounds=bounds)
    X_test = 4 * torch.rand(5, d, dtype=torch.float64) - 1
    with torch.no_grad():
        summaries = [
            compute_local_summary(X, Y, S_raw, k, lik, mean, input_transform=tf) for X, Y in raw
        ]
        model = FederatedPITCGP(
            S_raw, SparseSummary.sum(summaries), k, lik, mean, input_transform=tf
        )
        by_hand = FederatedPITCGP.from_client_data(clients, support, k, lik, mean)
        p, q = model.posterior(X_test), by_hand.posterior((X_test + 1) / 4)
    torch.testing.assert_close(p.mean, q.mean, atol=1e-12, rtol=0)
    torch.testing.assert_close(p.variance, q.variance, atol=1e-12, rtol=0)


def test_transforms_are_validated_at_construction():
    clients, support, k, lik, mean = _setting()
    d = support.shape[-1]
    with torch.no_grad():
        s = SparseSummary.sum(
            compute_local_summary(X, Y, support, k, lik, mean) for X, Y in clients
        )
    with pytest.raises(ValueError, match="outcome_transform.*untrained"):
        FederatedPITCGP(support, s, k, lik, mean, outcome_transform=Standardize(m=1))
    wide = Standardize(m=2)
    wide.train()
    wide(torch.randn(5, 2, dtype=torch.float64))
    wide.eval()
    with pytest.raises(UnsupportedError, match="m=2"):
        FederatedPITCGP(support, s, k, lik, mean, outcome_transform=wide)
    with pytest.raises(ValueError, match="input_transform.*learns"):
        FederatedPITCGP(support, s, k, lik, mean, input_transform=Normalize(d))
    with pytest.raises(ValueError, match="input_transform.*learns"):
        compute_local_summary(*clients[0], support, k, lik, mean, input_transform=Normalize(d))
    with pytest.raises(TypeError, match="outcome_transform"):
        FederatedPITCGP(support, s, k, lik, mean, outcome_transform=Normalize(d))
    with pytest.raises(TypeError, match="input_transform"):
        FederatedPITCGP(support, s, k, lik, mean, input_transform=Standardize(m=1))


# --- the BoTorch surface ------------------------------------------------------------------
def test_gibbon_with_pending_points_matches_single_task_gp():
    clients, X, Y, k, lik, mean = _exact_setting()
    d = X.shape[-1]
    model = FederatedPITCGP.from_client_data(clients, X, k, lik, mean, jitter=1e-12)
    stgp = SingleTaskGP(
        X, Y, covar_module=k, likelihood=lik, mean_module=mean, outcome_transform=None
    ).eval()
    candidates = torch.rand(64, d, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    X_pending = torch.rand(2, d, dtype=torch.float64)
    X_eval = torch.rand(5, 1, d, dtype=torch.float64)
    values = []
    for m in (model, stgp):
        torch.manual_seed(0)  # max-value samples are drawn at construction
        acqf = qLowerBoundMaxValueEntropy(m, candidates, num_mv_samples=8, X_pending=X_pending)
        with torch.no_grad():
            values.append(acqf(X_eval))
    torch.testing.assert_close(values[0], values[1], atol=1e-6, rtol=0)


def test_subset_output_and_multi_output_are_handled():
    clients, support, k, lik, mean = _setting()
    d = support.shape[-1]
    model = FederatedPITCGP.from_client_data(clients, support, k, lik, mean)
    assert model.subset_output([0]) is model
    with pytest.raises(UnsupportedError, match="single"):
        model.subset_output([1])
    with pytest.raises(UnsupportedError, match="single"):
        model.posterior(torch.rand(3, d, dtype=torch.float64), output_indices=[0, 1])
    X, Y = clients[0]
    with pytest.raises(UnsupportedError, match="2 outputs"):
        compute_local_summary(X, torch.cat([Y, Y], -1), support, k, lik, mean)
    with pytest.raises(UnsupportedError, match="2 outputs"):
        model.condition_on_observations(X, torch.cat([Y, Y], -1))


def test_bad_shapes_and_unknown_keywords_raise_botorch_errors():
    clients, support, k, lik, mean = _setting()
    d = support.shape[-1]
    model = FederatedPITCGP.from_client_data(clients, support, k, lik, mean)
    sampler = SobolQMCNormalSampler(sample_shape=torch.Size([4]), seed=0)
    fantasy = model.fantasize(torch.rand(2, 1, d, dtype=torch.float64), sampler)
    assert fantasy.batch_shape == torch.Size([4, 2])
    with pytest.raises(BotorchTensorDimensionError, match="does not broadcast"):
        fantasy.posterior(torch.rand(3, 5, d, dtype=torch.float64))
    X = torch.rand(3, d, dtype=torch.float64)
    with pytest.raises(BotorchTensorDimensionError, match="observation_noise"):
        model.posterior(X, observation_noise=torch.ones(3, 2, dtype=torch.float64))
    with pytest.raises(BotorchTensorDimensionError, match="observation_noise"):
        model.posterior(X, observation_noise=torch.ones(4, 1, dtype=torch.float64))
    with pytest.raises(ValueError, match="observation_noise"):
        model.posterior(X, observation_noise="yes")
    with pytest.raises(TypeError, match="unexpected keyword"):
        model.posterior(X, observation_nosie=True)
    with pytest.raises(TypeError, match="unexpected keyword"):
        model.condition_on_observations(X, torch.zeros(3, 1, dtype=torch.float64), nosie=None)
    with pytest.raises(TypeError, match="unexpected keyword"):
        model.fantasize(X, sampler, frobnicate=True)
    with pytest.raises(BotorchTensorDimensionError, match="`Y`"):
        model.condition_on_observations(X, torch.zeros(2, 1, dtype=torch.float64))
    with pytest.raises(InputDataError, match="NaN"):
        model.condition_on_observations(X * float("nan"), torch.zeros(3, 1, dtype=torch.float64))
    with pytest.raises(TypeError, match="client_data"):
        FederatedPITCGP.from_client_data(clients[0][0], support, k, lik, mean)
    with pytest.raises(BotorchTensorDimensionError, match=r"client_data\[1\]"):
        FederatedPITCGP.from_client_data(
            [clients[0], (clients[1][0], clients[1][1].squeeze(-1))], support, k, lik, mean
        )


def test_fantasy_model_supports_repeated_backward_passes():
    clients, support, k, lik, mean = _setting()
    d = support.shape[-1]
    model = FederatedPITCGP.from_client_data(clients, support, k, lik, mean)
    X_f = torch.rand(1, d, dtype=torch.float64, requires_grad=True)
    fantasy = model.fantasize(X_f, SobolQMCNormalSampler(sample_shape=torch.Size([3]), seed=0))
    grads = []
    for _ in range(3):
        X = torch.rand(4, d, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
        X.requires_grad_(True)
        fantasy.posterior(X).variance.sum().backward()
        grads.append(X.grad)
    torch.testing.assert_close(grads[0], grads[2], atol=0, rtol=0)
    assert grads[0].abs().sum() > 0


def test_condition_on_observations_reuses_the_support_factorisation(monkeypatch):
    clients, support, k, lik, mean = _setting()
    d = support.shape[-1]
    model = FederatedPITCGP.from_client_data(clients, support, k, lik, mean)
    X_test = torch.rand(3, d, dtype=torch.float64)
    model.posterior(X_test)
    calls = []
    for module, name in (
        (pitc_module, "validate_support"),
        (pitc_module, "support_factor"),
        (pitc_snapshot_module, "support_factor"),
    ):
        original = getattr(module, name)
        monkeypatch.setattr(
            module,
            name,
            lambda *a, _o=original, _n=name, **kw: (calls.append(_n), _o(*a, **kw))[1],
        )
    sampler = SobolQMCNormalSampler(sample_shape=torch.Size([4]), seed=0)
    fantasy = model.fantasize(torch.rand(2, 1, d, dtype=torch.float64), sampler)
    fantasy.posterior(torch.rand(2, 3, d, dtype=torch.float64))
    model.posterior(X_test)
    assert calls == []


def test_from_client_data_adds_tensors_without_a_numpy_round_trip(monkeypatch):
    clients, support, k, lik, mean = _setting()

    def no_numpy(self):
        raise AssertionError("to_numpy called")

    monkeypatch.setattr(SparseSummary, "to_numpy", no_numpy)
    model = FederatedPITCGP.from_client_data(clients, support, k, lik, mean)
    with torch.no_grad():
        ref = SparseSummary.sum(
            compute_local_summary(X, Y, support, k, lik, mean) for X, Y in clients
        )
    torch.testing.assert_close(model.summary.A, ref.A, atol=0, rtol=0)


# --- fitting ------------------------------------------------------------------------------
def _fit_setting(dtype=torch.float64):
    d = 2
    clients, support = random_federation(0, dtype, num_clients=4, d=d, m=9, sizes=[7, 3, 12, 5])
    covar = get_covar_module_with_dim_scaled_prior(d).to(dtype)
    lik = get_gaussian_likelihood_with_lognormal_prior().to(dtype)
    return clients, support, covar, lik, ConstantMean().to(dtype)


def test_fit_gpytorch_mll_refuses_other_marginal_likelihoods():
    clients, support, covar, lik, mean = _fit_setting()
    model = FederatedPITCGP.from_client_data(clients, support, covar, lik, mean)
    with pytest.raises(UnsupportedError, match="PITCMarginalLogLikelihood.*fit_federated_pitc"):
        fit_gpytorch_mll(ExactMarginalLogLikelihood(model.likelihood, model))
    with pytest.raises(ValueError, match="model.likelihood"):
        PITCMarginalLogLikelihood(GaussianLikelihood().double(), model, clients)


def test_pitc_marginal_likelihood_is_fit_federated_pitcs_objective():
    clients, support, covar, lik, mean = _fit_setting()
    model = FederatedPITCGP.from_client_data(clients, support, covar, lik, mean)
    mll = PITCMarginalLogLikelihood(model.likelihood, model, clients)
    hyper = PITCHyperparameters(covar, lik, mean)
    with torch.no_grad():
        packed = SparseSummary.sum(
            compute_local_summary(X, Y, support, covar, lik, mean) for X, Y in clients
        ).to_numpy()
    loss, _, _ = pitc_loss_and_adjoint(packed, len(support), hyper)
    # one objective from the same summaries by two code paths (torch, numpy): the
    # loss -(log p(y) + log prior) / n is formed by cancellation of its terms (quad,
    # |v|^2, the log-determinants, n log 2 pi, log prior), each rounded by the
    # factorisation of B = I + A~ (m x m) and sums over the M clients: 2 (M + m) cond(B)
    # relative to the terms' magnitude
    with torch.no_grad():
        total = SparseSummary.from_numpy(packed, len(support))
        L_B, v = summary_factor(total)
        n = int(total.num_data)
        terms = (
            total.quad.abs()
            + v.square().sum()
            + total.logdet.abs()
            + 2 * L_B.diagonal().log().abs().sum()
            + n * math.log(2 * math.pi)
        ) / (2 * n) + hyper.log_prior().abs() / n
        B = total.A + torch.eye(len(support), dtype=torch.float64)
        f = reordering_factor(len(clients) + len(support), torch.linalg.cond(B))
    bound = f * eps(torch.float64) * float(terms)
    assert abs(mll.compute_custom_loss().item() - loss) <= bound
    assert abs(mll().item() + loss) <= bound


# --- what PITC learns from new observations -------------------------------------------------
def test_observations_far_from_the_support_barely_move_the_posterior():
    k = ScaleKernel(RBFKernel()).double()
    k.base_kernel.lengthscale = 0.1
    lik = GaussianLikelihood().double()
    lik.noise = 1e-3
    S = torch.tensor([[0.1, 0.1], [0.2, 0.15], [0.6, 0.6]], dtype=torch.float64)
    X0 = S[:2] + 0.01  # data near two support points; none near the third
    model = FederatedPITCGP.from_client_data([(X0, torch.zeros(2, 1).double())], S, k, lik)
    near = S[2:] + 0.01
    far = torch.tensor([[0.95, 0.05]], dtype=torch.float64)  # >= 6.5 lengthscales from S
    y = torch.ones(1, 1, dtype=torch.float64)
    with torch.no_grad():
        for x, moved in ((near, True), (far, False)):
            before = model.posterior(x)
            after = model.condition_on_observations(x, y).posterior(x)
            shift = (after.mean - before.mean).abs().item()
            var_drop = 1 - (after.variance / before.variance).item()
            # an exact GP would move the mean at x to ~1 and drop its variance to ~noise
            if moved:
                assert shift > 0.5 and var_drop > 0.5
            else:
                assert shift < 1e-6 and var_drop < 1e-6


# --- float32 -------------------------------------------------------------------------------
def test_float32_model_is_float64_maths_on_rounded_inputs():
    r"""An ill-conditioned setting (lengthscale 1, noise 1e-4, cond(K_SS) > 1e8): a
    float32 model equals the float64 model on the same float32-rounded data up to the
    final rounding of its outputs."""
    d = 2
    clients, support = overlapping_federation()

    def modules(dtype):
        k = ScaleKernel(RBFKernel(ard_num_dims=d)).to(dtype)
        k.base_kernel.lengthscale = 1.0
        lik = GaussianLikelihood().to(dtype)
        lik.noise = 1e-4
        return k, lik

    c32 = [(X.float(), Y.float()) for X, Y in clients]
    X_test = torch.rand(200, d).float()
    with torch.no_grad():
        m32 = FederatedPITCGP.from_client_data(c32, support.float(), *modules(torch.float32))
        k64, lik64 = modules(torch.float64)
        k64.load_state_dict(m32.covar_module.state_dict())
        lik64.load_state_dict(m32.likelihood.state_dict())
        c64 = [(X.double(), Y.double()) for X, Y in c32]
        m64 = FederatedPITCGP.from_client_data(c64, support.float().double(), k64, lik64)
        p32, p64 = m32.posterior(X_test), m64.posterior(X_test.double())
        cond = torch.linalg.cond(k64(support.double()).to_dense()).item()
    assert cond > 1e8  # float32 could not even factorise K_SS at the default jitter
    assert p32.mean.dtype == torch.float32
    assert_close(p32.mean, p64.mean, dtype=torch.float32, factor=2)
    assert_close(p32.variance, p64.variance, dtype=torch.float32, factor=2)
    assert (p32.variance > 0).all()


def test_noise_too_small_for_float64_is_a_clear_error():
    clients, support, k, lik, mean = _setting()
    X, Y = clients[0]
    X, Y = torch.cat([X, X]), torch.cat([Y, Y])  # duplicated inputs: Lambda ~ noise
    with pytest.raises(InputDataError, match="Lambda"):
        compute_local_summary(X, Y, support, k, lik, mean, train_Yvar=torch.full_like(Y, 1e-300))


# --- state edge cases ------------------------------------------------------------------------
def test_derived_models_keep_their_own_record_of_the_state():
    clients, support, k, lik, mean = _setting()
    X_test = torch.rand(4, support.shape[-1], dtype=torch.float64)
    parent = FederatedPITCGP.from_client_data(clients, support, k, lik, mean)
    cond = parent.condition_on_observations(X_test[:1], torch.ones(1, 1, dtype=torch.float64))
    cond.posterior(X_test)
    k2, lik2, mean2 = make_modules(support.shape[-1], torch.float64, lengthscale=0.8, noise=0.05)
    other = FederatedPITCGP.from_client_data(clients[:2], support + 0.01, k2, lik2, mean2)
    parent.load_state_dict(other.state_dict())  # in place: the shared modules change
    with pytest.raises(HyperparametersChangedError):
        cond.posterior(X_test)
    assert not torch.equal(cond.support, parent.support)


def test_jitter_travels_with_the_state_dict():
    clients, support, k, lik, mean = _setting()
    X_test = torch.rand(6, support.shape[-1], dtype=torch.float64)
    source = FederatedPITCGP.from_client_data(clients, support, k, lik, mean, jitter=1e-2)
    k2, lik2, mean2 = make_modules(support.shape[-1], torch.float64, lengthscale=0.4)
    target = FederatedPITCGP.from_client_data(clients, support, k2, lik2, mean2)
    target.posterior(X_test)
    target.load_state_dict(source.state_dict())
    with torch.no_grad():
        p, q = target.posterior(X_test), source.posterior(X_test)
    torch.testing.assert_close(p.mean, q.mean, atol=1e-12, rtol=0)
    torch.testing.assert_close(p.variance, q.variance, atol=1e-12, rtol=0)


def test_module_structure_changes_are_detected():
    clients, support, k, lik, mean = _setting()
    d = support.shape[-1]
    X_test = torch.rand(3, d, dtype=torch.float64)
    model = FederatedPITCGP.from_client_data(clients, support, k, lik, mean)
    model.posterior(X_test)
    matern = ScaleKernel(MaternKernel(nu=2.5, ard_num_dims=d)).double()
    matern.load_state_dict(k.state_dict())  # same tensors, another kernel
    model.covar_module = matern
    with pytest.raises(HyperparametersChangedError, match="structure"):
        model.posterior(X_test)
    k_m = ScaleKernel(MaternKernel(nu=2.5, ard_num_dims=d)).double()
    model = FederatedPITCGP.from_client_data(clients, support, k_m, lik, mean)
    model.posterior(X_test)
    k_m.base_kernel.nu = 0.5
    with pytest.raises(HyperparametersChangedError, match="structure"):
        model.posterior(X_test)
    model = FederatedPITCGP.from_client_data(clients, support, k, lik, mean)
    model.outcome_transform = Log()
    with pytest.raises(HyperparametersChangedError, match="structure"):
        model.posterior(X_test)


@pytest.fixture
def _warnings_ignored():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def _old_structure_key(modules) -> int:
    r"""``_structure_key`` as it was before commit 979e08b (settings as a list, parts as
    a list), i.e. the value stored in the persistent ``summary_structure`` buffer of
    FederatedPITCGP state dicts saved by those versions."""
    parts = []
    for path, module in modules:
        if module is None:
            parts.append((path, None))
            continue
        settings = sorted(
            (k, v if not isinstance(v, tuple) else tuple(v))
            for k, v in vars(module).items()
            if k != "training"
            and (
                isinstance(v, _SCALARS)
                or (isinstance(v, tuple) and all(isinstance(e, _SCALARS) for e in v))
            )
        )
        parts.append((path, type(module).__module__, type(module).__qualname__, settings))
    digest = hashlib.sha256(repr(parts).encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True) >> 1


@pytest.mark.usefixtures("_warnings_ignored")
def test_structure_key_values_are_those_of_saved_state_dicts():
    kernel = ScaleKernel(MaternKernel(nu=2.5, ard_num_dims=2))
    modules = _summary_modules([("covar_module", kernel), ("likelihood", GaussianLikelihood())])
    assert _structure_key(modules) == _old_structure_key(modules)


@pytest.mark.usefixtures("_warnings_ignored")
def test_structure_compares_nan_settings_by_identity():
    r"""``_structure`` compares with ``==``: a NaN setting read twice is the same object,
    so an unchanged module is not reported as changed."""
    kernel = MaternKernel(nu=2.5)
    kernel.some_setting = float("nan")
    modules = _summary_modules([("k", kernel)])
    before = _structure(modules)
    assert _structure(modules) == before
    kernel.nu = 1.5
    assert _structure(modules) != before


def test_dtype_conversions_keep_the_summary_in_float64():
    d = 2
    clients, support = overlapping_federation()
    k = ScaleKernel(RBFKernel(ard_num_dims=d)).double()
    k.base_kernel.lengthscale = 1.0  # cond(K_SS) ~ 1e9: a float32 summary would show
    lik = GaussianLikelihood().double()
    lik.noise = 1e-4
    model = FederatedPITCGP.from_client_data(clients, support, k, lik)
    X_test = torch.rand(100, d, dtype=torch.float64)
    # the reference: a float64 model holding the float32-rounded hyperparameters and
    # the same float64 summary -- what `.float()` must amount to
    k_r, lik_r = deepcopy(k).float().double(), deepcopy(lik).float().double()
    rounded = FederatedPITCGP(support, model.summary, k_r, lik_r)
    with torch.no_grad():
        ref = rounded.posterior(X_test)
        model.float()
        assert model.summary_A.dtype == torch.float64
        p32 = model.posterior(X_test.float())  # float32 hyperparameters are re-recorded
        model.double()
        back = model.posterior(X_test)
    # identical float64 computations: only the final rounding of the outputs differs
    assert_close(p32.mean, ref.mean, dtype=torch.float32, factor=2)
    assert_close(p32.variance, ref.variance, dtype=torch.float32, factor=2)
    torch.testing.assert_close(back.mean, ref.mean, atol=1e-12, rtol=0)
    torch.testing.assert_close(back.variance, ref.variance, atol=1e-12, rtol=0)


def test_float32_inputs_do_not_disturb_a_float64_model_with_normalize():
    clients, support, k, lik, mean = _setting()
    d = support.shape[-1]
    bounds = torch.tensor([[-1.3] * d, [2.4] * d], dtype=torch.float64)
    tf = Normalize(d, bounds=bounds)
    summaries = [
        compute_local_summary(X, Y, support, k, lik, mean, input_transform=tf) for X, Y in clients
    ]
    model = FederatedPITCGP(
        support, SparseSummary.sum(summaries).to(torch.float64), k, lik, mean, input_transform=tf
    )
    X_test = torch.rand(5, d, dtype=torch.float64)
    with torch.no_grad():
        ref = model.posterior(X_test)
        p32 = model.posterior(X_test.float())
        again = model.posterior(X_test)
    assert p32.mean.dtype == torch.float32
    torch.testing.assert_close(again.mean, ref.mean, atol=0, rtol=0)


def test_nested_and_test_time_input_transforms():
    clients, X, Y, k, lik, mean = _exact_setting()
    d = X.shape[-1]
    X_test = torch.rand(5, d, dtype=torch.float64)
    with torch.no_grad():
        s = SparseSummary.sum(compute_local_summary(Xc, Yc, X, k, lik, mean) for Xc, Yc in clients)
    chained = ChainedInputTransform(norm=Normalize(d))
    with pytest.raises(ValueError, match="learns"):
        FederatedPITCGP(X, s, k, lik, mean, input_transform=chained)
    cases = {
        "chained": lambda: ChainedInputTransform(norm=Normalize(d)),
        "warp": lambda: Warp(d, indices=list(range(d))),  # holds a learnable Normalize
        "perturbation": lambda: InputPerturbation(
            torch.rand(3, d, dtype=torch.float64, generator=torch.Generator().manual_seed(0)) * 0.05
        ),
    }
    for name, make in cases.items():
        with torch.no_grad():
            model = FederatedPITCGP.from_client_data(
                clients, X, k, lik, mean, input_transform=make(), jitter=1e-12
            )
            stgp = SingleTaskGP(
                X,
                Y,
                covar_module=k,
                likelihood=lik,
                mean_module=mean,
                outcome_transform=None,
                input_transform=make(),
            ).eval()
            p, q = model.posterior(X_test), stgp.posterior(X_test)
        torch.testing.assert_close(p.mean, q.mean, atol=1e-6, rtol=0, msg=name)
        torch.testing.assert_close(p.variance, q.variance, atol=1e-6, rtol=0, msg=name)


def test_float32_modules_that_do_not_promote_dtypes():
    clients, support, _, _, _ = _setting(torch.float32)
    d = support.shape[-1]
    X_test = torch.rand(4, d)
    posts, states = {}, None
    for dtype in (torch.float32, torch.float64):
        k = ScaleKernel(PolynomialKernel(2)).to(dtype)
        lik = GaussianLikelihood().to(dtype)
        lik.noise = 0.05
        mean = LinearMean(d).to(dtype)
        with torch.no_grad():
            mean.weights.fill_(0.3)
            mean.bias.fill_(-0.2)  # (initialised at random)
            if states is not None:  # the float32 modules' (rounded) values, in float64
                for module, state in zip((k, lik, mean), states, strict=True):
                    module.load_state_dict(state)
            states = [module.state_dict() for module in (k, lik, mean)]
            data = [(X.to(dtype), Y.to(dtype)) for X, Y in clients]
            model = FederatedPITCGP.from_client_data(data, support.to(dtype), k, lik, mean)
            posts[dtype] = model.posterior(X_test.to(dtype))
    assert posts[torch.float32].mean.dtype == torch.float32
    # the float32 model computes in float64 with float64 copies of its modules' values
    # (call64), as the float64 model holding the same values and data: the same float64
    # computation, then the rounding of the outputs to float32 (<= eps32 / 2 relative;
    # <= 1 ulp <= eps32 relative should the float64 results differ in their last bits)
    assert_close(
        posts[torch.float32].mean,
        posts[torch.float64].mean,
        dtype=torch.float32,
        factor=1,
        scale=posts[torch.float64].mean.abs().max(),
    )


def test_chained_outcome_transform_is_trained_as_single_task_gp_does():
    clients, X, Y, k, lik, mean = _exact_setting()
    clients = [(Xc, Yc.exp()) for Xc, Yc in clients]
    X_test = torch.rand(5, X.shape[-1], dtype=torch.float64)
    make = lambda: ChainedOutcomeTransform(log=Log(), std=Standardize(m=1))  # noqa: E731
    with torch.no_grad():
        model = FederatedPITCGP.from_client_data(
            clients, X, k, lik, mean, outcome_transform=make(), jitter=1e-12
        )
        stgp = SingleTaskGP(
            X,
            Y.exp(),
            covar_module=k,
            likelihood=lik,
            mean_module=mean,
            outcome_transform=make(),
        ).eval()
        p, q = model.posterior(X_test), stgp.posterior(X_test)
    torch.testing.assert_close(p.mean, q.mean, atol=1e-6, rtol=1e-6)


def test_condition_on_observations_validates_its_data():
    clients, support, k, lik, mean = _setting()
    d = support.shape[-1]
    model = FederatedPITCGP.from_client_data(clients, support, k, lik, mean)
    X = torch.rand(2, 3, d, dtype=torch.float64)
    Y = torch.zeros(2, 3, 1, dtype=torch.float64)
    with pytest.raises(BotorchTensorDimensionError, match="`Y`.*broadcast"):
        model.condition_on_observations(X, torch.zeros(4, 3, 1, dtype=torch.float64))
    with pytest.raises(BotorchTensorDimensionError, match="`noise`"):
        model.condition_on_observations(X, Y, noise=torch.ones(2, 2, 1, dtype=torch.float64))
    with pytest.raises(InputDataError, match="`noise`.*positive"):
        model.condition_on_observations(X, Y, noise=-torch.ones(2, 3, 1, dtype=torch.float64))
    with pytest.raises(InputDataError, match="`noise`.*NaN"):
        model.condition_on_observations(X, Y, noise=torch.full((2, 3, 1), float("nan")).double())
    with pytest.raises(InputDataError, match="`Y`.*NaN"):
        model.condition_on_observations(X, Y * float("nan"))
    with pytest.raises(TypeError, match="`noise`"):
        model.condition_on_observations(X, Y, noise=[0.1])
    empty = model.fantasize(
        torch.rand(0, d, dtype=torch.float64),
        SobolQMCNormalSampler(sample_shape=torch.Size([2]), seed=0),
    )
    with torch.no_grad():
        torch.testing.assert_close(
            empty.posterior(X[0]).mean[0], model.posterior(X[0]).mean, atol=1e-12, rtol=0
        )


def test_user_mistakes_get_errors_naming_the_cause():
    clients, support, k, lik, mean = _setting()
    X, Y = clients[0]
    with pytest.raises(TypeError, match="`train_X` must be a torch Tensor"):
        compute_local_summary(X.numpy(), Y, support, k, lik, mean)
    bad = [clients[0], (clients[1][0].float(), clients[1][1].float())]
    with pytest.raises(InputDataError, match=r"client_data\[1\].*dtype"):
        FederatedPITCGP.from_client_data(bad, support, k, lik, mean)
    two = [(X, torch.cat([Y, Y], -1))]
    with pytest.raises(UnsupportedError, match=r"client_data\[0\].*2 outputs"):
        FederatedPITCGP.from_client_data(
            two, support, k, lik, mean, outcome_transform=Standardize(m=1)
        )
    nan = [clients[0], (clients[1][0], clients[1][1] * float("nan"))]
    with pytest.raises(InputDataError, match=r"client_data\[1\].*train_Y.*NaN"):
        FederatedPITCGP.from_client_data(nan, support, k, lik, mean)
    # an optimiser step outside the noise constraint: named as a negative noise
    model = FederatedPITCGP.from_client_data(clients, support, k, lik, mean)
    mll = PITCMarginalLogLikelihood(model.likelihood, model, clients)
    with torch.no_grad():
        lik.noise_covar.raw_noise.fill_(-50.0)  # softplus(-50) + 1e-4 bound > 0 ...
        lik.noise_covar.raw_noise_constraint.lower_bound.fill_(-0.5)  # ... unless shifted
    with pytest.raises(InputDataError, match="noise variance must be positive"):
        mll.compute_custom_loss()
