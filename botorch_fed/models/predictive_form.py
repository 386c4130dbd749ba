r"""A GP posterior that is linear in the kernel against fixed anchor points.

The dPITC and PIC posteriors (:class:`~botorch_fed.models.FederatedPITCGP`,
:class:`~botorch_fed.models.FederatedPICGP`) only depend on a test input ``x``
through ``k(x) = K(anchors, x)``, the kernel against fixed points (the support set,
plus the own block for PIC), and through the prior at ``x``::

    mean(x)     = mu(x) + k(x)' a
    cov(x, x')  = K(x, x') - sum_r s_r (R k(x))_r (R k(x'))_r

with weights ``a``, root rows ``R`` and signs ``s_r = +1`` (a subtracted square,
e.g. ``W = L^-1 K_S*``) or ``-1`` (an added one, e.g. ``C = L_B^-1 W``). Precomputing
``a`` and ``R`` once per model turns every prediction into one kernel evaluation and
two matrix products -- what gpytorch's exact-GP prediction caches do for an exact
GP -- instead of a chain of triangular solves, which matters inside an acquisition
optimiser that calls the posterior hundreds of times per step.

The roots are kept as a root (not as the matrix ``R' diag(s) R``): the squares are
formed from ``R k(x)``, as ``W'W`` is formed from ``W`` by the triangular-solve
formulas, so the form has the same rounding behaviour as those.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from gpytorch.kernels import Kernel
from gpytorch.means import Mean
from torch import Tensor

from botorch_fed.models.pitc_summary import evaluate64


def triangular_inverse(L: Tensor) -> Tensor:
    r"""``L^-1`` of a lower-triangular ``batch x m x m`` matrix (by a triangular solve).

    Args:
        L: Lower-triangular, non-singular.

    Returns:
        The lower-triangular inverse, same shape and dtype.
    """
    eye = torch.eye(L.shape[-1], dtype=L.dtype, device=L.device).expand_as(L)
    return torch.linalg.solve_triangular(L, eye, upper=False)


@dataclass(frozen=True)
class PredictiveForm:
    r"""``mean = mu + K_*Z a`` and ``cov = K_** - (R K_Z*)' diag(s) (R K_Z*)``.

    Attributes:
        anchors: ``p x d`` anchor points ``Z`` in the model's (transformed) input
            space, float64.
        weights: ``batch_shape x p`` mean weights ``a``.
        roots: ``batch_shape x r x p`` root rows ``R``.
        signs: ``r`` signs (``+1``: the row's square is subtracted, ``-1``: added).
    """

    anchors: Tensor
    weights: Tensor
    roots: Tensor
    signs: Tensor

    @classmethod
    def build(
        cls, anchors: Tensor, weights: Tensor, parts: list[tuple[Tensor, float]]
    ) -> PredictiveForm:
        r"""Stack root blocks.

        Args:
            anchors: ``p x d`` anchors.
            weights: ``batch_shape x p`` mean weights.
            parts: ``(rows, sign)`` pairs, ``rows`` of shape ``batch_shape x r_i x p``
                (broadcastable batch shapes).

        Returns:
            The form (detached).
        """
        batch = torch.broadcast_shapes(*(rows.shape[:-2] for rows, _ in parts))
        roots = torch.cat([rows.expand(*batch, *rows.shape[-2:]) for rows, _ in parts], dim=-2)
        signs = torch.cat(
            [torch.full((rows.shape[-2],), float(sign), dtype=roots.dtype) for rows, sign in parts]
        ).to(roots.device)
        return cls(anchors.detach(), weights.detach(), roots.detach(), signs)

    def predict(self, covar_module: Kernel, mean_module: Mean, X: Tensor) -> tuple[Tensor, Tensor]:
        r"""Latent float64 mean and covariance at transformed inputs ``X``.

        Args:
            covar_module: The kernel the form was built with.
            mean_module: The prior mean.
            X: ``batch_shape x q x d`` transformed inputs (any floating dtype).

        Returns:
            ``(mean, cov)`` of shapes ``batch x q`` and ``batch x q x q`` (``batch``
            the broadcast of ``X``'s and the form's batch shapes), float64,
            differentiable in ``X``.
        """
        X64 = X.to(torch.float64)
        Z = self.anchors.expand(*X64.shape[:-2], *self.anchors.shape)
        # one kernel evaluation against [Z; X]: q x p cross terms, then q x q
        K_all = evaluate64(covar_module, X64, torch.cat([Z, X64], dim=-2))
        p = self.anchors.shape[-2]
        K, K_UU = K_all[..., :p], K_all[..., p:]  # batch x q x p, batch x q x q
        mean = evaluate64(mean_module, X64) + (K @ self.weights.unsqueeze(-1)).squeeze(-1)
        Y = K @ self.roots.mT  # batch x q x r
        cov = K_UU - (Y * self.signs) @ Y.mT
        return mean, 0.5 * (cov + cov.mT)
