r"""Nystrom feature maps with variance-driven dictionary sampling ([LDP-BO] Alg. 4).

LDP-ATA-GP-UCB (Alg. 1, line 6) and MoMA-GP-UCB (Alg. 3, line 7) of [LDP-BO] replace
the kernel's infinite feature map by a finite one built on a *dictionary*
``D = {x_i1, ..., x_im}`` drawn from the points played so far (Appendix D.3, Alg. 4,
after its refs. [5] (Calandriello et al.'s BKB) and [7] (Chowdhury & Gopalan)):

1. Lines 3-6 (:func:`sample_dictionary`): each played point ``x_i`` enters ``D``
   independently with probability ``p_i = min(q sigma~_{t-1}^2(x_i), 1)``, where
   ``sigma~_{t-1}^2`` is the current (approximate) posterior variance and ``q`` the
   rate of Lemma 8, ``q = 6 rho ln(2T / delta) / eps^2`` with
   ``rho = (1 + eps) / (1 - eps)``. A dictionary is a *set*: a point played several
   times enters at most once (a repeated row adds nothing to the span of
   ``{k(x_i, .)}``, so the feature map does not change; it only makes ``K_D``
   singular).
2. Line 7 (:class:`NystromEmbedding`): ``phi(x) = (K_D^{1/2})^+ k_D(x)`` with
   ``K_D = [k(u, v)]_{u, v in D}`` and ``k_D(x) = [k(u, x)]_{u in D}``, so that
   ``phi(x)' phi(x') = k_D(x)' K_D^+ k_D(x')`` is the Nystrom approximation of
   ``k(x, x')``; it is exact whenever ``x`` or ``x'`` lies in ``D``.

Definition 2 calls ``D`` ``eps``-accurate when the reweighted dictionary's covariance
operator is within a factor ``1 +- eps`` of the full one (Loewner order); Lemma 8 says
that Alg. 4 with the rate above is ``eps``-accurate for all rounds with probability
``1 - delta`` and keeps ``m = O(q gamma_t)``. Note that the expected dictionary size is
``sum_i min(q sigma~^2(x_i), 1) <= q sum_i sigma^2(x_i) = q lambda d_eff`` (``d_eff =
tr(K (K + lambda I)^-1)``): with Lemma 8's ``q`` (hundreds) the dictionary is a strict
subset of the plays only once ``t`` is well above ``q lambda d_eff`` (measured: SE
kernel, ``l = 0.2`` on ``[0, 1]``, ``lambda = 1``, ``t = 300``: ``q = 626``, ``d_eff = 6``,
every point enters). The paper's ``sigma~^2`` is the unscaled posterior variance of its
eq. (3) (noise ``lambda``); ridge leverage scores are ``sigma^2 / lambda``, the same at
``lambda = 1``. With ``lambda = 0.01`` and the paper's rule (same setting otherwise) ``m``
was about 50 of 300 and Definition 2's deviation 0.4-0.8, above ``eps = 0.5``, although
the Nystrom kernel itself was accurate (``tests/models/test_nystrom.py``).
:func:`sample_dictionary` takes the variances as given: the caller picks the scaling.

Numerics: ``K_D`` is evaluated in float64 (on a private float64 copy of the kernel) and
factorised once by ``eigh``; eigenvalues at or below ``rtol`` times the largest are
dropped (the pseudo-inverse of line 7), which caps the amplification of ``phi`` at
``(rtol * max eig)^{-1/2}`` and leaves ``phi(x)' phi(x')`` with an absolute rounding
error of order ``eps_64 m^{1/2} / rtol^{1/2}`` (about ``2e-11 sqrt(m)`` at the default
``rtol = 1e-10``) and a truncation error of at most ``rtol`` times ``||K_D||`` on the
dictionary.

References:

.. [LDP-BO] X. Zhou, J. Tan. Local differential privacy for Bayesian optimization
   (paper 002 in ``shared/papers``), Alg. 1, 3 and 4, Definition 2, Lemmas 8-9.
"""

from __future__ import annotations

import copy
import math

import torch
from gpytorch import settings as gpytorch_settings
from gpytorch.kernels import Kernel
from torch import Tensor

__all__ = ["NystromEmbedding", "nystrom_embedding", "sample_dictionary"]


def _shape(value: object) -> object:
    return tuple(value.shape) if isinstance(value, Tensor) else type(value).__name__


