r"""botorch-fed: federated and privacy-preserving Bayesian optimisation for BoTorch.

Subpackages (imports only point down this list):

- ``botorch_fed.cli``: the ``botorch-fed`` command line.
- ``botorch_fed.models``: BoTorch models, e.g. the federated sparse GP
  :class:`~botorch_fed.models.FederatedPITCGP` (dPITC of [FBO-FedGP]).
- ``botorch_fed.inducing``: the federated k-means support set (Alg. 1 of [FBO-FedGP]).
- ``botorch_fed.secure``: secure aggregation backends (numpy + crypto, no torch).

References:

.. [FBO-FedGP] Secure federated Bayesian optimisation with distributed sparse GPs
   and multiparty homomorphic encryption (paper 000 in ``shared/papers``).
"""

from __future__ import annotations

__version__ = "0.1.0.dev0"
