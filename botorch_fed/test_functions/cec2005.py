r"""CEC-2005 F1-F20 as BoTorch ``SyntheticTestFunction``\ s.

Implemented from the definitions of the CEC-2005 report [CEC2005]_ (and the
conventions of its reference C/Matlab code), with the official shift vectors and
rotation matrices (see :mod:`botorch_fed.test_functions.cec2005_data`). [FBO-FedGP]
(Sec. 5, Table 1) benchmarks F1-F20 in 10-D. All functions are minimisation
problems with ``f(o) = bias``; ``negate=True`` turns them into maximisation problems
as in BoTorch. Every function is fully batched over ``batch_shape x d`` inputs of
any float dtype and device and differentiable almost everywhere.

==========  ===============================================  ===============  =======
class       function                                         bounds           bias
==========  ===============================================  ===============  =======
F1          shifted sphere                                   [-100, 100]^D    -450
F2          shifted Schwefel 1.2                             [-100, 100]^D    -450
F3          shifted rotated high-conditioned elliptic        [-100, 100]^D    -450
F4          shifted Schwefel 1.2 with noise in fitness       [-100, 100]^D    -450
F5          Schwefel 2.6, optimum on the bounds              [-100, 100]^D    -310
F6          shifted Rosenbrock                               [-100, 100]^D     390
F7          shifted rotated Griewank without bounds          [-600, 600]^D (*) -180
F8          shifted rotated Ackley, optimum on the bounds    [-32, 32]^D      -140
F9          shifted Rastrigin                                [-5, 5]^D        -330
F10         shifted rotated Rastrigin                        [-5, 5]^D        -330
F11         shifted rotated Weierstrass                      [-0.5, 0.5]^D      90
F12         Schwefel 2.13                                    [-pi, pi]^D      -460
F13         shifted expanded Griewank plus Rosenbrock        [-3, 1]^D        -130
F14         shifted rotated expanded Scaffer F6              [-100, 100]^D    -300
F15         hybrid composition function 1                    [-5, 5]^D         120
F16         rotated hybrid composition function 1            [-5, 5]^D         120
F17         F16 with noise in fitness                        [-5, 5]^D         120
F18         rotated hybrid composition function 2            [-5, 5]^D          10
F19         F18 with a narrow basin at the optimum           [-5, 5]^D          10
F20         F18 with the optimum on the bounds               [-5, 5]^D          10
==========  ===============================================  ===============  =======

Definitional choices (everything the report leaves open or the data files do not
say by themselves):

- **Dimensions.** ``dim`` in ``{2, 10, 30, 50}`` for every function (the
  dimensions of the official matrices; the report allows any ``D <= 100`` for the
  unrotated ones, we keep one rule). Others raise ``ValueError`` naming ``dim``.
  Default ``dim=10`` (the setting of [FBO-FedGP]). The 10/30/50-D matrices come
  from opfunu's files, the 2-D ones from ``optproblems`` (opfunu lacks them).
- **Conventions of the reference code.** Row vectors, ``z = (x - o) M``; the first
  ``D`` entries of the 100-long shift vectors; the top-left ``D x D`` blocks of
  F5's ``A`` and F12's ``a``, ``b``.
- **F2/F4** use the full Schwefel 1.2 sum ``sum_{i=1..D} (sum_{j<=i} z_j)^2``
  (opfunu drops the last term).
- **F4/F17 noise.** ``evaluate_true`` is the noise-free function. ``forward``
  applies the report's multiplicative noise ``(f - bias) (1 + s |N(0, 1)|) + bias``
  (``s = 0.4`` for F4, ``0.2`` for F17; change it with ``fitness_noise=``), then
  BoTorch's additive ``noise_std`` noise, then the negation. Both noises are
  drawn from the function's own ``torch.Generator`` when ``seed=`` or
  ``generator=`` is given (reproducible, global RNG untouched); without either
  they use the global torch RNG like BoTorch. ``forward(X, noise=False)`` is
  noise-free. Any function accepts ``seed``/``generator`` (for ``noise_std``).
- **F5.** The report's ``o_i = -100`` for ``i <= ceil(D/4)`` and ``o_i = 100`` for
  ``i >= max(floor(3D/4), 1)``, applied in this order (the note in the data
  package's ``global_optima.txt``): in 2-D both entries are 100. ``|A_i x - B_i|``
  with ``B = A o`` is evaluated as ``|A_i (x - o)|`` (same function, no
  cancellation).
- **F7** is "without bounds": the report only gives the initialisation range
  ``[0, 600]^D``, which does *not* contain ``o`` (all its entries are negative).
  BoTorch needs a box, so the default ``bounds`` are ``[-600, 600]^D``, the box
  symmetric to the initialisation range that contains ``o`` (and what the
  FBO-FedGP paper's F7 values, e.g. -169.28, require: over ``[0, 600]^10`` the
  minimum is about +1087). Pass ``bounds=[(0.0, 600.0)] * dim`` for the report's
  initialisation range; ``optimizers`` is only registered when the bounds contain
  ``o``. F7 is the only function that does not reject inputs outside its bounds,
  so ``F7(o) = -180`` can always be evaluated.
- **F8.** ``o_{2j-1} = -32`` for ``j = 1..floor(D/2)`` (1-based; the report's
  "optimum on the bounds"), the other entries are the file's values:
  deterministic (opfunu re-randomises them on every construction).
- **F12.** ``A_i - B_i(x)`` is evaluated as ``a_i (sin alpha - sin x) + b_i (cos
  alpha - cos x)`` (same function, exact zero at ``alpha``); ``optimizers`` =
  ``[alpha]`` (there may be further global minimisers).
- **F13** uses ``z = x - o + 1`` and the cyclic pairs ``(z_D, z_1)`` as in the report;
  the Griewank of a scalar ``r`` is ``r^2 / 4000 - cos(r) + 1``.
- **F11** (and the Weierstrass components of the compositions) is evaluated as
  ``sum_i (W(z_i) - W(0))`` with ``W(t) = sum_{k=0..20} a^k cos(2 pi b^k (t +
  0.5))``, ``a = 0.5``, ``b = 3``: the report's formula regrouped so that it is 0
  at ``z = 0`` to the last bit.
- **Compositions (F15-F20).** ``F(x) = sum_i w_i (C f_i((x - o_i) / lambda_i M_i) /
  |f_max,i| + bias_i) + f_bias`` with ``C = 2000``, ``bias_i = 0, 100, ..., 900``,
  ``f_max,i = f_i((5 / lambda_i) 1 M_i)`` and weights ``w_i = exp(-|x - o_i|^2 /
  (2 D sigma_i^2))``, multiplied by ``1 - max_j(w_j)^10`` unless ``w_i`` is the
  maximum, then normalised. The weights are computed relative to the maximum
  (in log space): identical to the reference whenever its weight sum is non-zero,
  and never ``0 / 0`` far from all optima. F15 uses identity matrices (report);
  F16/F17 the ``hybrid_func1`` matrices; F18-F20 the ``hybrid_func2`` optima and
  matrices with ``o_10 = 0`` (report), F19 with ``sigma_1 = 0.1``, ``lambda_1 =
  0.1 * 5 / 32``, F20 with ``o_{1,2j} = 5`` (1-based even entries on the upper
  bound).
- **Bounds** are checked like BoTorch 0.18 does (``ValueError`` outside them),
  except for F7. ``optimizers = [o]`` whenever ``o`` is in the bounds (always, for
  the default bounds, except F7). For F5, F8 and F20 ``o`` lies on the boundary.

Known defects of opfunu's own classes that this module does not share: F2/F4
drop the last term of the outer sum, F8 re-randomises half of its shift, F4/F17
draw their noise from numpy's global RNG.

References:

.. [CEC2005] P. N. Suganthan, N. Hansen, J. J. Liang, K. Deb, Y.-P. Chen, A. Auger,
   S. Tiwari. Problem definitions and evaluation criteria for the CEC 2005 special
   session on real-parameter optimization. KanGAL report 2005005, 2005.
.. [FBO-FedGP] Secure federated Bayesian optimisation with distributed sparse GPs
   and multiparty homomorphic encryption (paper 000 in ``shared/papers``).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from botorch.test_functions.synthetic import SyntheticTestFunction
from torch import Tensor

from botorch_fed.test_functions.base import SeededNoiseMixin
from botorch_fed.test_functions.cec2005_data import (
    SUPPORTED_DIMS,
    CEC2005Data,
    load_cec2005_data,
    validate_dim,
)

# ---------------------------------------------------------------------------------
# Basic functions: unshifted, unbiased, ``... x d -> ...``, minimum 0 at the origin
# (Rosenbrock at 1). They run in the dtype/device of their input.
# ---------------------------------------------------------------------------------

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


# ---------------------------------------------------------------------------------
# Base class
# ---------------------------------------------------------------------------------


class CEC2005Function(SeededNoiseMixin, SyntheticTestFunction):
    r"""Base class of the CEC-2005 functions (see the module docstring).

    Subclasses set ``number``, ``bias``, ``default_bound`` and implement
    ``_evaluate_true``. The official data are buffers (float64) and are cast to the
    input's dtype and device at evaluation time.
    """

    number: int
    bias: float
    default_bound: tuple[float, float]
    # Whether o may lie outside the (default or custom) bounds (F7 only).
    _optimum_may_lie_outside: bool = False
    _check_grad_at_opt: bool = False

    def __init__(
        self,
        dim: int = 10,
        noise_std: float | None = None,
        negate: bool = False,
        bounds: list[tuple[float, float]] | None = None,
        dtype: torch.dtype = torch.double,
        seed: int | None = None,
        generator: torch.Generator | None = None,
    ) -> None:
        r"""
        Args:
            dim: The input dimension, one of ``(2, 10, 30, 50)``.
            noise_std: Standard deviation of additive Gaussian observation noise.
            negate: If True, negate the function (maximisation).
            bounds: Custom bounds as ``dim`` (lower, upper) pairs; default: the
                report's search range (initialisation range for F7).
            dtype: The dtype of ``bounds`` and ``optimizers``.
            seed: Seed of the private ``torch.Generator`` used for all noise.
            generator: A ``torch.Generator`` to use instead of ``seed``.

        Raises:
            ValueError: If ``dim`` is not supported.
            ImportError: If the data packages of ``botorch-fed[cec]`` are missing.
        """
        validate_dim(self.number, dim)
        data = load_cec2005_data(self.number, int(dim))
        self.dim = int(dim)
        self.continuous_inds = list(range(self.dim))
        if bounds is None:
            bounds = [tuple(self.default_bound) for _ in range(self.dim)]
        self._optimal_value = float(self.bias)
        optimum = tuple(float(v) for v in data.optimum)
        if not self._optimum_may_lie_outside or _in_bounds(optimum, bounds):
            self._optimizers = [optimum]
        else:
            self._optimizers = None
        super().__init__(noise_std=noise_std, negate=negate, bounds=bounds, dtype=dtype)
        self.data_sources: tuple[str, ...] = data.sources
        self._register_data(data)
        self._init_noise_rng(seed=seed, generator=generator)

    def _register_data(self, data: CEC2005Data) -> None:
        self.register_buffer("shift", _tensor(data.shift))
        if data.matrix is not None:
            self.register_buffer("matrix", _tensor(data.matrix))

    def _shifted(self, X: Tensor) -> Tensor:
        return X - self.shift.to(X)

    def _rotated(self, X: Tensor) -> Tensor:
        return self._shifted(X) @ self.matrix.to(X)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(dim={self.dim}, bias={self.bias:g})"


def _tensor(array) -> Tensor:
    return torch.tensor(array, dtype=torch.float64)


def _in_bounds(point: tuple[float, ...], bounds: list[tuple[float, float]]) -> bool:
    return all(lo <= v <= hi for v, (lo, hi) in zip(point, bounds, strict=True))


class _FitnessNoiseMixin:
    r"""The report's multiplicative noise of F4 and F17 (applied in ``forward``)."""

    fitness_noise: float

    def _apply_fitness_noise(self, f: Tensor) -> Tensor:
        if self.fitness_noise == 0.0:
            return f
        factor = 1.0 + self.fitness_noise * self._randn(f.shape, f).abs()
        return (f - self.bias) * factor + self.bias


