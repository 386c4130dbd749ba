r"""The learners of [LDP-BO] by name (``UCBLearner.name``), as the protocol selects them.

References:

.. [LDP-BO] X. Zhou, J. Tan. Local differential privacy for Bayesian optimization
   (paper 002 in ``shared/papers``).
"""

from __future__ import annotations

from botorch_fed.ldp.ata import ATAGPUCB
from botorch_fed.ldp.exact_learners import GPUCB, TGPUCB
from botorch_fed.ldp.moma import MoMAGPUCB

LEARNERS = {cls.name: cls for cls in (GPUCB, TGPUCB, ATAGPUCB, MoMAGPUCB)}
