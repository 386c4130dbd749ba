r"""Co-EI and Co-ES: the slides' other collaborative acquisitions of [CoKG].

Like Co-KG (:mod:`botorch_fed.acquisition.co_kg`) they score a batch ``x_1..x_N`` (one
point per agent, ``X[..., n, :]`` is agent ``n``'s) as a central batch term plus
``beta_t`` times each agent's own term at its point, built from BoTorch's classes:

- :class:`qCoExpectedImprovement`: ``qLogExpectedImprovement`` of the central model at
  the batch ``+ beta * sum_n LogExpectedImprovement`` of local model ``n`` at ``x_n``
  (a sum of logs: the log of ``qEI^c * prod_n EI_n^beta``).
- :class:`qCoMaxValueEntropy`: the batch GIBBON value of the central model [Moss2021]
  ``+ beta * sum_n qMaxValueEntropy`` of local model ``n`` at ``x_n``. BoTorch's
  ``qLowerBoundMaxValueEntropy`` scores one point at a time (``q = 1``; a batch is
  built greedily through ``X_pending``); the batch value used here is the sum of the
  GIBBON quality terms of the ``N`` points plus ``1/2 log det R``, ``R`` the
  correlation matrix of the noisy observations at the batch -- which is exactly the
  sum of BoTorch's greedy increments taken in agent order (the determinant's chain
  rule; tested).

The slides name Co-EI / Co-ES as baselines without formulas; these are the direct
analogues of Co-KG's structure.

References:

.. [CoKG] D. Zhan, H. Zhang, R. Righter, Z. Zheng, J. Anderson. Collaborative Bayesian
   Optimization via Wasserstein Barycenters. CDC 2025 (slides: paper 001 in
   ``shared/papers``), "Experimental Setup" (baselines Co-EI / Co-ES).
.. [Moss2021] H. B. Moss, D. S. Leslie, J. Gonzalez, P. Rayson. GIBBON: General-purpose
   Information-Based Bayesian OptimisatioN. JMLR 22(235), 2021.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Sequence

import torch
from botorch.acquisition.acquisition import AcquisitionFunction
from botorch.acquisition.analytic import LogExpectedImprovement
from botorch.acquisition.logei import qLogExpectedImprovement
from botorch.acquisition.max_value_entropy_search import (
    qLowerBoundMaxValueEntropy,
    qMaxValueEntropy,
)
from botorch.exceptions.errors import UnsupportedError
from botorch.models.model import Model
from botorch.sampling.base import MCSampler
from botorch.sampling.normal import SobolQMCNormalSampler
from botorch.utils.transforms import t_batch_mode_transform
from linear_operator.utils.cholesky import psd_safe_cholesky
from torch import Tensor
from torch.nn import ModuleList

from botorch_fed.acquisition._rng import SeedLike, derived_seed, isolated_seed, resolve_seed
from botorch_fed.acquisition.co_inputs import (
    _check_beta,
    _check_models,
    _check_points,
    _check_q_X,
    _input_dim,
    _models,
)

# MC samples of the central qLogEI (BoTorch's default sample shape).
DEFAULT_MC_SAMPLES = 512


def _training_points(model: Model) -> Tensor | None:
    r"""The model's (untransformed) training inputs, ``n x d``, if it has any."""
    try:
        if getattr(model, "_has_transformed_inputs", False):
            X = model._original_train_inputs
        else:
            # gpytorch's train_inputs (untyped): mypy sees nn.Module.__getattr__'s
            # Tensor | Module; a model without them raises, handled below
            X = model.train_inputs[0]  # type: ignore[index]
    except (AttributeError, IndexError, TypeError):
        return None
    return X if isinstance(X, Tensor) and X.ndim == 2 and X.shape[0] > 0 else None