# ---------------------------------------------------------------------------------
# F1-F14
# ---------------------------------------------------------------------------------


class CEC2005F1(CEC2005Function):
    r"""F1: shifted sphere, ``sum z_i^2 - 450``, ``z = x - o``."""

    number, bias, default_bound = 1, -450.0, (-100.0, 100.0)
    _check_grad_at_opt = True

    def _evaluate_true(self, X: Tensor) -> Tensor:
        return sphere(self._shifted(X)) + self.bias


class CEC2005F2(CEC2005Function):
    r"""F2: shifted Schwefel 1.2, ``sum_{i=1..D} (sum_{j<=i} z_j)^2 - 450``."""

    number, bias, default_bound = 2, -450.0, (-100.0, 100.0)
    _check_grad_at_opt = True

    def _evaluate_true(self, X: Tensor) -> Tensor:
        return schwefel_1_2(self._shifted(X)) + self.bias


class CEC2005F3(CEC2005Function):
    r"""F3: shifted rotated high-conditioned elliptic, ``z = (x - o) M``, bias -450."""

    number, bias, default_bound = 3, -450.0, (-100.0, 100.0)
    _check_grad_at_opt = True

    def _evaluate_true(self, X: Tensor) -> Tensor:
        return high_conditioned_elliptic(self._rotated(X)) + self.bias


