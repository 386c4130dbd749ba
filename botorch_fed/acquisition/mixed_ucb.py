r"""UCB over a client's local GP and the global dPITC GP: Alg. 2 / eq. 3 of [FBO-FedGP].

At round ``t`` client ``i`` maximises the UCB of its *local* model with probability
``p_t^(i)`` and the UCB of the *global* model with probability ``1 - p_t^(i)``
(Alg. 2, lines 14-23; the schedule is
:class:`~botorch_fed.acquisition.mixing_schedule.MixingSchedule`, eq. 3).
:class:`MixedLocalGlobalUCB` packages this as one BoTorch acquisition function:

- ``mode="sample"``: the coin of Alg. 2 (``r ~ U(0, 1)``, local iff ``r < p``) is
  tossed once at construction; the value is the drawn model's UCB (``uses_local``).
- ``mode="expected"``: the value is ``p UCB_local(x) + (1 - p) UCB_global(x)``, the
  expectation over the coin (a smooth surrogate for analysis / ablations).

Both UCBs are BoTorch's own :class:`~botorch.acquisition.analytic.UpperConfidenceBound`
(``mean + sqrt(beta) sigma``, or ``-mean + sqrt(beta) sigma`` with
``maximize=False``).

References:

.. [FBO-FedGP] Secure federated Bayesian optimisation with distributed sparse GPs,
   Alg. 2 and Sec. 4.2-4.3 (paper 000 in ``shared/papers``).
"""

from __future__ import annotations

import math
import numbers
from typing import cast

import torch
from botorch.acquisition.acquisition import AcquisitionFunction
from botorch.acquisition.analytic import UpperConfidenceBound
from botorch.acquisition.objective import PosteriorTransform
from botorch.exceptions.errors import UnsupportedError
from botorch.models.model import Model, ModelList
from botorch.utils.transforms import t_batch_mode_transform
from torch import Tensor

from botorch_fed.acquisition._rng import SeedLike, uniform_draws
from botorch_fed.acquisition.mixing_schedule import MixingSchedule

MODES = ("expected", "sample")


def model_input_dim(model: Model) -> int | None:
    r"""The input dimension ``d`` of ``model`` where it can be read off, else ``None``.

    Reads the (untransformed) training inputs of GPyTorch models and the support set
    of :class:`~botorch_fed.models.FederatedPITCGP`.

    Args:
        model: A BoTorch model.

    Returns:
        ``d`` or ``None``.
    """
    support = getattr(model, "support", None)
    if isinstance(support, Tensor) and support.ndim >= 2:
        return int(support.shape[-1])
    try:
        if getattr(model, "_has_transformed_inputs", False):
            X = model._original_train_inputs
        else:
            # gpytorch's train_inputs (untyped): mypy sees nn.Module.__getattr__'s
            # Tensor | Module; a model without them raises, handled below
            X = model.train_inputs[0]  # type: ignore[index]
    except (AttributeError, IndexError, TypeError):
        return None
    return int(X.shape[-1]) if isinstance(X, Tensor) and X.ndim >= 2 else None


def _check_model(model: object, name: str, posterior_transform: object) -> Model:
    if not isinstance(model, Model):
        raise TypeError(f"`{name}` must be a BoTorch Model, got {type(model).__name__}.")
    if posterior_transform is None and model.num_outputs != 1:
        raise ValueError(
            f"`{name}` has {model.num_outputs} outputs; MixedLocalGlobalUCB needs "
            "single-output models (or a scalarizing `posterior_transform`)."
        )
    return model


def _check_beta(beta: float | Tensor) -> Tensor:
    if isinstance(beta, bool) or not isinstance(beta, numbers.Real | Tensor):
        raise ValueError(f"`beta` must be a float >= 0 or a tensor, got {beta!r}.")
    # A Python float is kept in float64 (``UpperConfidenceBound`` alone would store it
    # in the default dtype, float32, i.e. rounded); ``.to(X)`` casts it down if needed.
    if isinstance(beta, Tensor):
        beta_t = beta if beta.is_floating_point() else beta.to(torch.get_default_dtype())
    else:
        beta_t = torch.tensor(float(beta), dtype=torch.float64)
    if beta_t.ndim > 1:
        raise ValueError(f"`beta` must be a scalar or 1-dim, got shape {tuple(beta_t.shape)}.")
    if not (torch.isfinite(beta_t).all() and (beta_t >= 0).all()):
        raise ValueError(f"`beta` must be finite and >= 0, got {beta!r}.")
    return beta_t


def _check_p(p: object) -> float:
    if isinstance(p, bool) or not isinstance(p, numbers.Real):
        raise ValueError(f"`p_local` must be a float in [0, 1], got {p!r}.")
    value = float(p)
    if not (math.isfinite(value) and 0.0 <= value <= 1.0):
        raise ValueError(f"`p_local` must be in [0, 1], got {p!r}.")
    return value


