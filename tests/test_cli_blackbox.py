r"""``botorch-fed run`` on the user's own black box: ``--objective module:function
--bounds ...``, per-client functions in a ``--config`` TOML file, failed evaluations,
``--checkpoint`` / ``--resume``, and the examples of the documentation's "Your own black
box" page."""

from __future__ import annotations

import itertools
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from botorch_fed.algorithms import (
    FedZeroSettings,
    LDPBOSettings,
    available_algorithms,
    get_algorithm,
)
from botorch_fed.cli import main

TINY = ["--clients", "3", "--init", "3", "--rounds", "2"]
_counter = itertools.count()

USER_MODULE = """
import torch

def loss(X):
    return ((X - 0.25) ** 2).sum(-1)

def shifted(X, center=0.0, scale=1.0):
    return scale * ((X - center) ** 2).sum(-1, keepdim=True)

def flaky(X):
    if float(X[0, 0]) > 0.5:
        raise RuntimeError("simulator crashed")
    return X.sum(-1)

def always_nan(X):
    return torch.full((X.shape[0],), float("nan"))

def wrong_shape(X):
    return torch.zeros(X.shape[0], 2)

def two_arguments(X, Y):
    return X.sum(-1)

NOT_CALLABLE = 3

class Lab:
    @staticmethod
    def run(X):
        return X.sum(-1)

def markup(X):
    if float(X[0, 0]) > 0.5:
        raise RuntimeError("[/] [bold]not markup[/bold] [red]")
    return X.sum(-1)

def warns(X):
    import warnings
    warnings.warn("the simulator mesh is coarse")
    return X.sum(-1)

CALLS = []

def stops(X):  # Ctrl-C after STOP_AFTER evaluations (if set)
    import os
    CALLS.append(1)
    if os.environ.get("STOP_AFTER") and len(CALLS) > int(os.environ["STOP_AFTER"]):
        raise KeyboardInterrupt
    return ((X - 0.25) ** 2).sum(-1)
"""


@pytest.fixture(autouse=True)
def wide_console(monkeypatch):
    r"""rich wraps at 80 columns off a terminal: wide enough for whole messages."""
    monkeypatch.setenv("COLUMNS", "250")


@pytest.fixture
def mod(tmp_path, monkeypatch) -> str:
    r"""A fresh user module in the (new) current directory; its unique name."""
    name = f"user_bb_{next(_counter)}_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(USER_MODULE)
    monkeypatch.chdir(tmp_path)
    return name


def output(capsys) -> str:
    captured = capsys.readouterr()
    return captured.out + captured.err


def write_config(tmp_path: Path, text: str, name: str = "run.toml") -> str:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return str(path)


# ----------------------------------------------------------------------- --objective


@pytest.mark.parametrize("algorithm", available_algorithms())
def test_objective_runs_with_every_algorithm(algorithm, mod, tmp_path, capsys):
    out = tmp_path / "r.json"
    extra = ["--support", "4"] if algorithm == "fbo-fedgp" else []
    tiny = TINY
    if get_algorithm(algorithm).settings_class is FedZeroSettings:
        # no initial design; no declared Lipschitz constant: the step and radius are given
        tiny = ["--clients", "3", "--rounds", "2"]
        extra = ["--eta", "0.01", "--h", "0.01", "--record-points"]
    if get_algorithm(algorithm).settings_class is LDPBOSettings:
        # no initial design; a user's own black box declares B and R on the command line
        tiny = ["--clients", "3", "--rounds", "2"]
        extra = ["--reward-bound", "20", "--noise-bound", "0", "--plays-per-epoch", "1"]
    args = ["run", algorithm, "--objective", f"{mod}:loss", "--bounds", "0,1; -2,2", *tiny,
            *extra, "--out", str(out)]  # fmt: skip
    assert main(args) == 0, output(capsys)
    text = capsys.readouterr().out
    assert f"{algorithm} on {mod}:loss (2-D, minimised), 3 clients, 2 rounds" in text
    data = json.loads(out.read_text())
    assert data["problem"] == f"{mod}:loss" and data["minimize"] is True
    assert data["optimal_value"] is None and data["regret_per_round"] is None
    assert data["best_value"] == min(v for v in data["best_per_round"] if v is not None)
    x = data["best_point"]
    assert 0 <= x[0] <= 1 and -2 <= x[1] <= 2
    assert data["best_value"] == pytest.approx((x[0] - 0.25) ** 2 + (x[1] - 0.25) ** 2)
    assert data["config"]["setup"]["objectives"][0]["bounds"] == [[0.0, -2.0], [1.0, 2.0]]
    assert data["config"]["setup"]["num_clients"] == 3


