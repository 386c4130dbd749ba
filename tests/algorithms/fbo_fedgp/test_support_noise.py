r"""FBO-FedGP's support selection: ``center_noise`` (validation, the noise the server
receives, its private seed, which a resume continues and which every selection draws
afresh) and the preset's choice of ``support``, with the benchmark statistics behind the
default and what docs/security.md says about it."""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from botorch_fed.algorithms import FBOFedGPSettings, build_federation, run_federated
from botorch_fed.algorithms.fbo_fedgp.settings import PRESET_VALUES
from botorch_fed.inducing import local_centers
from botorch_fed.protocol import FederationSetup, Message
from botorch_fed.protocol.checkpoint import load_checkpoint
from tests.helpers.federation_runs import Killed, comparable, kill_after

pytestmark = pytest.mark.usefixtures("quiet_single_thread")
ROOT = Path(__file__).resolve().parents[3]


def _setup(**kwargs) -> FederationSetup:
    base = dict(problem="branin", dim=2, num_clients=3, seed=0, crypto_seed=0)
    base.update(kwargs)
    return FederationSetup(**base)


def _config(**kwargs) -> FBOFedGPSettings:
    base = dict(num_init=6, num_rounds=1, support_size=6, raw_samples=16, maxiter=20)
    base.update(kwargs)
    return FBOFedGPSettings(**base)


# the parties' private randomness from the OS, as in a deployment
OS = {"private_randomness": "os"}


# two clients, no crypto_seed (with OS below: a deployment's private randomness) and a
# support re-selected every round
def _os_setup(**kw) -> FederationSetup:
    base = dict(problem="branin", dim=2, num_clients=2, seed=0, crypto_seed=None)
    base.update(kw)
    return FederationSetup(**base)


def _reselect_config(**kw) -> FBOFedGPSettings:
    base = dict(num_init=6, num_rounds=2, support_size=4, raw_samples=16, maxiter=10,
                support_every=1)  # fmt: skip
    base.update(kw)
    return FBOFedGPSettings(**base)


# --- validation -------------------------------------------------------------------------
@pytest.mark.parametrize("value", [-0.1, -1e-300, math.nan, math.inf, -math.inf, True, "0.1"])
def test_center_noise_must_be_a_finite_non_negative_number(value):
    with pytest.raises(ValueError, match=r"`center_noise`=\S+ must be"):
        FBOFedGPSettings(support="clustered", center_noise=value).validate()
    with pytest.raises(ValueError, match=r"`center_noise`"):  # through the preset too
        FBOFedGPSettings(center_noise=value).validate()


def test_center_noise_needs_the_clustered_support():
    with pytest.raises(ValueError, match=r"`center_noise`=0.1 .* `support`='random' sends none"):
        FBOFedGPSettings(support="random", center_noise=0.1).validate()
    for value in (0, 0.0, 0.05, 1, 2.5):  # any finite value >= 0 with clustered centres
        FBOFedGPSettings(support="clustered", center_noise=value).validate()
        FBOFedGPSettings.paper(center_noise=value).validate()
    FBOFedGPSettings(support="random", center_noise=0.0).validate()


@pytest.mark.parametrize("value", [-1e-9, math.nan, math.inf, True, False, "0.1"])
def test_bad_center_noise_is_refused_through_the_preset_too(value):
    for cfg in (FBOFedGPSettings(center_noise=value), FBOFedGPSettings.paper(center_noise=value)):
        with pytest.raises(ValueError, match="center_noise"):
            cfg.validate()


def test_preset_resolution_and_random_support():
    assert FBOFedGPSettings().resolved().center_noise == 0.1
    assert FBOFedGPSettings.paper().resolved().center_noise == 0.0
    assert FBOFedGPSettings(support="random").resolved().center_noise == 0.0
    with pytest.raises(ValueError, match="sends none"):
        FBOFedGPSettings(support="random", center_noise=0.1).validate()
    FBOFedGPSettings(support="random", center_noise=0.0).validate()


