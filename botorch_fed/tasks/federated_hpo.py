r"""Federated hyperparameter tuning of a gradient-boosted classifier.

M clients each hold a private slice of one classification data set that ships with
scikit-learn (``breast_cancer``: 569 samples, 30 features, 2 classes; or ``digits``:
1797 samples, 64 features, 10 classes). They tune the hyperparameters of
``sklearn.ensemble.HistGradientBoostingClassifier`` together: each client's black box
is the validation log-loss of a model trained on its own training split -- a plain
Python function of an ``n x d`` tensor in the search space below, wrapped in
:class:`~botorch_fed.federation.CallableObjective`, as a user would write it. This is
the real-task setting of Sec. 5.1 of [FBO-FedGP] (classifier tuning on partitions
with quantity skew, alpha = 10) on data that needs no download.

Search space (``d = 5``; the user's domain, what the callables receive):

===================  ====================  ==========================================
coordinate           bounds                hyperparameter
===================  ====================  ==========================================
0 learning rate      ``[-2.5, 0]``         ``learning_rate = 10**v`` (0.0032 - 1)
1 max leaf nodes     ``[1, 6]``            ``max_leaf_nodes = round(2**v)`` (2 - 64)
2 min samples leaf   ``[1, 32]``           ``min_samples_leaf = round(v)``
3 l2 regularisation  ``[-4, 1]``           ``l2_regularization = 10**v``
4 max features       ``[0.1, 1]``          ``max_features = v`` (fraction per split)
===================  ====================  ==========================================

``round`` is round-half-up (``floor(v + 0.5)``). Fixed: ``max_iter`` (100 boosting
iterations), ``early_stopping=False``, ``random_state`` (0): an evaluation is a
deterministic function of its input, so checkpointed runs resume to the same result.

Data (:func:`make_federated_hpo_task`, every draw from ``seed``):

1. a stratified ``test_fraction`` of the data set is the shared held-out **test set**
   (no client ever sees it);
2. the rest is split across the clients by :func:`dirichlet_partition`: **quantity
   skew** (client proportions ``q ~ Dirichlet(quantity_alpha)``, alpha = 10 as in
   [FBO-FedGP] after Archetti et al., 2023) and **label skew** (per class
   ``w_k ~ Dirichlet(label_alpha)``; class ``k`` is split in proportions
   ``q * w_k`` normalised). Every sample lands in exactly one client;
3. each client splits its slice, stratified by class, into a training and a
   ``validation_fraction`` validation split.

Losses (all log-loss, natural log, lower is better):

- :meth:`FederatedHPOTask.validation_loss` ``(i, x)``: client ``i``'s black box --
  train on its training split with hyperparameters ``x``, score on its validation
  split;
- :meth:`FederatedHPOTask.test_loss` ``(i, x)``: the same model scored on the shared
  test set, each test sample of class ``k`` weighted by ``pi_i(k) / pi_test(k)``
  (``pi_i``: the class frequencies of client ``i``'s slice, ``pi_test``: the test
  set's). Under label skew the clients' class-conditional feature distributions are
  the shared ones, so this is client ``i``'s expected loss on new data of its own
  distribution, estimated from one shared test set (classes client ``i`` never holds
  get weight 0);
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

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from botorch_fed.federation.objectives import CallableObjective

DATASETS = ("breast_cancer", "digits")
SCALES = ("linear", "log10", "log2")


@dataclass(frozen=True)
class Hyperparameter:
    r"""One coordinate of the search space.

    Attributes:
        name: The ``HistGradientBoostingClassifier`` keyword.
        low: Lower bound in the search space (e.g. of ``log10`` of the value).
        high: Upper bound in the search space.
        scale: ``"linear"`` (the value itself), ``"log10"`` (value = ``10**v``) or
            ``"log2"`` (value = ``2**v``).
        integer: Round the value half-up to an integer (after the scale).
    """

    name: str
    low: float
    high: float
    scale: str = "linear"
    integer: bool = False

    def decode(self, v: float) -> float | int:
        r"""The hyperparameter's value at search-space coordinate ``v``."""
        if self.scale == "log10":
            value = 10.0**v
        elif self.scale == "log2":
            value = 2.0**v
        else:
            value = float(v)
        return int(math.floor(value + 0.5)) if self.integer else value


