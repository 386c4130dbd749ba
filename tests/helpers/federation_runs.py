r"""What several federation test files share: the algorithm cases, a simulated kill of a
run after round ``k`` and the parts of a result that must repeat exactly."""

from __future__ import annotations

import pytest

from botorch_fed.secure import available_backends

# (algorithm, aggregator): every registered algorithm, FBO-FedGP under two backends
ALGORITHMS = [
    ("fbo-fedgp", "plaintext"),
    ("fbo-fedgp", "masking"),
    ("local", "plaintext"),
    ("central", "plaintext"),
    ("fts", "plaintext"),
    ("random", "plaintext"),
]
IDS = [f"{a}-{g}" if a == "fbo-fedgp" else a for a, g in ALGORITHMS]


class Killed(Exception):
    r"""Raised by :func:`kill_after` to stop a run as a crash would."""


def kill_after(k: int):
    r"""An ``on_round`` hook that stops the run after round ``k`` (its checkpoint is
    written before the hook runs)."""

    def hook(t, best):
        if t == k:
            raise Killed

    return hook


def comparable(result) -> dict:
    r"""``result.to_dict()`` without what may differ between equal runs (wall times,
    versions); bytes and message counts stay."""
    out = result.to_dict()
    for key in ("time_s", "versions"):
        out.pop(key)
    ledger = out.pop("ledger")  # times differ; what was sent must not
    out["bytes"] = (ledger["bytes_per_client"], ledger["messages"])
    return out


def backend_params(*names: str) -> list:
    r"""``pytest.param`` per secure-aggregation backend, skipped where it is not installed."""
    return [
        pytest.param(
            name,
            marks=[]
            if name in available_backends()
            else [pytest.mark.skip(reason=f"{name} backend not installed")],
        )
        for name in names
    ]