def test_maximize_and_dotted_attributes(mod, tmp_path, capsys):
    out, plot = tmp_path / "r.json", tmp_path / "r.png"
    args = ["run", "random", "--objective", f"{mod}:Lab.run", "--bounds", "0,1;0,1", *TINY,
            "--maximize", "--out", str(out), "--plot", str(plot)]  # fmt: skip
    assert main(args) == 0
    assert "maximised" in capsys.readouterr().out
    data = json.loads(out.read_text())
    assert data["minimize"] is False and data["best_value"] == max(data["best_per_round"])
    assert data["best_value"] == pytest.approx(sum(data["best_point"]))
    assert plot.stat().st_size > 1000


def test_failed_evaluations_are_listed(mod, tmp_path, capsys):
    out = tmp_path / "r.json"
    args = ["run", "random", "--objective", f"{mod}:flaky", "--bounds", "0,1;0,1", *TINY,
            "--out", str(out)]  # fmt: skip
    assert main(args) == 0
    text = capsys.readouterr().out
    failures = json.loads(out.read_text())["failures"]
    assert failures, "the seed should hit x0 > 0.5"
    assert re.search(rf"failed evaluations\s*│\s*{len(failures)}\b", text)
    assert f"failed evaluations (first {min(5, len(failures))} of {len(failures)}" in text
    assert "RuntimeError: simulator crashed" in text
    first = failures[0]
    assert f"[{first['x'][0]:.4g}, {first['x'][1]:.4g}]" in text


def test_every_evaluation_failing_is_reported_not_plotted(mod, tmp_path, capsys):
    out, plot = tmp_path / "r.json", tmp_path / "r.png"
    args = ["run", "random", "--objective", f"{mod}:always_nan", "--bounds", "0,1", *TINY,
            "--out", str(out), "--plot", str(plot)]  # fmt: skip
    assert main(args) == 1  # a run that learnt nothing is not a success
    captured = capsys.readouterr()
    text = captured.out
    assert "none (every evaluation failed)" in text and "none (all failed)" in text
    assert "every evaluation failed (the first: non-finite value nan)" in captured.err
    assert "no plot written" in text and not plot.exists()
    data = json.loads(out.read_text())
    assert data["best_value"] is None and len(data["failures"]) == 3 * (3 + 2)


def test_fail_on_error_stops_the_run_with_exit_1(mod, capsys):
    args = ["run", "random", "--objective", f"{mod}:flaky", "--bounds", "0,1;0,1", *TINY,
            "--fail-on-error"]  # fmt: skip
    assert main(args) == 1
    text = output(capsys)
    assert "simulator crashed" in text and "Client" in text and "Traceback" not in text


def test_a_wrong_return_shape_stops_the_run_with_exit_1(mod, capsys):
    args = ["run", "random", "--objective", f"{mod}:wrong_shape", "--bounds", "0,1", *TINY]
    assert main(args) == 1
    assert "returned shape (1, 2)" in output(capsys)


def test_black_box_text_is_printed_verbatim_and_the_results_kept(mod, tmp_path, capsys):
    r"""Error messages and names of the user's black box are not console markup: a stray
    ``[/]`` in them neither crashes the table after the run nor keeps --out from being
    written."""
    out = tmp_path / "r.json"
    args = ["run", "random", "--objective", f"{mod}:markup", "--bounds", "0,1;0,1", *TINY,
            "--out", str(out)]  # fmt: skip
    assert main(args) == 0, output(capsys)
    text = capsys.readouterr().out
    assert "RuntimeError: [/] [bold]not markup[/bold] [red]" in text
    assert json.loads(out.read_text())["failures"]


