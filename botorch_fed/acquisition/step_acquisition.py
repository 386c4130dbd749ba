r"""One step's acquisition on a local or global model (Alg. 2 / eq. 3 of [FBO-FedGP]).

Alg. 2 (lines 17 and 23) maximises an acquisition ``AF`` -- "UCB, EI, or a posterior
sample for Thompson Sampling" (Sec. 4.2) -- on whichever model the mixing schedule
picked. This module builds that acquisition through BoTorch's own classes:

- ``"ucb"``: :class:`~botorch.acquisition.analytic.UpperConfidenceBound`;
- ``"ei"``: :class:`~botorch.acquisition.analytic.LogExpectedImprovement`;
- ``"ts"``: :class:`~botorch.acquisition.thompson_sampling.PathwiseThompsonSampling`
  (one Matheron path, drawn at construction from ``seed``). Pathwise sampling exists
  only for model types registered with ``botorch.sampling.pathwise`` (``ExactGP``
  such as ``SingleTaskGP``, ``ModelListGP``, approximate GPs) -- not for
  :class:`~botorch_fed.models.FederatedPITCGP`. For those,
  :func:`thompson_sample_candidate` draws one joint posterior sample on a seeded Sobol
  candidate set and returns its argmax
  (:class:`~botorch.generation.sampling.MaxPosteriorSampling`).

:func:`propose_step_candidate` picks the right route and returns the next point.

References:

.. [FBO-FedGP] Secure federated Bayesian optimisation with distributed sparse GPs,
   Alg. 2 and Sec. 4.2 (paper 000 in ``shared/papers``).
"""

from __future__ import annotations

from typing import Literal, overload

import torch
from botorch.acquisition.acquisition import AcquisitionFunction
from botorch.acquisition.analytic import LogExpectedImprovement, UpperConfidenceBound
from botorch.acquisition.objective import GenericMCObjective, PosteriorTransform
from botorch.acquisition.thompson_sampling import PathwiseThompsonSampling
from botorch.exceptions.errors import BotorchTensorDimensionError, UnsupportedError
from botorch.generation.sampling import MaxPosteriorSampling
from botorch.models.model import Model
from botorch.optim import optimize_acqf
from botorch.sampling.pathwise.posterior_samplers import DrawMatheronPaths
from botorch.utils.sampling import draw_sobol_samples
from torch import Tensor

from botorch_fed.acquisition._rng import SeedLike, isolated_seed, resolve_seed
from botorch_fed.acquisition.mixed_ucb import _check_beta

StepKind = Literal["ucb", "ei", "ts"]
STEP_KINDS: tuple[str, ...] = ("ucb", "ei", "ts")


def supports_pathwise_sampling(model: Model) -> bool:
    r"""Whether BoTorch can draw Matheron sample paths from ``model``.

    Args:
        model: A BoTorch model.

    Returns:
        True if ``botorch.sampling.pathwise`` has an implementation for its type.
    """
    return DrawMatheronPaths.dispatch(type(model)) is not None


def _negate(samples: Tensor, X: Tensor | None = None) -> Tensor:
    return -samples.squeeze(-1)


def _check_kind(kind: str) -> str:
    if kind not in STEP_KINDS:
        raise ValueError(f"`kind` must be one of {STEP_KINDS}, got {kind!r}.")
    return kind