def test_numpy_scalar_center_noise_is_accepted():
    FBOFedGPSettings(support="clustered", center_noise=np.float32(0.1)).validate()
    FBOFedGPSettings(support="clustered", center_noise=np.int64(1)).validate()
    resolved = FBOFedGPSettings(center_noise=np.float32(0.25)).resolved()
    assert type(resolved.center_noise) is float and resolved.center_noise == 0.25


# --- presets ----------------------------------------------------------------------------
def test_the_paper_preset_keeps_exact_clustered_centres():
    paper = FBOFedGPSettings.paper().resolved()
    assert (paper.support, paper.center_noise) == ("clustered", 0.0)  # Alg. 1 as published
    assert PRESET_VALUES["paper"]["support"] == "clustered"
    assert PRESET_VALUES["paper"]["center_noise"] == 0.0


def test_the_default_preset_hides_the_centres():
    # benchmarks/results/fbo_fedgp_support_privacy.md: the measured choice
    default = FBOFedGPSettings().resolved()
    assert (default.support, default.center_noise) == (
        PRESET_VALUES["default"]["support"],
        PRESET_VALUES["default"]["center_noise"],
    )
    assert default.support == "random" or default.center_noise > 0  # no exact centres


def test_support_and_center_noise_resolve_from_the_preset_unless_given():
    default = PRESET_VALUES["default"]
    # the fields stay None: replace() re-resolves under another preset
    cfg = FBOFedGPSettings()
    assert (cfg.support, cfg.center_noise) == (None, None)
    paper = dataclasses.replace(cfg, preset="paper").resolved()
    assert (paper.support, paper.center_noise) == ("clustered", 0.0)
    # explicit values win over either preset
    for preset in ("default", "paper"):
        r = FBOFedGPSettings(preset=preset, support="random").resolved()
        assert (r.support, r.center_noise) == ("random", 0.0)  # no centres, no noise
        r = FBOFedGPSettings(preset=preset, support="clustered", center_noise=0.2).resolved()
        assert (r.support, r.center_noise) == ("clustered", 0.2)
        r = FBOFedGPSettings(preset=preset, center_noise=0.0, support="clustered").resolved()
        assert (r.support, r.center_noise) == ("clustered", 0.0)
    # a chosen clustered support takes the preset's noise for clustered centres
    r = FBOFedGPSettings(support="clustered").resolved()
    expected = default["center_noise"] if default["support"] == "clustered" else 0.0
    assert r.center_noise == expected
    assert FBOFedGPSettings.paper(support="clustered").resolved().center_noise == 0.0
    # resolved settings are complete and valid
    for cfg in (
        FBOFedGPSettings(),
        FBOFedGPSettings.paper(),
        FBOFedGPSettings(support="clustered"),
    ):
        r = cfg.resolved()
        assert r.support is not None and r.center_noise is not None
        r.validate()


def test_the_run_records_the_resolved_support_settings():
    # what a checkpoint's manifest and the results hold (runner._run_info)
    from botorch_fed.protocol.runner import _run_info

    info = _run_info("fbo-fedgp", _setup(), _config(support="clustered", center_noise=0.1))
    assert (info["settings"]["support"], info["settings"]["center_noise"]) == ("clustered", 0.1)
    info = _run_info("fbo-fedgp", _setup(), _config(preset="paper"))
    assert (info["settings"]["support"], info["settings"]["center_noise"]) == ("clustered", 0.0)