def test_objective_names_are_printed_verbatim(mod, tmp_path, capsys):
    shared = write_config(
        tmp_path, f'objective = {{ function = "{mod}:loss", name = "[/] lab [red]" }}\n'
        'bounds = "0,1"\n', "shared.toml")  # fmt: skip
    assert main(["run", "random", "--config", shared, *TINY]) == 0, output(capsys)
    assert "random on [/] lab [red] (1-D, minimised)" in capsys.readouterr().out
    per_client = write_config(tmp_path, 'bounds = "0,1"\n' + "".join(
        f'[[objectives]]\nfunction = "{mod}:loss"\nname = "[bold]site {i}[/]"\n' for i in range(3)
    ), "clients.toml")  # fmt: skip
    assert main(["run", "random", "--config", per_client, *TINY[2:]]) == 0, output(capsys)
    text = capsys.readouterr().out
    assert all(f"[bold]site {i}[/]" in text for i in range(3)), text


def test_the_black_boxs_warnings_are_shown(mod):
    r"""Only the libraries' numerical advice is silenced during a run."""
    args = ["run", "random", "--objective", f"{mod}:warns", "--bounds", "0,1", *TINY]
    with pytest.warns(UserWarning, match="the simulator mesh is coarse"):
        assert main(args) == 0


def test_a_failing_run_exits_1_and_keeps_the_torch_threads(mod, monkeypatch, capsys):
    r"""An error inside a run whose arguments were valid is not "invalid arguments"."""
    import torch

    import botorch_fed.protocol.runner as runner

    def broken(*args, **kwargs):
        raise ValueError("singular matrix in round 7")

    monkeypatch.setattr(runner, "run_federated", broken)
    threads = torch.get_num_threads()
    args = ["run", "random", "--objective", f"{mod}:loss", "--bounds", "0,1", *TINY,
            "--threads", str(threads + 1)]  # fmt: skip
    assert main(args) == 1
    text = output(capsys)
    assert "the run failed: ValueError: singular matrix in round 7" in text
    assert torch.get_num_threads() == threads


def test_results_that_cannot_be_written_after_the_run_exit_1(mod, tmp_path, monkeypatch, capsys):
    import botorch_fed.cli.run as cli_run

    def full_disk(data, path):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(cli_run, "write_json", full_disk)
    out = tmp_path / "r.json"
    args = ["run", "random", "--objective", f"{mod}:loss", "--bounds", "0,1", *TINY,
            "--out", str(out)]  # fmt: skip
    assert main(args) == 1
    text = output(capsys)
    assert "best value (federation)" in text  # the tables are still printed
    assert f"--out {out}: the results could not be written" in text
    assert "No space left on device" in text and "Traceback" not in text


def test_out_is_written_atomically(tmp_path):
    from botorch_fed.runs.outputs import write_json

    path = tmp_path / "r.json"
    path.write_text('{"old": 1}')
    with pytest.raises(TypeError):
        write_json({"x": object()}, str(path))
    assert json.loads(path.read_text()) == {"old": 1}  # untouched, no temporary left
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]
    write_json({"new": 2}, str(path))
    assert json.loads(path.read_text()) == {"new": 2}


def _write_bad_modules(tmp_path: Path, mod: str) -> None:
    (tmp_path / f"{mod}_broken.py").write_text("raise RuntimeError('no licence server')\n")
    (tmp_path / f"{mod}_syntax.py").write_text("def loss(X)\n    return X\n")
    (tmp_path / f"{mod}_dep.py").write_text("import no_such_dependency_xyz\n")


