r"""Shared machinery of botorch-fed's synthetic test functions.

:class:`SeededNoiseMixin` gives a BoTorch ``SyntheticTestFunction`` a private
``torch.Generator`` for its observation noise (``seed=`` / ``generator=``), so that
noisy evaluations are reproducible without touching the global torch RNG
(botorch-fed convention: every stochastic entry point takes a seed or a generator).
Without a seed and a generator it draws from the global RNG, exactly like BoTorch.

It also validates inputs in a device-agnostic way: the last dimension must be
``dim`` (``BotorchTensorDimensionError`` otherwise) and, as BoTorch 0.18 does for
its own functions, points outside ``bounds`` are rejected (``ValueError``) unless
the function sets ``_enforce_bounds = False`` (CEC-2005 F7 is defined "without
bounds").
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from botorch.exceptions.errors import BotorchTensorDimensionError
from torch import Tensor

# a mixin of BoTorch's test functions: type-checked as one of them
if TYPE_CHECKING:
    from botorch.test_functions.synthetic import SyntheticTestFunction as _Base
else:
    _Base = object


def make_generator(
    seed: int | None = None, generator: torch.Generator | None = None
) -> torch.Generator | None:
    r"""The generator an object should draw from: ``generator``, one seeded with
    ``seed``, or ``None`` (use the global RNG) when both are ``None``.

    Raises:
        ValueError: If both ``seed`` and ``generator`` are given.
    """
    if seed is not None and generator is not None:
        raise ValueError("Pass either `seed` or `generator`, not both.")
    if generator is not None:
        if not isinstance(generator, torch.Generator):
            raise TypeError(
                f"`generator` must be a torch.Generator; got {type(generator).__name__}."
            )
        return generator
    if seed is None:
        return None
    return torch.Generator(device="cpu").manual_seed(int(seed))


class SeededNoiseMixin(_Base):
    r"""Seeded observation noise and input validation for BoTorch test functions.

    Put it *before* the BoTorch base class (``class F(SeededNoiseMixin,
    SyntheticTestFunction)``) and call :meth:`_init_noise_rng` in ``__init__``.
    Subclasses implement ``_evaluate_true`` (the hook of recent BoTorch;
    ``evaluate_true`` is overridden here, so older versions work too) and may
    override :meth:`_apply_fitness_noise` for noise that is part of the function's
    definition (applied in :meth:`forward` before the additive ``noise_std``).
    """

    _generator: torch.Generator | None = None
    _enforce_bounds: bool = True
    bounds: Tensor  # the buffer BoTorch's BaseTestProblem registers (undeclared there)

    def _init_noise_rng(
        self, seed: int | None = None, generator: torch.Generator | None = None
    ) -> None:
        self._generator = make_generator(seed=seed, generator=generator)

    @property
    def generator(self) -> torch.Generator | None:
        r"""The generator used for noise (``None``: the global torch RNG)."""
        return self._generator

    def _randn(self, shape: torch.Size, like: Tensor) -> Tensor:
        r"""Standard normal draws of ``shape`` with ``like``'s dtype and device."""
        gen = self._generator
        if gen is None:
            return torch.randn(shape, dtype=like.dtype, device=like.device)
        # Draw in float64 on the generator's device so that a seed gives the same
        # stream for every input dtype, then move.
        draw = torch.randn(shape, generator=gen, device=gen.device, dtype=torch.float64)
        return draw.to(device=like.device, dtype=like.dtype)

    def _validate_X(self, X: Tensor) -> None:
        name = type(self).__name__
        if not isinstance(X, Tensor):
            raise TypeError(f"{name} expects a torch.Tensor X; got {type(X).__name__}.")
        if X.dim() == 0 or X.shape[-1] != self.dim:
            raise BotorchTensorDimensionError(
                f"{name} expects X of shape `batch_shape x d` with d = dim = "
                f"{self.dim}; got X.shape={tuple(X.shape)}."
            )
        if not (X.is_floating_point()):
            raise ValueError(f"{name} expects a floating point X; got {X.dtype}.")
        if self._enforce_bounds and X.numel() > 0:
            bounds = self.bounds.to(device=X.device)
            if not ((X >= bounds[0]).all() and (X <= bounds[1]).all()):
                raise ValueError(
                    f"Expected `X` to be within the bounds of {name} "
                    f"[{bounds[0].min().item():g}, {bounds[1].max().item():g}]^d; "
                    f"got values in [{X.min().item():g}, {X.max().item():g}]."
                )

    def evaluate_true(self, X: Tensor) -> Tensor:
        r"""Evaluate the function without any noise.

        Args:
            X: A ``batch_shape x d``-dim tensor (any float dtype and device).

        Returns:
            A ``batch_shape``-dim tensor.
        """
        self._validate_X(X)
        return self._evaluate_true(X)

    def _apply_fitness_noise(self, f: Tensor) -> Tensor:
        r"""Noise that is part of the function's definition (identity here)."""
        return f

    def forward(self, X: Tensor, noise: bool = True) -> Tensor:
        r"""Evaluate the function on a set of points.

        Args:
            X: A ``batch_shape x d``-dim tensor of points.
            noise: If ``True``, apply the function's own noise (if any) and add
                Gaussian observation noise with standard deviation ``noise_std``,
                both drawn from this object's generator.

        Returns:
            A ``batch_shape``-dim tensor (negated if ``negate=True``).
        """
        f = self.evaluate_true(X)
        if noise:
            f = self._apply_fitness_noise(f)
            if self.noise_std is not None:
                noise_std = torch.as_tensor(self.noise_std, device=f.device, dtype=f.dtype)
                f = f + noise_std * self._randn(f.shape, f)
        if self.negate:
            f = -f
        return f
