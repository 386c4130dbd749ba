r"""Imports only point down the layers: every ``botorch_fed`` import (at module level or
inside a function, absolute or relative) of a package names a package of a lower layer.

The order is DESIGN.md's (``../shared/DESIGN.md``: cli, flower, algorithms, protocol,
acquisition/models, problems, privacy/zeroth_order/inducing, secure/test_functions) with this
repository's own choices for what it does not name: ``runs`` (a run's description, used
by cli and flower), ``tasks``, ``plotting``, ``regression_demo`` (top-level helpers);
``ldp`` > ``acquisition`` > ``models`` where DESIGN puts the BoTorch pieces on one level.
The package root is the curated API: its names load on first use."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import botorch_fed

# top to bottom; a package may import only packages with a smaller rank
RANKS = {
    "cli": 60,
    "console": 55,
    "flower": 50,
    "tasks": 50,
    "runs": 40,
    "plotting": 40,
    "regression_demo": 40,
    "experiments": 35,
    "algorithms": 32,
    "protocol": 30,
    "ldp": 22,
    "acquisition": 21,
    "models": 20,
    "problems": 12,
    "privacy": 10,
    "zeroth_order": 10,
    "inducing": 10,
    "secure": 0,
    "test_functions": 0,
}
ROOT = Path(botorch_fed.__file__).parent


def _imports(path: Path) -> set[str]:
    r"""The ``botorch_fed`` packages ``path`` imports (``from botorch_fed import x`` and
    relative imports included)."""
    here = ["botorch_fed", *path.relative_to(ROOT).with_suffix("").parts][:-1]  # its package
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the package, up level - 1
                parent = here[: len(here) - (node.level - 1)]
                base = ".".join(parent + ([base] if base else []))
            if base == "botorch_fed":
                names.update(f"botorch_fed.{alias.name}" for alias in node.names)
            else:
                names.add(base)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    found = {n.split(".")[1] for n in names if n.startswith("botorch_fed.")}
    return {n for n in found if not n.startswith("__")}  # not __version__


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
    wrong = [
        f"{path.relative_to(ROOT)} imports botorch_fed.{other}"
        for path in files
        for other in sorted(_imports(path) - {package})
        if RANKS[other] >= RANKS[package]
    ]
    assert not wrong, f"imports that do not point below {package}: {wrong}"


def test_the_package_root_imports_its_api_only_for_type_checkers():
    tree = ast.parse((ROOT / "__init__.py").read_text())
    top_level = [n for n in tree.body if isinstance(n, ast.Import | ast.ImportFrom)]
    assert top_level and all(
        not (getattr(n, "module", None) or "").startswith("botorch_fed")
        and not any(a.name.startswith("botorch_fed") for a in n.names)
        for n in top_level
    )


@pytest.mark.parametrize(
    "module",
    [
        "botorch_fed.secure",
        # Flower starts a ClientApp process for every message: torch would cost seconds each
        "botorch_fed.flower.client_app",
    ],
)
def test_importing_a_light_module_does_not_import_torch(module):
    code = f"import sys, {module}; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize(
    "where, code",
    [
        ("flower/m.py", "def f():\n    from botorch_fed.cli.run import execute_run\n"),
        ("flower/m.py", "import botorch_fed.cli.run as r\n"),
        ("flower/m.py", "from botorch_fed import cli\n"),
        ("flower/m.py", "from ..cli import run\n"),
        ("flower/sub/m.py", "from ...cli.run import execute_run\n"),
        ("flower/__init__.py", "from ..cli import run\n"),
    ],
)
def test_the_check_sees_an_upward_import(where, code, tmp_path, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    path = tmp_path / where
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(code)
    assert _imports(path) == {"cli"}
