r"""A Flower run with a ``--config`` file: its text travels in the run config
(``config``), every party and the server read it with the command line's reader, each
party imports only its own objective -- after its policy allowed it, with its domain --
and the server none; the run ends as ``botorch-fed run --config`` does in process.

The ServerApp's program, the ``ClientApp`` and the party agents run over the in-memory
grid (tests/helpers/fake_grid.py); no Flower processes. The fixture
:func:`who_prepares` records whose run (a party's or the server's) each import
happens in."""

from __future__ import annotations

import json
import re
import sys
import threading

import pytest
import torch

pytest.importorskip("flwr")

from botorch_fed.cli import main  # noqa: E402
from botorch_fed.flower.agent import PartyAgent  # noqa: E402
from botorch_fed.flower.policy import PartyPolicy, PolicyError  # noqa: E402
from botorch_fed.flower.run_options import (  # noqa: E402
    CONFIG_LABEL,
    MAX_CONFIG_CHARS,
    RUN_CONFIG_DEFAULTS,
    decode_config,
    prepare,
    split_config,
)
from botorch_fed.flower.transport import ClientFailed  # noqa: E402
from botorch_fed.runs import black_box  # noqa: E402
from botorch_fed.runs.black_box import ImportedObjective, RemoteObjective  # noqa: E402
from tests.helpers import fake_grid  # noqa: E402
from tests.helpers.fake_grid import EXPERIMENT  # noqa: E402

pytestmark = pytest.mark.usefixtures("quiet_single_thread")

HERE = __name__  # the parties' functions below: tests.flower.test_flower_config:<name>


def site_a(X):
    r"""Party 0's black box."""
    return ((X - 0.3) ** 2).sum(-1)


def site_b(X):
    r"""Party 1's black box: another function on the same domain."""
    return (X[..., 0] - 0.7).abs() + torch.sin(3 * X[..., 1])


TWO_SITES = f"""\
bounds = [[0, 1], [-1, 1]]
seed = 3
crypto_seed = 5

[[objectives]]
function = "{HERE}:site_a"

[[objectives]]
function = "{HERE}:site_b"
name = "site B"

[settings]
num_init = 3
num_rounds = 2
num_restarts = 2
raw_samples = 16
maxiter = 15

[settings.fbo-fedgp]
support_size = 4
"""
DOMAIN = "0,1;-1,1"


def _policy(function: str, domain: str = DOMAIN) -> PartyPolicy:
    r"""The test federation's party policy, running only ``function`` on ``domain``."""
    kept = {k: getattr(EXPERIMENT, k) for k in ("allow_plaintext", "allow_crypto_seed")}
    return PartyPolicy(
        **kept,
        share_results=True,
        algorithms=("all",),
        objectives=(f"{HERE}:{function}@{domain}",),
    )


SITES = [_policy("site_a"), _policy("site_b")]  # each party runs its own function only

_CURRENT = threading.local()  # (run config, party id or None) of the build running


@pytest.fixture
def who_prepares(monkeypatch):
    r"""Records, while a party agent's ``_build`` or the server's ``run_on_flower`` runs,
    whose run it is (the party's id; ``None`` on the server), for :func:`imports_seen`."""

    def within(fn, which):
        def wrapped(*args, **kwargs):
            _CURRENT.value = which(*args)
            try:
                return fn(*args, **kwargs)
            finally:
                _CURRENT.value = None

        return wrapped

    build = within(
        PartyAgent._build, lambda agent, run_config, *_: (run_config, agent.partition_id)
    )
    run = within(fake_grid.run_on_flower, lambda grid, run_config, *_: (run_config, None))
    monkeypatch.setattr(PartyAgent, "_build", build)
    monkeypatch.setattr(fake_grid, "run_on_flower", run)