@pytest.mark.parametrize(
    "args, messages",
    [
        (["--objective", "{mod}:loss", "--problem", "branin", "--bounds", "0,1"],
         ["`--objective` and `--problem` are exclusive"]),
        (["--objective", "{mod}:loss"], ["`--objective`", "needs the domain: `--bounds`"]),
        (["--objective", "{mod}:loss", "--bounds", "0,1;1"],
         ["`--bounds` '0,1;1'", "dimension 1 is '1'"]),
        (["--objective", "{mod}:loss", "--bounds", "0,1;a,b"], ["`--bounds`", "dimension 1"]),
        (["--objective", "{mod}:loss", "--bounds", "0,1,2"], ["`--bounds`", "dimension 0"]),
        (["--objective", "{mod}:loss", "--bounds", ""], ["`--bounds`", "lower,upper"]),
        (["--objective", "{mod}:loss", "--bounds", "0,1;1,0"],
         ["--bounds", "lower bound must be below its upper bound", "dimension(s) [1]"]),
        (["--objective", "{mod}:loss", "--bounds", "0,inf"], ["--bounds", "finite"]),
        (["--objective", "no_such_module_xyz:loss", "--bounds", "0,1"],
         ["`--objective` 'no_such_module_xyz:loss'", "cannot import module 'no_such_module_xyz'",
          "current directory"]),
        (["--objective", "{mod}_broken:loss", "--bounds", "0,1"],
         ["`--objective`", "importing module", "RuntimeError: no licence server"]),
        (["--objective", "{mod}_syntax:loss", "--bounds", "0,1"], ["`--objective`", "SyntaxError"]),
        (["--objective", "{mod}_dep:loss", "--bounds", "0,1"],
         ["`--objective`", "importing module", "no_such_dependency_xyz"]),
        (["--objective", "{mod}:los", "--bounds", "0,1"],
         ["`--objective`", "has no attribute 'los'", "Did you mean loss"]),
        (["--objective", "{mod}:NOT_CALLABLE", "--bounds", "0,1"],
         ["`--objective`", "is of type int, not a function"]),
        (["--objective", "{mod}", "--bounds", "0,1"], ["`--objective`", "MODULE:FUNCTION"]),
        (["--objective", "{mod}:two_arguments", "--bounds", "0,1"],
         ["`--objective`", "cannot be called as", "Y"]),
        (["--objective", "{mod}:loss", "--bounds", "0,1", "--shift", "0.1"],
         ["`--shift` applies to built-in problems only"]),
        (["--objective", "{mod}:loss", "--bounds", "0,1", "--noise-std", "0.1"],
         ["`--noise-std` applies to built-in problems only"]),
        (["--objective", "{mod}:loss", "--bounds", "0,1", "--dim", "3"],
         ["`--dim`=3 but the objective", "d=1"]),
        (["--objective", "{mod}:loss", "--bounds", "0,1", "--clients", "2",
          "--aggregator", "masking"], ["`--clients`=2", "at least 3 clients"]),
    ],
)  # fmt: skip
def test_bad_objective_arguments_exit_2_naming_the_flag(args, messages, mod, tmp_path, capsys):
    _write_bad_modules(tmp_path, mod)
    args = [a.format(mod=mod) for a in args]
    assert main(["run", "fbo-fedgp", "--rounds", "1", *args]) == 2
    text = output(capsys)
    for message in messages:
        assert message in text, (message, text)
    assert "Traceback" not in text


def test_objective_modules_are_imported_from_the_current_directory(tmp_path, monkeypatch, capsys):
    r"""Not from the folder the test runs in: the import path is the current directory
    of the command, restored afterwards."""
    import sys

    name = f"cwd_only_{tmp_path.name.replace('-', '_')}"
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / f"{name}.py").write_text("def f(X):\n    return X.sum(-1)\n")
    monkeypatch.chdir(tmp_path)
    before = list(sys.path)
    args = ["run", "random", "--objective", f"{name}:f", "--bounds", "0,1", *TINY]
    assert main(args) == 2 and "cannot import module" in output(capsys)
    monkeypatch.chdir(tmp_path / "sub")
    assert main(args) == 0
    assert sys.path == before


# ----------------------------------------------------------------------- --config


HETEROGENEOUS = """\
    # two different black boxes over one domain, three clients
    bounds = [[0, 1], [-1, 1]]
    seed = 1

    [[objectives]]
    function = "{mod}:shifted"
    kwargs = {{ center = 0.2 }}

    [[objectives]]
    function = "{mod}:shifted"
    kwargs = {{ center = -0.2, scale = 2.0 }}
    name = "site B"

    [[objectives]]
    function = "{mod}:loss"

    [settings]
    num_init = 3
    num_rounds = 2

    [settings.fbo-fedgp]
    support_size = 4
"""


