r"""The parameter formulas of :mod:`botorch_fed.ldp.parameters` against the paper's text.

Each expected value is written out from [LDP-BO] (``shared/papers/002``) in the form the
paper prints it (``2 sqrt 2 / sqrt lam`` rather than ``2 sqrt(2 / lam)``, ``(9 m c)^(1/(1+alpha))
n^((1-alpha)/(2(1+alpha)))`` with ``alpha = 1``, ...), and pinned to literal numbers worked
out by hand for ``B = 1.5, R = 0.5, epsilon = 2`` (so ``L = 2``, ``v = 10.5``, ``c = 8.25``),
``T = 1000``, ``delta = 0.1``, accuracy ``0.5`` (``rho = 3``).

References: Curator 1 (``L``), Alg. 2 lines 2-5 (``K``, ``b_{t-1}``, ``beta_t``), Thm. 2
(``v``, ``q``, ``b_t``, ``beta_{t+1}``), Thm. 4 / Cor. 1 / eq. (9) (``k``, ``beta_{n+1}``,
``c``), Sec. 4.3 (``Theta(t^(1/4))`` truncation of non-private TGP-UCB).
"""

from __future__ import annotations

import inspect
import math

import pytest

from botorch_fed.ldp import parameters as P

B, R, EPS = 1.5, 0.5, 2.0
T, DELTA, ACC = 1000, 0.1, 0.5
REL = 1e-13  # every formula is a handful of float64 operations


def close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=REL, abs_tol=0.0)


def test_laplace_scale_and_private_moments():
    # Curator 1: L = 2 (B + R) / epsilon = 2 * 2 / 2
    assert close(P.laplace_scale(EPS, B, R), 2.0)
    assert close(P.laplace_scale(0.5, 1.0, 0.0), 4.0)
    # Thm. 2: v = B^2 + R^2 + 8 (B + R)^2 / epsilon^2 = 2.25 + 0.25 + 8 = 10.5
    assert close(P.private_second_moment(B, R, EPS), B**2 + R**2 + 8 * (B + R) ** 2 / EPS**2)
    assert close(P.private_second_moment(B, R, EPS), 10.5)
    # Cor. 1: c = R^2 + 8 (B + R)^2 / epsilon^2 = 0.25 + 8
    assert close(P.private_noise_moment(B, R, EPS), R**2 + 8 * (B + R) ** 2 / EPS**2)
    assert close(P.private_noise_moment(B, R, EPS), 8.25)
    # v = B^2 + c (the reward is f + noise, |f| <= B)
    assert close(
        P.private_second_moment(3.0, 0.25, 0.7), 9.0 + P.private_noise_moment(3.0, 0.25, 0.7)
    )


def test_rho_nystrom_rate_and_plays_per_epoch():
    assert close(P.rho(ACC), 3.0)
    assert close(P.rho(0.2), 1.2 / 0.8)
    # Thm. 2 / 4: q = 6 rho ln(4 T / delta) / accuracy^2 = 72 ln(40000)
    assert close(P.nystrom_rate(T, DELTA, ACC), 6 * 3.0 * math.log(4 * T / DELTA) / ACC**2)
    assert math.isclose(P.nystrom_rate(T, DELTA, ACC), 762.9577007829172, rel_tol=1e-12)
    assert close(P.nystrom_rate(50, 0.05, 0.25), 6 * (1.25 / 0.75) * math.log(4000) / 0.0625)
    # Alg. 3 line 3 / Thm. 4: k = ceil(24 ln(4 e T / delta)); 24 (ln 40000 + 1) = 278.32
    assert P.plays_per_epoch(T, DELTA) == 279
    assert isinstance(P.plays_per_epoch(T, DELTA), int)
    for horizon, delta in [(1, 0.5), (10, 0.1), (300, 0.01), (12345, 0.3)]:
        exact = 24 * math.log(4 * math.e * horizon / delta)
        assert P.plays_per_epoch(horizon, delta) == math.ceil(exact)


