r"""Checkpoint and resume: a run killed after round k (0 included) and resumed ends bit for
bit as the uninterrupted run, for every registered algorithm; corrupt, altered or foreign
checkpoints, and manifests or states that do not fit the run, are refused before anything
is loaded; a run neither overwrites another run's checkpoint nor writes through a link
planted in its folder, and keeps its party files private to the user."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import pickle
import shutil
import stat
import warnings

import numpy as np
import pytest
import torch

from botorch_fed.algorithms import (
    FBOFedGPSettings,
    FedZeroSettings,
    LDPBOSettings,
    available_algorithms,
    get_algorithm,
    run_federated,
)
from botorch_fed.algorithms.fbo_fedgp.server import FBOFedGPServer
from botorch_fed.problems.objectives import CallableObjective
from botorch_fed.protocol import BOSettings, FederationSetup, ProtocolViolation
from botorch_fed.protocol import checkpoint as ckpt
from botorch_fed.protocol.checkpoint import MANIFEST, CheckpointError, load_checkpoint
from botorch_fed.secure import available_backends
from tests.helpers.federation_runs import Killed, comparable, kill_after

pytestmark = pytest.mark.usefixtures("quiet_single_thread")

ROUNDS, KILL = 4, 2


def _settings(algorithm: str, **kwargs):
    small = dict(num_init=3, num_rounds=ROUNDS, num_restarts=2, raw_samples=16, maxiter=15)
    small.update(kwargs)
    if get_algorithm(algorithm).settings_class is FedZeroSettings:
        return FedZeroSettings(num_rounds=small["num_rounds"], eta=0.05, h=0.05)
    if get_algorithm(algorithm).settings_class is LDPBOSettings:
        # MoMA: epochs of 2 plays, so the kill falls between epochs and inside one
        return LDPBOSettings(num_rounds=small["num_rounds"], plays_per_epoch=2, q=5.0)
    if get_algorithm(algorithm).settings_class is FBOFedGPSettings:
        # every kind of round before and after the kill: support re-selection, a
        # federated hyperparameter fit, global steps (schedule c=1: p_t = 1 - 1/t)
        options = dict(
            support_size=5,
            support_every=2,
            hyper_every=2,
            hyperparameters="federated",
            federated_maxiter=3,
            schedule=1.0,
            local_refit_every=2,
        )
        return FBOFedGPSettings(**{**options, **small})
    cls = get_algorithm(algorithm).settings_class
    fields = {f.name for f in dataclasses.fields(cls)}
    # Co-KG family: a 4 x 4 grid and few Monte Carlo samples keep a round cheap
    cheap = dict(points_per_dim=4, num_fantasies=4, num_mv_samples=4)
    small = {**{k: v for k, v in cheap.items() if k in fields}, **small}
    return cls(**{"local_refit_every": 2, **small})


def _setup(aggregator: str = "plaintext", **kwargs) -> FederationSetup:
    base = dict(problem="branin", num_clients=3, seed=2, noise_std=0.5, aggregator=aggregator)
    base.update(kwargs)
    return FederationSetup(**base)


def _state(clients) -> list:
    return [(c.X.clone(), c.Y.clone(), list(c.history)) for _, c in sorted(clients.items())]


def _cases():
    for name in available_algorithms():
        if get_algorithm(name).secure_aggregation:
            for agg in ("plaintext", "masking", "ckks"):
                marks = []
                if agg not in available_backends():
                    marks = [pytest.mark.skip(reason=f"{agg} backend not installed")]
                yield pytest.param(name, agg, id=f"{name}-{agg}", marks=marks)
        else:
            yield pytest.param(name, "plaintext", id=name)


def _setup_for(algorithm: str, aggregator: str) -> FederationSetup:
    if get_algorithm(algorithm).settings_class is LDPBOSettings:
        # LDP users draw their Laplace noise from private generators: seeded here
        return FederationSetup(problem="ldp-synthetic", num_clients=3, seed=2, crypto_seed=5)
    if get_algorithm(algorithm).settings_class is FBOFedGPSettings:
        # the default's clients noise their k-means centres from private generators
        # (`center_noise`): seeded here, so the uninterrupted run can be reproduced
        return _setup(aggregator, crypto_seed=5)
    return _setup(aggregator)


@pytest.mark.parametrize("algorithm, aggregator", list(_cases()))
def test_resume_is_bit_for_bit(tmp_path, algorithm, aggregator):
    full = run_federated(algorithm, _setup_for(algorithm, aggregator), _settings(algorithm))
    with pytest.raises(Killed):
        run_federated(
            algorithm,
            _setup_for(algorithm, aggregator),
            _settings(algorithm),
            checkpoint=tmp_path,
            on_round=kill_after(KILL),
        )
    manifest, states = load_checkpoint(tmp_path)
    assert manifest["round"] == KILL
    assert set(states) == {"server", "client-0", "client-1", "client-2"}
    rounds_seen = []
    resumed = run_federated(
        algorithm,
        _setup_for(algorithm, aggregator),
        _settings(algorithm),
        resume=tmp_path,
        on_round=lambda t, b: rounds_seen.append(t),
    )
    assert rounds_seen == list(range(KILL + 1, ROUNDS + 1))
    got, want = comparable(resumed), comparable(full)
    if aggregator == "ckks" and algorithm == "fbo-fedgp":
        # the resumed clients' CKKS roles are fresh: they hold no committed nonce, so the
        # first secure sum after the resume takes a nonce round (one exchange more)
        extra = [int(t == KILL + 1) for t in range(ROUNDS + 1)]
        assert got.pop("exchanges_per_round") == [
            n + e for n, e in zip(want.pop("exchanges_per_round"), extra, strict=True)
        ]
        got.pop("bytes"), want.pop("bytes")
    assert got == want
    assert load_checkpoint(tmp_path)[0]["round"] == ROUNDS


def test_resume_depends_on_the_saved_state(tmp_path):
    r"""Control: the comparison above can fail. Resuming with one client's generator
    state changed gives another run (local BO draws nothing from it, random search
    does)."""
    full = run_federated("random", _setup(), _settings("random"))
    with pytest.raises(Killed):
        run_federated(
            "random", _setup(), _settings("random"), checkpoint=tmp_path, on_round=kill_after(1)
        )
    manifest, states = load_checkpoint(tmp_path)
    entry = manifest["files"]["client-1"]
    state = states["client-1"]
    state["state"]["rng"] = torch.Generator().manual_seed(0).get_state()
    _rewrite(tmp_path, entry, state, manifest)
    resumed = run_federated("random", _setup(), _settings("random"), resume=tmp_path)
    assert comparable(resumed) != comparable(full)


def _rewrite(folder, entry, state, manifest) -> None:
    r"""Replace a party's file and fix its digest in the manifest (a consistent but
    different checkpoint)."""
    path = folder / entry["file"]
    torch.save(state, path)
    entry["sha256"] = hashlib.sha256(path.read_bytes()).hexdigest()
    (folder / MANIFEST).write_text(json.dumps(manifest))


def test_extending_a_finished_run_equals_the_longer_run(tmp_path):
    longer = run_federated("local", _setup(), _settings("local", num_rounds=ROUNDS + 2))
    run_federated("local", _setup(), _settings("local"), checkpoint=tmp_path)
    extended = run_federated(
        "local", _setup(), _settings("local", num_rounds=ROUNDS + 2), resume=tmp_path
    )
    assert comparable(extended) == comparable(longer)


def test_own_callable_objective_resumes(tmp_path):
    def loss(X):  # a deterministic black box in the user's domain
        return ((X - torch.tensor([0.3, -2.0], dtype=X.dtype)) ** 2).sum(-1)

    def setup():
        obj = CallableObjective(loss, bounds=[[0.0, -5.0], [1.0, 5.0]], name="quadratic")
        return FederationSetup(objectives=[obj] * 3, seed=1)

    full = run_federated("local", setup(), _settings("local"))
    with pytest.raises(Killed):
        run_federated(
            "local", setup(), _settings("local"), checkpoint=tmp_path, on_round=kill_after(KILL)
        )
    resumed = run_federated("local", setup(), _settings("local"), resume=tmp_path)
    assert comparable(resumed) == comparable(full)


@pytest.fixture(scope="module")
def _killed_run(tmp_path_factory):
    r"""A checkpoint of a killed FBO-FedGP run (masking) after round 1, made once."""
    folder = tmp_path_factory.mktemp("killed-fbo-fedgp")
    with warnings.catch_warnings(), pytest.raises(Killed):
        warnings.simplefilter("ignore")
        run_federated(
            "fbo-fedgp",
            _setup("masking"),
            _settings("fbo-fedgp"),
            checkpoint=folder,
            on_round=kill_after(1),
        )
    return folder


@pytest.fixture
def saved(_killed_run, tmp_path):
    r"""A copy of :func:`_killed_run`'s checkpoint (modes kept), for the test to alter."""
    folder = tmp_path / "checkpoint"
    shutil.copytree(_killed_run, folder)
    return folder