def _check_points(X: Tensor, name: str, allow_batch: bool = False) -> None:
    r"""``X`` must be a finite floating tensor, ``n x d`` (or ``batch x n x d``)."""
    if not isinstance(X, Tensor):
        raise ValueError(f"`{name}` must be a Tensor, got {type(X).__name__}.")
    if (X.ndim < 2) if allow_batch else (X.ndim != 2):
        what = "`batch x n x d`" if allow_batch else "`n x d`"
        raise ValueError(f"`{name}` must be a {what} tensor, got shape {tuple(X.shape)}.")
    if not X.is_floating_point():
        raise ValueError(f"`{name}` must be a floating-point tensor, got dtype {X.dtype}.")
    if X.numel() and not bool(torch.isfinite(X).all()):
        raise ValueError(f"`{name}` contains NaN or infinite values.")


def _check_rate(q: float) -> float:
    if isinstance(q, Tensor):
        if q.numel() != 1:
            raise ValueError(f"`q` must be one number, got a tensor of shape {tuple(q.shape)}.")
        q = q.item()
    if isinstance(q, bool) or not isinstance(q, int | float):
        raise ValueError(f"`q` must be a positive finite number, got {q!r}.")
    if not (math.isfinite(q) and q > 0):
        raise ValueError(f"`q` must be a positive finite number, got {q!r}.")
    return float(q)


def sample_dictionary(
    X: Tensor,
    variances: Tensor,
    q: float,
    generator: torch.Generator | None = None,
) -> Tensor:
    r"""Draw a Nystrom dictionary from points by their variances ([LDP-BO] Alg. 4, l. 3-6).

    Row ``i`` of ``X`` is selected independently with probability
    ``min(q * variances[i], 1)`` (one uniform draw per row, in row order, from
    ``generator``). Rows that are exact duplicates of an earlier *selected* row are then
    dropped: the dictionary is a set of points, and a repeated point adds nothing to the
    span of the kernel sections (a learner that plays a point ``k`` times passes it
    ``k`` times; it enters the dictionary at most once, with the probability that at
    least one copy is drawn).

    Args:
        X: ``n x d`` points (the plays ``x_1, ..., x_n``; ``n`` may be 0).
        variances: ``n`` posterior variances ``sigma~_{t-1}^2(x_i) >= 0`` (finite).
            Negative values down to ``-64 eps(dtype) max(1, max|variances|)`` are
            treated as rounding and clamped to 0; anything below raises.
        q: The rate ``q > 0`` (finite), e.g. Lemma 8's ``6 rho ln(2T/delta) / eps^2``.
        generator: A seeded ``torch.Generator`` for reproducible draws (default: torch's
            global generator). The draws are made on the generator's device.

    Returns:
        The selected row indices, an increasing ``int64`` tensor of length ``m`` on
        ``X``'s device (``m = 0`` possible).
    """
    _check_points(X, "X")
    n = X.shape[0]
    if not isinstance(variances, Tensor) or variances.ndim != 1 or variances.shape[0] != n:
        raise ValueError(
            f"`variances` must be a 1-d tensor with one entry per row of `X` (n={n}), "
            f"got shape {_shape(variances)}."
        )
    if not variances.is_floating_point():
        raise ValueError(f"`variances` must be floating point, got dtype {variances.dtype}.")
    q = _check_rate(q)
    if n == 0:
        return torch.zeros(0, dtype=torch.long, device=X.device)
    v = variances.detach().to(device=X.device, dtype=torch.float64)
    if not bool(torch.isfinite(v).all()):
        bad = int((~torch.isfinite(v)).nonzero()[0])
        raise ValueError(f"`variances` must be finite, got {v[bad].item()} at index {bad}.")
    floor = -64 * torch.finfo(variances.dtype).eps * max(1.0, float(v.abs().max()))
    if bool((v < floor).any()):
        bad = int(v.argmin())
        raise ValueError(
            f"`variances` must be >= 0, got {v[bad].item():.6g} at index {bad} (below the "
            f"round-off allowance {floor:.3g})."
        )
    p = (q * v.clamp_min(0.0)).clamp_max(1.0)
    draw_device = generator.device if generator is not None else X.device
    u = torch.rand(n, generator=generator, dtype=torch.float64, device=draw_device)
    # u in [0, 1): p = 1 is always selected, p = 0 never
    selected = (u.to(X.device) < p).nonzero().squeeze(-1)
    if selected.numel() <= 1:
        return selected
    rows = X.detach()[selected]
    _, inverse = torch.unique(rows, dim=0, return_inverse=True)
    first = torch.full(
        (int(inverse.max()) + 1,), selected.numel(), dtype=torch.long, device=X.device
    )
    first = first.scatter_reduce(
        0, inverse, torch.arange(selected.numel(), device=X.device), reduce="amin"
    )
    return selected[first.sort().values]


