r"""The federation an algorithm runs in: its clients' black boxes, size, seed, backend.

A :class:`FederationSetup` names the clients' objectives in one of two ways:

- ``problem="hartmann"`` (with ``dim``, ``num_clients``, ``noise_std``, ``noise``,
  ``shift``): a built-in test function, one seeded (and optionally shifted) copy per
  client;
- ``objectives=[...]``: the user's own black boxes, one
  :class:`~botorch_fed.protocol.objectives.Objective` per client (e.g.
  :class:`~botorch_fed.protocol.objectives.CallableObjective`), all over the same
  bounds and in the same convention (``minimize``); a single objective is shared by
  ``num_clients`` clients.

Every algorithm accepts either (:func:`~botorch_fed.protocol.runner.run_federated`).

Observation noise of a built-in problem (``noise``): Gaussian ``noise_std`` as
always, or the noises of [LDP-BO] (paper 002, Sec. 5.1): uniform ``U[-1, 1]`` (its
LDP experiments, the default of ``ldp-synthetic*``), Student-t with 3 degrees of
freedom (its heavy-tailed experiments), and a centred Pareto.
"""

from __future__ import annotations

import hashlib
import inspect
import math
from dataclasses import dataclass, fields
from typing import Any

import torch

from botorch_fed.protocol.evaluation import EVALUATION_ERRORS
from botorch_fed.protocol.objectives import Objective
from botorch_fed.protocol.problem import ClientObjective, client_shifts
from botorch_fed.protocol.registry import get_algorithm
from botorch_fed.test_functions import get_test_function, get_test_function_class
from botorch_fed.test_functions.noise import ObservationNoise

# ``FederationSetup.noise``: None (the problem's default) or one of these
SETUP_NOISES = ("none", "gaussian", "uniform", "student-t", "pareto")
#: the largest run seed: the seeds derived from it (``seed * 7919 + i``, ...) fit int64
MAX_SEED = 2**48

# Client i's ObservationNoise seed: its function's noise seed (seed * 7919 + i) plus
# this offset (distinct from every client's function seed while num_clients < offset).
NOISE_SEED_OFFSET = 1_000_003


def _is_number(value) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


DEFAULT_NUM_CLIENTS = 10
#: where a run's private randomness comes from (``run_federated(private_randomness=)``)
PRIVATE_RANDOMNESS = ("seed", "os")


def simulation_crypto_seed(seed: int) -> int:
    r"""The seed of every party's private randomness in a simulation of run ``seed``.

    A simulation holds every party in one process, so there is nothing to keep from
    anyone and a run repeats from its public ``seed`` alone. The value is a hash of
    ``seed`` under a domain tag (below :data:`MAX_SEED`), so it differs from the
    public seeds derived from ``seed``. It is predictable by design: a deployment never
    uses it (its parties draw from the OS unless the run has a ``crypto_seed``).
    """
    digest = hashlib.sha256(b"botorch-fed/simulation-private-randomness/%d" % seed).digest()
    return int.from_bytes(digest[:8], "little") % MAX_SEED