def test_config_with_per_client_functions(mod, tmp_path, capsys):
    config = write_config(tmp_path, HETEROGENEOUS.format(mod=mod))
    out = tmp_path / "r.json"
    args = ["run", "fbo-fedgp", "--config", config, "--aggregator", "masking", "--out", str(out)]
    assert main(args) == 0, output(capsys)
    text = capsys.readouterr().out
    assert "site B" in text and "3 client objectives" in text
    data = json.loads(out.read_text())
    setup, settings = data["config"]["setup"], data["config"]["settings"]
    names = [o["name"] for o in setup["objectives"]]
    assert names == [f"{mod}:shifted(center=0.2)", "site B", f"{mod}:loss"]
    assert setup["num_clients"] == 3 and setup["seed"] == 1 and setup["aggregator"] == "masking"
    assert settings["support_size"] == 4 and settings["num_rounds"] == 2
    assert settings["num_init"] == 3 and len(data["best_per_round"]) == 3
    # the same file drives a baseline: [settings.fbo-fedgp] is not its business
    # and the command line overrides the file
    assert main(["run", "local", "--config", config, "--rounds", "1", "--seed", "4",
                 "--out", str(out)]) == 0  # fmt: skip
    data = json.loads(out.read_text())
    assert data["config"]["settings"]["num_rounds"] == 1 and len(data["best_per_round"]) == 2
    assert data["config"]["setup"]["seed"] == 4
    assert "support_size" not in data["config"]["settings"]


def test_config_with_a_shared_objective_in_another_folder(tmp_path, monkeypatch, capsys):
    r"""Modules next to the config file are found too; `minimize = false` maximises."""
    name = f"shared_{tmp_path.name.replace('-', '_')}"
    (tmp_path / "exp").mkdir()
    (tmp_path / "exp" / f"{name}.py").write_text("def gain(X):\n    return -(X ** 2).sum(-1)\n")
    config = write_config(
        tmp_path / "exp",
        f"""\
        objective = "{name}:gain"
        bounds = "-1,1;-1,1"
        minimize = false
        clients = 4
        aggregator = "masking"  # algorithms without secure aggregation skip it
        [settings]
        num_init = 2
        num_rounds = 1
        """,
    )
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "r.json"
    assert main(["run", "random", "--config", config, "--out", str(out)]) == 0, output(capsys)
    data = json.loads(out.read_text())
    assert data["minimize"] is False and data["config"]["setup"]["num_clients"] == 4
    assert data["best_value"] == max(data["best_per_round"])
    # the command line's --problem replaces the file's black box (and its domain)
    assert main(["run", "random", "--config", config, "--problem", "branin",
                 "--out", str(out)]) == 0  # fmt: skip
    data = json.loads(out.read_text())
    assert data["problem"] == "Branin" and data["minimize"] is True


