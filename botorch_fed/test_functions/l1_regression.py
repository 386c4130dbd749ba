r"""Least-absolute-deviations (L1) regression: a convex Lipschitz stochastic problem.

The test problem of zero-order federated convex optimisation ([FedZero], paper 004
in ``shared/papers``): each worker samples a context ``c`` (here a data row) and
queries the convex, Lipschitz ``f_c`` at two points; the population objective is
``f(x) = E_c f_c(x)``. For least-absolute-deviations regression on a fixed data set
``(A, b)`` with ``N`` rows and the context uniform on the rows,

.. math::

    f_c(x) = |a_c^\top x - b_c|, \qquad
    f(x) = \frac{1}{N} \sum_{i=1}^{N} |a_i^\top x - b_i|,

both convex and Lipschitz on all of ``R^d`` (minimisation, like every test function
of botorch-fed; ``negate=True`` returns ``-f``).

Data: from ``torch.Generator().manual_seed(function_seed)``, in this order (all
float64): the ``N x d`` matrix ``A`` with rows ``a_i ~ N(0, I_d / d)`` (so
``||a_i|| ~ 1``; ``torch.randn(N, d) / sqrt(d)``), the support of the planted
solution ``x*`` (``sparsity`` distinct coordinates, ``torch.randperm(d)[:sparsity]``)
and its values ``U[-0.5, 0.5]`` (``torch.rand(sparsity) - 0.5``), then the noise
``e ~ N(0, 1)`` (``torch.randn(N)``, drawn only when ``data_noise > 0``) and
``b = A x* + data_noise * e``. One ``function_seed`` is one data set, independent of
the global RNG and of the observation-noise ``seed``; ``FederationSetup`` passes
``function_seed=seed``, so all clients of a run share the data.

Optimum: with ``data_noise = 0`` the planted ``x*`` interpolates the data, so
``f(x*) = 0`` is the minimum (``optimal_value = 0.0`` exactly, ``optimizers = x*``).
Otherwise (or when custom ``bounds`` exclude ``x*``) the minimum over the box is
the linear programme

.. math::

    \min_{x, t} \frac{1}{N} \sum_i t_i \quad\text{s.t.}\quad
    -t_i \le a_i^\top x - b_i \le t_i, \quad \ell \le x \le u,

solved once in the constructor by ``scipy.optimize.linprog`` (HiGHS). It has
``d + N`` variables and ``2N`` inequality rows with ``2 N (d + 1)`` nonzeros (a
dense ``A`` is passed as a sparse matrix): the default ``N = 1000, d = 100`` takes
about 2 s on one CPU core. Instances with ``N * d > MAX_LP_SIZE`` (``4_000_000``) that
need the LP are refused with a ``ValueError`` (raise the class attribute at your
own cost, or use ``data_noise = 0``). ``optimal_value`` is ``f`` evaluated at the
LP's argmin (clipped to the box), so it is a true value of the function; the LP is
solved to HiGHS's default tolerances (``~1e-7``), so ``f(x) - optimal_value`` can
be slightly negative (at most about that tolerance) at points very near the optimum.

Lipschitz constant: the paper's Lipschitz assumption ([FedZero] Assumption 2.2) is
per context, ``|f_c(x) - f_c(y)| <= L ||x - y||`` for every ``c``; here
``L = max_i ||a_i||_2`` (:attr:`L1Regression.lipschitz`). The population ``f`` is
Lipschitz with ``mean_i ||a_i|| <= L``.

The function is defined on all of ``R^d``: a zero-order method may query points
slightly outside the box (``x + delta u``), so inputs are not checked against
``bounds`` (``_enforce_bounds = False``); ``bounds`` is the domain of the
optimisation (the projection set) and of ``optimal_value``.

References:

.. [FedZero] A. Akhavan, D. Janz, E.-M. El-Mhamdi. High-probability analysis of
   online and federated zero-order optimisation (paper 004 in ``shared/papers``),
   Sec. 2 (problem setting, Assumptions 2.1-2.3).
"""

from __future__ import annotations

import math
import numbers

