r"""Tests of the constraint sets: exact Euclidean projections (variational inequality
``<y - p, c - p> <= 0`` for all ``c`` in the set), membership, diameters, shrinking."""

from __future__ import annotations

import math

import pytest
import torch

from botorch_fed.zeroth_order import Box, L1Ball, L2Ball, Simplex, sample_l1_sphere
from tests.helpers.tolerances import assert_close, eps, reordering_factor

DTYPES = [torch.float32, torch.float64]
D = 6
F64 = torch.float64
EPS64 = torch.finfo(F64).eps
#: A projected point meets its constraint to the rounding of a D-term sum (the l1 norm,
#: the simplex sum, the l2 norm) and <= 4 elementwise roundings (x - c, the scale or the
#: threshold, c + w), each eps relative to the scale; projecting it again moves it by at
#: most that and rounds as much: 2 (D + 4) eps.
REPROJECT = 2 * (D + 4)


def _sets(dtype):
    g = torch.Generator().manual_seed(0)
    lo = torch.rand(D, generator=g, dtype=dtype) - 1.0
    return {
        "box": Box(lo, lo + 0.5 + torch.rand(D, generator=g, dtype=dtype)),
        "l2": L2Ball(0.3 * torch.randn(D, generator=g, dtype=dtype), 1.5),
        "l1": L1Ball(0.3 * torch.randn(D, generator=g, dtype=dtype), 2.0),
        "simplex": Simplex(1.5),
    }


def _bisection_threshold(a: torch.Tensor, r: torch.Tensor, iters: int = 200) -> torch.Tensor:
    r"""Reference: ``theta`` with ``sum max(a - theta, 0) = r`` by bisection (float64)."""
    lo = a.min(dim=-1).values - r
    hi = a.max(dim=-1).values
    for _ in range(iters):
        mid = (lo + hi) / 2
        s = (a - mid.unsqueeze(-1)).clamp_min(0).sum(-1)
        lo, hi = torch.where(s > r, mid, lo), torch.where(s > r, hi, mid)
    return (lo + hi) / 2


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", ["box", "l2", "l1", "simplex"])
def test_projection_optimality(dtype, name):
    C = _sets(dtype)[name]
    g = torch.Generator().manual_seed(1)
    y = 2.0 * torch.randn(50, D, generator=g, dtype=dtype)
    p = C.project(y)
    assert p.shape == y.shape and p.dtype == dtype
    assert C.contains(p).all()
    # idempotent
    assert_close(C.project(p), p, dtype=dtype, factor=REPROJECT)
    # variational inequality against random points of C (projections of other points):
    # <y - p, c - p> <= 0 for the exact p and c; the computed ones are each within
    # delta = REPROJECT / 2 eps s of them (s = the points' magnitude), which moves the
    # product by at most delta (2 ||y - p||_1 + ||c - p||_1) (evaluated in float64)
    c = C.project(2.0 * torch.randn(40, D, generator=g, dtype=dtype))
    yd, pd, cd = y.double(), p.double(), c.double()
    vi = ((yd - pd).unsqueeze(1) * (cd.unsqueeze(0) - pd.unsqueeze(1))).sum(-1)  # n x k
    delta = REPROJECT / 2 * eps(dtype) * float(max(y.abs().max(), c.abs().max()))
    to_c = (cd.unsqueeze(0) - pd.unsqueeze(1)).abs().sum(-1)
    assert (vi <= delta * (2 * (yd - pd).abs().sum(-1, keepdim=True) + to_c)).all()
    # p is no farther from y than any of those points: ||y - p|| <= ||y - c|| for the exact
    # ones, up to ||p - p_exact|| + ||c - c_exact|| <= 2 sqrt(D) delta and the rounding of
    # the two norms in dtype (a D-term sum and a root: (D / 2 + 2) eps of each)
    dp = (y - p).norm(dim=-1, keepdim=True)
    dc = (y.unsqueeze(1) - c.unsqueeze(0)).norm(dim=-1)
    slack = 2 * D**0.5 * delta + (D / 2 + 2) * eps(dtype) * (dp + dc)
    assert (dp <= dc + slack).all()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", ["box", "l2", "l1", "simplex"])
def test_points_inside_unchanged(dtype, name):
    C = _sets(dtype)[name]
    inside = C.project(
        3.0 * torch.randn(30, D, generator=torch.Generator().manual_seed(2), dtype=dtype)
    )
    assert_close(C.project(inside), inside, dtype=dtype, factor=REPROJECT)
    if name in ("box", "l1"):  # returned as is
        interior = C.shrink(0.1).project(inside)
        assert torch.equal(C.project(interior), interior)


