r"""Federated hyperparameter tuning of a gradient-boosted classifier.

M clients each hold a private slice of one classification data set that ships with
scikit-learn (``breast_cancer``: 569 samples, 30 features, 2 classes; or ``digits``:
1797 samples, 64 features, 10 classes). They tune the hyperparameters of
``sklearn.ensemble.HistGradientBoostingClassifier`` together: each client's black box
is the validation log-loss of a model trained on its own training split -- a plain
Python function of an ``n x d`` tensor in the search space of
:data:`~botorch_fed.tasks.search_space.HYPERPARAMETERS`, wrapped in
:class:`~botorch_fed.problems.objectives.CallableObjective`, as a user would write it. This is
the real-task setting of Sec. 5.1 of [FBO-FedGP] (classifier tuning on partitions
with quantity skew, alpha = 10) on data that needs no download.

Fixed: ``max_iter`` (100 boosting iterations), ``early_stopping=False``,
``random_state`` (0): an evaluation is a deterministic function of its input, so
checkpointed runs resume to the same result. The data set is split across the clients
with quantity and label skew by :func:`~botorch_fed.tasks.data_split.split_data_set`.

Losses (all log-loss, natural log, lower is better):

- :meth:`FederatedHPOTask.validation_loss` ``(i, x)``: client ``i``'s black box --
  train on its training split with hyperparameters ``x``, score on its validation
  split; with ``cv_folds=k``, the mean over ``k`` stratified folds of the client's
  whole slice (training and validation splits together) of the loss on the fold of a
  model trained on the others: a client with a few dozen samples then scores a
  configuration on all of them, not on a 7-40-sample validation split that rewards
  whatever overfits it;
- :meth:`FederatedHPOTask.test_loss` ``(i, x)``: the client's model (trained on its
  training split; with ``cv_folds``, on its whole slice) scored on the shared test
  set, each test sample of class ``k`` weighted by ``pi_i(k) / pi_test(k)`` (``pi_i``:
  the class frequencies of client ``i``'s slice, ``pi_test``: the test set's). Under
  label skew the clients' class-conditional feature distributions are the shared ones,
  so this is client ``i``'s expected loss on new data of its own distribution,
  estimated from one shared test set (classes client ``i`` never holds get weight 0);
- :meth:`FederatedHPOTask.federation_test_loss` ``(x)``: every client trains on its
  own training split with the *same* configuration ``x``; the mean of their test
  losses weighted by the clients' data sizes.

Evaluations run with ``n_threads`` OpenMP threads (default 1, through
``threadpoolctl``) so that concurrent evaluations do not fight over cores.

References:

.. [FBO-FedGP] Secure federated Bayesian optimisation with distributed sparse GPs
   (paper 000 in ``shared/papers``), Sec. 5.1.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor

from botorch_fed.problems.objectives import CallableObjective
from botorch_fed.tasks.data_split import ClientData, _check_int, split_data_set
from botorch_fed.tasks.search_space import (
    HYPERPARAMETERS,
    Hyperparameter,
    decode_hyperparameters,
    search_space_bounds,
)


class FederatedHPOTask:
    r"""Federated tuning of ``HistGradientBoostingClassifier`` (see module docstring).

    Build one with :func:`make_federated_hpo_task`. Subclasses tune another model by
    overriding ``hyperparameters``, ``model_name`` and :meth:`make_model` (e.g.
    :class:`~botorch_fed.tasks.federated_mlp.FederatedMLPTask`).

    Example:
        >>> task = make_federated_hpo_task("breast_cancer", num_clients=5, seed=0)
        >>> setup = FederationSetup(objectives=task.objectives(), seed=0)
        >>> result = run_federated("local", setup, BOSettings(num_rounds=10))
        >>> task.federation_test_loss(result.best_point)

    Args:
        X: ``n x p`` features of the whole data set.
        y: ``n`` labels.
        clients: Each client's :class:`ClientData`.
        test_index: Indices of the shared test set.
        max_iter: Boosting iterations (fixed).
        random_state: ``random_state`` of every model.
        n_threads: OpenMP threads per evaluation (``None``: no limit).
        config: How the task was made (for result files).
        cv_folds: ``k`` of the k-fold cross-validated black box (``None``: the
            validation split's loss).
    """

    hyperparameters: tuple[Hyperparameter, ...] = HYPERPARAMETERS
    model_name: str = "hgb"

    def __init__(
        self,
        X: np.ndarray,
        y: np.ndarray,
        clients: Sequence[ClientData],
        test_index: np.ndarray,
        max_iter: int = 100,
        random_state: int = 0,
        n_threads: int | None = 1,
        config: dict | None = None,
        cv_folds: int | None = None,
    ) -> None:
        self.X = X
        self.y = y
        self.clients = list(clients)
        self.test_index = test_index
        self.X_test = X[test_index]
        self.y_test = y[test_index]
        self.classes = np.unique(y)
        self.max_iter = _check_int(max_iter, "max_iter", 1)
        self.random_state = _check_int(random_state, "random_state", 0)
        self.n_threads = None if n_threads is None else _check_int(n_threads, "n_threads", 1)
        self.cv_folds = None if cv_folds is None else _check_int(cv_folds, "cv_folds", 2)
        if self.cv_folds is not None:
            for i, c in enumerate(self.clients):
                if c.size < self.cv_folds:
                    raise ValueError(
                        f"`cv_folds`={self.cv_folds}: client {i} holds {c.size} samples, "
                        "fewer than one per fold."
                    )
        self.config = {**(config or {}), "cv_folds": self.cv_folds}
        self.bounds = search_space_bounds(hyperparameters=self.hyperparameters)

    # --- the search space -------------------------------------------------------------
    @property
    def num_clients(self) -> int:
        return len(self.clients)

    @property
    def dim(self) -> int:
        return len(self.hyperparameters)

    @property
    def client_sizes(self) -> list[int]:
        r"""Each client's number of samples (training plus validation)."""
        return [c.size for c in self.clients]

    def make_model(self, x):
        r"""An unfitted ``HistGradientBoostingClassifier`` with the hyperparameters at
        search-space point ``x`` (:func:`decode_hyperparameters`)."""
        from sklearn.ensemble import HistGradientBoostingClassifier

        return HistGradientBoostingClassifier(
            **decode_hyperparameters(x, self.hyperparameters),
            max_iter=self.max_iter,
            early_stopping=False,
            random_state=self.random_state,
        )

    def _threads(self):
        from contextlib import nullcontext

        from threadpoolctl import threadpool_limits

        if self.n_threads is None:
            return nullcontext()
        return threadpool_limits(limits=self.n_threads, user_api="openmp")

    def _client(self, client: int) -> ClientData:
        if isinstance(client, bool) or not isinstance(client, int | np.integer):
            raise ValueError(f"`client` must be an integer, got {client!r}.")
        if not 0 <= client < self.num_clients:
            raise ValueError(f"`client`={client} must be in [0, {self.num_clients}).")
        return self.clients[int(client)]

    def _slice(self, client: int) -> tuple[np.ndarray, np.ndarray]:
        r"""Client ``client``'s whole slice ``(X, y)`` (training, then validation)."""
        data = self._client(client)
        return np.concatenate([data.X_train, data.X_val]), data.labels

    def fit(self, client: int, x):
        r"""The model with hyperparameters ``x`` trained on client ``client``'s training
        split (with ``cv_folds``: on its whole slice)."""
        data = self._client(client)
        model = self.make_model(x)
        X, y = self._slice(client) if self.cv_folds else (data.X_train, data.y_train)
        with self._threads():
            model.fit(X, y)
        return model

    def folds(self, client: int) -> list[tuple[np.ndarray, np.ndarray]]:
        r"""The ``cv_folds`` ``(train, held-out)`` index pairs into client ``client``'s
        slice: stratified where every class has ``cv_folds`` samples, else plain
        k-fold; shuffled with ``random_state`` (the same folds at every evaluation)."""
        from sklearn.model_selection import KFold, StratifiedKFold

        if self.cv_folds is None:
            raise ValueError("This task has no `cv_folds`: its black box is the validation loss.")
        _, y = self._slice(client)
        k = self.cv_folds
        stratify = np.unique(y, return_counts=True)[1].min() >= k
        splitter = (StratifiedKFold if stratify else KFold)(
            k, shuffle=True, random_state=self.random_state
        )
        return list(splitter.split(np.zeros(len(y)), y))

    def _proba(self, model, X: np.ndarray) -> np.ndarray:
        r"""``predict_proba`` over all the task's classes (0 for classes the model never saw)."""
        with self._threads():
            proba = model.predict_proba(X)
        out = np.zeros((len(X), len(self.classes)))
        out[:, np.searchsorted(self.classes, model.classes_)] = proba
        return out

    # --- losses -----------------------------------------------------------------------
    def validation_loss(self, client: int, x) -> float:
        r"""Client ``client``'s black box at ``x``: validation log-loss of the model
        trained on its training split, or with ``cv_folds`` the mean over the folds
        (:meth:`folds`) of the loss on each fold of the model trained on the others."""
        from sklearn.metrics import log_loss

        data = self._client(client)
        if self.cv_folds is None:
            model = self.fit(client, x)
            with self._threads():
                proba = model.predict_proba(data.X_val)
            return float(log_loss(data.y_val, proba, labels=model.classes_))
        X, y = self._slice(client)
        losses = []
        for train, held in self.folds(client):
            model = self.make_model(x)
            with self._threads():
                model.fit(X[train], y[train])
            losses.append(log_loss(y[held], self._proba(model, X[held]), labels=self.classes))
        return float(np.mean(losses))

    def test_weights(self, client: int) -> np.ndarray:
        r"""Weights of the shared test samples for client ``client``: ``pi_i(k) /
        pi_test(k)`` for a sample of class ``k`` (0 for classes the client does not
        hold)."""
        data = self._client(client)
        k = len(self.classes)
        pi_client = np.bincount(np.searchsorted(self.classes, data.labels), minlength=k)
        pi_test = np.bincount(np.searchsorted(self.classes, self.y_test), minlength=k)
        ratio = np.divide(
            pi_client / pi_client.sum(),
            pi_test / pi_test.sum(),
            out=np.zeros(k),
            where=pi_test > 0,
        )
        return ratio[np.searchsorted(self.classes, self.y_test)]

    def test_loss(self, client: int, x) -> float:
        r"""Held-out loss of configuration ``x`` for client ``client``: the model
        trained on its training split (with ``cv_folds``: its whole slice), scored on the
        shared test set weighted to the client's class frequencies (:meth:`score_test`)."""
        return self.score_test(client, self.fit(client, x))

    def score_test(self, client: int, model) -> float:
        r"""Weighted test log-loss of a fitted classifier for client ``client`` (any
        model with ``predict_proba`` and ``classes_`` covering the client's classes,
        e.g. one with scikit-learn's default hyperparameters): the shared test set,
        each sample weighted by :meth:`test_weights`."""
        from sklearn.metrics import log_loss

        weights = self.test_weights(client)
        keep = weights > 0
        with self._threads():
            proba = model.predict_proba(self.X_test[keep])
        return float(
            log_loss(self.y_test[keep], proba, labels=model.classes_, sample_weight=weights[keep])
        )

    def federation_test_loss(self, x) -> float:
        r"""Held-out loss of one configuration ``x`` deployed by the whole federation:
        every client trains on its own training split with ``x``; the mean of their
        :meth:`test_loss` weighted by the clients' data sizes."""
        sizes = np.asarray(self.client_sizes, dtype=np.float64)
        losses = np.array([self.test_loss(i, x) for i in range(self.num_clients)])
        return float((sizes * losses).sum() / sizes.sum())

    # --- the black boxes --------------------------------------------------------------
    def objective(self, client: int) -> CallableObjective:
        r"""Client ``client``'s black box: a function of an ``n x d`` tensor of
        search-space points returning ``n`` validation log-losses, wrapped in
        :class:`~botorch_fed.problems.objectives.CallableObjective` (minimised)."""
        self._client(client)

        def validation_loss(X: Tensor) -> Tensor:
            # X: n x d points of the search space, one model trained and scored per row
            losses = [self.validation_loss(client, x) for x in X]
            return torch.tensor(losses, dtype=torch.float64)

        return CallableObjective(
            validation_loss,
            bounds=self.bounds,
            minimize=True,
            name=f"{self.model_name}-logloss-client{client}",
        )

    def objectives(self) -> list[CallableObjective]:
        r"""One :meth:`objective` per client, for ``FederationSetup(objectives=...)``."""
        return [self.objective(i) for i in range(self.num_clients)]

    def describe(self) -> dict:
        r"""A JSON-friendly description: settings, client sizes and class counts."""
        return {
            **self.config,
            "max_iter": self.max_iter,
            "random_state": self.random_state,
            "test_size": len(self.y_test),
            "client_train_sizes": [len(c.y_train) for c in self.clients],
            "client_val_sizes": [len(c.y_val) for c in self.clients],
            "cv_folds": self.cv_folds,
            "client_class_counts": [
                np.bincount(np.searchsorted(self.classes, c.labels), minlength=len(self.classes))
                .astype(int)
                .tolist()
                for c in self.clients
            ],
            "search_space": [
                {
                    "name": h.name,
                    "low": h.low,
                    "high": h.high,
                    "scale": h.scale,
                    "integer": h.integer,
                }
                for h in self.hyperparameters
            ],
        }

    def __repr__(self) -> str:
        return (
            f"FederatedHPOTask({self.config.get('dataset', '?')}, M={self.num_clients}, "
            f"sizes={self.client_sizes}, test={len(self.y_test)})"
        )


def make_federated_hpo_task(
    dataset: str = "breast_cancer",
    num_clients: int = 5,
    quantity_alpha: float | None = 10.0,
    label_alpha: float | None = 1.0,
    test_fraction: float = 0.25,
    validation_fraction: float = 0.3,
    seed: int = 0,
    max_iter: int = 100,
    random_state: int = 0,
    n_threads: int | None = 1,
    min_samples: int = 20,
    cv_folds: int | None = None,
) -> FederatedHPOTask:
    r"""Load a scikit-learn data set and split it into a federated tuning task.

    Args:
        dataset: ``"breast_cancer"`` (fast: about 20-40 ms per evaluation on one
            thread) or ``"digits"`` (10 classes, about 10x slower).
        num_clients: The number of clients ``M`` (>= 1).
        quantity_alpha: Dirichlet concentration of the client sizes (``None``:
            equal sizes); :func:`dirichlet_partition`.
        label_alpha: Dirichlet concentration of each class's split (``None``: no
            label skew).
        test_fraction: Share of the data set held out as the shared test set
            (stratified).
        validation_fraction: Share of each client's slice used for validation
            (stratified).
        seed: Seed of the test split, the partition and the validation splits.
        max_iter: Boosting iterations of every model (fixed).
        random_state: ``random_state`` of every model.
        n_threads: OpenMP threads per evaluation (``None``: no limit).
        min_samples: Fewest samples per client (partitions are redrawn until met).
        cv_folds: Each client's black box is its ``cv_folds``-fold cross-validated
            loss on its whole slice (``None``: its validation split's loss).

    Returns:
        The :class:`FederatedHPOTask`.
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
    return FederatedHPOTask(
        X,
        y,
        clients,
        test_index,
        max_iter=max_iter,
        random_state=random_state,
        n_threads=n_threads,
        config=config,
        cv_folds=cv_folds,
    )
