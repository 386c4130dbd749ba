r"""The unimodal CEC-2005 functions F1-F5 [CEC2005]_.

What each function is, and the definitional choices, are in
:mod:`~botorch_fed.test_functions.cec2005`.

References:

.. [CEC2005] P. N. Suganthan, N. Hansen, J. J. Liang, K. Deb, Y.-P. Chen, A. Auger,
   S. Tiwari. Problem definitions and evaluation criteria for the CEC 2005 special
   session on real-parameter optimization. KanGAL report 2005005, 2005.
"""

from __future__ import annotations

from torch import Tensor

from botorch_fed.test_functions.cec2005_basic import (
    high_conditioned_elliptic,
    schwefel_1_2,
    schwefel_2_6,
    sphere,
)
from botorch_fed.test_functions.cec2005_data import CEC2005Data
from botorch_fed.test_functions.cec2005_function import (
    CEC2005Function,
    _FitnessNoiseMixin,
    _tensor,
)


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
    default_fitness_noise = 0.4

    def _evaluate_true(self, X: Tensor) -> Tensor:
        return schwefel_1_2(self._shifted(X)) + self.bias


class CEC2005F5(CEC2005Function):
    r"""F5: Schwefel's problem 2.6 with the optimum on the bounds, bias -310.

    ``max_i |A_i x - B_i|`` with ``B_i = A_i o``.
    """

    number, bias, default_bound = 5, -310.0, (-100.0, 100.0)
    A: Tensor  # buffer (``_register_data``)

    def _register_data(self, data: CEC2005Data) -> None:
        super()._register_data(data)
        self.register_buffer("A", _tensor(data.extra["A"]))

    def _evaluate_true(self, X: Tensor) -> Tensor:
        return schwefel_2_6(self._shifted(X), self.A.to(X)) + self.bias