@pytest.fixture
def imports_seen(monkeypatch):
    r"""``[(who, MODULE:FUNCTION)]`` of every user's function imported: ``who`` is the
    importing party's id, ``None`` for the server (or a test's own call)."""
    seen: list = []
    real = black_box.import_callable

    def recording(spec, where):
        current = getattr(_CURRENT, "value", None)
        seen.append((None if current is None else current[1], spec))
        return real(spec, where)

    monkeypatch.setattr(black_box, "import_callable", recording)
    return seen


def _comparable(data: dict) -> dict:
    r"""A run's JSON without what differs between transports (as
    tests/helpers/flower_runs.comparable)."""
    out = dict(data)
    for key in ("time_s", "versions"):
        out.pop(key)
    ledger = out.pop("ledger")
    out["rounds"] = [[r["round"], sorted(r["stage_s"])] for r in ledger["rounds"]]
    return json.loads(json.dumps(out))


def _in_process(tmp_path, algorithm: str, text: str, *flags: str) -> dict:
    r"""``botorch-fed run <algorithm> --config <file with text> <flags>``'s JSON."""
    config, out = tmp_path / "run.toml", tmp_path / "in_process.json"
    config.write_text(text)
    assert main(["run", algorithm, "--config", str(config), *flags, "--out", str(out)]) == 0
    return json.loads(out.read_text())


# --- the same run as in process ---------------------------------------------------------
@pytest.mark.parametrize(
    "algorithm, flags",
    [("fbo-fedgp", ["--aggregator", "plaintext"]), ("local", []), ("random", [])],
)
def test_two_parties_with_their_own_objectives_end_as_the_in_process_run(
    algorithm, flags, tmp_path, who_prepares, imports_seen
):
    expected = _in_process(tmp_path, algorithm, TWO_SITES, *flags)
    imports_seen.clear()
    argv = [algorithm, *flags]
    result, _ = fake_grid.flower_run(argv, tmp_path, config_text=TWO_SITES, policy=SITES)
    assert _comparable(result.to_dict()) == _comparable(expected)
    names = [o["name"] for o in expected["config"]["setup"]["objectives"]]
    assert names == [f"{HERE}:site_a", "site B"] and result.evaluations
    assert set(result.best_per_client) == {0, 1}
    # each party imported its own function, once; the server and the submitter none
    assert sorted(set(imports_seen)) == [(0, f"{HERE}:site_a"), (1, f"{HERE}:site_b")]


def test_the_run_config_declares_the_config_key():
    assert RUN_CONFIG_DEFAULTS["config"] == ""
    assert decode_config({}) is None and decode_config({"config": ""}) is None
    assert decode_config({"config": TWO_SITES}) == TWO_SITES


# --- each party imports its own objective only, the server none ---------------------------
MISSING = """\
bounds = "0,1;-1,1"
[[objectives]]
function = "{a}"
[[objectives]]
function = "no_such_module_of_party_1:f"
name = "theirs"
"""


def test_a_party_imports_only_its_own_objective_and_the_server_none(monkeypatch):
    text = MISSING.format(a=f"{HERE}:site_a")
    own = prepare(["local"], config_text=text, imports=0).setup.make_objectives()
    assert [type(o) for o in own] == [ImportedObjective, RemoteObjective]
    assert own[0].fn is site_a and own[0].source == f"{HERE}:site_a"
    with pytest.raises(RuntimeError, match="'theirs'.*evaluated by its own client only"):
        own[1].evaluate(torch.rand(2, 2, dtype=torch.float64))
    with pytest.raises(ValueError, match="cannot import module 'no_such_module_of_party_1'"):
        prepare(["local"], config_text=text, imports=1)  # party 1 needs its module
    server = prepare(["local"], config_text=MISSING.format(a="nor_this_one:f"), imports=None)
    assert all(isinstance(o, RemoteObjective) for o in server.setup.make_objectives())
    assert [o.name for o in server.setup.make_objectives()] == ["nor_this_one:f", "theirs"]
    # every view describes the run alike (what the results and the scoring read)
    views = [prepare(["local"], config_text=text, imports=i) for i in (None, 0)]
    assert views[0].setup.describe() == views[1].setup.describe()


