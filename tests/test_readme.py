r"""The README's Python example runs as written."""

from __future__ import annotations

import re
from pathlib import Path

import torch


def test_readme_example_runs():
    text = (Path(__file__).parents[1] / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    example = [b for b in blocks if "candidate, _ = optimize_acqf" in b]
    assert example, "README has no python example"
    for block in blocks:  # every other example at least compiles
        compile(block, "README.md", "exec")
    namespace: dict = {}
    exec(compile(example[0], "README.md", "exec"), namespace)
    candidate = namespace["candidate"]
    assert candidate.shape == (1, 2) and torch.isfinite(candidate).all()
