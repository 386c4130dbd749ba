r"""An ``aggregate(list_of_arrays) -> sum`` callable backed by a secure backend.

The in-process federated fit (``botorch_fed.protocol.federated_fit``) and the
regression demo take any callable that sums a list of per-client float64 arrays.
:func:`make_aggregator` turns a backend into one: each call runs a full in-process
session of the backend among the listed clients (client ``i`` contributes
``arrays[i]``). With ``wide=True`` the arrays travel in the limb encoding of
:mod:`botorch_fed.secure.limbs`, which makes the sum exact to ``2^-40`` for any
magnitude below ``2^64`` (and removes CKKS's approximation error); ``wide=False``
sends the raw values (what the CKKS error figures in the benchmark measure).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from botorch_fed.secure.base import SecureAggregationBackend
from botorch_fed.secure.driver import aggregate
from botorch_fed.secure.limbs import LimbEncoding
from botorch_fed.secure.registry import get_backend


def make_aggregator(
    backend: str | SecureAggregationBackend,
    *,
    wide: bool = True,
    seed: int | None = None,
    stats: list | None = None,
    **options,
) -> Callable[[Sequence[np.ndarray]], np.ndarray]:
    r"""Wrap a secure-aggregation backend as an ``aggregate`` callable.

    Args:
        backend: A backend or its name (``"plaintext"``, ``"ckks"``, ``"masking"``).
        wide: Use the limb encoding (exact, any magnitude) instead of raw values.
        seed: Seed of the key material and session randomness (tests and benchmarks
            only; ``None`` uses OS randomness). Each call derives its own seed.
        stats: If a list, one statistics dict per call is appended (bytes, times).
        **options: Backend options when ``backend`` is a name.

    Returns:
        ``aggregate(arrays) -> float64 sum`` over ``len(arrays)`` clients.
    """
    if isinstance(backend, str):
        backend = get_backend(backend, **options)
    elif options:
        raise ValueError("Backend options are only accepted with a backend name.")
    if not isinstance(backend, SecureAggregationBackend):
        raise TypeError(f"`backend` must be a backend or its name, got {type(backend).__name__}.")
    encoding = LimbEncoding() if wide else None
    calls = 0

    def aggregate_arrays(arrays: Sequence[np.ndarray]) -> np.ndarray:
        nonlocal calls
        if len(arrays) == 0:
            raise ValueError("`arrays` is empty: no client contributed to the aggregate.")
        arrays = [np.asarray(a, dtype=np.float64) for a in arrays]
        shape = arrays[0].shape
        for i, a in enumerate(arrays):
            if a.shape != shape:
                raise ValueError(f"Client {i} sent shape {a.shape}, client 0 sent {shape}.")
        flat = [a.reshape(-1) for a in arrays]
        inputs = {i: encoding.encode(a) if encoding else a for i, a in enumerate(flat)}
        call_stats: dict | None = {} if stats is not None else None
        call_seed = None if seed is None else seed * 100_003 + calls
        calls += 1
        total = aggregate(backend, inputs, seed=call_seed, stats=call_stats)
        if stats is not None:
            stats.append(call_stats)
        total = encoding.decode(total) if encoding else total
        return total.reshape(shape)

    return aggregate_arrays
