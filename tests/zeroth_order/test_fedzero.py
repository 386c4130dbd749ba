r"""Tests of FedZero (Alg. 1), its Cor. 3.2 defaults, the server step and the batched
simulation; the optimisation error of the averaged iterate falls like
``sqrt(d / (n m))`` (Cor. 3.2). The federated program (``run_federated``) survives an
iterate on a face of the shrunk domain, honours a context problem's settings, refuses a
malformed sign message and flags an optimum outside Theta."""

from __future__ import annotations

import math

import pytest
import torch

from botorch_fed.algorithms import FedZeroSettings, build_federation, run_federated
from botorch_fed.problems.objectives import CallableObjective
from botorch_fed.protocol import FederationSetup, ProtocolViolation
from botorch_fed.zeroth_order import (
    Box,
    FedZero,
    L1Ball,
    L2Ball,
    fedzero_defaults,
    fedzero_step,
    simulate_fedzero,
)
from tests.helpers.tolerances import assert_close, reordering_factor

F64 = torch.float64


def _l1_problem(d: int = 4, dtype=F64):
    xs = torch.linspace(-0.5, 0.5, d, dtype=dtype)
    dom = Box(-torch.ones(d, dtype=dtype), torch.ones(d, dtype=dtype))
    return (lambda X: (X - xs).abs().sum(-1)), dom, xs


def test_defaults_formula():
    eta, h = fedzero_defaults(2.0, 100, 4, 9)
    assert math.isclose(eta, 0.5 * math.sqrt(4 / 900))
    assert math.isclose(h, 0.5 * math.sqrt(10 / 100))
    for args, name in [
        ((0.0, 1, 1, 1), "L"),
        ((float("nan"), 1, 1, 1), "L"),
        ((1.0, 0, 1, 1), "n"),
        ((1.0, 1, 0, 1), "m"),
        ((1.0, 1, 1, 0), "d"),
        ((1.0, 1.5, 1, 1), "n"),
    ]:
        with pytest.raises(ValueError, match=f"`{name}`"):
            fedzero_defaults(*args)


def test_run_shapes_calls_and_defaults():
    d, m, n = 3, 5, 7
    f0, dom, _ = _l1_problem(d)
    shapes = []

    def f(X):
        shapes.append(tuple(X.shape))
        return f0(X)

    x0 = torch.zeros(d, dtype=F64)
    fz = FedZero(
        f, dom, x0, m, n, lipschitz=math.sqrt(d), generator=torch.Generator().manual_seed(0)
    )
    eta, h = fedzero_defaults(math.sqrt(d), n, m, d)
    assert (fz.eta, fz.h) == (eta, h)
    res = fz.run()
    assert shapes == [(m, d)] * (2 * n)  # one call of f per side per round, all workers
    assert res.iterates.shape == (n, d) and res.average.shape == (d,) and res.last.shape == (d,)
    assert res.values.shape == (n,) and (res.eta, res.h) == (eta, h)
    assert torch.equal(res.iterates[0], x0)
    assert torch.equal(res.average, res.iterates.mean(0))  # the same mean of the same tensor
    assert dom.contains(res.iterates).all() and dom.contains(res.last)
    # given eta overrides only eta
    fz = FedZero(f, dom, x0, m, n, lipschitz=1.0, eta=0.01)
    assert fz.eta == 0.01 and fz.h == fedzero_defaults(1.0, n, m, d)[1]


def test_step_matches_manual_round():
    d, m = 3, 4
    f, dom, _ = _l1_problem(d)
    fz = FedZero(f, dom, torch.zeros(d, dtype=F64), m, 5, eta=0.1, h=0.05)
    x = torch.full((d,), 0.2, dtype=F64)
    x_next, g = fz.step(x, torch.Generator().manual_seed(3))
    from botorch_fed.zeroth_order import l1_gradient

    gw = l1_gradient(f, x.expand(m, d), 0.05, torch.Generator().manual_seed(3))
    # exact: the step runs these operations on these values (h and eta as 0-d tensors
    # instead of floats: the same numbers), elementwise or torch's own m-term mean
    assert torch.equal(g, gw.mean(0))
    assert torch.equal(x_next, dom.project(x - 0.1 * gw.mean(0)))