class CEC2005F4(_FitnessNoiseMixin, CEC2005Function):
    r"""F4: shifted Schwefel 1.2 with noise in fitness, bias -450.

    ``F4(x) = S(x - o) (1 + 0.4 |N(0, 1)|) - 450`` with ``S`` Schwefel 1.2;
    ``evaluate_true`` is the noise-free value, ``forward`` applies the noise.
    """

    number, bias, default_bound = 4, -450.0, (-100.0, 100.0)

    def __init__(
        self,
        dim: int = 10,
        noise_std: float | None = None,
        negate: bool = False,
        bounds: list[tuple[float, float]] | None = None,
        dtype: torch.dtype = torch.double,
        seed: int | None = None,
        generator: torch.Generator | None = None,
        fitness_noise: float = 0.4,
    ) -> None:
        r"""See :class:`CEC2005Function`; ``fitness_noise`` is the factor ``s`` of
        the multiplicative noise ``1 + s |N(0, 1)|`` (report: 0.4; 0 disables it)."""
        self.fitness_noise = float(fitness_noise)
        super().__init__(dim, noise_std, negate, bounds, dtype, seed, generator)

    def _evaluate_true(self, X: Tensor) -> Tensor:
        return schwefel_1_2(self._shifted(X)) + self.bias


class CEC2005F5(CEC2005Function):
    r"""F5: Schwefel's problem 2.6 with the optimum on the bounds, bias -310.

    ``max_i |A_i x - B_i|`` with ``B_i = A_i o``.
    """

    number, bias, default_bound = 5, -310.0, (-100.0, 100.0)

    def _register_data(self, data: CEC2005Data) -> None:
        super()._register_data(data)
        self.register_buffer("A", _tensor(data.extra["A"]))

    def _evaluate_true(self, X: Tensor) -> Tensor:
        return schwefel_2_6(self._shifted(X), self.A.to(X)) + self.bias


