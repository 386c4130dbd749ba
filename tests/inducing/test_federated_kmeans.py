r"""Federated k-means support set (Alg. 1 of FBO-FedGP)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from botorch.exceptions.errors import BotorchTensorDimensionError, InputDataError

from botorch_fed.inducing import global_support, local_centers, random_support
from tests.helpers.tolerances import eps, reordering_factor, tol

DTYPES = [torch.float32, torch.float64]


def _assignments(points: torch.Tensor, centers: torch.Tensor) -> torch.Tensor:
    return torch.cdist(points.double(), centers.double()).argmin(dim=-1)


def _is_lloyd_fixed_point(points, centers, atol, rtol=1e-5):
    labels = _assignments(points, centers)
    for j in range(len(centers)):
        members = points[labels == j].double()
        if len(members):
            if not torch.allclose(members.mean(0), centers[j].double(), rtol=rtol, atol=atol):
                return False
    return True


@pytest.mark.parametrize("dtype", DTYPES)
def test_local_centers_are_a_lloyd_fixed_point(dtype):
    g = torch.Generator().manual_seed(0)
    X = torch.rand(200, 3, generator=g, dtype=torch.float64).to(dtype)
    C = local_centers(X, k=7, tol=0.0, max_iter=1000, seed=1, min_cluster_size=1)
    assert C.shape == (7, 3) and C.dtype == dtype
    # scikit-learn's centres are float64 means of the members, rounded once to ``dtype``
    # (<= eps / 2 relative); the float64 mean here sums the <= 200 members in another
    # order (<= 200 eps64): factor 1 + 200 eps64 / eps(dtype), relative to max |X|.
    factor = 1 + len(X) * eps(torch.float64) / eps(dtype)
    atol = tol(dtype, factor) * X.abs().max().item()
    assert _is_lloyd_fixed_point(X, C, atol=atol, rtol=0.0)
    # deterministic given the seed
    assert torch.equal(C, local_centers(X, k=7, tol=0.0, max_iter=1000, seed=1, min_cluster_size=1))


def test_local_centers_clip_k_to_distinct_points():
    X = torch.tensor([[0.0, 0.0], [1.0, 1.0], [0.0, 0.0]])
    C = local_centers(X, k=5, min_cluster_size=1)
    assert C.shape == (2, 2)
    assert {tuple(r) for r in C.tolist()} == {(0.0, 0.0), (1.0, 1.0)}


def test_min_cluster_size_never_returns_a_raw_point():
    g = torch.Generator().manual_seed(5)
    for n in (2, 3, 4, 7):
        X = torch.rand(n, 2, generator=g, dtype=torch.float64)
        C = local_centers(X, k=n, seed=0, min_cluster_size=2)
        assert 1 <= len(C) <= n // 2
        assert not (C.unsqueeze(1) == X.unsqueeze(0)).all(-1).any()
        # each returned centre is the mean of >= 2 of the points
        labels = torch.cdist(X, C).argmin(dim=-1)
        assert all(int((labels == j).sum()) >= 2 for j in range(len(C))) or len(C) == 1
    with pytest.raises(ValueError, match="min_cluster_size"):
        local_centers(torch.rand(1, 2), k=1, min_cluster_size=2)
    with pytest.raises(ValueError, match="min_cluster_size"):
        local_centers(torch.rand(5, 2), k=1, min_cluster_size=0)


def test_noised_centres_are_seeded_and_have_the_requested_spread():
    g = torch.Generator().manual_seed(1)
    X = torch.rand(500, 2, generator=g, dtype=torch.float64)
    exact = local_centers(X, k=50, seed=3, min_cluster_size=1)
    noisy = local_centers(X, k=50, seed=3, noise_std=0.1, min_cluster_size=1)
    assert torch.equal(noisy, local_centers(X, k=50, seed=3, noise_std=0.1, min_cluster_size=1))
    diff = (noisy - exact).flatten()
    assert 0.07 < diff.std().item() < 0.13  # 100 draws of N(0, 0.1^2)


def test_global_support_finds_separated_client_blobs():
    g = torch.Generator().manual_seed(2)
    corners = torch.tensor([[0.1, 0.1], [0.9, 0.1], [0.1, 0.9], [0.9, 0.9]], dtype=torch.float64)
    centers = []
    for i, c in enumerate(corners):
        X = c + 0.02 * torch.randn(40, 2, generator=g, dtype=torch.float64)
        centers.append(local_centers(X, k=3, seed=i, min_cluster_size=1))
    S = global_support(centers, size=4, seed=0)
    assert S.shape == (4, 2)
    # one support point per blob, close to the blob's centre
    d = torch.cdist(corners, S)
    assert (d.min(dim=1).values < 0.05).all()
    assert len(set(d.argmin(dim=1).tolist())) == 4
    # and the result is a k-means fixed point on the pooled centres: scikit-learn's
    # float64 means of the (well separated, so stable) clusters vs the float64 means
    # here, each a sum of at most 12 pooled centres, in other orders
    pooled = torch.cat(centers)
    atol = tol(torch.float64, reordering_factor(len(pooled))) * pooled.abs().max().item()
    assert _is_lloyd_fixed_point(pooled, S, atol=atol, rtol=0.0)


@pytest.mark.parametrize("dtype", DTYPES)
def test_global_support_size_dtype_and_clipping(dtype):
    g = torch.Generator().manual_seed(3)
    centers = [torch.rand(k, 3, generator=g, dtype=torch.float64).to(dtype) for k in (2, 5, 4)]
    S = global_support(centers, size=6, seed=1)
    assert S.shape == (6, 3) and S.dtype == dtype
    assert torch.equal(S, global_support(centers, size=6, seed=1))
    assert global_support(centers, size=50).shape == (11, 3)  # |Z| <= |S|


def test_random_support_in_bounds_and_seeded():
    bounds = torch.tensor([[-1.0, 0.0, 2.0], [1.0, 5.0, 3.0]], dtype=torch.float64)
    S = random_support(bounds, 16, seed=4)
    assert S.shape == (16, 3) and S.dtype == torch.float64
    assert ((S >= bounds[0]) & (S <= bounds[1])).all()
    assert torch.equal(S, random_support(bounds, 16, seed=4))
    assert not torch.equal(S, random_support(bounds, 16, seed=5))


def test_bad_inputs():
    X = torch.rand(10, 2)
    with pytest.raises(ValueError, match="`k`"):
        local_centers(X, k=0)
    with pytest.raises(ValueError, match="noise_std"):
        local_centers(X, k=2, noise_std=-1.0)
    with pytest.raises(ValueError, match="max_iter"):
        local_centers(X, k=2, max_iter=0)
    Xn = X.clone()
    Xn[1, 1] = float("nan")
    with pytest.raises(InputDataError, match="`X`"):
        local_centers(Xn, k=2)
    with pytest.raises(BotorchTensorDimensionError, match="`X`"):
        local_centers(X[:0], k=2)
    with pytest.raises(TypeError, match="`X`"):
        local_centers(X.numpy(), k=2)
    with pytest.raises(ValueError, match="empty"):
        global_support([], 4)
    with pytest.raises(ValueError, match="`size`"):
        global_support([X], 0)
    with pytest.raises(BotorchTensorDimensionError, match=r"centers\[1\]"):
        global_support([X, torch.rand(3, 3)], 4)
    with pytest.raises(BotorchTensorDimensionError, match="bounds"):
        random_support(torch.rand(3, 2), 4)
    with pytest.raises(InputDataError, match="bounds"):
        random_support(torch.tensor([[1.0, 0.0], [0.0, 1.0]]), 4)


@pytest.mark.parametrize("copies", [2, 3, 10])
def test_copies_of_one_point_do_not_make_a_cluster(copies):
    # min_cluster_size counts distinct points. One isolated point
    # repeated `copies` times next to a spread-out cloud: its copies form a cluster of
    # their own, whose centre would be that raw point
    rng = np.random.default_rng(copies)
    cloud = torch.as_tensor(rng.uniform(0.0, 0.05, size=(12, 2)))
    lone = torch.tensor([[10.0, 10.0]], dtype=torch.float64)  # far: its own cluster
    X = torch.cat([cloud, lone.expand(copies, 2)])
    for seed in range(5):
        C = local_centers(X, k=3, seed=seed, min_cluster_size=2)
        # no centre is (up to the rounding of a mean of copies) any raw point
        assert torch.cdist(C, X).min() > 1e-9, (seed, C)


def test_fewer_distinct_points_than_min_cluster_size_gives_no_centre():
    X = torch.tensor([[0.3, 0.7]] * 5, dtype=torch.float64)
    C = local_centers(X, k=2, min_cluster_size=2)
    assert C.shape == (0, 2) and C.dtype == X.dtype
    assert local_centers(X, k=2, min_cluster_size=1).shape == (1, 2)