HYPERPARAMETERS: tuple[Hyperparameter, ...] = (
    Hyperparameter("learning_rate", -2.5, 0.0, "log10"),
    Hyperparameter("max_leaf_nodes", 1.0, 6.0, "log2", integer=True),
    Hyperparameter("min_samples_leaf", 1.0, 32.0, "linear", integer=True),
    Hyperparameter("l2_regularization", -4.0, 1.0, "log10"),
    Hyperparameter("max_features", 0.1, 1.0, "linear"),
)


def search_space_bounds(
    dtype: torch.dtype = torch.float64,
    hyperparameters: Sequence[Hyperparameter] = HYPERPARAMETERS,
) -> Tensor:
    r"""The search space's ``2 x d`` bounds (the user's domain of the objectives)."""
    return torch.tensor(
        [[h.low for h in hyperparameters], [h.high for h in hyperparameters]], dtype=dtype
    )


def decode_hyperparameters(
    x, hyperparameters: Sequence[Hyperparameter] = HYPERPARAMETERS
) -> dict[str, float | int]:
    r"""The model's keywords at a search-space point (by default the
    ``HistGradientBoostingClassifier`` ones of :data:`HYPERPARAMETERS`).

    Args:
        x: ``d`` numbers (a tensor, an array or a list) within the bounds of
            :func:`search_space_bounds` (up to a tolerance of ``1e-9``; values within
            it are clipped to the bounds).
        hyperparameters: The search space.

    Returns:
        ``{name: value}`` for every entry of ``hyperparameters`` (integers rounded
        half-up).
    """
    if isinstance(x, Tensor):
        x = x.detach().cpu().to(torch.float64).numpy()
    try:
        v = np.asarray(x, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"`x` must be {len(hyperparameters)} numbers, got {x!r}.") from exc
    d = len(hyperparameters)
    if v.shape != (d,):
        raise ValueError(f"`x` must have shape ({d},) (one search-space point), got {v.shape}.")
    if not np.isfinite(v).all():
        raise ValueError(f"`x` must be finite, got {v.tolist()}.")
    out = {}
    for h, vi in zip(hyperparameters, v.tolist(), strict=True):
        if not h.low - 1e-9 <= vi <= h.high + 1e-9:
            raise ValueError(
                f"`x`: coordinate {h.name!r} = {vi} is outside its bounds [{h.low}, {h.high}]."
            )
        out[h.name] = h.decode(min(max(vi, h.low), h.high))
    return out


# --- data ---------------------------------------------------------------------------------
def _load(dataset: str) -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_breast_cancer, load_digits

    if dataset not in DATASETS:
        raise ValueError(f"`dataset`={dataset!r} must be one of {DATASETS}.")
    loader = load_breast_cancer if dataset == "breast_cancer" else load_digits
    X, y = loader(return_X_y=True)
    return X.astype(np.float64), y.astype(np.int64)


