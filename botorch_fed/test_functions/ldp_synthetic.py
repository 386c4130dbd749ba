r"""The synthetic RKHS test function of [LDP-BO] Sec. 5.1, as a BoTorch test function.

[LDP-BO] Sec. 5.1 ("Synthetic data"): the domain ``D`` is ``[0, 1]`` discretised
uniformly into 100 points; the black box is

.. math::

    f = \sum_{i=1}^{p} a_i\, k(\cdot, x_i), \qquad a_i \sim U[-1, 1],\quad
    x_i \text{ drawn uniformly from } D,\quad p = 100,

with the squared-exponential kernel ``k_SE(x, x') = exp(-s^2 / (2 l^2))`` (``l = 0.2``)
or the Matern kernel of [LDP-BO] Sec. 2,
``k(x, x') = 2^(1-nu) / Gamma(nu) (s sqrt(2 nu) / l)^nu K_nu(s sqrt(2 nu) / l)``
(``l = 0.2``, ``nu = 2.5``), ``s = |x - x'|``. Both kernels have ``k(x, x) = 1``
(Sec. 2, "bounded variance"). The paper sets ``B = max_{x in D} |f(x)|`` and observes
``y = f(x) + eta`` with ``eta ~ U[-1, 1]`` (LDP case, ``R = 1``) or Student-t noise
with 3 degrees of freedom (non-private heavy-tailed case); those noises live in
:class:`~botorch_fed.test_functions.noise.ObservationNoise` (the federation's
``FederationSetup(noise=...)``), not here: this class's ``noise_std`` is ordinary
additive Gaussian noise, like every other test function of the library.

.. warning::

    **Sign convention.** The paper *maximises* ``f`` (its regret is
    ``f(x*) - f(x_t)``, Eq. (1)). Every test function of botorch-fed, like BoTorch's,
    is a *minimisation* problem, so :meth:`LDPSynthetic.evaluate_true` returns
    ``-f(x)``. Minimising ``-f`` is the same problem as maximising ``f``: same
    optimiser, ``optimal_value = -max_D f``, and the same regret. ``negate=True``
    returns ``f`` itself. :attr:`LDPSynthetic.reward_bound` is ``max_D |f|``, which
    is the same for ``f`` and ``-f``.

The function is continuous on the whole interval (a continuous optimiser may
evaluate it anywhere in ``[0, 1]``), but the paper's problem is the finite domain
``D``: :attr:`LDPSynthetic.candidates` is the grid, and ``optimal_value``,
``optimizers`` and ``reward_bound`` are taken over the grid. The maximum of ``f``
over the whole interval can exceed the grid maximum slightly (an algorithm that
ignores ``candidates`` may then show a small negative regret).

Randomness: the coefficients ``a_i`` and the centres ``x_i`` come from
``torch.Generator().manual_seed(function_seed)`` (first ``p`` float64 uniforms for
``a_i = 2 u_i - 1``, then ``p`` grid indices from ``torch.randint``), so one
``function_seed`` is one function, independent of the global RNG and of the noise
seed.

References:

.. [LDP-BO] X. Zhou, J. Tan. Local differential privacy for Bayesian optimization
   (paper 002 in ``shared/papers``; AAAI 2021, arXiv:2010.06709), Sec. 2 (kernels,
   RKHS assumptions) and Sec. 5.1 (synthetic data).
"""

from __future__ import annotations

import math
import numbers

import torch
from botorch.test_functions.synthetic import SyntheticTestFunction
from torch import Tensor

from botorch_fed.test_functions.base import SeededNoiseMixin

LDP_KERNELS = ("se", "matern")
MATERN_NUS = (0.5, 1.5, 2.5)


