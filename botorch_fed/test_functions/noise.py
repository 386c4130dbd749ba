r"""Additive observation noise of several kinds, seeded: ``y = f(x) + eta``.

[LDP-BO] (paper 002) assumes zero-mean noise bounded by ``R`` almost surely
(Sec. 2, "Noise Assumptions"; the LDP experiments of Sec. 5.1 use
``eta ~ U[-1, 1]``, so ``R = 1``), and treats unbounded heavy-tailed noise in
Sec. 4.5 / Sec. 5.1 (Student-t with 3 degrees of freedom), whose algorithms need the
moments ``E|eta|^(1 + alpha)``. :class:`ObservationNoise` draws such noise from its
own ``torch.Generator`` and reports the constants the algorithms need:
:attr:`ObservationNoise.bound` (``R``) and :meth:`ObservationNoise.moment`
(``E|eta|^p``).

Kinds (``scale >= 0``; every kind has mean zero where the mean exists):

- ``"gaussian"``: ``scale * Z``, ``Z ~ N(0, 1)``;
- ``"uniform"``: ``U[-scale, scale]`` (bounded: ``R = scale``);
- ``"student-t"``: ``scale * T``, ``T ~ t_df`` (finite ``E|T|^p`` iff ``p < df``;
  mean zero needs ``df > 1``, it is symmetric about zero for every ``df``);
- ``"pareto"``: ``scale * (P - E P)``, ``P ~ Pareto(x_m = 1, shape)``, i.e.
  ``P(P > x) = x^-shape`` for ``x >= 1`` and ``E P = shape / (shape - 1)``
  (``shape > 1``): zero mean, heavy right tail, finite ``E|.|^p`` iff ``p < shape``.

Sampling: float64 draws on the CPU from the noise's own generator, then cast/moved
like the values they are added to, so a seed gives one stream for every dtype and
device. Gaussian draws use ``torch.randn``, uniform ones ``torch.rand``; Student-t
and Pareto draws are inverse-CDF transforms of one ``torch.rand`` uniform each
(Student-t through ``scipy.special.stdtrit``, applied to the uniform shifted to the
middle of its ``2^-53`` cell, so the draws are exactly symmetric; the tails are
therefore cut at probability ``~2^-54``, far beyond any run's length, and a draw
beyond the largest float64 (only for ``df`` below about 0.06) is clamped to it).

References:

.. [LDP-BO] X. Zhou, J. Tan. Local differential privacy for Bayesian optimization
   (paper 002 in ``shared/papers``; AAAI 2021), Sec. 2, 4.5 and 5.1.
"""

from __future__ import annotations

import math
import numbers

import numpy as np
import torch
from scipy import integrate, special
from torch import Tensor

from botorch_fed.test_functions.base import make_generator

NOISE_KINDS = ("gaussian", "uniform", "student-t", "pareto")


