r"""Tests of the two-point estimators (FedZero, Alg. 1 and Sec. 3: ``E[g | x] = grad f_h``
with ``f_h(x) = E f(x + h U)``, ``U`` uniform in the unit ball of the same norm)."""

from __future__ import annotations

import pickle

import pytest
import torch
from scipy import stats

from botorch_fed.zeroth_order import ESTIMATORS, get_estimator, l1_gradient, l1_sign, l2_gradient
from tests.helpers.tolerances import assert_close

DTYPES = [torch.float32, torch.float64]


def _assert_mc_mean(g: torch.Tensor, expected: torch.Tensor, msg: str = "") -> None:
    r"""Mean of ``N x d`` samples within 5 standard errors per coordinate, and the whole
    vector within the chi2(d) 1 - 1e-6 quantile in the sample-covariance metric."""
    N, d = g.shape
    mean = g.mean(dim=0)
    cov = torch.cov(g.T).reshape(d, d) / N
    se = cov.diagonal().sqrt()
    assert ((mean - expected).abs() <= 5 * se).all(), (msg, mean, expected, se)
    r = mean - expected
    maha = float(r @ torch.linalg.solve(cov, r))
    assert maha <= stats.chi2(d).ppf(1 - 1e-6), (msg, maha)


def _assert_mc_differs(g: torch.Tensor, other: torch.Tensor) -> None:
    N = g.shape[0]
    se = g.std(dim=0) / N**0.5
    assert ((g.mean(dim=0) - other).abs() > 5 * se).any()