class MixedLocalGlobalUCB(AcquisitionFunction):
    r"""Mixture of the local and global UCB of a client (Alg. 2 of [FBO-FedGP]).

    An analytic ``q = 1`` acquisition over ``batch_shape x 1 x d`` inputs (like
    :class:`~botorch.acquisition.analytic.UpperConfidenceBound`); use it with
    ``optimize_acqf(..., q=1)``. ``self.model`` is a
    :class:`~botorch.models.model.ModelList` of ``(local_model, global_model)``.

    Example:
        >>> schedule = MixingSchedule(c=0.75, num_clients=3)
        >>> acqf = MixedLocalGlobalUCB(
        ...     local_gp, global_gp, beta=2.0, schedule=schedule, t=5, client=1,
        ...     mode="sample", seed=123,
        ... )
        >>> acqf.uses_local  # which model's UCB this round uses
        >>> x, _ = optimize_acqf(acqf, bounds, q=1, num_restarts=8, raw_samples=256)

    Attributes:
        p_local: The probability of a local step used (``p_t`` of the schedule).
        mode: ``"expected"`` or ``"sample"``.
        uses_local: In ``"sample"`` mode, whether the local model's UCB was drawn;
            ``None`` in ``"expected"`` mode.
        ucb_local: BoTorch ``UpperConfidenceBound`` of the local model.
        ucb_global: BoTorch ``UpperConfidenceBound`` of the global model.
    """

    def __init__(
        self,
        local_model: Model,
        global_model: Model,
        beta: float | Tensor,
        p_local: float | None = None,
        *,
        schedule: MixingSchedule | None = None,
        t: int | None = None,
        client: int | None = None,
        mode: str = "sample",
        seed: SeedLike = None,
        maximize: bool = True,
        posterior_transform: PosteriorTransform | None = None,
    ) -> None:
        r"""
        Args:
            local_model: The client's own fitted single-output model (e.g. a
                ``SingleTaskGP`` on its data).
            global_model: The global model (e.g. ``FederatedPITCGP``) on the same input
                space.
            beta: UCB trade-off ``beta >= 0`` (scalar, or ``b``-dim for batch mode, as
                in ``UpperConfidenceBound``); the same for both models.
            p_local: Probability of the local step. Give either this or ``schedule``.
            schedule: A mixing schedule; ``p_local = schedule.prob_local(t, client)``.
            t: The round (``>= 1``), required with ``schedule``.
            client: The client index (required for per-client schedules).
            mode: ``"sample"`` (default; Alg. 2: draw local/global once, here) or
                ``"expected"`` (``p UCB_local + (1 - p) UCB_global``).
            seed: Seed of the ``"sample"`` draw: an ``int``, a ``torch.Generator`` or
                ``numpy.random.Generator``, or ``None`` (fresh entropy). Unused in
                ``"expected"`` mode.
            maximize: If True, consider the problem a maximization problem.
            posterior_transform: Optional posterior transform, applied to both models.
        """
        if mode not in MODES:
            raise ValueError(f"`mode` must be one of {MODES}, got {mode!r}.")
        _check_model(local_model, "local_model", posterior_transform)
        _check_model(global_model, "global_model", posterior_transform)
        d_local, d_global = model_input_dim(local_model), model_input_dim(global_model)
        if d_local is not None and d_global is not None and d_local != d_global:
            raise ValueError(
                f"`local_model` has input dimension {d_local} but `global_model` has {d_global}."
            )
        beta_t = _check_beta(beta)
        if (p_local is None) == (schedule is None):
            raise ValueError("Pass exactly one of `p_local` and `schedule` (with `t`).")
        if schedule is not None:
            if not isinstance(schedule, MixingSchedule):
                raise TypeError(
                    f"`schedule` must be a MixingSchedule, got {type(schedule).__name__}."
                )
            if t is None:
                raise ValueError("`t` (the round, >= 1) is required with `schedule`.")
            p_local = schedule.prob_local(t, client)
        elif t is not None or client is not None:
            raise ValueError("`t` and `client` are only used with `schedule`.")
        super().__init__(model=ModelList(local_model, global_model))
        self.p_local: float = _check_p(p_local)
        self.mode = mode
        self.maximize = maximize
        self.posterior_transform = posterior_transform
        self.ucb_local = UpperConfidenceBound(
            local_model, beta=beta_t, posterior_transform=posterior_transform, maximize=maximize
        )
        self.ucb_global = UpperConfidenceBound(
            global_model, beta=beta_t, posterior_transform=posterior_transform, maximize=maximize
        )
        self.uses_local: bool | None = None
        if mode == "sample":
            # Alg. 2, lines 14-15: r ~ U(0, 1); local step iff r < p_t.
            self.uses_local = bool(uniform_draws(1, seed)[0] < self.p_local)

    @property
    def local_model(self) -> Model:
        r"""The client's local model."""
        return self.ucb_local.model

    @property
    def global_model(self) -> Model:
        r"""The global model."""
        return self.ucb_global.model

    @property
    def beta(self) -> Tensor:
        r"""The UCB trade-off parameter."""
        # a buffer BoTorch registers without declaring it (nn.Module.__getattr__ types it
        # Tensor | Module)
        return cast(Tensor, self.ucb_local.beta)

    @property
    def weights(self) -> tuple[float, float]:
        r"""``(w_local, w_global)``: the value is ``w_local UCB_local + w_global UCB_global``."""
        if self.mode == "sample":
            return (1.0, 0.0) if self.uses_local else (0.0, 1.0)
        return self.p_local, 1.0 - self.p_local

    def set_X_pending(self, X_pending: Tensor | None = None) -> None:
        r"""Not supported, as for BoTorch's analytic acquisition functions."""
        raise UnsupportedError("Analytic acquisition functions do not account for X_pending yet.")

    # BoTorch types the decorated method's ``self`` as any AcquisitionFunction, which
    # rejects every subclass's method
    @t_batch_mode_transform(expected_q=1)  # type: ignore[arg-type]
    def forward(self, X: Tensor) -> Tensor:
        r"""Evaluate the mixed UCB on the candidate set ``X``.

        Args:
            X: A ``batch_shape x 1 x d``-dim tensor of ``d``-dim design points.

        Returns:
            A ``batch_shape``-dim tensor of acquisition values.
        """
        w_local, w_global = self.weights
        if w_global == 0.0:
            return self.ucb_local(X)
        if w_local == 0.0:
            return self.ucb_global(X)
        return w_local * self.ucb_local(X) + w_global * self.ucb_global(X)
