r"""Shared settings for the acquisition tests."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def _single_thread():
    r"""Run on one intra-op thread (restored afterwards).

    These tests work with tiny matrices; on a loaded 2-core machine the OpenMP thread
    hand-off dominates (a ``2 x 2`` Cholesky took ~8 ms with 2 threads, ~1 us with 1).
    """
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(n)
