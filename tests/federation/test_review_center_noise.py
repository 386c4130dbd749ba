r"""Review of FBO-FedGP's ``center_noise`` (c7fc3b9, 92d823f, ceed31a, 1196205).

Passing tests record what held; ``xfail(strict=True)`` tests are defects that fail today
and pass once fixed."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from botorch_fed.federation import FBOFedGPConfig, FederationSetup, build_federation, run_federated
from botorch_fed.federation.checkpoint import load_checkpoint
from botorch_fed.inducing import local_centers
from tests.helpers.federation_runs import Killed, comparable, kill_after

pytestmark = pytest.mark.usefixtures("quiet_single_thread")
ROOT = Path(__file__).resolve().parents[2]


# the parties' private randomness from the OS, as in a deployment
OS = {"private_randomness": "os"}


def _setup(**kw) -> FederationSetup:
    base = dict(problem="branin", dim=2, num_clients=2, seed=0, crypto_seed=None)
    base.update(kw)
    return FederationSetup(**base)


def _config(**kw) -> FBOFedGPConfig:
    base = dict(num_init=6, num_rounds=2, support_size=4, raw_samples=16, maxiter=10,
                support_every=1)  # fmt: skip
    base.update(kw)
    return FBOFedGPConfig(**base)


# --- (2) settings ---------------------------------------------------------------------
@pytest.mark.parametrize("value", [-1e-9, math.nan, math.inf, True, False, "0.1"])
def test_bad_center_noise_is_refused_through_the_preset_too(value):
    for cfg in (FBOFedGPConfig(center_noise=value), FBOFedGPConfig.paper(center_noise=value)):
        with pytest.raises(ValueError, match="center_noise"):
            cfg.validate()


def test_preset_resolution_and_random_support():
    assert FBOFedGPConfig().resolved().center_noise == 0.1
    assert FBOFedGPConfig.paper().resolved().center_noise == 0.0
    assert FBOFedGPConfig(support="random").resolved().center_noise == 0.0
    with pytest.raises(ValueError, match="sends none"):
        FBOFedGPConfig(support="random", center_noise=0.1).validate()
    FBOFedGPConfig(support="random", center_noise=0.0).validate()


def test_numpy_scalar_center_noise_is_accepted():
    FBOFedGPConfig(support="clustered", center_noise=np.float32(0.1)).validate()
    FBOFedGPConfig(support="clustered", center_noise=np.int64(1)).validate()
    resolved = FBOFedGPConfig(center_noise=np.float32(0.25)).resolved()
    assert type(resolved.center_noise) is float and resolved.center_noise == 0.25


# --- (1) private randomness: resume, re-selection ---------------------------------------
def test_resume_under_os_randomness_continues_the_saved_private_generator(tmp_path):
    # crypto_seed=None: the private generator is seeded from the OS, so two resumes of
    # the same checkpoint only agree if its state is restored (not re-seeded), and the
    # resumed noise is not a replay the server could average against a fresh draw
    a, b = tmp_path / "a", tmp_path / "b"
    with pytest.raises(Killed):
        run_federated(
            "fbo-fedgp", _setup(), _config(), checkpoint=a, on_round=kill_after(1), **OS
        )
    shutil.copytree(a, b)
    ra = run_federated("fbo-fedgp", _setup(), _config(), resume=a, **OS)
    rb = run_federated("fbo-fedgp", _setup(), _config(), resume=b, **OS)
    assert comparable(ra) == comparable(rb)
    settings = load_checkpoint(a)[0]["settings"]  # resolved settings round trip
    assert (settings["support"], settings["center_noise"]) == ("clustered", 0.1)


def test_each_selection_draws_fresh_private_noise_so_repeats_average_out():
    # documented residual (docs/security.md): a cluster sent in r selections can be
    # averaged; asked again about the same data, a client repeats its answer
    server, clients, _ = build_federation("fbo-fedgp", _setup(crypto_seed=3), _config())
    client = clients[0]
    client.X = torch.rand(8, 2, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    exact = local_centers(client.X, k=2, seed=client.seed,
                          min_cluster_size=client.config.min_cluster_size).numpy()  # fmt: skip
    same = [client.on_centers({"k": 2})["centers"] for _ in range(3)]
    assert all(np.array_equal(d, same[0]) for d in same)  # no fresh noise for the same data

    def selection():
        client._centers = None  # a selection after the data grew (kept equal here)
        return client.on_centers({"k": 2})["centers"]

    draws = np.stack([selection() for _ in range(400)])
    assert not np.allclose(draws[0], draws[1])  # fresh noise every selection
    inner = (exact > 0.3) & (exact < 0.7)  # away from the clamp
    err = np.abs(draws.mean(0) - exact)[inner]
    assert err.max() < 0.1 / math.sqrt(400) * 4  # the average recovers the centre
    # the noise seed is not the public client seed
    public = local_centers(client.X, k=2, seed=client.seed, noise_std=0.1,
                           min_cluster_size=2).clamp(0, 1).numpy()  # fmt: skip
    assert not any(np.allclose(d, public) for d in draws)


# --- (3) the benchmark's statistics -------------------------------------------------------
def test_benchmark_rule_pairs_and_direction_recomputed_from_the_runs():
    from scipy.stats import wilcoxon

    runs = {}
    path = ROOT / "benchmarks/results/fbo_fedgp_support_privacy_runs.jsonl"
    for line in path.read_text().splitlines():
        r = json.loads(line)
        runs[r["key"]] = r
    arms = ("clustered", "noise0.05", "noise0.1", "random")
    problems = ("branin2", "levy4", "ackley5", "hartmann6")
    p = {}
    for arm in arms[1:]:
        d = []
        for pr in problems:
            for s in range(8):
                ra, rb = (
                    runs[f"default/{pr}/seed{s}/{arm}"],
                    runs[f"default/{pr}/seed{s}/clustered"],
                )
                # paired: same seed, same public setup, same initial designs
                assert ra["settings"]["setup"] == rb["settings"]["setup"]
                assert ra["regret_per_round"][0] == rb["regret_per_round"][0]
                d.append(
                    math.log10(max(ra["regret"], 1e-12)) - math.log10(max(rb["regret"], 1e-12))
                )
        d = np.array(d)
        p[arm] = wilcoxon(d, alternative="greater").pvalue  # H1: arm's regret higher
        assert wilcoxon(d, alternative="less").pvalue > 0.5  # direction: not better
        noise = runs[f"default/branin2/seed0/{arm}"]["settings"]["settings"]["center_noise"]
        assert noise == {"noise0.05": 0.05, "noise0.1": 0.1, "random": 0.0}[arm]
    assert round(p["random"], 4) == 0.0162 and round(p["noise0.1"], 3) == 0.332
    assert round(p["noise0.05"], 3) == 0.362
    # the rule, least revealing first: random rejected, noise0.1 kept -> the default
    chosen = next(a for a in ("random", "noise0.1", "noise0.05") if p[a] >= 0.05)
    assert chosen == "noise0.1"
    assert FBOFedGPConfig().resolved().center_noise == 0.1


# --- (4) docs -------------------------------------------------------------------------
def test_docs_say_the_default_noise_only_matters_under_ckks():
    text = (ROOT / "docs/security.md").read_text()
    start = text.index('*default preset*: `support="clustered"`')
    bullet = text[start : text.index("*paper preset*", start)]
    assert "ckks" in bullet and ("plaintext" in bullet or "masking" in bullet)
