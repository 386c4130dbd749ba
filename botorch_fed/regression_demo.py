r"""The ``botorch-fed demo`` job: federated sparse-GP regression on simulated clients.

``M`` simulated clients each hold private noisy samples of a test function, drawn
from different regions of the domain. Three ways of modelling the function are
compared on a common test set:

(a) each client's own exact GP (no collaboration),
(b) the federated dPITC model of [FBO-FedGP]: federated outcome standardisation,
    federated k-means support set (Alg. 1), federated hyperparameters (exact PITC
    marginal likelihood over aggregated summaries, or the average of local fits),
    and the model built from the aggregated whitened summaries,
(c) an exact GP on the pooled data (the non-private oracle).

Every sum over clients goes through one ``aggregate`` callable (default: plain sums;
``botorch_fed.secure.make_aggregator`` gives a secure one).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import cast

import torch
from botorch.models import SingleTaskGP
from botorch.models.utils.gpytorch_modules import (
    get_covar_module_with_dim_scaled_prior,
    get_gaussian_likelihood_with_lognormal_prior,
)
from botorch.utils.sampling import draw_sobol_samples
from botorch.utils.transforms import unnormalize
from gpytorch.means import ConstantMean
from torch import Tensor

from botorch_fed.inducing import global_support, local_centers
from botorch_fed.models import (
    FederatedPITCGP,
    PITCFitClient,
    PITCHyperparameters,
    SparseSummary,
    fit_exact_gp,
)
from botorch_fed.protocol.federated_fit import (
    Aggregate,
    fit_federated_pitc,
    fit_local_average,
    plain_sum,
    standardize_outcomes,
)
from botorch_fed.test_functions import get_test_function

FIT_STRATEGIES = ("federated", "average")


@dataclass
class RegressionDemoConfig:
    r"""Settings of the regression demo.

    Attributes:
        function: Test function name (any name ``get_test_function`` accepts).
        dim: Input dimension (``None``: the function's default).
        num_clients: Number of clients ``M``.
        points_per_client: Average number of observations per client (client sizes
            vary, roughly between half and one and a half times this, and sum to
            exactly ``num_clients * points_per_client``).
        support_size: Support-set size ``|S|``.
        noise_std: Observation noise, as a fraction of the function's standard
            deviation over the domain.
        region_width: Side of each client's sampling box in the unit cube.
        fit: ``"federated"`` (exact PITC marginal likelihood) or ``"average"``.
        num_test: Number of test points (scrambled Sobol over the domain).
        seed: Seed of everything random.
    """

    function: str = "branin"
    dim: int | None = None
    num_clients: int = 5
    points_per_client: int = 60
    support_size: int = 32
    noise_std: float = 0.05
    region_width: float = 0.4
    fit: str = "federated"
    num_test: int = 1000
    seed: int = 0

    def validate(self) -> None:
        r"""Raise ``ValueError`` naming the first invalid setting."""
        checks = [
            ("num_clients", self.num_clients >= 1, "must be >= 1"),
            ("points_per_client", self.points_per_client >= 2, "must be >= 2"),
            ("support_size", self.support_size >= 1, "must be >= 1"),
            ("noise_std", 0 < self.noise_std < math.inf, "must be positive and finite"),
            ("region_width", 0 < self.region_width <= 1, "must be in (0, 1]"),
            ("num_test", self.num_test >= 1, "must be >= 1"),
            ("fit", self.fit in FIT_STRATEGIES, f"must be one of {FIT_STRATEGIES}"),
        ]
        for name, ok, why in checks:
            if not ok:
                raise ValueError(f"`{name}`={getattr(self, name)!r} {why}.")


@dataclass
class DemoRow:
    r"""One line of the result table."""

    method: str
    rmse: float
    nll: float
    fit_s: float
    predict_s: float
    num_data: int
    extra: dict = field(default_factory=dict)


def _metrics(model, X_test: Tensor, y_test: Tensor) -> tuple[float, float, float]:
    r"""Test RMSE and mean NLL of the noisy test targets, and prediction time."""
    t0 = time.perf_counter()
    with torch.no_grad():
        post = model.posterior(X_test.unsqueeze(-2), observation_noise=True)
        mean = post.mean.reshape(-1)
        var = post.variance.reshape(-1).clamp_min(1e-12)
    elapsed = time.perf_counter() - t0
    rmse = (mean - y_test).pow(2).mean().sqrt().item()
    nll = (0.5 * (var.log() + (y_test - mean).pow(2) / var + math.log(2 * math.pi))).mean()
    return rmse, nll.item(), elapsed


def _exact_gp(X: Tensor, Y: Tensor) -> tuple[SingleTaskGP, float]:
    t0 = time.perf_counter()
    model = fit_exact_gp(X, Y)  # restarts from the global RNG, seeded by the demo
    return model, time.perf_counter() - t0


def client_sizes(num_clients: int, mean_size: int, generator: torch.Generator) -> list[int]:
    r"""Unequal client sizes (weights uniform in [0.5, 1.5]) that sum to exactly
    ``num_clients * mean_size``, each at least 2."""
    total = num_clients * mean_size
    w = 0.5 + torch.rand(num_clients, generator=generator, dtype=torch.float64)
    sizes = (w / w.sum() * (total - 2 * num_clients)).floor().long() + 2
    sizes[: total - int(sizes.sum())] += 1  # distribute the rounding remainder
    return sizes.tolist()


def simulate_clients(config: RegressionDemoConfig):
    r"""Clients' private data (in the unit cube), the test set and the function.

    Returns:
        ``(clients, X_test, y_test, function)`` with ``clients`` a list of
        ``(X_i, Y_i)`` pairs.
    """
    config.validate()
    fn = get_test_function(config.function, dim=config.dim)
    d = fn.dim
    dtype = torch.float64
    # a buffer BoTorch registers without declaring it (typed Tensor | Module)
    bounds = cast(Tensor, fn.bounds).to(dtype)
    g = torch.Generator().manual_seed(config.seed)

    def f(X: Tensor) -> Tensor:
        return fn.evaluate_true(unnormalize(X, bounds))

    X_test = draw_sobol_samples(
        torch.stack([torch.zeros(d), torch.ones(d)]).to(dtype), config.num_test, 1, seed=config.seed
    ).squeeze(-2)
    f_test = f(X_test)
    noise = config.noise_std * f_test.std().item()
    y_test = f_test + noise * torch.randn(config.num_test, generator=g, dtype=dtype)
    clients = []
    w = config.region_width
    for n in client_sizes(config.num_clients, config.points_per_client, g):
        corner = (1 - w) * torch.rand(d, generator=g, dtype=dtype)
        X = corner + w * torch.rand(n, d, generator=g, dtype=dtype)
        Y = f(X) + noise * torch.randn(n, generator=g, dtype=dtype)
        clients.append((X, Y.unsqueeze(-1)))
    return clients, X_test, y_test, fn


def run_regression_demo(
    config: RegressionDemoConfig,
    aggregate: Aggregate | None = None,
    on_stage: Callable[[str], None] | None = None,
) -> dict:
    r"""Run the demo and return its results.

    Args:
        config: The settings.
        aggregate: ``list of arrays -> sum`` used for every server-side sum
            (default plaintext).
        on_stage: Called with a short description as each stage starts (progress).

    Returns:
        A dict with ``config``, ``rows`` (list of :class:`DemoRow` as dicts) and
        ``federated`` details (support size, aggregation rounds, timings).
    """
    aggregate = aggregate or plain_sum
    stage = on_stage or (lambda _: None)
    torch.manual_seed(config.seed)  # BoTorch's fit uses the global RNG for restarts
    stage("simulating clients")
    clients, X_test, y_test, fn = simulate_clients(config)
    rows: list[DemoRow] = []

    for i, (X, Y) in enumerate(clients):
        stage(f"client {i} fits its own GP")
        model, fit_s = _exact_gp(X, Y)
        rmse, nll, pred_s = _metrics(model, X_test, y_test)
        rows.append(DemoRow(f"client {i} own GP", rmse, nll, fit_s, pred_s, len(X)))

    stage("federated dPITC: support set and hyperparameters")
    timings = {}
    t0 = time.perf_counter()
    tf = standardize_outcomes([Y for _, Y in clients], aggregate)  # two secure sums
    clients_tf = [(X, tf(Y)[0]) for X, Y in clients]
    k_local = max(1, math.ceil(2 * config.support_size / config.num_clients))
    centers = [
        local_centers(X, k=k_local, seed=config.seed + i, min_cluster_size=2)
        for i, (X, _) in enumerate(clients)
    ]
    support = global_support(centers, config.support_size, seed=config.seed)
    timings["support_s"] = time.perf_counter() - t0
    d = support.shape[-1]
    covar_module = get_covar_module_with_dim_scaled_prior(d).to(torch.float64)
    likelihood = get_gaussian_likelihood_with_lognormal_prior().to(torch.float64)
    mean_module = ConstantMean().to(torch.float64)
    fit_clients = [
        PITCFitClient(X, Y, support, covar_module, likelihood, mean_module) for X, Y in clients_tf
    ]
    t0 = time.perf_counter()
    if config.fit == "federated":
        result = fit_federated_pitc(
            fit_clients, support, covar_module, likelihood, mean_module, aggregate=aggregate
        )
        rounds = result.num_rounds
    else:
        fit_local_average(fit_clients, covar_module, likelihood, mean_module, aggregate=aggregate)
        rounds = 1
    timings["hyperparameters_s"] = time.perf_counter() - t0
    stage("federated dPITC: aggregate summaries and predict")
    t0 = time.perf_counter()
    theta = PITCHyperparameters(covar_module, likelihood, mean_module).get_theta()
    packed = aggregate([c.summary(theta) for c in fit_clients])
    model = FederatedPITCGP(
        support,
        SparseSummary.from_numpy(packed, len(support)),
        covar_module,
        likelihood,
        mean_module,
        outcome_transform=tf,
    )
    timings["summaries_s"] = time.perf_counter() - t0
    rmse, nll, pred_s = _metrics(model, X_test, y_test)
    fit_s = sum(timings.values())
    n_total = sum(len(X) for X, _ in clients)
    rows.append(
        DemoRow(
            f"federated dPITC (|S|={len(support)})",
            rmse,
            nll,
            fit_s,
            pred_s,
            n_total,
            extra={**timings, "aggregation_rounds": rounds + 3},  # + moments (2), summaries
        )
    )

    stage("exact GP on pooled data (non-private oracle)")
    X_all = torch.cat([X for X, _ in clients])
    Y_all = torch.cat([Y for _, Y in clients])
    model, fit_s = _exact_gp(X_all, Y_all)
    rmse, nll, pred_s = _metrics(model, X_test, y_test)
    rows.append(DemoRow("exact GP, pooled data", rmse, nll, fit_s, pred_s, n_total))
    return {
        "config": {**asdict(config), "function": type(fn).__name__, "dim": fn.dim},
        "rows": [asdict(r) for r in rows],
    }