@pytest.mark.parametrize(
    "text, messages",
    [
        ("rounds = 3", ["unknown key `rounds`"]),
        ("num_rounds = 3", ["unknown key `num_rounds`", "`settings.num_rounds`"]),
        ("resume = 'ckpt'", ["unknown key `resume`", "command-line option only"]),
        ('seed = "zero"', ["`seed` in {path} must be an integer, got 'zero'"]),
        ("clients = 2.5", ["`clients` in {path} must be an integer"]),
        ("init_regions = 1", ["`init_regions` in {path} must be true or false"]),
        ("[settings]\nsupport_size = 8",
         ["`settings.support_size` in {path}", "local has no setting `support_size`"]),
        ("[settings.fbo-fedgp]\nsupportsize = 8",
         ["`settings.fbo-fedgp.supportsize` in {path}", "Did you mean `support_size`"]),
        ("[settings.nope]\nnum_rounds = 1", ["[settings.nope] in {path}", "'nope'"]),
        ("[settings]\nnum_rounds = '3'", ["`settings.num_rounds` in {path} must be an integer"]),
        ("[settings]\nacquisition = 'pi'", ["`settings.acquisition` in {path} must be one of"]),
        ("[settings]\nraw_samples = 0",
         ["`settings.raw_samples` in {path}=0 must be >= 1"]),
        ("[settings]\nbeta = 'none'\nnum_init = 0",
         ["`settings.num_init` in {path}=0 must be >= 1"]),
        ("settings = 3", ["`settings` in {path} must be a table"]),
        ('problem = "branin"\nobjective = "m:f"', ["{path}: give one black box"]),
        ('problem = "branin"\nminimize = false', ["`minimize` in {path} applies to your own"]),
        ('problem = "branin"\nbounds = "0,1"', ["`bounds` in {path} applies to your own"]),
        ('minimize = "yes"', ["`minimize` in {path} must be true or false"]),
        ("minimize = true\nmaximize = false", ["{path}: give `minimize` or `maximize`"]),
        ('objective = "{mod}:loss"', ["needs the domain", "`bounds`"]),
        ('objective = "{mod}:loss"\nbounds = [[0, 1], [1]]',
         ["`bounds` in {path}: entry 1 is [1]"]),
        ('objective = "{mod}:loss"\nbounds = [[0, 1], [1, 0]]',
         ["`bounds` in {path}", "lower bound must be below"]),
        ('objective = "{mod}:nope"\nbounds = "0,1"',
         ["`objective` in {path} '{mod}:nope'", "has no attribute 'nope'"]),
        ('objective = 3', ["`objective` in {path} must be"]),
        ('objective = {{ function = "{mod}:shifted", kwargs = {{ centre = 1 }} }}\nbounds = "0,1"',
         ["`objective.kwargs` in {path}", "centre"]),
        ('bounds = "0,1"\n[[objectives]]\nfn = "{mod}:loss"', ["`objectives[0].fn` in {path}"]),
        ('bounds = "0,1"\n[[objectives]]\nfunction = "{mod}:loss"\n[[objectives]]\nname = "b"',
         ["`objectives[1].function` in {path}"]),
        ('bounds = "0,1"\n[[objectives]]\nfunction = "{mod}:loss"\nkwargs = 3',
         ["`objectives[0].kwargs` in {path} must be a table"]),
        ('bounds = "0,1"\n[[objectives]]\nfunction = "{mod}:loss"\n'
         '[[objectives]]\nfunction = "no_such_module_xyz:f"',
         ["`objectives[1].function` in {path} 'no_such_module_xyz:f'", "cannot import"]),
        ('bounds = "0,1"\nclients = 3\n[[objectives]]\nfunction = "{mod}:loss"\n'
         '[[objectives]]\nfunction = "{mod}:loss"',
         ["`clients` in {path} 3 but {path} has 2 [[objectives]] tables"]),
        ("this is = not toml", ["--config {path} is not valid TOML"]),
        ('out = "/no/such/folder/r.json"', ["`out` in {path} /no/such/folder/r.json: the folder"]),
        ("threads = 0", ["`threads` in {path}", ">= 1"]),
    ],
)  # fmt: skip
def test_bad_config_files_exit_2_naming_the_key_and_the_file(text, messages, mod, tmp_path, capsys):
    config = write_config(tmp_path, text.format(mod=mod) + "\n")
    assert main(["run", "local", "--config", config, "--rounds", "1"]) == 2
    out = output(capsys)
    for message in messages:
        assert message.format(path=config, mod=mod) in out, (message, out)
    assert "Traceback" not in out


def test_config_aggregator_is_checked_for_algorithms_that_aggregate(tmp_path, capsys):
    config = write_config(tmp_path, 'problem = "branin"\naggregator = "rot13"\n')
    assert main(["run", "fbo-fedgp", "--config", config]) == 2
    assert f"`aggregator` in {config} must be one of" in output(capsys)


def test_config_objectives_count_against_command_line_clients(mod, tmp_path, capsys):
    config = write_config(tmp_path, HETEROGENEOUS.format(mod=mod))
    assert main(["run", "local", "--config", config, "--clients", "2"]) == 2
    assert f"`--clients` 2 but {config} has 3 [[objectives]] tables" in output(capsys)


def test_missing_config_file(tmp_path, capsys):
    assert main(["run", "local", "--config", str(tmp_path / "nope.toml")]) == 2
    assert "nope.toml: no such file" in output(capsys)


# ----------------------------------------------------------------------- checkpoints


