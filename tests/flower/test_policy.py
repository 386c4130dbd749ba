r"""A party's agent refuses what its own policy does not allow, whatever the run
config (written by the server's operator) asks: plaintext or masking sums (ckks needs no
permission), a known crypto seed, an objective it does not run, the final report of its
evaluations, algorithms that show the server raw data, exact cluster centres, an epsilon
outside its bounds. Each test also runs the same request with the permission granted, so
it fails if the refusal is removed or if it refuses everything. (That the agent decides
on the run's options before building anything, its size caps and an objective's pinned
domain: test_agent_refusals.py.)"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

pytest.importorskip("flwr")

from botorch_fed.flower.agent import REPORT, PartyAgent  # noqa: E402
from botorch_fed.flower.keys import write_keyset  # noqa: E402
from botorch_fed.flower.policy import PartyPolicy, PolicyError  # noqa: E402
from botorch_fed.flower.run_options import prepare  # noqa: E402
from botorch_fed.flower.server_app import run_on_flower  # noqa: E402
from botorch_fed.protocol.declarations import ProtocolViolation  # noqa: E402
from botorch_fed.secure import available_backends  # noqa: E402
from tests.helpers.fake_grid import FakeGrid  # noqa: E402
from tests.helpers.flower_runs import short_argv  # noqa: E402

pytestmark = pytest.mark.usefixtures("quiet_single_thread")

MASKING = PartyPolicy(allow_masking=True)  # runs with --aggregator masking (test below)


def _send(agent: PartyAgent, run: int, argv: list[str], type_: str, payload=None, keyset=""):
    r"""One message of run ``run`` as the ClientApp forwards it (the run config is the
    server's)."""
    config = {"argv": json.dumps(argv), "keyset": keyset}
    return agent.answer({"run": run, "type": type_, "config": config}, payload or {})


def _first(agent: PartyAgent, argv: list[str], type_: str = "init", keyset: str = ""):
    return _send(agent, 1, argv, type_, keyset=keyset)


def _without_seed(argv: list[str]) -> list[str]:
    i = argv.index("--crypto-seed")
    return argv[:i] + argv[i + 2 :]


def test_plaintext_sums_are_refused_unless_allowed(tmp_path):
    argv = _without_seed(short_argv("fbo-fedgp", "plaintext"))
    keyset, _ = write_keyset(prepare(argv).setup, [0, 1, 2], tmp_path)
    with pytest.raises(PolicyError, match="--aggregator plaintext.*--allow-plaintext"):
        _first(PartyAgent(0, 3, tmp_path), argv, keyset=keyset)
    # allowed: the client is built and evaluates its initial design
    agent = PartyAgent(0, 3, tmp_path, policy=PartyPolicy(allow_plaintext=True))
    meta, _ = _first(agent, argv, keyset=keyset)
    assert meta["ok"]


def test_masking_sums_are_refused_unless_allowed(tmp_path):
    # under masking the server can solve every point a client evaluates out of the
    # summed FBO-FedGP summaries (docs/security.md, "Summaries under `masking`")
    argv = _without_seed(short_argv("fbo-fedgp", "masking"))
    keyset, _ = write_keyset(prepare(argv).setup, [0, 1, 2], tmp_path)
    with pytest.raises(PolicyError, match="--aggregator masking.*--allow-masking"):
        _first(PartyAgent(0, 3, tmp_path), argv, keyset=keyset)
    meta, _ = _first(PartyAgent(0, 3, tmp_path, policy=MASKING), argv, keyset=keyset)
    assert meta["ok"]


@pytest.mark.skipif("ckks" not in available_backends(), reason="ckks (TenSEAL) missing")
def test_ckks_sums_need_no_permission(tmp_path):
    argv = _without_seed(short_argv("fbo-fedgp", "ckks"))
    keyset, _ = write_keyset(prepare(argv).setup, [0, 1, 2], tmp_path)
    meta, _ = _first(PartyAgent(0, 3, tmp_path), argv, keyset=keyset)
    assert meta["ok"]


def test_flower_up_gives_every_agent_allow_masking(tmp_path, monkeypatch):
    from botorch_fed.cli import main
    from botorch_fed.flower import launcher
    from botorch_fed.flower.party import main as agent_main

    given = {}

    def up(clients, state_dir, **kwargs):
        given.update(kwargs)
        return {"address": "127.0.0.1:1"}

    monkeypatch.setattr(launcher, "up", up)
    argv = ["flower", "up", "--clients", "2", "--state-dir", str(tmp_path), "--allow-masking"]
    assert main(argv) == 0
    assert "--allow-masking" in given["agent_flags"]
    built = {}
    monkeypatch.setattr("botorch_fed.flower.party.serve", lambda agent, path: built.update(a=agent))
    monkeypatch.setattr("signal.signal", lambda *args: None)  # the agent's SIGTERM handler
    agent = ["--socket", "s", "--partition-id", "0", "--num-partitions", "2"]
    agent_main(agent)
    assert not built["a"].policy.allow_masking  # the default
    agent_main([*agent, *given["agent_flags"]])
    assert built["a"].policy.allow_masking


def test_a_crypto_seed_is_refused_unless_allowed():
    argv = short_argv("local")
    with pytest.raises(PolicyError, match="--crypto-seed.*--allow-crypto-seed"):
        _first(PartyAgent(0, 3), argv)
    meta, _ = _first(PartyAgent(0, 3, policy=PartyPolicy(allow_crypto_seed=True)), argv)
    assert meta["ok"]


def test_a_key_set_made_from_a_crypto_seed_is_refused_unless_allowed(tmp_path):
    r"""The run config names the key set: a run without --crypto-seed that names a key
    set an earlier seeded run left in the party's key folder is refused, since whoever
    knows that seed can recompute the party's key material."""
    from botorch_fed.protocol.runner import secagg_backend

    seeded_argv = short_argv("fbo-fedgp", "masking")  # --crypto-seed 5
    argv = _without_seed(seeded_argv)
    seeded, _ = write_keyset(prepare(seeded_argv).setup, [0, 1, 2], tmp_path)
    fresh, _ = write_keyset(prepare(argv).setup, [0, 1, 2], tmp_path)
    with pytest.raises(PolicyError, match=f"{seeded!r} was made from a crypto seed.*--allow-"):
        _first(PartyAgent(0, 3, tmp_path, policy=MASKING), argv, keyset=seeded)
    meta, _ = _first(PartyAgent(0, 3, tmp_path, policy=MASKING), argv, keyset=fresh)  # OS
    assert meta["ok"]
    # allowed: the party holds the material the seed gives (and anyone can recompute)
    policy = PartyPolicy(allow_crypto_seed=True, allow_masking=True)
    agent = PartyAgent(0, 3, tmp_path, policy=policy)
    meta, _ = _first(agent, argv, keyset=seeded)
    assert meta["ok"]
    backend = secagg_backend(prepare(argv).setup, [0, 1, 2])
    recomputed = backend.client(0, backend.setup([0, 1, 2], seed=5).for_client(0))
    assert agent._runs[1].client.secagg.federation_secret() == recomputed.federation_secret()


def test_a_partys_private_randomness_comes_from_the_os_not_the_run_seed():
    r"""A simulation derives its parties' randomness from the public seed; a party
    agent never does: two agents of one run config draw different noise keys, and
    neither is the simulation's."""
    from botorch_fed.algorithms import build_federation

    argv = _without_seed(short_argv("ldp-tgp"))
    config = {"argv": json.dumps(argv), "keyset": ""}
    keys = [
        bytes(PartyAgent(0, 3)._build(config).mechanism.generator.state()[:32].tolist())
        for _ in range(2)
    ]
    run = prepare(argv)
    _, simulated, _ = build_federation("ldp-tgp", run.setup, run.settings)
    simulated_key = bytes(simulated[0].mechanism.generator.state()[:32].tolist())
    assert keys[0] != keys[1] and simulated_key not in keys
    # control: the simulation's key repeats from the seed
    _, again, _ = build_federation("ldp-tgp", run.setup, run.settings)
    assert bytes(again[0].mechanism.generator.state()[:32].tolist()) == simulated_key


def test_two_parties_of_one_run_config_draw_their_own_centre_noise_and_sum_keys(tmp_path):
    r"""Two agents that hold party 0 of the same run config (no crypto seed, the same key
    set) send the same centres with different noise, not the simulation's, and open a
    secure sum with different ephemeral keys: neither the noise nor the secure-sum
    role's randomness follows from the run's public options."""
    from botorch_fed.algorithms import build_federation
    from botorch_fed.inducing import local_centers
    from botorch_fed.protocol.runner import secagg_backend

    argv = _without_seed(short_argv("fbo-fedgp", "masking"))
    argv += ["--num-init", "6", "--support-selection", "clustered", "--center-noise", "0.1"]
    argv += ["--centers-per-client", "2"]  # the k a client takes is the run's
    run = prepare(argv)
    keyset, server_key = write_keyset(run.setup, [0, 1, 2], tmp_path)
    agents = [PartyAgent(0, 3, tmp_path, policy=MASKING) for _ in range(2)]
    centres = []
    for agent in agents:
        _send(agent, 1, argv, "init", keyset=keyset)
        centres.append(_send(agent, 1, argv, "centers", {"k": 2}, keyset=keyset)[1]["centers"])
    # the same data (the public initial design), hence the same exact centres
    clients = [agent._runs[1].client for agent in agents]
    assert torch.equal(clients[0].X, clients[1].X)
    exact = local_centers(clients[0].X, k=2, seed=clients[0].seed, min_cluster_size=2).numpy()
    assert centres[0].shape == centres[1].shape == exact.shape == (2, 2)
    assert ((exact > 0.2) & (exact < 0.9)).all()  # the noise is rarely clamped
    assert not np.allclose(centres[0], centres[1])
    _, simulated, _ = build_federation("fbo-fedgp", run.setup, run.settings)
    from botorch_fed.protocol.messages import Message

    simulated[0].handle(Message("init"))
    expected = simulated[0].handle(Message("centers", {"k": 2})).payload["centers"]
    assert not any(np.allclose(c, expected) for c in centres)
    # the secure sum: the same opening message to both parties' roles
    server = secagg_backend(run.setup, [0, 1, 2]).server(server_key.read_bytes())
    opening = server.start([0, 1, 2], 4)[0]
    replies = [client.secagg.step(opening) for client in clients]
    assert len(replies[0]) == len(replies[1]) and replies[0] != replies[1]


def test_a_key_set_without_a_crypto_seed_is_made_from_os_randomness(tmp_path):
    r"""Two key sets of one run config (no crypto seed) give a party different key
    material, and neither is the material a simulation derives from the run's seed."""
    from botorch_fed.flower.keys import party_material
    from botorch_fed.protocol.runner import secagg_backend
    from botorch_fed.protocol.setup import simulation_crypto_seed

    setup = prepare(_without_seed(short_argv("fbo-fedgp", "masking"))).setup
    names = [write_keyset(setup, [0, 1, 2], tmp_path)[0] for _ in range(2)]
    materials = [party_material(tmp_path, name, 0) for name in names]
    assert materials[0] != materials[1]
    backend = secagg_backend(setup, [0, 1, 2])
    simulated = backend.setup([0, 1, 2], seed=simulation_crypto_seed(setup.seed))
    assert simulated.for_client(0) not in materials


def test_an_objective_is_refused_before_it_is_imported(tmp_path, monkeypatch):
    # the module would leave a file behind if it were imported
    marker = tmp_path / "imported"
    (tmp_path / "party_box.py").write_text(
        f"open({str(marker)!r}, 'w').close()\ndef f(X):\n    return X.sum(-1)\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    argv = ["local", "--objective", "party_box:f", "--bounds", "0,1;0,1", "--clients", "3"]
    argv += ["--num-rounds", "1", "--num-init", "2"]
    for abbreviated in (argv, [a.replace("--objective", "--obj") for a in argv]):
        with pytest.raises(PolicyError, match="'party_box:f'.*--allow-objective"):
            _first(PartyAgent(0, 3), abbreviated)
    assert not marker.exists()
    allowed = PartyPolicy(objectives=("party_box:f@0,1;0,1",))  # on its domain
    meta, _ = _first(PartyAgent(0, 3, policy=allowed), argv)
    assert meta["ok"] and marker.exists()


def test_the_report_is_refused_unless_shared(tmp_path):
    argv = _without_seed(short_argv("local"))
    keep = PartyAgent(0, 3)
    _first(keep, argv)
    with pytest.raises(PolicyError, match="keeps its evaluations.*--share-results"):
        _first(keep, argv, REPORT)
    share = PartyAgent(0, 3, policy=PartyPolicy(share_results=True))
    _first(share, argv)
    _, report = _first(share, argv, REPORT)
    assert len(json.loads(report["history"])) == 3  # its initial design (--num-init 3)


def test_a_run_completes_without_the_reports_of_parties_that_keep_them(tmp_path):
    # no party shares its evaluations: the run completes, its results hold none
    argv = short_argv("local")
    grid = FakeGrid(3, str(tmp_path), policy=PartyPolicy(allow_crypto_seed=True))
    grid.run_config = {"argv": json.dumps(argv), "out": str(tmp_path / "o.json")}
    lines = []
    result = run_on_flower(grid, grid.run_config, log=lines.append)
    assert result.evaluations == [] and result.best_value is None
    assert result.best_per_client == {}
    # each refusal is logged as the party's sentence, not as Flower's <class ...> text
    refusals = [line for line in lines if "--share-results" in line]
    assert len(refusals) == 3, lines
    assert all("<class" not in line and "PolicyError: " in line for line in refusals), refusals


def test_algorithms_that_show_the_server_raw_data_are_refused_unless_allowed():
    argv = _without_seed(short_argv("central"))
    with pytest.raises(PolicyError, match="'central'.*--allow-algorithm central"):
        _first(PartyAgent(0, 3), argv)
    meta, _ = _first(PartyAgent(0, 3, policy=PartyPolicy(algorithms=("central",))), argv)
    assert meta["ok"]


@pytest.mark.parametrize(
    "options, match",
    [
        (["--center-noise", "0"], "noise of std 0 "),
        # a noise too small to hide anything, and clusters of one point
        (["--center-noise", "1e-300"], "noise of std 1e-300 "),
        (["--min-cluster-size", "1"], "clusters of 1 point"),
    ],
)
def test_the_party_refuses_exact_cluster_centres_unless_allowed(options, match, tmp_path):
    argv = short_argv("fbo-fedgp", "masking")
    i = argv.index("--crypto-seed")
    argv = argv[:i] + argv[i + 2 :] + ["--support-selection", "clustered", *options]
    keyset, _ = write_keyset(prepare(argv).setup, [0, 1, 2], tmp_path)
    with pytest.raises(PolicyError, match=match):
        _send(PartyAgent(0, 3, tmp_path, policy=MASKING), 1, argv, "init", keyset=keyset)
    allowed = PartyPolicy(allow_exact_centres=True, allow_masking=True)
    meta, _ = _send(PartyAgent(0, 3, tmp_path, policy=allowed), 1, argv, "init", keyset=keyset)
    assert meta["ok"]


def test_an_epsilon_below_the_partys_minimum_is_refused():
    # a tiny epsilon would buy many answers (and failure bits) for little
    argv = ["ldp-tgp", "--problem", "ldp-synthetic", "--clients", "3", "--num-rounds", "2"]
    with pytest.raises(PolicyError, match="epsilon = 0.001 per answer, below this party's 0.1"):
        _first(PartyAgent(0, 3), [*argv, "--epsilon", "0.001"])
    allowed = PartyAgent(0, 3, policy=PartyPolicy(min_epsilon=0.001))
    with pytest.raises(ProtocolViolation, match="cannot handle messages of type 'init'"):
        _first(allowed, [*argv, "--epsilon", "0.001"])  # built: it answers queries only


def test_an_epsilon_above_the_partys_is_refused():
    argv = ["ldp-tgp", "--problem", "ldp-synthetic", "--clients", "3", "--num-rounds", "2"]
    with pytest.raises(PolicyError, match="epsilon = 4 per answer, above this party's 1"):
        _first(PartyAgent(0, 3), [*argv, "--epsilon", "4"])
    # allowed: the user is built (it answers queries, not `init`)
    for agent, options in [
        (PartyAgent(0, 3, policy=PartyPolicy(max_epsilon=4.0)), [*argv, "--epsilon", "4"]),
        (PartyAgent(0, 3), argv),  # the default epsilon, 1
    ]:
        with pytest.raises(ProtocolViolation, match="cannot handle messages of type 'init'"):
            _first(agent, options)


def _parsed(argv: list[str]):
    import argparse

    from botorch_fed.flower.policy_flags import add_policy_arguments

    parser = argparse.ArgumentParser()
    add_policy_arguments(parser)
    return parser.parse_args(argv)


@pytest.mark.parametrize(
    "flags",
    [
        [],
        ["--allow-plaintext", "--share-results", "--max-epsilon", "2.5"],
        ["--allow-objective", "m:f", "--allow-objective=n:g", "--allow-algorithm", "all"],
        ["--allow-crypto-seed", "--allow-exact-centres", "--allow-algorithm", "central"],
        ["--max-total-epsilon", "inf"],
        ["--min-epsilon", "0.5", "--min-center-noise", "0"],
        ["--allow-masking"],
        ["--allow-objective", "m:f@0,1;-5,5", "--allow-objective=m:g@0,1@max"],
    ],
)
def test_flower_up_passes_every_agent_the_policy_it_was_given(flags):
    from botorch_fed.flower.policy_flags import policy_flags, policy_from_arguments

    given = policy_from_arguments(_parsed(flags))
    passed = policy_from_arguments(_parsed(policy_flags(_parsed(flags))))  # the agent's
    assert passed == given
    assert (given == PartyPolicy()) == (flags == [])


@pytest.mark.parametrize("flag", ["--max-epsilon", "--max-total-epsilon", "--min-epsilon"])
@pytest.mark.parametrize("value", ["0", "-1", "nan"])
def test_an_epsilon_cap_not_above_zero_is_refused(flag, value):
    from botorch_fed.flower.policy_flags import policy_flags, policy_from_arguments

    for build in (policy_from_arguments, policy_flags):
        with pytest.raises(ValueError, match=f"{flag} must be > 0, got {value}"):
            build(_parsed([flag, value]))


def test_bad_minimums_are_refused():
    from botorch_fed.flower.policy_flags import policy_from_arguments

    with pytest.raises(ValueError, match="--min-center-noise must be >= 0 and finite, got -1"):
        policy_from_arguments(_parsed(["--min-center-noise", "-1"]))
    with pytest.raises(ValueError, match="--min-epsilon 2 is above --max-epsilon 1"):
        policy_from_arguments(_parsed(["--min-epsilon", "2"]))
