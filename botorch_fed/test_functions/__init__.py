r"""Synthetic test functions of botorch-fed, as BoTorch ``SyntheticTestFunction``\ s.

- CEC-2005 F1-F20 (:mod:`~botorch_fed.test_functions.cec2005`), the benchmark of
  [FBO-FedGP] Sec. 5 / Table 1, in 2, 10, 30 and 50 dimensions with the official
  shift vectors and rotation matrices (optional extra ``botorch-fed[cec]``; this
  package imports without it, constructing a CEC function then raises an
  ``ImportError``).
- The 2-D functions ``f_1`` (sin/cos bowl) and ``f_2`` (Rosenbrock) of [Co-KG]
  (:mod:`~botorch_fed.test_functions.cokg`).
- The 1-D random RKHS function of [LDP-BO] Sec. 5.1 (:class:`LDPSynthetic`, SE or
  Matern kernel, on a 100-point grid of ``[0, 1]``), and the paper's observation
  noises (:class:`ObservationNoise`: uniform, Student-t, Pareto, Gaussian).
- Least-absolute-deviations regression (:class:`L1Regression`), the convex
  Lipschitz stochastic problem of [FedZero].
- :func:`get_test_function` / :func:`list_test_functions`: look-up by name of the
  above and of every BoTorch synthetic test function.

All are minimisation problems (``negate=True`` to maximise) and accept ``seed`` /
``generator`` for reproducible noise that leaves the global torch RNG alone.

References:

.. [FBO-FedGP] Secure federated Bayesian optimisation with distributed sparse GPs
   and multiparty homomorphic encryption (paper 000 in ``shared/papers``).
.. [Co-KG] Collaborative Bayesian optimization via Wasserstein barycenters
   (paper 001 in ``shared/papers``).
.. [LDP-BO] Local differential privacy for Bayesian optimization (paper 002 in
   ``shared/papers``).
.. [FedZero] High-probability analysis of online and federated zero-order
   optimisation (paper 004 in ``shared/papers``).
"""

from __future__ import annotations

from botorch_fed.test_functions.base import SeededNoiseMixin, make_generator
from botorch_fed.test_functions.cec2005 import CEC2005_FUNCTIONS
from botorch_fed.test_functions.cec2005_composition import (
    CEC2005F15,
    CEC2005F16,
    CEC2005F17,
    CEC2005F18,
    CEC2005F19,
    CEC2005F20,
    CEC2005CompositionFunction,
)
from botorch_fed.test_functions.cec2005_data import (
    SUPPORTED_DIMS,
    CEC2005Data,
    load_cec2005_data,
    opfunu_data_dir,
)
from botorch_fed.test_functions.cec2005_function import CEC2005Function
from botorch_fed.test_functions.cec2005_multimodal import (
    CEC2005F6,
    CEC2005F7,
    CEC2005F8,
    CEC2005F9,
    CEC2005F10,
    CEC2005F11,
    CEC2005F12,
    CEC2005F13,
    CEC2005F14,
)
from botorch_fed.test_functions.cec2005_unimodal import (
    CEC2005F1,
    CEC2005F2,
    CEC2005F3,
    CEC2005F4,
    CEC2005F5,
)
from botorch_fed.test_functions.cokg import CoKGRosenbrock, CoKGSinCosBowl
from botorch_fed.test_functions.l1_regression import L1Regression
from botorch_fed.test_functions.ldp_synthetic import LDPSynthetic
from botorch_fed.test_functions.noise import NOISE_KINDS, ObservationNoise
from botorch_fed.test_functions.registry import (
    get_test_function,
    get_test_function_class,
    list_test_functions,
    seeded_class,
)

__all__ = [
    "CEC2005_FUNCTIONS",
    "NOISE_KINDS",
    "SUPPORTED_DIMS",
    "CEC2005CompositionFunction",
    "CEC2005Data",
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
    "CEC2005Function",
    "CoKGRosenbrock",
    "CoKGSinCosBowl",
    "L1Regression",
    "LDPSynthetic",
    "ObservationNoise",
    "SeededNoiseMixin",
    "get_test_function",
    "get_test_function_class",
    "list_test_functions",
    "load_cec2005_data",
    "make_generator",
    "opfunu_data_dir",
    "seeded_class",
]