# --- the centres the server receives ------------------------------------------------------
def _received_centres(
    setup: FederationSetup, config: FBOFedGPSettings, private_randomness: str = "seed"
):
    r"""Run a federation; the centres the server received, by client, with the centres
    the client's data give without noise (recomputed from its inputs at that time)."""
    received: dict[int, np.ndarray] = {}
    exact: dict[int, np.ndarray] = {}
    server, clients, _ = build_federation(
        "fbo-fedgp",
        setup,
        config,
        on_receive=lambda cid, reply: (
            received.__setitem__(cid, np.asarray(reply.payload["centers"]).copy())
            if reply.type == "centers"
            else None
        ),
        private_randomness=private_randomness,
    )
    for cid, client in clients.items():
        original = client.on_centers

        def recording(message, original=original, client=client, cid=cid):
            exact[cid] = local_centers(
                client.X,
                k=message.k,
                seed=client.seed,
                min_cluster_size=client.config.min_cluster_size,
            ).numpy()
            return original(message)

        client.on_centers = recording
    server.run()
    return received, exact, server, clients


def test_noised_centres_differ_from_the_exact_ones_and_stay_in_the_cube():
    cfg = _config(support="clustered", center_noise=0.1)
    received, exact, server, clients = _received_centres(_setup(), cfg)
    assert sorted(received) == sorted(clients)
    for cid in clients:
        got, ref = received[cid], exact[cid]
        assert got.shape == ref.shape and len(got) >= 1
        assert ((got >= 0) & (got <= 1)).all()  # clamped: the server accepts them
        moved = np.abs(got - ref)
        assert (moved > 1e-6).mean() > 0.9  # noise on (nearly) every coordinate
        assert moved.max() < 1.0
    # the run went on: every client holds the server's support, inside the cube
    for c in clients.values():
        assert c.support is not None and ((c.support >= 0) & (c.support <= 1)).all()
    # without noise the server receives exactly the k-means centres
    received0, exact0, _, _ = _received_centres(
        _setup(), dataclasses.replace(cfg, center_noise=0.0)
    )
    for cid in received0:
        np.testing.assert_array_equal(received0[cid], exact0[cid])
        np.testing.assert_array_equal(exact0[cid], exact[cid])  # same data, same k-means


def test_a_large_noise_is_clamped_into_the_cube():
    received, _, _, clients = _received_centres(
        _setup(), _config(support="clustered", center_noise=5.0)
    )
    for got in received.values():
        assert ((got >= 0) & (got <= 1)).all()
        assert np.isin(got, [0.0, 1.0]).mean() > 0.5  # most coordinates were pushed out
    for c in clients.values():
        assert ((c.support >= 0) & (c.support <= 1)).all()


def test_the_noise_is_private_not_derived_from_the_public_seed():
    cfg = _config(support="clustered", center_noise=0.1)
    # the same public run seed (initial designs, client seeds, k-means) with two
    # different private seeds: the same exact centres, different noise
    a, exact_a, _, clients = _received_centres(_setup(crypto_seed=0), cfg)
    b, exact_b, _, _ = _received_centres(_setup(crypto_seed=1), cfg)
    for cid in a:
        np.testing.assert_array_equal(exact_a[cid], exact_b[cid])
        assert not np.allclose(a[cid], b[cid])
    # ... and with OS randomness (no crypto_seed, the deployed case) as well
    c, _, _, _ = _received_centres(_setup(crypto_seed=None), cfg, "os")
    d, _, _, _ = _received_centres(_setup(crypto_seed=None), cfg, "os")
    assert not all(np.allclose(c[cid], d[cid]) for cid in c)
    # a simulation (no crypto_seed) derives the noise from the run's seed: it repeats
    e, _, _, _ = _received_centres(_setup(crypto_seed=None), cfg)
    f, _, _, _ = _received_centres(_setup(crypto_seed=None), cfg)
    for cid in e:
        np.testing.assert_array_equal(e[cid], f[cid])
    # a server that knows the run seed knows each client's public seed; noise drawn from
    # it (local_centers' default, seed -> noise) is not what the clients sent
    for cid, client in clients.items():
        public = local_centers(
            client.X[: cfg.num_init],
            k=cfg.centers_per_client,
            seed=client.seed,
            noise_std=0.1,
            min_cluster_size=cfg.min_cluster_size,
        ).clamp(0.0, 1.0)
        assert not np.allclose(public.numpy(), a[cid])
    # the same private seed reproduces the run (tests, reproducible experiments)
    again, _, _, _ = _received_centres(_setup(crypto_seed=0), cfg)
    for cid in a:
        np.testing.assert_array_equal(again[cid], a[cid])


