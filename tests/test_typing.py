r"""The package type-checks clean: mypy with the project's configuration
(``[tool.mypy]`` in pyproject.toml: every module of ``botorch_fed``, unused ignores
reported) finds no error, so the annotations a user's type checker reads through
``py.typed`` hold."""

from __future__ import annotations

import os
from pathlib import Path

import mypy.api
import pytest

ROOT = Path(__file__).resolve().parents[1]


USER_FILE = (
    "import botorch_fed as bf\n"
    "setup = bf.FederationSetup(problem='branin', num_clients=3)\n"
    "bf.run_federated('fbo-fedgp', setup, bf.FBOFedGPSettings(), checkpoint='c')\n"
    "bf.run_federated('gp-ucb', setup, bf.LDPBOSettings())\n"
    "bf.run_federated('local', setup)\n"
    "bf.run_federated('fbo-fedgp', setup, bf.FedZeroSettings())\n"
    "bf.run_federated('co-kg', setup, bf.CoEISettings())\n"
    "bf.run_federated('local', setup, private_randomness='always')\n"
    "name: str = 'local'\n"
    "bf.run_federated(name, setup, on_round=None)\n"
    "bf.run_federated(name, setup, bf.BOSettings())\n"
)
USER_ERRORS = [6, 7, 8, 11]  # the lines a type checker must refuse


@pytest.fixture(scope="module")
def mypy_report(tmp_path_factory) -> tuple[str, str, int, Path]:
    r"""One mypy run (the project's configuration) over the package and a user's file."""
    user = tmp_path_factory.mktemp("typing") / "user.py"
    user.write_text(USER_FILE)
    cwd = os.getcwd()
    os.chdir(ROOT)  # the configuration's paths are relative to it
    try:
        out, err, status = mypy.api.run(
            # a fresh cache: mypy's own would report a cached user file under its old path
            ["--config-file", str(ROOT / "pyproject.toml"), "--cache-dir", str(user.parent)]
            + ["botorch_fed", str(user)]
        )
    finally:
        os.chdir(cwd)
    return out, err, status, user


def _in(user: Path, line: str) -> bool:
    r"""Whether a mypy message is about the user's file."""
    return Path(line.split(":", 1)[0]).resolve() == user.resolve()


def test_the_package_type_checks_without_errors(mypy_report):
    out, err, _, user = mypy_report
    package = [line for line in out.splitlines() if ": error:" in line and not _in(user, line)]
    assert package == [], out + err
    # mypy ran to the end, and its only errors are the user file's
    assert f"Found {len(USER_ERRORS)} errors in 1 file" in out, out + err


def test_the_package_ships_its_type_marker():
    assert (ROOT / "botorch_fed" / "py.typed").is_file()


def test_run_federated_refuses_another_algorithms_settings_to_a_type_checker(mypy_report):
    r"""``bf.run_federated``'s overloads tie each algorithm name to its settings class:
    a type checker accepts matching settings and refuses another algorithm's."""
    out, err, _, user = mypy_report
    lines = [line for line in out.splitlines() if ": error:" in line and _in(user, line)]
    assert sorted(int(line.split(":")[1]) for line in lines) == USER_ERRORS, out + err


def test_run_federated_overloads_name_every_algorithm_with_its_settings_class():
    r"""Each registered algorithm has exactly one typed overload, whose settings
    annotation is the registry's settings class (a new algorithm needs its overload)."""
    import typing

    from botorch_fed.algorithms import available_algorithms, get_algorithm, run_federated

    typed: dict[str, object] = {}
    for overload in typing.get_overloads(run_federated)[:-1]:  # the last: any name, defaults
        hints = typing.get_type_hints(overload)
        (settings_class, _none) = typing.get_args(hints["settings"])
        for name in typing.get_args(hints["algorithm"]):
            assert name not in typed, name
            typed[name] = settings_class
    assert sorted(typed) == sorted(available_algorithms())
    for name, settings_class in typed.items():
        assert settings_class is get_algorithm(name).settings_class, name