import numpy as np
import torch
from botorch.test_functions.synthetic import SyntheticTestFunction
from torch import Tensor

from botorch_fed.test_functions.base import SeededNoiseMixin


def _is_real(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _is_int(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


class L1Regression(SeededNoiseMixin, SyntheticTestFunction):
    r"""``f(x) = (1/N) sum_i |a_i' x - b_i|``: least-absolute-deviations regression.

    Convex and Lipschitz on ``R^d``; a stochastic problem whose contexts are the
    ``N`` data rows (:meth:`evaluate_contexts`). See the module docstring for the
    data generation, the optimum and the Lipschitz constant.

    Args:
        dim: ``d >= 1``.
        num_data: ``N >= 1``, the number of data rows (contexts).
        sparsity: Number of nonzeros of the planted ``x*`` (``1 <= sparsity <= d``;
            ``None``: ``min(10, d)``).
        data_noise: Standard deviation (``>= 0``) of the Gaussian noise in ``b``.
            ``0``: ``x*`` interpolates and ``optimal_value = 0``; ``> 0``: the
            optimum comes from an LP (size limit ``MAX_LP_SIZE`` on ``N * d``).
        function_seed: Seed (``>= 0``) of the data: the same seed is the same data.
        noise_std: Standard deviation of additive Gaussian observation noise
            (``None``: none), drawn from the private generator (``seed``).
        negate: If True, return ``-f``.
        bounds: Custom domain as ``d`` ``(lower, upper)`` pairs (default
            ``[-1, 1]^d``).
        dtype: The dtype of ``bounds`` and ``optimizers``.
        seed: Seed of the private ``torch.Generator`` of the observation noise.
        generator: A ``torch.Generator`` to use instead of ``seed``.

    Attributes:
        A: ``N x d`` float64 design matrix (buffer).
        b: ``N`` float64 responses (buffer).
        solution: ``d`` float64 planted ``x*`` (buffer).
        optimizers: ``1 x d`` minimiser over the box (``x*`` when it interpolates
            and lies in the box, else the LP's argmin), in ``dtype``.
        optimal_value: ``0.0`` (interpolating ``x*``) or ``f`` at the LP's argmin.
        lipschitz: ``max_i ||a_i||_2`` (per-context Lipschitz constant).
        num_contexts: ``N``.

    Raises:
        ValueError: For a bad ``dim``, ``num_data``, ``sparsity``, ``data_noise``,
            ``function_seed`` or ``bounds``, or an LP beyond ``MAX_LP_SIZE``.
    """

    _enforce_bounds = False
    default_bound: tuple[float, float] = (-1.0, 1.0)
    MAX_LP_SIZE: int = 4_000_000
    A: Tensor  # buffers (registered in ``__init__``)
    b: Tensor
    solution: Tensor

    def __init__(
        self,
        dim: int = 100,
        num_data: int = 1000,
        sparsity: int | None = None,
        data_noise: float = 0.0,
        function_seed: int = 0,
        noise_std: float | None = None,
        negate: bool = False,
        bounds: list[tuple[float, float]] | None = None,
        dtype: torch.dtype = torch.double,
        seed: int | None = None,
        generator: torch.Generator | None = None,
    ) -> None:
        if not (_is_int(dim) and dim >= 1):
            raise ValueError(f"`dim` must be an integer >= 1, got {dim!r}.")
        if not (_is_int(num_data) and num_data >= 1):
            raise ValueError(f"`num_data` must be an integer >= 1, got {num_data!r}.")
        if sparsity is None and _is_int(dim) and dim >= 1:
            sparsity = min(10, int(dim))
        if sparsity is None or not (_is_int(sparsity) and 1 <= sparsity <= dim):
            raise ValueError(
                f"`sparsity` must be an integer with 1 <= sparsity <= dim = {dim}, "
                f"got {sparsity!r}."
            )
        if not (_is_real(data_noise) and 0 <= data_noise < math.inf):
            raise ValueError(f"`data_noise` must be a finite number >= 0, got {data_noise!r}.")
        if not (_is_int(function_seed) and function_seed >= 0):
            raise ValueError(
                f"`function_seed` must be a non-negative integer, got {function_seed!r}."
            )
        dim, num_data, sparsity = int(dim), int(num_data), int(sparsity)
        if bounds is None:
            low, high = self.default_bound
            bounds = [(low, high) for _ in range(dim)]
        try:
            pairs = [(float(lo), float(hi)) for lo, hi in bounds]
        except (TypeError, ValueError) as exc:
            raise ValueError(
                f"`bounds` must be {dim} (lower, upper) pairs, got {bounds!r}."
            ) from exc
        if len(pairs) != dim or not all(
            math.isfinite(lo) and math.isfinite(hi) and lo < hi for lo, hi in pairs
        ):
            raise ValueError(
                f"`bounds` must be {dim} finite (lower, upper) pairs with lower < upper, "
                f"got {bounds!r}."
            )
        self.dim = dim
        self.continuous_inds = list(range(dim))
        self.num_data = num_data
        self.sparsity = sparsity
        self.data_noise = float(data_noise)
        self.function_seed = int(function_seed)

        g = torch.Generator(device="cpu").manual_seed(self.function_seed)
        A = torch.randn(num_data, dim, generator=g, dtype=torch.float64) / math.sqrt(dim)
        support = torch.randperm(dim, generator=g)[:sparsity]
        solution = torch.zeros(dim, dtype=torch.float64)
        solution[support] = torch.rand(sparsity, generator=g, dtype=torch.float64) - 0.5
        b = self._products(solution.unsqueeze(0), A).squeeze(0)
        if self.data_noise > 0:
            b = b + self.data_noise * torch.randn(num_data, generator=g, dtype=torch.float64)

        lower = torch.tensor([p[0] for p in pairs], dtype=torch.float64)
        upper = torch.tensor([p[1] for p in pairs], dtype=torch.float64)
        in_box = bool(((solution >= lower) & (solution <= upper)).all())
        if self.data_noise == 0 and in_box:
            x_opt, f_opt = solution, 0.0
        else:
            x_opt = _lad_lp(A, b, lower, upper, self.MAX_LP_SIZE)
            residual = self._products(x_opt.unsqueeze(0), A).squeeze(0) - b
            f_opt = float(residual.abs().mean())
        self._optimal_value = f_opt
        self._optimizers = [tuple(float(v) for v in x_opt)]
        super().__init__(noise_std=noise_std, negate=negate, bounds=pairs, dtype=dtype)
        self._init_noise_rng(seed=seed, generator=generator)
        self.register_buffer("A", A)
        self.register_buffer("b", b)
        self.register_buffer("solution", solution)
        self._lipschitz = float(torch.linalg.vector_norm(A, dim=-1).max())

    @staticmethod
    def _products(X: Tensor, A: Tensor) -> Tensor:
        r"""``a_i' x`` for every point and row: ``... x d`` -> ``... x N`` (float64)."""
        return X.to(torch.float64) @ A.T

    def _evaluate_true(self, X: Tensor) -> Tensor:
        A = self.A.to(X.device)
        b = self.b.to(X.device)
        f = (self._products(X, A) - b).abs().mean(dim=-1)
        return f.to(X.dtype)

    def evaluate_contexts(self, X: Tensor, index: Tensor) -> Tensor:
        r"""The stochastic objective ``f_c(x) = |a_c' x - b_c|``, one context per point.

        Like :meth:`evaluate_true`: noise-free and not negated (``negate`` and
        ``noise_std`` apply in :meth:`forward` only).

        Args:
            X: ``batch_shape x d`` points (any float dtype; outside the box allowed).
            index: Integer tensor of context (row) indices in ``[0, N)`` whose shape
                broadcasts with ``batch_shape`` (typically equal to it).

        Returns:
            ``broadcast(batch_shape, index.shape)`` values, in ``X``'s dtype
            (computed in float64).

        Raises:
            ValueError: For a non-integer ``index``, indices out of range, or shapes
                that do not broadcast.
        """
        self._validate_X(X)
        index = torch.as_tensor(index, device=X.device)
        if index.is_floating_point() or index.is_complex() or index.dtype == torch.bool:
            raise ValueError(f"`index` must be an integer tensor, got {index.dtype}.")
        if index.numel() > 0 and (int(index.min()) < 0 or int(index.max()) >= self.num_data):
            raise ValueError(
                f"`index` must lie in [0, num_contexts = {self.num_data}), got values in "
                f"[{int(index.min())}, {int(index.max())}]."
            )
        try:
            shape = torch.broadcast_shapes(X.shape[:-1], index.shape)
        except RuntimeError as exc:
            raise ValueError(
                f"`index` of shape {tuple(index.shape)} does not broadcast with the batch "
                f"shape {tuple(X.shape[:-1])} of X."
            ) from exc
        index = index.long().expand(shape)
        A = self.A.to(X.device)
        b = self.b.to(X.device)
        rows = A[index]  # shape x d: one row per point, never batch x N x d
        values = (X.to(torch.float64).expand(*shape, self.dim) * rows).sum(-1) - b[index]
        return values.abs().to(X.dtype)

    def sample_contexts(
        self, shape: tuple[int, ...] | torch.Size, generator: torch.Generator | None = None
    ) -> Tensor:
        r"""Uniform context indices of ``shape`` (``torch.randint(N, shape)``), from
        ``generator`` (``None``: the global torch RNG)."""
        return torch.randint(self.num_data, tuple(shape), generator=generator)

    @property
    def data(self) -> tuple[Tensor, Tensor]:
        r"""``(A, b)``: the ``N x d`` design matrix and the ``N`` responses."""
        return self.A, self.b

    @property
    def lipschitz(self) -> float:
        r"""``L = max_i ||a_i||_2``: ``|f_c(x) - f_c(y)| <= L ||x - y||`` for every
        context ``c`` ([FedZero] Assumption 2.2 is per context)."""
        return self._lipschitz

    @property
    def num_contexts(self) -> int:
        r"""``N``, the number of contexts (data rows)."""
        return self.num_data

    def extra_repr(self) -> str:
        return (
            f"dim={self.dim}, num_data={self.num_data}, sparsity={self.sparsity}, "
            f"data_noise={self.data_noise:g}, function_seed={self.function_seed}"
        )


def _lad_lp(A: Tensor, b: Tensor, lower: Tensor, upper: Tensor, max_size: int) -> Tensor:
    r"""``argmin_{l <= x <= u} (1/N) sum_i |a_i' x - b_i|`` by HiGHS (see the module
    docstring), clipped to the box; float64 ``d`` tensor."""
    from scipy import optimize, sparse

    N, d = A.shape
    if N * d > max_size:
        raise ValueError(
            f"L1Regression: the optimum needs an LP with num_data * dim = {N * d} > "
            f"MAX_LP_SIZE = {max_size}; use data_noise=0 (planted optimum, no LP), a "
            "smaller instance, or raise L1Regression.MAX_LP_SIZE."
        )
    A_np = A.numpy()
    b_np = b.numpy()
    eye = sparse.identity(N, format="csr")
    A_csr = sparse.csr_matrix(A_np)
    # a_i'x - t_i <= b_i  and  -a_i'x - t_i <= -b_i
    A_ub = sparse.vstack(
        [sparse.hstack([A_csr, -eye]), sparse.hstack([-A_csr, -eye])], format="csr"
    )
    b_ub = np.concatenate([b_np, -b_np])
    c = np.concatenate([np.zeros(d), np.full(N, 1.0 / N)])
    box = [(float(lo), float(hi)) for lo, hi in zip(lower, upper, strict=True)]
    res = optimize.linprog(c, A_ub=A_ub, b_ub=b_ub, bounds=box + [(0.0, None)] * N, method="highs")
    if res.status != 0:  # pragma: no cover - the LP is always feasible and bounded
        raise RuntimeError(f"L1Regression: linprog failed: {res.message}")
    x = torch.as_tensor(res.x[:d], dtype=torch.float64)
    return torch.minimum(torch.maximum(x, lower), upper)


__all__ = ["L1Regression"]
