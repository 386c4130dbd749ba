r"""The server's step of Alg. 1 of [CoKG]: one batch ``x_1..x_N``, one point per agent.

:func:`optimize_co_acquisition` is one call of ``botorch.optim.optimize_acqf`` with
``q = N`` on a Co-KG / Co-EI / Co-ES acquisition, seeded. For the one-shot Co-KG it
passes :func:`gen_co_kg_initial_conditions`: BoTorch's one-shot initialiser
(``gen_one_shot_kg_initial_conditions``) seeds the trailing fantasy slots with the
maximisers of the *central* posterior mean, which in Co-KG's layout would also fill
the local models' blocks; here every block gets its own model's maximisers. The
discrete Co-KG, Co-EI and Co-ES take BoTorch's standard initial conditions.

References:

.. [CoKG] D. Zhan, H. Zhang, R. Righter, Z. Zheng, J. Anderson. Collaborative Bayesian
   Optimization via Wasserstein Barycenters. CDC 2025 (slides: paper 001 in
   ``shared/papers``), Algorithm 1, line 6.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from botorch.acquisition.analytic import PosteriorMean
from botorch.exceptions.errors import BotorchTensorDimensionError
from botorch.optim.initializers import gen_batch_initial_conditions
from botorch.optim.optimize import optimize_acqf
from botorch.utils.sampling import boltzmann_sample
from torch import Tensor

from botorch_fed.acquisition._rng import SeedLike, isolated_seed, resolve_seed
from botorch_fed.acquisition.co_ei_es import qCoExpectedImprovement, qCoMaxValueEntropy
from botorch_fed.acquisition.co_inputs import _models
from botorch_fed.acquisition.co_kg import qCoKnowledgeGradient

_CO_ACQUISITIONS = (qCoKnowledgeGradient, qCoExpectedImprovement, qCoMaxValueEntropy)
# Options read by gen_co_kg_initial_conditions (as BoTorch's one-shot initialiser).
_INNER_OPTION_KEYS = ("frac_random", "num_inner_restarts", "raw_inner_samples", "eta")


def gen_co_kg_initial_conditions(
    acq_function: qCoKnowledgeGradient,
    bounds: Tensor,
    q: int,
    num_restarts: int,
    raw_samples: int,
    fixed_features: dict[int, float] | None = None,
    options: dict[str, Any] | None = None,
    inequality_constraints: list[tuple[Tensor, Tensor, float]] | None = None,
    equality_constraints: list[tuple[Tensor, Tensor, float]] | None = None,
    **kwargs: Any,
) -> Tensor:
    r"""One-shot initial conditions for Co-KG, each fantasy block from its own model.

    As ``gen_one_shot_kg_initial_conditions``: BoTorch's standard heuristic for all
    ``q_aug`` rows, then in each block of ``num_fantasies`` maximisers (the central
    model's, then each local model's when ``beta > 0``) a fraction ``1 - frac_random``
    of the rows is replaced by maximisers of that model's posterior mean, drawn by a
    Boltzmann choice on their values. Draws from torch's global RNG (run it under a
    seed, as :func:`optimize_co_acquisition` does).

    Args:
        acq_function: A one-shot :class:`qCoKnowledgeGradient`.
        bounds: ``2 x d`` bounds.
        q: The number of agents ``N``.
        num_restarts: Number of initial conditions.
        raw_samples: Raw samples of the standard heuristic.
        fixed_features: Passed to BoTorch's generators.
        options: BoTorch's initialisation options plus ``frac_random`` (default 0.1),
            ``num_inner_restarts`` (20), ``raw_inner_samples`` (1024) and ``eta`` (2.0).
        inequality_constraints: Passed to BoTorch's generators.
        equality_constraints: Passed to BoTorch's generators.
        kwargs: Ignored (``optimize_acqf``'s extra initialiser arguments).

    Returns:
        ``num_restarts x q_aug x d`` initial conditions.
    """
    options = dict(options or {})
    if not isinstance(acq_function, qCoKnowledgeGradient) or (
        acq_function.discrete_support is not None
    ):
        raise ValueError("`acq_function` must be a one-shot (non-discrete) qCoKnowledgeGradient.")
    frac_random = options.get("frac_random", 0.1)
    if not 0 < frac_random < 1:
        raise ValueError(f"`frac_random` must be in (0, 1), got {frac_random!r}.")
    ics = gen_batch_initial_conditions(
        acq_function=acq_function,
        bounds=bounds,
        q=acq_function.get_augmented_q_batch_size(q),
        num_restarts=num_restarts,
        raw_samples=raw_samples,
        fixed_features=fixed_features,
        options=options,
        inequality_constraints=inequality_constraints,
        equality_constraints=equality_constraints,
    )
    N, nf = acq_function.num_agents, acq_function.num_fantasies
    n_value = int((1 - frac_random) * nf)
    if n_value == 0:
        return ics
    models = [acq_function.model]
    if acq_function.uses_local_models:
        models += list(_models(acq_function.local_models))
    for block, model in enumerate(models):
        cands, vals = optimize_acqf(
            acq_function=PosteriorMean(model),
            bounds=bounds,
            q=1,
            num_restarts=options.get("num_inner_restarts", 20),
            raw_samples=options.get("raw_inner_samples", 1024),
            fixed_features=fixed_features,
            return_best_only=False,
            inequality_constraints=inequality_constraints,
            equality_constraints=equality_constraints,
        )
        assert vals is not None  # return_acq_values (default True)
        idx = boltzmann_sample(
            function_values=vals,
            num_samples=num_restarts * n_value,
            eta=options.get("eta", 2.0),
            replacement=True,
        )
        end = N + nf * (block + 1)
        ics[:, end - n_value : end, :] = cands[idx, 0].view(num_restarts, n_value, -1)
    return ics


def optimize_co_acquisition(
    acqf: qCoKnowledgeGradient | qCoExpectedImprovement | qCoMaxValueEntropy,
    bounds: Tensor,
    num_restarts: int = 10,
    raw_samples: int = 256,
    seed: SeedLike = None,
    options: dict[str, Any] | None = None,
) -> Tensor:
    r"""The server's assignment: maximise a Co-* acquisition over ``N`` agents' points.

    One ``optimize_acqf`` call with ``q = N`` (one-shot for Co-KG: the fantasy
    maximisers are optimised jointly and dropped). With the integer seed ``s`` (drawn
    from ``seed`` if it is a generator) the Sobol raw samples take ``s`` and everything
    that draws from torch's global RNG (the Boltzmann choice of the initial
    conditions, the inner initialisations) runs under ``s``; the global RNG state is
    restored afterwards. The acquisition's own Monte Carlo samples are fixed by its
    construction. Same seed, same inputs -> the same points.

    Args:
        acqf: A :class:`qCoKnowledgeGradient`, :class:`qCoExpectedImprovement` or
            :class:`qCoMaxValueEntropy`.
        bounds: ``2 x d`` box bounds (lower < upper).
        num_restarts: L-BFGS-B restarts, an ``int >= 1``.
        raw_samples: Raw samples for the initial conditions, an ``int >= 1``.
        seed: An ``int``, a ``torch.Generator`` / ``numpy.random.Generator`` or ``None``.
        options: ``optimize_acqf`` options (e.g. ``maxiter``, ``batch_limit``, and for
            Co-KG ``frac_random``, ``num_inner_restarts``, ``raw_inner_samples``,
            ``eta``); not ``seed``.

    Returns:
        ``N x d``: row ``n`` is agent ``n``'s next point (detached).
    """
    if not isinstance(acqf, _CO_ACQUISITIONS):
        raise ValueError(
            "`acqf` must be a qCoKnowledgeGradient, qCoExpectedImprovement or "
            f"qCoMaxValueEntropy, got {type(acqf).__name__}."
        )
    if not isinstance(bounds, Tensor) or bounds.ndim != 2 or bounds.shape[0] != 2:
        shape = tuple(bounds.shape) if isinstance(bounds, Tensor) else type(bounds).__name__
        raise BotorchTensorDimensionError(f"`bounds` must be a `2 x d` tensor, got {shape}.")
    if not torch.isfinite(bounds).all() or not (bounds[0] < bounds[1]).all():
        raise ValueError(f"`bounds` must be finite with lower < upper, got {bounds.tolist()}.")
    d = acqf._input_dim
    if d is not None and bounds.shape[-1] != d:
        raise BotorchTensorDimensionError(
            f"`bounds` has d={bounds.shape[-1]} columns but the acquisition takes d={d} inputs."
        )
    for name, value in (("num_restarts", num_restarts), ("raw_samples", raw_samples)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"`{name}` must be an int >= 1, got {value!r}.")
    options = dict(options or {})
    if "seed" in options:
        raise ValueError("Pass the seed as `seed=`, not in `options`.")
    s = resolve_seed(seed)
    options["seed"] = s
    one_shot = isinstance(acqf, qCoKnowledgeGradient) and acqf.discrete_support is None
    ic_generator: Callable[..., Tensor] = (
        gen_co_kg_initial_conditions if one_shot else gen_batch_initial_conditions
    )
    if not one_shot:
        for key in _INNER_OPTION_KEYS:
            if key in options:
                raise ValueError(f"Option `{key}` is only used by the one-shot Co-KG.")
    else:
        # read by the initialiser only; keep them away from scipy's minimize
        inner = {k: options.pop(k) for k in _INNER_OPTION_KEYS if k in options}
        ic_generator = _with_inner_options(inner)
    with isolated_seed(s):
        candidates, _ = optimize_acqf(
            acq_function=acqf,
            bounds=bounds,
            q=acqf.num_agents,
            num_restarts=num_restarts,
            raw_samples=raw_samples,
            options=options,
            ic_generator=ic_generator,
        )
    return candidates.detach()


def _with_inner_options(inner: dict[str, Any]) -> Callable[..., Tensor]:
    def generator(*args: Any, options: dict[str, Any] | None = None, **kwargs: Any) -> Tensor:
        kwargs["options"] = {**(options or {}), **inner}
        return gen_co_kg_initial_conditions(*args, **kwargs)

    return generator
