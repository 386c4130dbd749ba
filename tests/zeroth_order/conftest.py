r"""Fixtures of the zeroth-order tests."""

from __future__ import annotations

import pytest

from botorch_fed.zeroth_order import sampling


@pytest.fixture(params=["words", "torch-rand"])
def l1_path(request, monkeypatch):
    r"""Run a test on both ways of drawing the Laplace vectors: random words (large
    batches on the CPU) and ``torch.rand`` (small batches, other devices)."""
    threshold = 0 if request.param == "words" else 1 << 62
    monkeypatch.setattr(sampling, "WORDS_MIN_NUMEL", threshold)
    return request.param
