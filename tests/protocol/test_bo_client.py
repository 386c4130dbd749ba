r"""BOClient builds and maximises acquisitions through step_acquisition, fits through
fit_exact_gp: checked against BoTorch computations written out here."""

from __future__ import annotations

import math

import pytest
import torch
from botorch.acquisition import LogExpectedImprovement, UpperConfidenceBound
from botorch.acquisition.thompson_sampling import PathwiseThompsonSampling
from botorch.fit import fit_gpytorch_mll
from botorch.models import SingleTaskGP
from botorch.optim import optimize_acqf
from botorch.utils.sampling import draw_sobol_samples
from gpytorch.mlls import ExactMarginalLogLikelihood

from botorch_fed.acquisition import (
    CachedUpperConfidenceBound,
    make_step_acquisition,
    propose_step_candidate,
    ranked_step_candidates,
    thompson_sample_candidate,
)
from botorch_fed.algorithms import build_federation
from botorch_fed.algorithms.fts.client import FTSClient, RandomFourierFeatures
from botorch_fed.models.exact_mll import exact_mll_closure
from botorch_fed.problems.heterogeneity import ClientObjective
from botorch_fed.protocol import BOSettings, FederationSetup, Message
from botorch_fed.protocol.bo_client import MIN_DISTANCE, BOClient, Init
from botorch_fed.test_functions import get_test_function
from tests.helpers.tolerances import assert_within, gp_posterior_error_factors, sqrt_error
from tests.helpers.toy_models import kernel_rounding, make_pitc

SEED = 3
T = 4  # the round of the steps below


pytestmark = pytest.mark.usefixtures("quiet_single_thread")


def _settings(**kwargs) -> BOSettings:
    base = dict(num_init=6, num_restarts=2, raw_samples=16, maxiter=20, ts_candidates=64)
    base.update(kwargs)
    return BOSettings(**base)


def _client(cls=BOClient, **kwargs) -> BOClient:
    settings = _settings(**kwargs.pop("settings", {}))
    client = cls(0, ClientObjective(get_test_function("branin")), settings, SEED, **kwargs)
    client.on_init(Init())
    return client


def _search(s: BOSettings) -> dict:
    # BOClient's documented search of a single step: at least 4 raw samples per restart
    return dict(
        num_restarts=s.num_restarts,
        raw_samples=max(s.raw_samples, 4 * s.num_restarts),
        maxiter=s.maxiter,
    )


def _beta(t: int, d: int) -> float:
    return 0.2 * d * math.log(2 * t)  # beta_t = 0.2 d log(2t), written out


def _ucb_rounding_bound(model: SingleTaskGP, X: torch.Tensor, beta: float) -> torch.Tensor:
    r"""Bound on the difference of two float64 evaluations of ``UCB = m + sqrt(beta) s``
    of a fitted ``SingleTaskGP`` (RBF kernel, ``Standardize``) at ``n x 1 x d`` points.

    Each evaluation is within ``eps f_mean`` (mean) and ``eps f_var`` (variance) of the
    exact posterior of the standardised targets
    (:func:`~tests.helpers.tolerances.gp_posterior_error_factors`; ``kappa`` of the
    kernel entries from :func:`~tests.helpers.toy_models.kernel_rounding` on the inputs
    scaled by the lengthscales), the variance error enters ``s`` through
    :func:`~tests.helpers.tolerances.sqrt_error`; ``Standardize`` scales them by the
    outcome std and adds its own roundings, and UCB's sum one more. Twice that: two
    evaluations.
    """
    eps = torch.finfo(torch.float64).eps
    X_train, y = model.train_inputs[0], model.train_targets
    Xt = model.transform_inputs(X).reshape(-1, X.shape[-1])
    kernel = model.covar_module
    with torch.no_grad():
        K = kernel(X_train).to_dense()
        K = K + model.likelihood.noise.reshape(()) * torch.eye(len(X_train), dtype=K.dtype)
        K_s, k_ss = kernel(Xt, X_train).to_dense(), kernel(Xt, diag=True).to_dense()
        c = model.mean_module.constant.reshape(())
        kappa = kernel_rounding(torch.cat([X_train, Xt]) / kernel.lengthscale.reshape(-1), 1.0)
        f_mean, f_var = gp_posterior_error_factors(
            K, K_s, k_ss, y - c, kappa, r_mag=y.abs() + c.abs()
        )
        var = (k_ss - (K_s * torch.linalg.solve(K, K_s.mT).mT).sum(-1)).clamp_min(0)
        mean = c + K_s @ torch.linalg.solve(K, y - c)
    shift = model.outcome_transform.means.reshape(())
    s = model.outcome_transform.stdvs.reshape(())
    root = math.sqrt(beta)
    latent = eps * f_mean + root * sqrt_error(var, eps * f_var)
    # m = shift + s m_std, sigma = s sigma_std and m + root sigma: two roundings each
    final = 2 * eps * (shift.abs() + s * mean.abs() + root * s * var.sqrt())
    return 2 * (s * latent + final)


