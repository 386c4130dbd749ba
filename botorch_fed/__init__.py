r"""botorch-fed: federated and privacy-preserving Bayesian optimisation for BoTorch.

Subpackages, top to bottom (imports only point down; ``tests/test_layers.py`` checks it):

- ``botorch_fed.cli``: the ``botorch-fed`` command line.
- ``botorch_fed.flower`` (extra ``flower``), ``botorch_fed.tasks``: the Flower deployment;
  real tuning tasks.
- ``botorch_fed.runs``: a run's description (options, config file, black box, checks).
- ``botorch_fed.federation``: the protocol, the algorithms as round-based programs,
  the in-process runner.
- ``botorch_fed.ldp``, ``botorch_fed.acquisition``, ``botorch_fed.models``: BoTorch
  pieces, e.g. the federated sparse GP :class:`~botorch_fed.models.FederatedPITCGP`
  (dPITC of [FBO-FedGP]).
- ``botorch_fed.privacy``, ``botorch_fed.zeroth_order``, ``botorch_fed.inducing``: LDP
  mechanisms; FedZero's estimators; the federated k-means support set (Alg. 1 of
  [FBO-FedGP]).
- ``botorch_fed.secure``, ``botorch_fed.test_functions``: secure aggregation backends
  (numpy + crypto, no torch); test functions.

References:

.. [FBO-FedGP] Secure federated Bayesian optimisation with distributed sparse GPs
   and multiparty homomorphic encryption (paper 000 in ``shared/papers``).
"""

from __future__ import annotations

__version__ = "0.1.0.dev0"