@pytest.mark.parametrize("name", ["l1", "simplex"])
def test_sort_projection_matches_bisection(name):
    g = torch.Generator().manual_seed(3)
    y = 3.0 * torch.randn(200, D, generator=g, dtype=torch.float64)
    r = torch.tensor(1.7, dtype=torch.float64)
    if name == "l1":
        p = L1Ball(torch.zeros(D, dtype=torch.float64), r).project(y)
        theta = _bisection_threshold(y.abs(), r).clamp_min(0)
        ref = torch.sign(y) * (y.abs() - theta.unsqueeze(-1)).clamp_min(0)
        ref = torch.where((y.abs().sum(-1) <= r).unsqueeze(-1), y, ref)
    else:
        p = Simplex(r).project(y)
        theta = _bisection_threshold(y, r)
        ref = (y - theta.unsqueeze(-1)).clamp_min(0)
    # theta on each side: the sort's k-term cumsum over k errs by k eps max|y| (<= D eps);
    # the bisection stops at adjacent floats of the root of a D-term sum that errs by
    # (k max|y| + D r) eps, over the slope k; then one subtraction (and the sign): each
    # side within (D + 2) eps max(|y|, r) of the exact projection
    scale = max(float(y.abs().max()), float(r))
    assert_close(p, ref, dtype=torch.float64, factor=2 * (D + 2), scale=scale)


def test_batched_parameters_match_per_run():
    R = 4
    g = torch.Generator().manual_seed(5)
    y = 2.0 * torch.randn(R, 3, D, generator=g, dtype=torch.float64)
    lo = -torch.rand(R, 1, D, generator=g, dtype=torch.float64)
    up = torch.rand(R, 1, D, generator=g, dtype=torch.float64)
    c = torch.randn(R, 1, D, generator=g, dtype=torch.float64)
    r = torch.tensor([0.5, 1.0, 2.0, 3.0], dtype=torch.float64).unsqueeze(-1)  # R x 1
    sets = [
        (Box(lo, up), lambda i: Box(lo[i, 0], up[i, 0])),
        (L2Ball(c, r), lambda i: L2Ball(c[i, 0], r[i, 0])),
        (L1Ball(c, r), lambda i: L1Ball(c[i, 0], r[i, 0])),
        (Simplex(r), lambda i: Simplex(float(r[i, 0]))),
    ]
    # the same formulas on the same values; only the D-term reductions (norms, cumsum,
    # sums) may run in another order in a batch: reordering of D-term sums relative to
    # the magnitude of the inputs (cancellations in x - c, c + w, the threshold)
    scale = float(y.abs().max() + c.abs().max() + r.max() + lo.abs().max() + up.abs().max())
    for batched, single in sets:
        p = batched.project(y)
        for i in range(R):
            expected = single(i).project(y[i])
            assert_close(p[i], expected, dtype=F64, factor=reordering_factor(D), scale=scale)
        assert batched.contains(p).shape == (R, 3)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", ["box", "l2", "l1"])
def test_shrink_keeps_perturbations_inside(dtype, name):
    C = _sets(dtype)[name]
    h = 0.2
    S = C.shrink(h)
    g = torch.Generator().manual_seed(6)
    x = S.project(3.0 * torch.randn(500, D, generator=g, dtype=dtype))
    z = sample_l1_sphere(500, d=D, generator=g, dtype=dtype)
    assert C.contains(x + h * z).all() and C.contains(x - h * z).all()
    # the worst directions: +-h e_j (box, l1) reach the boundary, not beyond
    e = h * torch.eye(D, dtype=dtype)
    assert C.contains(x[:1] + e).all() and C.contains(x[:1] - e).all()


def test_shrink_details():
    b = Box(torch.zeros(2), torch.ones(2)).shrink(0.25)
    assert torch.equal(b.lower, torch.full((2,), 0.25)) and torch.equal(
        b.upper, torch.full((2,), 0.75)
    )
    assert float(L1Ball(torch.zeros(2), 1.0).shrink(0.25).radius) == 0.75
    assert float(L2Ball(torch.zeros(2), 1.0).shrink(0.25).radius) == 0.75
    # per-run h for a batch of boxes
    hb = Box(torch.zeros(3, 2), torch.ones(3, 2)).shrink(torch.tensor([0.1, 0.2, 0.3]))
    assert torch.allclose(hb.lower[:, 0], torch.tensor([0.1, 0.2, 0.3]))
    with pytest.raises(ValueError, match="`h`"):
        Box(torch.zeros(2), torch.ones(2)).shrink(0.5)
    with pytest.raises(ValueError, match="`h`"):
        L2Ball(torch.zeros(2), 1.0).shrink(1.0)
    with pytest.raises(ValueError, match="`h`"):
        L1Ball(torch.zeros(2), 1.0).shrink(-0.1)
    with pytest.raises(NotImplementedError, match="empty interior"):
        Simplex().shrink(0.1)


