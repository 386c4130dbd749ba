r"""Plaintext aggregation: the elementwise sum of the clients' arrays.

:func:`sum_arrays` is the default ``aggregate`` callable of the federated hyperparameter
fit (:mod:`~botorch_fed.models.pitc_fit`) and of the federated outcome moments
(:mod:`~botorch_fed.models.federated_standardize`); the secure backends
(``botorch_fed.secure``) provide drop-in replacements with the same signature.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def sum_arrays(arrays: Sequence[np.ndarray]) -> np.ndarray:
    r"""Plaintext aggregation: the elementwise sum of the clients' float64 arrays.

    This is the default ``aggregate`` callable; secure backends
    (``botorch_fed.secure``) provide drop-in replacements with the same signature.

    Args:
        arrays: One array per client, all of the same shape.

    Returns:
        Their float64 sum.
    """
    if len(arrays) == 0:
        raise ValueError("`arrays` is empty: no client contributed to the aggregate.")
    return np.sum(np.stack([np.asarray(a, dtype=np.float64) for a in arrays]), axis=0)