def _is_real(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _is_int(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def ldp_kernel(s: Tensor, kernel: str, lengthscale: float, nu: float) -> Tensor:
    r"""The kernel of [LDP-BO] Sec. 2 as a function of the distance ``s >= 0``.

    Args:
        s: Distances (any shape, float).
        kernel: ``"se"``: ``exp(-s^2 / (2 l^2))``; ``"matern"``: the Matern kernel
            in the closed form of half-integer ``nu`` (``r = s / l``):
            ``exp(-r)`` (0.5), ``(1 + sqrt(3) r) exp(-sqrt(3) r)`` (1.5),
            ``(1 + sqrt(5) r + 5 r^2 / 3) exp(-sqrt(5) r)`` (2.5).
        lengthscale: ``l > 0``.
        nu: Smoothness of the Matern kernel (0.5, 1.5 or 2.5; ignored for ``"se"``).

    Returns:
        ``k`` with the shape of ``s``.
    """
    r = s / lengthscale
    if kernel == "se":
        return torch.exp(-0.5 * r.square())
    if nu == 0.5:
        return torch.exp(-r)
    if nu == 1.5:
        a = math.sqrt(3.0) * r
        return (1.0 + a) * torch.exp(-a)
    if nu == 2.5:
        a = math.sqrt(5.0) * r
        return (1.0 + a + a.square() / 3.0) * torch.exp(-a)
    raise ValueError(f"`nu` must be one of {MATERN_NUS}, got {nu!r}.")


class LDPSynthetic(SeededNoiseMixin, SyntheticTestFunction):
    r"""``-f`` for the random RKHS function ``f = sum_i a_i k(., x_i)`` of [LDP-BO] Sec. 5.1.

    A 1-D **minimisation** problem (see the module docstring: the paper maximises
    ``f``; this class returns ``-f``). Defaults are the paper's: 100 grid points on
    ``[0, 1]``, ``p = 100`` centres, SE kernel with ``l = 0.2`` (``kernel="matern"``
    with ``nu = 2.5`` for the paper's Matern variant).

    Args:
        kernel: ``"se"`` or ``"matern"``.
        lengthscale: ``l > 0``, in unit-interval coordinates (the domain is
            ``[0, 1]``; with custom ``bounds`` the function is stretched with the
            domain, so ``l`` stays a fraction of the domain's width).
        nu: Matern smoothness, one of 0.5, 1.5, 2.5 (closed forms; also checked,
            and reported in :attr:`kernel_hint`, for ``kernel="se"``, where it is
            unused).
        num_points: Size of the grid ``D`` (``>= 2``): ``num_points`` equispaced
            points including both ends of the domain (``i / (num_points - 1)``,
            correctly rounded, in unit coordinates).
        num_centers: ``p``, the number of kernel centres ``x_i`` (``>= 1``), drawn
            uniformly with replacement from the grid.
        function_seed: Seed (``>= 0``) of the generator of ``a_i`` and ``x_i``: the
            same seed is the same function.
        noise_std: Standard deviation of additive Gaussian observation noise
            (``None``: none). The paper's uniform / Student-t noises are
            :class:`~botorch_fed.test_functions.noise.ObservationNoise`.
        negate: If True, return ``f`` (the paper's maximisation form).
        bounds: Custom domain as one ``(lower, upper)`` pair (default ``[(0, 1)]``).
        dtype: The dtype of ``bounds`` and ``optimizers``.
        seed: Seed of the private ``torch.Generator`` of the Gaussian noise.
        generator: A ``torch.Generator`` to use instead of ``seed``.

    Attributes:
        candidates: ``num_points x 1`` float64 grid ``D`` in the function's domain.
        coefficients: ``p`` float64 coefficients ``a_i``.
        centers: ``p x 1`` float64 centres ``x_i`` in the function's domain.
        center_indices: ``p`` grid indices of the centres.
        reward_bound: ``B = max_{x in D} |f(x)|`` (float).
        kernel_hint: ``{"kernel", "lengthscale", "nu"}`` of the generating kernel
            (lengthscale in unit-cube coordinates).
        default_observation_noise: ``("uniform", 1.0)``: the paper's LDP setting
            ``eta ~ U[-1, 1]``, used by ``FederationSetup`` when no ``noise`` is named.

    Raises:
        ValueError: For an unknown ``kernel``, an unsupported ``nu``, a
            non-positive ``lengthscale``, too small ``num_points`` /
            ``num_centers``, a negative or non-integer ``function_seed``, or
            ``bounds`` that are not one increasing pair.
    """

    dim = 1
    continuous_inds = [0]
    _default_bounds = [(0.0, 1.0)]
    default_observation_noise: tuple[str, float] = ("uniform", 1.0)
    # buffers (registered in ``__init__``)
    coefficients: Tensor
    center_indices: Tensor
    centers: Tensor
    candidates: Tensor
    _unit_centers: Tensor

    def __init__(
        self,
        kernel: str = "se",
        lengthscale: float = 0.2,
        nu: float = 2.5,
        num_points: int = 100,
        num_centers: int = 100,
        function_seed: int = 0,
        noise_std: float | None = None,
        negate: bool = False,
        bounds: list[tuple[float, float]] | None = None,
        dtype: torch.dtype = torch.double,
        seed: int | None = None,
        generator: torch.Generator | None = None,
    ) -> None:
        if not isinstance(kernel, str) or kernel.lower() not in LDP_KERNELS:
            raise ValueError(f"`kernel` must be one of {LDP_KERNELS}, got {kernel!r}.")
        kernel = kernel.lower()
        if not (_is_real(lengthscale) and 0 < lengthscale < math.inf):
            raise ValueError(
                f"`lengthscale` must be a finite positive number, got {lengthscale!r}."
            )
        if not (_is_real(nu) and float(nu) in MATERN_NUS):
            raise ValueError(f"`nu` must be one of {MATERN_NUS}, got {nu!r}.")
        if not (_is_int(num_points) and num_points >= 2):
            raise ValueError(f"`num_points` must be an integer >= 2, got {num_points!r}.")
        if not (_is_int(num_centers) and num_centers >= 1):
            raise ValueError(f"`num_centers` must be an integer >= 1, got {num_centers!r}.")
        if not (_is_int(function_seed) and function_seed >= 0):
            raise ValueError(
                f"`function_seed` must be a non-negative integer, got {function_seed!r}."
            )
        if bounds is None:
            bounds = list(self._default_bounds)
        try:
            (lower, upper), *rest = bounds
            lower, upper = float(lower), float(upper)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"`bounds` must be one (lower, upper) pair, got {bounds!r}.") from exc
        if rest or not (math.isfinite(lower) and math.isfinite(upper) and lower < upper):
            raise ValueError(
                f"`bounds` must be one finite (lower, upper) pair with lower < upper, "
                f"got {bounds!r}."
            )
        # the bounds as stored in `dtype`, so that the grid lies within them
        lower, upper = (float(torch.tensor(v, dtype=dtype)) for v in (lower, upper))
        self.kernel = kernel
        self.lengthscale = float(lengthscale)
        self.nu = float(nu)
        self.num_points = int(num_points)
        self.num_centers = int(num_centers)
        self.function_seed = int(function_seed)

        # a_i ~ U[-1, 1], then x_i uniform on the grid (with replacement), Sec. 5.1
        g = torch.Generator(device="cpu").manual_seed(self.function_seed)
        coefficients = 2.0 * torch.rand(self.num_centers, generator=g, dtype=torch.float64) - 1.0
        center_indices = torch.randint(self.num_points, (self.num_centers,), generator=g)
        # i / (n - 1), correctly rounded (both ends exact)
        unit_grid = torch.arange(self.num_points, dtype=torch.float64) / (self.num_points - 1)
        unit_centers = unit_grid[center_indices]
        f_grid = self._f_unit(unit_grid, unit_centers, coefficients)
        best = int(torch.argmax(f_grid))  # the first grid maximiser on ties
        width = upper - lower
        grid = lower + width * unit_grid
        grid[-1] = upper  # exactly the upper end despite rounding
        self._optimal_value = -float(f_grid[best])
        self._optimizers = [(float(grid[best]),)]
        self._reward_bound = float(f_grid.abs().max())
        super().__init__(noise_std=noise_std, negate=negate, bounds=[(lower, upper)], dtype=dtype)
        self._init_noise_rng(seed=seed, generator=generator)
        self.register_buffer("coefficients", coefficients)
        self.register_buffer("center_indices", center_indices)
        self.register_buffer("centers", grid[center_indices].unsqueeze(-1))
        self.register_buffer("candidates", grid.unsqueeze(-1))
        self.register_buffer("_unit_centers", unit_centers)

    def _f_unit(self, u: Tensor, unit_centers: Tensor, coefficients: Tensor) -> Tensor:
        r"""``f`` at unit-interval points ``u`` (any shape), in float64.

        An elementwise product summed over the centres (not a matrix product, whose
        blocking depends on the batch size), so that a point's value does not
        depend on the batch it is evaluated in: the grid constants computed here
        are exactly what :meth:`evaluate_true` returns at the grid points.
        """
        s = (u.unsqueeze(-1) - unit_centers).abs()
        return (ldp_kernel(s, self.kernel, self.lengthscale, self.nu) * coefficients).sum(-1)

    def _evaluate_true(self, X: Tensor) -> Tensor:
        lower, upper = (float(b) for b in self.bounds[:, 0])
        u = (X[..., 0].to(torch.float64) - lower) / (upper - lower)
        device = X.device
        unit_centers = self._unit_centers.to(device, torch.float64)
        f = self._f_unit(u, unit_centers, self.coefficients.to(device, torch.float64))
        return (-f).to(X.dtype)  # minimisation convention: -f (see the module docstring)

    @property
    def reward_bound(self) -> float:
        r"""``B = max_{x in D} |f(x)|`` over the grid ([LDP-BO] Sec. 5.1)."""
        return self._reward_bound

    @property
    def kernel_hint(self) -> dict:
        r"""The generating kernel: ``{"kernel": "se" | "matern", "lengthscale": l,
        "nu": nu}``, lengthscale in unit-cube coordinates."""
        return {"kernel": self.kernel, "lengthscale": self.lengthscale, "nu": self.nu}


__all__ = ["LDPSynthetic", "LDP_KERNELS", "MATERN_NUS", "ldp_kernel"]