def test_ucb_uses_a_float64_beta():
    client = _client()
    model = client.local_model()
    acqf = client.make_acquisition(model, T)
    assert type(acqf) is CachedUpperConfidenceBound and isinstance(acqf, UpperConfidenceBound)
    assert acqf.beta.dtype == torch.float64 and acqf.beta.item() == _beta(T, 2)
    X = draw_sobol_samples(client.bounds, n=32, q=1, seed=0)
    with torch.no_grad():
        post = model.posterior(X)
        expected = post.mean.reshape(-1) + math.sqrt(_beta(T, 2)) * post.variance.sqrt().reshape(-1)
        value = acqf(X)
        # the acquisition's moments come from its cached factors, the expected ones from
        # model.posterior: two float64 computations of one posterior
        bound = _ucb_rounding_bound(model, X, _beta(T, 2))
        assert_within(value, expected, bound)
        # the check has teeth: BoTorch's class given the Python float rounds beta to
        # float32 (the default dtype), an error ~1e-8 relative -- far outside it
        float32_beta = UpperConfidenceBound(model, beta=_beta(T, 2))
        assert float32_beta.beta.dtype == torch.float32
        with pytest.raises(AssertionError):
            assert_within(float32_beta(X), expected, bound)
    # the same acquisition as make_step_acquisition's
    with torch.no_grad():
        ref = make_step_acquisition("ucb", model, beta=_beta(T, 2))
        assert torch.equal(value, ref(X))


@pytest.mark.parametrize("kind", ["ucb", "ei"])
def test_ucb_and_ei_steps_are_propose_step_candidate(kind):
    client = _client(settings={"acquisition": kind})
    model = client.local_model()
    state = torch.random.get_rng_state()
    x = client.acquire(model, T)
    assert torch.equal(torch.random.get_rng_state(), state)
    args = {"beta": _beta(T, 2)} if kind == "ucb" else {"best_f": client.Y.max()}
    ref = propose_step_candidate(
        kind, model, client.bounds, seed=client.step_seed(T), **args, **_search(client.settings)
    )
    assert x.shape == (1, 2) and torch.equal(x, ref.clamp(0.0, 1.0))
    # the search climbs from its best raw sample (seed s + 2)
    acqf = client.make_acquisition(model, T)
    assert isinstance(acqf, UpperConfidenceBound if kind == "ucb" else LogExpectedImprovement)
    raw = draw_sobol_samples(client.bounds, n=16, q=1, seed=client.step_seed(T) + 2)
    with torch.no_grad():
        assert acqf(x.unsqueeze(0)) >= acqf(raw).max()


def test_thompson_step_on_the_local_gp_is_pathwise():
    client = _client(settings={"acquisition": "ts"})
    model = client.local_model()
    s = client.step_seed(T)
    x = client.acquire(model, T)
    ref = propose_step_candidate(
        "ts", model, client.bounds, seed=s, num_candidates=64, **_search(client.settings)
    )
    assert torch.equal(x, ref.clamp(0.0, 1.0))
    # independently: the path drawn from the step's seed, written with BoTorch's class
    path = PathwiseThompsonSampling(model)
    with torch.random.fork_rng():
        torch.manual_seed(s)
        path.redraw(batch_size=1)
    path.batch_size = 1
    raw = draw_sobol_samples(client.bounds, n=16, q=1, seed=s + 2)
    grid = draw_sobol_samples(client.bounds, n=1024, q=1, seed=99)
    with torch.no_grad():
        at_x = path(x.unsqueeze(0))
        assert at_x >= path(raw).max()  # x maximises that path (from the best raw point)
        assert at_x >= path(grid).max() - 0.05 * path(grid).abs().max()
    # ... and is not discrete Thompson sampling's pick from a Sobol set
    _, X_cand, _ = thompson_sample_candidate(model, client.bounds, 64, seed=s, return_sample=True)
    assert not (X_cand == x).all(-1).any()


def test_thompson_step_on_a_model_without_pathwise_sampling_is_discrete():
    client = _client(settings={"acquisition": "ts"})
    g = torch.Generator().manual_seed(1)
    data = [(torch.rand(5, 2, generator=g, dtype=torch.float64), None) for _ in range(2)]
    data = [(X, torch.sin(4 * X).sum(-1, keepdim=True)) for X, _ in data]
    pitc = make_pitc(data, torch.rand(4, 2, generator=g, dtype=torch.float64))
    x = client.acquire(pitc, T)
    ref = thompson_sample_candidate(pitc, client.bounds, 64, seed=client.step_seed(T))
    assert torch.equal(x, ref)


