r"""The basic functions the CEC-2005 problems are built from [CEC2005]_.

Unshifted, unbiased, ``... x d -> ...``, minimum 0 at the origin (Rosenbrock and the
expanded Griewank-Rosenbrock at 1). They run in the dtype and on the device of their
input. ``_BASIC`` names the five that the hybrid compositions F15-F20 mix.

References:

.. [CEC2005] P. N. Suganthan, N. Hansen, J. J. Liang, K. Deb, Y.-P. Chen, A. Auger,
   S. Tiwari. Problem definitions and evaluation criteria for the CEC 2005 special
   session on real-parameter optimization. KanGAL report 2005005, 2005.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

_TWO_PI = 2.0 * math.pi


def sphere(z: Tensor) -> Tensor:
    r"""``sum_i z_i^2``."""
    return z.square().sum(dim=-1)


def schwefel_1_2(z: Tensor) -> Tensor:
    r"""Schwefel's problem 1.2: ``sum_{i=1..D} (sum_{j=1..i} z_j)^2``."""
    return torch.cumsum(z, dim=-1).square().sum(dim=-1)


def high_conditioned_elliptic(z: Tensor) -> Tensor:
    r"""``sum_i (10^6)^((i - 1) / (D - 1)) z_i^2``."""
    d = z.shape[-1]
    exponent = torch.arange(d, dtype=z.dtype, device=z.device) / max(d - 1, 1)
    return (torch.pow(10.0, 6.0 * exponent) * z.square()).sum(dim=-1)


def schwefel_2_6(z: Tensor, A: Tensor) -> Tensor:
    r"""``max_i |A_i z|`` (F5 with ``z = x - o``, i.e. ``|A_i x - B_i|``, ``B = A o``)."""
    return (z @ A.transpose(-1, -2)).abs().amax(dim=-1)


def rosenbrock(z: Tensor) -> Tensor:
    r"""``sum_{i<D} 100 (z_i^2 - z_{i+1})^2 + (z_i - 1)^2`` (minimum 0 at ``z = 1``)."""
    head, tail = z[..., :-1], z[..., 1:]
    return (100.0 * (head.square() - tail).square() + (head - 1.0).square()).sum(dim=-1)


def griewank(z: Tensor) -> Tensor:
    r"""``sum_i z_i^2 / 4000 - prod_i cos(z_i / sqrt(i)) + 1``."""
    d = z.shape[-1]
    sqrt_i = torch.arange(1, d + 1, dtype=z.dtype, device=z.device).sqrt()
    return z.square().sum(dim=-1) / 4000.0 - torch.cos(z / sqrt_i).prod(dim=-1) + 1.0


def ackley(z: Tensor) -> Tensor:
    r"""``-20 exp(-0.2 sqrt(mean z^2)) - exp(mean cos(2 pi z)) + 20 + e``."""
    d = z.shape[-1]
    # vector_norm has a zero (sub)gradient at the origin, unlike sqrt(sum z^2).
    rms = torch.linalg.vector_norm(z, dim=-1) / math.sqrt(d)
    mean_cos = torch.cos(_TWO_PI * z).mean(dim=-1)
    return -20.0 * torch.exp(-0.2 * rms) - torch.exp(mean_cos) + 20.0 + math.e


def rastrigin(z: Tensor) -> Tensor:
    r"""``sum_i z_i^2 - 10 cos(2 pi z_i) + 10``."""
    return (z.square() - 10.0 * torch.cos(_TWO_PI * z) + 10.0).sum(dim=-1)


def _weierstrass_terms(t: Tensor, a: float, b: float, k_max: int) -> Tensor:
    k = torch.arange(k_max + 1, dtype=t.dtype, device=t.device)
    a_k = torch.pow(a, k)
    two_pi_b_k = _TWO_PI * torch.pow(b, k)
    return (a_k * torch.cos(two_pi_b_k * (t.unsqueeze(-1) + 0.5))).sum(dim=-1)


def weierstrass(z: Tensor, a: float = 0.5, b: float = 3.0, k_max: int = 20) -> Tensor:
    r"""``sum_i sum_{k<=k_max} a^k cos(2 pi b^k (z_i + 0.5)) - D sum_k a^k cos(pi b^k)``.

    Evaluated as ``sum_i (W(z_i) - W(0))``, which is exactly 0 at the origin.
    """
    w0 = _weierstrass_terms(torch.zeros((), dtype=z.dtype, device=z.device), a, b, k_max)
    return (_weierstrass_terms(z, a, b, k_max) - w0).sum(dim=-1)


def expanded_scaffer_f6(z: Tensor) -> Tensor:
    r"""``sum_i F(z_i, z_{i+1})`` (cyclic, ``z_{D+1} = z_1``) with Scaffer's F6
    ``F(x, y) = 0.5 + (sin^2(sqrt(x^2 + y^2)) - 0.5) / (1 + 0.001 (x^2 + y^2))^2``."""
    pair = torch.stack([z, torch.roll(z, shifts=-1, dims=-1)], dim=-1)
    radius = torch.linalg.vector_norm(pair, dim=-1)
    sq = radius.square()
    return (0.5 + (torch.sin(radius).square() - 0.5) / (1.0 + 0.001 * sq).square()).sum(dim=-1)


def expanded_griewank_rosenbrock(z: Tensor) -> Tensor:
    r"""F8F2: ``sum_i G(R(z_i, z_{i+1}))`` (cyclic) with the 2-D Rosenbrock
    ``R(x, y) = 100 (x^2 - y)^2 + (x - 1)^2`` and the 1-D Griewank
    ``G(r) = r^2 / 4000 - cos(r) + 1`` (minimum 0 at ``z = 1``)."""
    nxt = torch.roll(z, shifts=-1, dims=-1)
    r = 100.0 * (z.square() - nxt).square() + (z - 1.0).square()
    return (r.square() / 4000.0 - torch.cos(r) + 1.0).sum(dim=-1)


_BASIC: dict[str, Callable[[Tensor], Tensor]] = {
    "sphere": sphere,
    "rastrigin": rastrigin,
    "weierstrass": weierstrass,
    "griewank": griewank,
    "ackley": ackley,
}
