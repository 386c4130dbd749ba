r"""The multimodal CEC-2005 functions F6-F14 [CEC2005]_: basic (F6-F12) and expanded (F13-F14).

What each function is, and the definitional choices, are in
:mod:`~botorch_fed.test_functions.cec2005`.

References:

.. [CEC2005] P. N. Suganthan, N. Hansen, J. J. Liang, K. Deb, Y.-P. Chen, A. Auger,
   S. Tiwari. Problem definitions and evaluation criteria for the CEC 2005 special
   session on real-parameter optimization. KanGAL report 2005005, 2005.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from botorch_fed.test_functions.cec2005_basic import (
    ackley,
    expanded_griewank_rosenbrock,
    expanded_scaffer_f6,
    griewank,
    rastrigin,
    rosenbrock,
    weierstrass,
)
from botorch_fed.test_functions.cec2005_data import CEC2005Data
from botorch_fed.test_functions.cec2005_function import CEC2005Function, _tensor


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
    accepted (see :mod:`~botorch_fed.test_functions.cec2005`).
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
    a: Tensor  # buffers (``_register_data``)
    b: Tensor
    alpha: Tensor

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
