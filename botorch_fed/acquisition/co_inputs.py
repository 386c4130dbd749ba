r"""Checks of the inputs the Co-* acquisitions of [CoKG] share.

:class:`~botorch_fed.acquisition.co_kg.qCoKnowledgeGradient`,
:class:`~botorch_fed.acquisition.co_ei_es.qCoExpectedImprovement` and
:class:`~botorch_fed.acquisition.co_ei_es.qCoMaxValueEntropy` take a central model and
``N >= 1`` single-output local models of one input dimension, a ``beta >= 0``, point
sets and fantasy samplers, and keep the local models and samplers in ``ModuleList``\ s
(:func:`_models`, :func:`_samplers` read them back typed).

References:

.. [CoKG] D. Zhan, H. Zhang, R. Righter, Z. Zheng, J. Anderson. Collaborative Bayesian
   Optimization via Wasserstein Barycenters. CDC 2025 (slides: paper 001 in
   ``shared/papers``), "Co-KG: Mathematical Definition" and Alg. 1.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from typing import cast

import torch
from botorch.exceptions.errors import BotorchTensorDimensionError, UnsupportedError
from botorch.models.model import Model
from botorch.sampling.base import MCSampler
from torch import Tensor
from torch.nn import ModuleList

from botorch_fed.acquisition.mixed_ucb import model_input_dim


def _check_model(model: object, name: str) -> Model:
    if not isinstance(model, Model):
        raise ValueError(f"`{name}` must be a BoTorch Model, got {type(model).__name__}.")
    if model.num_outputs != 1:
        raise UnsupportedError(
            f"`{name}` has {model.num_outputs} outputs; the Co-* acquisitions need "
            "single-output models."
        )
    return model


def _check_models(central_model: object, local_models: object) -> tuple[Model, list[Model]]:
    r"""The central model, the local models as a list (``N >= 1``), dims consistent."""
    central_model = _check_model(central_model, "central_model")
    if isinstance(local_models, Model | Tensor | str | bytes) or not isinstance(
        local_models, Sequence | ModuleList
    ):
        raise ValueError(
            "`local_models` must be a sequence of BoTorch Models (one per agent), got "
            f"{type(local_models).__name__}."
        )
    local_models = list(local_models)
    if len(local_models) == 0:
        raise ValueError("`local_models` is empty; Co-* acquisitions need N >= 1 agents.")
    local_models = [_check_model(m, f"local_models[{n}]") for n, m in enumerate(local_models)]
    _input_dim(central_model, local_models)
    return central_model, local_models


def _input_dim(central_model: Model, local_models: Sequence[Model]) -> int | None:
    r"""The common input dimension where it can be read off the models, else ``None``."""
    dims = {"central_model": model_input_dim(central_model)}
    dims.update({f"local_models[{n}]": model_input_dim(m) for n, m in enumerate(local_models)})
    known = {name: d for name, d in dims.items() if d is not None}
    if len(set(known.values())) > 1:
        raise BotorchTensorDimensionError(f"The models have different input dimensions: {known}.")
    return next(iter(known.values()), None)


def _check_beta(beta: object) -> float:
    if isinstance(beta, Tensor) and beta.numel() == 1:
        beta = beta.item()
    if isinstance(beta, bool) or not isinstance(beta, numbers.Real):
        raise ValueError(f"`beta` must be a real number >= 0, got {beta!r}.")
    value = float(beta)
    if not (value >= 0 and value < float("inf")):
        raise ValueError(f"`beta` must be finite and >= 0, got {beta!r}.")
    return value


def _check_points(points: object, name: str, d: int | None) -> Tensor:
    r"""An ``s x d`` finite tensor (``s >= 1``), ``d`` matching the models'."""
    if not isinstance(points, Tensor) or points.ndim != 2 or points.shape[0] < 1:
        shape = tuple(points.shape) if isinstance(points, Tensor) else type(points).__name__
        raise BotorchTensorDimensionError(
            f"`{name}` must be an `s x d` tensor with s >= 1, got {shape}."
        )
    if d is not None and points.shape[-1] != d:
        raise BotorchTensorDimensionError(
            f"`{name}` has d={points.shape[-1]} columns but the models take d={d} inputs."
        )
    if not points.is_floating_point() or not torch.isfinite(points).all():
        raise ValueError(f"`{name}` must be a finite floating point tensor.")
    return points


def _check_q_X(X: Tensor, q: int, d: int | None, what: str) -> None:
    if X.shape[-2] != q:
        raise BotorchTensorDimensionError(
            f"`X` must be `batch_shape x {q} x d` ({what}), got {tuple(X.shape)}."
        )
    if d is not None and X.shape[-1] != d:
        raise BotorchTensorDimensionError(
            f"`X` has d={X.shape[-1]} but the models take d={d} inputs."
        )


def _check_sampler(sampler: object, name: str, num_fantasies: int) -> MCSampler:
    if not isinstance(sampler, MCSampler):
        raise ValueError(f"`{name}` must be a BoTorch MCSampler, got {type(sampler).__name__}.")
    if sampler.sample_shape != torch.Size([num_fantasies]):
        raise ValueError(
            f"`{name}` draws sample_shape={tuple(sampler.sample_shape)}; expected "
            f"({num_fantasies},) (num_fantasies)."
        )
    return sampler


def _models(modules: ModuleList) -> Sequence[Model]:
    r"""``modules``, the Co-* acquisitions' local models (torch's ModuleList is not
    generic: it types its items as Module)."""
    return cast(Sequence[Model], modules)


def _samplers(modules: ModuleList) -> Sequence[MCSampler]:
    r"""``modules``, the local samplers (see :func:`_models`)."""
    return cast(Sequence[MCSampler], modules)