def default_best_f(model: Model, support: Tensor | None = None, name: str = "model") -> Tensor:
    r"""The incumbent of EI: the maximum of ``model``'s posterior mean over points.

    The points are ``support`` if given, else the model's ``support`` attribute (a
    :class:`~botorch_fed.models.BarycenterGP`'s), else its training inputs. The
    posterior mean, not the observed maximum, because the server of Co-EI sees no
    observations, only posteriors (and with noisy data the plug-in incumbent is the
    usual choice).

    Args:
        model: A single-output model.
        support: ``s x d`` points, optional.
        name: The model's name in error messages.

    Returns:
        A 0-dim tensor.
    """
    points = support
    if points is None:
        attr = getattr(model, "support", None)
        points = attr if isinstance(attr, Tensor) and attr.ndim == 2 else _training_points(model)
    if points is None:
        raise ValueError(
            f"Cannot default the incumbent of `{name}`: it has no `support` and no training "
            "inputs. Pass `best_f` / `local_best_f` or `support`."
        )
    with torch.no_grad():
        # Model.posterior is typed as the abstract Posterior, which declares no ``mean``
        return model.posterior(points).mean.max()  # type: ignore[attr-defined]


def _check_best_f(value: object, name: str) -> Tensor:
    if isinstance(value, Tensor):
        if value.numel() != 1:
            raise ValueError(f"`{name}` must be a scalar, got shape {tuple(value.shape)}.")
        out = value.detach().reshape(())
    elif isinstance(value, int | float) and not isinstance(value, bool):
        out = torch.tensor(float(value), dtype=torch.float64)
    else:
        raise ValueError(f"`{name}` must be a real number, got {value!r}.")
    if not torch.isfinite(out):
        raise ValueError(f"`{name}` must be finite, got {value!r}.")
    return out


class _CoAcquisition(AcquisitionFunction):
    r"""Shared parts: the models, ``beta``, one point per agent in ``X``."""

    def _setup(self, local_models: Sequence[Model], beta: float) -> None:
        self._co_beta = beta
        self.local_models = ModuleList(local_models)

    @property
    def beta(self) -> float:
        r"""``beta_t`` of this acquisition (fixed at construction)."""
        return self._co_beta

    @property
    def num_agents(self) -> int:
        r"""``N``, the number of agents (local models)."""
        return len(self.local_models)

    @property
    def uses_local_models(self) -> bool:
        r"""Whether the local terms are evaluated (``beta > 0``)."""
        return self._co_beta > 0

    def set_X_pending(self, X_pending: Tensor | None = None) -> None:
        r"""Pending points are not supported (every agent gets one point of the batch)."""
        if X_pending is not None:
            raise UnsupportedError(f"{type(self).__name__} does not support `X_pending`.")
        # BoTorch's X_pending is inferred as Tensor, though its set_X_pending stores None too
        self.X_pending = None  # type: ignore[assignment]

    @property
    @abstractmethod
    def _input_dim(self) -> int | None:
        r"""The models' input dimension ``d`` where known."""

    def _check_X(self, X: Tensor) -> None:
        _check_q_X(X, self.num_agents, self._input_dim, "one point per agent")


