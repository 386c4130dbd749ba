r"""Bayesian optimisation under local differential privacy and heavy-tailed noise [LDP-BO].

- :mod:`~botorch_fed.ldp.learners`: the learners -- :class:`GPUCB` (exact GP-UCB),
  :class:`TGPUCB` (Alg. 2), :class:`ATAGPUCB` (Alg. 1), :class:`MoMAGPUCB` (Alg. 3) --
  each private (rewards privatised by the users with Curator 1,
  :class:`~botorch_fed.privacy.LaplaceMechanism`) or not (heavy-tailed noise), on a
  finite domain or a box; their surrogates are BoTorch models
  (:class:`~botorch_fed.models.FeatureSpaceGP`).
- :mod:`~botorch_fed.ldp.parameters`: the paper's parameter formulas (``beta_t``,
  ``b_t``, ``q``, ``k``).
- :func:`run_learner`: a learner against a reward function, without the federation
  protocol (benchmarks); the protocol versions are ``botorch-fed run ldp-moma`` etc.
  (:mod:`botorch_fed.federation.ldp_bo`).

References:

.. [LDP-BO] X. Zhou, J. Tan. Local differential privacy for Bayesian optimization
   (paper 002 in ``shared/papers``).
"""

from botorch_fed.ldp.learners import (
    ATAGPUCB,
    GPUCB,
    KERNELS,
    LEARNERS,
    TGPUCB,
    MoMAGPUCB,
    RewardModel,
    UCBLearner,
    make_kernel,
)
from botorch_fed.ldp.loop import LearnerTrace, run_learner

__all__ = [
    "ATAGPUCB",
    "GPUCB",
    "KERNELS",
    "LEARNERS",
    "LearnerTrace",
    "MoMAGPUCB",
    "RewardModel",
    "TGPUCB",
    "UCBLearner",
    "make_kernel",
    "run_learner",
]
