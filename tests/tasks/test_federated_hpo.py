r"""The federated HGB tuning task: partition, domain mapping, losses, errors, one run.

Losses are checked against an independent computation: the classifier trained
directly with the hand-decoded hyperparameters, its probabilities compared exactly
and the log-loss recomputed with numpy. About 5 s on 2 cores.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from sklearn.ensemble import HistGradientBoostingClassifier

from botorch_fed.algorithms import run_federated
from botorch_fed.problems.objectives import CallableObjective
from botorch_fed.protocol import BOSettings, FederationSetup
from botorch_fed.tasks import (
    HYPERPARAMETERS,
    FederatedHPOTask,
    decode_hyperparameters,
    dirichlet_partition,
    make_federated_hpo_task,
    search_space_bounds,
)
from tests.helpers.tolerances import reordering_factor

Y = np.repeat(np.arange(4), [150, 120, 90, 60])  # 420 labels, 4 unbalanced classes
EPS = float(np.finfo(np.float64).eps)


@pytest.fixture(scope="module")
def task() -> FederatedHPOTask:
    return make_federated_hpo_task("breast_cancer", num_clients=4, label_alpha=1.0, seed=3)


def _sizes_cv(parts) -> float:
    sizes = np.array([len(p) for p in parts], dtype=float)
    return float(sizes.std() / sizes.mean())


def _label_tv(parts, y) -> float:
    r"""Mean total-variation distance between each client's and the overall label
    distribution."""
    classes = np.unique(y)
    overall = np.array([(y == c).mean() for c in classes])
    tv = [
        0.5 * np.abs(np.array([(y[p] == c).mean() for c in classes]) - overall).sum() for p in parts
    ]
    return float(np.mean(tv))


# --- partition --------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("quantity_alpha", "label_alpha"), [(10.0, None), (None, 0.5), (10.0, 1.0), (None, None)]
)
def test_partition_covers_every_sample_once_and_reproduces(quantity_alpha, label_alpha):
    parts = dirichlet_partition(Y, 5, quantity_alpha, label_alpha, seed=7)
    assert len(parts) == 5
    np.testing.assert_array_equal(np.sort(np.concatenate(parts)), np.arange(len(Y)))
    for p in parts:
        assert np.all(np.diff(p) > 0)  # sorted, no duplicates
        assert len(p) >= 10
        assert (np.bincount(Y[p], minlength=4) >= 2).sum() >= 2
    again = dirichlet_partition(Y, 5, quantity_alpha, label_alpha, seed=7)
    assert all(np.array_equal(a, b) for a, b in zip(parts, again, strict=True))
    if (quantity_alpha, label_alpha) != (None, None):
        other = dirichlet_partition(Y, 5, quantity_alpha, label_alpha, seed=8)
        assert not all(np.array_equal(a, b) for a, b in zip(parts, other, strict=True))


def test_quantity_skew_happens():
    seeds = range(10)
    skewed = np.mean([_sizes_cv(dirichlet_partition(Y, 5, 10.0, None, seed=s)) for s in seeds])
    equal = [dirichlet_partition(Y, 5, None, None, seed=s) for s in seeds]
    # Dirichlet(10 * 1_5) proportions: coefficient of variation ~0.28
    assert skewed > 0.15
    for parts in equal:  # equal shares of every class (up to rounding)
        assert max(len(p) for p in parts) - min(len(p) for p in parts) <= 4
    # quantity skew alone keeps every client's label distribution near the overall one
    assert (
        np.mean([_label_tv(dirichlet_partition(Y, 5, 10.0, None, seed=s), Y) for s in seeds]) < 0.03
    )


def test_label_skew_happens():
    seeds = range(10)
    tv = {
        a: np.mean([_label_tv(dirichlet_partition(Y, 5, None, a, seed=s), Y) for s in seeds])
        for a in (0.5, 5.0, None)
    }
    assert tv[None] < 0.02
    assert tv[0.5] > 0.25
    assert tv[0.5] > tv[5.0] > tv[None]


def test_task_splits_are_disjoint_and_stratified(task):
    n = len(task.y)
    indices = [task.test_index] + [
        np.concatenate([c.train_index, c.val_index]) for c in task.clients
    ]
    np.testing.assert_array_equal(np.sort(np.concatenate(indices)), np.arange(n))
    # shared test set: a stratified quarter
    assert abs(len(task.test_index) - 0.25 * n) <= len(task.classes)
    for c in task.clients:
        assert set(c.y_val) <= set(c.y_train)  # every validation class was trained on
        np.testing.assert_array_equal(c.X_train, task.X[c.train_index])
        np.testing.assert_array_equal(c.y_val, task.y[c.val_index])
        assert abs(len(c.y_val) - 0.3 * c.size) <= len(task.classes)
    again = make_federated_hpo_task("breast_cancer", num_clients=4, label_alpha=1.0, seed=3)
    for a, b in zip(task.clients, again.clients, strict=True):
        np.testing.assert_array_equal(a.train_index, b.train_index)
        np.testing.assert_array_equal(a.val_index, b.val_index)
    other = make_federated_hpo_task("breast_cancer", num_clients=4, label_alpha=1.0, seed=4)
    assert not np.array_equal(task.clients[0].train_index, other.clients[0].train_index)


# --- domain mapping and losses ------------------------------------------------------------
def test_decode_scales_and_rounding():
    bounds = search_space_bounds()
    assert bounds.shape == (2, len(HYPERPARAMETERS)) and bounds.dtype == torch.float64
    low = decode_hyperparameters(bounds[0])
    high = decode_hyperparameters(bounds[1].numpy())
    assert low == {
        "learning_rate": 10**-2.5,
        "max_leaf_nodes": 2,
        "min_samples_leaf": 1,
        "l2_regularization": 1e-4,
        "max_features": 0.1,
    }
    assert high["learning_rate"] == 1.0 and high["max_leaf_nodes"] == 64
    assert high["min_samples_leaf"] == 32 and high["l2_regularization"] == 10.0
    mid = decode_hyperparameters([-1.0, 2.5, 3.5, -2.0, 0.55])
    assert mid["learning_rate"] == 0.1
    assert mid["max_leaf_nodes"] == 6  # 2**2.5 = 5.66
    assert mid["min_samples_leaf"] == 4  # half up
    assert mid["l2_regularization"] == 0.01 and mid["max_features"] == 0.55
    assert decode_hyperparameters([-1.0, 2.3, 3.49, -2.0, 0.55])["max_leaf_nodes"] == 5  # 4.92
    assert decode_hyperparameters([-1.0, 2.3, 3.49, -2.0, 0.55])["min_samples_leaf"] == 3
    assert all(isinstance(mid[k], int) for k in ("max_leaf_nodes", "min_samples_leaf"))


def _direct_loss(X_fit, y_fit, X_eval, y_eval, x, weights=None):
    r"""Train HGB with hand-decoded hyperparameters; return (probabilities, log-loss by numpy)."""
    model = HistGradientBoostingClassifier(
        learning_rate=10.0 ** x[0],
        max_leaf_nodes=int(math.floor(2.0 ** x[1] + 0.5)),
        min_samples_leaf=int(math.floor(x[2] + 0.5)),
        l2_regularization=10.0 ** x[3],
        max_features=x[4],
        max_iter=100,
        early_stopping=False,
        random_state=0,
    )
    model.fit(X_fit, y_fit)
    proba = model.predict_proba(X_eval)
    eps = np.finfo(np.float64).eps
    p = np.clip(
        proba[np.arange(len(y_eval)), np.searchsorted(model.classes_, y_eval)], eps, 1 - eps
    )
    return proba, float(np.average(-np.log(p), weights=weights))


POINTS = [[-1.3, 2.2, 7.4, -3.1, 0.8], [-0.4, 4.6, 1.2, 0.3, 0.35], [-2.5, 1.0, 32.0, -4.0, 1.0]]


def test_validation_objective_matches_direct_training(task):
    i = 1
    c = task.clients[i]
    objective = task.objective(i)
    assert isinstance(objective, CallableObjective) and objective.minimize
    assert torch.equal(objective.bounds, search_space_bounds())
    X = torch.tensor(POINTS, dtype=torch.float64)
    values = objective.fn(X)
    assert values.shape == (3,) and values.dtype == torch.float64
    for x, v in zip(POINTS, values.tolist(), strict=True):
        proba, loss = _direct_loss(c.X_train, c.y_train, c.X_val, c.y_val, x)
        model = task.fit(i, x)
        np.testing.assert_array_equal(model.predict_proba(c.X_val), proba)
        assert v == task.validation_loss(i, x)
        # scikit-learn's log-loss against numpy's: the same n positive terms -log p,
        # their logs (one ulp each) and averages (n additions, a division) rounded in
        # two implementations: within (2 n + 4) eps of the loss
        assert abs(v - loss) <= (reordering_factor(len(c.y_val)) + 4) * EPS * loss
    assert torch.equal(objective.fn(X[:1]), values[:1])  # deterministic
    # through the public wrapper: unit-cube points are mapped onto the search space
    U = (X[:1] - task.bounds[0]) / (task.bounds[1] - task.bounds[0])
    observed, reported = objective.evaluate(U)
    torch.testing.assert_close(observed, values[:1], rtol=1e-12, atol=0)
    assert torch.equal(observed, reported)


def test_test_losses_match_direct_computation(task):
    x = POINTS[0]
    losses, bounds = [], []
    for i, c in enumerate(task.clients):
        # client i's class frequencies over its whole slice, relative to the test set's
        pi = np.array([(c.labels == k).mean() for k in task.classes])
        pi_test = np.array([(task.y_test == k).mean() for k in task.classes])
        w = (pi / pi_test)[np.searchsorted(task.classes, task.y_test)]
        np.testing.assert_allclose(task.test_weights(i), w, rtol=1e-14)
        _, loss = _direct_loss(c.X_train, c.y_train, task.X_test, task.y_test, x, weights=w)
        # the same as: sum over classes of pi_i(k) * mean test loss within class k;
        # weighted averages of n positive terms in two implementations (a log, a
        # product, n-term sums of w l and of w, a division each): within (2 n + 4) eps
        bound = (reordering_factor(len(task.y_test)) + 4) * EPS * loss
        assert abs(task.test_loss(i, x) - loss) <= bound
        losses.append(loss)
        bounds.append(bound)
    sizes = np.array([c.size for c in task.clients])
    # the clients' bounds carry over to their size-weighted mean, plus its own roundings
    # on both sides (M products and additions, a division)
    bound = (sizes * np.array(bounds)).sum() / sizes.sum()
    bound += reordering_factor(len(sizes)) * EPS * max(losses)
    expected = float((sizes * np.array(losses)).sum() / sizes.sum())
    assert abs(task.federation_test_loss(x) - expected) <= bound


def test_missing_class_gets_zero_weight():
    y = np.repeat(np.arange(3), 60)
    parts = dirichlet_partition(y, 3, None, 0.05, seed=0, min_samples=5)
    assert any((np.bincount(y[p], minlength=3) == 0).any() for p in parts)
    task = make_federated_hpo_task("digits", num_clients=3, label_alpha=0.05, seed=0)
    for i, c in enumerate(task.clients):
        absent = np.setdiff1d(task.classes, c.labels)
        w = task.test_weights(i)
        assert np.all(w[np.isin(task.y_test, absent)] == 0)
        assert np.all(w[~np.isin(task.y_test, absent)] > 0)
    assert any(len(np.setdiff1d(task.classes, c.labels)) for c in task.clients)


# --- errors -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"dataset": "iris"}, "dataset"),
        ({"num_clients": 0}, "num_clients"),
        ({"num_clients": True}, "num_clients"),
        ({"num_clients": 2.5}, "num_clients"),
        ({"quantity_alpha": 0.0}, "quantity_alpha"),
        ({"quantity_alpha": float("inf")}, "quantity_alpha"),
        ({"label_alpha": -1.0}, "label_alpha"),
        ({"label_alpha": "high"}, "label_alpha"),
        ({"test_fraction": 1.0}, "test_fraction"),
        ({"validation_fraction": 0}, "validation_fraction"),
        ({"seed": -1}, "seed"),
        ({"max_iter": 0}, "max_iter"),
        ({"n_threads": 0}, "n_threads"),
        ({"num_clients": 30}, "min_samples"),
    ],
)
def test_bad_task_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        make_federated_hpo_task(**kwargs)


def test_bad_partition_and_points(task):
    with pytest.raises(ValueError, match="integer labels"):
        dirichlet_partition(np.array([0.5, 1.5]), 2)
    with pytest.raises(ValueError, match="min_classes"):
        dirichlet_partition(Y, 2, min_classes=5)
    with pytest.raises(ValueError, match="No partition .* use fewer clients or larger alphas"):
        dirichlet_partition(Y, 20, None, 0.01, seed=0, max_tries=3)
    with pytest.raises(ValueError, match=r"shape \(5,\)"):
        decode_hyperparameters([0.1, 2.0])
    with pytest.raises(ValueError, match="'learning_rate' = 0.5 is outside"):
        decode_hyperparameters([0.5, 2.0, 3.0, -1.0, 0.5])
    with pytest.raises(ValueError, match="finite"):
        decode_hyperparameters([float("nan"), 2.0, 3.0, -1.0, 0.5])
    with pytest.raises(ValueError, match="client"):
        task.test_loss(4, POINTS[0])
    with pytest.raises(ValueError, match="client"):
        task.objective(-1)


# --- a federated run ----------------------------------------------------------------------
def test_run_federated_on_the_task(quiet_single_thread):
    task = make_federated_hpo_task("breast_cancer", num_clients=3, label_alpha=None, seed=0)
    setup = FederationSetup(objectives=task.objectives(), seed=0)
    settings = BOSettings(num_init=2, num_rounds=2, raw_samples=16, maxiter=10)
    result = run_federated("local", setup, settings)
    assert result.minimize and not result.failures
    assert result.steps == {"init": 6, "local": 6}
    assert len(result.best_per_round) == 3
    assert result.best_value == min(result.best_per_client.values())
    # the best point is a search-space point whose loss the owning client reproduces
    owner = min(result.best_per_client, key=result.best_per_client.get)
    assert task.validation_loss(owner, result.best_point) == result.best_value
    assert math.isfinite(task.federation_test_loss(result.best_point))


# --- the k-fold cross-validated black box -----------------------------------------------
@pytest.fixture(scope="module")
def cv_task() -> FederatedHPOTask:
    return make_federated_hpo_task("wine", num_clients=3, label_alpha=1.0, seed=1, cv_folds=4)


def test_cv_folds_partition_each_clients_whole_slice(cv_task):
    for i, c in enumerate(cv_task.clients):
        folds = cv_task.folds(i)
        assert len(folds) == 4
        held = np.concatenate([h for _, h in folds])
        assert sorted(held.tolist()) == list(range(c.size))  # every sample held out once
        for train, h in folds:
            assert not np.intersect1d(train, h).size and len(train) + len(h) == c.size
        assert [h.tolist() for _, h in cv_task.folds(i)] == [h.tolist() for _, h in folds]


def test_cv_objective_is_the_mean_fold_loss_of_models_trained_on_the_other_folds(cv_task):
    x = POINTS[1]
    for i, c in enumerate(cv_task.clients):
        X = np.concatenate([c.X_train, c.X_val])
        y = np.concatenate([c.y_train, c.y_val])
        losses = []
        for train, held in cv_task.folds(i):
            model = HistGradientBoostingClassifier(
                learning_rate=10.0 ** x[0], max_leaf_nodes=int(math.floor(2.0 ** x[1] + 0.5)),
                min_samples_leaf=int(math.floor(x[2] + 0.5)), l2_regularization=10.0 ** x[3],
                max_features=x[4], max_iter=100, early_stopping=False, random_state=0,
            )  # fmt: skip
            model.fit(X[train], y[train])
            proba = model.predict_proba(X[held])
            # a class missing from the training folds: probability 0, clipped to eps
            col = {k: j for j, k in enumerate(model.classes_)}
            p = np.array([proba[r, col[k]] if k in col else 0.0 for r, k in enumerate(y[held])])
            losses.append(float(np.mean(-np.log(np.clip(p, EPS, 1 - EPS)))))
        expected = float(np.mean(losses))
        bound = (reordering_factor(c.size) + 8) * EPS * expected
        assert abs(cv_task.validation_loss(i, x) - expected) <= bound
        # deployed on the shared test set: trained on the whole slice
        w = cv_task.test_weights(i)
        _, test = _direct_loss(X, y, cv_task.X_test, cv_task.y_test, x, weights=w)
        bound = (reordering_factor(len(cv_task.y_test)) + 4) * EPS * test
        assert abs(cv_task.test_loss(i, x) - test) <= bound


def test_cv_folds_fall_back_to_plain_kfold_when_a_class_is_rarer_than_the_folds():
    from sklearn.model_selection import KFold, StratifiedKFold

    task = make_federated_hpo_task("wine", num_clients=3, label_alpha=1.0, seed=3, cv_folds=5)
    rare = [
        i
        for i, c in enumerate(task.clients)
        if np.unique(c.labels, return_counts=True)[1].min() < 5
    ]
    assert rare  # this partition has one
    for i, c in enumerate(task.clients):
        kind = KFold if i in rare else StratifiedKFold
        expected = kind(5, shuffle=True, random_state=0).split(np.zeros(c.size), c.labels)
        assert [h.tolist() for _, h in task.folds(i)] == [h.tolist() for _, h in expected]
    assert np.isfinite(task.validation_loss(rare[0], POINTS[0]))


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"cv_folds": 1}, "cv_folds"),
        ({"cv_folds": 2.0}, "cv_folds"),
        ({"cv_folds": 200}, r"`cv_folds`=200: client \d holds \d+ samples"),
    ],
)
def test_bad_cv_folds_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        make_federated_hpo_task("wine", num_clients=3, **kwargs)


def test_folds_need_a_cv_task(task):
    with pytest.raises(ValueError, match="no `cv_folds`"):
        task.folds(0)