class qCoExpectedImprovement(_CoAcquisition):
    r"""Co-EI: central ``qLogEI`` at the batch ``+ beta * sum_n LogEI_n(x_n)``.

    ``X`` is ``b x N x d`` (agent ``n`` gets ``X[..., n, :]``); not one-shot, so
    ``optimize_acqf(acqf, bounds, q=N, ...)`` optimises it directly.

    Example:
        >>> acqf = qCoExpectedImprovement(central, [local_1, local_2], beta=0.5, seed=0)
        >>> acqf(torch.rand(4, 2, 2))  # 4 batches of 2 agents' points
    """

    def __init__(
        self,
        central_model: Model,
        local_models: Sequence[Model],
        beta: float = 0.0,
        best_f: float | Tensor | None = None,
        local_best_f: Sequence[float] | Tensor | None = None,
        sampler: MCSampler | None = None,
        seed: SeedLike = None,
        *,
        support: Tensor | None = None,
    ) -> None:
        r"""
        Args:
            central_model: The central (barycenter) model, single output.
            local_models: The ``N >= 1`` agents' models in agent order (not evaluated,
                nor their incumbents computed, when ``beta = 0``).
            beta: ``beta_t >= 0``.
            best_f: The central incumbent; default :func:`default_best_f` (the
                maximum of the central posterior mean over ``support``, the model's
                support or its training inputs).
            local_best_f: ``N`` incumbents, one per local model; default as ``best_f``
                for each local model.
            sampler: The central qLogEI's sampler (default
                ``SobolQMCNormalSampler(512, seed=seed)``).
            seed: Seeds the default sampler (an ``int``, a generator or ``None``).
            support: ``s x d`` points for the default incumbents (e.g. the
                federation's support grid).
        """
        central_model, local_models = _check_models(central_model, local_models)
        beta = _check_beta(beta)
        d = _input_dim(central_model, local_models)
        if support is not None:
            support = _check_points(support, "support", d)
        N = len(local_models)
        best_f = (
            default_best_f(central_model, support, "central_model")
            if best_f is None
            else _check_best_f(best_f, "best_f")
        )
        local_incumbents: list[Tensor] | None = None
        if local_best_f is not None:
            if isinstance(local_best_f, Tensor):
                local_best_f = list(local_best_f.reshape(-1)) if local_best_f.ndim == 1 else None
            if not isinstance(local_best_f, Sequence) or len(local_best_f) != N:
                raise ValueError(
                    f"`local_best_f` must be a sequence or 1-dim tensor of N={N} incumbents, "
                    "one per local model."
                )
            local_incumbents = [
                _check_best_f(v, f"local_best_f[{n}]") for n, v in enumerate(local_best_f)
            ]
        elif beta > 0:
            local_incumbents = [
                default_best_f(m, support, f"local_models[{n}]") for n, m in enumerate(local_models)
            ]
        if sampler is None:
            sampler = SobolQMCNormalSampler(
                torch.Size([DEFAULT_MC_SAMPLES]), seed=resolve_seed(seed)
            )
        elif not isinstance(sampler, MCSampler):
            raise ValueError(
                f"`sampler` must be a BoTorch MCSampler, got {type(sampler).__name__}."
            )
        super().__init__(model=central_model)
        self._setup(local_models, beta)
        self.central_acqf = qLogExpectedImprovement(
            model=central_model, best_f=best_f, sampler=sampler
        )
        local_acqfs = []
        if beta > 0:
            assert local_incumbents is not None  # given or defaulted above when beta > 0
            local_acqfs = [
                LogExpectedImprovement(model=m, best_f=bf)
                for m, bf in zip(local_models, local_incumbents, strict=True)
            ]
        self.local_acqfs = ModuleList(local_acqfs)

    @property
    def _input_dim(self) -> int | None:
        return _input_dim(self.model, _models(self.local_models))

    # BoTorch types the decorated method's ``self`` as any AcquisitionFunction, which
    # rejects every subclass's method
    @t_batch_mode_transform()  # type: ignore[arg-type]
    def forward(self, X: Tensor) -> Tensor:
        r"""Co-EI at ``X``.

        Args:
            X: ``b x N x d``: row ``n`` is agent ``n``'s point.

        Returns:
            A ``b`` tensor.
        """
        self._check_X(X)
        value = self.central_acqf(X)
        if self.uses_local_models:
            for n, acqf in enumerate(self.local_acqfs):
                value = value + self.beta * acqf(X[..., n : n + 1, :])
        return value


