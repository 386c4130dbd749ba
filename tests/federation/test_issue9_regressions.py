r"""Regression tests for the defects the issue-9 review found (resume from round 0,
overwriting another run's checkpoint, manifest and state validation, objectives'
return values, setup validation, clients without history). The
checkpoint tests compare a resumed run with the uninterrupted one (an independent
computation: the same run without a checkpoint) or check what is left on disk.
"""

from __future__ import annotations

import hashlib
import json
import math

import numpy as np
import pytest
import torch

from botorch_fed.federation import (
    AlgorithmSpec,
    BOSettings,
    CallableObjective,
    FBOFedGPConfig,
    FederatedClient,
    FederationSetup,
    ObjectiveContractError,
    register_algorithm,
    run_federated,
    unregister_algorithm,
)
from botorch_fed.federation import checkpoint as ckpt
from botorch_fed.federation.checkpoint import MANIFEST, CheckpointError, load_checkpoint
from botorch_fed.federation.independent import PacingServer
from tests.helpers.federation_runs import Killed, comparable, kill_after

pytestmark = pytest.mark.usefixtures("quiet_single_thread")

NUM_CLIENTS, NUM_INIT, ROUNDS = 3, 3, 3


def _setup(seed: int = 2, **kwargs) -> FederationSetup:
    return FederationSetup(problem="branin", num_clients=NUM_CLIENTS, seed=seed, **kwargs)


def _settings(algorithm: str, **kwargs):
    small = dict(num_init=NUM_INIT, num_rounds=ROUNDS, num_restarts=2, raw_samples=16, maxiter=15)
    small.update(kwargs)
    if algorithm == "fbo-fedgp":
        return FBOFedGPConfig(support_size=5, support_every=2, schedule=1.0, **small)
    return BOSettings(**small)


def _rewrite(folder, name, state, manifest) -> None:
    r"""Replace a party's file and fix its digest (a consistent but altered checkpoint)."""
    entry = manifest["files"][name]
    path = folder / entry["file"]
    torch.save(state, path)
    entry["sha256"] = hashlib.sha256(path.read_bytes()).hexdigest()
    (folder / MANIFEST).write_text(json.dumps(manifest))


# --- checkpoint / resume -----------------------------------------------------------------


@pytest.mark.parametrize("algorithm", ["local", "fbo-fedgp"])
def test_resume_from_the_round_0_checkpoint_is_bit_for_bit(tmp_path, algorithm):
    # private randomness seeded: FBO-FedGP's default noises its centres from it
    setup = _setup(crypto_seed=5)
    full = run_federated(algorithm, setup, _settings(algorithm))
    with pytest.raises(Killed):
        run_federated(
            algorithm,
            setup,
            _settings(algorithm),
            checkpoint=tmp_path,
            on_round=kill_after(0),
        )
    assert load_checkpoint(tmp_path)[0]["round"] == 0
    resumed = run_federated(algorithm, setup, _settings(algorithm), resume=tmp_path)
    assert resumed.steps["init"] == NUM_CLIENTS * NUM_INIT  # no initial design twice
    assert len(resumed.best_per_round) == ROUNDS + 1
    assert comparable(resumed) == comparable(full)


@pytest.mark.parametrize("how", ["fresh", "resume-into-another-folder"])
def test_a_run_refuses_to_overwrite_another_checkpoint(tmp_path, how):
    precious, other = tmp_path / "precious", tmp_path / "other"
    run_federated("local", _setup(seed=5), _settings("local"), checkpoint=precious)
    before = {p.name: p.read_bytes() for p in precious.iterdir()}
    with pytest.raises(CheckpointError, match="precious"):
        if how == "fresh":
            run_federated("local", _setup(seed=6), _settings("local"), checkpoint=precious)
        else:
            with pytest.raises(Killed):
                run_federated(
                    "local",
                    _setup(seed=6),
                    _settings("local"),
                    checkpoint=other,
                    on_round=kill_after(1),
                )
            run_federated(
                "local", _setup(seed=6), _settings("local"), resume=other, checkpoint=precious
            )
    assert {p.name: p.read_bytes() for p in precious.iterdir()} == before


