r"""The package type-checks clean: mypy with the project's configuration
(``[tool.mypy]`` in pyproject.toml: every module of ``botorch_fed``, unused ignores
reported) finds no error, so the annotations a user's type checker reads through
``py.typed`` hold."""

from __future__ import annotations

from pathlib import Path

import mypy.api

ROOT = Path(__file__).resolve().parents[1]


def test_the_package_type_checks_without_errors(monkeypatch):
    monkeypatch.chdir(ROOT)  # the configuration's `files` are relative to it
    out, err, status = mypy.api.run(["--config-file", str(ROOT / "pyproject.toml")])
    assert status == 0, out + err
    assert "Success: no issues found" in out


def test_the_package_ships_its_type_marker():
    assert (ROOT / "botorch_fed" / "py.typed").is_file()
