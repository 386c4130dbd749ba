r"""Federated zeroth-order optimisation with the l1-sphere estimator [FedZero]_.

The method (Alg. 1): each of ``m`` workers queries its (private, context-dependent)
convex ``L``-Lipschitz function at ``x_t +- h z`` with ``z`` uniform on the l1 unit
sphere and sends

    ``g_{j,t} = d / (2h) * (f(x_t + h z) - f(x_t - h z)) * sign(z)``  (``sign(0) = +1``),

an unbiased estimate of the gradient of the smoothed ``f_h(x) = E f(x + h U)``, ``U``
uniform in the l1 unit ball (Sec. 3); the server averages the ``m`` messages and takes a
projected step ``x_{t+1} = Proj_Theta(x_t - eta g_t)``. With ``eta = (1/L) sqrt(m/(n d))``
and ``h <= (1/L) sqrt((d+1)/n)`` (Cor. 3.2, :func:`fedzero_defaults`) the averaged
iterate is within ``D L sqrt(d/(n m))`` (up to logarithms) of the optimum, ``D`` the
diameter of ``Theta``. Uniform l1-sphere points are Laplace vectors over their l1 norm
(Definition 6.1).

Modules:

- :mod:`~botorch_fed.zeroth_order.sampling`: :func:`sample_l1_sphere`,
  :func:`sample_l2_sphere`, :func:`l1_sign`.
- :mod:`~botorch_fed.zeroth_order.estimators`: :func:`l1_gradient`,
  :func:`l2_gradient`, :data:`ESTIMATORS`, :func:`release_scratch`.
- :mod:`~botorch_fed.zeroth_order.projections`: :class:`Box`, :class:`L2Ball`,
  :class:`L1Ball`, :class:`Simplex` (exact batched projections).
- :mod:`~botorch_fed.zeroth_order.fedzero`: :class:`FedZero`, :func:`simulate_fedzero`,
  :func:`fedzero_step`, :func:`fedzero_defaults`.

This package depends on torch only (it sits below the federation, model and
acquisition packages).

References:

.. [FedZero] A. Akhavan, D. Janz, E.-M. El-Mhamdi. High-probability analysis of online
   and federated zero-order optimisation (FedZero; paper 004 in ``shared/papers``).
"""

from __future__ import annotations

from botorch_fed.zeroth_order.estimators import (
    ESTIMATORS,
    get_estimator,
    l1_gradient,
    l2_gradient,
    release_scratch,
)
from botorch_fed.zeroth_order.fedzero import (
    FedZero,
    FedZeroResult,
    SimulationResult,
    fedzero_defaults,
    fedzero_step,
    simulate_fedzero,
)
from botorch_fed.zeroth_order.projections import Box, ConvexSet, L1Ball, L2Ball, Simplex
from botorch_fed.zeroth_order.sampling import l1_sign, sample_l1_sphere, sample_l2_sphere

__all__ = [
    "Box",
    "ConvexSet",
    "ESTIMATORS",
    "FedZero",
    "FedZeroResult",
    "L1Ball",
    "L2Ball",
    "Simplex",
    "SimulationResult",
    "fedzero_defaults",
    "fedzero_step",
    "get_estimator",
    "l1_gradient",
    "l1_sign",
    "l2_gradient",
    "release_scratch",
    "sample_l1_sphere",
    "sample_l2_sphere",
    "simulate_fedzero",
]