def test_a_crash_while_saving_into_a_used_folder_keeps_its_checkpoint(tmp_path, monkeypatch):
    with pytest.raises(Killed):  # run A stopped after its initial designs
        run_federated(
            "local",
            _setup(seed=5),
            _settings("local"),
            checkpoint=tmp_path,
            on_round=kill_after(0),
        )
    real = ckpt._write_atomically

    def crash_at_the_manifest(path, data):
        if path.name == MANIFEST:
            raise Killed  # run B dies after writing its party files
        real(path, data)

    monkeypatch.setattr(ckpt, "_write_atomically", crash_at_the_manifest)
    with pytest.raises((Killed, CheckpointError)):  # refused up front is fine too
        run_federated("local", _setup(seed=6), _settings("local"), checkpoint=tmp_path)
    monkeypatch.setattr(ckpt, "_write_atomically", real)
    manifest, _ = load_checkpoint(tmp_path)  # raises: run A's files were overwritten
    assert manifest["round"] == 0 and manifest["setup"]["seed"] == 5


def test_a_checkpoint_path_that_is_a_file_is_refused_before_any_evaluation(tmp_path):
    calls = []

    def loss(X):
        calls.append(len(X))
        return (X**2).sum(-1)

    path = tmp_path / "a-file"
    path.write_text("not a folder")
    objective = CallableObjective(loss, [[0.0, 0.0], [1.0, 1.0]])
    setup = FederationSetup(objectives=objective, num_clients=2)
    with pytest.raises(ValueError, match="checkpoint"):
        run_federated("local", setup, _settings("local"), checkpoint=path)
    assert calls == []
    assert path.read_text() == "not a folder"


