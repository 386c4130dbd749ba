r"""The knowledge gradient of one model, the terms of Co-KG [CoKG].

Each term of Co-KG is the expected maximum of a model's posterior mean after observing
a batch, as BoTorch's ``qKnowledgeGradient`` without ``current_value``:

- :func:`one_shot_kg_values`: the inner maxima at given per-fantasy points, decision
  variables optimised jointly with the batch ([Balandat2020botorch]);
- :func:`discrete_kg_values`: the inner maxima exact over a finite support, the fantasy
  posterior mean on the support from Gaussian conditioning on the sampler's draws
  (the slides' reparameterisation trick), with the support mean and the cross
  covariances of :func:`support_mean_and_cross_covariance`.

References:

.. [CoKG] D. Zhan, H. Zhang, R. Righter, Z. Zheng, J. Anderson. Collaborative Bayesian
   Optimization via Wasserstein Barycenters. CDC 2025 (slides: paper 001 in
   ``shared/papers``), "Co-KG: Mathematical Definition" and Alg. 1.
.. [Balandat2020botorch] M. Balandat et al. BoTorch: A Framework for Efficient
   Monte-Carlo Bayesian Optimization. NeurIPS 2020 (one-shot KG).
"""

from __future__ import annotations

from typing import Any

import torch
from botorch import settings
from botorch.acquisition.analytic import PosteriorMean
from botorch.exceptions.errors import UnsupportedError
from botorch.models.model import Model
from botorch.sampling.base import MCSampler
from linear_operator.utils.cholesky import psd_safe_cholesky
from torch import Tensor

# The discrete mode forms joint posteriors over the support and at most
# max(s, this) of the t-batch's points at a time (covariances of at most (2 s)^2 or
# (s + 1024)^2 entries), and conditioned means of at most this many entries at once
# (t-batches x num_fantasies x s; 128 MiB of float64).
_DISCRETE_CHUNK_POINTS = 1024
_DISCRETE_CHUNK_ENTRIES = 2**24


def one_shot_kg_values(
    model: Model, sampler: MCSampler, X_actual: Tensor, X_fantasies: Tensor
) -> Tensor:
    r"""One-shot KG of ``model`` at ``X_actual``, as ``qKnowledgeGradient.forward``.

    The expected maximum of the fantasy posterior mean, the maximum taken at the given
    per-fantasy points (no ``current_value`` subtracted).

    Args:
        model: A single-output model that fantasizes.
        sampler: The fantasy sampler, ``sample_shape = (num_fantasies,)``.
        X_actual: ``batch_shape x q x d`` points to observe.
        X_fantasies: ``batch_shape x num_fantasies x d``: the maximiser of fantasy
            ``i`` is ``X_fantasies[..., i, :]``.

    Returns:
        A ``batch_shape`` tensor.
    """
    # Model declares no ``fantasize`` (FantasizeMixin does): mypy sees nn.Module.__getattr__
    fantasy_model = model.fantasize(X=X_actual, sampler=sampler)  # type: ignore[operator]
    # batch x nf x d -> nf x batch x 1 x d (fantasy models have batch nf x batch)
    X_f = X_fantasies.permute(-2, *range(X_fantasies.dim() - 2), -1).unsqueeze(-2)
    with settings.propagate_grads(True):
        values = PosteriorMean(model=fantasy_model)(X_f)  # nf x batch
    return values.mean(dim=0)


