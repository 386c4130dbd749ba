r"""The client-side federated PIC sparse GP (pPIC) as a BoTorch model.

PIC (partially independent conditional, [Snelson2007]) refines PITC at test points
that belong to one of the training blocks: there the covariance between the test
points and *that* block is the exact kernel, while every other block is seen
through the support set ``S`` as in PITC. In a federation ([Chen2013], pPIC) client
``i`` holds the federation's summed dPITC summary (over all clients' blocks, its own
included, :class:`~botorch_fed.models.sparse_summary.SparseSummary`) and its own raw
data block ``B = (X_B, y_B)``; the test points are treated as members of ``B``. So
predictions near the client's own data use the exact covariance with that data,
while the other clients' information enters through the support set. The block
data never leave the client: the model is built on the client, from the summary it
received and the data it holds.

With ``L = chol(K_SS)``, ``B~ = I + A~ = L_B L_B'``, ``v = L_B^-1 b~`` (see
:func:`~botorch_fed.models.sparse_summary.summary_factor`), ``W = L^-1 K_S*`` and
``C = L_B^-1 W`` (the PITC quantities of :class:`FederatedPITCGP`), and for the own
block::

    Phi_B = L^-1 K_SB,        Lam_B = K_BB - Phi_B' Phi_B + sigma^2 I,
    r_B   = y_B - mu(X_B),    R     = K_*B - W' Phi_B,
    D     = L_B^-1 Phi_B Lam_B^-1 R',

the predictive distribution is::

    mean = mu_* + (C - D)' v + R Lam_B^-1 r_B
    cov  = K_** - W'W - R Lam_B^-1 R' + (C - D)'(C - D)

which is ``mu_* + K~_*f (Q_ff + Lam)^-1 (y - mu)`` and
``K_** - K~_*f (Q_ff + Lam)^-1 K~_f*`` with the block-diagonal PITC ``Lam`` and
``K~_*f = Q_*f`` except on ``B``'s columns, where it is ``K_*B``. With a single
client whose block holds all the data it is the exact GP posterior, whatever the
support set; with a block far from the test points (``K_*B ~ 0``) it reduces to
PITC.

References:

.. [Snelson2007] E. Snelson and Z. Ghahramani. Local and global sparse Gaussian
   process approximations. AISTATS 2007.
.. [Chen2013] J. Chen, N. Cao, K. H. Low, R. Ouyang, C. K.-Y. Tan and P. Jaillet.
   Parallel Gaussian process regression with low-rank covariance matrix
   approximations. UAI 2013 (pPIC).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import fields
from typing import Any

import torch
from botorch import settings as botorch_settings
from botorch.exceptions.errors import (
    BotorchTensorDimensionError,
    InputDataError,
    UnsupportedError,
)
from botorch.models.transforms.input import InputTransform
from botorch.models.transforms.outcome import OutcomeTransform
from gpytorch import settings as gpytorch_settings
from gpytorch.kernels import Kernel
from gpytorch.likelihoods import Likelihood
from gpytorch.means import Mean
from torch import Tensor

from botorch_fed.models.float64 import evaluate64, noise64, prior_variance64
from botorch_fed.models.pitc import FederatedPITCGP
from botorch_fed.models.sparse_summary import SparseSummary
from botorch_fed.models.support_set import transform_support_inputs

_BLOCK_BUFFERS = ("_block_X", "_block_Y")


class FederatedPICGP(FederatedPITCGP):
    r"""Client-side distributed PIC sparse GP: dPITC plus the client's own data block.

    Built on client ``i`` from the federation's summed whitened summary (every
    client's block, ``i``'s included) and ``i``'s own data ``(X_B, y_B)``, which stay
    on the client. Test points are treated as members of the own block (see the
    module docstring for the predictive equations): near its own data the client
    predicts with the exact covariance, elsewhere the model is the dPITC model
    :class:`FederatedPITCGP`. With one client whose block is all the data the model
    is the exact GP posterior for any support set.

    Everything :class:`FederatedPITCGP` guarantees about stale state holds here too:
    the hyperparameter snapshot (``HyperparametersChangedError`` when the shared
    modules change after the summary was computed), ``.to()`` / ``.double()``
    keeping the float64 summary, support and block, and ``load_state_dict`` from
    another ``FederatedPICGP`` loading its summary and block together. The block can
    only be set through the constructor (``block_X`` and ``block_Y`` are read-only
    copies); the factorisation of ``Lam_B`` is cached with the other caches and
    rebuilt whenever the block buffers, the summary or the modules change.

    The summary must include the own block's summary, computed with the same
    hyperparameters, jitter and transforms (as :meth:`update_summary` requires for
    any summary); ``block_Y`` is in the outcome-transformed space the clients
    summarised in.

    Conditioning on new observations (``condition_on_observations``, ``fantasize``)
    is not supported: a new observation of the client belongs to its own block, so
    the block's share of the summary would have to be re-summarised.

    Example:
        >>> pitc = FederatedPITCGP(S, summed_summary, covar_module, likelihood)
        >>> Y_own_t = outcome_transform(Y_own)[0]  # eval mode: no re-training
        >>> model = FederatedPICGP.from_pitc(pitc, X_own, Y_own_t)
        >>> UCB = UpperConfidenceBound(model, beta=2.0)
    """

    # the own block's buffers (registered in ``__init__``)
    _block_X: Tensor
    _block_Y: Tensor

    def __init__(
        self,
        support: Tensor,
        summary: SparseSummary,
        covar_module: Kernel,
        likelihood: Likelihood,
        mean_module: Mean | None = None,
        outcome_transform: OutcomeTransform | None = None,
        input_transform: InputTransform | None = None,
        jitter: float | None = None,
        *,
        block_X: Tensor,
        block_Y: Tensor,
    ) -> None:
        r"""
        Args:
            support: ``m x d`` shared support set ``S`` (original input space).
            summary: The sum over *all* clients (this one included) of their whitened
                summaries on ``S`` (any batch shape; the model's batch shape is the
                summary's), computed with the current values of the modules below.
            covar_module: The shared kernel the summaries were computed with.
            likelihood: The shared ``GaussianLikelihood``.
            mean_module: The shared prior mean; ``None`` is a zero mean.
            outcome_transform: A *trained*, single-output outcome transform that the
                clients applied to their outcomes; posteriors are untransformed.
            input_transform: The shared input transform with fixed coefficients,
                applied to the support, the block and test inputs.
            jitter: Relative jitter of ``K_SS`` (must match the clients').
            block_X: ``n_B x d`` the client's own inputs (original input space, like
                ``support``), ``n_B >= 1``; no batch dimension. Stored in float64.
            block_Y: ``n_B x 1`` the client's own outcomes in the *outcome-transformed*
                space (the space the summary was computed in, e.g. ``Standardize``
                applied in eval mode). Stored in float64.
        """
        _check_block(block_X, block_Y, support)
        super().__init__(
            support,
            summary,
            covar_module,
            likelihood,
            mean_module,
            outcome_transform,
            input_transform,
            jitter,
        )
        if self._reads_are_free() and (self.summary_num_data < block_X.shape[0]).any():
            # the summary must include this block (its client summarised its own data too)
            raise ValueError(
                f"`summary` counts {self.summary_num_data.min().item():g} data points, fewer "
                f"than the {block_X.shape[0]} of `block_X`: it cannot include the client's "
                "own block."
            )
        device = self.support.device
        self.register_buffer("_block_X", block_X.detach().to(device, torch.float64).clone())
        self.register_buffer("_block_Y", block_Y.detach().to(device, torch.float64).clone())
        with torch.no_grad():  # Lam_B must be positive definite: fail here, not later
            S, L_S = self._support_factor()
            L_B, _ = self._summary_factor()
            self._block_factor(S, L_S, L_B)

    @classmethod
    def from_pitc(cls, model: FederatedPITCGP, block_X: Tensor, block_Y: Tensor) -> FederatedPICGP:
        r"""The PIC model of a client from its dPITC model and its own data.

        Shares ``model``'s modules (kernel, likelihood, mean, transforms) and jitter;
        the support and the summary are copied.

        Args:
            model: The federation's ``FederatedPITCGP`` (its summary includes this
                client's block), with hyperparameters still those of its summary.
            block_X: ``n_B x d`` the client's inputs (original input space).
            block_Y: ``n_B x 1`` the client's outcomes (outcome-transformed space).

        Returns:
            A ``FederatedPICGP`` with ``model``'s batch shape.

        Raises:
            HyperparametersChangedError: If ``model``'s modules changed since its
                summary was computed.
        """
        if not isinstance(model, FederatedPITCGP):
            raise TypeError(f"`model` must be a FederatedPITCGP, got {type(model).__name__}.")
        model.check_hyperparameters()
        summary = model.summary
        summary = SparseSummary(
            *(getattr(summary, f.name).detach().clone() for f in fields(summary))
        )
        return cls(
            model.support.detach().clone(),
            summary,
            model.covar_module,
            model.likelihood,
            model.mean_module,
            getattr(model, "outcome_transform", None),
            getattr(model, "input_transform", None),
            float(model.summary_jitter),
            block_X=block_X,
            block_Y=block_Y,
        )

    # --- the block ---------------------------------------------------------------
    @property
    def block_X(self) -> Tensor:
        r"""A copy of the ``n_B x d`` float64 block inputs (original input space)."""
        return self._block_X.clone()

    @property
    def block_Y(self) -> Tensor:
        r"""A copy of the ``n_B x 1`` float64 block outcomes (transformed space)."""
        return self._block_Y.clone()

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _BLOCK_BUFFERS and name in self.__dict__.get("_buffers", {}):
            raise AttributeError(
                f"`{name}` of a FederatedPICGP is set only by its constructor: build a new "
                "model (with a summary that includes the new block)."
            )
        super().__setattr__(name, value)

    def _load_from_state_dict(self, state_dict: dict, prefix: str, *args: Any) -> None:
        # another client's block may hold a different number of points: resize (a new
        # buffer, so the block cache is rebuilt), then let torch copy and check as usual
        for name in _BLOCK_BUFFERS:
            value = state_dict.get(prefix + name)
            current = self._buffers.get(name)
            if isinstance(value, Tensor) and current is not None and value.shape != current.shape:
                if value.ndim == 2 and value.shape[-1] == current.shape[-1]:
                    self._buffers[name] = current.new_empty(value.shape)
        super()._load_from_state_dict(state_dict, prefix, *args)

    def _block_key(self) -> tuple:
        return tuple((id(t), t.data_ptr(), t._version) for t in (self._block_X, self._block_Y))

    def _block_factor(self, S: Tensor, L_S: Tensor, L_B: Tensor) -> tuple[Tensor, ...]:
        r"""``(X_B, Phi_B, L_Lam, z, H)`` of the own block (float64).

        ``X_B`` transformed, ``Phi_B = L^-1 K_SB`` (``m x n_B``),
        ``L_Lam = chol(Lam_B)``, ``z = L_Lam^-1 r_B`` and
        ``H = L_B^-1 Phi_B L_Lam^-T`` (``batch x m x n_B``). Cached and detached
        exactly when the support and summary factors are (the base class clears
        ``_cache`` whenever the modules, summary or support change); the cache entry
        also records the block buffers (identity, storage, version, and on the CPU
        their values), so an in-place write or a load of the block rebuilds it.
        """
        live = botorch_settings.propagate_grads.on() or gpytorch_settings.detach_test_caches.off()
        key = self._block_key()
        entry = None if live else self._cache.get("block")
        if entry is not None:
            old_key, _, copies, factors = entry
            if old_key == key and (
                not self._reads_are_free()
                or (torch.equal(copies[0], self._block_X) and torch.equal(copies[1], self._block_Y))
            ):
                return factors
        with torch.set_grad_enabled(torch.is_grad_enabled() and live):
            factors = self._compute_block_factor(
                S, L_S, L_B, check=not live or self._reads_are_free()
            )
        if not live:
            # holding the buffers keeps their ids and storage from being reused; the
            # copies detect writes that bypass the version counter (``.data``)
            tensors = (self._block_X, self._block_Y)
            self._cache["block"] = (key, tensors, tuple(t.clone() for t in tensors), factors)
        return factors

    def _compute_block_factor(
        self, S: Tensor, L_S: Tensor, L_B: Tensor, check: bool
    ) -> tuple[Tensor, ...]:
        X_B = transform_support_inputs(self._block_X, getattr(self, "input_transform", None))
        factors = pic_block_factor(
            S, L_S, L_B, X_B, self._block_Y, self.covar_module, self.likelihood,
            self.mean_module, check=check,
        )  # fmt: skip
        return X_B, *factors

    # --- prediction --------------------------------------------------------------
    def _factors(self) -> tuple[Tensor, ...]:
        r"""The base class's factors followed by the own block's (:meth:`_block_factor`)."""
        S, L_S, L_B, v = super()._factors()
        return S, L_S, L_B, v, *self._block_factor(S, L_S, L_B)

    def _own_tensors(self) -> list[Tensor]:
        return [*super()._own_tensors(), self._block_X, self._block_Y]

    def _predict_from(
        self, factors: tuple[Tensor, ...], X: Tensor, diag: bool = False
    ) -> tuple[Tensor, Tensor]:
        r"""Latent float64 PIC mean (``batch x q``) and covariance (``batch x q x q``;
        with ``diag``, the variances, ``batch x q``) at transformed inputs ``X``, all
        treated as members of the own block, from given :meth:`_factors`."""
        return pic_predict(factors, self.covar_module, self.mean_module, X, diag=diag)

    # --- unsupported -------------------------------------------------------------
    def condition_on_observations(
        self, X: Tensor, Y: Tensor, noise: Tensor | None = None, **kwargs: Any
    ) -> FederatedPICGP:
        r"""Not supported for PIC.

        Raises:
            UnsupportedError: Always (see the class docstring).
        """
        raise UnsupportedError(_NO_CONDITIONING)

    def fantasize(self, *args: Any, **kwargs: Any) -> FederatedPICGP:
        r"""Not supported for PIC.

        Raises:
            UnsupportedError: Always (see the class docstring).
        """
        raise UnsupportedError(_NO_CONDITIONING)

    def _derived(self, summary: SparseSummary) -> FederatedPICGP:
        raise UnsupportedError(_NO_CONDITIONING)

    def _apply(self, fn: Callable[[Tensor], Tensor], recurse: bool = True) -> FederatedPICGP:
        r"""As :meth:`FederatedPITCGP._apply`; the block also stays float64."""
        kept = {n: t for n in _BLOCK_BUFFERS if (t := self._buffers.get(n)) is not None}
        if len(kept) < len(_BLOCK_BUFFERS):  # during construction
            return super()._apply(fn, recurse)
        for n in _BLOCK_BUFFERS:
            self._buffers[n] = None  # nn.Module._apply skips None buffers
        try:
            super()._apply(fn, recurse)
        finally:
            for n, t in kept.items():
                self._buffers[n] = t.to(device=self.support.device)
        if any(self._buffers[n] is not t for n, t in kept.items()):
            self._cache = {}  # the block moved (the base class kept its caches otherwise)
        return self


_NO_CONDITIONING = (
    "condition_on_observations / fantasize are not implemented for FederatedPICGP: a new "
    "observation of this client belongs to its own block, whose share of the summed "
    "summary would have to be re-summarised. Condition the FederatedPITCGP instead, or "
    "rebuild the PIC model from a new summary and block."
)


def _check_block(block_X: Tensor, block_Y: Tensor, support: Tensor) -> None:
    for name, value in (("block_X", block_X), ("block_Y", block_Y)):
        if not isinstance(value, Tensor):
            raise TypeError(f"`{name}` must be a torch Tensor, got {type(value).__name__}.")
        if not value.is_floating_point():
            raise InputDataError(f"`{name}` must be floating point, got {value.dtype}.")
    d = support.shape[-1] if isinstance(support, Tensor) and support.ndim == 2 else None
    if block_X.ndim != 2 or (d is not None and block_X.shape[-1] != d):
        raise BotorchTensorDimensionError(
            f"`block_X` must be an `n_B x d` tensor (no batch dimension) with d={d} as "
            f"`support`, got shape {tuple(block_X.shape)}."
        )
    n = block_X.shape[0]
    if n == 0:
        raise ValueError(
            "`block_X` is empty: a PIC model needs the client's own data block (n_B >= 1); "
            "a client without data predicts with FederatedPITCGP."
        )
    if block_Y.ndim != 2 or block_Y.shape != (n, 1):
        raise BotorchTensorDimensionError(
            f"`block_Y` must be `n_B x 1` with n_B={n} as `block_X`, got shape "
            f"{tuple(block_Y.shape)}."
        )
    for name, value in (("block_X", block_X), ("block_Y", block_Y)):
        if not torch.isfinite(value).all():
            raise InputDataError(f"`{name}` contains NaN or infinite values.")


def pic_block_factor(
    S: Tensor,
    L_S: Tensor,
    L_B: Tensor,
    X_B: Tensor,
    Y_B: Tensor,
    covar_module: Kernel,
    likelihood: Likelihood,
    mean_module: Mean,
    check: bool = True,
) -> tuple[Tensor, ...]:
    r"""``(Phi_B, L_Lam, z, H)`` of an own block (float64; see the module docstring).

    ``Phi_B = L^-1 K_SB`` (``m x n_B``), ``L_Lam = chol(Lam_B)``, ``z = L_Lam^-1 r_B`` and
    ``H = L_B^-1 Phi_B L_Lam^-T`` (``m x n_B``), with any batch shape that broadcasts
    (e.g. every member of a batch its own support, block and kernel).

    Args:
        S: ``batch x m x d`` transformed support.
        L_S: ``batch x m x m`` ``chol(K_SS)`` (jittered).
        L_B: ``batch x m x m`` ``chol(I + A~)`` of the summed summary.
        X_B: ``batch x n_B x d`` transformed block inputs.
        Y_B: ``batch x n_B x 1`` block outcomes (transformed space).
        covar_module: The kernel (batched like the inputs, or not).
        likelihood: The ``GaussianLikelihood``.
        mean_module: The prior mean.
        check: Raise if ``Lam_B`` is not positive definite (reads a flag).

    Raises:
        InputDataError: If ``check`` and ``Lam_B`` is not positive definite.
    """
    K_SB = evaluate64(covar_module, S.expand(*X_B.shape[:-2], *S.shape[-2:]), X_B)
    K_BB = evaluate64(covar_module, X_B, X_B)
    Phi = torch.linalg.solve_triangular(L_S, K_SB, upper=False)  # (k) x m x n_B
    noise = noise64(likelihood) * torch.ones_like(K_BB[..., 0])
    Lam = K_BB - Phi.mT @ Phi + torch.diag_embed(noise)
    L_Lam, info = torch.linalg.cholesky_ex(Lam)
    if check and (info != 0).any():
        raise InputDataError(
            "The own block's Lam_B = K_BB - Q_BB + noise is not positive definite: the "
            "noise variance is too small for float64 arithmetic at these "
            "hyperparameters (or `block_X` has duplicate points and zero noise)."
        )
    resid = Y_B.to(torch.float64).squeeze(-1) - evaluate64(mean_module, X_B)
    z = torch.linalg.solve_triangular(L_Lam, resid.unsqueeze(-1), upper=False).squeeze(-1)
    G = torch.linalg.solve_triangular(L_Lam, Phi.mT, upper=False)  # n_B x m: L_Lam^-1 Phi'
    H = torch.linalg.solve_triangular(L_B, G.mT, upper=False)  # batch x m x n_B
    return Phi, L_Lam, z, H


def pic_predict(
    factors: tuple[Tensor, ...],
    covar_module: Kernel,
    mean_module: Mean,
    X: Tensor,
    diag: bool = False,
) -> tuple[Tensor, Tensor]:
    r"""Latent float64 PIC mean and covariance at transformed inputs ``X``, all treated
    as members of the own block (the module docstring's equations).

    Args:
        factors: ``(S, L_S, L_B, v, X_B, Phi_B, L_Lam, z, H)``: the support and summary
            factors (:func:`~botorch_fed.models.support_set.support_factor`,
            :func:`~botorch_fed.models.sparse_summary.summary_factor`), the transformed
            block inputs and :func:`pic_block_factor`'s, with batch shapes that broadcast
            with ``X``'s.
        covar_module: The kernel.
        mean_module: The prior mean.
        X: ``batch x q x d`` test inputs (transformed).
        diag: Return the variances (``batch x q``) instead of the covariance.

    Returns:
        ``(mean, cov)``: ``batch x q`` and ``batch x q x q`` (or ``batch x q``).
    """
    S, L_S, L_B, v, X_B, Phi, L_Lam, z, H = factors
    X64 = X.to(torch.float64)
    batch = X64.shape[:-2]
    K_SU = evaluate64(covar_module, S.expand(*batch, *S.shape[-2:]), X64)
    # apart from K_SU: the distances of X to the block's own points must not depend
    # on the support's (a kernel such as Matern-1/2 amplifies their rounding)
    K_UB = evaluate64(covar_module, X64, X_B.expand(*batch, *X_B.shape[-2:]))
    W = torch.linalg.solve_triangular(L_S, K_SU, upper=False)  # batch x m x q
    C = torch.linalg.solve_triangular(L_B, W, upper=False)
    R = K_UB - W.mT @ Phi  # batch x q x n_B: the exact part the support misses
    T = torch.linalg.solve_triangular(L_Lam, R.mT, upper=False)  # L_Lam^-1 R'
    E = C - H @ T  # C - D
    mean = evaluate64(mean_module, X64)
    mean = mean + (E * v.unsqueeze(-1)).sum(dim=-2) + (T * z.unsqueeze(-1)).sum(dim=-2)
    if diag:
        prior = prior_variance64(covar_module, X64)
        return mean, prior - W.pow(2).sum(-2) - T.pow(2).sum(-2) + E.pow(2).sum(-2)
    K_UU = evaluate64(covar_module, X64, X64)
    cov = K_UU - W.mT @ W - T.mT @ T + E.mT @ E
    return mean, 0.5 * (cov + cov.mT)
