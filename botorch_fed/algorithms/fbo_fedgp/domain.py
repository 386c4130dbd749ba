r"""The declared domains of what an FBO-FedGP client computes on (docs/security.md, **Values
the server chooses**): chosen freely, ``theta``, the support or the standardisation could
make a summary's size (a refusal) reveal an outcome, so ``theta`` lies in
:func:`theta_domain` (:data:`THETA`), the support in :data:`SUPPORT` and the standardised
outcomes in ``[-Z, Z]`` (:func:`outcome_bound`, clamped)."""

from __future__ import annotations

import math

import numpy as np

from botorch_fed.protocol.declarations import Array

MEAN_RANGE = (-10.0, 10.0)  # the constant mean, in standardised units
_RANGES = {  # lengthscales (unit cube), noise variance (standardised): BoTorch's bounds below
    "covar_module.raw_lengthscale": (0.025, 1e4),
    "likelihood.noise_covar.raw_noise": (1e-4, 1e4),
    "mean_module.raw_constant": MEAN_RANGE,
}


def theta_domain(hyper) -> np.ndarray:
    r"""The ``size x 2`` box ``[lower, upper]`` of ``theta`` a client computes on: each
    entry's declared range within its own bounds (``hyper``: ``PITCHyperparameters``).

    Raises:
        ValueError: A parameter without a declared range, or transformed by its constraint.
    """
    rows = []
    for name, parameter in hyper.parameters.items():
        if name not in _RANGES:
            raise ValueError(f"The hyperparameter {name!r} has no declared domain.")
        constraint = hyper._constraints.get(name)
        if constraint is not None and constraint.enforced:
            raise ValueError(
                f"The hyperparameter {name!r} is transformed by its constraint; the "
                "declared domain is of untransformed values."
            )
        rows += [_RANGES[name]] * parameter.numel()
    domain, own = np.array(rows, dtype=np.float64), np.asarray(hyper.bounds, dtype=np.float64)
    return np.stack([np.maximum(domain[:, 0], own[:, 0]), np.minimum(domain[:, 1], own[:, 1])], 1)


#: a ``theta`` the server sends: within the receiving client's :attr:`theta_domain`
THETA = Array(
    (lambda client: len(client.theta_domain),),
    lambda client: client.theta_domain[:, 0],
    lambda client: client.theta_domain[:, 1],
    note=lambda client: (
        f"hyperparameters outside the declared domain (lower {client.theta_domain[:, 0]}, "
        f"upper {client.theta_domain[:, 1]})"
    ),
)
#: a support set: ``1 .. max_support_size()`` points of the receiving client's unit cube
SUPPORT = Array(
    (None, "dim"),
    0.0,
    1.0,
    rows=(1, "max_support_size"),
    note=lambda client: (
        f"must be 1..{client.max_support_size()} finite points of [0, 1]^{client.dim}"
    ),
)


def clamp_to_domain(values: np.ndarray, domain: np.ndarray) -> np.ndarray:
    r"""``values`` clamped into the domain (non-finite entries to its centre): a sum is
    never refused for its value (that would be a bit of it)."""
    values = np.asarray(values, dtype=np.float64)
    values = np.where(np.isfinite(values), values, domain.mean(axis=1))
    return np.clip(values, domain[:, 0], domain[:, 1])


def outcome_bound(num_clients: int, num_init: int, num_rounds: int) -> float:
    r"""``Z = sqrt(num_clients * (num_init + num_rounds))``: ``n`` standardised outcomes lie
    within ``(n - 1) / sqrt(n) < Z`` of 0 (Samuelson), so only a forged standardisation
    exceeds it."""
    return math.sqrt(int(num_clients) * (int(num_init) + int(num_rounds)))
