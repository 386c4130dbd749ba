r"""Attacks on what issue 9 added, found by a security review and fixed since (each test
failed before its fix). What the attacks were:

- Failed evaluations: ``BOClient.avoid_failures`` redraws a candidate that lies near
  a failed point from the client's own generator -- the same generator that draws the
  client's public local/global coin, and it is seeded from the run's public seed. The
  extra draw shifts every later coin, so the coin sequence reveals that a redraw
  happened: a malicious server that steers one client's global candidate onto a point
  ``P`` learns whether that client has a failed point within ``MIN_DISTANCE`` of ``P``
  (which client failed, and where), and even an honest-but-curious server under
  ``masking`` sees which client's coins left the sequence its public seed predicts.
- Checkpoints: the manifest's temporary name is predictable and opened following
  symlinks (a file planted in a shared folder makes the run overwrite any file the
  user can write); party files holding private data and secret keys are created
  world-readable under the usual umask; a server can make a client checkpoint a
  state that the loader then refuses (no validation of ``support`` on receipt); a
  deeply nested manifest escapes as ``RecursionError`` instead of ``CheckpointError``.
- CLI: the config file's folder (and the current directory) stay in front of
  ``sys.path`` for the whole run, so a module planted next to a config file that names
  only a built-in problem shadows a library the run imports lazily (``sympy``).
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys

import numpy as np
import pytest
import torch

from botorch_fed.acquisition import MixingSchedule
from botorch_fed.acquisition._rng import uniform_draws
from botorch_fed.federation import (
    BOSettings,
    CallableObjective,
    FBOFedGPConfig,
    FederationSetup,
    ProtocolViolation,
    build_federation,
    run_federated,
)
from botorch_fed.federation.checkpoint import CheckpointError, load_checkpoint
from botorch_fed.federation.fbo_fedgp import FBOFedGPServer, global_modules
from botorch_fed.federation.messages import Message
from botorch_fed.federation.problem import initial_design
from botorch_fed.models import SparseSummary, compute_local_summary

pytestmark = pytest.mark.usefixtures("quiet_single_thread")

SEED, M, DIM, NUM_INIT = 5, 3, 2, 4
UNIT = [[0.0, 0.0], [1.0, 1.0]]


def _client_seed(cid: int) -> int:
    return SEED * 1_000 + 101 * cid + 1  # public: derived from the run's seed


class TransientFailure:
    r"""Fails on its ``fail_call``-th call (-1: never); a bowl elsewhere."""

    def __init__(self, fail_call: int):
        self.calls, self.fail_call = 0, fail_call

    def __call__(self, Z):
        self.calls += 1
        if self.calls == self.fail_call:
            raise RuntimeError("transient failure")
        return ((Z - 0.3) ** 2).sum(-1)


def _steered_probe(failing_client: int, victim: int) -> bool:
    r"""A plaintext server steers ``victim``'s global candidate onto the victim's second
    initial point ``P`` (public: Sobol from the public seed) with a forged summary sum
    (one fake observation at ``P``, ``P`` the only support point), then picks the round
    ``t`` of a ``round`` message so that ``p_t`` separates the victim's next uniform
    draw with and without a redraw; returns the victim's coin ("global")."""
    objs = [
        CallableObjective(TransientFailure(2 if i == failing_client else -1), UNIT)
        for i in range(M)
    ]
    setup = FederationSetup(objectives=objs, seed=SEED, aggregator="plaintext", crypto_seed=0)
    cfg = FBOFedGPConfig(num_init=NUM_INIT, num_rounds=3, raw_samples=64, num_restarts=4)
    server, _, _ = build_federation("fbo-fedgp", setup, cfg)
    P = initial_design(NUM_INIT, DIM, _client_seed(victim), None)[1:2]
    server.initialize()
    server.support = P
    server.broadcast("support", {"support": P.numpy()})
    modules = global_modules(DIM)  # the clients' modules: defaults, never refreshed
    server.standardize_outcomes()
    fake = compute_local_summary(
        P, torch.tensor([[10.0]], dtype=torch.float64), P, *modules
    ).to_numpy()
    honest_broadcast = server.broadcast

    def forged(type, payload=None, clients=None):
        return honest_broadcast(
            type, {"sum": fake} if type == "secagg_result" else payload, clients
        )

    server.broadcast = forged
    server.secure_sum("summary", SparseSummary.packed_length(1))
    server.broadcast = honest_broadcast
    server.send({victim: Message("global_step", {"t": 1, "rank": 0, "count": 1})})
    schedule = MixingSchedule(c=0.5)
    clean = torch.Generator().manual_seed(_client_seed(victim))
    redrawn = torch.Generator().manual_seed(_client_seed(victim))
    torch.rand(1, DIM, generator=redrawn, dtype=torch.float64)
    lo, hi = sorted([float(uniform_draws(1, clean)[0]), float(uniform_draws(1, redrawn)[0])])
    t = next(t for t in range(1, 10**6) if lo < schedule.prob_local(t) <= hi)
    return bool(server.send({victim: Message("round", {"t": t})})[victim].payload["global"])


