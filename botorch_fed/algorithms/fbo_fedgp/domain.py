r"""The declared domains of what an FBO-FedGP client computes on.

The server (or the coordinator of a federated fit, another party) chooses the
hyperparameters a client summarises its data at (``arg:theta``, ``apply_theta``), the
support, the secure sums' encoding and the standardisation the sums imply. A server
that chose them freely could make a client's summary reveal its outcomes: with one
support point on a client's point, a lengthscale of ``1e-3``, noise ``1e-12`` and a
far mean constant the summary's largest entry is about ``(y_k - m)^2 / Lambda_kk``,
and whether it fits the encoding -- a refusal -- is one bit of ``y_k`` per query.
So every such value lies in a domain fixed before the run and is checked by the
client before it touches private data (docs/security.md, **Values the server
chooses**):

- the hyperparameters in :func:`theta_domain` (BoTorch's own lower bounds for the
  lengthscales and the noise, finite upper bounds, and a finite range for the
  constant mean in standardised units): outside it a client refuses -- a decision on
  the server's value alone, by the message's declaration (:data:`THETA`,
  :mod:`~botorch_fed.algorithms.fbo_fedgp.messages`);
- the standardised outcomes in ``[-Z, Z]`` with ``Z = sqrt(N_max)``
  (:func:`outcome_bound`, ``N_max`` the most outcomes the federation's settings
  allow): an honest standardisation never leaves it (Samuelson's inequality: ``n``
  values standardised with their own mean and sample standard deviation lie within
  ``(n - 1) / sqrt(n)``), so only a forged one is clamped;
- the encoding of each secure sum is the client's own
  (:meth:`~botorch_fed.protocol.client.FederatedClient.sum_encoding`), never the
  server's ``wide``.

With these, every vector an honest client contributes stays far below the encoding's
range (``tests/algorithms/fbo_fedgp/test_server_chosen_values.py`` checks the corners of every
bound), so no refusal can depend on private data; a vector that still would not fit
(only a forged sum can cause one) is saturated at the range, never refused
(:meth:`~botorch_fed.protocol.client.FederatedClient.on_secagg`).
"""

from __future__ import annotations

import math

import numpy as np

from botorch_fed.protocol.declarations import Array

LENGTHSCALE_RANGE = (0.025, 1e4)
r"""Lengthscales (unit-cube inputs): BoTorch's ``GreaterThan(2.5e-2)`` below."""
NOISE_RANGE = (1e-4, 1e4)
r"""Noise variance (standardised outcomes): BoTorch's ``GreaterThan(1e-4)`` below."""
MEAN_RANGE = (-10.0, 10.0)
r"""The constant mean, in standardised units (the outcomes' mean is 0, their std 1)."""

_RANGES = {
    "covar_module.raw_lengthscale": LENGTHSCALE_RANGE,
    "likelihood.noise_covar.raw_noise": NOISE_RANGE,
    "mean_module.raw_constant": MEAN_RANGE,
}

FIT_EVALUATIONS_PER_ITERATION = 2
r"""A federated fit evaluates the loss at most ``2 * federated_maxiter`` times (each
evaluation two secure sums): L-BFGS-B's line searches take a few more evaluations
than iterations; the server and every client stop a fit that asks for more."""


def theta_domain(hyper) -> np.ndarray:
    r"""The ``size x 2`` box of hyperparameter vectors a client computes on.

    Args:
        hyper: The :class:`~botorch_fed.models.PITCHyperparameters` of the global
            model (BoTorch's default kernel, likelihood and constant mean).

    Returns:
        ``[lower, upper]`` per entry of ``theta``: the declared range of its
        parameter, within the parameter's own bounds.

    Raises:
        ValueError: A parameter without a declared range, or one whose constraint
            transforms it (the domain is of the natural values, which ``theta`` then
            would not hold).
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
    domain = np.array(rows, dtype=np.float64)
    own = np.asarray(hyper.bounds, dtype=np.float64)
    domain[:, 0] = np.maximum(domain[:, 0], own[:, 0])
    domain[:, 1] = np.minimum(domain[:, 1], own[:, 1])
    return domain


#: a ``theta`` the server sends (``apply_theta``, ``arg:theta``): the receiving client's
#: :attr:`theta_domain` length, finite, each entry within its row of the box
THETA = Array(
    (lambda client: len(client.theta_domain),),
    lambda client: client.theta_domain[:, 0],
    lambda client: client.theta_domain[:, 1],
    note=lambda client: (
        f"hyperparameters outside the declared domain (lower {client.theta_domain[:, 0]}, "
        f"upper {client.theta_domain[:, 1]})"
    ),
)
#: a support set the server sends: ``1 .. max_support_size()`` finite points of
#: ``[0, 1]^dim`` of the receiving client (its settings' largest support, not the
#: server's choice)
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
    r"""``values`` clamped into the domain (non-finite entries to the domain's centre).

    For hyperparameters that come out of a secure sum (the size-weighted average of
    the clients' fits): a client never refuses a sum for its value -- that would tell
    the server a bit of a sum it must not learn -- it clamps it.
    """
    values = np.asarray(values, dtype=np.float64)
    centre = domain.mean(axis=1)
    values = np.where(np.isfinite(values), values, centre)
    return np.clip(values, domain[:, 0], domain[:, 1])


def outcome_bound(num_clients: int, num_init: int, num_rounds: int) -> float:
    r"""``Z = sqrt(N_max)``: no honestly standardised outcome exceeds it in magnitude.

    ``N_max = num_clients * (num_init + num_rounds)`` is the most outcomes the
    federation holds (an FBO-FedGP client evaluates its initial design and one point
    per round). ``n`` outcomes standardised with their mean and sample standard
    deviation lie within ``(n - 1) / sqrt(n) < sqrt(n) <= Z`` of 0; with a standard
    deviation below ``min_stdv`` (replaced by 1) they lie within ``1e-8 sqrt(n)``.
    """
    n = int(num_clients) * (int(num_init) + int(num_rounds))
    if n < 1:
        raise ValueError(f"The federation holds no outcomes (N_max = {n}).")
    return math.sqrt(n)
