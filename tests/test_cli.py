r"""The ``botorch-fed`` command line and the regression demo behind ``demo``."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from botorch_fed.cli import main
from botorch_fed.regression_demo import RegressionDemoConfig, run_regression_demo

SMALL = ["--clients", "3", "--points", "12", "--support", "8", "--test-points", "64"]


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
        (["--clients", "0"], "num_clients"),
        (["--support", "0"], "support_size"),
        (["--noise", "-1"], "noise_std"),
        (["--function", "no-such-function"], "no-such-function"),
        (["--function", "branin", "--dim", "3"], "dim"),
    ],
)
def test_bad_demo_arguments_exit_2_with_a_message(args, message, capsys):
    assert main(["demo", *args]) == 2
    assert message in capsys.readouterr().out


def test_argparse_errors_exit_2():
    with pytest.raises(SystemExit) as e:
        main(["demo", "--clients", "three"])
    assert e.value.code == 2
    with pytest.raises(SystemExit) as e:
        main([])
    assert e.value.code == 2


def test_console_script_is_installed():
    proc = subprocess.run(
        [sys.executable, "-m", "botorch_fed.cli", "--version"], capture_output=True, text=True
    )
    assert proc.returncode == 0 and "botorch-fed" in proc.stdout


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
    for label in ("best value (federation)", "simple regret", "time per stage", "bytes"):
        assert label in text
    data = json.loads(out.read_text())
    for key in ("best_value", "best_per_round", "regret_per_round", "time_s", "ledger",
                "config", "versions"):  # fmt: skip
        assert key in data
    assert len(data["best_per_round"]) == 3
    assert data["config"]["setup"]["aggregator"] == "masking"
    assert data["best_value"] == min(data["best_per_round"])
    assert plot.stat().st_size > 1000


@pytest.mark.parametrize("algorithm", ["local", "random"])
def test_run_baselines(algorithm, capsys):
    assert main(["run", algorithm, *RUN_SMALL]) == 0
    assert "best value (federation)" in capsys.readouterr().out


def test_run_defaults_to_the_functions_own_dimension(tmp_path):
    out = tmp_path / "r.json"
    args = ["run", "random", "--problem", "hartmann", "--clients", "3", "--init", "2",
            "--rounds", "1", "--out", str(out)]  # fmt: skip
    assert main(args) == 0
    assert json.loads(out.read_text())["dim"] == 6


def test_run_uses_the_library_defaults_of_fbo_fedgp(tmp_path):
    from botorch_fed.federation import FBOFedGPConfig

    out = tmp_path / "r.json"
    assert main(["run", "fbo-fedgp", *RUN_SMALL, "--out", str(out)]) == 0
    settings = json.loads(out.read_text())["config"]["settings"]
    defaults = FBOFedGPConfig()
    for name in ("support_every", "support_growth", "schedule", "hyperparameters", "mixing"):
        assert settings[name] == getattr(defaults, name), name


@pytest.mark.parametrize(
    "args, message",
    [
        (["--problem", "no-such-function"], "no-such-function"),
        (["--problem", "branin", "--dim", "3"], "dim"),
        (["--clients", "2", "--aggregator", "ckks"], "at least 3 clients"),
        (["--aggregator", "rot13"], "aggregator"),
        (["--schedule", "1.5"], "`c`"),
        (["--rounds", "0"], "num_rounds"),
        (["--support", "0"], "support_size"),
        (["--out", "/no/such/folder/r.json"], "--out /no/such/folder/r.json: the folder"),
        (["--plot", "/no/such/folder/r.png"], "--plot /no/such/folder/r.png: the folder"),
    ],
)
def test_bad_run_arguments_exit_2(args, message, capsys):
    base = ["--problem", "branin", "--dim", "2", "--clients", "3"]
    assert main(["run", "fbo-fedgp", *base, *args]) == 2
    assert message in capsys.readouterr().out


def test_demo_client_sizes_are_unequal_and_sum_exactly():
    import torch

    from botorch_fed.regression_demo import client_sizes

    for num_clients, mean_size in ((5, 60), (50, 200), (3, 2)):
        sizes = client_sizes(num_clients, mean_size, torch.Generator().manual_seed(0))
        assert sum(sizes) == num_clients * mean_size and min(sizes) >= 2
    assert len(set(client_sizes(10, 100, torch.Generator().manual_seed(1)))) > 1
