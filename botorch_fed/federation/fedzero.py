r"""FedZero on the federation protocol: workers (clients) estimate gradients from two
evaluations, the server averages them and takes a projected step ([FedZero] Alg. 1).

Round ``t``: the server broadcasts ``x_t`` (and ``h``); worker ``j`` draws ``z`` uniformly
on the l1 sphere (``estimator="l2"``: the l2 sphere), evaluates its black box at
``x_t + h z`` and ``x_t - h z`` (with its own context ``c_{j,t}`` where the problem has
contexts, e.g. a data row of its own shard for ``l1-regression``) and answers with its
estimate ``g_j = d / (2h) (y+ - y-) sign(z)``; the server sets
``x_{t+1} = Proj_Theta(x_t - eta mean_j g_j)``. Its recommendation is the averaged
iterate. The estimate travels in one of three forms (``message``), whose bytes the
ledger counts (the payload below plus its field names):

- ``vector``: ``g_j`` itself (``8 d`` bytes);
- ``seed``: the two values and the seed ``z`` was drawn from (24 bytes; the server
  redraws ``z``) -- the compression the paper notes;
- ``sign``: ``sign(z)`` packed to bits and the scalar ``d / (2h) (y+ - y-)``
  (``ceil(d / 8) + 8`` bytes; l1 estimator only).

``Theta`` is the objective's box, or an l1 / l2 ball around its centre (``domain``,
``radius``), shrunk by ``h`` so that every query ``x +- h z`` stays within the bounds
(``||h z||_inf <= h``, ``||h z||_1 = h``). ``eta`` and ``h`` default to Cor. 3.2's
``(1/L) sqrt(m / (n d))`` and ``(1/L) sqrt((d + 1) / n)``, with ``L`` the problem's
declared Lipschitz constant (``lipschitz``).

FedZero shares no data and hides nothing either: the server sees every worker's
estimate (in ``seed`` mode the two values), which is a difference of the worker's
objective at two points the server can compute (docs/security.md). A worker answers the
rounds ``1 .. num_rounds`` of its own settings, each once and in turn
(:meth:`~botorch_fed.federation.bo_client.RoundBudget.accept_round`): at most
``2 num_rounds`` evaluations, whatever the server sends.

References:

.. [FedZero] A. Akhavan, D. Janz, E.-M. El-Mhamdi. High-probability analysis of online
   and federated zero-order optimisation (paper 004 in ``shared/papers``).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor

from botorch_fed.federation.bo_client import RoundBudget, numeric_array
from botorch_fed.federation.checkpoint import CheckpointError, check_tensor, split_state
from botorch_fed.federation.evaluation import evaluate_point
from botorch_fed.federation.messages import TIME_PREFIX
from botorch_fed.federation.objectives import Objective
from botorch_fed.federation.registry import AlgorithmSpec, register_algorithm
from botorch_fed.federation.roles import FederatedClient, FederatedServer, ProtocolViolation
from botorch_fed.zeroth_order import (
    ESTIMATORS,
    Box,
    L1Ball,
    L2Ball,
    fedzero_defaults,
    l1_sign,
    sample_l1_sphere,
    sample_l2_sphere,
)

MESSAGES = ("vector", "seed", "sign")
DOMAINS = ("box", "l1-ball", "l2-ball")


def _number(name: str, value, positive: bool = True) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"`{name}` must be a finite number, got {value!r}.")
    if value <= 0 if positive else value < 0:
        raise ValueError(f"`{name}` must be positive, got {value!r}.")


@dataclass
class FedZeroSettings:
    r"""Settings of FedZero (defaults: Cor. 3.2 of the paper).

    Attributes:
        num_rounds: Rounds ``n``.
        eta: Step size (``None``: ``(1/L) sqrt(m / (n d))``).
        h: Perturbation radius (``None``: ``(1/L) sqrt((d + 1) / n)``).
        lipschitz: ``L`` (``None``: the problem's declared constant).
        estimator: ``l1`` (the paper's l1-sphere estimator) or ``l2`` (the classical
            l2-sphere one).
        message: What a worker sends: ``vector`` (its estimate), ``seed`` (two values
            and the seed of its direction) or ``sign`` (the sign vector as bits and one
            scalar; l1 only).
        domain: ``Theta``: the objective's ``box``, or an ``l1-ball`` / ``l2-ball``
            around the box's centre.
        radius: The ball's radius (``None``: half the box's smallest side).
        record_points: Record the queried points in the results (``2 m n`` points of
            dimension ``d``: large); otherwise only their values.
    """

    num_rounds: int = 200
    eta: float | None = None
    h: float | None = None
    lipschitz: float | None = None
    estimator: str = field(default="l1", metadata={"choices": tuple(ESTIMATORS)})
    message: str = field(default="vector", metadata={"choices": MESSAGES})
    domain: str = field(default="box", metadata={"choices": DOMAINS})
    radius: float | None = None
    record_points: bool = False

    def validate(self) -> None:
        r"""Raise ``ValueError`` naming the first invalid setting."""
        n = self.num_rounds
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"`num_rounds` must be a positive integer, got {n!r}.")
        for name in ("eta", "h", "lipschitz", "radius"):
            _number(name, getattr(self, name))
        if self.estimator not in ESTIMATORS:
            raise ValueError(f"`estimator`={self.estimator!r} must be one of {tuple(ESTIMATORS)}.")
        if self.message not in MESSAGES:
            raise ValueError(f"`message`={self.message!r} must be one of {MESSAGES}.")
        if self.domain not in DOMAINS:
            raise ValueError(f"`domain`={self.domain!r} must be one of {DOMAINS}.")
        if self.domain == "box" and self.radius is not None:
            raise ValueError("`radius` applies to `domain`='l1-ball' or 'l2-ball', not to the box.")
        if self.message == "sign" and self.estimator != "l1":
            raise ValueError(
                "`message`='sign' sends sign(z), which is the l1 estimator's direction: it "
                "needs `estimator`='l1'."
            )
        if not isinstance(self.record_points, bool):
            raise ValueError(f"`record_points` must be True or False, got {self.record_points!r}.")


def _function(objective: Objective):
    r"""The test function behind a built-in objective (``None`` for the user's own)."""
    return getattr(objective, "function", None)


def step_parameters(settings: FedZeroSettings, objective: Objective, m: int) -> tuple[float, float]:
    r"""``(eta, h)``: the settings', else Cor. 3.2's from ``L``."""
    eta, h = settings.eta, settings.h
    if eta is None or h is None:
        L = settings.lipschitz
        if L is None:
            L = getattr(_function(objective), "lipschitz", None)
        if L is None:
            raise ValueError(
                f"fedzero needs `eta` and `h`, or `lipschitz` (L) to derive them (Cor. 3.2): "
                f"the objective {objective.name!r} declares no Lipschitz constant."
            )
        eta0, h0 = fedzero_defaults(float(L), settings.num_rounds, m, objective.dim)
        eta = eta0 if eta is None else eta
        h = h0 if h is None else h
    return float(eta), float(h)


def make_domain(settings: FedZeroSettings, objective: Objective, h: float):
    r"""``Theta`` shrunk by ``h``: every query ``x +- h z`` lies within the bounds."""
    lower, upper = objective.bounds.to(torch.float64)
    half = float((upper - lower).min()) / 2
    # a default h too large for the domain: say where it came from and what to change
    origin = (
        " (Cor. 3.2's default (1/L) sqrt((d + 1) / n) for `num_rounds`="
        f"{settings.num_rounds}: raise `num_rounds` or give `h`)"
        if settings.h is None
        else ""
    )
    if settings.domain == "box":
        if h >= half:
            raise ValueError(
                f"`h`={h:g}{origin} must be below half the box's smallest side ({half:g}): "
                "the queries x +- h z must stay within the bounds."
            )
        return Box(lower, upper).shrink(h)
    radius = half if settings.radius is None else settings.radius
    if radius > half:
        raise ValueError(
            f"`radius`={radius:g} must be at most half the box's smallest side ({half:g}) "
            "so that the ball lies within the bounds."
        )
    if h >= radius:
        raise ValueError(f"`h`={h:g}{origin} must be below `radius`={radius:g}.")
    ball = L1Ball if settings.domain == "l1-ball" else L2Ball
    return ball((lower + upper) / 2, radius).shrink(h)


class FedZeroClient(RoundBudget, FederatedClient):
    r"""A worker: two evaluations around the broadcast point, one estimate back.

    Args:
        client_id: The id.
        objective: The worker's black box (minimised; a maximised one is negated).
        settings: The settings.
        seed: The worker's own seed (its directions and contexts).
        evaluation_errors: ``"record"`` or ``"raise"``.
        shard: The context indices this worker samples from (problems with contexts).
    """

    def __init__(
        self,
        client_id: int,
        objective: Objective,
        settings: FedZeroSettings,
        seed: int,
        evaluation_errors: str = "record",
        shard: Tensor | None = None,
    ) -> None:
        super().__init__(client_id)
        self.objective = objective
        self.settings = settings
        self.dim = objective.dim
        self.rng = torch.Generator().manual_seed(int(seed))
        self.evaluation_errors = evaluation_errors
        self.shard = shard
        self.history: list[dict] = []  # harness-only record, never sent

    def _check_round(self, payload: dict) -> tuple[int, Tensor, float]:
        r"""``(t, x, h)`` of a round, checked: ``x`` and ``h`` keep the queries within
        the bounds, and ``t`` is the round that comes next (then spent,
        :meth:`accept_round`)."""
        x, h = numeric_array(payload.get("x")), payload.get("h")
        if (
            x is None
            or x.size != self.dim
            or isinstance(h, bool | np.bool_)
            or not isinstance(h, int | float | np.integer | np.floating)
        ):
            raise self.violation(
                f"a round needs `t`, a point `x` of dimension {self.dim} and a number `h`",
                "round",
            )
        x, h = torch.as_tensor(x).reshape(self.dim), float(h)
        lower, upper = self.objective.bounds
        if not (torch.isfinite(x).all() and math.isfinite(h) and h > 0):
            raise self.violation("the round's point and `h` must be finite (and h > 0)", "round")
        # a few ulps of slack: the server's shrunk box is lower + h, rounded
        slack = 8 * torch.finfo(torch.float64).eps * (1 + torch.maximum(lower.abs(), upper.abs()))
        if ((x - h) < lower - slack).any() or ((x + h) > upper + slack).any():
            raise self.violation(f"the queries x +- h z would leave the bounds (h={h:g})", "round")
        t = self.accept_round(payload.get("t"), "round")
        return t, x, h

    def _values(self, P: Tensor, t: int) -> Tensor | None:
        r"""The black box at the 2 points ``P`` (domain coordinates), minimisation."""
        function = _function(self.objective)
        if self.shard is not None and hasattr(function, "evaluate_contexts"):
            index = self.shard[int(torch.randint(len(self.shard), (1,), generator=self.rng))]
            with torch.no_grad():
                values = function.evaluate_contexts(P, index.expand(len(P)))
                reported = self.objective.value(self._unit(P))  # f itself, for tables
            self._record(P, reported, t)
            return values
        X = self._unit(P)
        out = []
        for i in range(len(P)):  # a failure is per point
            entry = {"round": t, "step": "plus" if i == 0 else "minus", "x": None}
            entry, observed = evaluate_point(
                self.objective, X[i : i + 1], entry, self.evaluation_errors, self.client_id
            )
            if self.settings.record_points:
                entry["x"] = P[i].tolist()
            self.history.append(entry)
            if observed is None:
                return None
            out.append(observed.reshape(()))
        values = torch.stack(out)
        return values if self.objective.minimize else -values

    def _unit(self, P: Tensor) -> Tensor:
        r"""Domain points as unit-cube points (clamped: rounding at the bounds)."""
        lower, upper = self.objective.bounds
        return ((P - lower) / (upper - lower)).clamp(0.0, 1.0)

    def _record(self, P: Tensor, values: Tensor, t: int) -> None:
        for i, kind in enumerate(("plus", "minus")):
            x = P[i].tolist() if self.settings.record_points else None
            self.history.append({"round": t, "step": kind, "x": x, "value": float(values[i])})

    def on_round(self, payload: dict) -> dict:
        r"""Answer round ``{"t", "x", "h"}`` with this worker's estimate (in the
        settings' message form), or ``{"failed": 1}``."""
        t, x, h = self._check_round(payload)
        seed = int(torch.randint(2**62, (1,), generator=self.rng))
        z = _direction(self.settings.estimator, self.dim, seed)
        P = torch.stack([x + h * z, x - h * z])
        values = self._values(P, t)
        if values is None:
            return {"failed": 1}
        y_plus, y_minus = float(values[0]), float(values[1])
        scale = self.dim / (2 * h) * (y_plus - y_minus)
        mode = self.settings.message
        if mode == "seed":
            return {"y_plus": y_plus, "y_minus": y_minus, "seed": seed}
        if mode == "sign":
            bits = np.packbits((l1_sign(z) > 0).numpy().astype(np.uint8))
            return {"scale": scale, "signs": bits.tobytes()}
        direction = l1_sign(z) if self.settings.estimator == "l1" else z
        return {"g": (scale * direction).numpy()}

    def state_dict(self) -> dict:
        r"""History, generator, the objective's state and the last round accepted."""
        return {
            **super().state_dict(),
            **self.round_state(),
            "history": [dict(h) for h in self.history],
            "rng": self.rng.get_state(),
            "objective": self.objective.state_dict(),
        }

    def load_state_dict(self, state: dict) -> None:
        r"""Restore :meth:`state_dict`; a checkpoint written before the last accepted
        round was saved restores it from the history."""
        owner = f"Client {self.client_id}"
        last, state = self.load_round_state(owner, state)
        own, rest = split_state(owner, state, ("history", "rng", "objective"))
        super().load_state_dict(rest)
        if not isinstance(own["history"], list) or not all(
            isinstance(h, dict) for h in own["history"]
        ):
            raise CheckpointError(f"{owner}: `history` must be a list of dicts.")
        self.history = [dict(h) for h in own["history"]]
        self.restore_round(last, self.history)
        self.rng.set_state(check_tensor(owner, "rng", own["rng"], (None,), torch.uint8))
        try:
            self.objective.load_state_dict(own["objective"])
        except ValueError as exc:
            raise CheckpointError(f"{owner}: {exc}") from exc


def _direction(estimator: str, d: int, seed: int) -> Tensor:
    r"""The direction ``z`` drawn from ``seed`` (what the server redraws in ``seed`` mode)."""
    g = torch.Generator().manual_seed(seed)
    sample = sample_l1_sphere if estimator == "l1" else sample_l2_sphere
    return sample(d=d, generator=g, dtype=torch.float64)


class FedZeroServer(FederatedServer):
    r"""Broadcasts ``x_t``, averages the workers' estimates, takes the projected step."""

    def __init__(
        self,
        transport,
        settings: FedZeroSettings,
        domain,
        x0: Tensor,
        eta: float,
        h: float,
        bounds,
        domain_for=None,
    ) -> None:
        super().__init__(transport)
        self.settings = settings
        self._domain_for = domain_for  # h -> Theta shrunk by h (resumed runs)
        self.domain = domain
        self.eta, self.h = eta, h
        self.bounds = bounds.to(torch.float64)
        self.x = x0.clone()
        self.total = torch.zeros_like(x0)  # sum of the iterates x_1 .. x_t
        self.iterates: list[list[float]] = []  # x_1 .. x_t (unit cube, for scoring)
        self.failed = 0

    def initialize(self) -> None:
        r"""Nothing to initialise: ``x_1`` is the domain's centre."""

    def run_round(self, t: int) -> None:
        r"""Round ``t``: broadcast ``x_t``, average the estimates, step and project."""
        self.total += self.x
        lower, upper = self.bounds
        self.iterates.append(((self.x - lower) / (upper - lower)).tolist())
        replies = self.broadcast("round", {"t": t, "x": self.x.numpy(), "h": self.h})
        with self.ledger.timer("aggregate"):
            estimates = [
                g
                for cid in sorted(replies)
                if (g := self._estimate(cid, t, replies[cid].payload)) is not None
            ]
            if not estimates:  # every worker failed: no step
                return
            g = torch.stack(estimates).mean(0)
            self.x = self.domain.project(self.x - self.eta * g)

    def _estimate(self, cid: int, t: int, payload: dict) -> Tensor | None:
        payload = {k: v for k, v in payload.items() if not k.startswith(TIME_PREFIX)}
        d, mode = self.x.numel(), self.settings.message
        expected = {
            "vector": {"g"},
            "seed": {"y_plus", "y_minus", "seed"},
            "sign": {"scale", "signs"},
        }
        if set(payload) == {"failed"}:
            self.failed += 1
            return None
        if set(payload) != expected[mode]:
            raise ProtocolViolation(
                f"Round {t}: worker {cid} sent fields {sorted(payload)}; expected "
                f"{sorted(expected[mode])} (message={mode!r})."
            )
        try:
            if mode == "vector":
                g = torch.as_tensor(np.asarray(payload["g"], dtype=np.float64)).reshape(d)
            elif mode == "seed":
                z = _direction(self.settings.estimator, d, int(payload["seed"]))
                scale = d / (2 * self.h) * (float(payload["y_plus"]) - float(payload["y_minus"]))
                g = scale * (l1_sign(z) if self.settings.estimator == "l1" else z)
            else:
                raw = np.frombuffer(payload["signs"], dtype=np.uint8)
                bits = np.unpackbits(raw)
                if len(raw) != math.ceil(d / 8) or bits[d:].any():  # exact length, zero pad
                    raise ValueError
                bits = bits[:d]
                signs = torch.as_tensor(bits.astype(np.float64) * 2 - 1)
                g = float(payload["scale"]) * signs
        except (TypeError, ValueError, RuntimeError, OverflowError):
            raise ProtocolViolation(
                f"Round {t}: worker {cid}'s estimate does not decode."
            ) from None
        if not torch.isfinite(g).all():
            raise ProtocolViolation(f"Round {t}: worker {cid}'s estimate is not finite.")
        return g

    @property
    def recommendation(self) -> dict | None:
        r"""The averaged iterate ``(1/n) sum_t x_t`` (the quantity Cor. 3.2 bounds)."""
        if not self.iterates:
            return None
        mean = self.total / len(self.iterates)
        lower, upper = self.bounds
        return {
            "kind": "averaged iterate",
            "round": len(self.iterates),
            "client": 0,
            "x": mean.tolist(),
            "x_unit": ((mean - lower) / (upper - lower)).clamp(0, 1).tolist(),
            "predicted_value": None,
            "eta": self.eta,
            "h": self.h,
        }

    def state_dict(self) -> dict:
        return {
            **super().state_dict(),
            "x": self.x.clone(),
            "total": self.total.clone(),
            "iterates": [list(v) for v in self.iterates],
            "failed": self.failed,
            "eta": self.eta,
            "h": self.h,
        }

    def load_state_dict(self, state: dict) -> None:
        own, rest = split_state("Server", state, ("x", "total", "iterates", "failed", "eta", "h"))
        super().load_state_dict(rest)
        d = self.x.numel()
        self.x = check_tensor("Server", "x", own["x"], (d,)).clone()
        self.total = check_tensor("Server", "total", own["total"], (d,)).clone()
        self.iterates = [list(map(float, v)) for v in own["iterates"]]
        self.failed = int(own["failed"])
        # a resumed run keeps the step sizes it started with (an extended `num_rounds`
        # would change Cor. 3.2's defaults halfway)
        eta, h = float(own["eta"]), float(own["h"])
        if h != self.h:
            self.domain = self._domain_for(h)
        self.eta, self.h = eta, h


def _shards(objective: Objective, M: int) -> list[Tensor | None]:
    r"""Client ``i`` samples the contexts ``i, i + M, i + 2M, ...`` (its own data)."""
    n = getattr(_function(objective), "num_contexts", None)
    if n is None:
        return [None] * M
    if n < M:
        raise ValueError(f"The problem has {n} contexts (data rows) for {M} clients.")
    return [torch.arange(i, n, M) for i in range(M)]


def _check(ctx) -> None:
    objective = ctx.objectives[0]
    eta, h = step_parameters(ctx.settings, objective, len(ctx.objectives))
    domain = make_domain(ctx.settings, objective, h)
    for obj in ctx.objectives:
        function = _function(obj)
        if not hasattr(function, "evaluate_contexts"):
            continue
        shifted = bool((getattr(obj, "shift", torch.zeros(1)) != 0).any())
        noisy = getattr(function, "noise_std", None) is not None or obj.noise_bound != 0.0
        if shifted or noisy:
            raise ValueError(
                f"{obj.name}'s workers evaluate their own data rows (contexts): `shift` and "
                "`noise_std`/`noise` do not apply to it."
            )
    optimizers = getattr(_function(objective), "optimizers", None)
    if optimizers is not None:
        inside = domain.contains(optimizers.to(torch.float64).reshape(-1, objective.dim))
        if not bool(inside.any()):
            warnings.warn(
                f"The optimum of {objective.name} lies outside Theta (`domain`="
                f"{ctx.settings.domain!r} shrunk by h={h:.3g}): its regrets are against the "
                "unconstrained optimum and cannot reach 0.",
                UserWarning,
                stacklevel=2,
            )


def _make_client(ctx, cid: int) -> FedZeroClient:
    return FedZeroClient(
        cid,
        ctx.objectives[cid],
        ctx.settings,
        seed=ctx.client_seeds[cid],
        evaluation_errors=ctx.setup.evaluation_errors,
        shard=_shards(ctx.objectives[cid], len(ctx.objectives))[cid],
    )


def _make_server(ctx, transport) -> FedZeroServer:
    objective = ctx.objectives[0]
    eta, h = step_parameters(ctx.settings, objective, len(ctx.objectives))
    domain = make_domain(ctx.settings, objective, h)
    lower, upper = objective.bounds.to(torch.float64)
    x0 = domain.project(((lower + upper) / 2).unsqueeze(0)).squeeze(0)
    return FedZeroServer(
        transport,
        ctx.settings,
        domain,
        x0,
        eta,
        h,
        objective.bounds,
        domain_for=lambda h: make_domain(ctx.settings, objective, h),
    )


register_algorithm(
    AlgorithmSpec(
        name="fedzero",
        summary="FedZero: workers send two-point l1-sphere gradient estimates, the server "
        "averages and takes a projected step (zero-order, convex)",
        settings_class=FedZeroSettings,
        make_client=_make_client,
        make_server=_make_server,
        check=_check,
    )
)