@dataclass
class FederationSetup:
    r"""The federation an algorithm runs in.

    Attributes:
        problem: Built-in test function name (``cec2005-f1``, ``hartmann``, ...);
            exclusive with ``objectives``.
        objectives: The clients' own black boxes, one per client (or one
            :class:`~botorch_fed.protocol.objectives.Objective` shared by
            ``num_clients`` clients); exclusive with ``problem``.
        dim: Dimension of ``problem`` (``None``: the function's default). With
            ``objectives`` it must be ``None`` or their dimension.
        num_clients: Number of clients ``M`` (``None``: 10 for a problem, the number
            of objectives otherwise).
        seed: Seed of the run: the problem's functions, shifts and noise, the initial
            designs and every public random choice; in a simulation
            (:func:`~botorch_fed.protocol.runner.run_federated`, ``botorch-fed run``)
            also every party's private randomness unless ``crypto_seed`` is given
            (:func:`simulation_crypto_seed`), so a run repeats from its seed.
        aggregator: Secure-aggregation backend of algorithms that aggregate
            (FBO-FedGP): ``plaintext``, ``ckks``, ``masking``.
        noise_std: Additive observation noise of ``problem`` (``None``: none): the
            standard deviation of Gaussian noise, or the ``scale`` of the
            :class:`~botorch_fed.test_functions.noise.ObservationNoise` that
            ``noise`` names (``None``: scale 1).
        init_regions: Draw each client's initial design from its own sub-box of the
            domain (side ``region_width``).
        region_width: Side of the initial-design sub-boxes (fraction of the domain).
        shift: Per-client shifted ``problem``: maximal shift per coordinate as a
            fraction of the domain width (0: one shared objective).
        crypto_seed: Seed of every party's private randomness: key material, masks,
            nonces, centre noise, Laplace noise, failed-evaluation redraws. ``None``:
            derived from ``seed`` in a simulation, drawn from the OS in a deployment.
            For experiments only: a deployed party takes part in a run that sets it
            only when started with ``--allow-crypto-seed``.
        threads: torch's intra-op threads while the run runs (restored afterwards);
            BO works on small matrices, where threading costs, and some decisions
            differ in the last bits between thread counts.
        evaluation_errors: ``"record"``: an evaluation that raises or returns
            NaN/inf is recorded in the results and the client carries on (the point
            is never sent anywhere); ``"raise"``: it stops the run.
        noise: The kind of observation noise of ``problem``:

            - ``None``: the problem's default: for ``ldp-synthetic`` /
              ``ldp-synthetic-matern`` uniform noise ``U[-s, s]`` with
              ``s = noise_std`` or 1 ([LDP-BO] Sec. 5.1's LDP setting, ``R = 1``);
              for every other problem Gaussian ``noise_std``, as ``"gaussian"``
              (the same random stream);
            - ``"none"``: noise-free (``noise_std`` must be ``None``);
            - ``"gaussian"``: Gaussian ``noise_std`` (the function's own noise);
            - ``"uniform"``, ``"student-t"`` (3 degrees of freedom, Sec. 5.1),
              ``"pareto"`` (shape 3, centred): an
              :class:`~botorch_fed.test_functions.noise.ObservationNoise` of scale
              ``noise_std`` (``None``: 1) per client, seeded with the client's
              function seed ``seed * 7919 + i`` plus :data:`NOISE_SEED_OFFSET`.
    """

    problem: str | None = None
    objectives: list[Objective] | Objective | None = None
    dim: int | None = None
    num_clients: int | None = None
    seed: int = 0
    aggregator: str = "plaintext"
    noise_std: float | None = None
    init_regions: bool = False
    region_width: float = 0.5
    shift: float = 0.0
    crypto_seed: int | None = None
    evaluation_errors: str = "record"
    noise: str | None = None
    threads: int = 1

    @property
    def clients(self) -> int:
        r"""The number of clients this setup makes."""
        if self.num_clients is not None:
            return self.num_clients
        if isinstance(self.objectives, list | tuple):
            return len(self.objectives)
        return DEFAULT_NUM_CLIENTS

    def validate(self, algorithm: str) -> None:
        r"""Raise ``ValueError`` naming the first invalid setting (for ``algorithm``)."""
        spec = get_algorithm(algorithm)
        self._check_source()
        M = self.num_clients
        if M is not None and (isinstance(M, bool) or not isinstance(M, int)):
            raise ValueError(f"`num_clients` must be an integer, got {M!r}.")
        if self.clients < 1:
            raise ValueError(f"`num_clients` must be >= 1, got {self.clients}.")
        if self.clients < spec.min_clients:
            raise ValueError(
                f"`num_clients`={self.clients}: {algorithm} needs at least {spec.min_clients}."
            )
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ValueError(f"`seed` must be a non-negative integer, got {self.seed!r}.")
        if self.seed > MAX_SEED:  # the seeds derived from it must fit torch's int64
            raise ValueError(f"`seed` must be at most 2**48 = {MAX_SEED}, got {self.seed}.")
        if spec.secure_aggregation:
            from botorch_fed.secure.registry import BACKENDS, require_backend

            if self.aggregator not in BACKENDS:
                raise ValueError(
                    f"`aggregator`={self.aggregator!r} must be one of {tuple(BACKENDS)}."
                )
            require_backend(self.aggregator)  # 'ckks' without TenSEAL: says why, names 'masking'
            minimum = 2 if self.aggregator == "plaintext" else 3
            if self.clients < minimum:
                raise ValueError(
                    f"`num_clients`={self.clients}: {algorithm} with the {self.aggregator!r} "
                    f"aggregator needs at least {minimum} clients (a secure sum over fewer "
                    "than 3 reveals each input to the others)."
                )
        if self.noise_std is not None and not (
            _is_number(self.noise_std) and 0 <= self.noise_std < math.inf
        ):
            raise ValueError(
                f"`noise_std` must be a finite non-negative number or None, got {self.noise_std!r}."
            )
        self._check_noise()
        if not (_is_number(self.shift) and 0 <= self.shift < 1):
            raise ValueError(f"`shift` must be a number in [0, 1), got {self.shift!r}.")
        if not (_is_number(self.region_width) and 0 < self.region_width <= 1):
            raise ValueError(f"`region_width` must be in (0, 1], got {self.region_width!r}.")
        if not isinstance(self.init_regions, bool):
            raise ValueError(f"`init_regions` must be True or False, got {self.init_regions!r}.")
        cs = self.crypto_seed
        if cs is not None and (isinstance(cs, bool) or not isinstance(cs, int) or cs < 0):
            raise ValueError(f"`crypto_seed` must be a non-negative integer or None, got {cs!r}.")
        th = self.threads
        if isinstance(th, bool) or not isinstance(th, int) or th < 1:
            raise ValueError(f"`threads` must be an integer >= 1, got {th!r}.")
        if self.evaluation_errors not in EVALUATION_ERRORS:
            raise ValueError(
                f"`evaluation_errors`={self.evaluation_errors!r} must be one of "
                f"{EVALUATION_ERRORS}."
            )

    def _check_source(self) -> None:
        r"""Exactly one of ``problem`` and ``objectives``, and objectives that agree."""
        if self.problem is None and self.objectives is None:
            raise ValueError(
                "Give the clients' black boxes: `problem=` (a built-in test function name) "
                "or `objectives=` (one Objective per client, e.g. CallableObjective)."
            )
        if self.problem is not None and self.objectives is not None:
            raise ValueError(f"Give either `problem`={self.problem!r} or `objectives`, not both.")
        if self.problem is not None:
            if not isinstance(self.problem, str) or not self.problem:
                raise ValueError(f"`problem` must be a test function name, got {self.problem!r}.")
            return
        for name in ("noise_std", "noise", "shift"):
            default = next(f.default for f in fields(self) if f.name == name)
            if getattr(self, name) != default:
                raise ValueError(
                    f"`{name}` applies to built-in problems only; your objectives' noise and "
                    f"shifts are their own (got `{name}`={getattr(self, name)!r})."
                )
        objectives = self.objectives
        if isinstance(objectives, Objective):
            if self.dim is not None and self.dim != objectives.dim:
                raise ValueError(f"`dim`={self.dim} but the objective has d={objectives.dim}.")
            if self.num_clients is None:
                raise ValueError(
                    "One shared objective needs `num_clients` (how many clients hold it); "
                    "or pass a list with one objective per client."
                )
            return
        if not isinstance(objectives, list | tuple) or not objectives:
            raise ValueError(
                f"`objectives` must be a non-empty list of Objective (one per client), got "
                f"{objectives!r}."
            )
        for i, obj in enumerate(objectives):
            if not isinstance(obj, Objective):
                raise ValueError(
                    f"`objectives[{i}]` must be an Objective (wrap a function in "
                    f"CallableObjective(fn, bounds)), got a {type(obj).__name__}."
                )
        if self.num_clients is not None and self.num_clients != len(objectives):
            raise ValueError(
                f"`num_clients`={self.num_clients} but {len(objectives)} objectives were "
                "given (one per client)."
            )
        first = objectives[0]
        for i, obj in enumerate(objectives[1:], start=1):
            if obj.bounds.shape != first.bounds.shape or not torch.equal(obj.bounds, first.bounds):
                raise ValueError(
                    f"All objectives must share one domain: `objectives[{i}]` has bounds "
                    f"{obj.bounds.tolist()}, `objectives[0]` {first.bounds.tolist()}."
                )
            if obj.minimize != first.minimize:
                raise ValueError(
                    f"All objectives must use one convention: `objectives[{i}]` has "
                    f"minimize={obj.minimize}, `objectives[0]` minimize={first.minimize}."
                )
        if self.dim is not None and self.dim != first.dim:
            raise ValueError(f"`dim`={self.dim} but the objectives have d={first.dim}.")

    def _check_noise(self) -> None:
        r"""``noise`` is ``None`` or one of :data:`SETUP_NOISES`, and ``"none"``
        comes without ``noise_std``."""
        if self.noise is not None and (
            not isinstance(self.noise, str) or self.noise not in SETUP_NOISES
        ):
            raise ValueError(
                f"`noise`={self.noise!r} must be None (the problem's default) or one of "
                f"{SETUP_NOISES}."
            )
        if self.noise == "none" and self.noise_std is not None:
            raise ValueError(
                f"`noise`='none' is noise-free; got `noise_std`={self.noise_std!r} too."
            )

    def _noise_plan(self, function_class: type) -> tuple[str, float]:
        r"""``(kind, scale)`` of the problem's observation noise: ``"gaussian"`` (the
        function's own ``noise_std``), ``"none"``, or an ObservationNoise kind."""
        self._check_noise()
        kind = self.noise
        scale = 1.0 if self.noise_std is None else float(self.noise_std)
        if kind is None:
            default = getattr(function_class, "default_observation_noise", None)
            if default is None:
                return "gaussian", scale
            kind, default_scale = default
            scale = float(default_scale) if self.noise_std is None else scale
        return kind, scale

    def make_objectives(self) -> list[Objective]:
        r"""One objective per client (built-in problems: seeded, optionally shifted
        copies of the test function, with the observation noise of ``noise``; a
        function with a ``function_seed`` (``ldp-synthetic*``) gets
        ``function_seed=seed``, so all clients of a run share one function and
        runs of different seeds draw different functions)."""
        self._check_source()
        M = self.clients
        if self.objectives is not None:
            if isinstance(self.objectives, Objective):
                return [self.objectives] * M
            return list(self.objectives)
        assert self.problem is not None  # _check_source: a problem when no objectives
        function_class = get_test_function_class(self.problem)
        kind, scale = self._noise_plan(function_class)
        extra: dict[str, Any] = {}
        if "function_seed" in inspect.signature(function_class.__init__).parameters:
            extra["function_seed"] = self.seed
        noise_std = self.noise_std if kind == "gaussian" else None
        functions = [
            get_test_function(
                self.problem, dim=self.dim, noise_std=noise_std, seed=self.seed * 7919 + i, **extra
            )
            for i in range(M)
        ]
        if kind in ("gaussian", "none"):
            noises: list[ObservationNoise | None] = [None] * M
        else:
            noises = [
                ObservationNoise(kind, scale=scale, seed=self.seed * 7919 + i + NOISE_SEED_OFFSET)
                for i in range(M)
            ]
        shifts = client_shifts(M, functions[0].dim, self.shift, seed=self.seed + 17)
        return [
            ClientObjective(f, s, noise=n)
            for f, s, n in zip(functions, shifts, noises, strict=True)
        ]

    def describe(self) -> dict:
        r"""A JSON-friendly description (objectives by name, bounds and convention)."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["num_clients"] = self.clients
        if self.objectives is not None:
            shared = isinstance(self.objectives, Objective)
            objectives = (
                [self.objectives]
                if isinstance(self.objectives, Objective)  # `shared`, spelled out for mypy
                else list(self.objectives)
            )
            out["objectives"] = [o.describe() for o in objectives]
            out["objectives_shared"] = shared
        return out