def test_tgp_truncation_is_alg2_b_t():
    L = P.laplace_scale(EPS, B, R)
    # b_t = B + R + L ln t: b_10 = 2 + 2 ln 10
    assert close(P.tgp_truncation(10, B, R, L), 6.605170185988092)
    for t in [1, 2, 3, 7, 100, 4096]:
        assert close(P.tgp_truncation(t, B, R, L), B + R + L * math.log(t))
    # documented convention: ln t -> 0 for t <= 1 (the paper's b_0 = B + R + L ln 0 = -inf)
    assert P.tgp_truncation(0, B, R, L) == B + R
    assert P.tgp_truncation(1, B, R, L) == B + R


def test_tgp_beta_is_alg2_line5():
    L = P.laplace_scale(EPS, B, R)
    K = B**2 + R**2 + 2 * L**2  # Alg. 2 line 2
    assert close(K, 10.5)
    lam, gamma = 2.0, 3.0
    for t in [2, 3, 10, 57]:
        b_prev = B + R + L * math.log(t - 1)  # Alg. 2 line 4
        expected = (
            B
            + 2 * math.sqrt(2) / math.sqrt(lam) * b_prev * math.sqrt(gamma + math.log(1 / DELTA))
            + 1 / math.sqrt(lam) * math.sqrt(K * (math.log(t - 1) + 1))
        )
        assert close(P.tgp_beta(t, B, lam, b_prev, gamma, DELTA, K), expected)
    # t = 10 by hand: b_9 = 2 + 2 ln 9, 1.5 + 2 b_9 sqrt(3 + ln 10) + sqrt(10.5 (ln 9 + 1) / 2)
    b9 = P.tgp_truncation(9, B, R, L)
    assert math.isclose(
        P.tgp_beta(10, B, lam, b9, gamma, DELTA, K), 35.04643678698391, rel_tol=1e-12
    )
    # t = 1: ln(t - 1) is taken as 0 (documented), so the last term is sqrt(K / lam)
    expected_1 = (
        B + 2 * math.sqrt(2 / lam) * (B + R) * math.sqrt(math.log(1 / DELTA)) + math.sqrt(K / lam)
    )
    assert close(P.tgp_beta(1, B, lam, B + R, 0.0, DELTA, K), expected_1)


def test_heavy_tailed_tgp():
    # Sec. 4.3: TGP-UCB's b_t = Theta(t^(1/4)) for finite variance; here sqrt(v) t^(1/4)
    for t, v in [(1, 2.0), (16, 3.0), (81, 0.5), (1000, 10.5)]:
        assert close(P.heavy_tailed_truncation(t, v), math.sqrt(v) * t**0.25)
    assert close(P.heavy_tailed_truncation(16, 4.0), 4.0)  # 2 * 16^(1/4)
    lam, b_prev, gamma, bias = 0.5, 2.5, 1.7, 3.0
    expected = (
        B
        + 2 * math.sqrt(2) / math.sqrt(lam) * b_prev * math.sqrt(gamma + math.log(1 / DELTA))
        + bias / math.sqrt(lam)
    )
    assert close(P.heavy_tailed_tgp_beta(B, lam, b_prev, gamma, DELTA, bias), expected)


def test_ata_truncation_and_beta_are_thm2():
    v, m, lam = 10.5, 12, 2.0
    log = math.log(4 * m * T / DELTA)  # ln 480000
    # b_t = sqrt(v / ln(4 m_t T / delta))
    assert close(P.ata_truncation(v, m, T, DELTA), math.sqrt(v / log))
    assert math.isclose(P.ata_truncation(v, m, T, DELTA), 0.8959116620538655, rel_tol=1e-12)
    # beta_{t+1} = B (1 + 1 / sqrt(1 - accuracy)) + 4 sqrt(ln(4 m_t T / delta) v m_t / lam)
    expected = B * (1 + 1 / math.sqrt(1 - ACC)) + 4 * math.sqrt(log * v * m / lam)
    assert close(P.ata_beta(B, ACC, v, m, T, DELTA, lam), expected)
    assert math.isclose(P.ata_beta(B, ACC, v, m, T, DELTA, lam), 118.45247340729556, rel_tol=1e-12)
    # an empty dictionary (m = 0): the log takes m = 1 (documented), the width term is 0
    assert close(P.ata_beta(B, ACC, v, 0, T, DELTA, lam), B * (1 + 1 / math.sqrt(1 - ACC)))
    assert close(P.ata_truncation(v, 0, T, DELTA), math.sqrt(v / math.log(4 * T / DELTA)))


