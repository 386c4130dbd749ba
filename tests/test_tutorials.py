r"""Every tutorial notebook runs top to bottom in smoke mode (``SMOKE_TEST=1``)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

TUTORIALS = sorted((Path(__file__).parents[1] / "tutorials").glob("*.ipynb"))
#: tutorials that start a loopback Flower federation (extra `flower`)
ON_FLOWER = {"federated_campaign"}


def _flower_marks(path: Path) -> list:
    if path.stem not in ON_FLOWER:
        return []
    try:
        import flwr  # noqa: F401
    except ImportError:
        return [pytest.mark.flower, pytest.mark.skip(reason="needs the `flower` extra")]
    return [pytest.mark.flower]


@pytest.mark.notebook
@pytest.mark.parametrize(
    "path", [pytest.param(p, id=p.stem, marks=_flower_marks(p)) for p in TUTORIALS]
)
def test_tutorial_runs_in_smoke_mode(path, monkeypatch):
    monkeypatch.setenv("SMOKE_TEST", "1")
    monkeypatch.setenv("MPLBACKEND", "Agg")
    # the federations a notebook starts live in temporary folders of its own
    federations = Path(tempfile.gettempdir()).glob("*/*/federation.json")
    before = set(federations)
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(
        nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}
    )
    try:
        client.execute()
    finally:  # a notebook that failed half-way leaves no federation running
        if path.stem in ON_FLOWER:
            from botorch_fed.flower.launcher import down

            for record in set(Path(tempfile.gettempdir()).glob("*/*/federation.json")) - before:
                down(record.parent)
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
