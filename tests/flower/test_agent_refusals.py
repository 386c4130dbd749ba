r"""A party's agent refuses a run on its parsed options, before it builds anything of
it: a refused run costs the agent (which answers every run under one lock) no objective
built, no module imported. What it refuses that way: what its policy does not allow,
a client count other than its federation's, a size-like option above its cap (a run
the server makes huge: ``--clients 80000``, ``--dim 20000000``, ``--num-init
10000000``, ...), and an objective on another domain than the one the party pinned
or its function declares (a lab instrument driven outside its safe range).

"Before it builds anything" is checked structurally: the tests replace the run's
builder (:func:`botorch_fed.runs.prepare.prepare_run`) and the importer of the user's
function by functions that fail the test when called; a refusal must come first. No
Flower processes: the agent is called directly, as the ClientApp forwards a message."""

from __future__ import annotations

import json
import sys

import pytest
import torch

pytest.importorskip("flwr")

from botorch_fed.flower.party import PartyAgent, agent_parser  # noqa: E402
from botorch_fed.flower.policy import (  # noqa: E402
    MAX_DIM,
    NOT_SIZE_LIKE,
    SIZE_CAPS,
    PartyPolicy,
    PolicyError,
)
from botorch_fed.flower.policy_flags import policy_from_arguments  # noqa: E402
from tests.helpers.flower_runs import short_argv  # noqa: E402

pytestmark = pytest.mark.usefixtures("quiet_single_thread")

# a party that allows every permission: only the sizes and the domain are left to refuse
EVERYTHING = PartyPolicy(
    allow_plaintext=True,
    allow_masking=True,
    allow_crypto_seed=True,
    algorithms=("all",),
    allow_exact_centres=True,
)


class Built(AssertionError):
    r"""The agent built (or imported) something of a run it should have refused first."""


def _send(agent: PartyAgent, argv: list[str], run: int = 1, type_: str = "init"):
    config = {"argv": json.dumps(argv), "keyset": ""}
    return agent.answer({"run": run, "type": type_, "config": config}, {})


@pytest.fixture
def nothing_built(monkeypatch):
    r"""The run's builder and the user's-function importer fail when called."""

    def built(*args, **kwargs):
        raise Built("the agent built the run, or imported its objective, before refusing it")

    monkeypatch.setattr("botorch_fed.runs.prepare.prepare_run", built)
    monkeypatch.setattr("botorch_fed.runs.black_box.import_callable", built)


def _without_seed(argv: list[str]) -> list[str]:
    i = argv.index("--crypto-seed")
    return argv[:i] + argv[i + 2 :]


# --- F3: huge runs are refused on their options --------------------------------------
def test_a_huge_central_run_is_refused_without_building_it(nothing_built):
    argv = ["central", "--problem", "branin", "--clients", "80000", "--num-rounds", "1"]
    # not of this federation's size
    with pytest.raises(ValueError, match=r"80000 clients \(--clients\).*3 \(--num-partitions\)"):
        _send(PartyAgent(0, 3), argv)
    with pytest.raises(ValueError, match="10 clients"):  # nor is the default count, 10
        _send(PartyAgent(0, 3), [a for a in argv if a not in ("--clients", "80000")])
    # a federation of that size: the party does not join `central`
    with pytest.raises(PolicyError, match="'central'.*--allow-algorithm central"):
        _send(PartyAgent(0, 80000), argv)
    # and if it does, the run is above its cap on clients
    joins = PartyAgent(0, 80000, policy=PartyPolicy(algorithms=("central",)))
    with pytest.raises(PolicyError, match="--clients 80000, above the 10000 "):
        _send(joins, argv)