class qCoMaxValueEntropy(_CoAcquisition):
    r"""Co-ES: central batch GIBBON ``+ beta * sum_n qMaxValueEntropy_n(x_n)``.

    ``X`` is ``b x N x d`` (agent ``n`` gets ``X[..., n, :]``). The max values are
    sampled once at construction (Gumbel approximation over ``candidate_set``, as
    BoTorch's classes do), under ``seed``: the central model's with ``seed``, local
    ``n``'s (and its ``y`` samples) with ``seed + 1 + n``.

    Example:
        >>> acqf = qCoMaxValueEntropy(central, [local_1, local_2], beta=0.5,
        ...                           candidate_set=grid, seed=0)
        >>> acqf(torch.rand(4, 2, 2))
    """

    def __init__(
        self,
        central_model: Model,
        local_models: Sequence[Model],
        beta: float = 0.0,
        candidate_set: Tensor | None = None,
        num_mv_samples: int = 10,
        seed: SeedLike = None,
    ) -> None:
        r"""
        Args:
            central_model: The central (barycenter) model, single output.
            local_models: The ``N >= 1`` agents' models in agent order (not evaluated
                when ``beta = 0``).
            beta: ``beta_t >= 0``.
            candidate_set: ``m x d`` points over which the max values are sampled
                (e.g. the support grid); required. BoTorch appends the training inputs
                of models that have them.
            num_mv_samples: Max-value samples per model, an ``int >= 1``.
            seed: An ``int``, a generator or ``None``.
        """
        central_model, local_models = _check_models(central_model, local_models)
        beta = _check_beta(beta)
        if candidate_set is None:
            raise ValueError("`candidate_set` (m x d) is required by qCoMaxValueEntropy.")
        candidate_set = _check_points(
            candidate_set, "candidate_set", _input_dim(central_model, local_models)
        )
        if (
            isinstance(num_mv_samples, bool)
            or not isinstance(num_mv_samples, int)
            or num_mv_samples < 1
        ):
            raise ValueError(f"`num_mv_samples` must be an int >= 1, got {num_mv_samples!r}.")
        s = resolve_seed(seed)
        super().__init__(model=central_model)
        self._setup(local_models, beta)
        # BoTorch draws the max values (and qMES its y-sampler's seed) from torch's
        # global RNG: seeded and restored here.
        with isolated_seed(s):
            self.central_acqf = qLowerBoundMaxValueEntropy(
                model=central_model, candidate_set=candidate_set, num_mv_samples=num_mv_samples
            )
        local_acqfs = []
        if beta > 0:
            for n, m in enumerate(local_models):
                with isolated_seed(derived_seed(s, 1 + n)):
                    local_acqfs.append(
                        qMaxValueEntropy(
                            model=m, candidate_set=candidate_set, num_mv_samples=num_mv_samples
                        )
                    )
        self.local_acqfs = ModuleList(local_acqfs)
        self.candidate_set = candidate_set

    @property
    def _input_dim(self) -> int | None:
        return self.candidate_set.shape[-1]

    # BoTorch types the decorated method's ``self`` as any AcquisitionFunction, which
    # rejects every subclass's method
    @t_batch_mode_transform()  # type: ignore[arg-type]
    def forward(self, X: Tensor) -> Tensor:
        r"""Co-ES at ``X``.

        Args:
            X: ``b x N x d``: row ``n`` is agent ``n``'s point.

        Returns:
            A ``b`` tensor.
        """
        self._check_X(X)
        value = self.central_value(X)
        if self.uses_local_models:
            for n, acqf in enumerate(self.local_acqfs):
                value = value + self.beta * acqf(X[..., n : n + 1, :])
        return value

    def central_value(self, X: Tensor) -> Tensor:
        r"""Batch GIBBON of the central model: quality terms ``+ 1/2 log det R``.

        Args:
            X: ``batch_shape x N x d``.

        Returns:
            A ``batch_shape`` tensor.
        """
        batch_shape, (N, d) = X.shape[:-2], X.shape[-2:]
        quality = self.central_acqf(X.reshape(-1, 1, d)).reshape(*batch_shape, N).sum(dim=-1)
        if N == 1:
            return quality
        posterior = self.model.posterior(X, observation_noise=True)
        # the abstract Posterior declares no ``distribution`` (a GPyTorchPosterior here)
        cov = posterior.distribution.covariance_matrix  # type: ignore[attr-defined]
        std = cov.diagonal(dim1=-2, dim2=-1).clamp_min(torch.finfo(cov.dtype).tiny).sqrt()
        corr = cov / (std.unsqueeze(-1) * std.unsqueeze(-2))
        L = psd_safe_cholesky(corr)
        log_det = 2.0 * L.diagonal(dim1=-2, dim2=-1).log().sum(dim=-1)
        return quality + 0.5 * log_det
