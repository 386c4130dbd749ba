r"""Support sets (inducing points) shared by a federation: Alg. 1 of [FBO-FedGP]."""

from botorch_fed.inducing.federated_kmeans import global_support, local_centers, random_support

__all__ = ["global_support", "local_centers", "random_support"]
