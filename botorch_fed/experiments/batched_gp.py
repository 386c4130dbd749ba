r"""Many small GPs as one batched ``SingleTaskGP``, and the batched UCB search.

BoTorch makes many small GPs fast by batching them: a ``SingleTaskGP`` on ``B x n x d``
inputs is ``B`` independent GPs (their own hyperparameters, their own ``Standardize``)
evaluated, fitted and differentiated as one tensor program. A batched experiment grid
(:mod:`~botorch_fed.experiments.grid`) holds every replication's every client as one
batch member: ``B = R M`` GPs whose data grow by one point per round together.

- :func:`fit_batched_gp`: ``fit_gpytorch_mll`` on the batch (one L-BFGS-B on the sum
  of the ``B`` marginal log-likelihoods: at the joint optimum each member is at its own,
  but the joint stopping rule stops them together), warm-started from the last fit;
- :func:`maximize_batched_ucb` (:func:`maximize_batched` for any one-point
  acquisition): every member's acquisition maximised at once -- Sobol raw samples shared
  by all members, each member's best ``num_restarts`` as starting points, one L-BFGS-B
  over all starting points of all members (the sum of separable terms), then each
  member's best; :func:`maximize_batched_qucb`: each member's ``q``-point batch by
  sequential greedy ``qUpperConfidenceBound`` (central BO's batch).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

import torch
from botorch.acquisition import AcquisitionFunction, UpperConfidenceBound, qUpperConfidenceBound
from botorch.fit import fit_gpytorch_mll
from botorch.generation.gen import gen_candidates_scipy
from botorch.models import SingleTaskGP
from botorch.sampling import SobolQMCNormalSampler
from botorch.utils.sampling import draw_sobol_samples
from gpytorch.mlls import ExactMarginalLogLikelihood
from torch import Tensor


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
        devices = [train_X.device] if train_X.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices), warnings.catch_warnings():
            if seed is not None:
                torch.manual_seed(seed)
            warnings.simplefilter("ignore")  # BoTorch's advice on input scaling, retries
            fit_gpytorch_mll(mll, optimizer_kwargs=options)
    return model.eval()


def maximize_batched_ucb(
    model: SingleTaskGP,
    beta: float,
    *,
    num_restarts: int = 8,
    raw_samples: int = 256,
    maxiter: int | None = None,
    seed: int = 0,
) -> tuple[Tensor, Tensor]:
    r"""Each batch member's UCB maximiser over the unit cube.

    Args:
        model: A batched model (batch shape ``B``) on ``d`` inputs in ``[0, 1]^d``.
        beta: UCB's ``beta`` (the same for all members).
        num_restarts: Starting points of L-BFGS-B per member.
        raw_samples: Sobol points every member's starting points are chosen from.
        maxiter: L-BFGS-B iterations (``None``: BoTorch's default).
        seed: Seed of the Sobol raw samples.

    Returns:
        ``(X, values)``: the ``B x d`` maximisers and their ``B`` UCB values.
    """
    return maximize_batched(
        UpperConfidenceBound(model, beta=beta),
        model,
        num_restarts=num_restarts,
        raw_samples=raw_samples,
        maxiter=maxiter,
        seed=seed,
    )


def maximize_batched(
    acqf: AcquisitionFunction,
    model: SingleTaskGP,
    *,
    num_restarts: int = 8,
    raw_samples: int = 256,
    maxiter: int | None = None,
    seed: int = 0,
) -> tuple[Tensor, Tensor]:
    r"""Each batch member's maximiser of a one-point acquisition on a batched model
    (``acqf`` of ``num x B x 1 x d`` is ``num x B``; e.g. UCB, or ``qUpperConfidenceBound``
    with each member's pending points ``B x k x d``).

    Args:
        acqf: The acquisition on ``model``.
        model: The batched model (batch shape ``B``) on ``d`` inputs in ``[0, 1]^d``.
        num_restarts: Starting points of L-BFGS-B per member.
        raw_samples: Sobol points every member's starting points are chosen from.
        maxiter: L-BFGS-B iterations (``None``: BoTorch's default).
        seed: Seed of the Sobol raw samples.

    Returns:
        ``(X, values)``: the ``B x d`` maximisers and their ``B`` acquisition values.
    """
    X_train = model.train_inputs[0]
    B, d = X_train.shape[0], X_train.shape[-1]
    if num_restarts > raw_samples:
        raise ValueError(f"`num_restarts`={num_restarts} exceeds `raw_samples`={raw_samples}.")
    bounds = torch.stack([torch.zeros(d), torch.ones(d)]).to(X_train)
    raw = draw_sobol_samples(bounds=bounds, n=raw_samples, q=1, seed=seed)  # raw x 1 x d
    raw = raw.unsqueeze(1).expand(raw_samples, B, 1, d)  # every member at every raw point
    with torch.no_grad():
        values = acqf(raw)  # raw x B
    top = values.topk(num_restarts, dim=0).indices  # num_restarts x B
    X0 = raw[top, torch.arange(B, device=raw.device)]  # num_restarts x B x 1 x d
    options = {} if maxiter is None else {"maxiter": maxiter}
    # recorded, not shown: BoTorch forces its notes of an L-BFGS-B stop (maxiter, a line
    # search that fails for one member: all stop there, each at its best point so far)
    with warnings.catch_warnings(record=True):
        X, acq = gen_candidates_scipy(
            initial_conditions=X0,
            acquisition_function=acqf,
            lower_bounds=0.0,
            upper_bounds=1.0,
            options=options,
        )
    best = acq.argmax(dim=0)  # B
    members = torch.arange(B, device=X.device)
    return X[best, members, 0].detach(), acq[best, members].detach()


def maximize_batched_qucb(
    model: SingleTaskGP,
    beta: float,
    q: int,
    *,
    num_restarts: int = 8,
    raw_samples: int = 256,
    maxiter: int | None = None,
    seed: int = 0,
) -> Tensor:
    r"""Each member's ``q``-point batch by sequential greedy ``qUpperConfidenceBound``
    (point ``k`` maximised with the member's first ``k - 1`` pending, as
    ``optimize_acqf(..., sequential=True)``): ``B x q x d``."""
    X_train = model.train_inputs[0]
    B, d = X_train.shape[0], X_train.shape[-1]
    chosen = torch.empty(B, 0, d, dtype=X_train.dtype, device=X_train.device)
    for k in range(q):
        sampler = SobolQMCNormalSampler(sample_shape=torch.Size([512]), seed=seed + k)
        acqf = qUpperConfidenceBound(model, beta=beta, sampler=sampler)
        if k:
            acqf.set_X_pending(chosen)
        x, _ = maximize_batched(
            acqf, model, num_restarts=num_restarts, raw_samples=raw_samples,
            maxiter=maxiter, seed=seed + k,
        )  # fmt: skip
        chosen = torch.cat([chosen, x.unsqueeze(-2)], dim=-2)
    return chosen
