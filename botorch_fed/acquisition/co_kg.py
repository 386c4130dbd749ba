r"""Co-KG: the collaborative knowledge gradient of [CoKG].

``N`` agents each hold a local GP ``f_n``; the server holds the central model ``f^c``
(their Wasserstein barycenter, :class:`~botorch_fed.models.BarycenterGP`) and assigns
agent ``n`` the point ``x_n`` of the batch ``x = (x_1, ..., x_N)`` maximising

    alpha(x) = E[ max_x' E[f^c(x') | y(x_1..x_N)] ]
               + beta_t * sum_n E[ max_x' E[f_n(x') | y_n(x_n)] ],

the q-KG of the central model at the whole batch (collaboration) plus ``beta_t`` times
each local model's KG at its own point (self-reliance). As BoTorch's
``qKnowledgeGradient`` without ``current_value``, the value is the expected maximum of
the updated posterior means; the KG proper subtracts the constants
``max mu^c + beta_t sum_n max mu_n``, which do not move the argmax.

Two modes:

- *one-shot* (default, continuous ``x'``): the inner maxima are decision variables
  optimised jointly with the batch ([Balandat2020botorch]): ``X`` is
  ``b x (N + num_fantasies * (1 + N)) x d`` -- the batch, then ``num_fantasies``
  maximisers for the central model, then ``num_fantasies`` for each local model in
  agent order. With ``beta = 0`` the local models are not evaluated and their blocks
  are left out: ``X`` is ``b x (N + num_fantasies) x d``, exactly
  ``qKnowledgeGradient``'s layout. Use :meth:`qCoKnowledgeGradient.
  get_augmented_q_batch_size` and :meth:`~qCoKnowledgeGradient.extract_candidates`
  (``optimize_acqf`` does).
- *discrete* (``discrete_support``: ``s x d``): the inner maxima are exact over the
  ``s`` support points and ``X`` is ``b x N x d``. The fantasy posterior mean on the
  support is the Gaussian conditioning formula of the slides (reparameterisation
  trick): ``mu(S) + Sigma(S, X) (Sigma(X, X) + noise)^-1 (y - mu(X))`` with ``y`` drawn
  by the sampler from ``posterior(X, observation_noise=True)`` -- the same draws and
  the same conditioning as ``model.fantasize`` for a Gaussian model, computed from
  joint posteriors instead of ``num_fantasies x b`` fantasy models. Its cost is the
  joint posterior over the support and the batch's points (an ``s x s`` block per call
  for a generic model); a model can supply ``mu(S)`` and ``Sigma(X, S)`` itself through
  a ``support_mean_and_cross_covariance(support, X)`` method and skip that block.

Both use fixed base samples (``SobolQMCNormalSampler``; the central sampler takes
``seed``, local sampler ``n`` takes ``seed + 1 + n``), so the value is a deterministic
function of ``X`` that L-BFGS-B can optimise.

References:

.. [CoKG] D. Zhan, H. Zhang, R. Righter, Z. Zheng, J. Anderson. Collaborative Bayesian
   Optimization via Wasserstein Barycenters. CDC 2025 (slides: paper 001 in
   ``shared/papers``), "Co-KG: Mathematical Definition" and Alg. 1.
.. [Balandat2020botorch] M. Balandat et al. BoTorch: A Framework for Efficient
   Monte-Carlo Bayesian Optimization. NeurIPS 2020 (one-shot KG).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from botorch.acquisition.knowledge_gradient import qKnowledgeGradient
from botorch.exceptions.errors import BotorchTensorDimensionError, UnsupportedError
from botorch.models.model import Model
from botorch.sampling.base import MCSampler
from botorch.sampling.normal import SobolQMCNormalSampler
from botorch.utils.transforms import t_batch_mode_transform
from torch import Tensor
from torch.nn import ModuleList

from botorch_fed.acquisition._rng import SeedLike, derived_seed, resolve_seed
from botorch_fed.acquisition.co_inputs import (
    _check_beta,
    _check_models,
    _check_points,
    _check_q_X,
    _check_sampler,
    _input_dim,
    _models,
    _samplers,
)
from botorch_fed.acquisition.kg_values import discrete_kg_values, one_shot_kg_values


class qCoKnowledgeGradient(qKnowledgeGradient):
    r"""Co-KG of [CoKG]: central batch q-KG plus ``beta`` times the agents' own KG.

    For the batch ``x_1..x_N`` (``X[..., :N, :]``, agent ``n`` gets ``x_n``)

        value = qKG(central_model; x_1..x_N) + beta * sum_n KG(local_models[n]; x_n),

    Monte Carlo with fixed base samples. See the module docstring for the one-shot and
    the discrete mode and the layout of ``X``. A ``qKnowledgeGradient`` subclass, so
    ``optimize_acqf`` treats it as one-shot (``q = N``) and builds its initial
    conditions with ``gen_one_shot_kg_initial_conditions`` (which works with the
    augmented layout, but seeds the local blocks with the *central* model's
    maximisers). :func:`~botorch_fed.acquisition.optimize_co_acquisition` seeds each
    block from its own model instead. With ``discrete_support`` there are no fantasy
    points and BoTorch's one-shot initialiser fails (``cannot sample n_sample <= 0
    samples``): use :func:`~botorch_fed.acquisition.optimize_co_acquisition`, or
    ``optimize_acqf(..., ic_generator=gen_batch_initial_conditions)``.

    Example:
        >>> acqf = qCoKnowledgeGradient(central, [local_1, local_2], beta=0.5,
        ...                             num_fantasies=32, seed=0)
        >>> X_full = torch.rand(acqf.get_augmented_q_batch_size(2), 2)
        >>> acqf(X_full), acqf.extract_candidates(X_full).shape  # (value, 2 x 2)
    """

    sampler: MCSampler  # qKnowledgeGradient's is optional; the constructor always sets one

    def __init__(
        self,
        central_model: Model,
        local_models: Sequence[Model],
        beta: float = 0.0,
        num_fantasies: int | None = 64,
        sampler: MCSampler | None = None,
        local_samplers: Sequence[MCSampler] | None = None,
        discrete_support: Tensor | None = None,
        seed: SeedLike = None,
    ) -> None:
        r"""
        Args:
            central_model: The central (barycenter) model; single output, fantasizes.
            local_models: The ``N >= 1`` agents' models, in agent order; single output.
                Not evaluated when ``beta = 0``.
            beta: ``beta_t >= 0`` of this round (see :class:`BetaSchedule`).
            num_fantasies: Fantasies per model (``None``: taken from ``sampler``).
            sampler: The central model's fantasy sampler (default
                ``SobolQMCNormalSampler(num_fantasies, seed=seed)``).
            local_samplers: ``N`` fantasy samplers, one per local model (default
                ``SobolQMCNormalSampler(num_fantasies, seed=seed + 1 + n)``).
            discrete_support: ``s x d`` points: the inner maxima are taken exactly over
                them and ``X`` holds only the batch (``b x N x d``). The models then need
                Gaussian posteriors and no batch shape; a model with a method
                ``support_mean_and_cross_covariance(support, X)`` (see
                :func:`~botorch_fed.acquisition.kg_values.support_mean_and_cross_covariance`)
                is evaluated through it.
            seed: Seeds the default samplers: an ``int``, a ``torch.Generator`` /
                ``numpy.random.Generator`` (one integer is drawn), or ``None`` (fresh
                entropy; fixed for the lifetime of this object either way).
        """
        central_model, local_models = _check_models(central_model, local_models)
        beta = _check_beta(beta)
        if num_fantasies is None:
            if sampler is None:
                raise ValueError("Pass `num_fantasies` or a `sampler`.")
            num_fantasies = sampler.sample_shape[0] if sampler.sample_shape else 0
        if isinstance(num_fantasies, bool) or not isinstance(num_fantasies, int):
            raise ValueError(f"`num_fantasies` must be an int >= 1, got {num_fantasies!r}.")
        if num_fantasies < 1:
            raise ValueError(f"`num_fantasies` must be an int >= 1, got {num_fantasies}.")
        N = len(local_models)
        if sampler is None or local_samplers is None:
            s = resolve_seed(seed)
        if sampler is None:
            sampler = SobolQMCNormalSampler(torch.Size([num_fantasies]), seed=s)
        sampler = _check_sampler(sampler, "sampler", num_fantasies)
        if local_samplers is None:
            local_samplers = [
                SobolQMCNormalSampler(torch.Size([num_fantasies]), seed=derived_seed(s, 1 + n))
                for n in range(N)
            ]
        if isinstance(local_samplers, MCSampler) or not isinstance(
            local_samplers, Sequence | ModuleList
        ):
            raise ValueError(
                "`local_samplers` must be a sequence of N MCSamplers, got "
                f"{type(local_samplers).__name__}."
            )
        local_samplers = list(local_samplers)
        if len(local_samplers) != N:
            raise ValueError(
                f"`local_samplers` has {len(local_samplers)} samplers for N={N} local models."
            )
        local_samplers = [
            _check_sampler(smp, f"local_samplers[{n}]", num_fantasies)
            for n, smp in enumerate(local_samplers)
        ]
        if discrete_support is not None:
            discrete_support = _check_points(
                discrete_support, "discrete_support", _input_dim(central_model, local_models)
            )
            for name, m in [("central_model", central_model)] + [
                (f"local_models[{n}]", m) for n, m in enumerate(local_models)
            ]:
                try:
                    batch_shape = m.batch_shape
                except NotImplementedError:
                    continue
                if batch_shape is not None and len(batch_shape) > 0:
                    raise UnsupportedError(
                        f"The discrete mode needs models without a batch shape; `{name}` has "
                        f"batch_shape={tuple(batch_shape)}."
                    )
        super().__init__(model=central_model, num_fantasies=num_fantasies, sampler=sampler)
        self.local_models = ModuleList(local_models)
        self.local_samplers = ModuleList(local_samplers)
        self.beta = beta
        self.discrete_support = discrete_support

    @property
    def _input_dim(self) -> int | None:
        if self.discrete_support is not None:
            return self.discrete_support.shape[-1]
        return _input_dim(self.model, _models(self.local_models))

    @property
    def num_agents(self) -> int:
        r"""``N``, the number of agents (local models)."""
        return len(self.local_models)

    @property
    def uses_local_models(self) -> bool:
        r"""Whether the local terms are evaluated (``beta > 0``)."""
        return self.beta > 0

    def set_X_pending(self, X_pending: Tensor | None = None) -> None:
        r"""Pending points are not supported (every agent gets one point of the batch)."""
        if X_pending is not None:
            raise UnsupportedError("qCoKnowledgeGradient does not support `X_pending`.")
        # BoTorch's X_pending is inferred as Tensor, though its set_X_pending stores None too
        self.X_pending = None  # type: ignore[assignment]

    def get_augmented_q_batch_size(self, q: int) -> int:
        r"""The number of rows of ``X``: ``N`` (discrete), else ``N`` plus the
        fantasy maximisers (``num_fantasies`` per evaluated model).

        Args:
            q: Must equal ``N`` (one point per agent).

        Returns:
            ``N + num_fantasies * (1 + N)`` (one-shot, ``beta > 0``),
            ``N + num_fantasies`` (one-shot, ``beta = 0``) or ``N`` (discrete).
        """
        if q != self.num_agents:
            raise BotorchTensorDimensionError(
                f"`q` must equal the number of agents N={self.num_agents} (one point per "
                f"agent), got q={q}."
            )
        if self.discrete_support is not None:
            return q
        blocks = 1 + (self.num_agents if self.uses_local_models else 0)
        return q + self.num_fantasies * blocks

    def extract_candidates(self, X_full: Tensor) -> Tensor:
        r"""The agents' points ``X_full[..., :N, :]``.

        Args:
            X_full: ``b x q_aug x d`` (``q_aug`` from
                :meth:`get_augmented_q_batch_size`).

        Returns:
            ``b x N x d``: row ``n`` is agent ``n``'s point.
        """
        return X_full[..., : self.num_agents, :]

    def split(self, X: Tensor) -> tuple[Tensor, Tensor | None, list[Tensor]]:
        r"""Split a one-shot ``X`` into the batch and the fantasy maximisers.

        Args:
            X: ``batch_shape x q_aug x d``.

        Returns:
            ``(X_actual, X_central, X_locals)``: the ``batch_shape x N x d`` batch, the
            ``batch_shape x num_fantasies x d`` central maximisers (``None`` in the
            discrete mode) and a list of ``N`` such blocks for the local models (empty
            when ``beta = 0`` or discrete).
        """
        N, nf = self.num_agents, self.num_fantasies
        q_aug = self.get_augmented_q_batch_size(N)
        what = (
            "the N agents' points"
            if self.discrete_support is not None
            else (f"N={N} agents' points, then num_fantasies={nf} maximisers per evaluated model")
        )
        _check_q_X(X, q_aug, self._input_dim, what)
        if self.discrete_support is not None:
            return X, None, []
        X_actual, X_central = X[..., :N, :], X[..., N : N + nf, :]
        X_locals = [
            X[..., N + nf * (1 + n) : N + nf * (2 + n), :]
            for n in range(N if self.uses_local_models else 0)
        ]
        return X_actual, X_central, X_locals

    # BoTorch types the decorated method's ``self`` as any AcquisitionFunction, which
    # rejects every subclass's method
    @t_batch_mode_transform()  # type: ignore[arg-type]
    def forward(self, X: Tensor) -> Tensor:
        r"""Co-KG at ``X``.

        Args:
            X: ``b x q_aug x d`` (see :meth:`get_augmented_q_batch_size`): agent points
                first, then (one-shot mode) the fantasy maximisers.

        Returns:
            A ``b`` tensor: the Co-KG values (the expected maxima, see the module
            docstring).
        """
        X_actual, X_central, X_locals = self.split(X)
        value = self.central_value(X_actual, X_central)
        if self.uses_local_models:
            value = value + self.beta * self.local_values(X_actual, X_locals).sum(dim=0)
        return value

    def central_value(self, X_actual: Tensor, X_central: Tensor | None) -> Tensor:
        r"""The central q-KG term.

        Args:
            X_actual: ``batch_shape x N x d``.
            X_central: ``batch_shape x num_fantasies x d`` maximisers (one-shot mode),
                ``None`` in the discrete mode.

        Returns:
            A ``batch_shape`` tensor.
        """
        if self.discrete_support is not None:
            return discrete_kg_values(self.model, self.sampler, X_actual, self.discrete_support)
        assert X_central is not None  # one-shot mode: split() returned the maximisers
        return one_shot_kg_values(self.model, self.sampler, X_actual, X_central)

    def local_values(self, X_actual: Tensor, X_locals: Sequence[Tensor]) -> Tensor:
        r"""The agents' own KG terms (not multiplied by ``beta``).

        Args:
            X_actual: ``batch_shape x N x d``: local model ``n`` is evaluated at row
                ``n`` alone.
            X_locals: ``N`` blocks of ``batch_shape x num_fantasies x d`` maximisers
                (one-shot mode); ignored in the discrete mode.

        Returns:
            ``N x batch_shape`` (``0 x batch_shape`` when ``beta = 0``: not evaluated).
        """
        if not self.uses_local_models:
            return X_actual.new_zeros(0, *X_actual.shape[:-2])
        values = []
        for n, (model, sampler) in enumerate(
            zip(_models(self.local_models), _samplers(self.local_samplers), strict=True)
        ):
            x_n = X_actual[..., n : n + 1, :]
            if self.discrete_support is not None:
                values.append(discrete_kg_values(model, sampler, x_n, self.discrete_support))
            else:
                values.append(one_shot_kg_values(model, sampler, x_n, X_locals[n]))
        return torch.stack(values)

    # BoTorch's decorators type qKnowledgeGradient.evaluate as (self, X) -> Any, without
    # its ``bounds`` and ``**kwargs``; this is its actual signature
    def evaluate(self, X: Tensor, bounds: Tensor, **kwargs: Any) -> Tensor:  # type: ignore[override]
        r"""Co-KG at the batch ``X`` with the inner problems solved numerically.

        The central and each local term as ``qKnowledgeGradient.evaluate`` (its own
        multi-start search for each fantasy's maximiser); in the discrete mode this is
        :meth:`forward` (the inner maxima are exact already).

        Args:
            X: ``b x N x d`` agent points (no fantasy maximisers).
            bounds: ``2 x d`` bounds of the inner problems.
            kwargs: Passed to ``qKnowledgeGradient.evaluate`` (``num_restarts``,
                ``raw_samples``, ``options``, ``scipy_options``).

        Returns:
            A ``b`` tensor.
        """
        if X.ndim == 2:
            X = X.unsqueeze(0)
        _check_q_X(X, self.num_agents, self._input_dim, "the N agents' points")
        if self.discrete_support is not None:
            return self.forward(X)
        # (``bounds``: see the comment on this method)
        value = qKnowledgeGradient(self.model, num_fantasies=None, sampler=self.sampler).evaluate(
            X,
            bounds=bounds,  # type: ignore[call-arg]
            **kwargs,
        )
        if self.uses_local_models:
            for n, (model, sampler) in enumerate(
                zip(_models(self.local_models), _samplers(self.local_samplers), strict=True)
            ):
                kg = qKnowledgeGradient(model, num_fantasies=None, sampler=sampler)
                value = value + self.beta * kg.evaluate(
                    X[..., n : n + 1, :],
                    bounds=bounds,  # type: ignore[call-arg]
                    **kwargs,
                )
        return value
