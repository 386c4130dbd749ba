r"""Fixtures shared across the test packages (opted into with ``pytestmark``), and the
session settings of ``make test`` and ``make test-matrix``:

- torch's threads and ``torch.backends.mkldnn`` as
  :func:`tests.mkl_probe.apply_session_settings` sets them: under pytest-xdist (``-n 2``,
  setup.cfg) each worker takes ``cpu_count / workers`` threads (at least 1), so two
  workers do not oversubscribe two cores, unless ``BOTORCH_FED_TEST_THREADS`` says how
  many; ``BOTORCH_FED_TEST_MKLDNN=0`` turns mkldnn off (``make test-matrix`` varies both);
- the tests of one file run on one worker (``--dist loadgroup``, a group per file), so a
  module-scoped fixture (a Flower federation, the packaging check's resolutions) is
  built once; the files that start Flower processes (:data:`FLOWER_PROCESSES`) share
  one group: they take free ports that the OS picks, and one worker at a time picking
  them cannot race another for a port.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import pytest
import torch
from botorch.exceptions.warnings import InputDataWarning

from tests.mkl_probe import apply_session_settings

HERE = Path(__file__).parent
#: the test files that start SuperLinks, SuperNodes or party agents
FLOWER_PROCESSES = frozenset(
    HERE / "flower" / name
    for name in ("test_launcher.py", "test_loopback.py", "test_party_agent.py")
)


def pytest_configure(config) -> None:
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    try:
        apply_session_settings(workers)
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None


def pytest_collection_modifyitems(config, items) -> None:
    for item in items:
        path = Path(str(item.fspath))
        group = "flower-processes" if path in FLOWER_PROCESSES else str(path.relative_to(HERE))
        item.add_marker(pytest.mark.xdist_group(group))


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