def test_fedzero_step():
    dom = L2Ball(torch.zeros(2, dtype=F64), 1.0)
    x = torch.tensor([0.5, 0.0], dtype=F64)
    grads = torch.tensor([[-2.0, 0.0], [-4.0, 0.0]], dtype=F64)
    x_next, g = fedzero_step(x, grads, 0.25, dom)
    assert torch.equal(g, torch.tensor([-3.0, 0.0], dtype=F64))
    assert torch.allclose(x_next, torch.tensor([1.0, 0.0], dtype=F64))  # projected
    # batched runs, per-run eta
    xb = torch.zeros(3, 2, dtype=F64)
    gb = torch.ones(3, 4, 2, dtype=F64)
    xn, _ = fedzero_step(xb, gb, torch.tensor([0.1, 0.2, 0.3], dtype=F64), dom)
    assert torch.allclose(xn[:, 0], torch.tensor([-0.1, -0.2, -0.3], dtype=F64))
    with pytest.raises(ValueError, match="`gradients`"):
        fedzero_step(x, torch.ones(3, dtype=F64), 0.1, dom)
    with pytest.raises(ValueError, match="`eta`"):
        fedzero_step(x, grads, 0.0, dom)
    with pytest.raises(ValueError, match="`domain`"):
        fedzero_step(x, grads, 0.1, None)


@pytest.mark.parametrize("estimator", ["l1", "l2"])
def test_simulate_single_run_equals_fedzero(estimator):
    d, m, n = 3, 4, 20
    f, dom, _ = _l1_problem(d)
    x0 = torch.full((d,), -0.7, dtype=F64)
    res = FedZero(
        f,
        dom,
        x0,
        m,
        n,
        eta=0.05,
        h=0.1,
        estimator=estimator,
        generator=torch.Generator().manual_seed(11),
    ).run()
    sim = simulate_fedzero(
        f,
        dom,
        x0,
        1,
        m,
        n,
        0.05,
        0.1,
        estimator=estimator,
        generator=torch.Generator().manual_seed(11),
    )
    # exact: R = 1 runs the same elementwise operations on the same draws (a leading
    # dimension of size 1, which changes no reduction: the worker mean and f's sums still
    # reduce the same m and d values in the same order), so the iterates are bitwise those
    # of FedZero.run; only the average is formed otherwise (a running sum / n instead of
    # the mean of the stacked iterates): n-term sums in two orders
    assert torch.equal(sim.iterates[:, 0], res.iterates)
    assert torch.equal(sim.last[0], res.last)
    assert torch.equal(sim.values[:, 0], res.values)
    scale = float(res.iterates.abs().max())
    assert_close(sim.average[0], res.average, dtype=F64, factor=reordering_factor(n), scale=scale)


def test_simulate_per_run_eta_with_deterministic_estimator():
    # a callable estimator (the exact gradient of a quadratic): per-run step sizes in
    # one program reproduce separate runs
    d, m, n = 2, 3, 15
    dom = L1Ball(torch.zeros(d, dtype=F64), 1.0)
    target = torch.tensor([2.0, -1.0], dtype=F64)
    f = lambda X: 0.5 * ((X - target) ** 2).sum(-1)  # noqa: E731

    def exact(f, X, h, generator=None, context=None, return_values=False):
        g = X - target
        y = f(X)
        return g, torch.zeros_like(X), y, y

    etas = torch.tensor([0.05, 0.1, 0.3], dtype=F64)
    x0 = torch.zeros(d, dtype=F64)
    sim = simulate_fedzero(f, dom, x0, 3, m, n, etas, 0.1, estimator=exact)
    for i in range(3):
        r = FedZero(f, dom, x0, m, n, eta=float(etas[i]), h=0.1, estimator=exact).run()
        # exact: the same elementwise step and per-row projection on the same values
        assert torch.equal(sim.iterates[:, i], r.iterates)
    assert torch.equal(sim.eta, etas) and torch.equal(sim.h, torch.full((3,), 0.1, dtype=F64))


