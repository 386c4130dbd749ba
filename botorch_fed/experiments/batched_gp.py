r"""Many small GPs as one batched ``SingleTaskGP``, and the batched UCB search.

BoTorch makes many small GPs fast by batching them: a ``SingleTaskGP`` on ``B x n x d``
inputs is ``B`` independent GPs (their own hyperparameters, their own ``Standardize``)
evaluated, fitted and differentiated as one tensor program. A batched experiment grid
(:mod:`~botorch_fed.experiments.grid`) holds every replication's every client as one
batch member: ``B = R M`` GPs whose data grow by one point per round together.

- :func:`fit_batched_gp`: ``fit_gpytorch_mll`` on the batch (BoTorch fits a batched
  ``SingleTaskGP`` member by member, one L-BFGS-B each, every member with its own
  priors), warm-started from the last fit;
- :func:`maximize_batched_ucb` (:func:`maximize_batched` for any one-point
  acquisition): every member searched as ``optimize_acqf`` searches one -- its own
  Sobol raw samples and Boltzmann-sampled starting points, an L-BFGS-B problem per
  starting point -- with the problems of all members run in lockstep and every
  acquisition evaluation one call on the whole batch; :func:`maximize_batched_qucb`:
  each member's ``q``-point batch by sequential greedy ``qUpperConfidenceBound``
  (central BO's batch).
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Mapping, Sequence
from typing import Any, cast

import torch
from botorch.acquisition import AcquisitionFunction, UpperConfidenceBound, qUpperConfidenceBound
from botorch.fit import fit_gpytorch_mll
from botorch.generation.gen import gen_candidates_scipy
from botorch.models import SingleTaskGP
from botorch.models.model import Model
from botorch.optim.initializers import initialize_q_batch
from botorch.sampling import SobolQMCNormalSampler
from botorch.utils.sampling import draw_sobol_samples
from gpytorch.mlls import ExactMarginalLogLikelihood
from torch import Tensor

from botorch_fed.acquisition._rng import isolated_seed


def batched_gp_state(model: SingleTaskGP) -> dict[str, Tensor]:
    r"""The hyperparameters of a batched model (all but the outcome transform's)."""
    return {
        k: v.detach().clone()
        for k, v in model.state_dict().items()
        if not k.startswith("outcome_transform.")
    }


def fit_batched_gp(
    train_X: Tensor,
    train_Y: Tensor,
    *,
    warm_start: Mapping[str, Tensor] | None = None,
    refit: bool = True,
    maxiter: int | None = None,
    seed: int | None = None,
) -> SingleTaskGP:
    r"""``B`` independent default ``SingleTaskGP`` s as one batched model.

    Args:
        train_X: ``B x n x d`` inputs.
        train_Y: ``B x n x 1`` outcomes.
        warm_start: Hyperparameters to start from (:func:`batched_gp_state` of a model
            of the same batch shape).
        refit: If False, load ``warm_start`` (required then) without fitting.
        maxiter: L-BFGS-B iterations of the fit (``None``: BoTorch's default).
        seed: Seed of the fit's random restarts (torch's global RNG is restored).

    Returns:
        The model (batch shape ``B``) in eval mode.
    """
    if train_X.dim() != 3 or train_Y.shape != (*train_X.shape[:-1], 1):
        raise ValueError(
            f"`train_X` must be B x n x d and `train_Y` B x n x 1, got {tuple(train_X.shape)} "
            f"and {tuple(train_Y.shape)}."
        )
    if not refit and warm_start is None:
        raise ValueError("`refit=False` needs `warm_start` (the hyperparameters to load).")
    model = SingleTaskGP(train_X, train_Y)
    if warm_start is not None:
        model.load_state_dict(dict(warm_start), strict=False)
    if refit:
        mll = ExactMarginalLogLikelihood(model.likelihood, model)
        options: dict[str, Any] = {} if maxiter is None else {"options": {"maxiter": maxiter}}
        seeded = isolated_seed(seed) if seed is not None else contextlib.nullcontext()
        with seeded, warnings.catch_warnings():
            warnings.simplefilter("ignore")  # BoTorch's advice on input scaling, retries
            fit_gpytorch_mll(mll, optimizer_kwargs=options)
    return model.eval()


def maximize_batched_ucb(
    model: SingleTaskGP,
    beta: float,
    *,
    seeds: Sequence[int],
    num_restarts: int = 8,
    raw_samples: int = 256,
    maxiter: int | None = None,
) -> tuple[Tensor, Tensor]:
    r"""Each batch member's UCB maximiser over the unit cube (:func:`maximize_batched`).

    Args:
        model: A batched model (batch shape ``B``) on ``d`` inputs in ``[0, 1]^d``.
        beta: UCB's ``beta`` (the same for all members).
        seeds: ``B`` seeds, each member's search's own.
        num_restarts: Starting points of L-BFGS-B per member.
        raw_samples: Sobol points each member's starting points are chosen from.
        maxiter: L-BFGS-B iterations (``None``: BoTorch's default).

    Returns:
        ``(X, values)``: the ``B x d`` maximisers and their ``B`` UCB values.
    """
    return maximize_batched(
        UpperConfidenceBound(model, beta=beta),
        model,
        seeds=seeds,
        num_restarts=num_restarts,
        raw_samples=raw_samples,
        maxiter=maxiter,
    )


def maximize_batched(
    acqf: AcquisitionFunction,
    model: Model,
    *,
    seeds: Sequence[int],
    num_restarts: int = 8,
    raw_samples: int = 256,
    maxiter: int | None = None,
) -> tuple[Tensor, Tensor]:
    r"""Each batch member's maximiser of a one-point acquisition on a batched model
    (``acqf`` of ``num x B x 1 x d`` is ``num x B``; e.g. UCB, or ``qUpperConfidenceBound``
    with each member's pending points ``B x k x d``), each member searched on its own as
    ``optimize_acqf`` searches: its own Sobol raw samples (seed ``s + 2``), its starting
    points by ``initialize_q_batch`` (Boltzmann sampling under seed ``s + 2``, the best
    raw point always in), and one L-BFGS-B problem per starting point of every member,
    all run in lockstep by BoTorch's batched L-BFGS-B (each stops on its own), every
    acquisition evaluation one call on the whole batch. A member's result does not
    depend on the other members.

    Args:
        acqf: The acquisition on ``model``.
        model: The batched model (batch shape ``B``) on ``d`` inputs in ``[0, 1]^d``,
            with ``train_inputs[0]`` of shape ``B x n x d`` (a batched ``SingleTaskGP``,
            a :class:`~botorch_fed.experiments.batched_pic.BatchedPICGP`).
        seeds: ``B`` seeds, each member's search's own.
        num_restarts: Starting points of L-BFGS-B per member.
        raw_samples: Sobol points each member's starting points are chosen from.
        maxiter: L-BFGS-B iterations (``None``: BoTorch's default).

    Returns:
        ``(X, values)``: the ``B x d`` maximisers and their ``B`` acquisition values.
    """
    X_train: Tensor = model.train_inputs[0]  # type: ignore[index]  # a batched GP's
    B, d = X_train.shape[0], X_train.shape[-1]
    if len(seeds) != B:
        raise ValueError(f"`seeds` must hold one seed per member ({B}), got {len(seeds)}.")
    if num_restarts > raw_samples:
        raise ValueError(f"`num_restarts`={num_restarts} exceeds `raw_samples`={raw_samples}.")
    unit = torch.stack([torch.zeros(d), torch.ones(d)]).to(X_train)
    raw = torch.stack(
        [draw_sobol_samples(bounds=unit, n=raw_samples, q=1, seed=int(s) + 2) for s in seeds], 1
    )  # raw x B x 1 x d
    with torch.no_grad():
        values = acqf(raw)  # raw x B
    starts = []
    for b, s in enumerate(seeds):  # each member's Boltzmann draw under its own seed, on
        with isolated_seed(int(s) + 2):  # the CPU's generator as optimize_acqf draws it
            start = initialize_q_batch(raw[:, b].cpu(), values[:, b].cpu(), n=num_restarts)[0]
        starts.append(start.to(raw))
    X0 = torch.stack(starts, 1)  # num_restarts x B x 1 x d
    flat = X0.reshape(num_restarts * B, 1, d)
    # each (start, member) one problem; its flat index rides along as a fixed feature,
    # since the batched L-BFGS-B evaluates only the problems still running
    index = torch.arange(num_restarts * B, device=X0.device, dtype=X0.dtype)
    base = flat.detach()

    def each(Z: Tensor) -> Tensor:
        rows = Z[..., 0, d].round().long()
        X = base.index_put((rows,), Z[..., :d])
        return acqf(X.reshape(num_restarts, B, 1, d)).reshape(-1)[rows]

    options: dict[str, Any] = {} if maxiter is None else {"maxiter": maxiter}
    # recorded, not shown: BoTorch forces its note of every L-BFGS-B stop at maxiter
    with warnings.catch_warnings(record=True):
        try:
            Z, _ = gen_candidates_scipy(
                initial_conditions=torch.cat([flat, torch.zeros_like(flat[..., :1])], -1),
                acquisition_function=cast(AcquisitionFunction, each),  # a batched function
                lower_bounds=0.0,
                upper_bounds=1.0,
                options=options,
                fixed_features={d: index},
                use_parallel_mode=True,
            )
        except NotImplementedError as exc:  # BoTorch runs it with SciPy 1.13-1.17 only
            raise RuntimeError(
                f"The batched search needs BoTorch's batched L-BFGS-B, which it runs with "
                f"SciPy 1.13 to 1.17 ({exc})."
            ) from exc
    X = Z[..., :d].detach().reshape(num_restarts, B, 1, d)
    with torch.no_grad():
        acq = acqf(X)  # num_restarts x B
    best = acq.argmax(dim=0)  # B
    members = torch.arange(B, device=X.device)
    return X[best, members, 0], acq[best, members]


def maximize_batched_qucb(
    model: SingleTaskGP,
    beta: float,
    q: int,
    *,
    seeds: Sequence[int],
    num_restarts: int = 8,
    raw_samples: int = 256,
    maxiter: int | None = None,
) -> Tensor:
    r"""Each member's ``q``-point batch by sequential greedy ``qUpperConfidenceBound``
    (point ``k`` maximised with the member's first ``k - 1`` pending, each point's search
    under the member's seed, as ``optimize_acqf(..., sequential=True)``): ``B x q x d``.

    One quasi-MC sampler (seeded by the first member's seed) serves all members: its base
    samples are shared across the batch, so a member's batch depends on the first seed of
    the grid it runs in (the searches do not)."""
    X_train = model.train_inputs[0]
    B, d = X_train.shape[0], X_train.shape[-1]
    sampler = SobolQMCNormalSampler(sample_shape=torch.Size([512]), seed=int(seeds[0]))
    chosen = torch.empty(B, 0, d, dtype=X_train.dtype, device=X_train.device)
    for k in range(q):
        acqf = qUpperConfidenceBound(model, beta=beta, sampler=sampler)
        if k:
            acqf.set_X_pending(chosen)
        x, _ = maximize_batched(
            acqf, model, seeds=seeds, num_restarts=num_restarts, raw_samples=raw_samples,
            maxiter=maxiter,
        )  # fmt: skip
        chosen = torch.cat([chosen, x.unsqueeze(-2)], dim=-2)
    return chosen