def test_the_noise_seed_comes_from_the_private_generator(monkeypatch):
    import botorch_fed.algorithms.fbo_fedgp.client as fbo

    seen = []
    real = fbo.local_centers

    def spy(X, k, **kwargs):
        seen.append((X.clone(), kwargs))
        return real(X, k, **kwargs)

    monkeypatch.setattr(fbo, "local_centers", spy)
    server, clients, _ = build_federation(
        "fbo-fedgp", _setup(), _config(support="clustered", center_noise=0.05)
    )
    states = {cid: c.private_rng.get_state().clone() for cid, c in clients.items()}
    server.run()
    assert len(seen) == len(clients)
    for X, kwargs in seen:
        ((cid, client),) = [(i, c) for i, c in clients.items() if torch.equal(c.X[: len(X)], X)]
        assert kwargs["noise_std"] == 0.05
        assert kwargs["seed"] == client.seed  # k-means++ seeding: public, as before
        g = torch.Generator()
        g.set_state(states[cid])
        draws = torch.randint(2**62, (4,), generator=g).tolist()  # the lowest bits first
        expected = sum(d << (62 * i) for i, d in enumerate(draws))
        assert kwargs["noise_seed"] == expected != client.seed
        # every draw's bits are in it (a 62-bit seed is above 2^64 with probability 0)
        assert kwargs["noise_seed"].bit_length() > 64


@pytest.mark.parametrize("source", ["os", "private_seed"])
def test_the_noise_depends_on_every_bit_of_the_private_seed_material(source, monkeypatch):
    r"""Two clients whose private seed material agrees in its low 32 bits draw different
    noise. Were the private generator seeded with ``manual_seed``, which keeps those 32
    bits only, a server that learnt the noise of the first centres (those of the public
    initial design) could try every seed and subtract all the later noise."""
    import secrets

    from botorch_fed.protocol.registry import BuildContext

    def low_bits_shared(high: int, nbits: int) -> int:
        return ((high << 32) | 0x9E3779B9) % 2**nbits

    centres = []
    for high in (1, 2):
        with monkeypatch.context() as m:
            if source == "os":  # what the OS hands the client (as bits, or as bytes)
                m.setattr(secrets, "randbits", lambda k, h=high: low_bits_shared(h, k))
                m.setattr(
                    secrets,
                    "token_bytes",
                    lambda n, h=high: low_bits_shared(h, 8 * n).to_bytes(n, "little"),
                )
                kwargs = OS
            else:  # a simulation's seed of the private generator
                m.setattr(BuildContext, "private_seed", lambda self, cid, h=high: (h << 32) | 7)
                kwargs = {}
            _, clients, _ = build_federation(
                "fbo-fedgp",
                _os_setup(),
                _reselect_config(support="clustered", center_noise=0.1, centers_per_client=2),
                **kwargs,
            )
        clients[0].handle(Message("init"))
        centres.append(clients[0].handle(Message("centers", {"k": 2})).payload["centers"])
    # the same data and public seeds: only the noise can tell the two apart
    assert centres[0].shape == centres[1].shape and len(centres[0])
    assert not np.allclose(centres[0], centres[1])


