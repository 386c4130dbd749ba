r"""Imports only point down the layers of DESIGN.md: every ``botorch_fed`` import (at
module level or inside a function) of a package names a package of a lower layer."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import botorch_fed

# top to bottom; a package may import only packages with a smaller rank
RANKS = {
    "cli": 60,
    "flower": 50,
    "tasks": 50,
    "runs": 40,
    "plotting": 40,
    "regression_demo": 40,
    "federation": 30,
    "ldp": 22,
    "acquisition": 21,
    "models": 20,
    "privacy": 10,
    "zeroth_order": 10,
    "inducing": 10,
    "secure": 0,
    "test_functions": 0,
}
ROOT = Path(botorch_fed.__file__).parent


def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return {n.split(".")[1] for n in names if n.startswith("botorch_fed.")}


def _package(path: Path) -> str:
    return path.relative_to(ROOT).parts[0].removesuffix(".py")


def test_every_package_has_a_layer():
    packages = {_package(p) for p in ROOT.rglob("*.py")} - {"__init__", "__main__"}
    assert packages == set(RANKS)


@pytest.mark.parametrize("package", sorted(RANKS))
def test_imports_point_down(package):
    files = [ROOT / f"{package}.py"] if (ROOT / f"{package}.py").exists() else []
    files += sorted((ROOT / package).rglob("*.py")) if (ROOT / package).is_dir() else []
    assert files, package
    for path in files:
        for other in _imports(path) - {package}:
            assert RANKS[other] < RANKS[package], (
                f"{path.relative_to(ROOT)} imports botorch_fed.{other}, which is not below "
                f"{package} (DESIGN.md: imports only point down)"
            )


def test_the_check_sees_an_upward_import(tmp_path):
    path = tmp_path / "m.py"
    path.write_text("def f():\n    from botorch_fed.cli.run import execute_run\n")
    assert _imports(path) == {"cli"}