def _is_real(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


class ObservationNoise:
    r"""Seeded additive observation noise of one of :data:`NOISE_KINDS`.

    Example:
        >>> noise = ObservationNoise("uniform", scale=1.0, seed=0)  # [LDP-BO] LDP case
        >>> y = f + noise.sample(f.shape, like=f)
        >>> noise.bound, noise.moment(2)
        (1.0, 0.333...)

    Args:
        kind: One of :data:`NOISE_KINDS`.
        scale: ``>= 0`` and finite: the standard deviation (``"gaussian"``), the
            half-width (``"uniform"``) or the multiplier (``"student-t"``,
            ``"pareto"``). ``0``: noise-free.
        seed: Seed of a private ``torch.Generator``.
        generator: A ``torch.Generator`` (CPU) to use instead of ``seed``. Without
            both, draws come from the global torch RNG.
        df: Degrees of freedom of ``"student-t"`` (``> 0``, finite).
        shape: Shape (tail index) of ``"pareto"`` (``> 1``, finite).

    Raises:
        ValueError: For an unknown ``kind`` or invalid ``scale``, ``df``, ``shape``,
            or both ``seed`` and ``generator``.
    """

    def __init__(
        self,
        kind: str,
        scale: float,
        seed: int | None = None,
        generator: torch.Generator | None = None,
        df: float = 3.0,
        shape: float = 3.0,
    ) -> None:
        if not isinstance(kind, str) or kind not in NOISE_KINDS:
            raise ValueError(f"`kind` must be one of {NOISE_KINDS}, got {kind!r}.")
        if not (_is_real(scale) and 0 <= scale < math.inf):
            raise ValueError(f"`scale` must be a finite number >= 0, got {scale!r}.")
        if not (_is_real(df) and 0 < df < math.inf):
            raise ValueError(f"`df` must be a finite number > 0, got {df!r}.")
        if not (_is_real(shape) and 1 < shape < math.inf):
            raise ValueError(f"`shape` must be a finite number > 1, got {shape!r}.")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, numbers.Integral)):
            raise ValueError(f"`seed` must be an integer or None, got {seed!r}.")
        if generator is not None and not (
            isinstance(generator, torch.Generator) and generator.device.type == "cpu"
        ):
            raise ValueError(f"`generator` must be a CPU torch.Generator, got {generator!r}.")
        self.kind = kind
        self.scale = float(scale)
        self.df = float(df)
        self.shape = float(shape)
        self.seed = None if seed is None else int(seed)
        self._generator = make_generator(seed=seed, generator=generator)

    def __repr__(self) -> str:
        extra = {"student-t": f", df={self.df:g}", "pareto": f", shape={self.shape:g}"}
        return f"ObservationNoise({self.kind!r}, scale={self.scale:g}{extra.get(self.kind, '')})"

    @property
    def generator(self) -> torch.Generator | None:
        r"""The private generator (``None``: the global torch RNG)."""
        return self._generator

    def _uniform(self, shape: torch.Size) -> Tensor:
        r"""float64 draws in ``[0, 1)`` (multiples of ``2^-53``) on the CPU."""
        return torch.rand(shape, generator=self._generator, dtype=torch.float64)

    def sample(self, shape: torch.Size, like: Tensor) -> Tensor:
        r"""Draw noise.

        Args:
            shape: The shape of the draw.
            like: A tensor whose dtype and device the draw takes.

        Returns:
            A tensor of ``shape`` (float64 draws on the CPU, cast and moved like
            ``like``).
        """
        shape = torch.Size(shape)
        if self.kind == "gaussian":
            draw = torch.randn(shape, generator=self._generator, dtype=torch.float64)
        elif self.kind == "uniform":
            draw = 2.0 * self._uniform(shape) - 1.0
        elif self.kind == "student-t":
            u = self._uniform(shape) + 2.0**-54  # cell midpoints: in (0, 1), symmetric
            draw = torch.from_numpy(np.asarray(special.stdtrit(self.df, u.numpy())))
            big = torch.finfo(torch.float64).max  # only df < ~0.06 reaches it
            draw = draw.clamp(-big, big)
        else:  # pareto: P = (1 - U)^(-1/shape) with 1 - U in (0, 1]
            u = 1.0 - self._uniform(shape)
            draw = u.pow(-1.0 / self.shape) - self.shape / (self.shape - 1.0)
        return (self.scale * draw).to(device=like.device, dtype=like.dtype)

    @property
    def bound(self) -> float:
        r"""``R`` with ``|eta| <= R`` almost surely: ``scale`` for ``"uniform"``, ``0.0``
        for ``scale == 0``, ``math.inf`` (unbounded) otherwise."""
        if self.scale == 0.0:
            return 0.0
        return self.scale if self.kind == "uniform" else math.inf

    def moment(self, p: float) -> float:
        r"""``E|eta|^p``: closed forms where finite, ``math.inf`` where not.

        - gaussian: ``scale^p 2^(p/2) Gamma((p + 1)/2) / sqrt(pi)``;
        - uniform: ``scale^p / (p + 1)``;
        - student-t: ``scale^p df^(p/2) Gamma((p + 1)/2) Gamma((df - p)/2) /
          (sqrt(pi) Gamma(df/2))`` for ``p < df``, ``inf`` otherwise;
        - pareto (``Q = P - m``, ``m = shape / (shape - 1)``, ``a = shape``): for
          ``p < a``, ``E|Q|^p = a m^(p-a) [B(a - p, p + 1) + int_1^m (t - 1)^p
          t^(a-p-1) dt]`` (substituting ``x = m / t`` in ``int |x - m|^p a x^(-a-1)
          dx``): the right-tail part is the Beta function, the part on ``[1, m]`` a
          smooth finite integral computed with ``scipy.integrate.quad`` (relative
          error ~1e-12); ``p = 2`` gives the variance ``a / ((a - 1)^2 (a - 2))``.
          ``inf`` for ``p >= a``.

        Args:
            p: The order, ``> 0`` and finite.

        Returns:
            ``E|eta|^p`` (``0.0`` for ``scale == 0``).
        """
        if not (_is_real(p) and 0 < p < math.inf):
            raise ValueError(f"`p` must be a finite number > 0, got {p!r}.")
        p = float(p)
        if self.scale == 0.0:
            return 0.0
        factor = self.scale**p
        if self.kind == "gaussian":
            return factor * 2.0 ** (p / 2) * math.gamma((p + 1) / 2) / math.sqrt(math.pi)
        if self.kind == "uniform":
            return factor / (p + 1)
        if self.kind == "student-t":
            if p >= self.df:
                return math.inf
            nu = self.df
            log_m = (
                (p / 2) * math.log(nu)
                + math.lgamma((p + 1) / 2)
                + math.lgamma((nu - p) / 2)
                - 0.5 * math.log(math.pi)
                - math.lgamma(nu / 2)
            )
            return factor * math.exp(log_m)
        a = self.shape
        if p >= a:
            return math.inf
        m = a / (a - 1.0)
        inner, _ = integrate.quad(
            lambda t: (t - 1.0) ** p * t ** (a - p - 1.0), 1.0, m, epsabs=0.0, epsrel=1e-13
        )
        return factor * a * m ** (p - a) * (special.beta(a - p, p + 1.0) + inner)

    def state_dict(self) -> dict:
        r"""The generator's state (``{}`` without a private generator)."""
        if self._generator is None:
            return {}
        return {"generator": self._generator.get_state()}

    def load_state_dict(self, state: dict) -> None:
        r"""Restore :meth:`state_dict`.

        Raises:
            ValueError: If ``state``'s keys do not match this noise's.
        """
        expected = set() if self._generator is None else {"generator"}
        if not isinstance(state, dict) or set(state) != expected:
            keys = sorted(state) if isinstance(state, dict) else state
            raise ValueError(
                f"`state` of {self!r} must have keys {sorted(expected)}, got {keys!r}."
            )
        if self._generator is not None:
            self._generator.set_state(state["generator"])

    def describe(self) -> dict:
        r"""A JSON-friendly description: kind, scale, ``df`` / ``shape`` where they
        apply, the seed, and the bound (``None``: unbounded)."""
        out: dict = {"kind": self.kind, "scale": self.scale}
        if self.kind == "student-t":
            out["df"] = self.df
        if self.kind == "pareto":
            out["shape"] = self.shape
        out["seed"] = self.seed
        bound = self.bound
        out["bound"] = bound if math.isfinite(bound) else None
        return out


__all__ = ["NOISE_KINDS", "ObservationNoise"]
