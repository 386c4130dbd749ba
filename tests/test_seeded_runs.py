r"""A simulation repeats from its seed: ``botorch-fed run`` (every party in one process)
derives each party's private randomness -- key material, masks, nonces, centre noise,
Laplace noise, failed-evaluation redraws -- from ``--seed``, so two runs with the same
options write the same JSON apart from timings. ``run_federated(private_randomness="os")``
draws it from the OS, as the parties of a deployment do (their side:
``tests/flower/test_policy.py``)."""

from __future__ import annotations

import json
import re

import pytest
import torch

from botorch_fed.algorithms import run_federated
from botorch_fed.algorithms.ldp_bo import LDPBOSettings
from botorch_fed.cli import main
from botorch_fed.problems.objectives import CallableObjective
from botorch_fed.protocol import BOSettings, FederationSetup
from botorch_fed.secure import available_backends

TIMING_KEYS = ("time_s", "stage_s", "stage_party_s", "wall_s")

# one cheap run per kind of private randomness (FedZero: its seeded directions)
RUNS = {
    "fbo-fedgp-masking-center-noise": [
        "fbo-fedgp", "--aggregator", "masking", "--center-noise", "0.05",
        "--support-selection", "clustered",
    ],
    "fbo-fedgp-ckks": ["fbo-fedgp", "--aggregator", "ckks"],
    "ldp-tgp": ["ldp-tgp", "--problem", "ldp-synthetic", "--num-rounds", "6"],
    "fedzero": ["fedzero", "--eta", "0.05", "--h", "0.05"],
}  # fmt: skip
COMMON = ["--clients", "3", "--seed", "3", "--num-rounds", "2"]
BO = ["--problem", "branin", "--num-init", "3", "--num-restarts", "2", "--raw-samples", "16"]


def without_timings(value):
    r"""A result's JSON without the fields that measure time (and library versions)."""
    if isinstance(value, dict):
        return {
            k: without_timings(v)
            for k, v in value.items()
            if k not in TIMING_KEYS and k != "versions"
        }
    if isinstance(value, list):
        return [without_timings(v) for v in value]
    return value


def _argv(name: str) -> list[str]:
    argv = [*RUNS[name][:1], *COMMON, *RUNS[name][1:]]
    if "--problem" not in argv:
        argv += BO if name.startswith("fbo") else ["--problem", "branin"]
    return argv


@pytest.mark.parametrize("name", list(RUNS))
def test_two_runs_with_the_same_options_write_the_same_json(name, tmp_path):
    if name.endswith("ckks") and "ckks" not in available_backends():
        pytest.skip("TenSEAL is not installed")
    results = []
    for i in range(2):
        out = tmp_path / f"{i}.json"
        assert main(["run", *_argv(name), "--out", str(out)]) == 0
        results.append(json.loads(out.read_text()))
    assert results[0]["config"]["private_randomness"] == "seed"
    assert without_timings(results[0]) == without_timings(results[1])
    # the timings are what was left out
    assert results[0]["time_s"] != results[1]["time_s"]


def _rewards(setup, settings, **kwargs) -> tuple[dict, list[float]]:
    r"""An LDP-TGP-UCB run's JSON and the privatised rewards its server received (each a
    draw of the users' Laplace noise, so two noise streams never give the same list)."""
    rewards = []

    def on_receive(cid, reply):
        rewards.append(float(reply.payload["y"]))

    result = run_federated("ldp-tgp", setup, settings, on_receive=on_receive, **kwargs)
    return result.to_dict(), rewards


def test_os_randomness_does_not_repeat_and_is_recorded():
    setup = FederationSetup(problem="ldp-synthetic", num_clients=3, seed=3)
    settings = LDPBOSettings(num_rounds=6)
    seeded = [_rewards(setup, settings) for _ in range(2)]
    assert without_timings(seeded[0][0]) == without_timings(seeded[1][0])
    assert seeded[0][1] == seeded[1][1]
    fresh = [_rewards(setup, settings, private_randomness="os") for _ in range(2)]
    assert fresh[0][0]["config"]["private_randomness"] == "os"
    assert fresh[0][1] != fresh[1][1] and fresh[0][1] != seeded[0][1]
    with pytest.raises(ValueError, match="`private_randomness`='urandom' must be one of"):
        run_federated("ldp-tgp", setup, settings, private_randomness="urandom")


def test_a_crypto_seed_replaces_the_seed_derived_randomness():
    setup = FederationSetup(problem="ldp-synthetic", num_clients=3, seed=3)
    settings = LDPBOSettings(num_rounds=6)
    _, derived = _rewards(setup, settings)
    setup.crypto_seed = 11
    given, rewards = _rewards(setup, settings)
    assert given["config"]["private_randomness"] == "crypto_seed"
    assert rewards != derived
    assert _rewards(setup, settings)[1] == rewards


def _failing_first(n: int):
    r"""A black box whose first ``n`` evaluations fail (a fresh one per run)."""
    calls = []

    def fn(X):
        calls.append(X)
        if len(calls) <= n:
            raise OSError("licence server unreachable")
        return (X - 0.3).pow(2).sum(-1)

    return fn


def _redrawn_points(**kwargs) -> list[list[float]]:
    r"""The points client 0 evaluates after its whole initial design failed: drawn
    uniformly from its private generator while it holds no data."""
    objectives = [CallableObjective(_failing_first(3), [[0.0, 0.0], [1.0, 1.0]])] + [
        CallableObjective(_failing_first(0), [[0.0, 0.0], [1.0, 1.0]]) for _ in range(2)
    ]
    setup = FederationSetup(objectives=objectives, seed=3)
    settings = BOSettings(num_init=3, num_rounds=2, num_restarts=2, raw_samples=16)
    result = run_federated("local", setup, settings, **kwargs)
    return [e["x"] for e in result.evaluations if e["client"] == 0 and e["round"] > 0]


def test_failed_evaluation_redraws_repeat_from_the_seed():
    seeded = _redrawn_points()
    assert len(seeded) == 2 and seeded == _redrawn_points()
    assert _redrawn_points(private_randomness="os") != seeded


@pytest.mark.parametrize("threads", [1, 3])
def test_a_run_takes_the_setups_thread_count_and_restores_the_callers(threads):
    seen = []

    def f(X):
        seen.append(torch.get_num_threads())
        return X.sum(-1)

    from botorch_fed.problems.objectives import CallableObjective

    before = torch.get_num_threads()
    caller = 2 if before != 2 else 4
    torch.set_num_threads(caller)
    try:
        objective = CallableObjective(f, bounds=[[0.0, 0.0], [1.0, 1.0]])
        setup = FederationSetup(objectives=objective, num_clients=2, threads=threads)
        run_federated("random", setup)
        assert set(seen) == {threads}
        assert torch.get_num_threads() == caller
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("threads", [0, -1, 1.5, True, "2"])
def test_a_bad_thread_count_is_refused(threads):
    setup = FederationSetup(problem="branin", num_clients=2, threads=threads)
    with pytest.raises(ValueError, match=re.escape(f"`threads`={threads!r} must be")):
        run_federated("random", setup)
