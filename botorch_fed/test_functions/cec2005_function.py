r"""The base class of the CEC-2005 functions [CEC2005]_ and their fitness noise.

:class:`CEC2005Function` loads a function's official data (shift vector, rotation
matrix; :mod:`~botorch_fed.test_functions.cec2005_data`), sets its bounds, optimum and
bias, and shifts and rotates inputs; ``_FitnessNoiseMixin`` is the report's
multiplicative noise of F4 and F17. What every function is, and the definitional
choices, are in :mod:`~botorch_fed.test_functions.cec2005`.

References:

.. [CEC2005] P. N. Suganthan, N. Hansen, J. J. Liang, K. Deb, Y.-P. Chen, A. Auger,
   S. Tiwari. Problem definitions and evaluation criteria for the CEC 2005 special
   session on real-parameter optimization. KanGAL report 2005005, 2005.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from botorch.test_functions.synthetic import SyntheticTestFunction
from torch import Tensor

from botorch_fed.test_functions.base import SeededNoiseMixin
from botorch_fed.test_functions.cec2005_data import (
    CEC2005Data,
    load_cec2005_data,
    validate_dim,
)


class CEC2005Function(SeededNoiseMixin, SyntheticTestFunction):
    r"""Base class of the CEC-2005 functions (see :mod:`~botorch_fed.test_functions.cec2005`).

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
    # buffers (``_register_data``; ``matrix`` for the rotated functions only)
    shift: Tensor
    matrix: Tensor

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
            lower, upper = self.default_bound
            bounds = [(lower, upper) for _ in range(self.dim)]
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


# a mixin of the CEC-2005 functions: type-checked as one of them
if TYPE_CHECKING:
    _FunctionBase = CEC2005Function
else:
    _FunctionBase = object


class _FitnessNoiseMixin(_FunctionBase):
    r"""The report's multiplicative noise of F4 and F17 (applied in ``forward``)."""

    fitness_noise: float
    default_fitness_noise: float  # the report's factor ``s``

    def __init__(
        self,
        dim: int = 10,
        noise_std: float | None = None,
        negate: bool = False,
        bounds: list[tuple[float, float]] | None = None,
        dtype: torch.dtype = torch.double,
        seed: int | None = None,
        generator: torch.Generator | None = None,
        fitness_noise: float | None = None,
    ) -> None:
        r"""See :class:`CEC2005Function`; ``fitness_noise`` is the factor ``s`` of
        the multiplicative noise ``1 + s |N(0, 1)|`` (``None``: the report's,
        ``default_fitness_noise``; 0 disables it)."""
        s = self.default_fitness_noise if fitness_noise is None else fitness_noise
        self.fitness_noise = float(s)
        super().__init__(dim, noise_std, negate, bounds, dtype, seed, generator)

    def _apply_fitness_noise(self, f: Tensor) -> Tensor:
        if self.fitness_noise == 0.0:
            return f
        factor = 1.0 + self.fitness_noise * self._randn(f.shape, f).abs()
        return (f - self.bias) * factor + self.bias