# the algorithm whose parser takes each capped option (with EVERYTHING allowed)
CAPPED = {
    "clients": "local",
    "dim": "local",
    "threads": "local",
    "settings.num_rounds": "ldp-tgp",  # no exact GP on a client's data (COST_CAPS)
    "settings.num_init": "local",
    "settings.raw_samples": "local",
    "settings.num_restarts": "local",
    "settings.maxiter": "local",
    "settings.fit_maxiter": "local",
    "settings.federated_maxiter": "fbo-fedgp",
    "settings.ts_candidates": "local",
    "settings.num_fantasies": "local",
    "settings.num_mv_samples": "co-es",
    "settings.support_size": "fbo-fedgp",
    "settings.support_growth": "fbo-fedgp",
    "settings.centers_per_client": "fbo-fedgp",
    "settings.points_per_dim": "co-kg",
    "settings.plays_per_epoch": "ldp-moma",
}


def _flag(dest: str) -> str:
    from botorch_fed.runs.options import SETTING_FLAGS

    name = dest.removeprefix("settings.")
    return SETTING_FLAGS.get(name, "--" + name.replace("_", "-"))


def _sized(dest: str, value: int) -> tuple[PartyAgent, list[str]]:
    r"""An agent and a run of ``CAPPED[dest]`` whose option ``dest`` is ``value``."""
    argv = _without_seed(short_argv(CAPPED[dest]))
    clients = value if dest == "clients" else 3
    argv[argv.index("--clients") + 1] = str(clients)
    if dest == "dim":
        argv[argv.index("branin")] = "levy"  # a problem of any dimension
    if dest != "clients":
        argv += [_flag(dest), str(value)]
    if dest == "settings.num_init":  # the GP fit's cost within COST_CAPS at the cap
        argv += ["--fit-maxiter", "1", "--num-rounds", "1"]
    if dest == "settings.support_size":  # the federated fit's cost within COST_CAPS
        argv += ["--federated-maxiter", "1"]
    return PartyAgent(0, clients, policy=EVERYTHING), argv


def test_every_capped_option_has_a_case_below():
    assert sorted(CAPPED) == sorted(SIZE_CAPS)


@pytest.mark.parametrize("dest", sorted(SIZE_CAPS))
def test_a_size_above_its_cap_is_refused_without_building_the_run(dest, nothing_built):
    cap = SIZE_CAPS[dest]
    agent, argv = _sized(dest, cap + 1)
    with pytest.raises(PolicyError, match=f"{_flag(dest)} {cap + 1}, above the {cap} "):
        _send(agent, argv)
    # at the cap the options pass: the agent goes on to build the run
    agent, argv = _sized(dest, cap)
    with pytest.raises(Built):
        _send(agent, argv)


@pytest.mark.parametrize(
    "dest, value",
    [("dim", 20_000_000), ("settings.num_init", 10_000_000), ("settings.raw_samples", 10**9)],
)
def test_the_reviewed_huge_runs_are_refused_without_building_them(dest, value, nothing_built):
    agent, argv = _sized(dest, value)
    with pytest.raises(PolicyError, match=f"{_flag(dest)} {value}, above"):
        _send(agent, argv)


def test_every_integer_option_of_every_algorithm_is_capped_or_not_a_size():
    # an option added to a settings dataclass later must be capped or said not to be a size
    from botorch_fed.runs.parser import build_run_parser

    for algorithm, (_, options) in build_run_parser().run_parsers.items():
        for option in options:
            if option.kind is int:
                assert option.dest in SIZE_CAPS or option.dest in NOT_SIZE_LIKE, (
                    algorithm,
                    option.dest,
                )


def test_bounds_of_too_many_dimensions_are_refused_without_parsing_them(nothing_built):
    policy = PartyPolicy(objectives=("box:f@0,1;0,1",))
    bounds = "0,1;" * (MAX_DIM + 1)
    argv = ["local", "--objective", "box:f", "--bounds", bounds, "--clients", "3"]
    with pytest.raises(PolicyError, match=f"--bounds has {MAX_DIM + 1} dimensions"):
        _send(PartyAgent(0, 3, policy=policy), argv)