@pytest.mark.parametrize(
    "edit",
    [
        {"round": None},
        {"best_per_round": None},
        {"time_s": None},
        {"round": "2"},
        {"best_per_round": "oops"},
    ],
    ids=["no-round", "no-best", "no-time", "round-str", "best-str"],
)
def test_a_manifest_with_bad_entries_is_a_checkpoint_error(tmp_path, edit):
    with pytest.raises(Killed):
        run_federated(
            "local", _setup(), _settings("local"), checkpoint=tmp_path, on_round=kill_after(2)
        )
    manifest = json.loads((tmp_path / MANIFEST).read_text())
    for key, value in edit.items():
        if value is None:
            manifest.pop(key)
        else:
            manifest[key] = value
    (tmp_path / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(CheckpointError):
        run_federated("local", _setup(), _settings("local"), resume=tmp_path)


def test_a_manifest_round_that_disagrees_with_the_files_is_refused(tmp_path):
    with pytest.raises(Killed):
        run_federated(
            "local", _setup(), _settings("local"), checkpoint=tmp_path, on_round=kill_after(2)
        )
    manifest = json.loads((tmp_path / MANIFEST).read_text())
    manifest["round"] = 1
    manifest["best_per_round"] = manifest["best_per_round"][:2]
    (tmp_path / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(CheckpointError, match="round"):
        run_federated("local", _setup(), _settings("local"), resume=tmp_path)


def test_a_partial_local_gp_state_is_refused(tmp_path):
    with pytest.raises(Killed):
        run_federated(
            "local",
            _setup(),
            _settings("local", local_refit_every=3),
            checkpoint=tmp_path,
            on_round=kill_after(1),
        )
    manifest, states = load_checkpoint(tmp_path)
    state = states["client-0"]
    assert state["state"]["local_fitter"]["state"]  # there is a fitted state to lose
    state["state"]["local_fitter"]["state"] = {}
    _rewrite(tmp_path, "client-0", state, manifest)
    with pytest.raises(CheckpointError, match="Client 0"):
        run_federated("local", _setup(), _settings("local", local_refit_every=3), resume=tmp_path)


@pytest.mark.parametrize("case", ["function-not-wrapped", "settings-of-wrong-type"])
def test_checkpointing_keeps_the_clear_errors(tmp_path, case):
    if case == "function-not-wrapped":
        setup = FederationSetup(objectives=[lambda X: X.sum(-1)] * 2)
        settings, match = _settings("local"), "CallableObjective"
    else:
        setup, settings, match = _setup(), {"num_rounds": 2}, "BOSettings"
    with pytest.raises(ValueError, match=match):  # the control: no checkpoint
        run_federated("local", setup, settings)
    with pytest.raises(ValueError, match=match):
        run_federated("local", setup, settings, checkpoint=tmp_path)


# --- objectives --------------------------------------------------------------------------


def test_a_list_of_tensors_that_require_grad_is_accepted():
    w = torch.tensor([1.0, -2.0], dtype=torch.float64, requires_grad=True)

    def loss(Z):  # e.g. a torch model's loss per point, returned as a list
        return [(z * w).sum() ** 2 for z in Z]

    objective = CallableObjective(loss, [[0.0, 0.0], [1.0, 1.0]])
    X = torch.tensor([[0.25, 0.5], [1.0, 0.0]], dtype=torch.float64)
    observed, reported = objective.evaluate(X)
    expected = torch.stack([v.detach() for v in loss(X)])
    assert torch.equal(observed, expected) and torch.equal(reported, expected)


def test_a_ragged_return_value_is_a_contract_error():
    objective = CallableObjective(lambda Z: [1.0, [2.0]], [[0.0, 0.0], [1.0, 1.0]])
    with pytest.raises(ObjectiveContractError, match="<lambda>"):
        objective.evaluate(torch.rand(2, 2, dtype=torch.float64))


@pytest.mark.parametrize(
    "value",
    [np.ma.masked, np.ma.array([5.0], mask=[True])],
    ids=["masked-constant", "masked-array"],
)
def test_masked_values_are_not_reported_as_numbers(value):
    objective = CallableObjective(lambda Z: value, [[0.0, 0.0], [1.0, 1.0]])
    X = torch.rand(1, 2, dtype=torch.float64)
    try:
        observed, reported = objective.evaluate(X)
    except ObjectiveContractError:
        return
    assert not torch.isfinite(observed).any() and not torch.isfinite(reported).any()


# --- setup / settings / registry -----------------------------------------------------------


@pytest.mark.parametrize(
    "algorithm, field, value",
    [
        ("fbo-fedgp", "crypto_seed", -1),
        ("fbo-fedgp", "crypto_seed", 1.5),
        ("local", "init_regions", "no"),
        ("local", "noise_std", math.inf),
        ("local", "noise_std", "0.1"),
        ("local", "shift", "0.1"),
        ("local", "beta", "1"),
    ],
)
def test_bad_setup_values_are_named(algorithm, field, value):
    if field == "beta":
        with pytest.raises(ValueError, match=f"`{field}`"):
            BOSettings(beta=value).validate()
        return
    setup = _setup(**{field: value})
    with pytest.raises(ValueError, match=f"`{field}`"):
        setup.validate(algorithm)


class _NoHistoryClient(FederatedClient):
    r"""A user's client that forgot the ``history`` the harness scores."""

    calls: list = []

    def __init__(self, cid, objective):
        super().__init__(cid)
        self.objective = objective

    def on_init(self, payload):
        _NoHistoryClient.calls.append("init")
        self.objective.evaluate(torch.rand(1, self.objective.dim, dtype=torch.float64))
        return {}

    def on_round(self, payload):
        _NoHistoryClient.calls.append("round")
        return {}


def test_a_client_without_history_is_refused_before_the_run():
    spec = AlgorithmSpec(
        name="review-no-history",
        summary="a client without history (review toy)",
        settings_class=BOSettings,
        make_client=lambda ctx, cid: _NoHistoryClient(cid, ctx.objectives[cid]),
        make_server=lambda ctx, transport: PacingServer(transport, ctx.settings),
    )
    register_algorithm(spec)
    _NoHistoryClient.calls = []
    try:
        objective = CallableObjective(lambda Z: Z.sum(-1), [[0.0, 0.0], [1.0, 1.0]])
        setup = FederationSetup(objectives=objective, num_clients=2)
        with pytest.raises((TypeError, ValueError), match="history"):
            run_federated("review-no-history", setup, BOSettings(num_rounds=2))
        assert _NoHistoryClient.calls == []
    finally:
        unregister_algorithm("review-no-history")
