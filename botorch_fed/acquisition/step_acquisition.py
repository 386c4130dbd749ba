r"""One step's acquisition on a local or global model (Alg. 2 / eq. 3 of [FBO-FedGP]).

Alg. 2 (lines 17 and 23) maximises an acquisition ``AF`` -- "UCB, EI, or a posterior
sample for Thompson Sampling" (Sec. 4.2) -- on whichever model the mixing schedule
picked. This module builds that acquisition through BoTorch's own classes:

- ``"ucb"``: :class:`~botorch.acquisition.analytic.UpperConfidenceBound`;
- ``"ei"``: :class:`~botorch.acquisition.analytic.LogExpectedImprovement`;

both as their cached-factor subclasses
(:mod:`~botorch_fed.acquisition.cached_analytic`: the same values and gradients,
with the posterior moments of the ``SingleTaskGP`` and dPITC/PIC models computed
from factors kept for the model's state);
- ``"kg"``: :class:`~botorch.acquisition.knowledge_gradient.qKnowledgeGradient`
  (one-shot, ``num_fantasies`` fantasies from a seeded ``SobolQMCNormalSampler``; its
  ``q``-batch form is the "data sharing" baseline of [Co-KG], the ``q = 1`` form its
  "no collaboration" baseline);
- ``"ts"``: :class:`~botorch.acquisition.thompson_sampling.PathwiseThompsonSampling`
  (one Matheron path, drawn at construction from ``seed``). Pathwise sampling exists
  only for model types registered with ``botorch.sampling.pathwise`` (``ExactGP``
  such as ``SingleTaskGP``, ``ModelListGP``, approximate GPs) -- not for
  :class:`~botorch_fed.models.FederatedPITCGP`. For those,
  :func:`thompson_sample_candidate` draws one joint posterior sample on a seeded Sobol
  candidate set and returns its argmax
  (:class:`~botorch.generation.sampling.MaxPosteriorSampling`).

:func:`propose_step_candidate` picks the right route and returns the next point. Its
pieces are public for callers that build or rank the acquisition themselves:
:func:`pathwise_thompson_sampling` (also for ``q > 1`` paths),
:func:`maximize_step_acquisition` (the seeded ``optimize_acqf`` search) and
:func:`ranked_step_candidates` (every distinct optimum of that search, best first --
for several parties that maximise one acquisition on one model and must not
evaluate one point twice).

Seeds: one integer seed ``s`` drives a whole step -- the Thompson path is drawn from
``s``, the knowledge gradient's fantasy base samples from ``s``, the discrete Thompson
sample from ``s + 1`` and the ``optimize_acqf`` search (Sobol raw samples and the
choice of initial conditions) from ``s + 2``.

References:

.. [FBO-FedGP] Secure federated Bayesian optimisation with distributed sparse GPs,
   Alg. 2 and Sec. 4.2 (paper 000 in ``shared/papers``).
.. [Co-KG] Collaborative Bayesian optimization via Wasserstein barycenters (paper 001
   in ``shared/papers``), "Experimental Setup": the baselines.
"""

from __future__ import annotations

import math
from typing import Literal, overload

import torch
from botorch.acquisition.acquisition import AcquisitionFunction, OneShotAcquisitionFunction
from botorch.acquisition.knowledge_gradient import qKnowledgeGradient
from botorch.acquisition.objective import (
    GenericMCObjective,
    PosteriorTransform,
    ScalarizedPosteriorTransform,
)
from botorch.acquisition.thompson_sampling import PathwiseThompsonSampling
from botorch.exceptions.errors import BotorchTensorDimensionError, UnsupportedError
from botorch.generation.sampling import MaxPosteriorSampling
from botorch.models.model import Model
from botorch.optim import optimize_acqf
from botorch.sampling.normal import SobolQMCNormalSampler
from botorch.sampling.pathwise.posterior_samplers import DrawMatheronPaths
from botorch.utils.sampling import draw_sobol_samples
from torch import Tensor

