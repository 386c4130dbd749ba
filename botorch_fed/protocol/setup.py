r"""The federation an algorithm runs in: the clients' black boxes, size, seed, backend
(noises of [LDP-BO], paper 002, Sec. 5.1)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, fields
from typing import Annotated

import torch

from botorch_fed.problems.heterogeneity import benchmark_objectives
from botorch_fed.problems.objectives import Objective
from botorch_fed.protocol.declarations import Choice, Flag, Int, Real, check_settings, check_value
from botorch_fed.protocol.evaluation import EVALUATION_ERRORS
from botorch_fed.protocol.registry import get_algorithm

SETUP_NOISES = ("none", "gaussian", "uniform", "student-t", "pareto")
MAX_SEED = 2**48  #: the seeds derived from a run's seed (``seed * 7919 + i``, ...) fit int64
DEFAULT_NUM_CLIENTS = 10
PRIVATE_RANDOMNESS = ("seed", "os")  #: ``run_federated(private_randomness=)``


def simulation_crypto_seed(seed: int) -> int:
    r"""The seed of every party's private randomness in a simulation of run ``seed``
    (predictable by design: a deployment never uses it)."""
    digest = hashlib.sha256(b"botorch-fed/simulation-private-randomness/%d" % seed).digest()
    return int.from_bytes(digest[:8], "little") % MAX_SEED


@dataclass
class FederationSetup:
    r"""The federation an algorithm runs in: the clients' black boxes and the deployment
    (size, seed, aggregator, private randomness, failure policy). A benchmark federation is
    named by ``problem`` with ``dim``, ``noise``, ``noise_std``, ``shift`` and ``rotation``,
    a shorthand for ``objectives=benchmark_objectives(problem, ...)``
    (:func:`~botorch_fed.problems.heterogeneity.benchmark_objectives`).

    Attributes:
        problem: Built-in test function name (``cec2005-f1``, ``hartmann``, ...);
            exclusive with ``objectives``.
        objectives: The clients' own black boxes: one
            :class:`~botorch_fed.problems.objectives.Objective` per client, or one
            shared by ``num_clients`` clients, all over the same bounds and convention.
        dim: Dimension of ``problem`` (``None``: its default); with ``objectives``
            ``None`` or their dimension.
        num_clients: Number of clients (``None``: 10 for a problem, else one per
            objective).
        seed: Seed of the run: the problem's functions, shifts and noise, the initial
            designs and every public random choice; in a simulation without
            ``crypto_seed`` also every party's private randomness
            (:func:`simulation_crypto_seed`), so a run repeats from its seed.
        aggregator: Secure-aggregation backend of the algorithms that aggregate:
            ``plaintext``, ``ckks``, ``masking``.
        noise_std: Observation noise of ``problem``: the std of Gaussian noise, or the
            scale of the noise ``noise`` names (``None``: noise-free Gaussian, scale 1
            for the others).
        init_regions: Draw each client's initial design from its own sub-box of the
            domain (side ``region_width``).
        region_width: Side of the initial-design sub-boxes (a fraction of the domain).
        shift: Maximal per-client shift of ``problem`` per coordinate, a fraction of the
            domain width (0: one shared objective).
        rotation: Scale ``r`` of a per-client rotation of ``problem`` about the domain's
            centre, ``expm(A)`` with ``A`` antisymmetric, entries ``r`` times standard
            normals (0: none; the literature's mild heterogeneity is ``shift=0.05,
            rotation=0.1``, severe ``0.3, 1.0``).
        crypto_seed: Seed of every party's private randomness (keys, masks, nonces,
            centre and Laplace noise, redraws). ``None``: derived from ``seed`` in a
            simulation, drawn from the OS in a deployment; for experiments only (a
            deployed party accepts it only with ``--allow-crypto-seed``).
        evaluation_errors: What an evaluation that raises or returns NaN/inf does:
            ``"record"``: it is recorded and the client carries on (the point is never
            sent anywhere); ``"raise"``: the run stops.
        noise: ``None`` (the problem's default: uniform ``U[-s, s]`` with ``s =
            noise_std`` or 1 for ``ldp-synthetic*``, [LDP-BO] Sec. 5.1's ``R``; else
            Gaussian), ``"none"``, ``"gaussian"``, ``"uniform"``, ``"student-t"`` (3
            degrees of freedom) or ``"pareto"`` (shape 3, centred).
        threads: torch's intra-op threads during the run (restored afterwards).
    """

    problem: str | None = None
    objectives: list[Objective] | Objective | None = None
    dim: int | None = None
    num_clients: Annotated[int | None, Int(1, optional=True)] = None
    seed: Annotated[int, Int(0, MAX_SEED)] = 0
    aggregator: str = "plaintext"
    noise_std: Annotated[float | None, Real(0, optional=True)] = None
    init_regions: Annotated[bool, Flag()] = False
    region_width: Annotated[float, Real(0, 1, open="low")] = 0.5
    shift: Annotated[float, Real(0, 1, open="high")] = 0.0
    rotation: Annotated[float, Real(0, 100)] = 0.0
    crypto_seed: Annotated[int | None, Int(0, optional=True)] = None
    evaluation_errors: Annotated[str, Choice(EVALUATION_ERRORS)] = "record"
    noise: Annotated[str | None, Choice(SETUP_NOISES, optional=True)] = None
    threads: Annotated[int, Int(1)] = 1

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
        self._check_values()
        if self.clients < spec.min_clients:
            raise ValueError(
                f"`num_clients`={self.clients}: {algorithm} needs at least {spec.min_clients}."
            )
        if spec.secure_aggregation:
            from botorch_fed.secure.registry import BACKENDS, require_backend

            check_value("aggregator", self.aggregator, Choice(tuple(BACKENDS)))
            require_backend(self.aggregator)  # 'ckks' without TenSEAL: says why
            minimum = 2 if self.aggregator == "plaintext" else 3
            if self.clients < minimum:
                raise ValueError(
                    f"`num_clients`={self.clients}: {algorithm} with the {self.aggregator!r} "
                    f"aggregator needs at least {minimum} clients (a secure sum over fewer "
                    "than 3 reveals each input to the others)."
                )

    def _check_values(self) -> None:
        r"""Every field in its declared domain, and the rules across fields."""
        check_settings(self)
        if self.noise == "none" and self.noise_std is not None:
            raise ValueError(
                f"`noise`='none' is noise-free; got `noise_std`={self.noise_std!r} too."
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
        for name, default in (
            ("noise_std", None),
            ("noise", None),
            ("shift", 0.0),
            ("rotation", 0.0),
        ):
            if getattr(self, name) != default:
                raise ValueError(
                    f"`{name}` applies to built-in problems only; your objectives' noise and "
                    f"shifts are their own (got `{name}`={getattr(self, name)!r})."
                )
        objectives, shared = self.objectives, isinstance(self.objectives, Objective)
        if shared and self.num_clients is None:
            raise ValueError("One shared objective needs `num_clients` (or give a list).")
        if not shared and (not isinstance(objectives, list | tuple) or not objectives):
            raise ValueError(
                f"`objectives` must be a non-empty list of Objective (one per client), got "
                f"{objectives!r}."
            )
        given = self._given()
        for i, obj in enumerate(given):
            if not isinstance(obj, Objective):
                raise ValueError(
                    f"`objectives[{i}]` must be an Objective (wrap a function in "
                    f"CallableObjective(fn, bounds)), got a {type(obj).__name__}."
                )
        if not shared and self.num_clients not in (None, len(given)):
            raise ValueError(
                f"`num_clients`={self.num_clients} but {len(given)} objectives were "
                "given (one per client)."
            )
        first = given[0]
        for i, obj in enumerate(given[1:], start=1):
            if not torch.equal(obj.bounds, first.bounds) or obj.minimize != first.minimize:
                raise ValueError(
                    f"All objectives must share one domain and convention: `objectives[{i}]` "
                    f"has bounds {obj.bounds.tolist()} and minimize={obj.minimize}, "
                    f"`objectives[0]` {first.bounds.tolist()} and minimize={first.minimize}."
                )
        if self.dim is not None and self.dim != first.dim:
            raise ValueError(f"`dim`={self.dim} but the objectives have d={first.dim}.")

    def _given(self) -> list[Objective]:
        r"""The objectives given (a shared one once)."""
        objectives = self.objectives
        return [objectives] if isinstance(objectives, Objective) else list(objectives or [])

    def make_objectives(self) -> list[Objective]:
        r"""One objective per client: the given ones, or ``problem``'s
        (:func:`~botorch_fed.problems.heterogeneity.benchmark_objectives`)."""
        self._check_source()
        M = self.clients
        if self.objectives is not None:
            given = self._given()
            return given * M if isinstance(self.objectives, Objective) else given
        assert self.problem is not None  # _check_source: a problem when no objectives
        self._check_values()
        return list(
            benchmark_objectives(
                self.problem,
                M,
                self.seed,
                self.dim,
                self.noise,
                self.noise_std,
                self.shift,
                self.rotation,
            )
        )

    def describe(self) -> dict:
        r"""A JSON-friendly description (objectives by name, bounds and convention)."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["num_clients"] = self.clients
        if self.objectives is not None:
            out["objectives"] = [o.describe() for o in self._given()]
            out["objectives_shared"] = isinstance(self.objectives, Objective)
        return out
