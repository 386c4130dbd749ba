r"""A scikit-learn classification data set split across clients with quantity and label skew.

The data sets (:data:`DATASETS`) ship with scikit-learn (``breast_cancer``: 569
samples, 30 features, 2 classes; ``digits``: 1797 samples, 64 features, 10 classes;
``wine``: 178 samples, 13 features, 3 classes).
:func:`split_data_set` (what the tasks' ``make_*_task`` call; every draw from ``seed``):

1. a stratified ``test_fraction`` of the data set is the shared held-out **test set**
   (no client ever sees it);
2. the rest is split across the clients by :func:`dirichlet_partition`: **quantity
   skew** (client proportions ``q ~ Dirichlet(quantity_alpha)``, alpha = 10 as in
   [FBO-FedGP] after Archetti et al., 2023) and **label skew** (per class
   ``w_k ~ Dirichlet(label_alpha)``; class ``k`` is split in proportions
   ``q * w_k`` normalised). Every sample lands in exactly one client;
3. each client splits its slice, stratified by class, into a training and a
   ``validation_fraction`` validation split.

Each client's share is a :class:`ClientData`.

References:

.. [FBO-FedGP] Secure federated Bayesian optimisation with distributed sparse GPs
   (paper 000 in ``shared/papers``), Sec. 5.1.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

DATASETS = ("breast_cancer", "digits", "wine")


def _load(dataset: str) -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_breast_cancer, load_digits, load_wine

    if dataset not in DATASETS:
        raise ValueError(f"`dataset`={dataset!r} must be one of {DATASETS}.")
    loaders = {"breast_cancer": load_breast_cancer, "digits": load_digits, "wine": load_wine}
    X, y = loaders[dataset](return_X_y=True)
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
