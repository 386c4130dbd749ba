r"""The parameter formulas of [LDP-BO] (Zhou & Tan, 2020), one function each.

Every learner (:class:`~botorch_fed.ldp.ucb_learner.UCBLearner`) takes these as its
defaults; each can be overridden (a constant ``beta``, a ``beta_scale``, a dictionary rate
``q``, plays per epoch ``k``). The theory's constants are large: with them the confidence widths are
conservative and the learners explore for a long time. The paper's own experiments set
the parameters "order-wise similar" to the theorems; ``beta_scale`` is that knob.

Notation: ``B`` bounds ``|f|`` (RKHS norm), ``R`` the noise, ``epsilon`` the LDP level,
``L = 2 (B + R) / epsilon`` the Laplace scale of Curator 1, ``lam`` the ridge/noise
parameter ``lambda``, ``delta`` the confidence, ``accuracy`` the Nystrom accuracy
(the paper's :math:`\varepsilon`, Definition 2), ``rho = (1 + accuracy) / (1 - accuracy)``,
``T`` the horizon, ``gamma`` the information gain of the plays so far, ``m`` the
Nystrom dimension. All formulas assume finite variance (the paper's ``alpha = 1``).

References:

.. [LDP-BO] X. Zhou, J. Tan. Local differential privacy for Bayesian optimization
   (paper 002 in ``shared/papers``): Alg. 1-3, Thm. 2-4, Cor. 1, Lemma 8.
"""

from __future__ import annotations

import functools
import inspect
import math


def _positive(name: str, value: float, allow_zero: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"`{name}` must be a number, got {value!r}.")
    ok = value >= 0 if allow_zero else value > 0
    if not (ok and math.isfinite(value)):
        kind = "non-negative" if allow_zero else "positive"
        raise ValueError(f"`{name}` must be a finite {kind} number, got {value!r}.")
    return float(value)


def _integer(name: str, value, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"`{name}` must be an integer >= {minimum}, got {value!r}.")
    return value


