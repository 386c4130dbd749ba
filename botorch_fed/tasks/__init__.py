r"""Real federated black-box tasks, built on the public API (:class:`CallableObjective`).

- :mod:`~botorch_fed.tasks.federated_hpo`: federated hyperparameter tuning of
  scikit-learn's ``HistGradientBoostingClassifier`` on a data set split across clients
  with quantity and label skew (the real-task setting of Sec. 5.1 of [FBO-FedGP]); its
  search space (:mod:`~botorch_fed.tasks.search_space`) and the split of the data set
  across the clients (:mod:`~botorch_fed.tasks.data_split`).
- :mod:`~botorch_fed.tasks.federated_mlp`: the same split, tuning a small neural
  network's l2 penalty and learning rate (the NN tuning task of the Co-KG slides; 2-D).

A task sits on top of :mod:`botorch_fed.protocol`: it only makes objectives (one
per client) and scores configurations on held-out data; any registered algorithm runs
on it through :func:`~botorch_fed.protocol.runner.run_federated`.

References:

.. [FBO-FedGP] Secure federated Bayesian optimisation with distributed sparse GPs
   (paper 000 in ``shared/papers``), Sec. 5.1.
"""

from __future__ import annotations

from botorch_fed.tasks.data_split import (
    DATASETS,
    ClientData,
    dirichlet_partition,
    split_data_set,
)
from botorch_fed.tasks.federated_hpo import FederatedHPOTask, make_federated_hpo_task
from botorch_fed.tasks.federated_mlp import (
    MLP_HYPERPARAMETERS,
    FederatedMLPTask,
    make_federated_mlp_task,
)
from botorch_fed.tasks.search_space import (
    HYPERPARAMETERS,
    Hyperparameter,
    decode_hyperparameters,
    search_space_bounds,
)

__all__ = [
    "DATASETS",
    "HYPERPARAMETERS",
    "ClientData",
    "FederatedHPOTask",
    "Hyperparameter",
    "decode_hyperparameters",
    "dirichlet_partition",
    "make_federated_hpo_task",
    "search_space_bounds",
    "split_data_set",
    "MLP_HYPERPARAMETERS",
    "FederatedMLPTask",
    "make_federated_mlp_task",
]