def make_step_acquisition(
    kind: StepKind,
    model: Model,
    *,
    beta: float | Tensor | None = None,
    best_f: float | Tensor | None = None,
    seed: SeedLike = None,
    maximize: bool = True,
    posterior_transform: PosteriorTransform | None = None,
) -> AcquisitionFunction:
    r"""Build one step's ``q = 1`` acquisition on ``model`` with BoTorch's classes.

    Args:
        kind: ``"ucb"``, ``"ei"`` or ``"ts"``.
        model: The fitted single-output model of this step (local or global).
        beta: UCB trade-off ``>= 0``; required for ``"ucb"``.
        best_f: Incumbent value (best observed, in the model's outcome space);
            required for ``"ei"``.
        seed: Seed of the Thompson sample path (``"ts"``): an ``int``, a
            ``torch.Generator`` / ``numpy.random.Generator``, or ``None``.
        maximize: If True, consider the problem a maximization problem.
        posterior_transform: Optional posterior transform.

    Returns:
        An ``UpperConfidenceBound``, ``LogExpectedImprovement`` or
        ``PathwiseThompsonSampling`` (path already drawn) on ``model``.

    Raises:
        UnsupportedError: For ``"ts"`` on a model without pathwise sampling support;
            use :func:`thompson_sample_candidate` (or :func:`propose_step_candidate`).
    """
    kind = _check_kind(kind)
    if not isinstance(model, Model):
        raise TypeError(f"`model` must be a BoTorch Model, got {type(model).__name__}.")
    if kind == "ucb":
        if beta is None:
            raise ValueError("`beta` is required for kind='ucb'.")
        return UpperConfidenceBound(
            model,
            beta=_check_beta(beta),
            posterior_transform=posterior_transform,
            maximize=maximize,
        )
    if kind == "ei":
        if best_f is None:
            raise ValueError("`best_f` (the incumbent value) is required for kind='ei'.")
        best_f_t = torch.as_tensor(best_f)
        if not torch.isfinite(best_f_t).all():
            raise ValueError(f"`best_f` must be finite, got {best_f!r}.")
        return LogExpectedImprovement(
            model, best_f=best_f_t, posterior_transform=posterior_transform, maximize=maximize
        )
    if not supports_pathwise_sampling(model):
        raise UnsupportedError(
            f"Pathwise Thompson sampling does not support {type(model).__name__}; use "
            "`thompson_sample_candidate` (discrete Thompson sampling on a Sobol set)."
        )
    acqf = PathwiseThompsonSampling(
        model,
        objective=None if maximize else GenericMCObjective(_negate),
        posterior_transform=posterior_transform,
    )
    with isolated_seed(resolve_seed(seed)):
        acqf.redraw(batch_size=1)
    acqf.batch_size = 1
    return acqf


def _check_bounds(bounds: Tensor) -> Tensor:
    if not isinstance(bounds, Tensor) or bounds.ndim != 2 or bounds.shape[0] != 2:
        shape = tuple(bounds.shape) if isinstance(bounds, Tensor) else type(bounds).__name__
        raise BotorchTensorDimensionError(f"`bounds` must be a `2 x d` tensor, got {shape}.")
    if not torch.isfinite(bounds).all() or (bounds[0] > bounds[1]).any():
        raise ValueError(f"`bounds` must be finite with lower <= upper, got {bounds}.")
    return bounds


@overload
def thompson_sample_candidate(
    model: Model,
    bounds: Tensor,
    num_candidates: int = ...,
    seed: SeedLike = ...,
    *,
    X_candidates: Tensor | None = ...,
    maximize: bool = ...,
    posterior_transform: PosteriorTransform | None = ...,
    return_sample: Literal[False] = ...,
) -> Tensor: ...


@overload
def thompson_sample_candidate(
    model: Model,
    bounds: Tensor,
    num_candidates: int = ...,
    seed: SeedLike = ...,
    *,
    X_candidates: Tensor | None = ...,
    maximize: bool = ...,
    posterior_transform: PosteriorTransform | None = ...,
    return_sample: Literal[True],
) -> tuple[Tensor, Tensor, Tensor]: ...


