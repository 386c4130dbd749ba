r"""The federated MLP tuning task (Co-KG's NN task): its search space, determinism and
that it scores what scikit-learn scores when the same pipeline is built by hand."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from botorch_fed.tasks import (
    MLP_HYPERPARAMETERS,
    FederatedMLPTask,
    decode_hyperparameters,
    make_federated_hpo_task,
    make_federated_mlp_task,
)


@pytest.fixture(scope="module")
def task() -> FederatedMLPTask:
    return make_federated_mlp_task(num_clients=3, seed=0, max_iter=30)


def test_search_space(task):
    assert task.dim == 2
    torch.testing.assert_close(
        task.bounds, torch.tensor([[-6.0, -4.0], [0.0, -1.0]], dtype=torch.float64)
    )
    assert decode_hyperparameters([-2.0, -3.0], MLP_HYPERPARAMETERS) == pytest.approx(
        {"alpha": 1e-2, "learning_rate_init": 1e-3}
    )
    with pytest.raises(ValueError, match="outside its bounds"):
        decode_hyperparameters([1.0, -3.0], MLP_HYPERPARAMETERS)
    with pytest.raises(ValueError, match="shape"):
        decode_hyperparameters([1.0, -3.0, 0.0], MLP_HYPERPARAMETERS)
    with pytest.raises(ValueError, match="hidden_units"):
        make_federated_mlp_task(num_clients=2, hidden_units=0)


def test_same_split_as_the_hpo_task(task):
    hgb = make_federated_hpo_task(num_clients=3, seed=0)
    for a, b in zip(task.clients, hgb.clients, strict=True):
        np.testing.assert_array_equal(a.train_index, b.train_index)
        np.testing.assert_array_equal(a.val_index, b.val_index)


def test_objective_is_the_validation_loss_of_the_pipeline(task):
    from sklearn.metrics import log_loss
    from sklearn.neural_network import MLPClassifier
    from sklearn.preprocessing import StandardScaler

    x = torch.tensor([[-3.0, -2.5], [-1.0, -1.5]], dtype=torch.float64)
    unit = (x - task.bounds[0]) / (task.bounds[1] - task.bounds[0])
    observed, _ = task.objective(1).evaluate(unit)
    data = task.clients[1]
    expected = []
    for row in x:
        scaler = StandardScaler().fit(data.X_train)
        mlp = MLPClassifier(
            hidden_layer_sizes=(16,),
            alpha=10 ** float(row[0]),
            learning_rate_init=10 ** float(row[1]),
            max_iter=30,
            random_state=0,
        )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            mlp.fit(scaler.transform(data.X_train), data.y_train)
        proba = mlp.predict_proba(scaler.transform(data.X_val))
        expected.append(log_loss(data.y_val, proba, labels=mlp.classes_))
    torch.testing.assert_close(observed.squeeze(-1), torch.tensor(expected, dtype=torch.float64))
    again, _ = task.objective(1).evaluate(unit)
    torch.testing.assert_close(again, observed)  # deterministic
    assert task.objective(0).name == "mlp-logloss-client0"
    assert task.describe()["hidden_units"] == 16
    assert np.isfinite(task.federation_test_loss([-3.0, -2.5]))
