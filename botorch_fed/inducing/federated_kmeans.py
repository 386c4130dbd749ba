r"""The shared support set of FBO-FedGP: federated k-means (Alg. 1 of [FBO-FedGP]).

1. Each client clusters its own inputs (:func:`local_centers`: k-means++ seeding,
   then Lloyd iterations) and sends only the ``k`` centres.
2. The server (:func:`global_support`) pools all centres, seeds ``|S|`` centres by
   greedy farthest-first traversal starting from the centres of one randomly
   chosen client, then runs k-means over the pooled centres from that seeding. The
   final centres are the support set ``S`` broadcast to every client.

Privacy note: cluster centres are means of client data, so they leak coarse
information about where a client's data lie (and, for tiny clusters, the data
points themselves: a cluster of one point *is* that point). ``noise_std`` in
:func:`local_centers` perturbs the centres with Gaussian noise before they leave
the client. This is an obfuscation heuristic, not a formal differential privacy
guarantee (the assignment of points to clusters is data dependent and unbounded
in sensitivity). Where that leakage is unacceptable, use :func:`random_support`
(the paper's ablation: a data-independent support set).

References:

.. [FBO-FedGP] Secure federated Bayesian optimisation with distributed sparse GPs,
   Alg. 1 and App. D.3 (paper 000 in ``shared/papers``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from botorch.exceptions.errors import BotorchTensorDimensionError, InputDataError
from botorch.utils.sampling import draw_sobol_samples
from sklearn.cluster import KMeans
from torch import Tensor


def _as_points(name: str, X: Tensor) -> np.ndarray:
    if not isinstance(X, Tensor):
        raise TypeError(f"`{name}` must be a torch.Tensor, got {type(X).__name__}.")
    if X.ndim != 2 or X.shape[0] < 1 or X.shape[1] < 1:
        raise BotorchTensorDimensionError(
            f"`{name}` must be an `n x d` tensor with n, d >= 1, got shape {tuple(X.shape)}."
        )
    if not torch.isfinite(X).all():
        raise InputDataError(f"`{name}` contains NaN or infinite values.")
    return X.detach().to(device="cpu", dtype=torch.float64).numpy()


def _unique_rows(points: np.ndarray) -> np.ndarray:
    return np.unique(points, axis=0)


def local_centers(
    X: Tensor,
    k: int,
    tol: float = 1e-4,
    max_iter: int = 300,
    seed: int | None = None,
    noise_std: float = 0.0,
    min_cluster_size: int = 2,
    noise_seed: int | None = None,
) -> Tensor:
    r"""A client's k-means centres (LOCALCLUSTERING of Alg. 1).

    k-means++ seeding followed by Lloyd iterations (scikit-learn's ``KMeans`` with
    ``algorithm="lloyd"``, one initialisation). Lloyd stops when the centres move
    less than ``tol`` (scikit-learn's criterion: Frobenius norm of the centre shift
    relative to the mean per-dimension variance of ``X``) or after ``max_iter``
    iterations.

    Args:
        X: ``n x d`` local inputs.
        k: Number of centres; clipped to the number of distinct points in ``X``.
        tol: Relative convergence tolerance of Lloyd's iterations.
        max_iter: Maximum number of Lloyd iterations.
        seed: Seed of the k-means++ seeding (and of the noise if ``noise_seed`` is
            ``None``).
        noise_std: Standard deviation of Gaussian noise added to each centre before
            it leaves the client (0: exact centres). See the module docstring.
        noise_seed: Seed of the noise; ``None``: ``seed``. Whoever knows the noise's
            seed can subtract the noise, so a client passes a seed from its private
            randomness, never one derived from a public seed (FBO-FedGP's clients do,
            ``FBOFedGPSettings.center_noise``).
        min_cluster_size: Centres of clusters with fewer *distinct* points are not
            returned (a centre of one point, or of copies of one point, *is* that
            point, so the default 2 never sends a raw data point; 1 gives plain
            k-means); ``k`` is also capped at ``#distinct points // min_cluster_size``.
            If no cluster is large enough, the mean of all points is returned; if
            ``X`` has fewer distinct points than ``min_cluster_size``, no centre is.

    Returns:
        At most ``min(k, #distinct points) x d`` centres (dtype/device of ``X``);
        ``0 x d`` when ``X`` has fewer than ``min_cluster_size`` distinct points.
    """
    points = _as_points("X", X)
    if not isinstance(k, int | np.integer) or k < 1:
        raise ValueError(f"`k` must be a positive integer, got {k!r}.")
    if not tol >= 0:
        raise ValueError(f"`tol` must be non-negative, got {tol}.")
    if not isinstance(max_iter, int | np.integer) or max_iter < 1:
        raise ValueError(f"`max_iter` must be a positive integer, got {max_iter!r}.")
    if isinstance(noise_std, bool) or not (noise_std >= 0 and np.isfinite(noise_std)):
        raise ValueError(f"`noise_std` must be a finite non-negative number, got {noise_std}.")
    if not isinstance(min_cluster_size, int | np.integer) or min_cluster_size < 1:
        raise ValueError(
            f"`min_cluster_size` must be a positive integer, got {min_cluster_size!r}."
        )
    if points.shape[0] < min_cluster_size:
        raise ValueError(
            f"`X` has {points.shape[0]} points, fewer than `min_cluster_size`={min_cluster_size}."
        )
    distinct = _unique_rows(points)
    if distinct.shape[0] < min_cluster_size:  # every centre would be a raw point
        return torch.empty(0, points.shape[1], dtype=X.dtype, device=X.device)
    k = max(1, min(int(k), distinct.shape[0] // min_cluster_size))
    if k == distinct.shape[0] and min_cluster_size == 1:
        centers = distinct
    else:
        km = KMeans(
            n_clusters=k,
            init="k-means++",
            n_init=1,
            max_iter=int(max_iter),
            tol=float(tol),
            algorithm="lloyd",
            random_state=seed,
        ).fit(points)
        # distinct points per cluster: copies of one point do not make a cluster
        counts = np.array(
            [_unique_rows(points[km.labels_ == c]).shape[0] for c in range(k)], dtype=int
        )
        centers = km.cluster_centers_[counts >= min_cluster_size]
        if centers.shape[0] == 0:
            centers = points.mean(axis=0, keepdims=True)
    if noise_std > 0:
        rng = np.random.default_rng(seed if noise_seed is None else noise_seed)
        centers = centers + rng.normal(scale=noise_std, size=centers.shape)
    return torch.as_tensor(centers, dtype=X.dtype, device=X.device)


def global_support(
    centers: Sequence[Tensor],
    size: int,
    seed: int | None = None,
    max_iter: int = 300,
    tol: float = 1e-4,
) -> Tensor:
    r"""The server's support set from all clients' centres (GLOBALCLUSTERING).

    Pools the centres, seeds ``size`` centres by greedy farthest-first traversal
    starting from the centres of one randomly chosen client (all of them, or a
    random subset of ``size`` if it has more), then runs k-means on the pooled
    centres from that seeding.

    Args:
        centers: One ``k_i x d`` tensor of centres per client.
        size: The support-set size ``|S|``; clipped to the number of distinct
            pooled centres (Alg. 1 returns ``|Z| <= |S|``).
        seed: Seed for the choice of the starting client.
        max_iter: Maximum k-means iterations on the pooled centres.
        tol: Relative k-means tolerance.

    Returns:
        ``min(size, #distinct centres) x d`` support set (dtype/device of the first
        client's centres).
    """
    if len(centers) == 0:
        raise ValueError("`centers` is empty: no client sent centres.")
    if not isinstance(size, int | np.integer) or size < 1:
        raise ValueError(f"`size` must be a positive integer, got {size!r}.")
    arrays = [_as_points(f"centers[{i}]", c) for i, c in enumerate(centers)]
    d = arrays[0].shape[1]
    for i, a in enumerate(arrays):
        if a.shape[1] != d:
            raise BotorchTensorDimensionError(
                f"`centers[{i}]` has d={a.shape[1]} columns but `centers[0]` has d={d}."
            )
    ref = centers[0]
    pooled = _unique_rows(np.concatenate(arrays, axis=0))
    size = min(int(size), pooled.shape[0])
    if size == pooled.shape[0]:
        return torch.as_tensor(pooled, dtype=ref.dtype, device=ref.device)
    rng = np.random.default_rng(seed)
    start = _unique_rows(arrays[rng.integers(len(arrays))])
    if start.shape[0] > size:
        start = start[rng.choice(start.shape[0], size=size, replace=False)]
    init = _farthest_first(pooled, start, size)
    km = KMeans(n_clusters=size, init=init, n_init=1, max_iter=int(max_iter), tol=float(tol)).fit(
        pooled
    )
    return torch.as_tensor(km.cluster_centers_, dtype=ref.dtype, device=ref.device)


def _farthest_first(pool: np.ndarray, start: np.ndarray, size: int) -> np.ndarray:
    r"""Greedy farthest-first traversal of ``pool`` from ``start`` up to ``size`` points."""
    chosen = [c for c in start]
    dist = np.min(np.linalg.norm(pool[:, None, :] - start[None, :, :], axis=-1), axis=1)
    while len(chosen) < size:
        j = int(np.argmax(dist))
        chosen.append(pool[j])
        dist = np.minimum(dist, np.linalg.norm(pool - pool[j], axis=-1))
    return np.stack(chosen)


def random_support(bounds: Tensor, size: int, seed: int | None = None) -> Tensor:
    r"""A data-independent support set: a scrambled Sobol sample of the domain.

    The random-support ablation of [FBO-FedGP] (App. D.3); leaks nothing about the
    clients' data.

    Args:
        bounds: ``2 x d`` lower and upper bounds of the domain.
        size: Number of support points.
        seed: Seed of the Sobol scrambling.

    Returns:
        ``size x d`` support points (dtype/device of ``bounds``).
    """
    if bounds.ndim != 2 or bounds.shape[0] != 2:
        raise BotorchTensorDimensionError(
            f"`bounds` must be a `2 x d` tensor, got shape {tuple(bounds.shape)}."
        )
    if not torch.isfinite(bounds).all() or not (bounds[1] > bounds[0]).all():
        raise InputDataError("`bounds` must be finite with upper > lower in every dimension.")
    if not isinstance(size, int | np.integer) or size < 1:
        raise ValueError(f"`size` must be a positive integer, got {size!r}.")
    return draw_sobol_samples(bounds=bounds, n=int(size), q=1, seed=seed).squeeze(-2)