def thompson_sample_candidate(
    model: Model,
    bounds: Tensor,
    num_candidates: int = 1024,
    seed: SeedLike = None,
    *,
    X_candidates: Tensor | None = None,
    maximize: bool = True,
    posterior_transform: PosteriorTransform | None = None,
    return_sample: bool = False,
) -> Tensor | tuple[Tensor, Tensor, Tensor]:
    r"""Discrete Thompson sampling: argmax of one joint posterior draw on a Sobol set.

    Works for any BoTorch model with a samplable posterior (e.g. ``FederatedPITCGP``).
    The candidate set is ``draw_sobol_samples(bounds, num_candidates, q=1, seed=s)``
    and the joint sample is drawn from torch's RNG seeded with ``s + 1``, where ``s`` is the
    integer seed (drawn from ``seed`` if it is a generator); the argmax is taken by
    ``MaxPosteriorSampling``. The global RNG state is restored afterwards.

    Args:
        model: A fitted single-output model.
        bounds: ``2 x d`` box bounds.
        num_candidates: Size ``N`` of the Sobol candidate set (the joint sample needs
            an ``N x N`` Cholesky factor).
        seed: An ``int``, a ``torch.Generator`` / ``numpy.random.Generator``, or
            ``None`` (fresh entropy).
        X_candidates: Optional ``N x d`` candidate set used instead of Sobol points.
        maximize: If False, return the argmin of the sample.
        posterior_transform: Optional posterior transform.
        return_sample: Also return the candidate set and the sampled values.

    Returns:
        The ``1 x d`` candidate; with ``return_sample``, ``(candidate, X_candidates,
        f)`` where ``X_candidates`` is ``N x d`` and ``f`` the ``N``-dim sample.
    """
    if not isinstance(model, Model):
        raise TypeError(f"`model` must be a BoTorch Model, got {type(model).__name__}.")
    bounds = _check_bounds(bounds)
    s = resolve_seed(seed)
    if X_candidates is None:
        if isinstance(num_candidates, bool) or not isinstance(num_candidates, int):
            raise ValueError(f"`num_candidates` must be an int >= 1, got {num_candidates!r}.")
        if num_candidates < 1:
            raise ValueError(f"`num_candidates` must be an int >= 1, got {num_candidates}.")
        X_candidates = draw_sobol_samples(bounds, n=num_candidates, q=1, seed=s).squeeze(-2)
    elif (
        not isinstance(X_candidates, Tensor)
        or X_candidates.ndim != 2
        or X_candidates.shape[-1] != bounds.shape[-1]
        or X_candidates.shape[0] < 1
    ):
        shape = tuple(X_candidates.shape) if isinstance(X_candidates, Tensor) else None
        raise BotorchTensorDimensionError(
            f"`X_candidates` must be `N x d` with d={bounds.shape[-1]}, got {shape}."
        )
    mps = MaxPosteriorSampling(
        model,
        objective=None if maximize else GenericMCObjective(_negate),
        posterior_transform=posterior_transform,
        replacement=True,
    )
    with torch.no_grad(), isolated_seed(s + 1):
        # What MaxPosteriorSampling.forward does, keeping the sample to return it.
        posterior = model.posterior(X_candidates, posterior_transform=posterior_transform)
        samples = posterior.rsample(sample_shape=torch.Size([1]))  # 1 x N x 1
    candidate = mps.maximize_samples(X_candidates, samples, num_samples=1)  # 1 x d
    if return_sample:
        return candidate, X_candidates, samples.reshape(-1)
    return candidate


def propose_step_candidate(
    kind: StepKind,
    model: Model,
    bounds: Tensor,
    *,
    beta: float | Tensor | None = None,
    best_f: float | Tensor | None = None,
    seed: SeedLike = None,
    maximize: bool = True,
    posterior_transform: PosteriorTransform | None = None,
    num_restarts: int = 8,
    raw_samples: int = 256,
    num_candidates: int = 1024,
) -> Tensor:
    r"""The next point of one step of Alg. 2 (lines 17 / 23) on ``model``.

    UCB, EI and pathwise TS are maximised with ``optimize_acqf`` (seeded initial
    conditions, global RNG state restored afterwards); TS on a model without pathwise
    support (e.g. ``FederatedPITCGP``) uses :func:`thompson_sample_candidate`.

    Args:
        kind: ``"ucb"``, ``"ei"`` or ``"ts"``.
        model: The fitted single-output model of this step.
        bounds: ``2 x d`` box bounds.
        beta: UCB trade-off (``"ucb"``).
        best_f: Incumbent value (``"ei"``).
        seed: One seed for the whole step (an ``int`` or a generator, or ``None``).
        maximize: If True, consider the problem a maximization problem.
        posterior_transform: Optional posterior transform.
        num_restarts: ``optimize_acqf`` restarts.
        raw_samples: ``optimize_acqf`` raw samples for the initial conditions.
        num_candidates: Candidate set size for discrete TS.

    Returns:
        A ``1 x d`` candidate inside ``bounds``.
    """
    kind = _check_kind(kind)
    bounds = _check_bounds(bounds)
    s = resolve_seed(seed)
    if kind == "ts" and not supports_pathwise_sampling(model):
        return thompson_sample_candidate(
            model,
            bounds,
            num_candidates=num_candidates,
            seed=s,
            maximize=maximize,
            posterior_transform=posterior_transform,
        )
    acqf = make_step_acquisition(
        kind,
        model,
        beta=beta,
        best_f=best_f,
        seed=s,
        maximize=maximize,
        posterior_transform=posterior_transform,
    )
    # The Sobol raw samples take the seed; the Boltzmann selection of the initial
    # conditions draws from torch's global RNG, hence also the isolated_seed context.
    with isolated_seed(s + 2):
        candidate, _ = optimize_acqf(
            acqf,
            bounds=bounds,
            q=1,
            num_restarts=num_restarts,
            raw_samples=raw_samples,
            options={"seed": s + 2},
        )
    return candidate.detach()
