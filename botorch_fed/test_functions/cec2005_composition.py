r"""The hybrid composition functions F15-F20 of CEC-2005 [CEC2005]_ (report Sec. 2.15).

Each mixes ten shifted, scaled and rotated basic functions
(:mod:`~botorch_fed.test_functions.cec2005_basic`) with weights that favour the
component whose optimum is nearest; the definitional choices are in
:mod:`~botorch_fed.test_functions.cec2005`.

References:

.. [CEC2005] P. N. Suganthan, N. Hansen, J. J. Liang, K. Deb, Y.-P. Chen, A. Auger,
   S. Tiwari. Problem definitions and evaluation criteria for the CEC 2005 special
   session on real-parameter optimization. KanGAL report 2005005, 2005.
"""

from __future__ import annotations

import torch
from torch import Tensor

from botorch_fed.test_functions.cec2005_basic import _BASIC
from botorch_fed.test_functions.cec2005_data import CEC2005Data
from botorch_fed.test_functions.cec2005_function import CEC2005Function, _FitnessNoiseMixin


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
    # buffers (``_register_data``)
    sigma: Tensor
    lam: Tensor
    component_bias: Tensor
    f_max: Tensor

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
_LAMBDAS_1: tuple[float, ...] = (1.0, 1.0, 10.0, 10.0, 5.0 / 60.0, 5.0 / 60.0)
_LAMBDAS_1 += (5.0 / 32.0, 5.0 / 32.0, 5.0 / 100.0, 5.0 / 100.0)

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
_LAMBDAS_2: tuple[float, ...] = (2.0 * 5.0 / 32.0, 5.0 / 32.0, 2.0, 1.0, 2.0 * 5.0 / 100.0)
_LAMBDAS_2 += (5.0 / 100.0, 20.0, 10.0, 2.0 * 5.0 / 60.0, 5.0 / 60.0)


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
    default_fitness_noise = 0.2
    components, sigmas, lambdas = _COMPOSITION_1, (1.0,) * 10, _LAMBDAS_1


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
