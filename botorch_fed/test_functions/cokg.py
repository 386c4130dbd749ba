r"""The 2-D synthetic test functions of [Co-KG] as BoTorch ``SyntheticTestFunction``\ s.

The slides (paper 001, "Experimental Setup -> Tasks -> Synthetic") give

- ``f_1(x) = x_1^2 + x_2^2 + sin(2 pi x_1) + cos(2 pi x_2)`` (a bowl with sin/cos
  ripples), and
- ``f_2(x) = (1 - x_1)^2 + 100 (x_2 - x_1^2)^2`` (Rosenbrock),

but neither their domains nor whether the reported regret is for minimisation.
Our reading, stated here because the slides are ambiguous:

- Both are **minimisation** problems, BoTorch's convention (the slides phrase BO as
  maximising ``f``; both functions are unbounded above and bowl-shaped, so the
  meaningful task is to minimise them, i.e. maximise ``-f``: pass ``negate=True``
  for a maximisation algorithm).
- **Domains**: ``[-1, 1]^2`` for ``f_1`` (two ripple periods per axis around the bowl,
  which the 10x10 and 30x30 support grids of the slides resolve) and ``[-2, 2]^2``
  for ``f_2`` (the classic 2-D Rosenbrock box). Override with ``bounds=``.
- ``f_1`` is separable: its minimisers solve ``2 x_1 + 2 pi cos(2 pi x_1) = 0`` and
  ``2 x_2 - 2 pi sin(2 pi x_2) = 0``. There are two global minimisers,
  ``(-0.23793454..., +-0.47580245...)``, with value ``-1.70259153...`` (computed to
  30 digits with mpmath's ``findroot``; both lie inside ``[-1, 1]^2``).
- ``f_2`` has its minimum 0 at ``(1, 1)``.

References:

.. [Co-KG] D. Zhan, H. Zhang, R. Righter, Z. Zheng, J. Anderson. Collaborative
   Bayesian optimization via Wasserstein barycenters (paper 001 in
   ``shared/papers``; slides, IEEE CDC 2025).
"""

from __future__ import annotations

import math

import torch
from botorch.test_functions.synthetic import SyntheticTestFunction
from torch import Tensor

from botorch_fed.test_functions.base import SeededNoiseMixin

# Roots of the 1-D stationarity conditions (mpmath, 30 digits, rounded to float64).
_X1_STAR = -0.23793454175773471
_X2_STAR = 0.47580245102422112
_F1_STAR = -1.7025915341414767


class _CoKGFunction(SeededNoiseMixin, SyntheticTestFunction):
    dim = 2
    continuous_inds = [0, 1]
    _default_bounds: list[tuple[float, float]]

    def __init__(
        self,
        noise_std: float | None = None,
        negate: bool = False,
        bounds: list[tuple[float, float]] | None = None,
        dtype: torch.dtype = torch.double,
        seed: int | None = None,
        generator: torch.Generator | None = None,
    ) -> None:
        r"""
        Args:
            noise_std: Standard deviation of additive Gaussian observation noise.
            negate: If True, negate the function (maximisation).
            bounds: Custom bounds as two (lower, upper) pairs.
            dtype: The dtype of ``bounds`` and ``optimizers``.
            seed: Seed of the private ``torch.Generator`` used for the noise.
            generator: A ``torch.Generator`` to use instead of ``seed``.
        """
        if bounds is None:
            bounds = list(self._default_bounds)
        super().__init__(noise_std=noise_std, negate=negate, bounds=bounds, dtype=dtype)
        self._init_noise_rng(seed=seed, generator=generator)


class CoKGSinCosBowl(_CoKGFunction):
    r"""``f_1(x) = x_1^2 + x_2^2 + sin(2 pi x_1) + cos(2 pi x_2)`` of [Co-KG].

    Domain ``[-1, 1]^2``; two global minimisers ``(-0.2379..., +-0.4758...)`` with
    value ``-1.7025915...`` (see the module docstring).
    """

    _default_bounds = [(-1.0, 1.0), (-1.0, 1.0)]
    _optimal_value = _F1_STAR
    _optimizers = [(_X1_STAR, -_X2_STAR), (_X1_STAR, _X2_STAR)]

    def _evaluate_true(self, X: Tensor) -> Tensor:
        x1, x2 = X[..., 0], X[..., 1]
        two_pi = 2.0 * math.pi
        return x1.square() + x2.square() + torch.sin(two_pi * x1) + torch.cos(two_pi * x2)


class CoKGRosenbrock(_CoKGFunction):
    r"""``f_2(x) = (1 - x_1)^2 + 100 (x_2 - x_1^2)^2`` of [Co-KG] (Rosenbrock).

    Domain ``[-2, 2]^2``; minimum 0 at ``(1, 1)``.
    """

    _default_bounds = [(-2.0, 2.0), (-2.0, 2.0)]
    _optimal_value = 0.0
    _optimizers = [(1.0, 1.0)]

    def _evaluate_true(self, X: Tensor) -> Tensor:
        x1, x2 = X[..., 0], X[..., 1]
        return (1.0 - x1).square() + 100.0 * (x2 - x1.square()).square()


__all__ = ["CoKGRosenbrock", "CoKGSinCosBowl"]
