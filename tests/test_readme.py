r"""README and the documentation pages: their examples run as written, their links stay
inside the repository, and README stays a landing page."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
PAGES = [p for p in PAGES if "_build" not in p.parts and "generated" not in p.parts]


def _python_blocks(path: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", path.read_text(), re.S)


def test_readme_is_a_landing_page_of_fewer_than_150_lines():
    assert len((ROOT / "README.md").read_text().splitlines()) < 150


def test_readme_example_runs():
    (example,) = [b for b in _python_blocks(ROOT / "README.md") if "run_federated" in b]
    namespace: dict = {}
    exec(compile(example, "README.md", "exec"), namespace)
    result = namespace["result"]
    assert result.best_value is not None and len(result.best_per_round) == 6


def test_the_first_botorch_model_example_runs():
    page = ROOT / "docs" / "getting_started.md"
    (example,) = [b for b in _python_blocks(page) if "candidate, _ = optimize_acqf" in b]
    namespace: dict = {}
    exec(compile(example, str(page), "exec"), namespace)
    candidate = namespace["candidate"]
    assert candidate.shape == (1, 2) and torch.isfinite(candidate).all()


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_python_example_compiles(page):
    for block in _python_blocks(page):
        compile(block, str(page), "exec")


def test_readme_links_only_into_the_repository():
    text = (ROOT / "README.md").read_text()
    assert not re.findall(r"\]\((?:[a-z]+:|/)", text), "README links outside the repository"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_points_to_a_file_of_the_repository(page):
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)  # not inside code
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+://|mailto:|#", target):
            continue
        path = (page.parent / target.split("#")[0]).resolve()
        assert path.is_relative_to(ROOT), f"{page.name}: {target} leaves the repository"
        assert path.exists(), f"{page.name}: {target} does not exist"