class CEC2005F6(CEC2005Function):
    r"""F6: shifted Rosenbrock, ``z = x - o + 1``, bias 390."""

    number, bias, default_bound = 6, 390.0, (-100.0, 100.0)
    _check_grad_at_opt = True

    def _evaluate_true(self, X: Tensor) -> Tensor:
        return rosenbrock(self._shifted(X) + 1.0) + self.bias


class CEC2005F7(CEC2005Function):
    r"""F7: shifted rotated Griewank without bounds, ``z = (x - o) M``, bias -180.

    Default bounds ``[-600, 600]^D`` (they contain ``o``; the report's
    initialisation range ``[0, 600]^D`` does not); inputs outside the bounds are
    accepted (see the module docstring).
    """

    number, bias, default_bound = 7, -180.0, (-600.0, 600.0)
    _optimum_may_lie_outside = True
    _enforce_bounds = False
    _check_grad_at_opt = True

    def _evaluate_true(self, X: Tensor) -> Tensor:
        return griewank(self._rotated(X)) + self.bias


class CEC2005F8(CEC2005Function):
    r"""F8: shifted rotated Ackley with the optimum on the bounds, bias -140."""

    number, bias, default_bound = 8, -140.0, (-32.0, 32.0)

    def _evaluate_true(self, X: Tensor) -> Tensor:
        return ackley(self._rotated(X)) + self.bias


