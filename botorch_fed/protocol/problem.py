r"""The black box each client evaluates, in the unit cube, with optional heterogeneity.

Federated algorithms work on ``[0, 1]^d``; a :class:`ClientObjective` maps a unit-cube
point to the test function's domain and returns the value to *maximise* (BoTorch's
convention). Benchmarks report the function's own (minimisation) values.

Heterogeneity options (the FBO-FedGP paper's non-i.i.d. setting):

- per-client shifted objectives: client ``i`` evaluates ``f(x - delta_i)`` (clipped to
  the domain) with a seeded shift ``delta_i`` of at most ``shift`` (fraction of the
  domain width) per coordinate;
- initial designs from different regions: see :func:`initial_design`.

Observation noise is the function's own Gaussian ``noise_std`` or, for the noises
of [LDP-BO] (paper 002, Sec. 5.1: uniform, Student-t; also Pareto), an
:class:`~botorch_fed.test_functions.noise.ObservationNoise` added to the
function's noise-free value.
"""

from __future__ import annotations

import torch
from botorch.test_functions.synthetic import SyntheticTestFunction
from botorch.utils.sampling import draw_sobol_samples
from botorch.utils.transforms import unnormalize
from torch import Tensor

from botorch_fed.protocol.objectives import Objective, check_candidates
from botorch_fed.test_functions.noise import ObservationNoise


class ClientObjective(Objective):
    r"""One client's view of a built-in test function.

    Args:
        function: A BoTorch synthetic test function (minimisation convention,
            ``negate=False``), possibly noisy and seeded.
        shift: Per-coordinate shift of this client's objective, as a fraction of
            the domain width (``d`` tensor; zeros for the shared objective).
        noise: Additive observation noise drawn from its own generator and added to
            the function's value (then ``function`` must have no ``noise_std``; a
            function's own fitness noise, CEC-2005 F4/F17, still applies first).

    Finite domains and declared constants (see
    :class:`~botorch_fed.protocol.objectives.Objective`):

    - :attr:`candidates`: the function's ``candidates`` (e.g. the grid of
      :class:`~botorch_fed.test_functions.LDPSynthetic`) in unit-cube coordinates.
      A shifted client keeps the *same* candidates (the federation's domain ``D``
      is shared); its objective at candidate ``u`` is ``f(u - delta)`` (clipped),
      as everywhere else.
    - :attr:`reward_bound`: the function's ``reward_bound`` (``max_D |f|``); for a
      shifted client with candidates it is recomputed as ``max_D |f(u - delta)|``
      over the candidates (the function's own bound is over other points then),
      and ``None`` for a shifted client without candidates.
    - :attr:`optimal_value`: the function's optimum, or ``None`` when shifted;
      for a shifted client with candidates, ``min_D f(u - delta)`` over the
      candidates (exact on a finite domain).
    - :attr:`noise_bound`: ``0.0`` without any noise, ``noise.bound`` with a
      bounded ``noise`` (``None`` for unbounded kinds), ``None`` with Gaussian
      ``noise_std`` or the function's own fitness noise.
    - :attr:`kernel_hint`: the function's ``kernel_hint``, if it has one.
    """

    minimize = True

    def __init__(
        self,
        function: SyntheticTestFunction,
        shift: Tensor | None = None,
        noise: ObservationNoise | None = None,
    ) -> None:
        if getattr(function, "negate", False):
            raise ValueError("`function` must use the minimisation convention (negate=False).")
        noise_std = getattr(function, "noise_std", None)
        if noise is not None:
            if not isinstance(noise, ObservationNoise):
                raise ValueError(
                    f"`noise` must be an ObservationNoise or None, got {type(noise).__name__}."
                )
            if noise_std is not None:
                raise ValueError(
                    f"`noise`={noise!r} is added to the function's value: the function must "
                    f"have no noise_std of its own, got noise_std={noise_std!r}."
                )
        self.function = function
        self.noise = noise
        # botorch registers `bounds` as a buffer without declaring it: nn.Module.__getattr__
        # types it Tensor | Module
        self.bounds = function.bounds.to(torch.float64)  # type: ignore[assignment]
        self.name = type(function).__name__.replace("Seeded", "")
        shift = torch.zeros(self.dim, dtype=torch.float64) if shift is None else shift
        if shift.shape != (self.dim,):
            raise ValueError(f"`shift` must have shape ({self.dim},), got {tuple(shift.shape)}.")
        self.shift = shift.to(torch.float64)
        optimum = getattr(function, "_optimal_value", None)
        # a shifted objective's optimum may be clipped away: unknown
        shifted = bool((self.shift != 0).any())
        self.optimal_value = None if optimum is None or shifted else float(optimum)
        candidates = getattr(function, "candidates", None)
        if candidates is not None:
            self.candidates = check_candidates(candidates, self.bounds, name="function.candidates")
        reward_bound = getattr(function, "reward_bound", None)
        if not shifted:
            self.reward_bound = None if reward_bound is None else float(reward_bound)
        elif self.candidates is not None:  # exact on the finite domain
            values = self.value(self.candidates)
            self.reward_bound = float(values.abs().max())
            self.optimal_value = float(values.min())
        kernel_hint = getattr(function, "kernel_hint", None)
        self.kernel_hint = None if kernel_hint is None else dict(kernel_hint)
        fitness_noise = float(getattr(function, "fitness_noise", 0.0) or 0.0)
        if fitness_noise != 0.0:
            self.noise_bound = None  # multiplicative, unbounded (CEC-2005 F4/F17)
        elif noise is not None:
            bound = noise.bound
            self.noise_bound = bound if bound < float("inf") else None
        elif noise_std is None or noise_std == 0:
            self.noise_bound = 0.0
        else:
            self.noise_bound = None  # Gaussian: unbounded

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
            y = self.function(self._domain_point(X))
            if self.noise is not None:
                y = y + self.noise.sample(y.shape, like=y)
            return -y.unsqueeze(-1)

    def evaluate(self, X: Tensor) -> tuple[Tensor, Tensor]:
        observed = -self.observe(X).squeeze(-1)
        return observed, self.value(X)

    def _state_keys(self) -> set[str]:
        keys = set()
        if getattr(self.function, "generator", None) is not None:
            keys.add("noise_generator")
        if self.noise is not None and self.noise.generator is not None:
            keys.add("observation_noise")
        return keys

    def state_dict(self) -> dict:
        r"""The function's noise generator (``"noise_generator"``) and the
        observation noise's state (``"observation_noise"``), where they exist."""
        keys = self._state_keys()
        state = {}
        if "noise_generator" in keys:
            # a seeded function's generator (SeededNoiseMixin), which torch's
            # nn.Module.__getattr__ types Tensor | Module on the botorch base class
            state["noise_generator"] = self.function.generator.get_state()  # type: ignore[union-attr,operator]
        if "observation_noise" in keys:
            assert self.noise is not None  # the key is there only with a noise
            state["observation_noise"] = self.noise.state_dict()
        return state

    def load_state_dict(self, state: dict) -> None:
        keys = self._state_keys()
        if set(state) != keys:
            raise ValueError(
                f"State of objective {self.name!r} has keys {sorted(state)}; expected "
                f"{sorted(keys)}."
            )
        if "noise_generator" in keys:
            # as in state_dict: nn.Module.__getattr__ types the generator Tensor | Module
            self.function.generator.set_state(state["noise_generator"])  # type: ignore[union-attr,operator]
        if "observation_noise" in keys:
            assert self.noise is not None  # the key is there only with a noise
            self.noise.load_state_dict(state["observation_noise"])


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
