r"""Support sets (inducing points) shared by a federation: Alg. 1 of [FBO-FedGP]
(federated k-means, :mod:`~botorch_fed.inducing.federated_kmeans`) and the
data-independent grid and Sobol supports of Co-KG
(:mod:`~botorch_fed.inducing.support_grid`)."""

from botorch_fed.inducing.federated_kmeans import global_support, local_centers, random_support
from botorch_fed.inducing.support_grid import grid_support, sobol_support

__all__ = ["global_support", "grid_support", "local_centers", "random_support", "sobol_support"]
