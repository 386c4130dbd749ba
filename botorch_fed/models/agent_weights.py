r"""The weights of the agents' posteriors in Co-KG's barycenter.

The central model of [Co-KG] is the weighted 2-Wasserstein barycenter of the ``N``
agents' posteriors on a shared support
(:class:`~botorch_fed.models.barycenter_gp.BarycenterGP`); :func:`agent_weights` gives
the weights: uniform (the paper), by data, or by posterior precision (the slides'
"adaptive agent weighting" future work).

References:

.. [Co-KG] Collaborative Bayesian optimisation via Wasserstein barycenters (paper 001
   in ``shared/papers``), Proposition 1 and Algorithm 1.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

AGENT_WEIGHTS = ("uniform", "data", "precision")


def agent_weights(
    scheme: str,
    covariances: Tensor | None = None,
    num_data: Sequence[int] | Tensor | None = None,
) -> Tensor:
    r"""Barycenter weights of ``N`` agents.

    - ``"uniform"``: ``1 / N`` (the paper).
    - ``"data"``: proportional to each agent's number of observations.
    - ``"precision"``: proportional to the inverse of each agent's average posterior
      variance on the support, ``s / tr(C_n)`` (the slides' "adaptive agent weighting"
      future work: an agent whose posterior is confident counts more).

    Args:
        scheme: One of ``"uniform"``, ``"data"``, ``"precision"``.
        covariances: ``N x s x s`` posterior covariances (``"uniform"``: used for
            ``N`` if ``num_data`` is not given; ``"precision"``: required).
        num_data: ``N`` observation counts (``"data"``: required).

    Returns:
        ``N`` float64 weights summing to one.
    """
    if scheme not in AGENT_WEIGHTS:
        raise ValueError(f"`scheme`={scheme!r} must be one of {AGENT_WEIGHTS}.")
    counts = None
    if num_data is not None:
        counts = torch.as_tensor(num_data, dtype=torch.float64)
        if counts.ndim != 1 or counts.numel() == 0:
            raise ValueError(f"`num_data` must be a non-empty sequence, got {num_data!r}.")
        if not torch.isfinite(counts).all() or (counts < 0).any():
            raise ValueError(f"`num_data` must be non-negative counts, got {counts.tolist()}.")
    if covariances is not None:
        if not isinstance(covariances, Tensor) or covariances.ndim != 3:
            raise ValueError("`covariances` must be an `N x s x s` tensor.")
        if counts is not None and counts.numel() != covariances.shape[0]:
            raise ValueError(
                f"`num_data` has {counts.numel()} entries but `covariances` {covariances.shape[0]}."
            )
    if scheme == "uniform":
        if counts is None and covariances is None:
            raise ValueError("`uniform` weights need `covariances` or `num_data` (for N).")
        if counts is not None:
            N = counts.numel()
        else:
            assert covariances is not None  # checked just above
            N = covariances.shape[0]
        return torch.full((N,), 1.0 / N, dtype=torch.float64)
    if scheme == "data":
        if counts is None:
            raise ValueError("`data` weights need `num_data`.")
        if counts.sum() <= 0:
            raise ValueError("`data` weights need at least one observation in total.")
        return counts / counts.sum()
    if covariances is None:
        raise ValueError("`precision` weights need `covariances`.")
    trace = covariances.detach().to(torch.float64).diagonal(dim1=-2, dim2=-1).sum(-1)
    if not torch.isfinite(trace).all() or (trace <= 0).any():
        raise ValueError("`precision` weights need covariances with a positive finite trace.")
    precision = covariances.shape[-1] / trace
    return precision / precision.sum()