def test_simulate_records_and_contexts():
    R, m, n, d = 5, 3, 12, 2
    A = torch.randn(50, d, dtype=F64, generator=torch.Generator().manual_seed(0))
    b = A @ torch.tensor([0.2, -0.3], dtype=F64)
    shapes, seen = [], []

    def contexts(shape, generator):
        shapes.append(shape)
        return torch.randint(0, 50, shape, generator=generator)

    def f(X, c):  # f_c(x) = |a_c' x - b_c|, one data point per worker
        seen.append(c)
        return ((X * A[c]).sum(-1) - b[c]).abs()

    dom = Box(-torch.ones(d, dtype=F64), torch.ones(d, dtype=F64))
    x0 = torch.zeros(R, d, dtype=F64)
    sim = simulate_fedzero(
        f,
        dom,
        x0,
        R,
        m,
        n,
        0.05,
        0.05,
        contexts=contexts,
        generator=torch.Generator().manual_seed(1),
        record_every=4,
    )
    assert shapes == [(R, m)] * n
    assert len(seen) == 2 * n and all(seen[2 * t] is seen[2 * t + 1] for t in range(n))
    assert sim.rounds.tolist() == [4, 8, 12]
    assert sim.iterates.shape == sim.averages.shape == (3, R, d)
    assert torch.equal(sim.averages[-1], sim.average)  # total / n, recorded at t = n = 12
    assert sim.values.shape == (n, R) and sim.last.shape == (R, d)
    # FedZero passes (m,) shapes
    shapes.clear()
    FedZero(f, dom, torch.zeros(d, dtype=F64), m, 2, eta=0.1, h=0.1, contexts=contexts).run()
    assert shapes == [(m,)] * 2
    none = simulate_fedzero(f, dom, x0, R, m, n, 0.05, 0.05, contexts=contexts, record_every=None)
    assert none.iterates.shape == (0, R, d) and none.rounds.numel() == 0


def test_simulate_float32_stays_in_domain():
    d = 3
    f, dom, _ = _l1_problem(d, torch.float32)
    sim = simulate_fedzero(
        f, dom, torch.zeros(d), 8, 2, 30, 0.5, 0.1, generator=torch.Generator().manual_seed(0)
    )
    assert sim.iterates.dtype == torch.float32
    assert dom.contains(sim.iterates).all() and dom.contains(sim.last).all()


def _slope(xs, ys):
    lx, ly = torch.log(torch.tensor(xs, dtype=F64)), torch.log(torch.tensor(ys, dtype=F64))
    lx = lx - lx.mean()
    return float((lx * (ly - ly.mean())).sum() / (lx**2).sum())


def test_error_falls_with_rounds_and_workers():
    r"""f(x) = ||x - x*||_1 on [-1, 1]^d (L = sqrt(d)), Cor. 3.2 eta and h for each
    (n, m): the error of the averaged iterate falls like (n m)^(-1/2). All horizons of
    one m run in one program (per-run eta, h; the average read at round n)."""
    d, reps = 5, 40
    ns, ms = [64, 128, 256, 512], [1, 4, 16]
    xs = torch.full((d,), 0.3, dtype=F64)
    f = lambda X: (X - xs).abs().sum(-1)  # noqa: E731
    dom = Box(-torch.ones(d, dtype=F64), torch.ones(d, dtype=F64))
    x0 = torch.full((d,), -0.8, dtype=F64)
    L = math.sqrt(d)
    err = torch.zeros(len(ms), len(ns), dtype=F64)
    for i, m in enumerate(ms):
        pars = [fedzero_defaults(L, n, m, d) for n in ns]
        eta = torch.tensor([p[0] for p in pars], dtype=F64).repeat_interleave(reps)
        h = torch.tensor([p[1] for p in pars], dtype=F64).repeat_interleave(reps)
        sim = simulate_fedzero(
            f,
            dom,
            x0,
            len(ns) * reps,
            m,
            max(ns),
            eta,
            h,
            generator=torch.Generator().manual_seed(i),
            record_every=ns[0],
        )
        for k, n in enumerate(ns):
            rec = sim.rounds.tolist().index(n)
            err[i, k] = f(sim.averages[rec, k * reps : (k + 1) * reps]).mean()
    for i in range(len(ms)):
        s = _slope(ns, err[i].tolist())
        assert -0.7 <= s <= -0.35, (ms[i], s, err[i])  # -1/2; n^-1/4 or n^-1 fail
    for k in range(len(ns)):
        s = _slope(ms, err[:, k].tolist())
        assert -0.7 <= s <= -0.35, (ns[k], s, err[:, k])
    # and the rate constant: error <= D L sqrt(d / (n m)) (Cor. 3.2, no log factors needed)
    D = dom.diameter
    bound = torch.tensor([[D * L * math.sqrt(d / (n * m)) for n in ns] for m in ms], dtype=F64)
    assert (err <= bound).all()


