r"""Independent float64 references for the LDP-BO learner tests.

Everything here is written from the paper's formulas with dense ``torch.linalg`` and
the SE kernel of explicit differences -- nothing from :mod:`botorch_fed.models` or
:mod:`botorch_fed.ldp` -- so the tests compare two computations that share no code.

References: [LDP-BO] X. Zhou, J. Tan, *Local differential privacy for Bayesian
optimization* (``shared/papers/002``): eqs. (2)-(3) (GP posterior), Alg. 1 lines 8-13
(feature-adaptive truncation), Alg. 3 lines 9-12 (median of means), Alg. 4 line 7
(Nystrom features ``phi(x) = (K_D^{1/2})^+ k_D(x)``).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

F64 = torch.float64
LENGTHSCALE = 0.2


def se(A: Tensor, B: Tensor, lengthscale: float = LENGTHSCALE) -> Tensor:
    r"""``k_SE(x, x') = exp(-|x - x'|^2 / (2 l^2))`` (the paper's SE kernel) from explicit
    differences, float64."""
    A, B = A.to(F64), B.to(F64)
    d2 = ((A.unsqueeze(-2) - B.unsqueeze(-3)) ** 2).sum(-1)
    return torch.exp(-0.5 * d2 / lengthscale**2)


def gp_posterior(X: Tensor, y: Tensor, Xs: Tensor, lam: float) -> tuple[Tensor, Tensor, float]:
    r"""Eqs. (2)-(3) over all ``t`` plays (repeated points as separate rows):
    ``mu = k_t(x)' (K_t + lam I)^-1 y`` and ``sigma^2 = k(x, x) - k_t(x)' (K_t + lam I)^-1 k_t(x)``.

    Returns ``(mean, variance, cond(K_t + lam I))``.
    """
    A = se(X, X) + lam * torch.eye(len(X), dtype=F64)
    Ks = se(Xs, X)
    mean = Ks @ torch.linalg.solve(A, y.to(F64))
    var = 1.0 - (Ks * torch.linalg.solve(A, Ks.mT).mT).sum(-1)
    return mean, var, float(torch.linalg.cond(A))


def information_gain(X: Tensor, lam: float) -> float:
    r"""``0.5 log det(I + K_t / lam)`` of the plays (dense ``slogdet``)."""
    sign, logdet = torch.linalg.slogdet(torch.eye(len(X), dtype=F64) + se(X, X) / lam)
    assert float(sign) > 0
    return 0.5 * float(logdet)


def nystrom_features(D: Tensor, X: Tensor, rtol: float = 1e-10) -> Tensor:
    r"""Alg. 4 line 7: ``phi(x) = (K_D^{1/2})^+ k_D(x)``, rows of ``X`` (float64); the
    pseudo-inverse square root by ``eigh`` with eigenvalues below ``rtol * max`` dropped."""
    s, U = torch.linalg.eigh(se(D, D))
    keep = s > rtol * s.max()
    W = U[:, keep] @ torch.diag(s[keep] ** -0.5) @ U[:, keep].mT
    return se(X, D) @ W


def ridge(Phi: Tensor, y: Tensor, lam: float) -> Tensor:
    r"""``(Phi' Phi + lam I)^-1 Phi' y`` by ``torch.linalg.solve``."""
    V = Phi.mT @ Phi + lam * torch.eye(Phi.shape[1], dtype=F64)
    return torch.linalg.solve(V, Phi.mT @ y.to(F64))


def tofu(Phi: Tensor, y: Tensor, lam: float, b: Tensor) -> tuple[Tensor, int]:
    r"""Alg. 1 lines 8-11, written loop by loop: ``V = Phi' Phi + lam I``; the rows
    ``u_i'`` of ``V^{-1/2} Phi'`` (``V^{-1/2}`` from ``eigh``); ``r_i = sum_tau u_{i,tau}
    y_tau 1{|u_{i,tau} y_tau| <= b_tau}``; ``theta = V^{-1/2} r``. Returns ``theta`` and the
    number of dropped terms."""
    n, m = Phi.shape
    V = Phi.mT @ Phi + lam * torch.eye(m, dtype=F64)
    s, Q = torch.linalg.eigh(V)
    V_isqrt = Q @ torch.diag(s**-0.5) @ Q.mT
    U = V_isqrt @ Phi.mT  # m x n, rows u_i'
    r = torch.zeros(m, dtype=F64)
    dropped = 0
    for i in range(m):
        for tau in range(n):
            term = float(U[i, tau]) * float(y[tau])
            if abs(term) <= float(b[tau]):
                r[i] += term
            else:
                dropped += 1
    return V_isqrt @ r, dropped


def median_of_means(Phi: Tensor, Y: Tensor, lam: float) -> tuple[Tensor, int, list[float]]:
    r"""Alg. 3 lines 10-12 by brute force: ``theta_j = V^-1 sum_i y_{i,j} phi(x_i)``,
    ``r_j = median_{s != j} ||theta_j - theta_s||_V`` with ``||z||_V = sqrt(z' V z)`` (the
    statistical median; the tests use an odd number ``k - 1`` of distances, where it is
    the middle one), ``k* = argmin_j r_j``. Returns ``(theta_{k*}, k*, r)``."""
    n, m = Phi.shape
    k = Y.shape[1]
    V = Phi.mT @ Phi + lam * torch.eye(m, dtype=F64)
    thetas = [torch.linalg.solve(V, Phi.mT @ Y[:, j].to(F64)) for j in range(k)]
    r = []
    for j in range(k):
        dists = sorted(
            math.sqrt(float((thetas[j] - thetas[s]) @ V @ (thetas[j] - thetas[s])))
            for s in range(k)
            if s != j
        )
        half = len(dists) // 2
        med = dists[half] if len(dists) % 2 else 0.5 * (dists[half - 1] + dists[half])
        r.append(med)
    k_star = min(range(k), key=lambda j: r[j])
    return thetas[k_star], k_star, r