@pytest.mark.parametrize("algorithm", ["random", "local"])
def test_checkpoint_and_resume_from_the_command_line(algorithm, mod, tmp_path, capsys):
    ckpt = tmp_path / "ckpt"
    base = ["run", algorithm, "--objective", f"{mod}:loss", "--bounds", "0,1;0,1",
            "--clients", "3", "--init", "3"]  # fmt: skip
    full, part, resumed = (tmp_path / f"{n}.json" for n in ("full", "part", "resumed"))
    assert main([*base, "--rounds", "3", "--out", str(full)]) == 0
    assert main([*base, "--rounds", "1", "--checkpoint", str(ckpt), "--out", str(part)]) == 0
    assert any(ckpt.iterdir())
    capsys.readouterr()
    assert main([*base, "--rounds", "3", "--resume", str(ckpt), "--out", str(resumed)]) == 0
    assert "resumed at round 2" in capsys.readouterr().out
    a, b = json.loads(full.read_text()), json.loads(resumed.read_text())
    assert b["best_per_round"] == a["best_per_round"] and len(a["best_per_round"]) == 4
    assert b["best_point"] == a["best_point"] and b["steps"] == a["steps"]


def test_resuming_another_run_is_refused(mod, tmp_path, capsys):
    ckpt = tmp_path / "ckpt"
    base = ["run", "random", "--objective", f"{mod}:loss", "--bounds", "0,1", "--clients", "3",
            "--init", "2", "--rounds", "1"]  # fmt: skip
    assert main([*base, "--checkpoint", str(ckpt)]) == 0
    capsys.readouterr()
    assert main([*base, "--seed", "7", "--resume", str(ckpt)]) == 2
    text = output(capsys)
    assert "error:" in text and "Traceback" not in text
    assert main([*base, "--checkpoint", str(tmp_path / "no" / "such" / "dir")]) == 2
    assert "--checkpoint" in output(capsys)


def test_checkpoint_does_not_overwrite_another_runs_checkpoint(mod, tmp_path, capsys):
    ckpt = tmp_path / "ckpt"
    base = ["run", "random", "--objective", f"{mod}:loss", "--bounds", "0,1", "--clients", "3",
            "--init", "2"]  # fmt: skip
    assert main([*base, "--rounds", "1", "--checkpoint", str(ckpt)]) == 0
    before = {p.name: p.read_bytes() for p in ckpt.iterdir()}
    capsys.readouterr()
    assert main([*base, "--rounds", "1", "--seed", "3", "--checkpoint", str(ckpt)]) == 2
    text = output(capsys)
    assert f"--checkpoint {ckpt} already holds a checkpoint" in text
    assert f"--resume {ckpt}" in text
    assert {p.name: p.read_bytes() for p in ckpt.iterdir()} == before
    # continuing it, into the same folder, is what --resume is for
    assert main([*base, "--rounds", "2", "--resume", str(ckpt), "--checkpoint", str(ckpt)]) == 0


def test_an_interrupted_run_exits_130_and_resumes_from_its_checkpoint(
    mod, tmp_path, monkeypatch, capsys
):
    import sys

    ckpt = tmp_path / "ckpt"
    base = ["run", "random", "--objective", f"{mod}:stops", "--bounds", "0,1;0,1",
            "--clients", "3", "--init", "3"]  # fmt: skip
    full, never, resumed = (tmp_path / f"{n}.json" for n in ("full", "never", "resumed"))
    assert main([*base, "--rounds", "3", "--out", str(full)]) == 0
    calls = sys.modules[mod].CALLS
    assert len(calls) == 3 * 3 + 3 * 3  # one call per point
    calls.clear()
    monkeypatch.setenv("STOP_AFTER", str(3 * 3 + 2 * 3))  # Ctrl-C in round 3
    args = [*base, "--rounds", "3", "--checkpoint", str(ckpt), "--out", str(never)]
    assert main(args) == 130
    text = output(capsys)
    assert f"interrupted: every completed round is checkpointed in {ckpt}" in text
    assert f"--resume {ckpt}" in text and "Traceback" not in text and not never.exists()
    calls.clear()
    assert main([*base, "--rounds", "3"]) == 130  # without a checkpoint
    assert "nothing was saved" in output(capsys)
    monkeypatch.delenv("STOP_AFTER")
    # fewer rounds than the checkpoint holds: named by the flag
    assert main([*base, "--rounds", "1", "--resume", str(ckpt)]) == 2
    assert "beyond `--num-rounds`/`--rounds`=1" in output(capsys)
    assert main([*base, "--rounds", "3", "--resume", str(ckpt), "--out", str(resumed)]) == 0
    assert "resumed at round 3" in capsys.readouterr().out
    a, b = json.loads(full.read_text()), json.loads(resumed.read_text())
    assert b["best_per_round"] == a["best_per_round"] and b["best_point"] == a["best_point"]


