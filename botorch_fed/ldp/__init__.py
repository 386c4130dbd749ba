r"""Bayesian optimisation under local differential privacy and heavy-tailed noise [LDP-BO].

- the learners (:class:`UCBLearner`, :mod:`~botorch_fed.ldp.ucb_learner`) --
  :class:`GPUCB` (exact GP-UCB) and :class:`TGPUCB` (Alg. 2)
  (:mod:`~botorch_fed.ldp.exact_learners`), :class:`ATAGPUCB` (Alg. 1,
  :mod:`~botorch_fed.ldp.ata`), :class:`MoMAGPUCB` (Alg. 3, :mod:`~botorch_fed.ldp.moma`),
  by name in :data:`LEARNERS` -- each private (rewards privatised by the users with Curator 1,
  :class:`~botorch_fed.privacy.LaplaceMechanism`) or not (heavy-tailed noise), on a
  finite domain or a box; their surrogates are BoTorch models
  (:class:`~botorch_fed.models.FeatureSpaceGP`).
- :mod:`~botorch_fed.ldp.parameters`: the paper's parameter formulas (``beta_t``,
  ``b_t``, ``q``, ``k``).
- :func:`run_learner`: a learner against a reward function, without the federation
  protocol (benchmarks); the protocol versions are ``botorch-fed run ldp-moma`` etc.
  (:mod:`botorch_fed.algorithms.ldp_bo`).

References:

.. [LDP-BO] X. Zhou, J. Tan. Local differential privacy for Bayesian optimization
   (paper 002 in ``shared/papers``).
"""

from botorch_fed.ldp.assumptions import KERNELS, RewardModel, make_kernel
from botorch_fed.ldp.ata import ATAGPUCB
from botorch_fed.ldp.exact_learners import GPUCB, TGPUCB
from botorch_fed.ldp.loop import LearnerTrace, run_learner
from botorch_fed.ldp.moma import MoMAGPUCB
from botorch_fed.ldp.registry import LEARNERS
from botorch_fed.ldp.ucb_learner import UCBLearner

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