def test_bad_inputs():
    d = 2
    f, dom, _ = _l1_problem(d)
    x0 = torch.zeros(d, dtype=F64)
    ok = dict(eta=0.1, h=0.1)
    with pytest.raises(ValueError, match="`x0` must lie in the domain"):
        FedZero(f, dom, torch.full((d,), 2.0, dtype=F64), 2, 3, **ok)
    with pytest.raises(ValueError, match="`x0`"):
        FedZero(f, dom, torch.zeros(3, dtype=F64), 2, 3, **ok)
    with pytest.raises(ValueError, match="`num_workers`"):
        FedZero(f, dom, x0, 0, 3, **ok)
    with pytest.raises(ValueError, match="`num_rounds`"):
        FedZero(f, dom, x0, 2, 0, **ok)
    with pytest.raises(ValueError, match="`eta`"):
        FedZero(f, dom, x0, 2, 3, eta=0.0, h=0.1)
    with pytest.raises(ValueError, match="`eta`"):
        FedZero(f, dom, x0, 2, 3, eta=-1.0, h=0.1)
    with pytest.raises(ValueError, match="`h`"):
        FedZero(f, dom, x0, 2, 3, eta=0.1, h=0.0)
    with pytest.raises(ValueError, match="`lipschitz`"):
        FedZero(f, dom, x0, 2, 3, eta=0.1)
    with pytest.raises(ValueError, match="`estimator`"):
        FedZero(f, dom, x0, 2, 3, estimator="l3", **ok)
    with pytest.raises(ValueError, match="`domain`"):
        FedZero(f, "box", x0, 2, 3, **ok)
    with pytest.raises(ValueError, match="`contexts`"):
        FedZero(f, dom, x0, 2, 3, contexts=3, **ok)
    with pytest.raises(ValueError, match="`f`"):
        FedZero(lambda X: X, dom, x0, 2, 3, **ok).run()  # wrong output shape
    with pytest.raises(ValueError, match="`f` returned non-finite"):
        FedZero(lambda X: X.sum(-1) * float("nan"), dom, x0, 2, 3, **ok).run()
    sim = dict(eta=0.1, h=0.1)
    with pytest.raises(ValueError, match="`num_runs`"):
        simulate_fedzero(f, dom, x0, 0, 2, 3, **sim)
    with pytest.raises(ValueError, match="`x0`"):
        simulate_fedzero(f, dom, torch.zeros(3, d, dtype=F64), 4, 2, 3, **sim)
    with pytest.raises(ValueError, match="`x0` must lie"):
        simulate_fedzero(f, dom, torch.tensor([[0.0, 0.0], [3.0, 0.0]], dtype=F64), 2, 2, 3, **sim)
    with pytest.raises(ValueError, match="`eta`"):
        simulate_fedzero(f, dom, x0, 2, 2, 3, torch.tensor([0.1, -0.1], dtype=F64), 0.1)
    with pytest.raises(ValueError, match="`h`"):
        simulate_fedzero(f, dom, x0, 2, 2, 3, 0.1, torch.ones(3, dtype=F64))
    with pytest.raises(ValueError, match="`record_every`"):
        simulate_fedzero(f, dom, x0, 2, 2, 3, record_every=0, **sim)
    with pytest.raises(ValueError, match="`estimator`"):
        simulate_fedzero(f, dom, x0, 2, 2, 3, estimator="nope", **sim)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_simulation():
    d = 3
    xs = torch.zeros(d, device="cuda", dtype=F64)
    f = lambda X: (X - xs).abs().sum(-1)  # noqa: E731
    dom = Box(-torch.ones(d), torch.ones(d))
    x0 = torch.full((d,), 0.5, device="cuda", dtype=F64)
    sim = simulate_fedzero(
        f, dom, x0, 16, 4, 50, 0.05, 0.05, generator=torch.Generator(device="cuda").manual_seed(0)
    )
    assert sim.average.device.type == "cuda" and dom.contains(sim.last).all()
    res = FedZero(
        f, dom, x0, 4, 10, eta=0.05, h=0.05, generator=torch.Generator(device="cuda").manual_seed(0)
    ).run()
    assert res.last.device.type == "cuda"