def test_moma_beta_is_thm4_with_alpha_one():
    c, m, n, alpha = 8.25, 12, 7, 1.0
    # Thm. 4: beta_{n+1} = B (1 + 1/sqrt(1 - eps))
    #                      + 3 (9 m_n c)^(1/(1+alpha)) n^((1-alpha)/(2(1+alpha)))
    gamma_n = (9 * m * c) ** (1 / (1 + alpha)) * n ** ((1 - alpha) / (2 * (1 + alpha)))
    thm4 = B * (1 + 1 / math.sqrt(1 - ACC)) + 3 * gamma_n
    assert close(P.moma_beta(B, ACC, c, m, 1.0), thm4)  # lam = 1: Thm. 4 as printed
    assert math.isclose(thm4, 93.17018968315544, rel_tol=1e-12)
    # eq. (9): beta_{n+1} = B (1 + 1/sqrt(1 - eps)) + lam^(-1/2) 3 gamma
    lam = 4.0
    eq9 = B * (1 + 1 / math.sqrt(1 - ACC)) + lam**-0.5 * 3 * gamma_n
    assert close(P.moma_beta(B, ACC, c, m, lam), eq9)
    # Cor. 1: the private c
    c_priv = P.private_noise_moment(B, R, EPS)
    assert close(
        P.moma_beta(B, 0.2, c_priv, 5, 1.0),
        B * (1 + 1 / math.sqrt(0.8)) + 3 * math.sqrt(9 * 5 * c_priv),
    )


def test_gp_ucb_beta():
    # IGP-UCB (ref. [6]) as documented: B + (R / sqrt lam) sqrt(2 (gamma + 1 + ln 1/delta))
    lam, gamma = 0.25, 4.2
    expected = B + R / math.sqrt(lam) * math.sqrt(2 * (gamma + 1 + math.log(1 / DELTA)))
    assert close(P.gp_ucb_beta(B, R, gamma, DELTA, lam), expected)


# --- bad inputs --------------------------------------------------------------------

GOOD = dict(
    epsilon=2.0, B=1.0, R=0.5, accuracy=0.5, horizon=100, delta=0.1, t=5, scale=1.5,
    lam=1.0, b_prev=2.0, gamma=1.0, K=3.0, v=2.0, m=4, bias=0.5, c=1.0,
)  # fmt: skip
BAD = dict(
    epsilon=[0.0, -2.0, math.nan, math.inf], B=[-1.0, math.nan], R=[-0.5, math.nan],
    accuracy=[0.0, 1.0, math.nan], horizon=[0, -3, 2.5], delta=[0.0, 1.5, -0.1, math.nan],
    t=[-1, 2.5], scale=[-1.0, math.nan], lam=[0.0, -1.0, math.nan], b_prev=[-2.0, math.nan],
    gamma=[-1.0, math.nan], K=[-3.0, math.nan], v=[-2.0, math.nan], m=[-1, 2.5],
    bias=[-0.5, math.nan], c=[-1.0, math.nan],
)  # fmt: skip
FUNCTIONS = [
    "laplace_scale", "rho", "nystrom_rate", "plays_per_epoch", "tgp_truncation", "tgp_beta",
    "heavy_tailed_truncation", "heavy_tailed_tgp_beta", "ata_truncation", "ata_beta",
    "moma_beta", "gp_ucb_beta", "private_second_moment", "private_noise_moment",
]  # fmt: skip


def _cases():
    for name in FUNCTIONS:
        yield pytest.param(name, id=name)


@pytest.mark.parametrize("name", list(_cases()))
def test_bad_input_raises_value_error_naming_it(name):
    fn = getattr(P, name)
    args = list(inspect.signature(fn).parameters)
    fn(**{a: GOOD[a] for a in args})  # the good values are accepted
    for arg in args:
        for value in BAD[arg]:
            kwargs = {a: GOOD[a] for a in args}
            kwargs[arg] = value
            with pytest.raises(ValueError, match=f"`{arg}`"):
                fn(**kwargs)


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, True, "1"])
def test_non_numbers_rejected_where_validated(value):
    with pytest.raises(ValueError, match="`epsilon`"):
        P.laplace_scale(value, B, R)
    with pytest.raises(ValueError, match="`accuracy`"):
        P.rho(value)
