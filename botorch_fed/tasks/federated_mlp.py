r"""Federated tuning of a small neural network (the Co-KG slides' NN tuning task).

The Co-KG slides tune a neural network on ``breast_cancer`` split across agents. Here
each client trains scikit-learn's ``MLPClassifier`` (one hidden layer of 16 units,
inputs standardised on the client's own training split) on its slice and reports the
validation log-loss; the data split, the losses and the objectives are those of
:class:`~botorch_fed.tasks.federated_hpo.FederatedHPOTask` (quantity and label skew,
a shared held-out test set).

Search space (``d = 2``, so the Co-KG grid supports apply; the user's domain):

========================  =============  ===========================================
coordinate                bounds         hyperparameter
========================  =============  ===========================================
0 l2 penalty              ``[-6, 0]``    ``alpha = 10**v``
1 initial learning rate   ``[-4, -1]``   ``learning_rate_init = 10**v`` (Adam)
========================  =============  ===========================================

Fixed: ``max_iter`` Adam epochs (default 200), ``random_state`` (0), no early
stopping: an evaluation is a deterministic function of its input. Runs that stop at
``max_iter`` before convergence are expected (the learning rate is being tuned); their
``ConvergenceWarning`` is silenced.

References:

.. [Co-KG] Collaborative Bayesian optimisation via Wasserstein barycenters (paper 001
   in ``shared/papers``), "NN hyperparameter tuning".
"""

from __future__ import annotations

import warnings

from botorch_fed.tasks.data_split import _check_int, split_data_set
from botorch_fed.tasks.federated_hpo import FederatedHPOTask
from botorch_fed.tasks.search_space import Hyperparameter, decode_hyperparameters

MLP_HYPERPARAMETERS: tuple[Hyperparameter, ...] = (
    Hyperparameter("alpha", -6.0, 0.0, "log10"),
    Hyperparameter("learning_rate_init", -4.0, -1.0, "log10"),
)


class FederatedMLPTask(FederatedHPOTask):
    r"""Federated tuning of an ``MLPClassifier`` (see the module docstring).

    Build one with :func:`make_federated_mlp_task`. ``max_iter`` is the number of Adam
    epochs; ``hidden_units`` the width of the hidden layer.
    """

    hyperparameters = MLP_HYPERPARAMETERS
    model_name = "mlp"

    def __init__(self, *args, hidden_units: int = 16, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.hidden_units = _check_int(hidden_units, "hidden_units", 1)

    def make_model(self, x):
        r"""An unfitted pipeline (``StandardScaler`` then ``MLPClassifier``) with the
        hyperparameters at search-space point ``x``."""
        from sklearn.neural_network import MLPClassifier
        from sklearn.pipeline import make_pipeline
        from sklearn.preprocessing import StandardScaler

        return make_pipeline(
            StandardScaler(),
            MLPClassifier(
                hidden_layer_sizes=(self.hidden_units,),
                **decode_hyperparameters(x, self.hyperparameters),
                max_iter=self.max_iter,
                random_state=self.random_state,
            ),
        )

    def _threads(self):
        from threadpoolctl import threadpool_limits

        if self.n_threads is None:
            return super()._threads()
        return threadpool_limits(limits=self.n_threads)  # BLAS as well as OpenMP

    def fit(self, client: int, x):
        r"""The pipeline with hyperparameters ``x`` trained on client ``client``'s
        training split (``ConvergenceWarning`` silenced, see the module docstring)."""
        from sklearn.exceptions import ConvergenceWarning

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            return super().fit(client, x)

    def describe(self) -> dict:
        r"""As :meth:`FederatedHPOTask.describe`, with the network's width."""
        return {**super().describe(), "model": "mlp", "hidden_units": self.hidden_units}

    def __repr__(self) -> str:
        return super().__repr__().replace("FederatedHPOTask", "FederatedMLPTask", 1)


def make_federated_mlp_task(
    dataset: str = "breast_cancer",
    num_clients: int = 4,
    quantity_alpha: float | None = 10.0,
    label_alpha: float | None = 1.0,
    test_fraction: float = 0.25,
    validation_fraction: float = 0.3,
    seed: int = 0,
    max_iter: int = 200,
    hidden_units: int = 16,
    random_state: int = 0,
    n_threads: int | None = 1,
    min_samples: int = 20,
) -> FederatedMLPTask:
    r"""Load a scikit-learn data set and split it into a federated MLP tuning task.

    Arguments as :func:`~botorch_fed.tasks.federated_hpo.make_federated_hpo_task`;
    ``max_iter`` is the number of Adam epochs, ``hidden_units`` the hidden layer's width.

    Returns:
        The :class:`FederatedMLPTask`.
    """
    X, y, clients, test_index, config = split_data_set(
        dataset,
        num_clients,
        quantity_alpha,
        label_alpha,
        test_fraction,
        validation_fraction,
        seed,
        min_samples,
    )
    return FederatedMLPTask(
        X,
        y,
        clients,
        test_index,
        max_iter=max_iter,
        random_state=random_state,
        n_threads=n_threads,
        config=config,
        hidden_units=hidden_units,
    )
