r"""The black box each client evaluates, in the unit cube, with optional heterogeneity.

Federated algorithms work on ``[0, 1]^d``; a :class:`ClientObjective` maps a unit-cube
point to the test function's domain and returns the value to *maximise* (BoTorch's
convention). Benchmarks report the function's own (minimisation) values.

Heterogeneity options (the FBO-FedGP paper's non-i.i.d. setting):

- per-client shifted objectives: client ``i`` evaluates ``f(x - delta_i)`` (clipped to
  the domain) with a seeded shift ``delta_i`` of at most ``shift`` (fraction of the
  domain width) per coordinate;
- initial designs from different regions: see :func:`initial_design`.
"""

from __future__ import annotations

import torch
from botorch.test_functions.synthetic import SyntheticTestFunction
from botorch.utils.sampling import draw_sobol_samples
from botorch.utils.transforms import unnormalize
from torch import Tensor

from botorch_fed.federation.objectives import Objective


class ClientObjective(Objective):
    r"""One client's view of a built-in test function.

    Args:
        function: A BoTorch synthetic test function (minimisation convention,
            ``negate=False``), possibly noisy and seeded.
        shift: Per-coordinate shift of this client's objective, as a fraction of
            the domain width (``d`` tensor; zeros for the shared objective).
    """

    minimize = True

    def __init__(self, function: SyntheticTestFunction, shift: Tensor | None = None) -> None:
        if getattr(function, "negate", False):
            raise ValueError("`function` must use the minimisation convention (negate=False).")
        self.function = function
        self.bounds = function.bounds.to(torch.float64)
        self.name = type(function).__name__.replace("Seeded", "")
        shift = torch.zeros(self.dim, dtype=torch.float64) if shift is None else shift
        if shift.shape != (self.dim,):
            raise ValueError(f"`shift` must have shape ({self.dim},), got {tuple(shift.shape)}.")
        self.shift = shift.to(torch.float64)
        optimum = getattr(function, "_optimal_value", None)
        # a shifted objective's optimum may be clipped away: unknown
        shifted = bool((self.shift != 0).any())
        self.optimal_value = None if optimum is None or shifted else float(optimum)

    def _domain_point(self, X: Tensor) -> Tensor:
        if X.shape[-1] != self.dim:
            raise ValueError(f"`X` must have d={self.dim} columns, got shape {tuple(X.shape)}.")
        if not torch.isfinite(X).all() or (X < 0).any() or (X > 1).any():
            raise ValueError("`X` must lie in the unit cube [0, 1]^d.")
        Z = (X.to(torch.float64) - self.shift).clamp(0.0, 1.0)
        return unnormalize(Z, self.bounds)

    def to_domain(self, X: Tensor) -> Tensor:
        return self._domain_point(X)

    def value(self, X: Tensor) -> Tensor:
        r"""Noise-free function values (minimisation convention) at unit-cube ``X``."""
        with torch.no_grad():
            return self.function.evaluate_true(self._domain_point(X))

    def observe(self, X: Tensor) -> Tensor:
        r"""A (possibly noisy) observation to maximise: ``-f(x) (+ noise)``.

        Args:
            X: ``n x d`` unit-cube points.

        Returns:
            ``n x 1`` values in the maximisation convention.
        """
        with torch.no_grad():
            return -self.function(self._domain_point(X)).unsqueeze(-1)

    def evaluate(self, X: Tensor) -> tuple[Tensor, Tensor]:
        observed = -self.observe(X).squeeze(-1)
        return observed, self.value(X)

    def state_dict(self) -> dict:
        generator = getattr(self.function, "generator", None)
        return {} if generator is None else {"noise_generator": generator.get_state()}

    def load_state_dict(self, state: dict) -> None:
        generator = getattr(self.function, "generator", None)
        if set(state) != ({"noise_generator"} if generator is not None else set()):
            raise ValueError(
                f"State of objective {self.name!r} has keys {sorted(state)}; expected "
                f"{['noise_generator'] if generator is not None else []}."
            )
        if generator is not None:
            generator.set_state(state["noise_generator"])


def initial_design(num_points: int, dim: int, seed: int, region: Tensor | None = None) -> Tensor:
    r"""A client's initial design: scrambled Sobol points in the unit cube.

    Args:
        num_points: Number of points.
        dim: Dimension.
        seed: Seed of the scrambling.
        region: Optional ``2 x d`` sub-box of the unit cube to sample from (clients'
            initial points from different regions of the domain).

    Returns:
        ``num_points x dim`` float64 points.
    """
    if num_points < 1:
        raise ValueError(f"`num_points` must be >= 1, got {num_points}.")
    bounds = torch.stack([torch.zeros(dim), torch.ones(dim)]).to(torch.float64)
    if region is not None:
        bounds = region.to(torch.float64)
    return draw_sobol_samples(bounds=bounds, n=num_points, q=1, seed=seed).squeeze(-2)


def client_regions(num_clients: int, dim: int, seed: int, width: float = 0.5) -> list[Tensor]:
    r"""One random sub-box of side ``width`` of the unit cube per client."""
    if not 0 < width <= 1:
        raise ValueError(f"`width` must be in (0, 1], got {width}.")
    g = torch.Generator().manual_seed(seed)
    corners = (1 - width) * torch.rand(num_clients, dim, generator=g, dtype=torch.float64)
    return [torch.stack([c, c + width]) for c in corners]


def client_shifts(num_clients: int, dim: int, magnitude: float, seed: int) -> list[Tensor]:
    r"""Seeded per-client shifts, uniform in ``[-magnitude, magnitude]^d``."""
    if not 0 <= magnitude < 1:
        raise ValueError(f"`magnitude` must be in [0, 1), got {magnitude}.")
    g = torch.Generator().manual_seed(seed)
    raw = 2 * torch.rand(num_clients, dim, generator=g, dtype=torch.float64) - 1
    return list(magnitude * raw)
