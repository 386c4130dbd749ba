r"""A benchmark federation's objectives (:func:`benchmark_objectives`): what
``FederationSetup(problem=...)`` runs on, built without a setup."""

from __future__ import annotations

import pytest
import torch

from botorch_fed.problems.heterogeneity import benchmark_objectives
from botorch_fed.protocol.setup import FederationSetup


@pytest.mark.parametrize(
    "problem, options",
    [("hartmann", {"dim": 6, "noise_std": 0.05, "shift": 0.1}), ("branin", {"noise": "student-t"})],
)
def test_benchmark_objectives_are_the_setups_objectives(problem, options):
    built = benchmark_objectives(problem, 3, seed=4, **options)
    setup = FederationSetup(problem=problem, num_clients=3, seed=4, **options).make_objectives()
    X = torch.rand(5, built[0].dim, dtype=torch.float64)
    for a, b in zip(built, setup, strict=True):
        assert torch.equal(a.shift, b.shift)
        assert torch.equal(a.observe(X), b.observe(X))  # the same noise streams


def test_clients_differ_by_their_shift_only_when_asked():
    same = benchmark_objectives("branin", 3, seed=0)
    assert all(not o.shift.any() for o in same)
    shifted = benchmark_objectives("branin", 3, seed=0, shift=0.2)
    assert len({tuple(o.shift.tolist()) for o in shifted}) == 3
    assert all(o.shift.abs().max() <= 0.2 for o in shifted)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"num_clients": 0}, "`num_clients`=0"),
        ({"num_clients": True}, "`num_clients`=True"),
        ({"shift": 1.0}, r"`shift`=1.0 must lie in \[0, 1\)"),
        ({"problem": "hartman"}, "hartmann"),
    ],
)
def test_bad_benchmark_options_are_refused_by_name(kwargs, match):
    args = {"problem": "branin", "num_clients": 3} | kwargs
    with pytest.raises(ValueError, match=match):
        benchmark_objectives(**args)