def test_malicious_server_cannot_locate_a_failed_point():
    # world A: client 0's evaluation at its 2nd initial point failed; world B: client 1's.
    # The attack needs the victim to take a global step it did not draw (to land it on
    # the probed point): a client refuses that, in either world.
    for world in (0, 1):
        for victim in (0, 1):
            with pytest.raises(ProtocolViolation, match="drew no global step"):
                _steered_probe(world, victim)


def _coins(fail_near_optimum: bool) -> list[list[bool]]:
    def bowl(Z):
        return ((Z - 0.3) ** 2).sum(-1)

    def flaky(Z):
        if ((Z - 0.3) ** 2).sum() < 0.01:
            raise RuntimeError("solver crash")
        return bowl(Z)

    objs = [
        CallableObjective(flaky if (i == 1 and fail_near_optimum) else bowl, UNIT) for i in range(M)
    ]
    setup = FederationSetup(objectives=objs, seed=SEED, aggregator="masking", crypto_seed=0)
    coins: list[list[bool]] = [[] for _ in range(M)]

    def on_receive(cid, reply):
        if reply.type == "round":
            coins[cid].append(bool(reply.payload["global"]))

    server, clients, _ = build_federation(
        "fbo-fedgp",
        setup,
        FBOFedGPConfig(num_init=NUM_INIT, num_rounds=10, raw_samples=32),
        on_receive=on_receive,
    )
    server.run()
    if fail_near_optimum:  # the scenario is as intended: client 1's evaluations failed
        assert len(clients[1].failures) >= 1
    return coins


def test_coins_do_not_depend_on_failures_passive_server():
    # client 1's black box crashes near the optimum; the coins the server sees must be
    # those of the run in which nothing fails (they are draws of the client's seed only)
    assert _coins(True) == _coins(False)


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


def test_malicious_support_does_not_deny_resume(tmp_path, monkeypatch):
    setup = FederationSetup(problem="cec2005-f1", dim=2, num_clients=3, seed=0)

    def cfg(rounds):
        return FBOFedGPConfig(num_init=4, num_rounds=rounds, raw_samples=16, support_size=4)

    honest = FBOFedGPServer.run_round

    def malicious(self, t):
        honest(self, t)
        self.broadcast("support", {"support": np.zeros(6)})  # a 1-D "support", last message

    monkeypatch.setattr(FBOFedGPServer, "run_round", malicious)
    try:
        run_federated("fbo-fedgp", setup, cfg(1), checkpoint=tmp_path / "ck")
    except (ProtocolViolation, ValueError):
        return  # refused on receipt: what a fix may do
    monkeypatch.setattr(FBOFedGPServer, "run_round", honest)
    run_federated("fbo-fedgp", setup, cfg(2), resume=tmp_path / "ck")


def test_nested_manifest_is_a_checkpoint_error(tmp_path):
    (tmp_path / "checkpoint.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(CheckpointError):
        load_checkpoint(tmp_path)


def test_config_folder_does_not_shadow_libraries(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "exp.toml").write_text('problem = "cec2005-f1"\n')  # names no user code
    marker = tmp_path / "PLANTED_CODE_RAN"
    (shared / "sympy.py").write_text(
        f"import pathlib\npathlib.Path({str(marker)!r}).write_text('ran')\n"
        "raise ImportError('planted')\n"
    )
    cwd = tmp_path / "clean"
    cwd.mkdir()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    subprocess.run(
        [sys.executable, "-m", "botorch_fed.cli", "run", "fbo-fedgp", "--config",
         str(shared / "exp.toml"), "--rounds", "1", "--clients", "3", "--dim", "2"],
        cwd=cwd, env=env, capture_output=True, timeout=300, check=False,
    )  # fmt: skip
    assert not marker.exists()
