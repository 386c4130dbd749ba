r"""Batched experiment grids (``botorch_fed.experiments``): batched models against
per-member models, the batched search against dense grids and the per-member search,
the grid runner against the protocol runner, seeds, bad input."""

from __future__ import annotations

import json

import pytest
import torch
from botorch.acquisition import UpperConfidenceBound
from botorch.models import SingleTaskGP

from botorch_fed.algorithms import run_federated
from botorch_fed.cli import main
from botorch_fed.experiments import run_grid
from botorch_fed.experiments.batched_gp import (
    batched_gp_state,
    fit_batched_gp,
    maximize_batched_ucb,
)
from botorch_fed.protocol import BOSettings, FederationSetup

SMALL = BOSettings(num_init=4, num_rounds=2)


def _data(B, n, d, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    X = torch.rand(B, n, d, generator=g, dtype=torch.float64)
    Y = torch.sin(6 * X).sum(-1, keepdim=True) + 0.05 * torch.randn(
        B, n, 1, generator=g, dtype=torch.float64
    )
    return X.to(dtype), Y.to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_a_batched_model_is_its_members_models(dtype):
    X, Y = _data(3, 12, 2, dtype)
    batched = fit_batched_gp(X, Y, maxiter=50, seed=0)
    state = batched_gp_state(batched)
    Xt = torch.rand(7, 2, dtype=dtype)
    mean_b = batched.posterior(Xt.expand(3, 7, 2)).mean
    var_b = batched.posterior(Xt.expand(3, 7, 2)).variance
    for b in range(3):  # the member's hyperparameters in a model of its own data alone
        single = SingleTaskGP(X[b], Y[b])
        member = {k: v[b] if v.dim() and v.shape[0] == 3 else v for k, v in state.items()}
        single.load_state_dict(member, strict=False)
        single.eval()
        post = single.posterior(Xt)
        tol = 1e-10 if dtype == torch.float64 else 2e-4
        torch.testing.assert_close(mean_b[b], post.mean, rtol=tol, atol=tol)
        torch.testing.assert_close(var_b[b], post.variance, rtol=tol, atol=tol)


def test_the_batched_fit_reaches_each_members_own_fit():
    from botorch_fed.models.exact_gp import fit_exact_gp

    X, Y = _data(3, 15, 2, torch.float64, seed=1)
    batched = fit_batched_gp(X, Y, seed=0)
    mll_b = _mll(batched)
    for b in range(3):
        own = fit_exact_gp(X[b], Y[b], seed=0)
        # BoTorch fits a batched model member by member: each reaches its own fit's
        # likelihood up to the optimiser's tolerance
        assert mll_b[b] >= _mll(own) - 1e-3 * abs(_mll(own))


def _mll(model):
    from gpytorch.mlls import ExactMarginalLogLikelihood

    model.train()
    mll = ExactMarginalLogLikelihood(model.likelihood, model)
    with torch.no_grad():
        out = mll(model(*model.train_inputs), model.train_targets)
    model.eval()
    return out * model.train_targets.shape[-1]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_batched_ucb_search_finds_each_members_maximum(dtype):
    X, Y = _data(4, 10, 1, dtype, seed=2)
    model = fit_batched_gp(X, Y, maxiter=30, seed=0)
    x, values = maximize_batched_ucb(
        model, beta=2.0, num_restarts=4, raw_samples=64, seeds=[3, 4, 5, 6]
    )
    assert x.shape == (4, 1) and values.shape == (4,)
    grid = torch.linspace(0, 1, 2001, dtype=dtype).reshape(-1, 1, 1)
    ucb = UpperConfidenceBound(model, beta=2.0)
    with torch.no_grad():
        dense = ucb(grid.unsqueeze(1).expand(-1, 4, 1, 1))  # 2001 x 4: every member
        at_x = ucb(x.unsqueeze(-2).unsqueeze(0)).squeeze(0)
    torch.testing.assert_close(at_x, values, rtol=1e-6, atol=1e-6)
    # a dense grid's best (spacing 5e-4) is not better than the search's beyond its resolution
    assert bool((values >= dense.max(dim=0).values - 1e-4).all())


def test_the_batched_search_does_as_well_as_optimize_acqf_on_each_member():
    from botorch.optim import optimize_acqf

    X, Y = _data(6, 15, 4, torch.float64, seed=5)
    model = fit_batched_gp(X, Y, maxiter=50, seed=0)
    state = batched_gp_state(model)
    x, values = maximize_batched_ucb(
        model, beta=1.5, num_restarts=3, raw_samples=32, seeds=range(6)
    )
    bounds = torch.stack([torch.zeros(4), torch.ones(4)]).double()
    for b in range(6):  # the member alone, searched by optimize_acqf with more effort
        single = SingleTaskGP(X[b], Y[b])
        single.load_state_dict(
            {k: v[b] if v.dim() and v.shape[0] == 6 else v for k, v in state.items()}, strict=False
        )
        single.eval()
        _, best = optimize_acqf(UpperConfidenceBound(single, beta=1.5), bounds, q=1,
                                num_restarts=8, raw_samples=256)  # fmt: skip
        assert float(values[b]) >= float(best) - 1e-3 * abs(float(best)) - 1e-6


def test_a_members_search_does_not_depend_on_the_other_members():
    X, Y = _data(3, 12, 3, torch.float64, seed=7)
    both = maximize_batched_ucb(fit_batched_gp(X, Y, maxiter=30), 2.0, num_restarts=2,
                                raw_samples=16, seeds=[11, 12, 13])[0]  # fmt: skip
    alone = maximize_batched_ucb(fit_batched_gp(X[1:2], Y[1:2], maxiter=30), 2.0, num_restarts=2,
                                 raw_samples=16, seeds=[12])[0]  # fmt: skip
    torch.testing.assert_close(both[1:2], alone, rtol=1e-6, atol=1e-8)


def test_a_replications_result_does_not_depend_on_the_grid_it_ran_in():
    setup = FederationSetup(problem="hartmann", dim=6, num_clients=2, seed=1)
    settings = BOSettings(num_init=4, num_rounds=3, num_restarts=2, raw_samples=16)
    in_pair = run_grid("local", setup, settings, seeds=[1, 2])[1]
    alone = run_grid("local", setup, settings, seeds=[2])[0]
    assert alone.best_per_round[-1] < alone.best_per_round[0]  # the searches mattered
    assert in_pair.best_per_round == pytest.approx(alone.best_per_round, rel=1e-9)
    assert in_pair.best_per_client == pytest.approx(alone.best_per_client, rel=1e-9)


def test_central_batches_are_distinct_points_of_sequential_greedy_qucb():
    from botorch_fed.experiments.batched_gp import maximize_batched_qucb

    X, Y = _data(2, 12, 2, torch.float64, seed=8)
    model = fit_batched_gp(X, Y, maxiter=30)
    batch = maximize_batched_qucb(model, 2.0, 3, num_restarts=2, raw_samples=32, seeds=[1, 2])
    assert batch.shape == (2, 3, 2)
    for b in range(2):  # each point chosen with the earlier ones pending: no repeats
        assert float(torch.pdist(batch[b]).min()) > 1e-3


def test_the_local_grid_fits_and_searches_on_the_protocols_schedule(monkeypatch):
    from botorch_fed.experiments import grid as grid_module

    calls, betas = [], []
    real_fit, real_search = grid_module.fit_batched_gp, grid_module.maximize_batched_ucb

    def fit(X, Y, **kw):
        calls.append((X.shape[1], kw["refit"], kw["warm_start"] is not None))
        return real_fit(X, Y, **kw)

    def search(model, beta, **kw):
        betas.append(beta)
        return real_search(model, beta, **kw)

    monkeypatch.setattr(grid_module, "fit_batched_gp", fit)
    monkeypatch.setattr(grid_module, "maximize_batched_ucb", search)
    settings = BOSettings(
        num_init=3, num_rounds=5, local_refit_every=2, num_restarts=2, raw_samples=16
    )
    run_grid("local", FederationSetup(problem="branin", num_clients=2), settings)
    # round t: data of init + t - 1 points; refit at t = 1, 3, 5, warm-started after the first
    assert calls == [
        (3, True, False),
        (4, False, True),
        (5, True, True),
        (6, False, True),
        (7, True, True),
    ]
    assert betas == [settings.beta_at(t, 2) for t in range(1, 6)]


def test_random_search_grid_takes_the_protocol_runners_decisions():
    setup = FederationSetup(
        problem="hartmann", dim=6, num_clients=3, seed=4, shift=0.05, rotation=0.1
    )
    for result in run_grid("random", setup, SMALL, seeds=[4, 9]):
        own = run_federated("random", FederationSetup(problem="hartmann", dim=6, num_clients=3,
                            seed=result.seed, shift=0.05, rotation=0.1), SMALL)  # fmt: skip
        assert result.best_per_round == own.best_per_round
        assert result.best_per_client == own.best_per_client
        assert result.optimal_value == own.optimal_value


def test_a_local_grid_starts_from_the_protocol_runners_initial_designs_and_is_seeded():
    setup = FederationSetup(problem="branin", num_clients=2, seed=0)
    grid = run_grid("local", setup, SMALL, seeds=2)
    again = run_grid("local", setup, SMALL, seeds=2)
    for r, a in zip(grid, again, strict=True):
        own = run_federated(
            "local", FederationSetup(problem="branin", num_clients=2, seed=r.seed), SMALL
        )
        assert r.best_per_round[0] == own.best_per_round[0]  # the same initial designs
        assert r.best_per_round == a.best_per_round  # a grid repeats from its seeds
        assert len(r.best_per_round) == 3


@pytest.mark.parametrize(
    "args, match",
    [
        (("fts",), "the batched runner runs"),
        (
            ("local", FederationSetup(problem="branin"), BOSettings(acquisition="ei")),
            "maximises UCB",
        ),
        (("local", FederationSetup(problem="branin"), SMALL, [1, 1]), "distinct"),
        (("local", FederationSetup(problem="branin"), SMALL, True), "a count or a list"),
    ],
)
def test_bad_grids_are_refused(args, match):
    full = list(args) + [FederationSetup(problem="branin"), SMALL, 1][len(args) - 1 :]
    with pytest.raises(ValueError, match=match):
        run_grid(*full[:4])


def test_a_grid_of_the_users_own_black_box_is_refused():
    from botorch_fed.problems.objectives import CallableObjective

    own = CallableObjective(lambda X: X.sum(-1), torch.tensor([[0.0], [1.0]], dtype=torch.float64))
    with pytest.raises(ValueError, match="built-in problems"):
        run_grid("local", FederationSetup(objectives=own, num_clients=2), SMALL)


def test_the_grid_command_writes_records_compare_reuses(tmp_path, capsys, monkeypatch):
    out = tmp_path / "g"
    base = [
        "--problem",
        "branin",
        "--clients",
        "2",
        "--init",
        "4",
        "--rounds",
        "2",
        "--seeds",
        "3",
        "--out",
        str(out),
    ]
    assert main(["grid", "local", *base]) == 0
    rec = json.loads((out / "runs" / "local" / "seed-2.json").read_text())
    assert rec["fingerprint"]["runner"] == "batched"
    from botorch_fed.runs import compare as compare_module

    def no_grid(*args, **kwargs):
        raise AssertionError("the stored runs are reused")

    monkeypatch.setattr(compare_module, "_grid_records", no_grid)
    assert main(["compare", "local", "--batched", *base]) == 0
    assert "3 runs of this comparison are stored" in capsys.readouterr().out
    # the protocol runner's records are another comparison's
    assert main(["compare", "local", *base]) == 2
    assert "runner" in capsys.readouterr().err
    assert main(["compare", "local", "fts", "--batched", *base]) == 2
    assert "fts has no batched runner" in capsys.readouterr().err
    assert main(["compare", "local", "--device", "cpu", *base]) == 2


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_grid_on_cuda_takes_the_cpus_initial_designs():
    setup = FederationSetup(problem="branin", num_clients=2, seed=0)
    cpu = run_grid("local", setup, SMALL, seeds=2)
    gpu = run_grid("local", setup, SMALL, seeds=2, device="cuda")
    assert [r.best_per_round[0] for r in cpu] == [r.best_per_round[0] for r in gpu]


def test_pooled_data_are_in_the_central_servers_order():
    from botorch_fed.experiments.grid import _pooled

    R, M, init, t = 2, 3, 2, 2
    # member (r, i)'s j-th point carries (r, i, j)
    Z = torch.tensor([[[r, i, j] for j in range(init + t)] for r in range(R) for i in range(M)])
    pooled = _pooled(Z, M, init)
    for r in range(R):
        expected = [[r, i, j] for i in range(M) for j in range(init)]  # uploads of round 1
        expected += [[r, i, j] for j in range(init, init + t) for i in range(M)]  # then rounds
        assert pooled[r].tolist() == expected


def test_a_central_grid_hands_each_client_one_point_of_its_replications_batch():
    setup = FederationSetup(problem="branin", num_clients=2, seed=3)
    settings = BOSettings(num_init=3, num_rounds=1, num_restarts=2, raw_samples=16)
    grid = run_grid("central", setup, settings, seeds=2)
    for r in grid:
        own = run_federated(
            "central", FederationSetup(problem="branin", num_clients=2, seed=r.seed), settings
        )
        assert r.best_per_round[0] == own.best_per_round[0]
        assert len(r.best_per_round) == 2 and set(r.best_per_client) == {0, 1}


def test_each_members_search_is_the_protocol_clients_search_on_its_model():
    from botorch_fed.acquisition import maximize_step_acquisition

    X, Y = _data(4, 12, 3, torch.float64, seed=9)
    model = fit_batched_gp(X, Y, maxiter=40, seed=0)
    state = batched_gp_state(model)
    seeds = [101, 202, 303, 404]
    x, _ = maximize_batched_ucb(model, 1.7, num_restarts=3, raw_samples=24, seeds=seeds)
    bounds = torch.stack([torch.zeros(3), torch.ones(3)]).double()
    for b, s in enumerate(seeds):
        single = SingleTaskGP(X[b], Y[b])
        single.load_state_dict(
            {k: v[b] if v.dim() and v.shape[0] == 4 else v for k, v in state.items()}, strict=False
        )
        single.eval()
        own = maximize_step_acquisition(UpperConfidenceBound(single, beta=1.7), bounds, seed=s,
                                        num_restarts=3, raw_samples=24)  # fmt: skip
        # the same raw samples, starting points and L-BFGS-B problems: the same point up to
        # the batched model's rounding (its members' kernels computed in one batch)
        torch.testing.assert_close(x[b : b + 1], own, rtol=0, atol=1e-6)