def _resume(folder, **setup_kwargs):
    setup_kwargs.setdefault("aggregator", "masking")
    return run_federated("fbo-fedgp", _setup(**setup_kwargs), _settings("fbo-fedgp"), resume=folder)


def test_refuses_a_folder_without_checkpoint(tmp_path):
    with pytest.raises(CheckpointError, match="holds no checkpoint"):
        run_federated("local", _setup(), _settings("local"), resume=tmp_path)


@pytest.mark.parametrize("damage", ["truncate", "flip", "delete"])
def test_refuses_damaged_party_files(saved, damage):
    manifest = json.loads((saved / MANIFEST).read_text())
    path = saved / manifest["files"]["client-1"]["file"]
    data = path.read_bytes()
    if damage == "truncate":
        path.write_bytes(data[: len(data) // 2])
    elif damage == "flip":
        path.write_bytes(data[:100] + bytes([data[100] ^ 1]) + data[101:])
    else:
        path.unlink()
    with pytest.raises(CheckpointError, match="client-1"):
        _resume(saved)


def test_refuses_a_corrupt_manifest(saved):
    (saved / MANIFEST).write_text('{"format": 1, "round": ')
    with pytest.raises(CheckpointError, match="corrupt"):
        _resume(saved)
    (saved / MANIFEST).write_text(json.dumps({"format": 99}))
    with pytest.raises(CheckpointError, match="format"):
        _resume(saved)


@pytest.mark.parametrize(
    "change, message",
    [
        ({"seed": 3}, "seed"),
        ({"num_clients": 4}, "num_clients"),
        ({"problem": "hartmann"}, "problem"),
        ({"aggregator": "plaintext"}, "aggregator"),
    ],
)
def test_refuses_another_runs_checkpoint(saved, change, message):
    with pytest.raises(CheckpointError, match=message):
        _resume(saved, **change)


def test_refuses_other_algorithm_or_settings(saved):
    with pytest.raises(CheckpointError, match="algorithm"):
        run_federated("local", _setup("masking"), _settings("local"), resume=saved)
    with pytest.raises(CheckpointError, match="support_size"):
        run_federated(
            "fbo-fedgp", _setup("masking"), _settings("fbo-fedgp", support_size=6), resume=saved
        )


def test_refuses_fewer_rounds_than_done(tmp_path):
    with pytest.raises(Killed):
        run_federated(
            "local", _setup(), _settings("local"), checkpoint=tmp_path, on_round=kill_after(2)
        )
    with pytest.raises(CheckpointError, match="beyond `num_rounds`"):
        run_federated("local", _setup(), _settings("local", num_rounds=1), resume=tmp_path)


@pytest.mark.parametrize("saved_with, resumed_with", [("seed", "os"), ("os", "seed")])
def test_refuses_a_resume_that_changes_where_the_private_randomness_comes_from(
    tmp_path, saved_with, resumed_with
):
    r"""The result of a resumed run records where its private randomness came from;
    resumed from another source it would name one that did not make the saved keys,
    generators and noise."""
    with pytest.raises(Killed):
        run_federated(
            "local",
            _setup(),
            _settings("local"),
            checkpoint=tmp_path,
            on_round=kill_after(1),
            private_randomness=saved_with,
        )
    assert load_checkpoint(tmp_path)[0]["private_randomness"] == saved_with
    message = f"private_randomness: '{saved_with}' -> '{resumed_with}'"
    with pytest.raises(CheckpointError, match=message):
        run_federated(
            "local", _setup(), _settings("local"), resume=tmp_path, private_randomness=resumed_with
        )
    resumed = run_federated(
        "local", _setup(), _settings("local"), resume=tmp_path, private_randomness=saved_with
    )
    assert resumed.config["private_randomness"] == saved_with


def test_refuses_a_state_that_does_not_fit_the_run(saved):
    r"""A consistent manifest with a state of the wrong shape: a CheckpointError, raised
    before the run starts."""
    manifest, states = load_checkpoint(saved)
    state = states["client-2"]
    state["state"]["X"] = state["state"]["X"][:, :1]
    _rewrite(saved, manifest["files"]["client-2"], state, manifest)
    with pytest.raises(CheckpointError, match="Client 2: `X`"):
        _resume(saved)


@pytest.mark.parametrize("damage", ["short", "not-seeded"])
def test_refuses_a_private_generator_state_that_is_not_one(saved, damage):
    manifest, states = load_checkpoint(saved)
    state = states["client-2"]
    private = state["state"]["private_rng"].clone()
    if damage == "short":
        private = private[:100]
    else:  # the Mersenne Twister's `seeded` flag cleared
        private[12:16] = 0
    state["state"]["private_rng"] = private
    _rewrite(saved, manifest["files"]["client-2"], state, manifest)
    with pytest.raises(CheckpointError, match="Client 2: `private_rng`"):
        _resume(saved)


class _Exploit:
    def __reduce__(self):
        return (os.system, ("touch pwned",))


def test_a_checkpoint_cannot_execute_code(saved, monkeypatch):
    monkeypatch.chdir(saved)
    manifest = json.loads((saved / MANIFEST).read_text())
    entry = manifest["files"]["server"]
    path = saved / entry["file"]
    path.write_bytes(pickle.dumps({"state": _Exploit()}))
    entry["sha256"] = hashlib.sha256(path.read_bytes()).hexdigest()
    (saved / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(CheckpointError, match="cannot be read"):
        _resume(saved)
    assert not (saved / "pwned").exists()


def test_a_crash_while_saving_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    r"""Kill the process between the party files and the manifest of round 2: the
    folder still holds round 1 complete, and resuming from it ends as the full run."""
    full = run_federated("central", _setup(), _settings("central"))
    real = ckpt.write_atomically

    def crash_on_round_2_manifest(path, data):
        if path.name == MANIFEST and json.loads(data)["round"] == 2:
            raise Killed
        real(path, data)

    monkeypatch.setattr(ckpt, "write_atomically", crash_on_round_2_manifest)
    with pytest.raises(Killed):
        run_federated("central", _setup(), _settings("central"), checkpoint=tmp_path)
    monkeypatch.setattr(ckpt, "write_atomically", real)
    assert load_checkpoint(tmp_path)[0]["round"] == 1
    resumed = run_federated("central", _setup(), _settings("central"), resume=tmp_path)
    assert comparable(resumed) == comparable(full)


def test_each_party_file_holds_only_its_own_data(tmp_path):
    r"""The server's file holds no client's raw data; each client's file holds only its
    own points (clients' files belong on their machines). A point two clients both
    evaluated (a corner of the box their acquisitions both chose) is each one's own."""
    # the centre noise seeded: with 11, clients 0 and 2 both evaluate the corner (1, 0)
    # (on the machines this was written on; the test holds either way)
    setup = _setup("masking", crypto_seed=11)
    run_federated("fbo-fedgp", setup, _settings("fbo-fedgp"), checkpoint=tmp_path)
    _, states = load_checkpoint(tmp_path)
    client_X = {n: s["state"]["X"] for n, s in states.items() if n != "server"}
    assert all(len(X) > 0 for X in client_X.values())

    def tensors(obj):
        if isinstance(obj, torch.Tensor):
            yield obj
        elif isinstance(obj, dict):
            for v in obj.values():
                yield from tensors(v)
        elif isinstance(obj, list | tuple):
            for v in obj:
                yield from tensors(v)

    def holds(state, X, own=None) -> bool:
        rows = {tuple(r) for r in X.tolist()}
        if own is not None:
            rows -= {tuple(r) for r in own.tolist()}
        for t in tensors(state):
            if t.is_floating_point() and t.ndim == 2 and t.shape[-1] == X.shape[-1]:
                if rows & {tuple(r) for r in t.tolist()}:
                    return True
        return False

    for name, X in client_X.items():
        assert holds(states[name], X)  # positive control
        assert not holds(states["server"], X), name
        for other in client_X:
            if other != name:
                assert not holds(states[other], X, own=client_X[other]), (other, name)


def test_base_settings_default(tmp_path):
    r"""``settings=None`` checkpoints and resumes with the algorithm's defaults."""
    s = BOSettings(num_rounds=2, num_init=2, raw_samples=16, num_restarts=2, maxiter=10)
    run_federated("random", _setup(), s, checkpoint=tmp_path)
    with pytest.raises(CheckpointError, match="num_init"):
        run_federated("random", _setup(), None, resume=tmp_path)


@pytest.mark.parametrize("algorithm", ["local", "fbo-fedgp"])
def test_resume_after_failed_evaluations(tmp_path, algorithm):
    r"""Failed evaluations leave a client's local GP cached across rounds; the resumed
    run must hold the same model (and fitter count) as the uninterrupted one."""

    def flaky(X):
        y = torch.sin(3 * X).sum(-1)
        return torch.where(X[:, 0] > 0.45, torch.nan, y)

    def setup():
        obj = CallableObjective(flaky, bounds=[[0.0, 0.0], [1.0, 1.0]], name="flaky")
        return FederationSetup(objectives=[obj] * 3, seed=4, crypto_seed=0)

    settings = lambda: _settings(algorithm, num_rounds=5, local_refit_every=3)  # noqa: E731
    full = run_federated(algorithm, setup(), settings())
    assert full.failures  # the case this test is about
    with pytest.raises(Killed):
        run_federated(algorithm, setup(), settings(), checkpoint=tmp_path, on_round=kill_after(2))
    resumed = run_federated(algorithm, setup(), settings(), resume=tmp_path)
    assert comparable(resumed) == comparable(full)


# --- short noiseless runs: resume from round 0, the folder, the manifest -----------------
NUM_CLIENTS, NUM_INIT, SHORT_ROUNDS = 3, 3, 3


def _noiseless_setup(seed: int = 2, **kwargs) -> FederationSetup:
    return FederationSetup(problem="branin", num_clients=NUM_CLIENTS, seed=seed, **kwargs)


def _short_settings(algorithm: str, **kwargs):
    small = dict(
        num_init=NUM_INIT, num_rounds=SHORT_ROUNDS, num_restarts=2, raw_samples=16, maxiter=15
    )
    small.update(kwargs)
    if algorithm == "fbo-fedgp":
        return FBOFedGPSettings(support_size=5, support_every=2, schedule=1.0, **small)
    return BOSettings(**small)


def _rewrite_party(folder, name, state, manifest) -> None:
    r"""Replace party ``name``'s file and fix its digest (a consistent but altered
    checkpoint)."""
    _rewrite(folder, manifest["files"][name], state, manifest)


@pytest.mark.parametrize("algorithm", ["local", "fbo-fedgp"])
def test_resume_from_the_round_0_checkpoint_is_bit_for_bit(tmp_path, algorithm):
    # private randomness seeded: FBO-FedGP's default noises its centres from it
    setup = _noiseless_setup(crypto_seed=5)
    full = run_federated(algorithm, setup, _short_settings(algorithm))
    with pytest.raises(Killed):
        run_federated(
            algorithm,
            setup,
            _short_settings(algorithm),
            checkpoint=tmp_path,
            on_round=kill_after(0),
        )
    assert load_checkpoint(tmp_path)[0]["round"] == 0
    resumed = run_federated(algorithm, setup, _short_settings(algorithm), resume=tmp_path)
    assert resumed.steps["init"] == NUM_CLIENTS * NUM_INIT  # no initial design twice
    assert len(resumed.best_per_round) == SHORT_ROUNDS + 1
    assert comparable(resumed) == comparable(full)


# --- the checkpoint folder: another run's, a file, a planted link, permissions ------------
@pytest.mark.parametrize("how", ["fresh", "resume-into-another-folder"])
def test_a_run_refuses_to_overwrite_another_checkpoint(tmp_path, how):
    precious, other = tmp_path / "precious", tmp_path / "other"
    run_federated("local", _noiseless_setup(seed=5), _short_settings("local"), checkpoint=precious)
    before = {p.name: p.read_bytes() for p in precious.iterdir()}
    with pytest.raises(CheckpointError, match="precious"):
        if how == "fresh":
            run_federated(
                "local", _noiseless_setup(seed=6), _short_settings("local"), checkpoint=precious
            )
        else:
            with pytest.raises(Killed):
                run_federated(
                    "local",
                    _noiseless_setup(seed=6),
                    _short_settings("local"),
                    checkpoint=other,
                    on_round=kill_after(1),
                )
            run_federated(
                "local",
                _noiseless_setup(seed=6),
                _short_settings("local"),
                resume=other,
                checkpoint=precious,
            )
    assert {p.name: p.read_bytes() for p in precious.iterdir()} == before


def test_a_crash_while_saving_into_a_used_folder_keeps_its_checkpoint(tmp_path, monkeypatch):
    with pytest.raises(Killed):  # run A stopped after its initial designs
        run_federated(
            "local",
            _noiseless_setup(seed=5),
            _short_settings("local"),
            checkpoint=tmp_path,
            on_round=kill_after(0),
        )
    real = ckpt.write_atomically

    def crash_at_the_manifest(path, data):
        if path.name == MANIFEST:
            raise Killed  # run B dies after writing its party files
        real(path, data)

    monkeypatch.setattr(ckpt, "write_atomically", crash_at_the_manifest)
    with pytest.raises((Killed, CheckpointError)):  # refused up front is fine too
        run_federated(
            "local", _noiseless_setup(seed=6), _short_settings("local"), checkpoint=tmp_path
        )
    monkeypatch.setattr(ckpt, "write_atomically", real)
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
        run_federated("local", setup, _short_settings("local"), checkpoint=path)
    assert calls == []
    assert path.read_text() == "not a folder"


@pytest.fixture
def umask_022():
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


def _tiny_run(folder):
    setup = FederationSetup(problem="cec2005-f1", dim=2, num_clients=3, seed=0)
    return run_federated(
        "local", setup, BOSettings(num_init=3, num_rounds=1, raw_samples=16), checkpoint=folder
    )


def test_planted_symlink_does_not_redirect_the_manifest_write(tmp_path, umask_022):
    victim = tmp_path / "precious.txt"
    victim.write_text("precious user data\n")
    folder = tmp_path / "shared"
    folder.mkdir()
    os.symlink(victim, folder / "checkpoint.json.tmp")  # planted by someone else
    try:
        _tiny_run(folder)
    except (CheckpointError, OSError):
        pass  # refusing the folder is fine too
    assert victim.read_text() == "precious user data\n"


def test_checkpoint_files_are_private(tmp_path, umask_022):
    folder = tmp_path / "ck"
    _tiny_run(folder)
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in folder.iterdir()}
    assert all(mode & 0o077 == 0 for name, mode in modes.items() if name.endswith(".pt")), modes


# --- manifests and states that do not fit the run ---------------------------------------
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
            "local",
            _noiseless_setup(),
            _short_settings("local"),
            checkpoint=tmp_path,
            on_round=kill_after(2),
        )
    manifest = json.loads((tmp_path / MANIFEST).read_text())
    for key, value in edit.items():
        if value is None:
            manifest.pop(key)
        else:
            manifest[key] = value
    (tmp_path / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(CheckpointError):
        run_federated("local", _noiseless_setup(), _short_settings("local"), resume=tmp_path)


def test_a_manifest_round_that_disagrees_with_the_files_is_refused(tmp_path):
    with pytest.raises(Killed):
        run_federated(
            "local",
            _noiseless_setup(),
            _short_settings("local"),
            checkpoint=tmp_path,
            on_round=kill_after(2),
        )
    manifest = json.loads((tmp_path / MANIFEST).read_text())
    manifest["round"] = 1
    manifest["best_per_round"] = manifest["best_per_round"][:2]
    (tmp_path / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(CheckpointError, match="round"):
        run_federated("local", _noiseless_setup(), _short_settings("local"), resume=tmp_path)


def test_a_partial_local_gp_state_is_refused(tmp_path):
    with pytest.raises(Killed):
        run_federated(
            "local",
            _noiseless_setup(),
            _short_settings("local", local_refit_every=3),
            checkpoint=tmp_path,
            on_round=kill_after(1),
        )
    manifest, states = load_checkpoint(tmp_path)
    state = states["client-0"]
    assert state["state"]["local_fitter"]["state"]  # there is a fitted state to lose
    state["state"]["local_fitter"]["state"] = {}
    _rewrite_party(tmp_path, "client-0", state, manifest)
    with pytest.raises(CheckpointError, match="Client 0"):
        run_federated(
            "local",
            _noiseless_setup(),
            _short_settings("local", local_refit_every=3),
            resume=tmp_path,
        )


def test_nested_manifest_is_a_checkpoint_error(tmp_path):
    (tmp_path / "checkpoint.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(CheckpointError):
        load_checkpoint(tmp_path)


def test_malicious_support_does_not_deny_resume(tmp_path, monkeypatch):
    setup = FederationSetup(problem="cec2005-f1", dim=2, num_clients=3, seed=0)

    def cfg(rounds):
        return FBOFedGPSettings(num_init=4, num_rounds=rounds, raw_samples=16, support_size=4)

    honest = FBOFedGPServer.run_round

    def malicious(self, t):
        honest(self, t)
        self.broadcast("support", {"support": np.zeros(6)})  # a 1-D "support", last message

    monkeypatch.setattr(FBOFedGPServer, "run_round", malicious)
    try:
        run_federated("fbo-fedgp", setup, cfg(1), checkpoint=tmp_path / "ck")
    except (ProtocolViolation, ValueError):
        return  # refused on receipt: fine too
    monkeypatch.setattr(FBOFedGPServer, "run_round", honest)
    run_federated("fbo-fedgp", setup, cfg(2), resume=tmp_path / "ck")


@pytest.mark.parametrize("case", ["function-not-wrapped", "settings-of-wrong-type"])
def test_checkpointing_keeps_the_clear_errors(tmp_path, case):
    if case == "function-not-wrapped":
        setup = FederationSetup(objectives=[lambda X: X.sum(-1)] * 2)
        settings, match = _short_settings("local"), "CallableObjective"
    else:
        setup, settings, match = _noiseless_setup(), {"num_rounds": 2}, "BOSettings"
    with pytest.raises(ValueError, match=match):  # the control: no checkpoint
        run_federated("local", setup, settings)
    with pytest.raises(ValueError, match=match):
        run_federated("local", setup, settings, checkpoint=tmp_path)


def test_a_restored_standardisation_keeps_float64():
    # the next round's one-pass moments are centred at its mean: a float32 copy would
    # centre them elsewhere than the run that was not interrupted
    from botorch_fed.protocol.runner import build_federation

    setup = _setup_for("fbo-fedgp", "plaintext")
    server, clients, _ = build_federation("fbo-fedgp", setup, _settings("fbo-fedgp", num_rounds=1))
    server.run()
    _, fresh, _ = build_federation("fbo-fedgp", setup, _settings("fbo-fedgp", num_rounds=1))
    for cid, client in clients.items():
        fresh[cid].load_state_dict(client.state_dict())
        got, want = fresh[cid].standardize, client.standardize
        assert got.means.dtype == got.stdvs.dtype == torch.float64
        assert torch.equal(got.means, want.means) and torch.equal(got.stdvs, want.stdvs)
