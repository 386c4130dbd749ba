r"""Independent numpy re-implementations of CEC-2005 functions for the tests.

Written from the report's formulas, one point at a time, reading the raw data files
directly (only the *folder* is located through ``opfunu_data_dir``); the report's
modifications (F5, F8, F18-F20 optima) are re-derived here from their 1-based
definitions, not taken from the package.
"""

from __future__ import annotations

import importlib.util
import math

import numpy as np

BIASES = {
    1: -450.0,
    2: -450.0,
    3: -450.0,
    4: -450.0,
    5: -310.0,
    6: 390.0,
    7: -180.0,
    8: -140.0,
    9: -330.0,
    10: -330.0,
    11: 90.0,
    12: -460.0,
    13: -130.0,
    14: -300.0,
    15: 120.0,
    16: 120.0,
    17: 120.0,
    18: 10.0,
    19: 10.0,
    20: 10.0,
}
ROTATED = {3, 7, 8, 10, 11, 14, 16, 17, 18, 19, 20}


def _available(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


HAS_OPFUNU = _available("opfunu")
HAS_OPTPROBLEMS = _available("optproblems")


def load(name: str) -> np.ndarray:
    from botorch_fed.test_functions import opfunu_data_dir

    return np.loadtxt(opfunu_data_dir() / name, ndmin=2)


def matrix(prefix: str, dim: int, blocks: int = 1) -> np.ndarray:
    m = load(f"{prefix}_M_D{dim}.txt")
    return m.reshape(blocks, dim, dim) if blocks > 1 else m


def optimum(n: int, dim: int) -> np.ndarray:
    r"""The global minimiser of F``n`` derived from the data files + report rules."""
    files = {
        1: "data_sphere.txt",
        2: "data_schwefel_102.txt",
        3: "data_high_cond_elliptic_rot.txt",
        4: "data_schwefel_102.txt",
        6: "data_rosenbrock.txt",
        7: "data_griewank.txt",
        8: "data_ackley.txt",
        9: "data_rastrigin.txt",
        10: "data_rastrigin.txt",
        11: "data_weierstrass.txt",
        13: "data_EF8F2.txt",
        14: "data_E_ScafferF6.txt",
    }
    if n in files:
        o = load(files[n])[0, :dim].copy()
        if n == 8:
            for j in range(1, dim // 2 + 1):  # o_{2j-1} = -32, 1-based
                o[2 * j - 1 - 1] = -32.0
        return o
    if n == 5:
        o = load("data_schwefel_206.txt")[0, :dim].copy()
        for i in range(1, dim + 1):  # 1-based, Matlab order
            if i <= math.ceil(dim / 4):
                o[i - 1] = -100.0
        for i in range(max(math.floor(0.75 * dim), 1), dim + 1):
            o[i - 1] = 100.0
        return o
    if n == 12:
        return load("data_schwefel_213.txt")[200, :dim].copy()
    return composition_optima(n, dim)[0]


def composition_optima(n: int, dim: int) -> np.ndarray:
    if n <= 17:
        return load("data_hybrid_func1.txt")[:, :dim].copy()
    o = load("data_hybrid_func2.txt")[:, :dim].copy()
    o[9] = 0.0
    if n == 20:
        for j in range(1, dim // 2 + 1):  # o_{1, 2j} = 5, 1-based
            o[0, 2 * j - 1] = 5.0
    return o


# ---- basic functions, one point (1-D array) at a time, straight from the report ----


def sphere(z):
    return float(np.sum(z**2))


def rastrigin(z):
    return float(np.sum(z**2 - 10 * np.cos(2 * np.pi * z) + 10))


def griewank(z):
    i = np.arange(1, len(z) + 1)
    return float(np.sum(z**2) / 4000 - np.prod(np.cos(z / np.sqrt(i))) + 1)


def ackley(z):
    d = len(z)
    return float(
        -20 * np.exp(-0.2 * np.sqrt(np.sum(z**2) / d))
        - np.exp(np.sum(np.cos(2 * np.pi * z)) / d)
        + 20
        + np.e
    )


def weierstrass(z, a=0.5, b=3.0, kmax=20):
    k = np.arange(kmax + 1)
    total = 0.0
    for zi in z:
        total += np.sum(a**k * np.cos(2 * np.pi * b**k * (zi + 0.5)))
    return float(total - len(z) * np.sum(a**k * np.cos(2 * np.pi * b**k * 0.5)))


def composition(x, optima, matrices, sigmas, lambdas, funcs, f_bias):
    r"""The report's hybrid composition function, literally (C = 2000)."""
    d = len(x)
    w = np.array(
        [np.exp(-np.sum((x - optima[i]) ** 2) / (2 * d * sigmas[i] ** 2)) for i in range(10)]
    )
    w_max = w.max()
    w = np.array([wi if wi == w_max else wi * (1 - w_max**10) for wi in w])
    w = w / w.sum()
    total = 0.0
    for i in range(10):
        f_max = funcs[i]((5 * np.ones(d) / lambdas[i]) @ matrices[i])
        f_i = funcs[i](((x - optima[i]) / lambdas[i]) @ matrices[i])
        total += w[i] * (2000 * f_i / abs(f_max) + 100 * i)
    return total + f_bias


COMPOSITION_1 = [rastrigin] * 2 + [weierstrass] * 2 + [griewank] * 2
COMPOSITION_1 += [ackley] * 2 + [sphere] * 2
LAMBDAS_1 = [1, 1, 10, 10, 5 / 60, 5 / 60, 5 / 32, 5 / 32, 5 / 100, 5 / 100]
COMPOSITION_2 = [ackley] * 2 + [rastrigin] * 2 + [sphere] * 2
COMPOSITION_2 += [weierstrass] * 2 + [griewank] * 2
SIGMAS_2 = [1, 2, 1.5, 1.5, 1, 1, 1.5, 1.5, 2, 2]
LAMBDAS_2 = [2 * 5 / 32, 5 / 32, 2, 1, 2 * 5 / 100, 5 / 100, 20, 10, 2 * 5 / 60, 5 / 60]


def composition_spec(n: int, dim: int):
    r"""(optima, matrices, sigmas, lambdas, funcs) of F15, F16, F18, F19, F20."""
    optima = composition_optima(n, dim)
    if n == 15:
        return optima, [np.eye(dim)] * 10, [1] * 10, LAMBDAS_1, COMPOSITION_1
    if n == 16:
        return optima, matrix("hybrid_func1", dim, 10), [1] * 10, LAMBDAS_1, COMPOSITION_1
    sigmas, lambdas = list(SIGMAS_2), list(LAMBDAS_2)
    if n == 19:
        sigmas[0], lambdas[0] = 0.1, 0.1 * 5 / 32
    return optima, matrix("hybrid_func2", dim, 10), sigmas, lambdas, COMPOSITION_2
