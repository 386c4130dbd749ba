r"""The README's Python example runs as written."""

from __future__ import annotations

import re
from pathlib import Path

import torch


def test_readme_example_runs():
    text = (Path(__file__).parents[1] / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert blocks, "README has no python example"
    namespace: dict = {}
    exec(compile(blocks[0], "README.md", "exec"), namespace)
    candidate = namespace["candidate"]
    assert candidate.shape == (1, 2) and torch.isfinite(candidate).all()
