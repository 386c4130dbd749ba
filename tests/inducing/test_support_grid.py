r"""The data-independent supports of Co-KG: the regular grid and Sobol points."""

from __future__ import annotations

import itertools

import pytest
import torch
from botorch.utils.sampling import draw_sobol_samples

from botorch_fed.inducing import grid_support, sobol_support
from tests.helpers.tolerances import assert_close


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("dim, m", [(1, 5), (2, 10), (2, 6), (3, 4), (4, 2)])
def test_grid_is_every_combination_of_the_axis_values(dim, m, dtype):
    grid = grid_support(dim, m, dtype=dtype)
    assert grid.shape == (m**dim, dim) and grid.dtype == dtype
    # independent construction: itertools.product of the evenly spaced axis values
    axis = [i / (m - 1) for i in range(m)]
    expected = torch.tensor(list(itertools.product(axis, repeat=dim)), dtype=torch.float64)
    # linspace forms each value as 0 + i step or 1 - j step: one rounding each of the
    # step, the product and the sum, and one of the reference, each <= eps / 2 of the
    # axis' range 1
    assert_close(grid, expected, dtype=dtype, factor=2, scale=1.0)
    # the corners are exact, every point distinct and inside the cube
    assert grid.min() == 0 and grid.max() == 1
    assert len(torch.unique(grid, dim=0)) == m**dim


def test_grid_of_one_point_per_axis_is_the_centre():
    assert torch.equal(grid_support(3, 1), torch.full((1, 3), 0.5, dtype=torch.float64))


def test_the_papers_grid():
    grid = grid_support(2, 10)
    assert grid.shape == (100, 2)
    # spacing 1/9 along each axis, the last coordinate fastest: a difference of two grid
    # values, each <= eps off (above), rounded once more (eps / 2)
    step = torch.tensor([0.0, 1 / 9], dtype=torch.double)
    assert_close(grid[1] - grid[0], step, dtype=torch.double, factor=3, scale=1.0)
    assert_close(grid[10] - grid[0], step.flip(0), dtype=torch.double, factor=3, scale=1.0)


def test_grid_too_large_is_refused():
    with pytest.raises(ValueError, match=r"`points_per_dim`=10 in `dim`=6 .* 1000000 points"):
        grid_support(6, 10)
    assert grid_support(2, 30, max_points=900).shape == (900, 2)
    with pytest.raises(ValueError, match="`max_points`=899"):
        grid_support(2, 30, max_points=899)


@pytest.mark.parametrize(
    "kwargs, name",
    [
        (dict(dim=0, points_per_dim=3), "dim"),
        (dict(dim=2.0, points_per_dim=3), "dim"),
        (dict(dim=True, points_per_dim=3), "dim"),
        (dict(dim=2, points_per_dim=0), "points_per_dim"),
        (dict(dim=2, points_per_dim=None), "points_per_dim"),
        (dict(dim=2, points_per_dim=3, max_points=0), "max_points"),
        (dict(dim=2, points_per_dim=3, dtype=torch.int64), "dtype"),
    ],
)
def test_grid_bad_inputs(kwargs, name):
    with pytest.raises(ValueError, match=f"`{name}`"):
        grid_support(**kwargs)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_sobol_is_botorchs_scrambled_sobol_on_the_unit_cube(dtype):
    points = sobol_support(5, 50, seed=7, dtype=dtype)
    assert points.shape == (50, 5) and points.dtype == dtype
    assert ((points >= 0) & (points <= 1)).all()
    bounds = torch.tensor([[0.0] * 5, [1.0] * 5], dtype=dtype)
    expected = draw_sobol_samples(bounds=bounds, n=50, q=1, seed=7).squeeze(-2)
    assert torch.equal(points, expected)
    # seeded: the same points for the same seed on every party, others for another
    assert torch.equal(sobol_support(5, 50, seed=7, dtype=dtype), points)
    assert not torch.equal(sobol_support(5, 50, seed=8, dtype=dtype), points)


def test_sobol_points_are_stratified():
    # a (0, m, 2)-net: every elementary box of area 1/64 holds exactly one of 64 points,
    # which i.i.d. uniform points essentially never do
    points = sobol_support(2, 64, seed=3)
    for a in range(7):
        b = 6 - a
        cells = (points[:, 0] * 2**a).floor() * 2**b + (points[:, 1] * 2**b).floor()
        assert torch.equal(torch.bincount(cells.long(), minlength=64), torch.ones(64).long())
    uniform = torch.rand(64, 2, generator=torch.Generator().manual_seed(0), dtype=torch.double)
    cells = (uniform[:, 0] * 8).floor() * 8 + (uniform[:, 1] * 8).floor()
    assert not torch.equal(torch.bincount(cells.long(), minlength=64), torch.ones(64).long())


@pytest.mark.parametrize(
    "kwargs, name",
    [
        (dict(dim=0, n=3), "dim"),
        (dict(dim=2, n=0), "n"),
        (dict(dim=2, n=2.5), "n"),
        (dict(dim=2, n=4, seed=-1), "seed"),
        (dict(dim=2, n=4, seed=1.5), "seed"),
        (dict(dim=2, n=4, dtype=torch.int32), "dtype"),
    ],
)
def test_sobol_bad_inputs(kwargs, name):
    with pytest.raises(ValueError, match=f"`{name}`"):
        sobol_support(**kwargs)