@pytest.mark.parametrize(
    "argv, match",
    [
        (["fts", "--problem", "branin"], "'fts'.*--allow-algorithm fts"),
        (["fbo-fedgp", "--aggregator", "plaintext"], "--aggregator plaintext.*--allow-plaintext"),
        (["fbo-fedgp", "--aggregator", "masking"], "--aggregator masking.*--allow-masking"),
        (["local", "--crypto-seed", "1"], "--crypto-seed.*--allow-crypto-seed"),
        (["local", "--objective", "box:f", "--bounds", "0,1"], "'box:f'.*--allow-objective"),
        (["ldp-tgp", "--problem", "ldp-synthetic", "--epsilon", "5"], "--max-epsilon"),
        (["ldp-tgp", "--problem", "ldp-synthetic", "--epsilon", "0.01"], "--min-epsilon"),
        (["fbo-fedgp", "--aggregator", "ckks", "--center-noise", "0"], "--allow-exact-centres"),
        (["fbo-fedgp", "--aggregator", "ckks", "--preset", "paper"], "--allow-exact-centres"),
        (["fbo-fedgp", "--aggregator", "ckks", "--min-cluster-size", "1"], "--allow-exact-"),
    ],
)
def test_the_policy_is_decided_on_the_options_without_building_the_run(argv, match, nothing_built):
    with pytest.raises(PolicyError, match=match):
        _send(PartyAgent(0, 3), [*argv, "--clients", "3", "--num-rounds", "1"])


def test_a_refusal_leaves_the_agent_as_it_was(nothing_built):
    agent = PartyAgent(0, 3)
    with pytest.raises(PolicyError):
        _send(agent, ["local", "--clients", "3", "--num-init", "10000000"])
    assert agent._runs == {} and agent._over == {}


# --- F5: an allowed objective runs on the party's domain only --------------------------
BOX = """
def f(X):
    return X.sum(-1)
"""


