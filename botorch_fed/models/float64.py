r"""Float64 evaluation of gpytorch modules, whatever the dtype of their state.

The dPITC linear algebra runs in float64 whatever the dtype of the inputs and of the
hyperparameters (see :func:`~botorch_fed.models.support_set.support_cholesky`).
:func:`call64` evaluates a kernel, a mean or a likelihood with float64 copies of the
module's parameters and buffers, so a float32 model computes exactly what a float64
model with the same (rounded) values would; :func:`evaluate64`, :func:`prior_variance64`
and :func:`noise64` are its three uses.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from gpytorch import settings as gpytorch_settings
from gpytorch.likelihoods import GaussianLikelihood
from torch import Tensor
from torch.func import functional_call


def _to64(t: Tensor) -> Tensor:
    return t.to(torch.float64)


class _Call(torch.nn.Module):
    r"""Wraps ``fn(module, *inputs)`` as a module, for ``functional_call``."""

    def __init__(self, module: torch.nn.Module, fn: Callable) -> None:
        super().__init__()
        self.module = module
        self.fn = fn

    def forward(self, *inputs: Tensor) -> Tensor:
        return self.fn(self.module, *inputs)


def _dense(out: Tensor) -> Tensor:
    return _to64(out.to_dense() if hasattr(out, "to_dense") else out)


def call64(module: torch.nn.Module, fn: Callable, *inputs: Tensor) -> Tensor:
    r"""``fn(module, *inputs)`` computed with float64 values of ``module``'s state.

    A module whose floating parameters and buffers are all float64 is used as it is;
    otherwise ``fn`` runs on float64 copies of them (``torch.func.functional_call``,
    differentiable in the originals). So a float32 model evaluates its kernel, mean and
    noise (e.g. a softplus of a raw parameter plus a bound) exactly as a float64 model
    with the same (rounded) values would, and modules that do not promote dtypes
    (``LinearMean``, ``PolynomialKernel``) work on float64 inputs.

    Args:
        module: A gpytorch module.
        fn: ``fn(module, *inputs) -> Tensor`` (may return a linear operator).
        *inputs: Tensor inputs, cast to float64.

    Returns:
        The dense float64 result.
    """
    inputs = tuple(_to64(x) for x in inputs)
    named = [*module.named_parameters(), *module.named_buffers()]
    if all(t.dtype == torch.float64 or not t.is_floating_point() for _, t in named):
        with gpytorch_settings.lazily_evaluate_kernels(False):  # dense anyway: no lazy wrapper
            return _dense(fn(module, *inputs))
    state = {f"module.{n}": _to64(t) if t.is_floating_point() else t for n, t in named}
    with gpytorch_settings.lazily_evaluate_kernels(False):
        # evaluated inside the call, while the float64 values are in place
        return functional_call(
            _Call(module, lambda m, *x: _dense(fn(m, *x))), state, inputs, strict=False
        )


def evaluate64(module: torch.nn.Module, *inputs: Tensor) -> Tensor:
    r"""Evaluate a kernel or mean module in float64, densely (see :func:`call64`).

    Args:
        module: A gpytorch kernel or mean.
        *inputs: Its inputs (``batch_shape x n x d`` tensors).

    Returns:
        The dense float64 output (``batch_shape x n x n'`` or ``batch_shape x n``).
    """
    return call64(module, lambda m, *x: m(*x), *inputs)


def prior_variance64(kernel: torch.nn.Module, X: Tensor) -> Tensor:
    r"""The prior variances ``k(x, x)`` (``batch_shape x n``) of a kernel in float64,
    by gpytorch's ``diag=True`` path (see :func:`call64`)."""
    return call64(kernel, lambda m, x: m(x, x, diag=True), X)


def noise64(likelihood: GaussianLikelihood) -> Tensor:
    r"""The likelihood's noise variance computed in float64 (see :func:`call64`)."""
    return call64(likelihood, lambda m: m.noise)