def discrete_kg_values(
    model: Model, sampler: MCSampler, X_actual: Tensor, support: Tensor
) -> Tensor:
    r"""KG of ``model`` at ``X_actual`` with the inner max exact over ``support``.

    ``E_y[max_{s in support} E[f(s) | y(X_actual)]]`` by Gaussian conditioning on the
    sampler's draws of ``y ~ posterior(X_actual, observation_noise=True)`` (the draws
    ``model.fantasize`` would condition on):
    ``E[f(S) | y] = mu(S) + Sigma(S, X) (Sigma(X, X) + noise)^-1 (y - mu(X))``, with
    ``mu(S)`` and ``Sigma(X, S)`` from :func:`support_mean_and_cross_covariance`.

    Args:
        model: A single-output model with a Gaussian posterior and no batch shape.
        sampler: The fantasy sampler, ``sample_shape = (num_fantasies,)``.
        X_actual: ``batch_shape x q x d`` points to observe.
        support: ``s x d`` points over which the inner maximum is taken.

    Returns:
        A ``batch_shape`` tensor.
    """
    batch_shape, (q, d) = X_actual.shape[:-2], X_actual.shape[-2:]
    support = support.to(X_actual)
    s = support.shape[-2]
    noisy = model.posterior(X_actual, observation_noise=True)
    L = psd_safe_cholesky(_covariance(noisy)).expand(*batch_shape, q, q).reshape(-1, q, q)
    Y = sampler(noisy)[..., 0]  # nf x batch x q
    nf = Y.shape[0]
    # Model.posterior is typed as the abstract Posterior, which declares no ``mean``
    # (Gaussian here: _covariance checked it)
    resid = (Y - noisy.mean[..., 0]).reshape(nf, -1, q)  # type: ignore[attr-defined]
    # B x nf x q: the whitened residuals (the base samples when the sampler's factor is L)
    Z = torch.linalg.solve_triangular(L, resid.permute(1, 2, 0), upper=False).transpose(-1, -2)
    mu_S, cross = support_mean_and_cross_covariance(model, support, X_actual.reshape(-1, q, d))
    W = torch.linalg.solve_triangular(L, cross, upper=False)  # B x q x s
    B = L.shape[0]
    chunk = max(1, _DISCRETE_CHUNK_ENTRIES // (nf * s))  # t-batches per B x nf x s block
    out = []
    for lo in range(0, B, chunk):
        c = min(chunk, B - lo)
        Zc, Wc = Z[lo : lo + c], W[lo : lo + c]
        # The maximiser of each fantasy's mean without autograd, then its value with it:
        # the gradient of a max is the gradient at the argmax (ties have measure zero),
        # and the backward pass stays c x nf x q instead of c x nf x s.
        with torch.no_grad():
            idx = torch.baddbmm(mu_S.expand(c, 1, s), Zc, Wc).argmax(dim=-1)  # c x nf
        W_best = Wc.gather(-1, idx.unsqueeze(-2).expand(c, q, nf))  # c x q x nf
        best = mu_S[idx] + (Zc * W_best.transpose(-1, -2)).sum(dim=-1)  # c x nf
        out.append(best.mean(dim=-1))
    return torch.cat(out).reshape(batch_shape)


def support_mean_and_cross_covariance(
    model: Model, support: Tensor, X: Tensor
) -> tuple[Tensor, Tensor]:
    r"""The latent posterior mean on ``support`` and covariances between ``X`` and it.

    A model may provide this itself as a method
    ``support_mean_and_cross_covariance(support, X)`` with the same contract (used
    when present: a model with structure can skip the ``s x s`` block; returning
    ``NotImplemented`` falls back to the generic computation). Otherwise
    it comes from joint posteriors over the support and chunks of the points of ``X``
    flattened into one set (not the support repeated per t-batch, whose joint
    covariances would be ``B x (q + s)^2``): each chunk holds at most
    ``max(s, 1024)`` points.

    Args:
        model: A single-output model with a Gaussian posterior and no batch shape.
        support: ``s x d`` points.
        X: ``B x q x d`` points.

    Returns:
        ``(mean, cross)``: the ``s`` posterior mean on the support and the ``B x q x s``
        covariances ``Cov(f(X[b, i]), f(support[j]))`` (no observation noise).
    """
    hook = getattr(model, "support_mean_and_cross_covariance", None)
    if callable(hook):
        out = hook(support, X)
        if out is not NotImplemented:
            return out
    B, q, d = X.shape
    s = support.shape[-2]
    flat_X = X.reshape(-1, d)
    chunk = max(1, max(s, _DISCRETE_CHUNK_POINTS) // q)  # t-batches per joint posterior
    mean, cross = None, []
    for lo in range(0, B, chunk):
        c = min(chunk, B - lo)
        joint = model.posterior(torch.cat([support, flat_X[lo * q : (lo + c) * q]], dim=-2))
        if mean is None:
            # the abstract Posterior declares no ``mean`` (a Gaussian posterior here)
            mean = joint.mean[..., :s, 0]  # type: ignore[attr-defined]
        block = _covariance(joint, rows=slice(s, s + c * q), cols=slice(0, s))  # (c q) x s
        cross.append(block.reshape(c, q, s))
    assert mean is not None  # B >= 1 t-batches: the loop ran
    return mean, torch.cat(cross)


def _covariance(posterior: Any, rows: slice | None = None, cols: slice | None = None) -> Tensor:
    r"""A (block of the) covariance of a Gaussian single-output posterior, dense."""
    dist = getattr(posterior, "distribution", None)
    lazy = getattr(dist, "lazy_covariance_matrix", None)
    if lazy is None:
        raise UnsupportedError(
            "The discrete mode of qCoKnowledgeGradient needs a Gaussian posterior "
            f"(a GPyTorchPosterior); got {type(posterior).__name__}."
        )
    if rows is not None:
        lazy = lazy[..., rows, cols]
    return lazy.to_dense()