def _check_alpha(value, name: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ValueError(f"`{name}` must be a positive number or None, got {value!r}.")
    if not math.isfinite(value):
        raise ValueError(f"`{name}` must be finite (None: no skew), got {value!r}.")
    return float(value)


def _check_int(value, name: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < minimum:
        raise ValueError(f"`{name}` must be an integer >= {minimum}, got {value!r}.")
    return int(value)


def _check_fraction(value, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < 1:
        raise ValueError(f"`{name}` must be a number in (0, 1), got {value!r}.")
    return float(value)


def dirichlet_partition(
    y,
    num_clients: int,
    quantity_alpha: float | None = 10.0,
    label_alpha: float | None = None,
    seed: int = 0,
    min_samples: int = 10,
    min_classes: int = 2,
    max_tries: int = 1000,
) -> list[np.ndarray]:
    r"""Split sample indices across clients with quantity and label skew.

    Client proportions ``q ~ Dirichlet(quantity_alpha * 1_M)`` (quantity skew, as the
    "quantity-skewed partitioning (alpha = 10)" of [FBO-FedGP] Sec. 5.1; ``None``:
    equal proportions) and, for each class ``k``, ``w_k ~ Dirichlet(label_alpha *
    1_M)`` (label skew; ``None``: none). Class ``k``'s samples, shuffled, are cut in
    proportions ``q * w_k / sum(q * w_k)``. A draw in which some client gets fewer
    than ``min_samples`` samples or fewer than ``min_classes`` classes with at least
    two samples each (a classifier needs them to train and validate) is redrawn, at
    most ``max_tries`` times.

    Args:
        y: ``n`` integer class labels.
        num_clients: The number of clients ``M`` (>= 1).
        quantity_alpha: Concentration of the client proportions (small: skewed
            sizes; ``None``: equal).
        label_alpha: Concentration of each class's split across clients (small:
            each client holds few classes; ``None``: no label skew).
        seed: Seed of the draws.
        min_samples: Fewest samples per client.
        min_classes: Fewest classes (with >= 2 samples) per client.
        max_tries: Draws before giving up.

    Returns:
        ``M`` sorted index arrays into ``y``: every sample in exactly one of them.
    """
    y = np.asarray(y)
    if y.ndim != 1 or len(y) == 0 or not np.issubdtype(y.dtype, np.integer):
        raise ValueError(
            f"`y` must be a non-empty 1-d array of integer labels, got shape {y.shape} "
            f"and dtype {y.dtype}."
        )
    M = _check_int(num_clients, "num_clients", 1)
    quantity_alpha = _check_alpha(quantity_alpha, "quantity_alpha")
    label_alpha = _check_alpha(label_alpha, "label_alpha")
    _check_int(seed, "seed", 0)
    min_samples = _check_int(min_samples, "min_samples", 1)
    min_classes = _check_int(min_classes, "min_classes", 1)
    max_tries = _check_int(max_tries, "max_tries", 1)
    classes = np.unique(y)
    if min_classes > len(classes):
        raise ValueError(f"`min_classes`={min_classes} but `y` has only {len(classes)} classes.")
    if M * min_samples > len(y):
        raise ValueError(
            f"{len(y)} samples cannot give {M} clients `min_samples`={min_samples} each."
        )
    members = [np.flatnonzero(y == c) for c in classes]
    rng = np.random.default_rng(seed)
    for _ in range(max_tries):
        q = rng.dirichlet(np.full(M, quantity_alpha)) if quantity_alpha else np.full(M, 1 / M)
        W = (
            rng.dirichlet(np.full(M, label_alpha), size=len(classes))
            if label_alpha
            else np.ones((len(classes), M))
        )
        parts: list[list[np.ndarray]] = [[] for _ in range(M)]
        for k, idx in enumerate(members):
            p = q * W[k]
            p = p / p.sum() if p.sum() > 0 else q
            cuts = np.floor(np.cumsum(p)[:-1] * len(idx) + 0.5).astype(int)
            for i, chunk in enumerate(np.split(rng.permutation(idx), cuts)):
                parts[i].append(chunk)
        out = [np.sort(np.concatenate(p)) for p in parts]
        if all(
            len(o) >= min_samples and (np.bincount(y[o] - classes[0]) >= 2).sum() >= min_classes
            for o in out
        ):
            return out
    raise ValueError(
        f"No partition of {len(y)} samples into {M} clients with >= {min_samples} samples "
        f"and >= {min_classes} classes each in {max_tries} draws (quantity_alpha="
        f"{quantity_alpha}, label_alpha={label_alpha}): use fewer clients or larger alphas."
    )


def _stratified_split(
    index: np.ndarray, y: np.ndarray, fraction: float, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    r"""``(rest, held_out)``: about ``fraction`` of each class held out (round half up),
    at least one of every class with two or more members, and never a class's last."""
    rest, held = [], []
    for c in np.unique(y[index]):
        idx = rng.permutation(index[y[index] == c])
        n_held = int(math.floor(fraction * len(idx) + 0.5))
        n_held = min(max(n_held, 1 if len(idx) >= 2 else 0), len(idx) - 1)
        held.append(idx[:n_held])
        rest.append(idx[n_held:])
    return np.sort(np.concatenate(rest)), np.sort(np.concatenate(held))


@dataclass(frozen=True)
class ClientData:
    r"""One client's private data.

    Attributes:
        X_train: ``n_train x p`` training features.
        y_train: ``n_train`` training labels.
        X_val: ``n_val x p`` validation features.
        y_val: ``n_val`` validation labels.
        train_index: Indices of the training samples in the full data set.
        val_index: Indices of the validation samples in the full data set.
    """

    X_train: np.ndarray
    y_train: np.ndarray
    X_val: np.ndarray
    y_val: np.ndarray
    train_index: np.ndarray
    val_index: np.ndarray

    @property
    def size(self) -> int:
        r"""Training plus validation samples."""
        return len(self.y_train) + len(self.y_val)

    @property
    def labels(self) -> np.ndarray:
        r"""All of the client's labels (training, then validation)."""
        return np.concatenate([self.y_train, self.y_val])


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
        self.config = dict(config or {})
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

    def fit(self, client: int, x):
        r"""The model with hyperparameters ``x`` trained on client ``client``'s training
        split."""
        data = self._client(client)
        model = self.make_model(x)
        with self._threads():
            model.fit(data.X_train, data.y_train)
        return model

    # --- losses -----------------------------------------------------------------------
    def validation_loss(self, client: int, x) -> float:
        r"""Client ``client``'s black box at ``x``: validation log-loss of the model
        trained on its training split."""
        from sklearn.metrics import log_loss

        data = self._client(client)
        model = self.fit(client, x)
        with self._threads():
            proba = model.predict_proba(data.X_val)
        return float(log_loss(data.y_val, proba, labels=model.classes_))

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
        trained on its training split, scored on the shared test set weighted to the
        client's class frequencies (:meth:`score_test`)."""
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
        :class:`~botorch_fed.federation.CallableObjective` (minimised)."""
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
    )


def split_data_set(
    dataset: str,
    num_clients: int,
    quantity_alpha: float | None,
    label_alpha: float | None,
    test_fraction: float,
    validation_fraction: float,
    seed: int,
    min_samples: int,
) -> tuple[np.ndarray, np.ndarray, list[ClientData], np.ndarray, dict]:
    r"""Steps 1-3 of the module docstring (arguments as :func:`make_federated_hpo_task`).

    Returns:
        ``(X, y, clients, test_index, config)`` for a task's constructor.
    """
    X, y = _load(dataset)
    M = _check_int(num_clients, "num_clients", 1)
    test_fraction = _check_fraction(test_fraction, "test_fraction")
    validation_fraction = _check_fraction(validation_fraction, "validation_fraction")
    seed = _check_int(seed, "seed", 0)
    test_rng, partition_seed, split_rng = (
        np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(3)
    )
    pool, test_index = _stratified_split(np.arange(len(y)), y, test_fraction, test_rng)
    parts = dirichlet_partition(
        y[pool],
        M,
        quantity_alpha=quantity_alpha,
        label_alpha=label_alpha,
        seed=int(partition_seed.integers(2**31)),
        min_samples=min_samples,
        min_classes=2,
    )
    clients = []
    for part in parts:
        train, val = _stratified_split(pool[part], y, validation_fraction, split_rng)
        clients.append(ClientData(X[train], y[train], X[val], y[val], train, val))
    config = {
        "dataset": dataset,
        "num_clients": M,
        "quantity_alpha": quantity_alpha,
        "label_alpha": label_alpha,
        "test_fraction": test_fraction,
        "validation_fraction": validation_fraction,
        "seed": seed,
        "min_samples": min_samples,
    }
    return X, y, clients, test_index, config
