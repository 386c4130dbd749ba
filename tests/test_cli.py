r"""The ``botorch-fed`` command line (``run`` with built-in problems, ``list``, ``demo``)
and the regression demo behind ``demo``. Your own black boxes and ``--config`` files:
``tests/test_cli_blackbox.py``."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from typing import Annotated

import numpy as np
import pytest

from botorch_fed.cli import build_parser, main
from botorch_fed.protocol.declarations import Choice
from botorch_fed.regression_demo import RegressionDemoConfig, run_regression_demo
from botorch_fed.runs.options import setting_options

SMALL = ["--clients", "3", "--points", "12", "--support", "8", "--test-points", "64"]


@pytest.fixture(autouse=True)
def wide_console(monkeypatch):
    r"""rich wraps at 80 columns off a terminal: wide enough for whole messages."""
    monkeypatch.setenv("COLUMNS", "250")


def output(capsys) -> str:
    captured = capsys.readouterr()
    return captured.out + captured.err


def test_demo_prints_table_and_writes_json(tmp_path, capsys):
    out = tmp_path / "demo.json"
    assert main(["demo", *SMALL, "--out", str(out)]) == 0
    text = capsys.readouterr().out
    for label in ("client 0 own GP", "federated dPITC", "exact GP, pooled data", "test RMSE"):
        assert label in text
    results = json.loads(out.read_text())
    rows = {r["method"].split(" (")[0]: r for r in results["rows"]}
    assert len(results["rows"]) == 3 + 2
    for r in results["rows"]:
        assert np.isfinite([r["rmse"], r["nll"], r["fit_s"], r["predict_s"]]).all()
    # pooling information helps: the federated model beats the average client
    own = np.mean([r["rmse"] for r in results["rows"] if "own GP" in r["method"]])
    assert rows["federated dPITC"]["rmse"] < own
    assert results["config"]["num_clients"] == 3


def test_demo_uses_only_the_aggregate_for_server_side_sums():
    config = RegressionDemoConfig(
        num_clients=3, points_per_client=10, support_size=6, num_test=32, fit="average"
    )
    calls = []

    def aggregate(arrays):
        calls.append(len(arrays))
        return np.sum(arrays, axis=0)

    results = run_regression_demo(config, aggregate=aggregate)
    # outcome moments (two passes), averaged hyperparameters, summaries
    assert calls == [3, 3, 3, 3]
    assert results["rows"][-2]["extra"]["aggregation_rounds"] == 4


@pytest.mark.parametrize(
    "args, message",
    [
        (["--clients", "0"], "`--clients`=0 must be >= 1"),
        (["--support", "0"], "`--support`=0"),
        (["--noise", "-1"], "`--noise`=-1.0"),
        (["--points", "1"], "`--points`=1"),
        (["--test-points", "0"], "`--test-points`=0"),
        (["--function", "no-such-function"], "`--function` no-such-function: "),
        (["--function", "branin", "--dim", "3"], "`--function` branin, `--dim` 3: "),
        (["--out", "/no/such/folder/d.json"], "--out /no/such/folder/d.json: the folder"),
    ],
)
def test_bad_demo_arguments_exit_2_naming_the_flag(args, message, capsys):
    assert main(["demo", *args]) == 2
    captured = capsys.readouterr()
    text = captured.err  # errors go to standard error, as argparse's
    assert message in text and "error" not in captured.out, text
    for name in ("num_clients", "support_size", "noise_std", "points_per_client", "num_test"):
        assert name not in text


def test_argparse_errors_exit_2(capsys):
    assert main(["demo", "--clients", "three"]) == 2
    assert "--clients" in capsys.readouterr().err
    assert main([]) == 2
    assert main(["run"]) == 2  # no algorithm
    assert main(["run", "no-such-algorithm"]) == 2
    assert "no-such-algorithm" in capsys.readouterr().err


def test_console_script_is_installed():
    proc = subprocess.run(
        [sys.executable, "-m", "botorch_fed.cli", "--version"], capture_output=True, text=True
    )
    assert proc.returncode == 0 and "botorch-fed" in proc.stdout


def test_list_prints_every_algorithm_with_its_summary(capsys):
    from botorch_fed.algorithms import available_algorithms, get_algorithm

    assert main(["list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    for name in available_algorithms():
        spec = get_algorithm(name)
        (line,) = [s for s in lines if s.split()[:1] == [name]]
        assert spec.summary in line
        assert ("yes" if spec.secure_aggregation else "no") == line.split()[1]


# ----------------------------------------------------------------------- run: options


def test_algorithm_options_come_from_its_settings_dataclass():
    import dataclasses

    from botorch_fed.algorithms import available_algorithms, get_algorithm

    parser = build_parser()
    for name in available_algorithms():
        spec = get_algorithm(name)
        _, options = parser.run_parsers[name]
        fields = {f.name for f in dataclasses.fields(spec.settings_class)}
        assert {o.field for o in options if o.field} == fields, name
        for option in setting_options(spec.settings_class):
            # help from the docstring's Attributes entry, not the fallback
            action = next(
                a
                for a in parser.run_parsers[name][0]._actions
                if option.flags[0] in a.option_strings
            )
            assert action.help and action.help != option.field.replace("_", " "), option.field
        secure = any(o.dest == "aggregator" for o in options)
        assert secure == spec.secure_aggregation, name


def test_fixed_sets_of_strings_become_choices():
    from botorch_fed.algorithms.fbo_fedgp.settings import (
        GLOBAL_BATCHES,
        HYPERPARAMETERS,
        MIXINGS,
        SUPPORTS,
        FBOFedGPSettings,
    )
    from botorch_fed.protocol.bo_client import ACQUISITIONS

    choices = {o.field: o.choices for o in setting_options(FBOFedGPSettings)}
    assert set(choices["acquisition"]) == set(ACQUISITIONS)
    assert set(choices["support"]) == set(SUPPORTS)
    assert set(choices["mixing"]) == set(MIXINGS)
    assert set(choices["hyperparameters"]) == set(HYPERPARAMETERS)
    assert set(choices["global_batch"]) == set(GLOBAL_BATCHES)
    assert choices["beta"] is None and choices["num_rounds"] is None


def _refused(cls, name, value) -> bool:
    try:
        cls(**{name: value}).validate()
    except (ValueError, TypeError):
        return True
    return False


def test_every_fixed_set_of_strings_is_declared():
    r"""The command line reads choices from a field's ``Choice`` domain only: a
    string setting of a registered algorithm that ``validate()`` restricts to some
    values (it refuses an odd string) must declare them, and they must be exactly
    values ``validate()`` accepts."""
    import dataclasses
    import typing

    from botorch_fed.algorithms import available_algorithms, get_algorithm
    from botorch_fed.runs.options import field_type

    checked = 0
    for algorithm in available_algorithms():
        cls = get_algorithm(algorithm).settings_class
        hints = typing.get_type_hints(cls)
        options = {o.field: o for o in setting_options(cls)}
        for f in dataclasses.fields(cls):
            if field_type(hints[f.name])[0] is not str:
                continue
            checked += 1
            where = f"{algorithm}: {cls.__name__}.{f.name}"
            choices = options[f.name].choices if f.name in options else None
            if _refused(cls, f.name, "no such value \x00"):
                assert choices, f"{where} takes a fixed set of strings: declare its choices"
            if choices is not None:
                assert _refused(cls, f.name, "no such value \x00"), where
                for choice in choices:
                    assert not _refused(cls, f.name, choice), (where, choice)
                default = getattr(cls(), f.name)
                # a nullable setting may default to None (e.g. left to a preset)
                assert default in choices or (default is None and field_type(hints[f.name])[1]), (
                    where
                )
            assert options[f.name].choices == (None if choices is None else tuple(choices))
    assert checked >= 5


def test_choices_are_not_guessed_from_docstrings():
    import dataclasses

    @dataclasses.dataclass
    class Settings:
        r"""Attributes:
        mode: ``"fast"`` or ``"slow"``.
        kind: ``"a"`` or ``"b"``.
        """

        mode: str = "fast"
        kind: Annotated[str, Choice(("a", "b"))] = "a"

        def validate(self) -> None:
            if self.mode not in ("fast", "slow"):
                raise ValueError("`mode`")

    choices = {o.field: o.choices for o in setting_options(Settings)}
    assert choices == {"mode": None, "kind": ("a", "b")}


def test_algorithm_help_lists_only_its_options_with_defaults(capsys):
    assert main(["run", "fbo-fedgp", "--help"]) == 0
    text = capsys.readouterr().out
    for flag in ("--support-size INT, --support INT", "--num-rounds INT, --rounds INT",
                 "--num-init INT, --init INT", "--support-selection {clustered,random,none}",
                 "--center-noise FLOAT|none",
                 "--aggregator {plaintext,ckks,masking}", "--objective", "--bounds", "--config",
                 "--checkpoint", "--resume"):  # fmt: skip
        assert flag in text, flag
    assert "(default: 16)" in text and "(default: 50)" in text and "(default: default)" in text
    assert "--preset {default,paper}" in text and "--mixing {sample,expected,global,none}" in text
    assert "[settings]" in text  # the config file's schema
    assert main(["run", "local", "--help"]) == 0
    text = capsys.readouterr().out
    assert "--num-rounds" in text and "(default: ucb)" in text
    for flag in ("--support", "--schedule", "--aggregator", "--mixing"):
        assert flag not in text, flag


@pytest.mark.parametrize(
    "args", [["--support", "4"], ["--schedule", "0.5"], ["--aggregator", "masking"]]
)
def test_baselines_refuse_fbo_fedgp_options(args, capsys):
    assert main(["run", "local", "--problem", "branin", *args]) == 2
    assert f"unrecognized arguments: {args[0]}" in capsys.readouterr().err


def test_none_sets_an_optional_setting(tmp_path):
    out = tmp_path / "r.json"
    args = ["run", "random", "--problem", "branin", "--clients", "3", "--init", "2",
            "--rounds", "1", "--beta", "none", "--out", str(out)]  # fmt: skip
    assert main(args) == 0
    assert json.loads(out.read_text())["config"]["settings"]["beta"] is None
    assert main([*args[:-2], "--beta", "2.5", "--out", str(out)]) == 0
    assert json.loads(out.read_text())["config"]["settings"]["beta"] == 2.5


# ----------------------------------------------------------------------- run: built-in problems

RUN_SMALL = [
    "--problem", "branin", "--dim", "2", "--clients", "3", "--init", "3", "--rounds", "2",
    "--support", "4",
]  # fmt: skip


def test_run_fbo_fedgp_writes_json_and_plot(tmp_path, capsys):
    out, plot = tmp_path / "r.json", tmp_path / "r.png"
    code = main(["run", "fbo-fedgp", *RUN_SMALL, "--aggregator", "masking", "--out", str(out),
                 "--plot", str(plot)])  # fmt: skip
    assert code == 0
    text = capsys.readouterr().out
    for label in ("best value (federation)", "simple regret", "time per stage", "bytes",
                  "best point", "minimised"):  # fmt: skip
        assert label in text
    data = json.loads(out.read_text())
    for key in ("best_value", "best_per_round", "regret_per_round", "time_s", "ledger",
                "config", "versions", "best_point", "failures", "minimize"):  # fmt: skip
        assert key in data
    assert len(data["best_per_round"]) == 3
    assert data["config"]["setup"]["aggregator"] == "masking"
    assert data["config"]["settings"]["support_size"] == 4
    assert data["best_value"] == min(data["best_per_round"])
    assert plot.stat().st_size > 1000
    # the cumulative regret says what it sums (every evaluation of every client, the
    # initial designs too) and what its mean divides by
    n = len(data["evaluations"])
    total = data["cumulative_regret_per_round"][-1]
    assert n == 3 * (3 + 2)  # 3 clients: 3 initial points and 2 rounds each
    assert f"sum of |f(x) - f*| over all N = {n} successful evaluations" in text
    assert re.search(rf"R_N / N\s*[│|]\s*{total / n:.6g}\b", text), text


def test_fedzero_table_labels_the_regret_of_its_iterates(capsys):
    args = ["run", "fedzero", "--problem", "branin", "--clients", "3", "--rounds", "4",
            "--eta", "0.05", "--h", "0.05"]  # fmt: skip
    assert main(args) == 0
    text = capsys.readouterr().out
    assert "cumulative regret R_T of the iterates: sum of |f(x_t) - f*| over T = 4 rounds" in text
    assert "mean regret per iterate R_T / T" in text


@pytest.mark.parametrize("algorithm", ["local", "random"])
def test_run_baselines(algorithm, capsys):
    args = [a for a in RUN_SMALL if a not in ("--support", "4")]
    assert main(["run", algorithm, *args]) == 0
    assert "best value (federation)" in capsys.readouterr().out


def test_run_defaults_to_the_functions_own_dimension(tmp_path):
    out = tmp_path / "r.json"
    args = ["run", "random", "--problem", "hartmann", "--clients", "3", "--init", "2",
            "--rounds", "1", "--out", str(out)]  # fmt: skip
    assert main(args) == 0
    assert json.loads(out.read_text())["dim"] == 6


def test_run_uses_the_library_defaults_of_fbo_fedgp(tmp_path):
    from botorch_fed.algorithms import FBOFedGPSettings

    out = tmp_path / "r.json"
    assert main(["run", "fbo-fedgp", *RUN_SMALL, "--out", str(out)]) == 0
    settings = json.loads(out.read_text())["config"]["settings"]
    defaults = FBOFedGPSettings().resolved()  # the results record the resolved settings
    for name in ("support_every", "support_growth", "schedule", "hyperparameters", "mixing",
                 "support", "center_noise"):  # fmt: skip
        assert settings[name] == getattr(defaults, name), name


def test_preset_paper_on_the_command_line_gives_the_papers_algorithm(tmp_path):
    from botorch_fed.algorithms import FBOFedGPSettings

    out = tmp_path / "r.json"
    assert main(["run", "fbo-fedgp", *RUN_SMALL, "--preset", "paper", "--out", str(out)]) == 0
    settings = json.loads(out.read_text())["config"]["settings"]
    paper = FBOFedGPSettings.paper().resolved()
    for name in ("preset", "mixing", "global_model", "global_batch", "hyperparameters",
                 "support", "center_noise"):  # fmt: skip
        assert settings[name] == getattr(paper, name), name
    assert (settings["support"], settings["center_noise"]) == ("clustered", 0.0)  # Alg. 1
    # an explicit flag wins over the preset
    assert main(["run", "fbo-fedgp", *RUN_SMALL, "--preset", "paper", "--mixing", "global",
                 "--out", str(out)]) == 0  # fmt: skip
    settings = json.loads(out.read_text())["config"]["settings"]
    assert (settings["mixing"], settings["global_model"]) == ("global", "pitc")


def test_center_noise_on_the_command_line_reaches_the_settings(tmp_path):
    out = tmp_path / "r.json"
    assert main(["run", "fbo-fedgp", *RUN_SMALL, "--support-selection", "clustered",
                 "--center-noise", "0.05", "--out", str(out)]) == 0  # fmt: skip
    settings = json.loads(out.read_text())["config"]["settings"]
    assert (settings["support"], settings["center_noise"]) == ("clustered", 0.05)


@pytest.mark.parametrize(
    "args, messages",
    [
        (["--problem", "no-such-function"], ["no-such-function"]),
        (["--problem", "branin", "--dim", "3"], ["--problem", "--dim", "dim=3"]),
        (["--clients", "2", "--aggregator", "ckks"], ["`--clients`", "at least 3 clients"]),
        (["--aggregator", "rot13"], ["--aggregator", "rot13"]),
        (["--schedule", "1.5"], ["`--schedule`=1.5 must lie in (0, 1]"]),
        (["--rounds", "0"], ["`--num-rounds`/`--rounds`=0 must be >= 1"]),
        (["--support", "0"], ["`--support-size`/`--support`=0 lies outside its domain [1, 4096]"]),
        (["--init", "1"], ["`--num-init`/`--init`=1", "`--min-cluster-size`=2"]),
        (["--mixing", "expected", "--acquisition", "ei"], ["`--mixing`", "`--acquisition`"]),
        (["--support-selection", "nearest"], ["--support-selection", "nearest"]),
        (["--center-noise", "-1"], ["`--center-noise`=-1.0 must be >= 0"]),
        (
            ["--center-noise", "0.1", "--support-selection", "random"],
            ["`--center-noise`=0.1", "`--support-selection`='random'"],
        ),
        (["--seed", "-1"], ["`--seed`"]),
        (["--threads", "0"], ["`--threads`"]),
        (["--rounds", "two"], ["--num-rounds/--rounds", "two"]),
        (["--out", "/no/such/folder/r.json"], ["--out /no/such/folder/r.json: the folder"]),
        (["--plot", "/no/such/folder/r.png"], ["--plot /no/such/folder/r.png: the folder"]),
        (["--resume", "/no/such/checkpoint"], ["--resume /no/such/checkpoint"]),
        (["--bounds", "0,1;0,1"], ["`--bounds`", "your own objective"]),
        (["--maximize"], ["`--maximize`", "minimised"]),
    ],
)
def test_bad_run_arguments_exit_2_naming_the_flag(args, messages, capsys):
    base = ["--problem", "branin", "--dim", "2", "--clients", "3"]
    assert main(["run", "fbo-fedgp", *base, *args]) == 2
    text = output(capsys)
    for message in messages:
        assert message in text, (message, text)
    assert "Traceback" not in text


def test_outputs_that_could_not_be_written_are_refused_before_the_run(tmp_path, capsys):
    config = tmp_path / "run.toml"
    config.write_text('problem = "branin"\n')
    same = str(tmp_path / "same")
    cases = [
        (["--out", str(tmp_path)], f"--out {tmp_path} is a folder"),
        (["--out", same, "--plot", same], f"--out and --plot name the same file {same}"),
        (["--plot", str(tmp_path / "r.xyz")], "matplotlib cannot write .xyz files"),
        (["--config", str(config), "--out", str(config)], f"--out {config} is the --config file"),
        (["--checkpoint", str(config)], f"--checkpoint {config} is a file"),
    ]
    if os.geteuid() != 0:  # root writes read-only files
        readonly = tmp_path / "ro.json"
        readonly.write_text("{}")
        readonly.chmod(0o444)
        cases.append((["--out", str(readonly)], "the file exists and is not writable"))
    base = ["run", "random", "--problem", "branin", "--clients", "3", "--init", "2",
            "--rounds", "1"]  # fmt: skip
    for args, message in cases:
        assert main([*base, *args]) == 2, args
        text = output(capsys)
        assert message in text, (message, text)
        assert "best value" not in text  # nothing ran
    assert config.read_text() == 'problem = "branin"\n'


def test_threads_are_restored_after_a_run():
    import torch

    threads = torch.get_num_threads()
    args = ["run", "random", "--problem", "branin", "--clients", "3", "--init", "2",
            "--rounds", "1", "--threads", str(threads + 1)]  # fmt: skip
    assert main(args) == 0
    assert torch.get_num_threads() == threads


def test_make_demo_command_parses():
    r"""``make demo``'s command line (the Makefile's, as README quotes it), and the
    README's (parsed and checked, not run)."""
    from pathlib import Path

    from botorch_fed.cli.compare import _groups, _prepare

    root = Path(__file__).resolve().parents[1]
    recipe = root.joinpath("Makefile").read_text().split("\ndemo:", 1)[1].split("\n\n", 1)[0]
    line = recipe.split("$(BIN)/botorch-fed ", 1)[1].replace("\\\n", " ")
    tokens = line.split()
    assert " ".join(tokens) in " ".join(root.joinpath("README.md").read_text().split())
    parser = build_parser()
    known, rest = parser.parse_known_args(tokens)
    assert known.command == "compare" and known.algorithms == ["fbo-fedgp", "local"]
    assert known.seeds == 6 and known.jobs == 2
    groups = _groups(rest, {a: parser.run_parsers[a] for a in known.algorithms})
    fbo = _prepare(parser, "fbo-fedgp", [t for _, g in groups for t in g])
    assert fbo.settings.num_rounds == 15 and fbo.setup.aggregator == "ckks"
    assert fbo.setup.num_clients == 5 and fbo.setup.dim == 6
    args = parser.parse_args(
        "run fbo-fedgp --problem cec2005-f1 --dim 10 --clients 10 --init 4 --rounds 50 "
        "--support 16 --aggregator ckks --schedule 0.5 --seed 0 --out results.json "
        "--plot regret.png".split()
    )
    assert vars(args)["settings.support_size"] == 16 and vars(args)["settings.num_init"] == 4
    for alias in ("--support-selection", "--support-every", "--support-growth", "--mixing",
                  "--hyperparameters", "--acquisition", "--beta", "--noise-std", "--shift",
                  "--init-regions", "--threads"):  # fmt: skip
        assert any(alias in a.option_strings for a in parser.run_parsers["fbo-fedgp"][0]._actions)


def test_demo_client_sizes_are_unequal_and_sum_exactly():
    import torch

    from botorch_fed.regression_demo import client_sizes

    for num_clients, mean_size in ((5, 60), (50, 200), (3, 2)):
        sizes = client_sizes(num_clients, mean_size, torch.Generator().manual_seed(0))
        assert sum(sizes) == num_clients * mean_size and min(sizes) >= 2
    assert len(set(client_sizes(10, 100, torch.Generator().manual_seed(1)))) > 1


def test_errors_on_standard_error_are_coloured_only_if_it_is_a_terminal(capsys):
    # standard output a colour terminal, standard error a file: no escape codes there
    from rich.console import Console

    from botorch_fed.cli.errors import print_error

    print_error(Console(force_terminal=True, color_system="truecolor"), "--rounds [0] bad")
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == "error: --rounds [0] bad\n"