class NystromEmbedding:
    r"""The Nystrom feature map ``phi(x) = (K_D^{1/2})^+ k_D(x)`` ([LDP-BO] Alg. 4, l. 7).

    ``K_D = U diag(s) U'`` (float64 ``eigh``); with ``r`` eigenvalues above
    ``rtol * max(s)`` kept, ``W = U_r diag(s_r^{-1/2}) U_r'`` (``m x m``, symmetric) is
    the pseudo-inverse square root and ``phi(x) = W k_D(x)``, so
    ``phi(x)' phi(x') = k_D(x)' K_D^+ k_D(x')``. The features are ``m``-dimensional
    (of rank ``r``); with an empty dictionary they are 0-dimensional and every model
    built on them is the prior.

    The embedding is immutable: it holds a float64 deep copy of the kernel (with its
    parameters frozen: the hyperparameters are fixed) and a copy of the dictionary.
    Features are differentiable with respect to the inputs.

    Example:
        >>> emb = NystromEmbedding(ScaleKernel(RBFKernel()), X_train[:10])
        >>> Phi = emb(X_train)  # n x 10, float64
    """

    def __init__(self, kernel: Kernel, dictionary: Tensor, rtol: float = 1e-10) -> None:
        r"""
        Args:
            kernel: A gpytorch kernel with fixed hyperparameters and no batch shape (not
                modified: a float64 copy is taken).
            dictionary: ``m x d`` dictionary points (``m`` may be 0). Duplicate rows are
                allowed (they only lower the rank).
            rtol: Relative eigenvalue cut-off in ``[0, 1)`` of ``K_D``'s pseudo-inverse.
                Values much below ``1e-12`` let rounding errors of ``k_D(x)``
                (``~1e-16``) be amplified by ``rtol^{-1/2}``.
        """
        if not isinstance(kernel, Kernel):
            raise ValueError(f"`kernel` must be a gpytorch Kernel, got {type(kernel).__name__}.")
        if kernel.batch_shape != torch.Size([]):
            raise ValueError(f"`kernel` must have no batch shape, got {tuple(kernel.batch_shape)}.")
        _check_points(dictionary, "dictionary")
        if isinstance(rtol, bool) or not isinstance(rtol, int | float) or not 0 <= rtol < 1:
            raise ValueError(f"`rtol` must be a number in [0, 1), got {rtol!r}.")
        device = dictionary.device
        k64 = copy.deepcopy(kernel).to(device=device, dtype=torch.float64)
        for p in k64.parameters():
            p.requires_grad_(False)
        self._kernel = k64
        self._dictionary = dictionary.detach().to(torch.float64).clone()
        self._rtol = float(rtol)
        self.indices: Tensor | None = None  # set by :func:`nystrom_embedding`
        m = self._dictionary.shape[0]
        if m == 0:
            self._W = torch.zeros(0, 0, dtype=torch.float64, device=device)
            self._rank = 0
            return
        K = self._evaluate(self._dictionary, self._dictionary)
        K = 0.5 * (K + K.mT)
        if not bool(torch.isfinite(K).all()):
            raise ValueError("`kernel` evaluated on `dictionary` gave non-finite values.")
        s, U = torch.linalg.eigh(K)
        s_max = float(s[-1])
        keep = s > self._rtol * s_max if s_max > 0 else torch.zeros_like(s, dtype=torch.bool)
        Ur = U[:, keep]
        self._W = (Ur * s[keep].rsqrt()) @ Ur.mT
        self._rank = int(keep.sum())

    # --- state ------------------------------------------------------------------------
    @property
    def kernel(self) -> Kernel:
        r"""The float64 copy of the kernel (frozen parameters; do not modify)."""
        return self._kernel

    @property
    def dictionary(self) -> Tensor:
        r"""``m x d`` float64 dictionary points (a copy)."""
        return self._dictionary.clone()

    @property
    def dim(self) -> int:
        r"""``m``, the feature dimension (the dictionary size)."""
        return int(self._dictionary.shape[0])

    @property
    def rank(self) -> int:
        r"""``r <= m``, the number of eigenvalues of ``K_D`` kept."""
        return self._rank

    @property
    def rtol(self) -> float:
        r"""The relative eigenvalue cut-off."""
        return self._rtol

    @property
    def input_dim(self) -> int:
        r"""``d``, the input dimension."""
        return int(self._dictionary.shape[1])

    @property
    def projection(self) -> Tensor:
        r"""``W = (K_D^{1/2})^+``, ``m x m`` float64 (a copy)."""
        return self._W.clone()

    # --- evaluation -------------------------------------------------------------------
    def _evaluate(self, A: Tensor, B: Tensor) -> Tensor:
        with gpytorch_settings.lazily_evaluate_kernels(False):
            out = self._kernel(A, B)
        return out.to_dense() if not isinstance(out, Tensor) else out

    def check_inputs(self, X: Tensor, name: str = "X") -> None:
        r"""Raise ``ValueError`` unless ``X`` is a finite ``batch x n x d`` tensor."""
        _check_points(X, name, allow_batch=True)
        if X.shape[-1] != self.input_dim:
            raise ValueError(
                f"`{name}` must have d={self.input_dim} columns (the dictionary's), got "
                f"shape {tuple(X.shape)}."
            )

    def kernel_matrix(self, X1: Tensor, X2: Tensor | None = None) -> Tensor:
        r"""``k(X1, X2)`` in float64 (``batch x n1 x n2``), differentiable in the inputs."""
        X1 = X1.to(torch.float64)
        X2 = X1 if X2 is None else X2.to(torch.float64)
        batch = torch.broadcast_shapes(X1.shape[:-2], X2.shape[:-2])
        return self._evaluate(X1.expand(*batch, *X1.shape[-2:]), X2.expand(*batch, *X2.shape[-2:]))

    def kernel_diag(self, X: Tensor) -> Tensor:
        r"""``k(x, x)`` at ``batch x n x d`` inputs: ``batch x n`` float64."""
        with gpytorch_settings.lazily_evaluate_kernels(False):
            out = self._kernel(X.to(torch.float64), diag=True)
        return out.to_dense() if not isinstance(out, Tensor) else out

    def __call__(self, X: Tensor) -> Tensor:
        r"""The features ``phi(x) = W k_D(x)`` of each row.

        Args:
            X: ``batch x n x d`` inputs (any floating dtype; on the dictionary's device).

        Returns:
            ``batch x n x m`` float64 features (``batch x n x 0`` for an empty
            dictionary), differentiable with respect to ``X``.
        """
        self.check_inputs(X)
        X64 = X.to(torch.float64)
        m = self.dim
        if m == 0:
            return X64.new_zeros(*X64.shape[:-1], 0)
        D = self._dictionary.expand(*X64.shape[:-2], m, self.input_dim)
        return self._evaluate(X64, D) @ self._W

    def __repr__(self) -> str:
        return (
            f"NystromEmbedding(dim={self.dim}, rank={self.rank}, input_dim={self.input_dim}, "
            f"kernel={type(self._kernel).__name__})"
        )


def nystrom_embedding(
    kernel: Kernel,
    X: Tensor,
    variances: Tensor,
    q: float,
    generator: torch.Generator | None = None,
    rtol: float = 1e-10,
) -> NystromEmbedding:
    r"""``NystromEmbedding`` of [LDP-BO] Alg. 4: sample a dictionary from ``X``, embed.

    Args:
        kernel: The gpytorch kernel (fixed hyperparameters, no batch shape).
        X: ``n x d`` points played so far.
        variances: ``n`` posterior variances ``sigma~_{t-1}^2(x_i)`` (see
            :func:`sample_dictionary`).
        q: The dictionary rate ``q > 0``.
        generator: A seeded ``torch.Generator`` (default: torch's global one).
        rtol: Relative eigenvalue cut-off of ``K_D``'s pseudo-inverse.

    Returns:
        The embedding on the dictionary ``X[idx]``; ``idx`` (increasing row indices into
        ``X``) is kept as its ``indices`` attribute.
    """
    idx = sample_dictionary(X, variances, q, generator=generator)
    embedding = NystromEmbedding(kernel, X[idx], rtol=rtol)
    embedding.indices = idx
    return embedding
