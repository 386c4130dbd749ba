r"""The whitened dPITC summary a client sends, and what every party computes from a sum.

A client's :class:`SparseSummary` holds its data projected on the shared support set
``S`` and whitened with ``L = chol(K_SS)`` (eq. 6-7 of [FBO-FedGP], App. A):
``b~_i = L^-1 K_Si Lambda_i^-1 (y_i - mu_i)``, ``A~_i = L^-1 K_Si Lambda_i^-1 K_iS L^-T``,
and the scalars the marginal likelihood needs: ``y_i' Lambda_i^-1 y_i``,
``log|Lambda_i|`` and ``n_i`` (computed by
:func:`~botorch_fed.models.local_summary.compute_local_summary`). Whitened summaries are
O(1)-scaled and well conditioned, so noise added by secure aggregation (CKKS) is not
amplified in the posterior.

The server only ever adds summaries (``+``), so the sum can be formed under secure
aggregation from the flat float64 vectors produced by :meth:`SparseSummary.to_numpy`.
From the sum every party factorises ``B = I + sum_i A~_i`` (:func:`summary_factor`, for
the predictive distribution, eq. 9-10) and evaluates the PITC log marginal likelihood
(:func:`pitc_log_marginal_likelihood`).

References:

.. [FBO-FedGP] Secure federated Bayesian optimisation with distributed sparse GPs,
   Sec. 2 and App. A (paper 000 in ``shared/papers``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, fields

import numpy as np
import torch
from botorch.exceptions.errors import InputDataError
from torch import Tensor

from botorch_fed.models.float64 import _to64


@dataclass
class SparseSummary:
    r"""Whitened dPITC summary of one client, of several stacked clients, or a sum.

    All fields share a (broadcastable) batch shape; a summary computed for one
    client has an empty batch shape. Summaries add elementwise (``s1 + s2``), which
    is the server's only operation.

    Attributes:
        b: ``batch_shape x m`` whitened projection ``L^-1 K_S Lambda^-1 (y - mu)``.
        A: ``batch_shape x m x m`` whitened precision ``L^-1 K_S Lambda^-1 K_S' L^-T``
            (symmetric positive semi-definite).
        quad: ``batch_shape`` quadratic form ``(y - mu)' Lambda^-1 (y - mu)``.
        logdet: ``batch_shape`` log-determinant ``log|Lambda|``.
        num_data: ``batch_shape`` number of observations (as a float tensor).
    """

    b: Tensor
    A: Tensor
    quad: Tensor
    logdet: Tensor
    num_data: Tensor

    @property
    def num_support(self) -> int:
        r"""The number ``m`` of support points the summary lives on."""
        return self.b.shape[-1]

    @property
    def batch_shape(self) -> torch.Size:
        r"""The broadcast batch shape of all fields."""
        return torch.broadcast_shapes(
            self.b.shape[:-1],
            self.A.shape[:-2],
            self.quad.shape,
            self.logdet.shape,
            self.num_data.shape,
        )

    def __add__(self, other: SparseSummary) -> SparseSummary:
        if not isinstance(other, SparseSummary):
            return NotImplemented
        if other.num_support != self.num_support:
            raise ValueError(
                "Cannot add summaries on different support sets: "
                f"{self.num_support} vs {other.num_support} support points."
            )
        return SparseSummary(
            *(getattr(self, f.name) + getattr(other, f.name) for f in fields(self))
        )

    def __radd__(self, other: SparseSummary | int) -> SparseSummary:
        # Lets the builtin ``sum`` start from 0.
        if isinstance(other, int) and other == 0:
            return self
        if not isinstance(other, SparseSummary):
            return NotImplemented
        return self.__add__(other)

    @staticmethod
    def sum(summaries: Iterable[SparseSummary]) -> SparseSummary:
        r"""Add a non-empty collection of summaries (in the given order).

        Args:
            summaries: The summaries to add.

        Returns:
            The summed summary.
        """
        summaries = list(summaries)
        if len(summaries) == 0:
            raise ValueError("`summaries` is empty: nothing to sum.")
        total = summaries[0]
        for s in summaries[1:]:
            total = total + s
        return total

    def unbind(self, dim: int = 0) -> list[SparseSummary]:
        r"""Split a summary of stacked clients along a batch dimension.

        Args:
            dim: The (non-negative) batch dimension to split along.

        Returns:
            A list of summaries, one per entry of that batch dimension.
        """
        batch_shape = self.batch_shape
        if not 0 <= dim < len(batch_shape):
            raise ValueError(f"`dim`={dim} is not a batch dimension of {batch_shape}.")
        m = self.num_support
        b = self.b.expand(*batch_shape, m)
        A = self.A.expand(*batch_shape, m, m)
        scalars = [t.expand(batch_shape) for t in (self.quad, self.logdet, self.num_data)]
        parts = zip(b.unbind(dim), A.unbind(dim), *(s.unbind(dim) for s in scalars), strict=True)
        return [SparseSummary(*p) for p in parts]

    def to(self, *args, **kwargs) -> SparseSummary:
        r"""Move/cast all fields, with the arguments of :meth:`torch.Tensor.to`."""
        return SparseSummary(*(getattr(self, f.name).to(*args, **kwargs) for f in fields(self)))

    @staticmethod
    def packed_length(num_support: int) -> int:
        r"""Length of the packed vector for ``num_support`` support points.

        Args:
            num_support: The number ``m`` of support points.

        Returns:
            ``m + m (m + 1) / 2 + 3`` (``b``, the upper triangle of ``A``, and the
            three scalars).
        """
        return num_support + num_support * (num_support + 1) // 2 + 3

    def pack(self) -> Tensor:
        r"""Pack into one flat tensor (differentiable).

        Returns:
            A ``batch_shape x P`` tensor with ``P = packed_length(m)``: ``b``, the
            row-major upper triangle of ``A`` (diagonal included), ``quad``,
            ``logdet`` and ``num_data``.
        """
        m = self.num_support
        batch_shape = self.batch_shape
        rows, cols = torch.triu_indices(m, m, device=self.A.device)
        parts = [
            self.b.expand(*batch_shape, m),
            self.A.expand(*batch_shape, m, m)[..., rows, cols],
            *(t.expand(batch_shape).unsqueeze(-1) for t in (self.quad, self.logdet, self.num_data)),
        ]
        dtype = torch.promote_types(self.b.dtype, self.A.dtype)
        return torch.cat([p.to(dtype) for p in parts], dim=-1)

    @classmethod
    def unpack(cls, packed: Tensor, num_support: int) -> SparseSummary:
        r"""Inverse of :meth:`pack` (differentiable).

        Args:
            packed: A ``batch_shape x P`` tensor with ``P = packed_length(m)``.
            num_support: The number ``m`` of support points.

        Returns:
            The summary; ``A`` is rebuilt symmetric from its upper triangle.
        """
        m = int(num_support)
        if m < 1:
            raise ValueError(f"`num_support` must be a positive integer, got {num_support}.")
        length = cls.packed_length(m)
        if packed.ndim < 1 or packed.shape[-1] != length:
            raise ValueError(
                f"A packed summary on {m} support points has length {length}, but the "
                f"vector has shape {tuple(packed.shape)}."
            )
        if not torch.isfinite(packed).all():
            raise InputDataError("The packed summary contains NaN or infinite values.")
        b = packed[..., :m]
        triu = packed[..., m : length - 3]
        rows, cols = torch.triu_indices(m, m, device=packed.device)
        upper = packed.new_zeros(*packed.shape[:-1], m, m)
        upper[..., rows, cols] = triu
        A = upper + upper.mT - torch.diag_embed(upper.diagonal(dim1=-2, dim2=-1))
        quad, logdet, num_data = packed[..., -3], packed[..., -2], packed[..., -1]
        return cls(b=b, A=A, quad=quad, logdet=logdet, num_data=num_data)

    def to_numpy(self) -> np.ndarray:
        r"""Pack into a flat float64 numpy vector for secure aggregation.

        Returns:
            A ``batch_shape x P`` float64 array (``P = packed_length(m)``), see
            :meth:`pack` for the layout.
        """
        return self.pack().detach().to(device="cpu", dtype=torch.float64).numpy()

    @classmethod
    def from_numpy(
        cls,
        vector: np.ndarray,
        num_support: int,
        dtype: torch.dtype = torch.float64,
        device: torch.device | str | None = None,
    ) -> SparseSummary:
        r"""Rebuild a summary from :meth:`to_numpy` output (or a sum of such vectors).

        Args:
            vector: A ``batch_shape x P`` array.
            num_support: The number ``m`` of support points.
            dtype: The dtype of the returned tensors.
            device: The device of the returned tensors.

        Returns:
            The summary.
        """
        array = np.asarray(vector, dtype=np.float64)
        return cls.unpack(torch.as_tensor(array, dtype=dtype, device=device), num_support)


_SUMMARY_FIELDS = ("b", "A", "quad", "logdet", "num_data")


def summary_factor(summary: SparseSummary, check: bool = True) -> tuple[Tensor, Tensor]:
    r"""``L_B = chol(I + A~)`` and ``v = L_B^-1 b~`` of a summed summary (float64).

    The one place both the predictive distribution (eq. 9-10) and the marginal
    likelihood factorise ``B = I + sum_i A~_i``.

    Args:
        summary: The sum of all clients' summaries.
        check: Raise if the factorisation fails (reads a flag: a host synchronisation
            on an accelerator). Skip only for summaries known to be valid.

    Returns:
        ``(L_B, v)`` with shapes ``batch_shape x m x m`` and ``batch_shape x m``.

    Raises:
        InputDataError: If ``I + A~`` is not positive definite (not a sum of valid
            client summaries).
    """
    A, b = _to64(summary.A), _to64(summary.b)
    eye = torch.eye(A.shape[-1], dtype=A.dtype, device=A.device)
    L_B, info = torch.linalg.cholesky_ex(eye + A)
    if check and (info != 0).any():
        raise InputDataError(
            "I + summary.A is not positive definite: the summary is not a sum of "
            "valid client summaries (corrupted or wrongly aggregated)."
        )
    v = torch.linalg.solve_triangular(L_B, b.unsqueeze(-1), upper=False).squeeze(-1)
    return L_B, v


def pitc_log_marginal_likelihood(summary: SparseSummary) -> Tensor:
    r"""Exact log marginal likelihood of the PITC model from the *summed* summary.

    With ``B = I + sum_i A~_i`` and ``b~ = sum_i b~_i`` (DESIGN.md):

        y'(Q + Lambda)^-1 y = sum_i y_i' Lambda_i^-1 y_i - b~' B^-1 b~,
        log|Q + Lambda|     = log|B| + sum_i log|Lambda_i|,

    so the likelihood needs only aggregated quantities.

    Args:
        summary: The sum of all clients' summaries.

    Returns:
        A ``batch_shape`` float64 tensor: ``log p(y)`` (not normalised by ``n``).
    """
    L_B, v = summary_factor(summary)
    logdet_B = 2 * L_B.diagonal(dim1=-2, dim2=-1).log().sum(dim=-1)
    n = _to64(summary.num_data)
    return -0.5 * (
        _to64(summary.quad)
        - v.pow(2).sum(dim=-1)
        + logdet_B
        + _to64(summary.logdet)
        + n * math.log(2 * math.pi)
    )
