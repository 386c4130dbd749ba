r"""botorch_fed.privacy depends only on torch, cryptography and the standard library (no federation,
models or acquisition code), so any layer can use it."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import botorch_fed.privacy as privacy


def test_imports_only_torch_and_stdlib():
    allowed = set(sys.stdlib_module_names) | {"torch", "cryptography", "__future__"}
    for path in Path(privacy.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                assert node.level == 0, f"{path.name}: relative import"
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                assert top in allowed or name.startswith("botorch_fed.privacy"), (
                    f"{path.name} imports {name}"
                )


def test_public_api():
    assert set(privacy.__all__) == {
        "KeyStream",
        "LaplaceMechanism",
        "PrivacyLedger",
        "ReleaseLog",
        "ReleaseLogError",
        "sub_weibull_radius",
    }