class CEC2005F9(CEC2005Function):
    r"""F9: shifted Rastrigin, ``z = x - o``, bias -330."""

    number, bias, default_bound = 9, -330.0, (-5.0, 5.0)
    _check_grad_at_opt = True

    def _evaluate_true(self, X: Tensor) -> Tensor:
        return rastrigin(self._shifted(X)) + self.bias


class CEC2005F10(CEC2005Function):
    r"""F10: shifted rotated Rastrigin, ``z = (x - o) M``, bias -330."""

    number, bias, default_bound = 10, -330.0, (-5.0, 5.0)
    _check_grad_at_opt = True

    def _evaluate_true(self, X: Tensor) -> Tensor:
        return rastrigin(self._rotated(X)) + self.bias


class CEC2005F11(CEC2005Function):
    r"""F11: shifted rotated Weierstrass (a = 0.5, b = 3, k_max = 20), bias 90."""

    number, bias, default_bound = 11, 90.0, (-0.5, 0.5)

    def _evaluate_true(self, X: Tensor) -> Tensor:
        return weierstrass(self._rotated(X)) + self.bias


class CEC2005F12(CEC2005Function):
    r"""F12: Schwefel's problem 2.13, ``sum_i (A_i - B_i(x))^2 - 460`` with
    ``A_i = sum_j a_ij sin(alpha_j) + b_ij cos(alpha_j)`` and ``B_i(x)`` the same
    at ``x``; the optimum is ``alpha``."""

    number, bias, default_bound = 12, -460.0, (-math.pi, math.pi)
    _check_grad_at_opt = True

    def _register_data(self, data: CEC2005Data) -> None:
        self.register_buffer("a", _tensor(data.extra["a"]))
        self.register_buffer("b", _tensor(data.extra["b"]))
        self.register_buffer("alpha", _tensor(data.extra["alpha"]))

    def _evaluate_true(self, X: Tensor) -> Tensor:
        alpha = self.alpha.to(X)
        d_sin = torch.sin(alpha) - torch.sin(X)
        d_cos = torch.cos(alpha) - torch.cos(X)
        diff = d_sin @ self.a.to(X).transpose(-1, -2) + d_cos @ self.b.to(X).transpose(-1, -2)
        return diff.square().sum(dim=-1) + self.bias


class CEC2005F13(CEC2005Function):
    r"""F13: shifted expanded Griewank plus Rosenbrock (F8F2), ``z = x - o + 1``,
    bias -130."""

    number, bias, default_bound = 13, -130.0, (-3.0, 1.0)
    _check_grad_at_opt = True

    def _evaluate_true(self, X: Tensor) -> Tensor:
        return expanded_griewank_rosenbrock(self._shifted(X) + 1.0) + self.bias


class CEC2005F14(CEC2005Function):
    r"""F14: shifted rotated expanded Scaffer's F6, ``z = (x - o) M``, bias -300."""

    number, bias, default_bound = 14, -300.0, (-100.0, 100.0)

    def _evaluate_true(self, X: Tensor) -> Tensor:
        return expanded_scaffer_f6(self._rotated(X)) + self.bias


# ---------------------------------------------------------------------------------
# Hybrid composition functions F15-F20
# ---------------------------------------------------------------------------------


