r"""Built-in test functions as client objectives, with the FBO-FedGP paper's
heterogeneity: per-client shifts, initial designs from different regions, and the
observation noises of [LDP-BO] (paper 002, Sec. 5.1); and the per-client rotations of
the federated-BO literature's heterogeneity levels (GUIDE-FBO, 2026: a rotation
``R = expm(A)``, ``A`` antisymmetric with entries scaled by ``r``, with a shift of up
to ``z`` of the domain; homogeneous ``(z, r) = (0, 0)``, mild ``(0.05, 0.1)``, severe
``(0.3, 1.0)``).
"""

from __future__ import annotations

import inspect
import math
from typing import Any

import torch
from botorch.test_functions.base import ConstrainedBaseTestProblem
from botorch.test_functions.synthetic import SyntheticTestFunction
from botorch.utils.sampling import draw_sobol_samples
from botorch.utils.transforms import normalize, unnormalize
from torch import Tensor

from botorch_fed.problems.objectives import Objective, check_candidates, check_unit
from botorch_fed.test_functions import get_test_function, get_test_function_class
from botorch_fed.test_functions.noise import ObservationNoise

NOISE_SEED_OFFSET = 1_000_003  #: client i's noise seed: ``seed * 7919 + i`` plus this


class ClientObjective(Objective):
    r"""One client's view of a built-in test function: ``f(T(u))`` at unit-cube ``u``,
    ``T(u) = clip(c + R (u - c) - shift)`` with ``c`` the cube's centre (the unit cube
    mapped onto the function's bounds): a rotation about the centre, then a shift.

    A transformed client's ``optimal_value`` is the function's where one of its known
    optimisers has a preimage in the cube (then ``min f o T = f*`` exactly; else
    unknown: the clipping may have cut it away, and ``optimum_bound = f*`` bounds it
    from below, up to the rounding of the declared ``f*``; none for a moved constrained
    function); a client with candidates keeps them,
    and its ``optimal_value`` and ``reward_bound`` are exact over them.

    Args:
        function: A BoTorch synthetic test function (``negate=False``), possibly noisy.
        shift: ``d`` per-coordinate shift as a fraction of the domain width.
        noise: Observation noise added to the value (``function`` must then have no
            ``noise_std``; CEC-2005 F4/F17's fitness noise still applies first).
        rotation: ``d x d`` orthogonal matrix ``R`` (``None``: the identity).
    """

    minimize = True

    def __init__(
        self,
        function: SyntheticTestFunction,
        shift: Tensor | None = None,
        noise: ObservationNoise | None = None,
        rotation: Tensor | None = None,
    ) -> None:
        if getattr(function, "negate", False):
            raise ValueError("`function` must use the minimisation convention (negate=False).")
        noise_std = getattr(function, "noise_std", None)
        if noise is not None and not isinstance(noise, ObservationNoise):
            raise ValueError(f"`noise` must be an ObservationNoise, got {type(noise).__name__}.")
        if noise is not None and noise_std is not None:
            raise ValueError(
                f"`noise`={noise!r} is added to the value: the function must have no noise_std "
                f"of its own, got noise_std={noise_std!r}."
            )
        self.function, self.noise = function, noise
        # botorch registers `bounds` as a buffer without declaring it: nn.Module.__getattr__
        # types it Tensor | Module
        self.bounds = function.bounds.to(torch.float64)  # type: ignore[assignment]
        self.name = type(function).__name__.replace("Seeded", "")
        shift = torch.zeros(self.dim, dtype=torch.float64) if shift is None else shift
        if shift.shape != (self.dim,):
            raise ValueError(f"`shift` must have shape ({self.dim},), got {tuple(shift.shape)}.")
        self.shift = shift.to(torch.float64)
        self.rotation = None if rotation is None else check_rotation(rotation, self.dim)
        optimum = getattr(function, "_optimal_value", None)
        moved = bool((self.shift != 0).any()) or self.rotation is not None
        constrained = isinstance(function, ConstrainedBaseTestProblem)
        if moved and (getattr(function, "discrete_inds", None) or
                      getattr(function, "categorical_inds", None)):  # fmt: skip
            raise ValueError(
                f"{self.name} has discrete or categorical inputs: `shift` and `rotation` would "
                "move its points off their grid."
            )
        self.optimal_value = None if optimum is None else float(optimum)
        # T maps the cube into the domain: no client does better than the function's
        # optimum (up to its rounding); a constrained function's is over its feasible set
        self.optimum_bound = None if constrained and moved else self.optimal_value
        if moved and optimum is not None and (constrained or not self._optimum_reachable(function)):
            self.optimal_value = None  # the clipping may have cut the optimum away
        candidates = getattr(function, "candidates", None)
        if candidates is not None:
            self.candidates = check_candidates(candidates, self.bounds, name="function.candidates")
        reward_bound = getattr(function, "reward_bound", None)
        if not moved:
            self.reward_bound = None if reward_bound is None else float(reward_bound)
        elif self.candidates is not None:  # exact on the finite domain
            values = self.value(self.candidates)
            self.reward_bound = float(values.abs().max())
            self.optimal_value = float(values.min())
        kernel_hint = getattr(function, "kernel_hint", None)
        self.kernel_hint = None if kernel_hint is None else dict(kernel_hint)
        self.noise_bound = None  # Gaussian or CEC-2005 F4/F17's multiplicative: unbounded
        if not float(getattr(function, "fitness_noise", 0.0) or 0.0):
            if noise is not None:
                self.noise_bound = noise.bound if noise.bound < float("inf") else None
            elif not noise_std:
                self.noise_bound = 0.0

    def _optimum_reachable(self, function: SyntheticTestFunction) -> bool:
        r"""Whether a known optimiser ``u*`` has its preimage ``c + R' (u* + shift - c)``
        in the unit cube (then ``T`` maps a point of the cube onto it, unclipped)."""
        optimizers = getattr(function, "optimizers", None)
        if optimizers is None:
            return False
        U = normalize(optimizers.to(torch.float64).reshape(-1, self.dim), self.bounds)
        U = U[((U >= 0) & (U <= 1)).all(dim=-1)]  # an optimiser outside the domain: unreachable
        pre = U + self.shift - 0.5
        if self.rotation is not None:
            pre = pre @ self.rotation  # rows: R' v = (v' R)'
        pre = pre + 0.5
        return bool(((pre >= 0) & (pre <= 1)).all(dim=-1).any())

    def to_domain(self, X: Tensor) -> Tensor:
        Z = check_unit(X, self.dim, batch=True).to(torch.float64)
        if self.rotation is not None:  # rows: R (u - c) = ((u - c)' R')'
            Z = 0.5 + (Z - 0.5) @ self.rotation.to(Z).transpose(-1, -2)
        return unnormalize((Z - self.shift.to(Z)).clamp(0.0, 1.0), self.bounds)

    def value(self, X: Tensor) -> Tensor:
        r"""Noise-free function values (minimisation convention) at unit-cube ``X``."""
        with torch.no_grad():
            return self.function.evaluate_true(self.to_domain(X))

    def observe(self, X: Tensor) -> Tensor:
        r"""``n x 1`` (possibly noisy) observations to maximise, ``-(f(x) + noise)``."""
        with torch.no_grad():
            y = self.function(self.to_domain(X))
            if self.noise is not None:
                y = y + self.noise.sample(y.shape, like=y)
            return -y.unsqueeze(-1)

    def evaluate(self, X: Tensor) -> tuple[Tensor, Tensor]:
        observed = -self.observe(X).squeeze(-1)
        return observed, self.value(X)

    def state_dict(self) -> dict:
        r"""The function's noise generator and the observation noise, where they exist."""
        state = {}
        generator = getattr(self.function, "generator", None)  # SeededNoiseMixin's
        if generator is not None:
            state["noise_generator"] = generator.get_state()
        if self.noise is not None and self.noise.generator is not None:
            state["observation_noise"] = self.noise.state_dict()
        return state

    def load_state_dict(self, state: dict) -> None:
        keys = set(self.state_dict())
        if set(state) != keys:
            raise ValueError(
                f"State of objective {self.name!r} has keys {sorted(state)}; expected "
                f"{sorted(keys)}."
            )
        if "noise_generator" in keys:
            getattr(self.function, "generator").set_state(state["noise_generator"])  # noqa: B009
        if self.noise is not None and "observation_noise" in keys:
            self.noise.load_state_dict(state["observation_noise"])


