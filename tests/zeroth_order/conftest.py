r"""Fixtures of the zeroth-order tests."""

from __future__ import annotations

import pytest

from botorch_fed.zeroth_order import estimators, sampling


@pytest.fixture(params=["words", "torch-rand"])
def l1_path(request, monkeypatch):
    r"""Run a test on both ways of drawing the Laplace vectors: random words (large
    batches on the CPU) and ``torch.rand`` (small batches, other devices)."""
    threshold = 0 if request.param == "words" else 1 << 62
    monkeypatch.setattr(sampling, "WORDS_MIN_NUMEL", threshold)
    return request.param


@pytest.fixture
def scratch_words_path(monkeypatch):
    r"""The random-word sampler (and so the l1 estimator's scratch buffer) at test sizes,
    and no buffer left over from an earlier test."""
    monkeypatch.setattr(sampling, "WORDS_MIN_NUMEL", 0)
    estimators._scratch.buffer = None
    yield
    estimators._scratch.buffer = None
