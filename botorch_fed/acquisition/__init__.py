r"""Acquisition pieces of botorch-fed: Alg. 2 / eq. 3 of [FBO-FedGP].

- :class:`MixingSchedule`: the local-step probability ``p_t = 1 - t^-c`` (or a custom,
  per-client schedule) and the conditions of eq. 3.
- :class:`MixedLocalGlobalUCB`: UCB of a client's local GP with probability ``p_t``,
  of the global dPITC GP otherwise (sampled, or in expectation).
- :func:`make_step_acquisition`, :func:`thompson_sample_candidate`,
  :func:`propose_step_candidate`: one step's UCB / EI / Thompson sampling on a model
  through BoTorch's own classes; :func:`pathwise_thompson_sampling`,
  :func:`maximize_step_acquisition` and :func:`ranked_step_candidates` are its seeded
  pieces (batch paths, the ``optimize_acqf`` search, distinct optima by rank).
- :class:`qCoKnowledgeGradient` (Co-KG of [CoKG]: central batch q-KG + ``beta_t`` times
  each agent's KG; one-shot or exact over a discrete support), :class:`BetaSchedule`
  (``beta_t``: constant, linear, power), :class:`qCoExpectedImprovement` and
  :class:`qCoMaxValueEntropy` (Co-EI / Co-ES), :func:`optimize_co_acquisition` (one
  seeded ``optimize_acqf`` call, ``q = N`` agents).

References:

.. [FBO-FedGP] Secure federated Bayesian optimisation with distributed sparse GPs,
   Alg. 2 and Sec. 4.2-4.3 (paper 000 in ``shared/papers``).
.. [CoKG] Collaborative Bayesian Optimization via Wasserstein Barycenters, CDC 2025
   (paper 001 in ``shared/papers``).
"""

from botorch_fed.acquisition._rng import SeedLike
from botorch_fed.acquisition.beta_schedule import BETA_KINDS, BetaSchedule
from botorch_fed.acquisition.cached_analytic import (
    CachedLogExpectedImprovement,
    CachedUpperConfidenceBound,
)
from botorch_fed.acquisition.co_ei_es import (
    default_best_f,
    qCoExpectedImprovement,
    qCoMaxValueEntropy,
)
from botorch_fed.acquisition.co_kg import qCoKnowledgeGradient
from botorch_fed.acquisition.co_optimize import (
    gen_co_kg_initial_conditions,
    optimize_co_acquisition,
)
from botorch_fed.acquisition.mixed_ucb import MixedLocalGlobalUCB, model_input_dim
from botorch_fed.acquisition.mixing_schedule import MixingSchedule
from botorch_fed.acquisition.step_acquisition import (
    STEP_KINDS,
    make_step_acquisition,
    maximize_step_acquisition,
    pathwise_thompson_sampling,
    propose_step_candidate,
    ranked_step_candidates,
    supports_pathwise_sampling,
    thompson_sample_candidate,
)

__all__ = [
    "BETA_KINDS",
    "BetaSchedule",
    "CachedLogExpectedImprovement",
    "CachedUpperConfidenceBound",
    "default_best_f",
    "gen_co_kg_initial_conditions",
    "optimize_co_acquisition",
    "qCoExpectedImprovement",
    "qCoKnowledgeGradient",
    "qCoMaxValueEntropy",
    "MixedLocalGlobalUCB",
    "MixingSchedule",
    "STEP_KINDS",
    "SeedLike",
    "make_step_acquisition",
    "maximize_step_acquisition",
    "model_input_dim",
    "pathwise_thompson_sampling",
    "propose_step_candidate",
    "ranked_step_candidates",
    "supports_pathwise_sampling",
    "thompson_sample_candidate",
]
