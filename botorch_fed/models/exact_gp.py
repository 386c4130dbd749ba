r"""The one exact-GP fit of botorch-fed: a ``SingleTaskGP`` fitted by ``fit_gpytorch_mll``.

Every party that fits an exact GP to data it holds -- a BO client's local GP, the
central-BO oracle's pooled GP, the clients of ``fit_local_average``, the regression
demo's and the scaling benchmark's reference GPs -- goes through
:func:`fit_exact_gp`, so all of them fit the same way:

- BoTorch's ``SingleTaskGP`` (its default modules and ``Standardize`` outcome
  transform unless modules are given) and ``fit_gpytorch_mll`` on its
  ``ExactMarginalLogLikelihood``, with the loss evaluated by
  :func:`~botorch_fed.models.exact_mll.exact_mll_closure` (the same loss and
  gradients from one dense Cholesky factorisation, about a third less time per
  evaluation for a client's small GP);
- ``seed``: ``fit_gpytorch_mll`` retries a failed fit from hyperparameters sampled
  from their priors with torch's global RNG; with a seed the fit runs under that seed
  and restores the global RNG state afterwards, so its result does not depend on what
  ran before;
- ``warm_start`` / ``maxiter``: start L-BFGS-B from earlier hyperparameters (e.g. the
  last fit on fewer data) and cap its iterations -- a refit on one more point then
  costs a fraction of a cold fit.

:class:`ExactGPRefitter` adds the policy of a party whose data grow by a point per
round: refit every ``K``-th model update (warm-started), reuse the last
hyperparameters in between.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import torch
from botorch.fit import fit_gpytorch_mll
from botorch.models import SingleTaskGP
from botorch.models.transforms.outcome import OutcomeTransform
from botorch.utils.types import DEFAULT, _DefaultType
from gpytorch.kernels import Kernel
from gpytorch.likelihoods import Likelihood
from gpytorch.means import Mean
from gpytorch.mlls import ExactMarginalLogLikelihood
from torch import Tensor

from botorch_fed.models.exact_mll import exact_mll_closure

_SEED_BOUND = 2**62


def _check_seed(seed: object) -> int | None:
    if seed is None:
        return None
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"`seed` must be an int >= 0 or None, got {seed!r}.")
    return seed % _SEED_BOUND


def _check_maxiter(maxiter: object) -> int | None:
    if maxiter is not None and (
        isinstance(maxiter, bool) or not isinstance(maxiter, int) or maxiter < 1
    ):
        raise ValueError(f"`maxiter` must be an int >= 1 or None, got {maxiter!r}.")
    return maxiter


@contextmanager
def _seeded(seed: int | None, device: torch.device) -> Iterator[None]:
    r"""Seed torch's global RNG inside the block and restore it on exit (no-op for
    ``None``)."""
    if seed is None:
        yield
        return
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        yield


def exact_gp_state(model: SingleTaskGP) -> dict[str, Tensor]:
    r"""The hyperparameters of ``model`` as a state dict, for a later warm start.

    The outcome transform's entries are left out: a new model fits its transform to
    its own data.

    Args:
        model: A ``SingleTaskGP``.

    Returns:
        ``{name: tensor}`` (detached clones).
    """
    return {
        k: v.detach().clone()
        for k, v in model.state_dict().items()
        if not k.startswith("outcome_transform.")
    }


def check_exact_gp_state(state: Mapping[str, Tensor], dim: int, name: str = "state") -> None:
    r"""Raise ``ValueError`` unless ``state`` has exactly the entries, shapes and dtypes
    of :func:`exact_gp_state` of a default float64 ``SingleTaskGP`` on ``dim`` inputs
    (a partial state would load non-strictly and silently keep initial values).

    Args:
        state: The hyperparameter state to check.
        dim: The input dimension ``d``.
        name: How to call it in messages.
    """
    with warnings.catch_warnings():  # a throw-away model on dummy data
        warnings.simplefilter("ignore")
        reference = exact_gp_state(
            SingleTaskGP(
                torch.zeros(2, dim, dtype=torch.float64), torch.zeros(2, 1, dtype=torch.float64)
            )
        )
    if not isinstance(state, Mapping) or set(state) != set(reference):
        keys = sorted(state) if isinstance(state, Mapping) else type(state).__name__
        raise ValueError(f"`{name}` must hold the entries {sorted(reference)}, got {keys}.")
    for key, ref in reference.items():
        value = state[key]
        if not (
            isinstance(value, Tensor) and value.shape == ref.shape and value.dtype == ref.dtype
        ):
            got = (value.dtype, tuple(value.shape)) if isinstance(value, Tensor) else type(value)
            raise ValueError(
                f"`{name}[{key!r}]` must be a {ref.dtype} tensor of shape {tuple(ref.shape)}, "
                f"got {got}."
            )


def fit_exact_gp(
    train_X: Tensor,
    train_Y: Tensor,
    *,
    seed: int | None = None,
    warm_start: Mapping[str, Tensor] | None = None,
    maxiter: int | None = None,
    refit: bool = True,
    covar_module: Kernel | None = None,
    likelihood: Likelihood | None = None,
    mean_module: Mean | None = None,
    outcome_transform: OutcomeTransform | _DefaultType | None = DEFAULT,
) -> SingleTaskGP:
    r"""A ``SingleTaskGP`` on ``(train_X, train_Y)`` fitted with ``fit_gpytorch_mll``.

    Args:
        train_X: ``n x d`` inputs (their dtype and device are the model's).
        train_Y: ``n x 1`` outcomes.
        seed: Seed of the fit's random restarts (see the module docstring);
            ``None``: BoTorch's behaviour, drawing from torch's global RNG.
        warm_start: Hyperparameters to start from (:func:`exact_gp_state` of an
            earlier model); loaded non-strictly, so module entries it lacks keep their
            initial values.
        maxiter: L-BFGS-B iterations of the fit (``None``: BoTorch's default).
        refit: If False, only load ``warm_start`` (required then) and do not fit.
        covar_module: Kernel (``None``: BoTorch's default). Given modules are fitted
            in place.
        likelihood: Likelihood (``None``: BoTorch's default).
        mean_module: Mean (``None``: BoTorch's default constant mean).
        outcome_transform: Outcome transform (default: ``Standardize``; ``None``:
            none).

    Returns:
        The model, in eval mode.
    """
    seed = _check_seed(seed)
    maxiter = _check_maxiter(maxiter)
    if not refit and warm_start is None:
        raise ValueError("`refit=False` needs `warm_start` (the hyperparameters to load).")
    model = SingleTaskGP(
        train_X,
        train_Y,
        likelihood=likelihood,
        covar_module=covar_module,
        mean_module=mean_module,
        outcome_transform=outcome_transform,
    )
    if warm_start is not None:
        model.load_state_dict(dict(warm_start), strict=False)
    if refit:
        kwargs: dict[str, Any] = (
            {} if maxiter is None else {"optimizer_kwargs": {"options": {"maxiter": maxiter}}}
        )
        mll = ExactMarginalLogLikelihood(model.likelihood, model)
        # BoTorch fits batches and outputs one by one when given no closure
        if train_X.dim() == 2 and model.num_outputs == 1:
            kwargs["closure"] = exact_mll_closure(mll)
        with _seeded(seed, train_X.device):
            fit_gpytorch_mll(mll, **kwargs)
    return model.eval()


class ExactGPRefitter:
    r"""Exact GPs on growing data: refit every ``K``-th update, reuse in between.

    Update ``u = 0, 1, 2, ...`` (one call each) builds a ``SingleTaskGP`` on the data
    it is given. Updates ``u`` with ``u % refit_every == 0`` fit the hyperparameters
    (with ``warm_start``: starting from the last fitted values, at most ``maxiter``
    L-BFGS-B iterations); the others load the last fitted values unchanged. The fit
    of update ``u`` runs under the seed ``(seed * 1_000_003 + u) mod 2^62``.

    Args:
        refit_every: ``K >= 1``.
        maxiter: L-BFGS-B iterations of a fit (``None``: BoTorch's default).
        warm_start: Start each refit from the last fitted values (else from the
            model's initial values).
        seed: Base seed of the fits (``None``: BoTorch's global-RNG behaviour).
    """

    def __init__(
        self,
        *,
        refit_every: int = 1,
        maxiter: int | None = None,
        warm_start: bool = True,
        seed: int | None = None,
    ) -> None:
        if isinstance(refit_every, bool) or not isinstance(refit_every, int) or refit_every < 1:
            raise ValueError(f"`refit_every` must be an int >= 1, got {refit_every!r}.")
        self.refit_every = refit_every
        self.maxiter = _check_maxiter(maxiter)
        self.warm_start = bool(warm_start)
        self.seed = _check_seed(seed)
        self.state: dict[str, Tensor] | None = None
        self.num_updates = 0

    def state_dict(self) -> dict:
        r"""The last fitted hyperparameters and the update count (checkpoints)."""
        return {
            "state": None if self.state is None else dict(self.state),
            "num_updates": self.num_updates,
        }

    def load_state_dict(self, state: dict) -> None:
        r"""Restore :meth:`state_dict`."""
        if set(state) != {"state", "num_updates"}:
            raise ValueError(
                f"ExactGPRefitter state has keys {sorted(state)}; expected "
                "['num_updates', 'state']."
            )
        num = state["num_updates"]
        if isinstance(num, bool) or not isinstance(num, int) or num < 0:
            raise ValueError(f"ExactGPRefitter state: `num_updates` must be >= 0, got {num!r}.")
        self.state = None if state["state"] is None else dict(state["state"])
        self.num_updates = num

    def fit_seed(self, update: int) -> int | None:
        r"""The seed of the fit of update ``update`` (``None`` without a base seed)."""
        if self.seed is None:
            return None
        return (self.seed * 1_000_003 + update) % _SEED_BOUND

    def __call__(self, train_X: Tensor, train_Y: Tensor) -> SingleTaskGP:
        r"""The model of the next update on ``(train_X, train_Y)``.

        Args:
            train_X: ``n x d`` inputs.
            train_Y: ``n x 1`` outcomes.

        Returns:
            A ``SingleTaskGP`` in eval mode.
        """
        u = self.num_updates
        refit = self.state is None or u % self.refit_every == 0
        model = fit_exact_gp(
            train_X,
            train_Y,
            seed=self.fit_seed(u),
            warm_start=self.state if (self.warm_start or not refit) else None,
            maxiter=self.maxiter,
            refit=refit,
        )
        if refit:
            self.state = exact_gp_state(model)
        self.num_updates += 1
        return model