# ------------------------------------------------- docs/own_black_box.md


def _readme_section() -> str:
    r"""The documentation's "Your own black box" page, up to its first subsection."""
    text = (Path(__file__).parents[1] / "docs" / "own_black_box.md").read_text()
    end = text.find("\n## ")
    return text[: end if end > 0 else None]


def test_readme_python_api_example_runs(tmp_path, monkeypatch):
    section = _readme_section()
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    api = next(b for b in blocks if "run_federated" in b)
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    exec(compile(api, "docs/own_black_box.md", "exec"), namespace)
    result = namespace["result"]
    assert result.best_value is not None and len(result.best_per_round) > 1


def test_readme_command_line_examples_run(tmp_path, monkeypatch, capsys):
    r"""The page's module and config file, with its commands (fewer rounds)."""
    section = _readme_section()
    module = next(b for b in re.findall(r"```python\n(.*?)```", section, re.S)
                  if b.startswith("# mylab.py"))  # fmt: skip
    (tmp_path / "mylab.py").write_text(module)
    toml = re.findall(r"```toml\n(.*?)```", section, re.S)[0]
    assert toml.startswith("# run.toml")
    (tmp_path / "run.toml").write_text(toml)
    monkeypatch.chdir(tmp_path)
    import sys

    sys.modules.pop("mylab", None)
    commands = [
        line.strip().removeprefix(".venv/bin/").split("#")[0]
        for line in re.findall(r"```bash\n(.*?)```", section, re.S)[0].splitlines()
        if line.strip().startswith((".venv/bin/botorch-fed", "botorch-fed"))
    ]
    assert len(commands) >= 3
    for command in commands:
        argv = command.split()[1:]
        argv = [a.strip('"') for a in argv]
        if argv[0] == "run":
            argv += ["--rounds", "1", "--init", "3"]
        assert main(argv) == 0, (command, output(capsys))
    sys.modules.pop("mylab", None)


def test_negative_lower_bound_after_a_space(mod, tmp_path):
    r"""``--bounds -2,3`` (a value starting with '-') is read as the value of --bounds."""
    out = tmp_path / "r.json"
    args = ["run", "random", "--objective", f"{mod}:loss", "--bounds", "-2,3;0,1", *TINY,
            "--out", str(out)]  # fmt: skip
    assert main(args) == 0
    data = json.loads(out.read_text())
    assert data["config"]["setup"]["objectives"][0]["bounds"] == [[-2.0, 0.0], [3.0, 1.0]]


def test_algorithm_placeholder_in_paths(mod, tmp_path):
    r"""``{algorithm}`` in --out / --checkpoint: one command line (or config file) serves
    several algorithms without one refusing the other's checkpoint."""
    for algorithm in ("random", "local"):
        args = ["run", algorithm, "--objective", f"{mod}:loss", "--bounds", "0,1;0,1", *TINY,
                "--out", str(tmp_path / "{algorithm}.json"),
                "--checkpoint", str(tmp_path / "ckpt-{algorithm}")]  # fmt: skip
        assert main(args) == 0
    for algorithm in ("random", "local"):
        assert json.loads((tmp_path / f"{algorithm}.json").read_text())["algorithm"] == algorithm
        assert (tmp_path / f"ckpt-{algorithm}" / "checkpoint.json").is_file()


# --- the config file's folder on the import path -------------------------------------
@pytest.mark.usefixtures("quiet_single_thread")
def test_config_folder_does_not_shadow_libraries(tmp_path):
    r"""The folder of a config file (and the current directory) is not put in front of
    ``sys.path`` for the run: a module planted next to a config file that names only a
    built-in problem cannot shadow a library the run imports lazily (``sympy``)."""
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