# --- private randomness: resume, re-selection -------------------------------------------
def test_resume_under_os_randomness_continues_the_saved_private_generator(tmp_path):
    # crypto_seed=None: the private generator is seeded from the OS, so two resumes of
    # the same checkpoint only agree if its state is restored (not re-seeded), and the
    # resumed noise is not a replay the server could average against a fresh draw
    a, b = tmp_path / "a", tmp_path / "b"
    with pytest.raises(Killed):
        run_federated(
            "fbo-fedgp", _os_setup(), _reselect_config(), checkpoint=a, on_round=kill_after(1), **OS
        )
    shutil.copytree(a, b)
    ra = run_federated("fbo-fedgp", _os_setup(), _reselect_config(), resume=a, **OS)
    rb = run_federated("fbo-fedgp", _os_setup(), _reselect_config(), resume=b, **OS)
    assert comparable(ra) == comparable(rb)
    settings = load_checkpoint(a)[0]["settings"]  # resolved settings round trip
    assert (settings["support"], settings["center_noise"]) == ("clustered", 0.1)


def test_each_selection_draws_fresh_private_noise_so_repeats_average_out():
    # documented residual (docs/security.md): a cluster sent in r selections can be
    # averaged; asked again about the same data, a client repeats its answer
    server, clients, _ = build_federation(
        "fbo-fedgp", _os_setup(crypto_seed=3), _reselect_config(centers_per_client=2)
    )
    client = clients[0]
    client.X = torch.rand(8, 2, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    exact = local_centers(client.X, k=2, seed=client.seed,
                          min_cluster_size=client.config.min_cluster_size).numpy()  # fmt: skip
    same = [client.handle(Message("centers", {"k": 2})).payload["centers"] for _ in range(3)]
    assert all(np.array_equal(d, same[0]) for d in same)  # no fresh noise for the same data

    def selection():
        client._centers = None  # a selection after the data grew (kept equal here)
        return client.handle(Message("centers", {"k": 2})).payload["centers"]

    draws = np.stack([selection() for _ in range(400)])
    assert not np.allclose(draws[0], draws[1])  # fresh noise every selection
    inner = (exact > 0.3) & (exact < 0.7)  # away from the clamp
    err = np.abs(draws.mean(0) - exact)[inner]
    assert err.max() < 0.1 / math.sqrt(400) * 4  # the average recovers the centre
    # the noise seed is not the public client seed
    public = local_centers(client.X, k=2, seed=client.seed, noise_std=0.1,
                           min_cluster_size=2).clamp(0, 1).numpy()  # fmt: skip
    assert not any(np.allclose(d, public) for d in draws)


# --- the benchmark behind the default preset's noise ------------------------------------
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
    assert FBOFedGPSettings().resolved().center_noise == 0.1


# --- docs -------------------------------------------------------------------------------
def test_docs_say_the_default_noise_only_matters_under_ckks():
    text = (ROOT / "docs/security.md").read_text()
    start = text.index('*default preset*: `support="clustered"`')
    bullet = text[start : text.index("*paper preset*", start)]
    assert "ckks" in bullet and ("plaintext" in bullet or "masking" in bullet)


@pytest.mark.parametrize("seed", [None, 7, (5 << 40) | 7])
def test_the_private_generator_state_is_every_word_of_its_key_stream(seed):
    r"""All 624 Mersenne Twister words of a client's private generator come from its
    ChaCha20 key stream (the top 32 bits of each uniform), none from ``manual_seed``,
    whose 32-bit seed a server could search; two key streams give two states."""
    from botorch_fed.privacy import KeyStream
    from botorch_fed.protocol.bo_client import private_generator

    def words(state):  # torch's CPU generator state: the 624 words from byte 24
        return state[24 : 24 + 8 * 624].view(torch.int64)

    state = private_generator(seed).get_state()
    assert state[:8].view(torch.int64).item() == 0  # no manual_seed value recorded
    if seed is not None:
        expected = (KeyStream.from_seed(seed).uniform(624) * 2.0**32).floor().to(torch.int64)
        assert torch.equal(words(state), expected)
    other = private_generator(None if seed is None else seed + 1).get_state()
    assert not torch.equal(words(other), words(state))