from botorch_fed.acquisition._rng import SeedLike, isolated_seed, resolve_seed
from botorch_fed.acquisition.cached_analytic import (
    CachedLogExpectedImprovement,
    CachedUpperConfidenceBound,
)
from botorch_fed.acquisition.mixed_ucb import _check_beta

StepKind = Literal["ucb", "ei", "ts", "kg"]
# the acquisitions of Alg. 2 of [FBO-FedGP] (Sec. 4.2), and all kinds this module builds:
# those plus the knowledge gradient of the [Co-KG] baselines
STEP_KINDS: tuple[str, ...] = ("ucb", "ei", "ts")
ACQUISITION_KINDS: tuple[str, ...] = (*STEP_KINDS, "kg")
DEFAULT_NUM_FANTASIES = 64  # qKnowledgeGradient's default


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


def _check_kind(kind: StepKind) -> StepKind:
    if kind not in ACQUISITION_KINDS:
        raise ValueError(f"`kind` must be one of {ACQUISITION_KINDS}, got {kind!r}.")
    return kind


def _check_positive_int(value: object, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"`{name}` must be an int >= 1, got {value!r}.")
    return value


def make_step_acquisition(
    kind: StepKind,
    model: Model,
    *,
    beta: float | Tensor | None = None,
    best_f: float | Tensor | None = None,
    seed: SeedLike = None,
    maximize: bool = True,
    posterior_transform: PosteriorTransform | None = None,
    num_fantasies: int = DEFAULT_NUM_FANTASIES,
) -> AcquisitionFunction:
    r"""Build one step's ``q = 1`` acquisition on ``model`` with BoTorch's classes.

    ``"kg"`` builds a ``qKnowledgeGradient`` that also takes ``q > 1`` batches (its
    batch size is the number of non-fantasy points of the one-shot input).

    Args:
        kind: ``"ucb"``, ``"ei"``, ``"ts"`` or ``"kg"``.
        model: The fitted single-output model of this step (local or global).
        beta: UCB trade-off ``>= 0``; required for ``"ucb"``.
        best_f: Incumbent value (best observed, in the model's outcome space);
            required for ``"ei"``.
        seed: Seed of the Thompson sample path (``"ts"``) and of the fantasy base
            samples (``"kg"``): an ``int``, a ``torch.Generator`` /
            ``numpy.random.Generator``, or ``None``.
        maximize: If True, consider the problem a maximization problem.
        posterior_transform: Optional posterior transform.
        num_fantasies: Fantasies of the knowledge gradient (``"kg"``).

    Returns:
        A ``CachedUpperConfidenceBound``, ``CachedLogExpectedImprovement`` (BoTorch's
        ``UpperConfidenceBound``, ``LogExpectedImprovement`` with cached factors),
        ``PathwiseThompsonSampling`` (path already drawn) or ``qKnowledgeGradient``
        (fixed Sobol base samples) on ``model``.

    Raises:
        UnsupportedError: For ``"ts"`` on a model without pathwise sampling support;
            use :func:`thompson_sample_candidate` (or :func:`propose_step_candidate`).
            For ``"kg"`` with ``maximize=False`` and a ``posterior_transform``.
    """
    kind = _check_kind(kind)
    if not isinstance(model, Model):
        raise TypeError(f"`model` must be a BoTorch Model, got {type(model).__name__}.")
    if kind == "ucb":
        if beta is None:
            raise ValueError("`beta` is required for kind='ucb'.")
        return CachedUpperConfidenceBound(
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
        return CachedLogExpectedImprovement(
            model, best_f=best_f_t, posterior_transform=posterior_transform, maximize=maximize
        )
    if kind == "kg":
        return knowledge_gradient(
            model,
            num_fantasies=num_fantasies,
            seed=seed,
            maximize=maximize,
            posterior_transform=posterior_transform,
        )
    return pathwise_thompson_sampling(
        model, seed=seed, maximize=maximize, posterior_transform=posterior_transform
    )


def knowledge_gradient(
    model: Model,
    *,
    num_fantasies: int = DEFAULT_NUM_FANTASIES,
    seed: SeedLike = None,
    maximize: bool = True,
    posterior_transform: PosteriorTransform | None = None,
) -> qKnowledgeGradient:
    r"""BoTorch's one-shot ``qKnowledgeGradient`` with seeded fantasy base samples.

    The fantasies come from ``SobolQMCNormalSampler(num_fantasies, seed=s)`` (``s``
    the integer seed), so the acquisition is deterministic in its input and the
    global RNG is not touched. The inner maximisation uses the posterior mean
    (analytic); minimisation negates it by a ``ScalarizedPosteriorTransform``.

    Args:
        model: A fitted single-output model that supports ``fantasize``.
        num_fantasies: Number of fantasies ``>= 1``.
        seed: An ``int``, a ``torch.Generator`` / ``numpy.random.Generator``, or
            ``None``.
        maximize: If False, the knowledge gradient of the minimisation problem.
        posterior_transform: Optional scalarizing posterior transform (only with
            ``maximize=True``).

    Returns:
        The ``qKnowledgeGradient`` (``q`` = the number of non-fantasy points of its
        ``b x (q + num_fantasies) x d`` input).
    """
    if not isinstance(model, Model):
        raise TypeError(f"`model` must be a BoTorch Model, got {type(model).__name__}.")
    _check_positive_int(num_fantasies, "num_fantasies")
    if not maximize:
        if posterior_transform is not None:
            raise UnsupportedError(
                "kind='kg' with maximize=False negates the posterior through a "
                "posterior transform; pass a negated `posterior_transform` instead."
            )
        parameter = next(iter(model.parameters()), None)
        dtype = torch.float64 if parameter is None else parameter.dtype
        posterior_transform = ScalarizedPosteriorTransform(weights=-torch.ones(1, dtype=dtype))
    sampler = SobolQMCNormalSampler(
        sample_shape=torch.Size([num_fantasies]), seed=resolve_seed(seed)
    )
    return qKnowledgeGradient(
        model, num_fantasies=None, sampler=sampler, posterior_transform=posterior_transform
    )


def pathwise_thompson_sampling(
    model: Model,
    *,
    seed: SeedLike = None,
    batch_size: int = 1,
    maximize: bool = True,
    posterior_transform: PosteriorTransform | None = None,
) -> PathwiseThompsonSampling:
    r"""BoTorch's ``PathwiseThompsonSampling`` with its Matheron paths drawn from ``seed``.

    Args:
        model: A fitted single-output model with pathwise sampling support (see
            :func:`supports_pathwise_sampling`), e.g. a ``SingleTaskGP``.
        seed: An ``int``, a ``torch.Generator`` / ``numpy.random.Generator``, or
            ``None``; the global RNG state is restored afterwards.
        batch_size: Number ``q`` of independent paths. The acquisition takes
            ``b x q x d`` inputs and sums path ``j`` at point ``j``, so maximising it
            over a ``q``-batch maximises every path (batch Thompson sampling).
        maximize: If False, the paths are negated (minimisation).
        posterior_transform: Optional posterior transform.

    Returns:
        The acquisition with its paths drawn (deterministic in ``X``).

    Raises:
        UnsupportedError: For a model without pathwise sampling support; use
            :func:`thompson_sample_candidate`.
    """
    if not isinstance(model, Model):
        raise TypeError(f"`model` must be a BoTorch Model, got {type(model).__name__}.")
    _check_positive_int(batch_size, "batch_size")
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
        acqf.redraw(batch_size=batch_size)
    acqf.batch_size = batch_size
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


def maximize_step_acquisition(
    acqf: AcquisitionFunction,
    bounds: Tensor,
    *,
    seed: SeedLike = None,
    q: int = 1,
    num_restarts: int = 8,
    raw_samples: int = 256,
    maxiter: int | None = None,
    sequential: bool = False,
) -> Tensor:
    r"""The seeded ``optimize_acqf`` search of one step.

    With the integer seed ``s`` (drawn from ``seed`` if it is a generator), the Sobol
    raw samples take ``s + 2`` and the Boltzmann choice of the initial conditions,
    which draws from torch's global RNG, runs under that seed too; the global RNG
    state is restored afterwards.

    Args:
        acqf: The acquisition (e.g. from :func:`make_step_acquisition`).
        bounds: ``2 x d`` box bounds.
        seed: The step's seed (an ``int``, a generator, or ``None``).
        q: Batch size (``q > 1`` for batch acquisitions such as ``qUCB`` or
            :func:`pathwise_thompson_sampling` with ``batch_size=q``).
        num_restarts: ``optimize_acqf`` restarts.
        raw_samples: ``optimize_acqf`` raw samples for the initial conditions.
        maxiter: L-BFGS-B iterations per restart (``None``: ``optimize_acqf``'s
            default).
        sequential: Sequential greedy optimisation of the ``q`` points (not for
            one-shot acquisitions such as ``qKnowledgeGradient``, which optimise the
            batch jointly).

    Returns:
        The ``q x d`` maximiser found (for a one-shot acquisition its candidates,
        without the fantasy points).
    """
    bounds = _check_bounds(bounds)
    if sequential and isinstance(acqf, OneShotAcquisitionFunction):
        raise UnsupportedError(
            f"`sequential=True` is not supported for the one-shot {type(acqf).__name__}; "
            "its q points are optimised jointly."
        )
    s = resolve_seed(seed)
    with isolated_seed(s + 2):
        candidate, _ = optimize_acqf(
            acqf,
            bounds=bounds,
            q=_check_positive_int(q, "q"),
            num_restarts=_check_positive_int(num_restarts, "num_restarts"),
            raw_samples=_check_positive_int(raw_samples, "raw_samples"),
            options=_search_options(s, maxiter),
            sequential=sequential,
        )
    return candidate.detach()


def _search_options(s: int, maxiter: int | None) -> dict:
    # The Sobol raw samples take the seed; the Boltzmann selection of the initial
    # conditions draws from torch's global RNG, hence also the isolated_seed context.
    options: dict = {"seed": s + 2}
    if maxiter is not None:
        options["maxiter"] = _check_positive_int(maxiter, "maxiter")
    return options


def ranked_step_candidates(
    acqf: AcquisitionFunction,
    bounds: Tensor,
    *,
    seed: SeedLike = None,
    num_restarts: int = 8,
    raw_samples: int = 256,
    maxiter: int | None = None,
    min_distance: float = 0.0,
) -> Tensor:
    r"""Every distinct point of one seeded ``q = 1`` search, best first.

    Runs the search of :func:`maximize_step_acquisition` (same seed, so the first
    point is its candidate) but keeps all restarts, then ranks: the optimised points
    by decreasing acquisition value, then the search's ``raw_samples`` Sobol points
    (``draw_sobol_samples(bounds, raw_samples, 1, seed=s + 2)``, the ones
    ``optimize_acqf`` drew its initial conditions from) by decreasing value. A point
    within ``min_distance`` (Euclidean, in the input space) of one already ranked is
    dropped. Parties that maximise the same acquisition on the same model with the
    same seed get the same list, so the ``r``-th of them can take the ``r``-th point
    without exchanging anything.

    Args:
        acqf: A ``q = 1`` acquisition.
        bounds: ``2 x d`` box bounds.
        seed: The step's seed (an ``int``, a generator, or ``None``).
        num_restarts: ``optimize_acqf`` restarts (the optimised points).
        raw_samples: ``optimize_acqf`` raw samples (the fallback points).
        maxiter: L-BFGS-B iterations per restart (``None``: ``optimize_acqf``'s
            default).
        min_distance: Points closer than this to a ranked point count as that point.

    Returns:
        A ``k x d`` tensor of ranked points, ``1 <= k <= num_restarts + raw_samples``.
    """
    bounds = _check_bounds(bounds)
    if not (min_distance >= 0 and math.isfinite(min_distance)):
        raise ValueError(f"`min_distance` must be finite and >= 0, got {min_distance!r}.")
    s = resolve_seed(seed)
    one_shot = isinstance(acqf, OneShotAcquisitionFunction)
    with isolated_seed(s + 2):
        X_opt, v_opt = optimize_acqf(
            acqf,
            bounds=bounds,
            q=1,
            num_restarts=_check_positive_int(num_restarts, "num_restarts"),
            raw_samples=_check_positive_int(raw_samples, "raw_samples"),
            options=_search_options(s, maxiter),
            return_best_only=False,
            return_full_tree=one_shot,
        )
    assert v_opt is not None  # return_acq_values (default True)
    X_raw = draw_sobol_samples(bounds, n=raw_samples, q=1, seed=s + 2)
    with torch.no_grad():
        if isinstance(acqf, OneShotAcquisitionFunction):  # one_shot, narrowing acqf
            X_full = X_opt.detach()  # num_restarts x (1 + fantasies) x d
            fantasies = X_full[v_opt.detach().reshape(-1).argmax(), 1:]
            X_opt = acqf.extract_candidates(X_full)
            v_raw = acqf(torch.cat([X_raw, fantasies.expand(len(X_raw), -1, -1)], dim=-2))
        else:
            v_raw = acqf(X_raw)
    d = bounds.shape[-1]
    kept: list[Tensor] = []
    for X, values in ((X_opt.detach().reshape(-1, d), v_opt), (X_raw.reshape(-1, d), v_raw)):
        order = torch.sort(values.detach().reshape(-1), descending=True, stable=True).indices
        for x in X[order]:
            if not kept or bool(((torch.stack(kept) - x).norm(dim=-1) > min_distance).all()):
                kept.append(x)
    return torch.stack(kept)


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
    maxiter: int | None = None,
    num_candidates: int = 1024,
    num_fantasies: int = DEFAULT_NUM_FANTASIES,
) -> Tensor:
    r"""The next point of one step of Alg. 2 (lines 17 / 23) on ``model``.

    UCB, EI, KG and pathwise TS are maximised with :func:`maximize_step_acquisition`
    (seeded initial conditions, global RNG state restored afterwards); TS on a model
    without pathwise support (e.g. ``FederatedPITCGP``) uses
    :func:`thompson_sample_candidate`.

    Args:
        kind: ``"ucb"``, ``"ei"``, ``"ts"`` or ``"kg"``.
        model: The fitted single-output model of this step.
        bounds: ``2 x d`` box bounds.
        beta: UCB trade-off (``"ucb"``).
        best_f: Incumbent value (``"ei"``).
        seed: One seed for the whole step (an ``int`` or a generator, or ``None``).
        maximize: If True, consider the problem a maximization problem.
        posterior_transform: Optional posterior transform.
        num_restarts: ``optimize_acqf`` restarts.
        raw_samples: ``optimize_acqf`` raw samples for the initial conditions.
        maxiter: L-BFGS-B iterations per restart (``None``: ``optimize_acqf``'s
            default).
        num_candidates: Candidate set size for discrete TS.
        num_fantasies: Fantasies of the knowledge gradient (``"kg"``).

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
        num_fantasies=num_fantasies,
    )
    return maximize_step_acquisition(
        acqf,
        bounds,
        seed=s,
        num_restarts=num_restarts,
        raw_samples=raw_samples,
        maxiter=maxiter,
    )