# --- the federated FedZero program (run_federated / build_federation) --------------------
def _linear_run(lower: float, h: float, domain: str = "box"):
    d = 3
    obj = CallableObjective(lambda X: X.sum(-1), bounds=[[lower] * d, [lower + 2.0] * d])
    setup = FederationSetup(objectives=obj, num_clients=2, seed=0)
    # f increasing in every coordinate, large eta: the iterate sits on the lower face
    return run_federated(
        "fedzero", setup, FedZeroSettings(num_rounds=10, eta=1.0, h=h, domain=domain)
    )


@pytest.mark.usefixtures("quiet_single_thread")
@pytest.mark.parametrize("domain", ["box", "l1-ball"])
def test_protocol_survives_iterate_on_shrunk_face_float32_h(domain):
    res = _linear_run(-1.0, 0.7, domain)
    assert res.recommendation is not None


@pytest.mark.usefixtures("quiet_single_thread")
def test_protocol_survives_float64_rounding_at_face():
    res = _linear_run(-0.085, 0.25)
    assert res.recommendation is not None


@pytest.mark.usefixtures("quiet_single_thread")
@pytest.mark.parametrize("kw", [dict(noise_std=1.0), dict(shift=0.2)])
def test_context_problem_honours_noise_and_shift(kw):
    settings = FedZeroSettings(num_rounds=5)
    base = run_federated(
        "fedzero", FederationSetup(problem="l1-regression", dim=5, num_clients=2, seed=0), settings
    )
    try:
        other = run_federated(
            "fedzero",
            FederationSetup(problem="l1-regression", dim=5, num_clients=2, seed=0, **kw),
            settings,
        )
    except ValueError:
        return  # refusing the unsupported setting is an acceptable fix
    assert other.recommendation["x"] != base.recommendation["x"]


@pytest.mark.usefixtures("quiet_single_thread")
def test_sign_message_of_wrong_length_is_refused():
    d = 4
    obj = CallableObjective(lambda X: X.sum(-1), bounds=[[-1.0] * d, [1.0] * d])
    server, clients, _ = build_federation(
        "fedzero",
        FederationSetup(objectives=obj, num_clients=2, seed=0),
        FedZeroSettings(num_rounds=2, eta=0.1, h=0.1, message="sign"),
    )
    clients[1].on_round = lambda payload: {"scale": 1.0, "signs": b"\xff\x00\x00"}
    with pytest.raises(ProtocolViolation):
        server.run()


@pytest.mark.usefixtures("quiet_single_thread")
def test_an_optimum_outside_theta_is_flagged():
    r"""l1-regression's planted x* (||x*||_1 = 1.43 at dim 10) lies outside the shrunk
    l1 ball: the regrets are against an optimum Theta does not contain, which the run
    says (a warning) instead of reporting regrets that silently cannot vanish."""
    setup = FederationSetup(problem="l1-regression", dim=10, num_clients=4, seed=0)
    with pytest.warns(UserWarning, match="outside Theta"):
        run_federated("fedzero", setup, FedZeroSettings(num_rounds=50, domain="l1-ball"))
