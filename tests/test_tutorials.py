r"""Every tutorial notebook runs top to bottom in smoke mode (``SMOKE_TEST=1``)."""

from __future__ import annotations

import os
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

TUTORIALS = sorted((Path(__file__).parents[1] / "tutorials").glob("*.ipynb"))


@pytest.mark.notebook
@pytest.mark.parametrize("path", TUTORIALS, ids=[p.stem for p in TUTORIALS])
def test_tutorial_runs_in_smoke_mode(path, monkeypatch):
    monkeypatch.setenv("SMOKE_TEST", "1")
    monkeypatch.setenv("MPLBACKEND", "Agg")
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(
        nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}
    )
    client.execute()
    errors = [
        o
        for c in nb.cells
        if c.cell_type == "code"
        for o in c.get("outputs", [])
        if o.get("output_type") == "error"
    ]
    assert not errors


def test_there_are_tutorials():
    assert TUTORIALS, "no tutorials found"
    assert os.path.basename(TUTORIALS[0]).endswith(".ipynb")