class CEC2005CompositionFunction(CEC2005Function):
    r"""Hybrid composition of ten basic functions (F15-F20; report Sec. 2.15).

    Class attributes: ``components`` (ten names of basic functions), ``sigmas``,
    ``lambdas``; ``C = 2000``, ``component_biases = 0, 100, ..., 900``.
    """

    components: tuple[str, ...]
    sigmas: tuple[float, ...]
    lambdas: tuple[float, ...]
    C: float = 2000.0
    component_biases: tuple[float, ...] = tuple(100.0 * i for i in range(10))
    default_bound = (-5.0, 5.0)

    def _register_data(self, data: CEC2005Data) -> None:
        super()._register_data(data)  # shift: 10 x d, matrix: 10 x d x d
        self.register_buffer("sigma", torch.tensor(self.sigmas, dtype=torch.float64))
        self.register_buffer("lam", torch.tensor(self.lambdas, dtype=torch.float64))
        self.register_buffer(
            "component_bias", torch.tensor(self.component_biases, dtype=torch.float64)
        )
        # f_max,i = |f_i((y / lambda_i) M_i)|, y = 5 * ones(D)   (float64)
        y = torch.full((10, 1, self.dim), 5.0, dtype=torch.float64) / self.lam.view(10, 1, 1)
        f_max = self._component_values((y @ self.matrix).squeeze(-2)).abs()
        self.register_buffer("f_max", f_max)

    def _component_values(self, z: Tensor) -> Tensor:
        r"""``... x 10 x d`` transformed inputs -> ``... x 10`` raw ``f_i(z_i)``."""
        return torch.stack(
            [_BASIC[name](z[..., i, :]) for i, name in enumerate(self.components)],
            dim=-1,
        )

    def _weights(self, diff: Tensor) -> Tensor:
        r"""Normalised weights ``... x 10`` from ``diff = x - o_i`` (``... x 10 x d``)."""
        sigma = self.sigma.to(diff)
        log_w = -diff.square().sum(dim=-1) / (2.0 * self.dim * sigma.square())
        log_w_max = log_w.amax(dim=-1, keepdim=True)
        is_max = log_w == log_w_max
        w_rel = torch.exp(log_w - log_w_max)  # w_i / max_j w_j, in (0, 1]
        damp = 1.0 - torch.exp(10.0 * log_w_max)  # 1 - max_j(w_j)^10
        w_rel = torch.where(is_max, w_rel, w_rel * damp)
        return w_rel / w_rel.sum(dim=-1, keepdim=True)

    def _composition(self, X: Tensor) -> Tensor:
        diff = X.unsqueeze(-2) - self.shift.to(X)  # ... x 10 x d
        w = self._weights(diff)
        z = diff / self.lam.to(X).unsqueeze(-1)
        z = (z.unsqueeze(-2) @ self.matrix.to(X)).squeeze(-2)  # ... x 10 x d
        values = self._component_values(z)
        scaled = self.C * values / self.f_max.to(X) + self.component_bias.to(X)
        return (w * scaled).sum(dim=-1)

    def _evaluate_true(self, X: Tensor) -> Tensor:
        return self._composition(X) + self.bias


_COMPOSITION_1 = (
    "rastrigin",
    "rastrigin",
    "weierstrass",
    "weierstrass",
    "griewank",
    "griewank",
    "ackley",
    "ackley",
    "sphere",
    "sphere",
)
_LAMBDAS_1 = (1.0, 1.0, 10.0, 10.0, 5.0 / 60.0, 5.0 / 60.0, 5.0 / 32.0, 5.0 / 32.0)
_LAMBDAS_1 += (5.0 / 100.0, 5.0 / 100.0)

_COMPOSITION_2 = (
    "ackley",
    "ackley",
    "rastrigin",
    "rastrigin",
    "sphere",
    "sphere",
    "weierstrass",
    "weierstrass",
    "griewank",
    "griewank",
)
_SIGMAS_2 = (1.0, 2.0, 1.5, 1.5, 1.0, 1.0, 1.5, 1.5, 2.0, 2.0)
_LAMBDAS_2 = (2.0 * 5.0 / 32.0, 5.0 / 32.0, 2.0, 1.0, 2.0 * 5.0 / 100.0, 5.0 / 100.0)
_LAMBDAS_2 += (20.0, 10.0, 2.0 * 5.0 / 60.0, 5.0 / 60.0)


class CEC2005F15(CEC2005CompositionFunction):
    r"""F15: hybrid composition function 1 (Rastrigin, Weierstrass, Griewank,
    Ackley, sphere; two each), ``sigma_i = 1``, identity ``M_i``, bias 120."""

    number, bias = 15, 120.0
    components, sigmas, lambdas = _COMPOSITION_1, (1.0,) * 10, _LAMBDAS_1