def _open_unit(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < 1:
        raise ValueError(f"`{name}` must be in (0, 1), got {value!r}.")
    return float(value)


# how each argument of the formulas is checked (a ValueError names the argument)
_RULES = {
    **{
        n: (lambda n, v: _positive(n, v, allow_zero=True))
        for n in ("B", "R", "scale", "b_prev", "gamma", "K", "v", "bias", "c")
    },  # fmt: skip
    "epsilon": _positive,
    "lam": _positive,
    "delta": _open_unit,
    "accuracy": _open_unit,
    "horizon": lambda n, v: _integer(n, v, 1),
    "t": lambda n, v: _integer(n, v, 0),
    "m": lambda n, v: _integer(n, v, 0),
}


def _validated(fn):
    r"""Check every argument of a formula by its name (:data:`_RULES`)."""
    names = list(inspect.signature(fn).parameters)

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        bound = dict(zip(names, args, strict=False)) | kwargs
        for name, value in bound.items():
            _RULES[name](name, value)
        return fn(*args, **kwargs)

    return wrapper


@_validated
def laplace_scale(epsilon: float, B: float, R: float) -> float:
    r"""``L = 2 (B + R) / epsilon``, the scale of Curator 1's Laplace noise."""
    return 2.0 * (_positive("B", B, True) + _positive("R", R, True)) / _positive("epsilon", epsilon)


@_validated
def rho(accuracy: float) -> float:
    r"""``(1 + accuracy) / (1 - accuracy)`` of Thm. 2 and 4 (``accuracy`` in (0, 1))."""
    if not (isinstance(accuracy, int | float) and 0 < accuracy < 1):
        raise ValueError(f"`accuracy` must be in (0, 1), got {accuracy!r}.")
    return (1 + accuracy) / (1 - accuracy)


@_validated
def nystrom_rate(horizon: int, delta: float, accuracy: float) -> float:
    r"""``q = 6 rho ln(4 T / delta) / accuracy^2`` (Thm. 2 and 4): a point enters the
    Nystrom dictionary with probability ``min(q sigma~^2, 1)``."""
    return 6 * rho(accuracy) * math.log(4 * horizon / delta) / accuracy**2


@_validated
def plays_per_epoch(horizon: int, delta: float) -> int:
    r"""``k = ceil(24 ln(4 e T / delta))`` of MoMA-GP-UCB (Alg. 3, Thm. 4)."""
    return math.ceil(24 * math.log(4 * math.e * horizon / delta))


@_validated
def tgp_truncation(t: int, B: float, R: float, scale: float) -> float:
    r"""LDP-TGP-UCB's truncation point ``b_t = B + R + L ln t`` (Alg. 2), ``L = scale``;
    ``ln t`` is taken as 0 for ``t <= 1`` (the paper's ``b_0`` would be ``-inf``)."""
    return B + R + scale * math.log(max(t, 1))


@_validated
def tgp_beta(
    t: int, B: float, lam: float, b_prev: float, gamma: float, delta: float, K: float
) -> float:
    r"""LDP-TGP-UCB's ``beta_t = B + (2 sqrt 2 / sqrt lam) b_{t-1} sqrt(gamma_{t-1} + ln 1/delta)
    + (1 / sqrt lam) sqrt(K (ln(t-1) + 1))`` (Alg. 2 line 5), ``K = B^2 + R^2 + 2 L^2``."""
    log_t = math.log(max(t - 1, 1))
    return (
        B
        + 2 * math.sqrt(2 / lam) * b_prev * math.sqrt(gamma + math.log(1 / delta))
        + math.sqrt(K * (log_t + 1) / lam)
    )


@_validated
def heavy_tailed_truncation(t: int, v: float) -> float:
    r"""Non-private TGP-UCB's truncation point for finite variance, ``b_t = sqrt(v) t^(1/4)``
    (the ``Theta(t^(1/4))`` of [LDP-BO] Sec. 4.3 for [7]'s TGP-UCB with ``alpha = 1``;
    ``v`` bounds the rewards' second moment)."""
    return math.sqrt(v) * max(t, 1) ** 0.25


@_validated
def heavy_tailed_tgp_beta(
    B: float, lam: float, b_prev: float, gamma: float, delta: float, bias: float
) -> float:
    r"""Non-private TGP-UCB's width ``B + (2 sqrt 2 / sqrt lam) b sqrt(gamma + ln 1/delta)
    + bias / sqrt lam``: Alg. 2's self-normalised term with the truncation bias
    ``bias = sqrt(sum_tau (v / b_tau)^2)`` (``|E[y 1{|y| > b}]| <= v / b``) in place of
    the Laplace tail term."""
    return (
        B
        + 2 * math.sqrt(2 / lam) * b_prev * math.sqrt(gamma + math.log(1 / delta))
        + bias / (math.sqrt(lam))
    )


@_validated
def ata_truncation(v: float, m: int, horizon: int, delta: float) -> float:
    r"""LDP-ATA-GP-UCB's feature-adaptive threshold ``b_t = sqrt(v / ln(4 m_t T / delta))``
    (Thm. 2), ``v = B^2 + R^2 + 8 (B + R)^2 / epsilon^2`` (private) or the rewards'
    second-moment bound (non-private)."""
    return math.sqrt(v / math.log(4 * max(m, 1) * horizon / delta))


@_validated
def ata_beta(B: float, accuracy: float, v: float, m: int, horizon: int, delta: float, lam: float):
    r"""``beta_{t+1} = B (1 + 1 / sqrt(1 - accuracy)) + 4 sqrt(ln(4 m_t T / delta) v m_t / lam)``
    (Thm. 2)."""
    log = math.log(4 * max(m, 1) * horizon / delta)
    return B * (1 + 1 / math.sqrt(1 - accuracy)) + 4 * math.sqrt(log * v * m / lam)


@_validated
def moma_beta(B: float, accuracy: float, c: float, m: int, lam: float) -> float:
    r"""``beta_{n+1} = B (1 + 1 / sqrt(1 - accuracy)) + 3 lam^(-1/2) (9 m_n c)^(1/2)``
    (Thm. 4 with ``alpha = 1``, and the ``lam^(-1/2)`` of its eq. (9))."""
    return B * (1 + 1 / math.sqrt(1 - accuracy)) + 3 * math.sqrt(9 * m * c / lam)


@_validated
def gp_ucb_beta(B: float, R: float, gamma: float, delta: float, lam: float) -> float:
    r"""IGP-UCB's ``beta_t = B + (R / sqrt lam) sqrt(2 (gamma_{t-1} + 1 + ln 1/delta))``
    (Chowdhury & Gopalan 2017, [LDP-BO]'s ref. [6]; ``R`` the sub-Gaussian parameter)."""
    return B + R * math.sqrt(2 * (gamma + 1 + math.log(1 / delta)) / lam)


@_validated
def private_second_moment(B: float, R: float, epsilon: float) -> float:
    r"""``v = B^2 + R^2 + 8 (B + R)^2 / epsilon^2`` (Thm. 2): the second moment of a
    privatised reward ``f + eta + Laplace(L)`` (``2 L^2 = 8 (B + R)^2 / epsilon^2``)."""
    return B**2 + R**2 + 2 * laplace_scale(epsilon, B, R) ** 2


@_validated
def private_noise_moment(B: float, R: float, epsilon: float) -> float:
    r"""``c = R^2 + 8 (B + R)^2 / epsilon^2`` (Cor. 1): the second moment of the total
    noise ``eta + Laplace(L)`` of a privatised reward."""
    return R**2 + 2 * laplace_scale(epsilon, B, R) ** 2