def initial_design(num_points: int, dim: int, seed: int, region: Tensor | None = None) -> Tensor:
    r"""``num_points x dim`` scrambled Sobol points (seed ``seed``) in the unit cube or
    in its ``2 x d`` sub-box ``region``."""
    if num_points < 1:
        raise ValueError(f"`num_points` must be >= 1, got {num_points}.")
    bounds = torch.stack([torch.zeros(dim), torch.ones(dim)]) if region is None else region
    return draw_sobol_samples(bounds=bounds.double(), n=num_points, q=1, seed=seed).squeeze(-2)


def client_regions(num_clients: int, dim: int, seed: int, width: float = 0.5) -> list[Tensor]:
    r"""One random sub-box of side ``width`` (in ``(0, 1]``) of the unit cube per client."""
    g = torch.Generator().manual_seed(seed)
    corners = (1 - width) * torch.rand(num_clients, dim, generator=g, dtype=torch.float64)
    return [torch.stack([c, c + width]) for c in corners]


def client_shifts(num_clients: int, dim: int, magnitude: float, seed: int) -> list[Tensor]:
    r"""Seeded per-client shifts, uniform in ``[-magnitude, magnitude]^d`` (``[0, 1)``)."""
    g = torch.Generator().manual_seed(seed)
    raw = 2 * torch.rand(num_clients, dim, generator=g, dtype=torch.float64) - 1
    return list(magnitude * raw)