@pytest.mark.parametrize("name", ["l1", "l2"])
def test_linear_exactly_unbiased(name, l1_path):
    d, N = 6, 100000
    a = torch.tensor([1.0, -2.0, 0.5, 0.0, 3.0, -0.25], dtype=torch.float64)
    x = torch.randn(d, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    X = x.expand(N, d)
    g = ESTIMATORS[name](lambda Z: Z @ a + 1.0, X, 0.3, generator=torch.Generator().manual_seed(2))
    _assert_mc_mean(g, a, name)


def test_l1_linear_is_d_inner_sign_exact(l1_path):
    d = 4
    a = torch.tensor([1.0, -2.0, 0.5, 3.0], dtype=torch.float64)
    x = torch.zeros(10, d, dtype=torch.float64)
    g, z, yp, ym = l1_gradient(
        lambda Z: Z @ a, x, 0.7, torch.Generator().manual_seed(0), return_values=True
    )
    expected = d * (z @ a).unsqueeze(-1) * l1_sign(z)
    # x = 0: f sees h z (z = lap / norm; the library forms lap * (h / norm), two roundings,
    # the reference z then 0.7 z, two) and sums d products: each side of y+ = 0.7 z'a errs
    # by at most (d + 2) eps h sum_j |z_j a_j| <= (d + 2) eps h max|a| (||z||_1 = 1);
    # y- = -y+ exactly, and g = d / 2h (y+ - y-) sign(z) vs d (z'a) sign(z) adds three
    # roundings: (2 d + 5) eps d max|a| in all
    amax = float(a.abs().max())
    assert_close(g, expected, dtype=torch.float64, factor=2 * d + 5, scale=d * amax)
    assert_close(yp, 0.7 * z @ a, dtype=torch.float64, factor=2 * (d + 2), scale=0.7 * amax)
    assert_close(ym, -0.7 * z @ a, dtype=torch.float64, factor=2 * (d + 2), scale=0.7 * amax)


@pytest.mark.parametrize("name", ["l1", "l2"])
def test_quadratic_unbiased_for_smoothed_gradient(name, l1_path):
    # f = ||x||^2 / 2: grad f_h(x) = x exactly for any symmetric U
    d, N = 5, 100000
    x = torch.tensor([0.3, -1.0, 0.0, 2.0, 0.5], dtype=torch.float64)
    g = ESTIMATORS[name](
        lambda Z: 0.5 * (Z**2).sum(-1),
        x.expand(N, d),
        0.5,
        generator=torch.Generator().manual_seed(3),
    )
    _assert_mc_mean(g, x, name)


@pytest.mark.parametrize("name", ["l1", "l2"])
def test_cubic_unbiased_for_smoothed_not_true_gradient(name, l1_path):
    # f(x) = sum x_j^3 / 3: grad_j f_h(x) = x_j^2 + h^2 E[U_j^2], with
    # E[U_j^2] = 2 / ((d+1)(d+2)) for U uniform in the l1 ball (radius ~ Beta(d, 1),
    # |z_j| ~ Beta(1, d-1) on the sphere) and 1 / (d+2) in the l2 ball.
    d, N, h = 3, 200000, 1.0
    x = torch.tensor([0.1, -0.2, 0.3], dtype=torch.float64)
    moment = 2 / ((d + 1) * (d + 2)) if name == "l1" else 1 / (d + 2)
    g = ESTIMATORS[name](
        lambda Z: (Z**3).sum(-1) / 3, x.expand(N, d), h, generator=torch.Generator().manual_seed(4)
    )
    _assert_mc_mean(g, x**2 + h**2 * moment, name)
    _assert_mc_differs(g, x**2)  # the smoothing bias is resolved at this N


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("batch", [(), (4,), (2, 3)])
def test_shapes_and_one_call_per_side(dtype, batch, l1_path):
    d = 3
    calls, kept = [], []

    def f(Z):
        calls.append(Z.clone())
        kept.append(Z)  # an objective may keep its inputs: they must not change afterwards
        return Z.sum(-1, keepdim=True)  # ``... x 1`` accepted

    x = torch.rand(*batch, d, dtype=dtype)
    g, z, yp, ym = l1_gradient(f, x, 0.1, torch.Generator().manual_seed(0), return_values=True)
    assert len(calls) == 2
    assert calls[0].shape == calls[1].shape == x.shape
    assert g.shape == z.shape == x.shape and g.dtype == dtype
    assert yp.shape == ym.shape == batch
    # x +- h z: three roundings on each side (library: h / norm, lap * that, x +; here:
    # lap / norm, 0.1 *, x +), each at most eps/2 of |x| + h |z|
    scale = float(x.abs().max()) + 0.1 * float(z.abs().max())
    assert_close(calls[0], x + 0.1 * z, dtype=dtype, factor=3, scale=scale)
    assert_close(calls[1], x - 0.1 * z, dtype=dtype, factor=3, scale=scale)
    assert all(torch.equal(a, b) for a, b in zip(calls, kept, strict=True))


def test_input_that_requires_grad(l1_path):
    # out= has no autograd: an x that requires grad takes the out-of-place path, gives
    # the same estimate, and its graph is right: for f(Z) = ||Z||^2 the l1 estimate is
    # g = 2 d (x . z) sign(z), so d(sum g) / dx = 2 d z sum(sign(z)) (closed form)
    n, d = 40, 3
    x = torch.rand(n, d, dtype=torch.float64)
    f = lambda Z: (Z**2).sum(-1)  # noqa: E731
    a = l1_gradient(f, x, 0.1, torch.Generator().manual_seed(2))
    xg = x.clone().requires_grad_(True)
    b, z, _, _ = l1_gradient(f, xg, 0.1, torch.Generator().manual_seed(2), return_values=True)
    assert b.requires_grad
    torch.testing.assert_close(a, b.detach(), rtol=0, atol=0)
    (grad,) = torch.autograd.grad(b.sum(), xg)
    expected = 2 * d * z.detach() * torch.where(z >= 0, 1.0, -1.0).sum(-1, keepdim=True)
    # autograd forms c (2 (x + h z) - 2 (x - h z)), c = d / 2h sum(sign z) (|c| <= d^2 / 2h),
    # by cancellation: x +- h z carry 3 roundings each (eps/2 of |x| + h |z|), the two
    # products and the difference 4 more of 2 |c| (|x| + h |z|); the closed form rounds
    # 3 times relative to |expected| <= 2 d^2 |z|: 13 eps of d^2 / h (|x| + h |z|)
    scale = d**2 / 0.1 * (float(x.abs().max()) + 0.1 * float(z.abs().max()))
    assert_close(grad, expected, dtype=torch.float64, factor=13, scale=scale)


def test_per_row_h_and_contexts(l1_path):
    R, m, d = 3, 4, 2
    h = torch.tensor([0.1, 0.2, 0.4], dtype=torch.float64).unsqueeze(-1)  # R x 1
    x = torch.zeros(R, m, d, dtype=torch.float64)
    ctx = torch.arange(R * m).reshape(R, m)
    seen = []

    def f(Z, c):
        seen.append(c)
        return Z.sum(-1) + c.to(Z.dtype)

    g, z, yp, ym = l2_gradient(
        f, x, h, torch.Generator().manual_seed(0), context=ctx, return_values=True
    )
    assert len(seen) == 2 and seen[0] is ctx and seen[1] is ctx
    # perturbation radius per run: y+ - ctx = h <1, z>. y+ rounds h z (1), the d = 2 sum
    # (1), + c (1) and y+ - c (1); the reference h z.sum(-1) twice: each at most eps/2 of
    # |c| + h ||z||_1, which the rounding of + c at |c| <= 11 dominates
    scale = float(ctx.abs().max()) + float((h * z.abs().sum(-1)).max())
    assert_close(yp - ctx, h * z.sum(-1), dtype=torch.float64, factor=3, scale=scale)
    # the contexts cancel (same on both sides): g is d / 2h times the same y+ - y- times z,
    # four roundings on each side relative to |g|
    expected = d / (2 * h.unsqueeze(-1)) * (yp - ym).unsqueeze(-1) * z
    assert_close(g, expected, dtype=torch.float64, factor=4)
    with pytest.raises(ValueError, match="`context`"):
        l1_gradient(f, x, 0.1, context=torch.zeros(R))


def test_seeded_reproducible():
    x = torch.rand(5, 3)
    f = lambda Z: (Z**2).sum(-1)  # noqa: E731
    a = l1_gradient(f, x, 0.1, torch.Generator().manual_seed(1))
    b = l1_gradient(f, x, 0.1, torch.Generator().manual_seed(1))
    assert torch.equal(a, b)


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan"), float("inf"), True, "x"])
def test_bad_h(bad):
    with pytest.raises(ValueError, match="`h`"):
        l1_gradient(lambda Z: Z.sum(-1), torch.zeros(2, 3), bad)


def test_bad_h_shape_and_values():
    with pytest.raises(ValueError, match=r"`h` of shape \(3,\)"):
        l1_gradient(lambda Z: Z.sum(-1), torch.zeros(2, 3), torch.ones(3))
    with pytest.raises(ValueError, match="`h`"):
        l2_gradient(lambda Z: Z.sum(-1), torch.zeros(2, 3), torch.tensor([0.1, -0.1]))


def test_bad_x():
    f = lambda Z: Z.sum(-1)  # noqa: E731
    for bad in (
        torch.zeros(2, 0),
        torch.tensor(1.0),
        torch.zeros(2, 3, dtype=torch.long),
        torch.tensor([[float("nan"), 0.0]]),
        [[0.0, 1.0]],
    ):
        with pytest.raises(ValueError, match="`x`"):
            l1_gradient(f, bad, 0.1)


def test_bad_f_output():
    x = torch.zeros(4, 3)
    with pytest.raises(ValueError, match=r"`f`.*expected shape \(4,\).*got \(4, 3\)"):
        l1_gradient(lambda Z: Z, x, 0.1)
    with pytest.raises(ValueError, match=r"`f`.*got \(\)"):
        l1_gradient(lambda Z: Z.sum(), x, 0.1)
    with pytest.raises(ValueError, match="`f` returned non-finite"):
        l2_gradient(lambda Z: Z.sum(-1) / 0.0 * 0.0, x, 0.1)
    with pytest.raises(ValueError, match="`f` must be callable"):
        l1_gradient(3, x, 0.1)


def test_registry():
    assert ESTIMATORS == {"l1": l1_gradient, "l2": l2_gradient}
    assert get_estimator("l2") is l2_gradient
    with pytest.raises(ValueError, match="`estimator`"):
        get_estimator("l3")


# --- autograd through the estimator, and the inputs f is given ------------------------
# (x + h z and x - h z are computed in one (2, ..., d) buffer: f still gets a tensor that
# owns its storage)
def _f(Z):
    return (Z**2).sum(-1)


def test_l2_gradient_with_h_that_requires_grad():
    x = torch.rand(6, 3, dtype=torch.float64)
    h = torch.tensor(0.1, dtype=torch.float64, requires_grad=True)
    g = l2_gradient(_f, x, h, torch.Generator().manual_seed(0))
    ref = l2_gradient(_f, x, 0.1, torch.Generator().manual_seed(0))
    torch.testing.assert_close(g.detach(), ref)
    assert g.requires_grad


def test_l2_gradient_under_forward_mode_ad():
    x = torch.rand(6, 3, dtype=torch.float64)

    def est(x):
        return l2_gradient(_f, x, 0.1, torch.Generator().manual_seed(0))

    g, tangent = torch.func.jvp(est, (x,), (torch.ones_like(x),))
    torch.testing.assert_close(g, est(x))
    assert tangent.shape == x.shape


@pytest.mark.parametrize("name", ["l1", "l2"])
def test_objective_input_owns_its_storage(name):
    seen = []

    def f(Z):
        # what an objective that serialises its query points (to a worker, a log, a
        # checkpoint) sends: the whole storage of the tensor it was given
        seen.append(pickle.loads(pickle.dumps(Z)).untyped_storage().nbytes())
        return Z.sum(-1)

    x = torch.rand(8, 16, dtype=torch.float64)
    (l1_gradient if name == "l1" else l2_gradient)(f, x, 0.1, torch.Generator().manual_seed(0))
    assert seen == [x.numel() * x.element_size()] * 2


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda():
    x = torch.rand(8, 3, device="cuda", dtype=torch.float64)
    g = l1_gradient(lambda Z: Z.sum(-1), x, 0.1, torch.Generator(device="cuda").manual_seed(0))
    assert g.device.type == "cuda" and g.shape == x.shape