@pytest.fixture
def party_box(tmp_path, monkeypatch):
    r"""The module ``party_box`` (function ``f``) next to the agent; returns a function
    writing it with extra source lines (declarations)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))

    def write(extra: str = "") -> None:
        (tmp_path / "party_box.py").write_text(BOX + extra)
        sys.modules.pop("party_box", None)

    write()
    yield write
    sys.modules.pop("party_box", None)


def _objective_argv(bounds: str | None = "0,1;-5,5", *extra: str) -> list[str]:
    argv = ["local", "--objective", "party_box:f", "--clients", "3", "--num-rounds", "1"]
    argv += ["--num-init", "2", "--num-restarts", "2", "--raw-samples", "16", "--maxiter", "15"]
    return argv + ([] if bounds is None else ["--bounds", bounds]) + list(extra)


PINNED = PartyPolicy(objectives=("party_box:f@0,1;-5,5",))


@pytest.mark.parametrize(
    "argv, match",
    [
        (_objective_argv("0,1;-1e6,1e6"), "--bounds '0,1;-1e6,1e6'"),  # wider
        (_objective_argv("0,1;-5,4"), "--bounds '0,1;-5,4'"),  # narrower is another domain
        (_objective_argv("0,1;-5,5;0,1"), "--bounds"),  # another dimension
        (_objective_argv("0,1;-5,5", "--dim", "3"), "--dim 3"),
        (_objective_argv(None), "no --bounds"),
        (_objective_argv("0,1;-5,5", "--maximize"), "--maximize"),
    ],
)
def test_a_pinned_objective_on_another_domain_is_refused_before_it_is_imported(
    argv, match, party_box, nothing_built
):
    with pytest.raises(PolicyError, match=f"{match}.*'0,1;-5,5'.*--allow-objective"):
        _send(PartyAgent(0, 3, policy=PINNED), argv)


def test_a_pinned_objective_on_its_domain_runs_there(party_box):
    agent = PartyAgent(0, 3, policy=PINNED)
    meta, _ = _send(agent, _objective_argv("0,1;-5,5"))
    assert meta["ok"]
    X = agent._runs[1].client.objective.to_domain(agent._runs[1].client.X)
    lower, upper = torch.tensor([[0.0, -5.0], [1.0, 5.0]], dtype=torch.float64)
    assert len(X) == 2 and ((X >= lower) & (X <= upper)).all()
    # written otherwise, the same numbers are the same domain
    meta, _ = _send(PartyAgent(0, 3, policy=PINNED), _objective_argv("0.0,1.0;-5.0,5.0;"))
    assert meta["ok"]


def test_a_maximised_objective_is_refused_minimised_and_runs_maximised(party_box, nothing_built):
    policy = PartyPolicy(objectives=("party_box:f@0,1;-5,5@max",))
    with pytest.raises(PolicyError, match="--no-maximize .*maximised"):
        _send(PartyAgent(0, 3, policy=policy), _objective_argv("0,1;-5,5"))
    with pytest.raises(Built):  # the options pass: the agent goes on to build the run
        _send(PartyAgent(0, 3, policy=policy), _objective_argv("0,1;-5,5", "--maximize"))


def test_an_objective_allowed_on_two_domains_runs_on_either(party_box, nothing_built):
    policy = PartyPolicy(objectives=("party_box:f@0,1;-5,5", "party_box:f@0,2@max"))
    for argv in (_objective_argv("0,1;-5,5"), _objective_argv("0,2", "--maximize")):
        with pytest.raises(Built):
            _send(PartyAgent(0, 3, policy=policy), argv)
    with pytest.raises(PolicyError):
        _send(PartyAgent(0, 3, policy=policy), _objective_argv("0,2"))


def test_a_declared_domain_is_the_objectives_domain(party_box):
    party_box('f.bounds = "0,1;-5,5"\nf.maximize = False\n')
    agent = PartyAgent(0, 3, policy=PartyPolicy(objectives=("party_box:f",)))
    with pytest.raises(PolicyError, match="--bounds '0,1;-9,9'.*'0,1;-5,5'"):
        _send(agent, _objective_argv("0,1;-9,9"))
    with pytest.raises(PolicyError, match="--maximize"):
        _send(agent, _objective_argv("0,1;-5,5", "--maximize"), run=2)
    meta, _ = _send(agent, _objective_argv("0,1;-5,5"), run=3)
    assert meta["ok"]
    party_box("f.bounds = [[0, 1], [-5, 5]]\nf.maximize = True\n")  # the other form
    agent = PartyAgent(0, 3, policy=PartyPolicy(objectives=("party_box:f",)))
    meta, _ = _send(agent, _objective_argv("0,1;-5,5", "--maximize"))
    assert meta["ok"]


def test_an_objective_without_a_pinned_or_declared_domain_is_refused_at_the_run(party_box):
    agent = PartyAgent(0, 3, policy=PartyPolicy(objectives=("party_box:f",)))  # starts
    with pytest.raises(PolicyError, match="pins no domain.*declares none.*'party_box:f@lo,hi"):
        _send(agent, _objective_argv("0,1;-5,5"))
    assert agent._runs == {}


@pytest.mark.parametrize(
    "entry",
    ["m:f@", "m:f@1,0", "m:f@0,1;;0,1", "m:f@0,1@up", "m:f@0,1@max@x", "mf@0,1", "m:f@0,inf"],
)
def test_a_malformed_pinned_domain_stops_the_agent_at_start_up(entry):
    with pytest.raises(ValueError, match="--allow-objective"):
        PartyPolicy(objectives=(entry,))
    command = ["--socket", "s", "--partition-id", "0", "--num-partitions", "3"]
    args = agent_parser().parse_args([*command, "--allow-objective", entry])
    with pytest.raises(ValueError, match="--allow-objective"):
        policy_from_arguments(args)


@pytest.mark.parametrize(
    "extra, match",
    [
        (["--num-init", str(SIZE_CAPS["settings.num_init"] + 1)], "--num-init"),
        (["--threads", str(SIZE_CAPS["threads"] + 1)], "--threads"),
        (["--crypto-seed", "1"], "--allow-crypto-seed"),
    ],
)
def test_the_built_run_is_checked_again(extra, match):
    # defence in depth: what the options were refused for, the built run is refused for too
    from botorch_fed.flower.run_options import prepare
    from botorch_fed.protocol.registry import get_algorithm

    run = prepare(["local", "--problem", "branin", "--clients", "3", *extra])
    with pytest.raises(PolicyError, match=match):
        PartyPolicy().check(get_algorithm(run.algorithm), run.setup, run.settings)


def test_the_built_runs_objective_is_checked_again(party_box):
    from botorch_fed.flower.run_options import prepare
    from botorch_fed.protocol.registry import get_algorithm

    for argv, match in [
        (_objective_argv("0,1;-9,9"), "the domain '0,1;-9,9'"),
        (_objective_argv("0,1;-5,5", "--maximize"), "--maximize"),
    ]:
        run = prepare(argv)  # no check: as if the options had slipped through
        spec = get_algorithm(run.algorithm)
        with pytest.raises(PolicyError, match=match):
            PINNED.check(spec, run.setup, run.settings)
    run = prepare(_objective_argv("0,1;-5,5"))
    PINNED.check(get_algorithm(run.algorithm), run.setup, run.settings)
    with pytest.raises(PolicyError, match="does not run"):
        PartyPolicy().check(get_algorithm(run.algorithm), run.setup, run.settings)
    # a declared domain is read from the built function
    party_box('f.bounds = "0,1;-5,5"\n')
    run = prepare(_objective_argv("0,1;-9,9"))
    policy = PartyPolicy(objectives=("party_box:f",))
    with pytest.raises(PolicyError, match="the domain '0,1;-9,9'"):
        policy.check(get_algorithm(run.algorithm), run.setup, run.settings)


# --- what a refusal costs, and what its text tells --------------------------------------
def test_a_run_config_too_long_to_parse_is_refused_before_parsing(monkeypatch):
    # argparse is quadratic in a repeated option: 100,000 repeats of `--seed 1` kept an
    # agent (and every run it holds) busy for minutes before the refusal
    from botorch_fed.flower import run_options

    def parsed(*args, **kwargs):
        raise Built("the agent parsed a run config it should have refused first")

    monkeypatch.setattr("botorch_fed.runs.parser.build_run_parser", parsed)
    many = ["local", "--problem", "branin", "--clients", "3"] + ["--seed", "1"] * 300
    with pytest.raises(ValueError, match=r"605 arguments, more than the 512"):
        _send(PartyAgent(0, 3, policy=EVERYTHING), many)
    long = ["local", "--problem", "branin" + " " * run_options.MAX_ARGV_CHARS]
    with pytest.raises(ValueError, match=r"characters, more than the 65536"):
        _send(PartyAgent(0, 3, policy=EVERYTHING), long)


@pytest.mark.parametrize(
    ("options", "what"),
    [
        (["--num-init", "2000", "--fit-maxiter", "10000"], "--fit-maxiter is 8"),
        (["--dim", "1000", "--raw-samples", "100000"], r"--raw-samples x --dim is 1e\+08"),
        (["--num-restarts", "1000", "--maxiter", "10000"], r"--maxiter is 1e\+07"),
        (["--support-size", "4096"], r"--support-size\^3 x --federated-maxiter is 2"),
        (
            ["--support-size", "2048", "--num-rounds", "1000", "--federated-maxiter", "1"],
            r"--num-rounds is 4",
        ),
    ],
)
def test_sizes_each_within_their_cap_are_refused_when_their_product_is_not(
    options, what, nothing_built
):
    algorithm = "fbo-fedgp" if "--support-size" in options else "local"
    argv = [algorithm, "--problem", "ackley", "--clients", "3", *options]
    assert all(
        int(v) <= SIZE_CAPS.get(f"settings.{k[2:].replace('-', '_')}", SIZE_CAPS.get(k[2:]))
        for k, v in zip(options[::2], options[1::2], strict=True)
    )
    with pytest.raises(PolicyError, match=what + ".*COST_CAPS"):
        _send(PartyAgent(0, 3, policy=EVERYTHING), argv)
