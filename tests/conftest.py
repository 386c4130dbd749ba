r"""Fixtures shared across the test packages (opted into with ``pytestmark``), and the
session settings of ``make test`` and ``make test-matrix``:

- torch's threads and ``torch.backends.mkldnn`` as
  :func:`tests.mkl_probe.apply_session_settings` sets them: under pytest-xdist (``-n 3``,
  setup.cfg) each worker takes ``cpu_count / workers`` threads (at least 1), unless
  ``BOTORCH_FED_TEST_THREADS`` says how many; ``BOTORCH_FED_TEST_MKLDNN=0`` turns mkldnn
  off (``make test-matrix`` varies both);
- the tests of a file with a module- or session-scoped fixture (a Flower federation,
  the packaging check's resolutions, a fitted model) run on one worker
  (``--dist loadgroup``, a group per file), so the fixture is built once; the files that
  start Flower processes (:data:`FLOWER_PROCESSES`) share one group, which runs first:
  they take free ports that the OS picks, so one worker at a time picks them, and they
  mostly wait on Flower's polls while the other workers compute. Every other test is
  scheduled on its own, so the workers stay balanced, the notebooks (the longest) first.
"""

from __future__ import annotations

import os
import re
import warnings
from functools import cache
from pathlib import Path

import pytest
import torch
from botorch.exceptions.warnings import InputDataWarning

from tests.mkl_probe import apply_session_settings

HERE = Path(__file__).parent
_MODULE_FIXTURE = re.compile(r"""scope\s*=\s*["'](module|session)["']""")
#: the test files that start SuperLinks, SuperNodes or party agents
FLOWER_PROCESSES = frozenset(
    HERE / "flower" / name
    for name in (
        "test_launcher.py",
        "test_launcher_restart.py",
        "test_loopback.py",
        "test_party_agent.py",
    )
)


def pytest_configure(config) -> None:
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    try:
        apply_session_settings(workers)
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None


def _group(path: Path) -> str | None:
    r"""The group whose tests run on one worker: Flower's, the file's own where it
    has a module- or session-scoped fixture, or None (each test on its own)."""
    if path in FLOWER_PROCESSES:
        return "flower-processes"
    if _MODULE_FIXTURE.search(path.read_text()):
        return str(path.relative_to(HERE))
    return None


@pytest.hookimpl(optionalhook=True, tryfirst=True)
def pytest_xdist_make_scheduler(config, log):
    r"""``--dist loadgroup`` with the groups of :func:`_group`, given by path. (xdist's own
    ``xdist_group`` marks do not take effect under pytest 9: its worker renames
    ``item._nodeid``, which pytest no longer reads.)"""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    groups: dict[str, str | None] = {}

    class ByGroup(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            if path not in groups:
                groups[path] = _group(config.rootpath / path)
            return groups[path] or nodeid

    return ByGroup(config, log)


def pytest_collection_modifyitems(config, items) -> None:
    # the Flower group first, then the other groups (setup.cfg turns off xdist's
    # reordering by the number of tests in a group), then the notebooks (tens of seconds
    # each: at the end they would leave workers idle), each test's order kept
    def key(item) -> tuple[int, bool]:
        return _rank(Path(str(item.fspath))), item.get_closest_marker("notebook") is None

    items.sort(key=key)


@cache
def _rank(path: Path) -> int:
    group = _group(path)
    return 0 if group == "flower-processes" else 1 if group else 2


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