def test_diameters_and_dims():
    assert math.isclose(Box(torch.zeros(4), torch.full((4,), 2.0)).diameter, 4.0)
    assert L2Ball(torch.zeros(3), 1.5).diameter == 3.0
    assert L1Ball(torch.zeros(3), 1.5).diameter == 3.0
    assert math.isclose(Simplex(2.0).diameter, 2 * math.sqrt(2))
    assert Box(torch.zeros(4), torch.ones(4)).dim == 4 and Simplex().dim is None
    # the diameters are attained
    assert math.isclose(float((torch.tensor([1.5, 0, 0]) - torch.tensor([-1.5, 0, 0])).norm()), 3.0)
    for C in (
        Box(torch.zeros(2), torch.ones(2)),
        L1Ball(torch.zeros(2), 1.0),
        L2Ball(torch.zeros(2), 1.0),
        Simplex(),
    ):
        d = C.describe()
        assert d["type"] == type(C).__name__ and "diameter" in d
        assert type(C).__name__ in repr(C)


def test_contains_per_row_and_atol():
    C = L2Ball(torch.zeros(2, dtype=torch.float64), 1.0)
    x = torch.tensor([[0.0, 1.0], [0.0, 1.01], [0.5, 0.5]], dtype=torch.float64)
    assert C.contains(x).tolist() == [True, False, True]
    assert C.contains(x, atol=0.02).all()
    S = Simplex()
    assert S.contains(torch.tensor([[0.5, 0.5], [1.1, -0.1], [0.5, 0.4]])).tolist() == [
        True,
        False,
        False,
    ]


def test_validation():
    with pytest.raises(ValueError, match="`lower` must be < `upper`"):
        Box(torch.zeros(2), torch.tensor([1.0, 0.0]))
    with pytest.raises(ValueError, match="`lower`"):
        Box(torch.tensor([float("nan"), 0.0]), torch.ones(2))
    with pytest.raises(ValueError, match="`upper`"):
        Box(torch.zeros(2), torch.tensor([1.0, float("inf")]))
    with pytest.raises(ValueError, match="broadcast"):
        Box(torch.zeros(2), torch.ones(3))
    for cls in (L2Ball, L1Ball):
        for bad in (0.0, -1.0, float("nan")):
            with pytest.raises(ValueError, match="`radius`"):
                cls(torch.zeros(2), bad)
        with pytest.raises(ValueError, match="`center`"):
            cls(torch.tensor(0.0), 1.0)
    with pytest.raises(ValueError, match="`radius`"):
        Simplex(0.0)
    with pytest.raises(ValueError, match="`x`"):
        Box(torch.zeros(2), torch.ones(2)).project(torch.zeros(3))
    with pytest.raises(ValueError, match="`x`"):
        L1Ball(torch.zeros(2), 1.0).project([0.0, 0.0])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_projection():
    y = torch.randn(10, 4, device="cuda", dtype=torch.float64)
    for C in (
        Box(-torch.ones(4), torch.ones(4)),
        L1Ball(torch.zeros(4), 1.0),
        L2Ball(torch.zeros(4), 1.0),
        Simplex(),
    ):
        p = C.project(y)
        assert p.device.type == "cuda" and C.contains(p).all()


# --- rounding: float radii and steps, float32 extremes, batched radii ---------------------
# Tolerances are a few ulps of the dtype under test (the quantities are single roundings
# away from exact); one intra-op thread and warnings ignored (quiet_single_thread), as in
# the federated FedZero tests.
@pytest.mark.usefixtures("quiet_single_thread")
def test_float_radius_keeps_float64_precision():
    ball = L1Ball(torch.zeros(3, dtype=F64), 0.1)
    p = ball.project(torch.tensor([[5.0, 0.0, 0.0]], dtype=F64))
    assert abs(p[0, 0].item() - 0.1) <= 4 * EPS64  # one rounding (a float32 radius: 1.5e-9 off)


@pytest.mark.usefixtures("quiet_single_thread")
def test_box_shrink_by_float_h_keeps_queries_inside():
    box = Box(-torch.ones(2, dtype=F64), torch.ones(2, dtype=F64))
    s = box.shrink(0.7)
    assert bool(((s.lower - 0.7) >= -1.0).all()) and bool(((s.upper + 0.7) <= 1.0).all())


@pytest.mark.usefixtures("quiet_single_thread")
def test_l2_ball_projection_of_large_float32_point():
    p = L2Ball(torch.zeros(3), 1.0).project(torch.full((1, 3), 1e20))
    expected = torch.full((1, 3), 1 / math.sqrt(3))
    assert (p - expected).abs().max().item() <= 8 * torch.finfo(torch.float32).eps


@pytest.mark.usefixtures("quiet_single_thread")
def test_l1_ball_batched_radius_unbatched_point():
    ball = L1Ball(torch.zeros(3, dtype=F64), torch.tensor([1.0, 2.0], dtype=F64))
    try:
        p = ball.project(torch.full((3,), 5.0, dtype=F64))
    except ValueError:
        return
    assert p.shape == (2, 3)