def test_a_shared_objective_table_is_every_party_own(monkeypatch):
    text = f'bounds = "{DOMAIN}"\nclients = 3\nobjective = {{ function = "{HERE}:site_b" }}\n'
    for party in (0, 2):
        run = prepare(["local"], config_text=text, imports=party)
        assert all(o.fn is site_b for o in run.setup.make_objectives())
    run = prepare(["local"], config_text=text, imports=None)
    assert all(isinstance(o, RemoteObjective) for o in run.setup.make_objectives())


# --- a party's policy decides on every table it would import, before importing it ---------
@pytest.fixture
def party_module(tmp_path, monkeypatch):
    r"""``(module name, marker)``: a party's module that leaves ``marker`` behind when
    it is imported."""
    name = f"party_box_{tmp_path.name.replace('-', '_')}"
    marker = tmp_path / "imported"
    (tmp_path / f"{name}.py").write_text(
        f"open({str(marker)!r}, 'w').close()\ndef f(X):\n    return X.sum(-1)\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name, marker
    sys.modules.pop(name, None)


def _config(function: str, bounds: str = DOMAIN, extra: str = "", kwargs: str = "") -> str:
    table = f'function = "{function}"\n' + (f"kwargs = {kwargs}\n" if kwargs else "")
    return (
        f'bounds = "{bounds}"\nseed = 1\n{extra}\n[[objectives]]\n{table}'
        f'[[objectives]]\nfunction = "{HERE}:site_b"\n[settings]\nnum_init = 2\nnum_rounds = 1\n'
    )


def _init(agent: PartyAgent, text: str, argv=("local",)):
    r"""The run's first message as the ClientApp forwards it, with the config's text."""
    config = {"argv": json.dumps(list(argv)), "keyset": "", "config": text}
    return agent.answer({"run": 1, "type": "init", "config": config}, {})


@pytest.mark.parametrize(
    "allowed, text, message",
    [
        # an objective the party does not run
        ("{m}:g@0,1;-1,1", _config("{m}:f"), "`objectives\\[0\\].function` in the run's config: "
         "The run names the objective '{m}:f', which this party does not run"),
        # its objective on another domain than the one the party pinned
        ("{m}:f@0,1;-1,1", _config("{m}:f", bounds="0,1;-5,1"),
         "--bounds '0,1;-5,1' for the objective '{m}:f', which this party runs only on its "
         "own domain '0,1;-1,1'"),
        ("{m}:f@0,1;-1,1", _config("{m}:f", bounds="0,1;-1,1;0,1"), "its own domain"),
        ("{m}:f@0,1;-1,1", _config("{m}:f", extra="maximize = true"), "--maximize for"),
        # arguments the server chooses for the party's code
        ("{m}:f@0,1;-1,1", _config("{m}:f", kwargs="{{ path = '/etc/passwd' }}"),
         "`objectives\\[0\\].kwargs` in the run's config: the run gives this party's function "
         "arguments"),
    ],
)  # fmt: skip
def test_a_party_refuses_an_objective_or_domain_its_policy_does_not_allow_before_importing_it(
    allowed, text, message, party_module, who_prepares
):
    name, marker = party_module
    agent = PartyAgent(0, 2, policy=PartyPolicy(objectives=(allowed.format(m=name),)))
    with pytest.raises(PolicyError, match=message.format(m=name)):
        _init(agent, text.format(m=name))
    assert not marker.exists(), "the party imported an objective its policy refuses"
    assert name not in sys.modules


def test_a_party_runs_the_objective_its_policy_allows(party_module, who_prepares):
    name, marker = party_module
    agent = PartyAgent(0, 2, policy=PartyPolicy(objectives=(f"{name}:f@{DOMAIN}",)))
    meta, _ = _init(agent, _config(f"{name}:f"))
    assert meta["ok"] and marker.exists()
    # the other party's function is not this party's business: site_b is not allowed here


def test_the_config_list_bounds_are_the_pinned_domain(party_module, who_prepares):
    name, _ = party_module
    agent = PartyAgent(0, 2, policy=PartyPolicy(objectives=(f"{name}:f@{DOMAIN}",)))
    text = _config(f"{name}:f").replace(f'bounds = "{DOMAIN}"', "bounds = [[0, 1], [-1, 1]]")
    assert _init(agent, text)[0]["ok"]


def test_a_refusing_party_stops_the_flower_run_naming_itself(tmp_path, who_prepares):
    # party 1 runs site_a only: the run's table for it names site_b
    with pytest.raises(ClientFailed, match="site_b', which this party does not run"):
        fake_grid.flower_run(["local"], tmp_path, config_text=TWO_SITES, policy=[SITES[0]] * 2)


def test_the_submitter_asks_each_party_policy_without_importing(party_module):
    r"""What ``flower run`` checks before it submits (``_refused_by_a_party``): party
    ``i``'s policy on party ``i``'s table, with nothing imported on its machine."""
    name, marker = party_module
    text = _config(f"{name}:f")
    policies = [PartyPolicy(objectives=(f"{name}:f@{DOMAIN}",)), SITES[1]]
    for i, policy in enumerate(policies):
        run = prepare(
            ["local"],
            check=lambda args, i=i, policy=policy: policy.check_options(args, client=i),
            outputs=True,
            config_text=text,
            imports=None,
        )
        assert all(isinstance(o, RemoteObjective) for o in run.setup.make_objectives())
    with pytest.raises(PolicyError, match=f"'{name}:f', which this party does not run"):
        prepare(
            ["local"],
            check=lambda args: SITES[1].check_options(args, client=0),
            config_text=text,
            imports=None,
        )
    assert not marker.exists()


# --- what a party tells the server ------------------------------------------------------
def test_a_party_module_that_fails_is_not_described_to_the_server(
    tmp_path, monkeypatch, who_prepares
):
    r"""The party's own module: what is wrong with it (its error, its folder, its
    function's parameters) stays in its agent's log."""
    name = f"private_box_{tmp_path.name.replace('-', '_')}"
    secret = "CLINICAL-TRIAL-7"
    (tmp_path / f"{name}.py").write_text(f"raise RuntimeError({secret!r})\n")
    (tmp_path / f"{name}_sig.py").write_text("def f(X, private_dose):\n    return X.sum(-1)\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    for module, hidden in ((name, secret), (f"{name}_sig", "private_dose")):
        agent = PartyAgent(0, 2, policy=PartyPolicy(objectives=(f"{module}:f@{DOMAIN}",)))
        config = {"argv": json.dumps(["local"]), "keyset": "", "config": _config(f"{module}:f")}
        meta, _ = agent.reply({"run": 1, "type": "init", "config": config}, {})
        assert not meta["ok"] and "cannot load the run's objective" in meta["error"]
        assert hidden not in meta["error"] and str(tmp_path) not in meta["error"]
        sys.modules.pop(module, None)


# --- malformed and oversized configs ------------------------------------------------------
def test_an_oversized_config_is_refused_everywhere(tmp_path, who_prepares):
    huge = "# padding\n" * (MAX_CONFIG_CHARS // 10 + 1)
    cap = f"more than the {MAX_CONFIG_CHARS} a run's config may have"
    with pytest.raises(ValueError, match=f"`config` has {len(huge)} characters, {cap}"):
        decode_config({"config": huge})
    with pytest.raises(ValueError, match=cap):
        prepare(["local"], config_text=huge, imports=None)
    with pytest.raises(ValueError, match=cap):
        _init(PartyAgent(0, 2, policy=SITES[0]), huge)
    big = tmp_path / "big.toml"
    big.write_text(huge)
    with pytest.raises(ValueError, match=f"--config {big} is larger than the {MAX_CONFIG_CHARS}"):
        split_config(["local", "--config", str(big)])


@pytest.mark.parametrize(
    "text, message",
    [
        ("this is = not toml", "the run's config is not valid TOML"),
        ("a = " + "[" * 2000 + "]" * 2000, "the run's config is not valid TOML: nested too deeply"),
        ("seed = " + "9" * 5000, "the run's config is not valid TOML"),
        ("rounds = 3", "the run's config: unknown key `rounds`"),
        ("resume = 'ck'", "--resume is a command-line option only"),
        ("config = 'other.toml'", "--config is a command-line option only"),
        ("seed = 'zero'", "`seed` in the run's config must be an integer"),
        ('out = "r.json"', "`out` in the run's config: a Flower run's config names no file"),
        ('plot = "r.png"', "`plot` in the run's config: a Flower run's config names no file"),
        ('checkpoint = "ck"', "`checkpoint` in the run's config: .*checkpoints are not written"),
        ('bounds = "0,1"\n[[objectives]]\nfn = "m:f"',
         "`objectives\\[0\\].fn` in the run's config"),
    ],
)  # fmt: skip
def test_a_malformed_config_is_refused_naming_the_key(text, message, who_prepares):
    with pytest.raises(ValueError, match=message):
        prepare(["local"], config_text=text, imports=None)
    # a party refuses it with the same words (a refusal the server may read)
    with pytest.raises(ValueError, match=message):
        _init(PartyAgent(0, 1, policy=EXPERIMENT), text)


def test_a_deeply_nested_config_is_refused_whatever_the_recursion_limit(who_prepares):
    # other libraries raise the interpreter's recursion limit; the refusal must not depend on it
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(20_000)
    try:
        for depth in (17, 2000):
            text = "a = " + "[" * depth + "]" * depth
            with pytest.raises(ValueError, match="not valid TOML: nested too deeply"):
                prepare(["local"], config_text=text, imports=None)
    finally:
        sys.setrecursionlimit(limit)
    prepare(["local"], config_text="bounds = [[0, 1]]\nseed = 1", imports=None)


def test_a_config_with_more_clients_than_tables_is_refused():
    text = f'bounds = "0,1"\nclients = 3\n[[objectives]]\nfunction = "{HERE}:site_a"\n'
    message = "`clients` in the run's config 3 but the run's config has 1 \\[\\[objectives\\]\\]"
    with pytest.raises(ValueError, match=message):
        prepare(["local"], config_text=text, imports=None)


def test_a_config_that_is_not_text_is_refused():
    with pytest.raises(ValueError, match="`config` must be the text of a TOML file.*int"):
        decode_config({"config": 3})


def test_the_options_name_no_config_file():
    with pytest.raises(ValueError, match="--config is not available on Flower.*`config`"):
        prepare(["local", "--config", "run.toml"])


# --- the submitter's side -----------------------------------------------------------------
@pytest.mark.parametrize(
    "given",
    [["--config", "{f}"], ["--config={f}"], ["--conf", "{f}"], ["--con={f}"]],
)
def test_split_config_takes_the_file_out_of_the_options(given, tmp_path):
    path = tmp_path / "run.toml"
    path.write_text(TWO_SITES)
    argv = ["local", "--seed", "4", *[g.format(f=path) for g in given], "--num-rounds", "1"]
    rest, file, text = split_config(argv)
    assert rest == ["local", "--seed", "4", "--num-rounds", "1"]
    assert file == str(path) and text == TWO_SITES
    # the submitter's messages name its file; the run's do not
    with pytest.raises(ValueError, match=re.escape(f"`seed` in {path} must be an integer")):
        prepare(rest, config_text="seed = 'x'", config_file=file, outputs=True, imports=None)
    assert split_config(["local", "--seed", "4"]) == (["local", "--seed", "4"], None, None)


def test_split_config_refuses_a_missing_file(tmp_path):
    with pytest.raises(ValueError, match="nope.toml: no such file"):
        split_config(["local", "--config", str(tmp_path / "nope.toml")])
    assert CONFIG_LABEL == "the run's config"
