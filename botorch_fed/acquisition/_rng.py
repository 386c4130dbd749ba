r"""Seed handling for the stochastic draws of Alg. 2 of [FBO-FedGP] (no global RNG).

Every stochastic entry point of :mod:`botorch_fed.acquisition` takes a ``seed`` that
is one of

- an ``int >= 0``: reproducible;
- a ``torch.Generator`` or a ``numpy.random.Generator``: draws advance it;
- ``None``: fresh OS entropy (not reproducible).

The global torch / numpy RNG states are never read or left modified. BoTorch APIs that
draw from torch's global RNG (posterior sampling, pathwise paths, the Boltzmann choice
of initial conditions in ``optimize_acqf``) run inside :func:`isolated_seed`, which
seeds the global generators and restores their states (CPU and CUDA) afterwards.

References:

.. [FBO-FedGP] Secure federated Bayesian optimisation with distributed sparse GPs,
   Alg. 2 (paper 000 in ``shared/papers``).
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import torch
from torch import Tensor

SeedLike = int | torch.Generator | np.random.Generator | None

# Seeds are kept below 2^62 so that small offsets (seed + 1) stay valid torch seeds.
_SEED_BOUND = 2**62


def _check_int_seed(seed: object, name: str) -> int:
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer):
        raise ValueError(
            f"`{name}` must be an int >= 0, a torch.Generator, a numpy Generator or None, "
            f"got {seed!r} of type {type(seed).__name__}."
        )
    seed = int(seed)
    if seed < 0:
        raise ValueError(f"`{name}` must be >= 0, got {seed}.")
    return seed


def resolve_seed(seed: SeedLike, name: str = "seed") -> int:
    r"""An ``int`` seed in ``[0, 2^62)`` for BoTorch APIs that take integer seeds.

    Args:
        seed: An ``int >= 0`` (returned reduced modulo ``2^62``), a ``torch.Generator``
            or ``numpy.random.Generator`` (one integer is drawn from it), or ``None``
            (fresh OS entropy).
        name: The argument name used in error messages.

    Returns:
        A non-negative integer seed below ``2^62``.
    """
    if seed is None:
        return secrets.randbits(62)
    if isinstance(seed, torch.Generator):
        return int(torch.randint(0, _SEED_BOUND, (1,), generator=seed, device=seed.device))
    if isinstance(seed, np.random.Generator):
        return int(seed.integers(0, _SEED_BOUND))
    return _check_int_seed(seed, name) % _SEED_BOUND


def uniform_draws(n: int, seed: SeedLike, name: str = "seed") -> Tensor:
    r"""``n`` i.i.d. ``Uniform(0, 1)`` draws (float64, CPU) from ``seed``.

    Used for the local/global coin of Alg. 2, lines 14-15 (``r ~ U(0, 1)``, local step
    iff ``r < p_t``).

    Args:
        n: The number of draws.
        seed: See the module docstring; an ``int`` (reduced modulo ``2^62``) seeds a
            fresh ``torch.Generator``.
        name: The argument name used in error messages.

    Returns:
        A ``n``-dim float64 tensor.
    """
    if isinstance(seed, np.random.Generator):
        return torch.from_numpy(seed.random(n))
    if isinstance(seed, torch.Generator):
        return torch.rand(n, generator=seed, dtype=torch.float64, device=seed.device).cpu()
    generator = torch.Generator()
    if seed is None:
        generator.seed()  # OS entropy; touches only this generator
    else:
        generator.manual_seed(_check_int_seed(seed, name) % _SEED_BOUND)
    return torch.rand(n, generator=generator, dtype=torch.float64)


def derived_seed(seed: int, offset: int) -> int:
    r"""``(seed + offset) mod 2^62``: the seed of the ``offset``-th sampler."""
    return (seed + offset) % _SEED_BOUND


@contextmanager
def isolated_seed(seed: int) -> Iterator[None]:
    r"""Seed torch's global generators inside the block; restore them on exit.

    Like :func:`botorch.utils.sampling.manual_seed`, but also restores the CUDA
    generators (``torch.manual_seed`` seeds them too).

    Args:
        seed: An integer seed.
    """
    devices = list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        yield