def check_rotation(rotation: Tensor, dim: int) -> Tensor:
    r"""``rotation`` as float64 if it is a ``dim x dim`` orthogonal matrix (to
    ``1e-10``), else ``ValueError``."""
    if not isinstance(rotation, Tensor) or rotation.shape != (dim, dim):
        shape = tuple(rotation.shape) if isinstance(rotation, Tensor) else type(rotation).__name__
        raise ValueError(f"`rotation` must be a {dim} x {dim} tensor, got {shape}.")
    R = rotation.detach().to(device="cpu", dtype=torch.float64)
    if not bool(torch.isfinite(R).all()):
        raise ValueError("`rotation` has non-finite entries.")
    error = float((R @ R.T - torch.eye(dim, dtype=torch.float64)).abs().max())
    if error > 1e-10:
        raise ValueError(f"`rotation` must be orthogonal: |R R' - I| = {error:.3g} > 1e-10.")
    return R


def client_rotations(num_clients: int, dim: int, scale: float, seed: int) -> list[Tensor | None]:
    r"""Seeded per-client rotations ``R = expm(A)``, ``A`` antisymmetric with
    ``A_jk = scale g_jk`` (``j < k``, ``g`` standard normal); ``None`` for ``scale = 0``."""
    if not math.isfinite(scale) or scale < 0:
        raise ValueError(f"`rotation`={scale!r} must be a finite number >= 0.")
    if scale == 0:
        return [None] * num_clients
    g = torch.Generator().manual_seed(seed)
    G = torch.randn(num_clients, dim, dim, generator=g, dtype=torch.float64).triu(1)
    A = scale * (G - G.transpose(-1, -2))
    return list(torch.linalg.matrix_exp(A))


def benchmark_objectives(
    problem: str,
    num_clients: int,
    seed: int = 0,
    dim: int | None = None,
    noise: str | None = None,
    noise_std: float | None = None,
    shift: float = 0.0,
    rotation: float = 0.0,
) -> list[ClientObjective]:
    r"""A benchmark federation's objectives: seeded, shifted, noisy copies of a built-in
    test function, one per client (what ``FederationSetup(problem=...)`` runs on; the
    list can be given as ``FederationSetup(objectives=...)`` too).

    Args:
        problem: Built-in test function name (``hartmann``, ``cec2005-f1``, ...).
        num_clients: Number of clients ``M``.
        seed: Seed of the functions (client ``i``: ``seed * 7919 + i``; one with a
            ``function_seed``, ``ldp-synthetic*``, gets ``seed``), noises and shifts.
        dim: Dimension (``None``: the function's default).
        noise: ``None`` (the function's default: uniform for ``ldp-synthetic*``, else
            Gaussian), ``"none"``, ``"gaussian"``, ``"uniform"``, ``"student-t"`` or
            ``"pareto"`` (:class:`~botorch_fed.test_functions.noise.ObservationNoise`).
        noise_std: The Gaussian noise's std, or the other noises' scale (``None``:
            noise-free Gaussian, scale 1 for the others).
        shift: Maximal per-client shift per coordinate, a fraction of the domain width
            in ``[0, 1)`` (0: one shared objective).
        rotation: Scale ``r`` of the per-client rotations about the domain's centre
            (:func:`client_rotations`; 0: none).

    Returns:
        ``M`` objectives over the function's bounds.
    """
    if isinstance(num_clients, bool) or not isinstance(num_clients, int) or num_clients < 1:
        raise ValueError(f"`num_clients`={num_clients!r} must be an integer >= 1.")
    if not 0 <= shift < 1:
        raise ValueError(f"`shift`={shift!r} must lie in [0, 1).")
    function_class = get_test_function_class(problem)
    default = getattr(function_class, "default_observation_noise", None) or ("gaussian", 1)
    kind, scale = default if noise is None else (noise, 1.0)
    scale = float(scale if noise_std is None else noise_std)
    extra: dict[str, Any] = {}
    if "function_seed" in inspect.signature(function_class.__init__).parameters:
        extra["function_seed"] = seed
    gaussian_std = noise_std if kind == "gaussian" else None
    seeds = [seed * 7919 + i for i in range(num_clients)]
    functions = [
        get_test_function(problem, dim=dim, noise_std=gaussian_std, seed=s, **extra) for s in seeds
    ]
    noises: list[ObservationNoise | None] = [None] * num_clients
    if kind not in ("gaussian", "none"):
        noises = [ObservationNoise(kind, scale=scale, seed=s + NOISE_SEED_OFFSET) for s in seeds]
    shifts = client_shifts(num_clients, functions[0].dim, shift, seed=seed + 17)
    rotations = client_rotations(num_clients, functions[0].dim, rotation, seed=seed + 29)
    return [
        ClientObjective(f, s, n, r)
        for f, s, n, r in zip(functions, shifts, noises, rotations, strict=True)
    ]