@pytest.mark.parametrize("kind", ["ucb", "ei"])
def test_distinct_batch_takes_ranked_step_candidates_by_rank(kind):
    client = _client(settings={"acquisition": kind})
    model = client.local_model()
    best_f = torch.tensor(0.0, dtype=torch.float64)
    acqf = client.make_acquisition(model, T, best_f=best_f) if kind == "ei" else None
    count, seed = 3, 1234
    xs = [client.acquire(model, T, acqf=acqf, rank=r, count=count, seed=seed) for r in range(4)]
    # count clients: max(restarts, 2 count) restarts, 4 raw samples per restart
    ref_acqf = (
        make_step_acquisition("ucb", model, beta=_beta(T, 2))
        if kind == "ucb"
        else make_step_acquisition("ei", model, best_f=best_f)
    )
    ranked = ranked_step_candidates(
        ref_acqf,
        client.bounds,
        seed=seed,
        num_restarts=6,
        raw_samples=24,
        maxiter=20,
        min_distance=MIN_DISTANCE,
    )
    for r, x in enumerate(xs):
        assert torch.equal(x[0], ranked[min(r, len(ranked) - 1)].clamp(0.0, 1.0))
    X = torch.cat(xs[:count])
    assert (torch.cdist(X, X) + torch.eye(count) > MIN_DISTANCE).all()


def test_local_model_is_the_warm_started_refit():
    settings = {"local_refit_every": 2, "fit_maxiter": 3}
    client = _client(settings=settings)
    seed_of = [(SEED * 1_000_003 + u) % 2**62 for u in range(3)]

    def botorch_fit(u, state=None):
        model = SingleTaskGP(client.X, client.Y)
        if state is not None:
            model.load_state_dict(state, strict=False)
        mll = ExactMarginalLogLikelihood(model.likelihood, model)
        with torch.random.fork_rng():
            torch.manual_seed(seed_of[u])
            # fit_exact_gp's loss closure (tests/models/test_exact_mll.py checks it
            # against BoTorch's)
            fit_gpytorch_mll(
                mll, closure=exact_mll_closure(mll), optimizer_kwargs={"options": {"maxiter": 3}}
            )
        return model

    def same(a, b):
        return all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True))

    m0 = client.local_model()
    assert client.local_model() is m0  # cached until new data arrive
    ref0 = botorch_fit(0)
    assert same(m0, ref0)
    client.evaluate(torch.full((1, 2), 0.3, dtype=torch.float64), 1, "local")
    m1 = client.local_model()  # update 1: update 0's hyperparameters, new data
    assert m1 is not m0 and same(m1, ref0) and m1.train_inputs[0].shape[0] == 7
    client.evaluate(torch.full((1, 2), 0.6, dtype=torch.float64), 2, "local")
    m2 = client.local_model()  # update 2: refit, warm-started from update 0
    state0 = {k: v for k, v in ref0.state_dict().items() if "outcome_transform" not in k}
    assert same(m2, botorch_fit(2, state0))
    assert not same(m2, ref0)


def test_fts_local_step_is_pathwise_thompson_sampling():
    features = RandomFourierFeatures(2, 16, 0.3, seed=0)
    client = _client(FTSClient, features=features)
    model = client.local_model()
    ref = propose_step_candidate(
        "ts", model, client.bounds, seed=client.step_seed(T), **_search(client.settings)
    )
    client._accepted_round = T - 1  # rounds 1..T-1 were the server's
    client.handle(Message("round", {"t": T}))  # no other client's sample: a local step
    assert client.history[-1]["step"] == "local"
    assert torch.equal(client.X[-1:], ref.clamp(0.0, 1.0))


def test_central_batch_thompson_sampling_is_pathwise():
    setup = FederationSetup(problem="branin", dim=2, num_clients=3, seed=0)
    settings = BOSettings(
        num_init=4, num_rounds=1, acquisition="ts", raw_samples=16, maxiter=20, num_restarts=2
    )
    server, _, _ = build_federation("central", setup, settings)
    server.broadcast("init")
    server._collect()
    X = server._batch(1, 3)
    # by hand: the pooled-data GP fitted as documented (seed of update 0), then three
    # pathwise samples drawn from the round's seed and maximised jointly
    model = SingleTaskGP(server.X, server.Y)
    mll = ExactMarginalLogLikelihood(model.likelihood, model)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        fit_gpytorch_mll(mll, closure=exact_mll_closure(mll))  # fit_exact_gp's closure
    model.eval()
    s = 1  # (seed * 1_000_003 + t) % 2^31 with seed 0, t = 1
    acqf = PathwiseThompsonSampling(model)
    with torch.random.fork_rng():
        torch.manual_seed(s)
        acqf.redraw(batch_size=3)
    acqf.batch_size = 3
    with torch.random.fork_rng():
        torch.manual_seed(s + 2)
        ref, _ = optimize_acqf(
            acqf,
            server_bounds(2),
            q=3,
            num_restarts=2,
            raw_samples=16,
            options={"seed": s + 2, "maxiter": 20},
        )
    assert X.shape == (3, 2) and torch.equal(X, ref.clamp(0.0, 1.0))
    assert (torch.cdist(X, X) + torch.eye(3) > 1e-6).all()


def server_bounds(d: int) -> torch.Tensor:
    return torch.stack([torch.zeros(d), torch.ones(d)]).double()
