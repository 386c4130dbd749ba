r"""The Laplace mechanism of LDP-BO (Curator 1, ``CTL(epsilon)``), with clipping.

Zhou & Tan, "Local Differential Privacy for Bayesian Optimization" (2020), Sec. 4.1:
a user holding a reward ``y = f(x) + eta`` with ``|f(x)| <= B`` (RKHS norm bound) and
``|eta| <= R`` reports ``y + L`` with ``L ~ Laplace(scale = 2 (B + R) / epsilon)``
(density ``exp(-|l| / scale) / (2 scale)``, mean 0, variance ``2 scale^2``). Lemma 1
(proof in App. B): the sensitivity of ``y`` is ``2 (B + R)``, so the report is
``epsilon``-LDP: for all inputs ``y, y'`` and every measurable set ``A``,
``P[M(y) in A] <= exp(epsilon) P[M(y') in A]``.

Clipping. Lemma 1 only holds for inputs in ``[-(B + R), B + R]``; a reward outside that
interval (a wrong ``B``, heavier noise than assumed) would be released with a privacy
loss ``|y - y'| / scale`` larger than ``epsilon``. :class:`LaplaceMechanism` therefore
clips ``y`` to ``[-(B + R), B + R]`` before adding the noise, which makes the guarantee
hold for every finite input. Clipping changes the released value only for inputs
outside the declared bound; how often that happened is counted (and recorded in a
:class:`~botorch_fed.privacy.ledger.PrivacyLedger` when one is attached).

Unbounded noise (Sec. 4.5). For sub-Weibull noise, ``P(|eta| >= x) <= a exp(-b
x^(1/theta))``, :meth:`LaplaceMechanism.sub_weibull` picks ``R`` so that, with
probability at least ``1 - delta``, no noise value over a horizon of ``T`` rewards
exceeds ``R``; the paper calls the resulting mechanism ``(epsilon, delta)``-LDP.

Floating point. The noise is drawn by inverse CDF in float64; as for every textbook
floating-point Laplace sampler, the low-order bits of ``y + L`` can leak information
about ``y`` (Mironov, "On significance of the least significant bits for differential
privacy", CCS 2012). The snapping mechanism that closes this gap is not implemented:
the guarantee is that of the idealised real-valued mechanism.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from botorch_fed.privacy._validation import (
    as_real,
    check_count,
    check_nonnegative_finite,
    check_positive_finite,
    check_probability,
    check_user,
)
from botorch_fed.privacy.stream import KeyStream

if TYPE_CHECKING:  # pragma: no cover
    from botorch_fed.privacy.ledger import PrivacyLedger

__all__ = ["LaplaceMechanism", "sub_weibull_radius"]

# Largest |L| / scale the float64 inverse-CDF sampler can return: u >= 2^-53 (a torch
# generator's grid; the key stream's is 2^-53 too: (k + 1/2) / 2^52), so
# 1 - 2|u - 1/2| >= 2^-52 and |log1p(-2|u - 1/2|)| <= 53 ln 2 ~ 36.7.
_MAX_NOISE_OVER_SCALE = 53.0 * math.log(2.0)


def _uniforms(n: int, source: KeyStream | torch.Generator) -> Tensor:
    r"""``n`` uniforms on the open interval ``(0, 1)`` from ``source`` (float64, CPU)."""
    if isinstance(source, KeyStream):
        return source.uniform(n)
    u = torch.rand(n, dtype=torch.float64, generator=source)
    bad = u == 0.0  # torch.rand is [0, 1): redraw the endpoint
    while bool(bad.any()):
        u[bad] = torch.rand(int(bad.sum()), dtype=torch.float64, generator=source)
        bad = u == 0.0
    return u


def _laplace_noise(
    shape: torch.Size | tuple[int, ...], scale: float, source: KeyStream | torch.Generator
) -> Tensor:
    r"""I.i.d. ``Laplace(0, scale)`` draws in float64 on the CPU, by inverse CDF.

    ``u ~ U(-1/2, 1/2)`` (open interval) and ``L = -scale * sign(u) * log1p(-2 |u|)``.
    Draws come only from ``source`` (never from torch's global RNG), on the CPU, so a
    seed gives the same stream on every device.

    Args:
        shape: Output shape (``()`` for a scalar).
        scale: Laplace scale ``>= 0`` (not validated here).
        source: The mechanism's :class:`~botorch_fed.privacy.stream.KeyStream`, or a
            CPU :class:`torch.Generator` (simulations only: 32-bit seeds).

    Returns:
        A float64 CPU tensor of shape ``shape``; every entry finite.
    """
    shape = torch.Size(shape)
    u = _uniforms(shape.numel(), source) - 0.5
    noise = -scale * torch.sign(u) * torch.log1p(-2.0 * u.abs())
    return noise.reshape(shape)


def sub_weibull_radius(
    delta: float, horizon: int, theta: float, a: float = 2.0, b: float = 1.0
) -> float:
    r"""Noise radius ``R`` exceeded by any of ``horizon`` sub-Weibull draws w.p. ``<= delta``.

    For ``P(|eta| >= x) <= a exp(-b x^(1/theta))`` (paper Eq. (5), Sec. 4.5) a union
    bound over ``T = horizon`` draws gives ``P(exists t <= T: |eta_t| > R) <=
    T a exp(-b R^(1/theta)) = delta`` for ``R = (ln(a T / delta) / b)^theta``. If
    ``ln(a T / delta) <= 0`` the tail bound alone gives ``P(|eta| > 0) <= a <=
    delta / T`` and ``R = 0``.

    Args:
        delta: Allowed probability that some ``|eta_t|`` exceeds ``R``; in ``(0, 1)``.
        horizon: Number of rewards ``T``; integer ``>= 1``.
        theta: Tail parameter ``> 0`` (1/2: sub-Gaussian, 1: sub-exponential).
        a: Tail constant ``> 0``.
        b: Tail constant ``> 0``.

    Returns:
        ``R >= 0`` (finite).

    Raises:
        TypeError: If an argument has the wrong type.
        ValueError: If an argument is out of its domain, or ``R`` overflows float64.
    """
    delta = check_probability("delta", delta, allow_zero=False)
    horizon = check_count("horizon", horizon, minimum=1)
    theta = check_positive_finite("theta", theta)
    a = check_positive_finite("a", a)
    b = check_positive_finite("b", b)
    # ln(a T / delta) computed as a sum of logs: a * T / delta may overflow.
    log_term = math.log(a) + math.log(horizon) - math.log(delta)
    if log_term <= 0.0:
        return 0.0
    try:
        R = (log_term / b) ** theta
    except OverflowError:
        R = math.inf
    if not math.isfinite(R):
        raise ValueError(
            f"the noise radius R = (ln(a * horizon / delta) / b) ** theta overflows for "
            f"delta={delta!r}, horizon={horizon!r}, theta={theta!r}, a={a!r}, b={b!r}"
        )
    return R


class LaplaceMechanism:
    r"""``CTL(epsilon)`` of LDP-BO (Curator 1, Lemma 1) with input clipping.

    ``M(y) = clip(y, -(B + R), B + R) + L`` with ``L ~ Laplace(0, 2 (B + R) / epsilon)``
    i.i.d. per element. For every pair of finite inputs ``y, y'`` and every set ``A``,
    ``P[M(y) in A] <= exp(epsilon) P[M(y') in A]``: each released value is
    ``epsilon``-LDP. The clipping is part of the mechanism: without it the guarantee
    fails for inputs outside ``[-(B + R), B + R]`` (the privacy loss of ``y`` would be
    ``|y - y'| / scale``, unbounded). The guarantee is per released value; a user who
    releases ``k`` values has spent ``k * epsilon`` (basic composition), which an
    attached :class:`~botorch_fed.privacy.ledger.PrivacyLedger` keeps track of.

    ``B + R == 0`` is allowed: the scale is 0 and the output is the clipped input, i.e.
    identically 0 (independent of ``y``, so trivially private, and useless).

    Randomness comes from the mechanism's own
    :class:`~botorch_fed.privacy.stream.KeyStream` (ChaCha20 with a 256-bit key), never
    from torch's global RNG: by default the key is 32 bytes of OS entropy; ``seed``
    derives it from an integer (tests and reproducible simulations: whoever knows the
    seed knows the noise). ``generator`` draws from (and advances) a caller's CPU
    :class:`torch.Generator` instead -- simulations only: a Mersenne Twister keeps 32
    bits of its seed, so a server seeing a few dozen outputs can search every seed and
    subtract the noise.

    Args:
        epsilon: Privacy parameter; ``0 < epsilon < inf``.
        B: Bound on ``|f(x)|`` (``||f||_H`` for a kernel with ``k(x, x) <= 1``);
            finite, ``>= 0``.
        R: Bound on the observation noise ``|eta|``; finite, ``>= 0``.
        seed: An integer the stream's key is derived from (``None``: OS entropy).
        generator: A CPU :class:`torch.Generator` to draw from instead of the stream
            (exclusive with ``seed``; not private against a server that can search
            its 32-bit seed space).
        delta: The ``delta`` recorded with every release (``0`` for the bounded-noise
            mechanism of Sec. 4.1; see :meth:`sub_weibull`); in ``[0, 1)``.
        ledger: If given, every call records its release in it (an object with a
            :meth:`~botorch_fed.privacy.ledger.PrivacyLedger.record` method).
        user: The user recorded in ``ledger`` (``int``, ``str`` or ``None``).

    Raises:
        TypeError: If an argument has the wrong type.
        ValueError: If an argument is out of its domain, both ``seed`` and
            ``generator`` are given, or the noise scale overflows float64.

    Example:
        >>> mech = LaplaceMechanism(epsilon=1.0, B=1.0, R=0.5, seed=0)
        >>> mech.scale
        3.0
        >>> mech(torch.tensor([0.2, 7.0])).dtype  # 7.0 is clipped to 1.5 first
        torch.float64
    """

    def __init__(
        self,
        epsilon: float,
        B: float,
        R: float,
        seed: int | None = None,
        generator: torch.Generator | None = None,
        delta: float = 0.0,
        ledger: PrivacyLedger | None = None,
        user: int | str | None = None,
    ) -> None:
        self._epsilon = check_positive_finite("epsilon", epsilon)
        self._B = check_nonnegative_finite("B", B)
        self._R = check_nonnegative_finite("R", R)
        self._delta = check_probability("delta", delta, allow_zero=True)
        bound = self._B + self._R
        scale = 2.0 * bound / self._epsilon
        if not (math.isfinite(bound) and math.isfinite(bound + _MAX_NOISE_OVER_SCALE * scale)):
            raise ValueError(
                f"the Laplace scale 2 (B + R) / epsilon = {scale!r} (epsilon={self._epsilon!r}, "
                f"B={self._B!r}, R={self._R!r}) is too large for float64 outputs"
            )
        if ledger is not None and not callable(getattr(ledger, "record", None)):
            raise TypeError(
                f"ledger must be a PrivacyLedger (with a record method), got "
                f"{type(ledger).__name__}"
            )
        self.ledger = ledger
        self.user = check_user(user)
        self.horizon: int | None = None
        self._generator = _make_source(seed, generator)

    # ----------------------------------------------------------------------- parameters
    @property
    def epsilon(self) -> float:
        r"""Privacy parameter of each release."""
        return self._epsilon

    @property
    def B(self) -> float:  # noqa: N802 (the paper's notation)
        r"""Bound on ``|f(x)|``."""
        return self._B

    @property
    def R(self) -> float:  # noqa: N802 (the paper's notation)
        r"""Bound on the observation noise ``|eta|``."""
        return self._R

    @property
    def delta(self) -> float:
        r"""``delta`` recorded with each release (0 for bounded noise)."""
        return self._delta

    @property
    def bound(self) -> float:
        r"""``B + R``: inputs are clipped to ``[-bound, bound]``."""
        return self._B + self._R

    @property
    def scale(self) -> float:
        r"""Laplace scale ``2 (B + R) / epsilon`` (``\mathcal{L}`` of Curator 1)."""
        return 2.0 * (self._B + self._R) / self._epsilon

    @property
    def generator(self) -> KeyStream | torch.Generator:
        r"""Where the noise comes from: the mechanism's
        :class:`~botorch_fed.privacy.stream.KeyStream`, or the caller's generator."""
        return self._generator

    @property
    def position(self) -> int:
        r"""Bytes of the key stream used so far (releases never reuse them)."""
        if not isinstance(self._generator, KeyStream):
            raise TypeError("A mechanism drawing from a torch.Generator has no stream position.")
        return self._generator.position

    def fingerprint(self) -> str:
        r"""The public fingerprint of the mechanism's key (release logs are bound to it)."""
        if not isinstance(self._generator, KeyStream):
            raise TypeError("A mechanism drawing from a torch.Generator has no key.")
        return self._generator.fingerprint()

    def advance_to(self, position: int) -> None:
        r"""Move the key stream forward to ``position`` (e.g. past releases a restored
        checkpoint does not know of); never backwards."""
        if not isinstance(self._generator, KeyStream):
            raise TypeError("A mechanism drawing from a torch.Generator cannot be advanced.")
        self._generator.advance_to(position)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(epsilon={self._epsilon!r}, B={self._B!r}, R={self._R!r}, "
            f"delta={self._delta!r}, scale={self.scale!r})"
        )

    # ----------------------------------------------------------------------- release
    def __call__(self, y: Tensor) -> Tensor:
        r"""Release ``clip(y, -bound, bound) + Laplace(0, scale)``, i.i.d. per element.

        Args:
            y: Rewards, any shape (``()``, ``n``, ``n x 1``, ``batch x n``, ...), any
                real dtype, any device. Must be finite: NaN or inf raises (a NaN is
                never privatised). Gradients are not propagated (the output is
                detached).

        Returns:
            A float64 tensor of ``y``'s shape on ``y``'s device; every entry finite.
            If a ledger is attached, ``y.numel()`` releases (with the number of
            clipped entries) are recorded for ``self.user``; an empty ``y`` releases
            and records nothing.

        Raises:
            TypeError: If ``y`` is not a tensor, or is bool or complex.
            ValueError: If ``y`` contains NaN or inf.
        """
        y64 = _as_float64(y)
        clipped_y, n_clipped = self._clip(y64)
        if y64.numel() == 0:
            return clipped_y
        noise = _laplace_noise(y64.shape, self.scale, self._generator).to(y64.device)
        out = clipped_y + noise
        if not bool(torch.isfinite(out).all()):  # pragma: no cover (excluded by __init__)
            raise RuntimeError("LaplaceMechanism produced a non-finite output")
        if self.ledger is not None:
            self.ledger.record(
                self.user,
                epsilon=self._epsilon,
                delta=self._delta,
                count=y64.numel(),
                clipped=n_clipped,
            )
        return out

    def _clip(self, y: Tensor) -> tuple[Tensor, int]:
        r"""Clip ``y`` (float64, finite) to ``[-bound, bound]``.

        Returns:
            The clipped tensor and the number of entries with ``|y| > bound``.
        """
        bound = self.bound
        n_clipped = int((y.abs() > bound).sum())
        return torch.clamp(y, -bound, bound), n_clipped

    # ----------------------------------------------------------------------- sub-Weibull
    @classmethod
    def sub_weibull(
        cls,
        epsilon: float,
        B: float,
        delta: float,
        horizon: int,
        theta: float,
        a: float = 2.0,
        b: float = 1.0,
        seed: int | None = None,
        generator: torch.Generator | None = None,
        ledger: PrivacyLedger | None = None,
        user: int | str | None = None,
    ) -> LaplaceMechanism:
        r"""The mechanism for i.i.d. sub-Weibull noise (paper Sec. 4.5).

        The noise satisfies ``P(|eta| >= x) <= a exp(-b x^(1/theta))`` for all
        ``x > 0`` (paper Eq. (5)); ``theta = 1/2`` is sub-Gaussian and ``theta = 1``
        sub-exponential. ``R = (ln(a * horizon / delta) / b) ** theta`` (0 if the log
        is ``<= 0``) makes ``P(exists t <= horizon: |eta_t| > R) <= delta`` by a union
        bound (:func:`sub_weibull_radius`).

        What the guarantee means: the paper (Sec. 4.5) calls ``CTL(epsilon)`` with this
        ``R`` ``(epsilon, delta)``-LDP -- with probability at least ``1 - delta`` over
        the observation noise, every one of the ``horizon`` rewards lies within
        ``B + R`` and each release is ``epsilon``-LDP; the remaining ``delta`` is the
        chance that some reward falls outside the bound. Because this implementation
        clips, a reward outside the bound is clipped rather than released with a
        larger privacy loss, so each release is in fact ``epsilon``-LDP for every
        input; ``delta`` then bounds the probability that clipping changed any of the
        ``horizon`` rewards (a bias, not a privacy failure). ``delta`` is still
        recorded with every release, as the paper's accounting does (conservative).
        The union bound covers ``horizon`` rewards only: releasing more exceeds the
        ``delta`` budget (``self.horizon`` keeps the value for reference).

        Args:
            epsilon: Privacy parameter; ``0 < epsilon < inf``.
            B: Bound on ``|f(x)|``; finite, ``>= 0``.
            delta: Probability that some ``|eta_t|`` exceeds ``R``; in ``(0, 1)``.
            horizon: Number of rewards ``T``; integer ``>= 1``.
            theta: Sub-Weibull tail parameter ``> 0``.
            a: Tail constant ``> 0`` (default 2).
            b: Tail constant ``> 0`` (default 1).
            seed: See :class:`LaplaceMechanism`.
            generator: See :class:`LaplaceMechanism`.
            ledger: See :class:`LaplaceMechanism`.
            user: See :class:`LaplaceMechanism`.

        Returns:
            A :class:`LaplaceMechanism` with that ``R``, ``delta`` and ``horizon``.

        Raises:
            TypeError: If an argument has the wrong type.
            ValueError: If an argument is out of its domain or ``R`` overflows.
        """
        R = sub_weibull_radius(delta, horizon, theta, a=a, b=b)
        mech = cls(
            epsilon, B, R, seed=seed, generator=generator, delta=delta, ledger=ledger, user=user
        )
        mech.horizon = int(horizon)
        return mech

    # ----------------------------------------------------------------------- checkpoints
    def state_dict(self) -> dict[str, Any]:
        r"""Parameters and the generator state (a uint8 tensor), for checkpoints.

        Returns:
            ``{"epsilon", "B", "R", "delta", "generator_state"}``. The ledger is not
            included (it has its own :meth:`PrivacyLedger.state_dict`).
        """
        return {
            "epsilon": self._epsilon,
            "B": self._B,
            "R": self._R,
            "delta": self._delta,
            "generator_state": (
                self._generator.state()
                if isinstance(self._generator, KeyStream)
                else self._generator.get_state().clone()
            ),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        r"""Restore the generator state: the next draws continue the saved stream.

        Args:
            state: A dict from :meth:`state_dict` of a mechanism with the same
                ``epsilon``, ``B``, ``R`` and ``delta``.

        Raises:
            TypeError: If ``state`` is not a dict or the generator state is not a
                uint8 tensor.
            ValueError: If a key is missing, a parameter differs from this
                mechanism's (a stream calibrated for other parameters is refused), or
                torch rejects the generator state.
        """
        if not isinstance(state, dict):
            raise TypeError(f"state must be a dict, got {type(state).__name__}")
        for key in ("epsilon", "B", "R", "delta", "generator_state"):
            if key not in state:
                raise ValueError(f"state is missing the key {key!r}")
        for key, mine in (
            ("epsilon", self._epsilon),
            ("B", self._B),
            ("R", self._R),
            ("delta", self._delta),
        ):
            theirs = as_real(f"state[{key!r}]", state[key])
            if theirs != mine:
                raise ValueError(
                    f"state[{key!r}] = {theirs!r} differs from this mechanism's {key} = {mine!r}"
                )
        gs = state["generator_state"]
        if not isinstance(gs, torch.Tensor) or gs.dtype != torch.uint8:
            raise TypeError(
                f"state['generator_state'] must be a uint8 tensor, got {type(gs).__name__}"
                + (f" of dtype {gs.dtype}" if isinstance(gs, torch.Tensor) else "")
            )
        try:
            if isinstance(self._generator, KeyStream):
                self._generator = KeyStream.from_state(gs.detach().cpu().clone())
            else:
                self._generator.set_state(gs.detach().cpu().clone())
        except (RuntimeError, ValueError) as err:
            raise ValueError(
                f"state['generator_state'] is not a valid generator state: {err}"
            ) from None


def _make_source(seed: Any, generator: Any) -> KeyStream | torch.Generator:
    r"""The mechanism's randomness from ``seed`` / ``generator`` (see the class doc)."""
    if seed is not None and generator is not None:
        raise ValueError(
            f"give seed or generator, not both (got seed={seed!r} and generator={generator!r})"
        )
    if generator is not None:
        if not isinstance(generator, torch.Generator):
            raise TypeError(f"generator must be a torch.Generator, got {type(generator).__name__}")
        if generator.device.type != "cpu":
            raise ValueError(
                f"generator must be a CPU generator (noise is drawn on the CPU), got one on "
                f"{generator.device}"
            )
        return generator
    if seed is None:
        return KeyStream()  # 32 bytes of OS entropy
    return KeyStream.from_seed(check_count("seed", seed, minimum=-(2**63)))


def _as_float64(y: Any) -> Tensor:
    r"""``y`` detached and converted to float64 on its device, after checking it is a
    finite real tensor."""
    if not isinstance(y, torch.Tensor):
        raise TypeError(f"y must be a torch.Tensor, got {type(y).__name__}")
    if y.dtype == torch.bool or y.is_complex():
        raise TypeError(f"y must have a real dtype, got {y.dtype}")
    y64 = y.detach().to(torch.float64)
    finite = torch.isfinite(y64)
    if not bool(finite.all()):
        bad = y64[~finite]
        raise ValueError(
            f"y must be finite (NaN/inf rewards are never privatised), got "
            f"{int(bad.numel())} non-finite value(s), e.g. {float(bad[0])!r}"
        )
    return y64
