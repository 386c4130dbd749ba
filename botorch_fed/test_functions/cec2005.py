r"""CEC-2005 F1-F20 as BoTorch ``SyntheticTestFunction``\ s: the suite and its classes by number.

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

The classes: F1-F5 in :mod:`~botorch_fed.test_functions.cec2005_unimodal`, F6-F14 in
:mod:`~botorch_fed.test_functions.cec2005_multimodal`, F15-F20 in
:mod:`~botorch_fed.test_functions.cec2005_composition`, on the base class of
:mod:`~botorch_fed.test_functions.cec2005_function` and the basic functions of
:mod:`~botorch_fed.test_functions.cec2005_basic`; :data:`CEC2005_FUNCTIONS` maps each
number to its class.

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

from botorch_fed.test_functions.cec2005_composition import (
    CEC2005F15,
    CEC2005F16,
    CEC2005F17,
    CEC2005F18,
    CEC2005F19,
    CEC2005F20,
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
