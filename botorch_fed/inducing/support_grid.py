r"""Data-independent support sets on the unit cube: a regular grid and Sobol points.

Co-KG ([Co-KG]) discretises every agent's GP posterior on one support shared by the
federation: the slides use a regular ``10 x 10`` (or ``30 x 30``) grid in 2-D and name
supports for higher dimensions as future work. :func:`grid_support` builds the grid
(``points_per_dim^d`` points, so only for small ``d``); :func:`sobol_support` draws a
scrambled Sobol sample of any size, the natural replacement for ``d > 2``. Both are
functions of public settings only, so every party can compute (and check) the
support itself and it reveals nothing about anybody's data. A data-dependent support
(the k-means support of FBO-FedGP) is :func:`~botorch_fed.inducing.global_support`.

References:

.. [Co-KG] D. Zhan, H. Zhang, R. Righter, Z. Zheng, J. Anderson. Collaborative
   Bayesian optimization via Wasserstein barycenters (paper 001 in ``shared/papers``;
   slides, IEEE CDC 2025).
"""

from __future__ import annotations

import torch
from botorch.utils.sampling import draw_sobol_samples
from torch import Tensor

MAX_GRID_POINTS = 65_536


def _check_int(value: object, name: str, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"`{name}` must be an int >= {minimum}, got {value!r}.")
    return value


def _check_float_dtype(dtype: torch.dtype) -> torch.dtype:
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ValueError(f"`dtype` must be a floating-point torch.dtype, got {dtype!r}.")
    return dtype


def grid_support(
    dim: int,
    points_per_dim: int,
    *,
    max_points: int = MAX_GRID_POINTS,
    dtype: torch.dtype = torch.float64,
    device: torch.device | str | None = None,
) -> Tensor:
    r"""The regular grid on ``[0, 1]^dim`` with ``points_per_dim`` points per axis.

    Each axis takes ``linspace(0, 1, points_per_dim)`` (its end points included; one
    point per axis is the centre ``0.5``); the points are listed in lexicographic
    order, the last coordinate varying fastest (``torch.cartesian_prod``).

    Args:
        dim: The dimension ``d >= 1``.
        points_per_dim: Points per axis ``m >= 1``.
        max_points: Refuse grids with more than this many points (``m^d`` grows fast).
        dtype: Floating-point dtype of the result.
        device: Device of the result.

    Returns:
        The ``m^d x d`` grid.

    Raises:
        ValueError: ``dim``, ``points_per_dim`` or ``max_points`` not a positive int, a
            non-floating ``dtype``, or more than ``max_points`` points.

    Example:
        >>> grid_support(2, 3)[:4]
        tensor([[0.0000, 0.0000],
                [0.0000, 0.5000],
                [0.0000, 1.0000],
                [0.5000, 0.0000]], dtype=torch.float64)
    """
    dim = _check_int(dim, "dim")
    m = _check_int(points_per_dim, "points_per_dim")
    max_points = _check_int(max_points, "max_points")
    dtype = _check_float_dtype(dtype)
    if m**dim > max_points:
        raise ValueError(
            f"A grid with `points_per_dim`={m} in `dim`={dim} dimensions has {m}^{dim} = "
            f"{m**dim} points, more than `max_points`={max_points}; use fewer points per "
            "axis or a Sobol support (sobol_support) for d > 2."
        )
    axis = (
        torch.full((1,), 0.5, dtype=dtype, device=device)
        if m == 1
        else torch.linspace(0.0, 1.0, m, dtype=dtype, device=device)
    )
    if dim == 1:
        return axis.unsqueeze(-1)
    return torch.cartesian_prod(*([axis] * dim))


def sobol_support(
    dim: int,
    n: int,
    seed: int | None = None,
    *,
    dtype: torch.dtype = torch.float64,
    device: torch.device | str | None = None,
) -> Tensor:
    r"""``n`` scrambled Sobol points in ``[0, 1]^dim``.

    ``draw_sobol_samples`` on the unit cube (torch's ``SobolEngine`` with scrambling):
    the same ``seed`` gives the same points on every party. For ``n = 2^k`` the points
    form a digital net: in 2-D every cell of every ``2^a x 2^b`` partition of the square
    with ``a + b = k`` holds exactly one point.

    Args:
        dim: The dimension ``d >= 1`` (at most 21201, ``SobolEngine``'s limit).
        n: Number of points ``>= 1``.
        seed: Seed of the scrambling (``None``: fresh randomness).
        dtype: Floating-point dtype of the result.
        device: Device of the result.

    Returns:
        The ``n x d`` points.

    Raises:
        ValueError: ``dim`` or ``n`` not a positive int, ``seed`` not an int >= 0 or
            ``None``, a non-floating ``dtype``.
    """
    dim = _check_int(dim, "dim")
    n = _check_int(n, "n")
    if seed is not None:
        seed = _check_int(seed, "seed", minimum=0)
    dtype = _check_float_dtype(dtype)
    bounds = torch.zeros(2, dim, dtype=dtype, device=device)
    bounds[1] = 1.0
    return draw_sobol_samples(bounds=bounds, n=n, q=1, seed=seed).squeeze(-2)


__all__ = ["MAX_GRID_POINTS", "grid_support", "sobol_support"]
