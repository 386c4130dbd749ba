r"""Fixtures shared across the test packages (opted into with ``pytestmark``)."""

from __future__ import annotations

import warnings

import pytest
import torch
from botorch.exceptions.warnings import InputDataWarning


@pytest.fixture
def quiet_single_thread():
    r"""Warnings ignored and one intra-op thread (restored afterwards): the federation
    tests fit many tiny GPs, where the OpenMP hand-off dominates on a loaded 2-core
    machine, and float32 fits warn (InputDataWarning, Cholesky jitter)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        torch.set_num_threads(n)


@pytest.fixture
def quiet_seeded():
    r"""float32 InputDataWarnings ignored, and torch's global RNG seeded (0) for the
    test and restored after it, so unseeded draws do not depend on test order."""
    with warnings.catch_warnings(), torch.random.fork_rng():
        warnings.simplefilter("ignore", InputDataWarning)
        torch.manual_seed(0)
        yield