class CEC2005F16(CEC2005CompositionFunction):
    r"""F16: rotated hybrid composition function 1 (F15 with the official
    ``M_i``), bias 120."""

    number, bias = 16, 120.0
    components, sigmas, lambdas = _COMPOSITION_1, (1.0,) * 10, _LAMBDAS_1


class CEC2005F17(_FitnessNoiseMixin, CEC2005CompositionFunction):
    r"""F17: F16 with noise in fitness, ``G(x) (1 + 0.2 |N(0, 1)|) + 120`` with
    ``G = F16 - 120``; ``evaluate_true`` is noise-free, ``forward`` adds the noise."""

    number, bias = 17, 120.0
    components, sigmas, lambdas = _COMPOSITION_1, (1.0,) * 10, _LAMBDAS_1

    def __init__(
        self,
        dim: int = 10,
        noise_std: float | None = None,
        negate: bool = False,
        bounds: list[tuple[float, float]] | None = None,
        dtype: torch.dtype = torch.double,
        seed: int | None = None,
        generator: torch.Generator | None = None,
        fitness_noise: float = 0.2,
    ) -> None:
        r"""See :class:`CEC2005Function`; ``fitness_noise`` is the factor ``s`` of
        the multiplicative noise ``1 + s |N(0, 1)|`` (report: 0.2; 0 disables it)."""
        self.fitness_noise = float(fitness_noise)
        super().__init__(dim, noise_std, negate, bounds, dtype, seed, generator)


class CEC2005F18(CEC2005CompositionFunction):
    r"""F18: rotated hybrid composition function 2 (Ackley, Rastrigin, sphere,
    Weierstrass, Griewank; two each), ``o_10 = 0``, bias 10."""

    number, bias = 18, 10.0
    components, sigmas, lambdas = _COMPOSITION_2, _SIGMAS_2, _LAMBDAS_2


class CEC2005F19(CEC2005CompositionFunction):
    r"""F19: F18 with a narrow basin for the global optimum (``sigma_1 = 0.1``,
    ``lambda_1 = 0.1 * 5 / 32``), bias 10."""

    number, bias = 19, 10.0
    components = _COMPOSITION_2
    sigmas = (0.1,) + _SIGMAS_2[1:]
    lambdas = (0.1 * 5.0 / 32.0,) + _LAMBDAS_2[1:]


class CEC2005F20(CEC2005CompositionFunction):
    r"""F20: F18 with the global optimum on the bounds (``o_{1,2j} = 5``), bias 10."""

    number, bias = 20, 10.0
    components, sigmas, lambdas = _COMPOSITION_2, _SIGMAS_2, _LAMBDAS_2


CEC2005_FUNCTIONS: dict[int, type[CEC2005Function]] = {
    cls.number: cls
    for cls in (
        CEC2005F1,
        CEC2005F2,
        CEC2005F3,
        CEC2005F4,
        CEC2005F5,
        CEC2005F6,
        CEC2005F7,
        CEC2005F8,
        CEC2005F9,
        CEC2005F10,
        CEC2005F11,
        CEC2005F12,
        CEC2005F13,
        CEC2005F14,
        CEC2005F15,
        CEC2005F16,
        CEC2005F17,
        CEC2005F18,
        CEC2005F19,
        CEC2005F20,
    )
}

__all__ = [
    "CEC2005_FUNCTIONS",
    "SUPPORTED_DIMS",
    "CEC2005CompositionFunction",
    "CEC2005Function",
    "CEC2005F1",
    "CEC2005F2",
    "CEC2005F3",
    "CEC2005F4",
    "CEC2005F5",
    "CEC2005F6",
    "CEC2005F7",
    "CEC2005F8",
    "CEC2005F9",
    "CEC2005F10",
    "CEC2005F11",
    "CEC2005F12",
    "CEC2005F13",
    "CEC2005F14",
    "CEC2005F15",
    "CEC2005F16",
    "CEC2005F17",
    "CEC2005F18",
    "CEC2005F19",
    "CEC2005F20",
]
