r"""FedZero: federated zeroth-order projected SGD ([FedZero]_, Alg. 1).

Round ``t``: the server broadcasts ``x_t``; each worker ``j`` samples a context
``c_{j,t}`` and a direction ``z_{j,t}`` uniform on the l1 unit sphere, queries
``f_{c_{j,t}}(x_t +- h z_{j,t})`` and sends ``g_{j,t} = d/(2h) (y - y') sign(z_{j,t})``;
the server averages ``g_t = mean_j g_{j,t}`` and steps
``x_{t+1} = Proj_Theta(x_t - eta g_t)``. The output is ``x_1, ..., x_n``; the bound of
Cor. 3.2 is on their average, with ``h <= (1/L) sqrt((d+1)/n)`` and
``eta = (1/L) sqrt(m/(n d))`` giving ``D L sqrt(d/(n m))`` up to logarithms.

- :class:`FedZero`: one run, the workers of a round batched into one ``m x d`` call of
  ``f`` per side.
- :func:`simulate_fedzero`: ``R`` independent runs as one tensor program (one call of
  ``f`` per side per round on ``R x m x d`` points; per-run ``eta``/``h`` tensors).
- :func:`fedzero_step`: the server's aggregation and projected step, for a protocol
  that receives the workers' messages itself.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from botorch_fed.zeroth_order.estimators import check_points, check_positive, get_estimator
from botorch_fed.zeroth_order.projections import ConvexSet


def _positive_int(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"`{name}` must be an integer >= 1, got {value!r}.")
    return value


def _positive_float(value: Any, name: str) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not (math.isfinite(value) and value > 0)
    ):
        raise ValueError(f"`{name}` must be a positive finite number, got {value!r}.")
    return float(value)


def fedzero_defaults(L: float, n: int, m: int, d: int) -> tuple[float, float]:
    r"""Step size and perturbation radius of [FedZero]_, Cor. 3.2.

    Args:
        L: Lipschitz constant of every ``f_c`` (Assumption 2.2), ``> 0``.
        n: Number of rounds.
        m: Number of workers.
        d: Dimension.

    Returns:
        ``(eta, h)`` with ``eta = (1/L) sqrt(m / (n d))`` and ``h = (1/L) sqrt((d+1)/n)``
        (the largest ``h`` the corollary allows).
    """
    L = _positive_float(L, "L")
    n, m, d = _positive_int(n, "n"), _positive_int(m, "m"), _positive_int(d, "d")
    return math.sqrt(m / (n * d)) / L, math.sqrt((d + 1) / n) / L


def fedzero_step(
    x: Tensor, gradients: Tensor, eta: float | Tensor, domain: ConvexSet
) -> tuple[Tensor, Tensor]:
    r"""The server's step of Alg. 1: average the workers' estimates, step, project.

    Args:
        x: ``... x d`` current iterate(s).
        gradients: ``... x m x d`` worker messages ``g_{j,t}``.
        eta: Step size ``> 0``: a float or a ``...`` tensor (one per run).
        domain: The constraint set ``Theta``.

    Returns:
        ``(x_next, g)``: ``x_next = Proj_Theta(x - eta g)`` and ``g = mean_j g_{j,t}``,
        both ``... x d``.
    """
    x = check_points(x)
    gradients = check_points(gradients, "gradients")
    if (
        gradients.dim() != x.dim() + 1
        or gradients.shape[:-2] != x.shape[:-1]
        or (gradients.shape[-1] != x.shape[-1])
    ):
        raise ValueError(
            f"`gradients` must be ``... x m x d`` = {tuple(x.shape[:-1])} x m x "
            f"{x.shape[-1]}, got shape {tuple(gradients.shape)}."
        )
    if not isinstance(domain, ConvexSet):
        raise ValueError(f"`domain` must be a ConvexSet, got {type(domain).__name__}.")
    eta_t = check_positive(eta, "eta", x.shape[:-1], x)
    g = gradients.mean(dim=-2)
    return domain.project(x - eta_t.unsqueeze(-1) * g), g


def _round(
    estimator: Callable,
    f: Callable,
    x: Tensor,
    m: int,
    eta: Tensor,
    h: Tensor,
    domain: ConvexSet,
    generator: torch.Generator | None,
    contexts: Callable | None,
) -> tuple[Tensor, Tensor, Tensor]:
    r"""One round from ``x`` (``... x d``; ``eta``, ``h`` of shape ``...`` or ``()``):
    returns ``(x_next, g, mean observed value)``."""
    batch = x.shape[:-1]
    X = x.unsqueeze(-2).expand(*batch, m, x.shape[-1])
    context = None if contexts is None else contexts(tuple(batch) + (m,), generator)
    g_w, _, y_p, y_m = estimator(
        f, X, h.unsqueeze(-1), generator=generator, context=context, return_values=True
    )
    g = g_w.mean(dim=-2)
    x_next = domain.project(x - eta.unsqueeze(-1) * g)
    return x_next, g, 0.5 * (y_p + y_m).mean(dim=-1)


def _check_setup(
    f: Any,
    domain: Any,
    x0: Any,
    num_workers: Any,
    num_rounds: Any,
    contexts: Any,
    generator: Any,
) -> Tensor:
    if not callable(f):
        raise ValueError(f"`f` must be callable, got {type(f).__name__}.")
    if not isinstance(domain, ConvexSet):
        raise ValueError(f"`domain` must be a ConvexSet, got {type(domain).__name__}.")
    _positive_int(num_workers, "num_workers")
    _positive_int(num_rounds, "num_rounds")
    if contexts is not None and not callable(contexts):
        raise ValueError(
            f"`contexts` must be None or a callable (shape, generator) -> Tensor, got "
            f"{type(contexts).__name__}."
        )
    if generator is not None and not isinstance(generator, torch.Generator):
        raise ValueError(f"`generator` must be a torch.Generator or None, got {generator!r}.")
    x0 = check_points(x0, "x0")
    if domain.dim is not None and x0.shape[-1] != domain.dim:
        raise ValueError(
            f"`x0` must have last dimension {domain.dim} (the domain's), got shape "
            f"{tuple(x0.shape)}."
        )
    inside = domain.contains(x0)
    if not inside.all():
        raise ValueError(
            f"`x0` must lie in the domain {domain!r}; {int((~inside).sum())} of "
            f"{inside.numel()} starting point(s) (shape {tuple(x0.shape)}) do not: "
            f"{x0[~inside].tolist() if x0.dim() > 1 else x0.tolist()!r}."
        )
    return x0


@dataclass
class FedZeroResult:
    r"""Output of :meth:`FedZero.run`.

    Attributes:
        iterates: ``n x d``: ``x_1, ..., x_n`` (``x_1 = x0``).
        average: ``d``: their mean (the point Cor. 3.2 bounds).
        last: ``d``: ``x_{n+1}``, the point after the ``n``-th update.
        eta: The step size used.
        h: The perturbation radius used.
        values: ``n``: round ``t``'s mean of the ``2m`` observed values
            ``(y + y')/2`` (a free noisy estimate of ``f_h(x_t)``); None if not recorded.
    """

    iterates: Tensor
    average: Tensor
    last: Tensor
    eta: float
    h: float
    values: Tensor | None = None


class FedZero:
    r"""One run of FedZero ([FedZero]_, Alg. 1).

    Args:
        f: The workers' oracle: ``f(X)`` (or ``f(X, C)`` with ``contexts``) on ``... x d``
            points returns ``...`` values; called once per side per round on the
            ``m x d`` batch of the round.
        domain: The constraint set ``Theta`` (a :class:`ConvexSet`).
        x0: ``d`` starting point ``x_1`` in ``domain``.
        num_workers: ``m >= 1``.
        num_rounds: ``n >= 1``.
        lipschitz: ``L`` for the defaults of Cor. 3.2 (used for ``eta``/``h`` not given).
        eta: Step size ``> 0`` (default: Cor. 3.2).
        h: Perturbation radius ``> 0`` (default: Cor. 3.2's largest). The queries
            ``x_t +- h z`` may leave ``domain`` by up to ``h``: ``f`` must accept them, or
            pass ``domain.shrink(h)`` (as the federation protocol does).
        estimator: ``"l1"`` (the paper's), ``"l2"``, or a callable with the signature of
            :func:`~botorch_fed.zeroth_order.l1_gradient`.
        generator: Seeded generator for the directions and contexts (default: torch's
            global RNG).
        contexts: Optional ``(shape, generator) -> Tensor`` sampling the contexts
            ``c_{j,t}`` of a round (``shape = (m,)``; e.g. random data indices); passed
            to ``f`` as its second argument, the same on both sides.
    """

    def __init__(
        self,
        f: Callable,
        domain: ConvexSet,
        x0: Tensor,
        num_workers: int,
        num_rounds: int,
        lipschitz: float | None = None,
        eta: float | None = None,
        h: float | None = None,
        estimator: str | Callable = "l1",
        generator: torch.Generator | None = None,
        contexts: Callable | None = None,
    ) -> None:
        x0 = _check_setup(f, domain, x0, num_workers, num_rounds, contexts, generator)
        if x0.dim() != 1:
            raise ValueError(f"`x0` must be a ``d`` vector, got shape {tuple(x0.shape)}.")
        self.estimator = get_estimator(estimator)
        if eta is None or h is None:
            if lipschitz is None:
                raise ValueError(
                    f"`lipschitz` is needed for the Cor. 3.2 defaults when `eta` ({eta!r}) "
                    f"or `h` ({h!r}) is not given."
                )
            eta_d, h_d = fedzero_defaults(lipschitz, num_rounds, num_workers, x0.shape[-1])
            eta = eta_d if eta is None else eta
            h = h_d if h is None else h
        self.eta = _positive_float(eta, "eta")
        self.h = _positive_float(h, "h")
        self.f, self.domain, self.x0 = f, domain, x0
        self.num_workers, self.num_rounds = num_workers, num_rounds
        self.generator, self.contexts = generator, contexts

    def step(self, x: Tensor, generator: torch.Generator | None = None) -> tuple[Tensor, Tensor]:
        r"""One round from ``x`` (``d``, or ``... x d`` for several points at once).

        Args:
            x: The broadcast point(s).
            generator: Generator for this round (default: the run's).

        Returns:
            ``(x_next, g)``, both shaped like ``x``.
        """
        x = check_points(x)
        gen = self.generator if generator is None else generator
        eta = torch.tensor(self.eta, dtype=x.dtype, device=x.device)
        h = torch.tensor(self.h, dtype=x.dtype, device=x.device)
        x_next, g, _ = _round(
            self.estimator, self.f, x, self.num_workers, eta, h, self.domain, gen, self.contexts
        )
        return x_next, g

    def run(self) -> FedZeroResult:
        r"""Run ``n`` rounds from ``x0``.

        Returns:
            A :class:`FedZeroResult`.
        """
        x = self.x0
        eta = torch.tensor(self.eta, dtype=x.dtype, device=x.device)
        h = torch.tensor(self.h, dtype=x.dtype, device=x.device)
        iterates, values = [], []
        for _ in range(self.num_rounds):
            iterates.append(x)
            x, _, v = _round(
                self.estimator,
                self.f,
                x,
                self.num_workers,
                eta,
                h,
                self.domain,
                self.generator,
                self.contexts,
            )
            values.append(v)
        its = torch.stack(iterates)
        return FedZeroResult(
            iterates=its,
            average=its.mean(dim=0),
            last=x,
            eta=self.eta,
            h=self.h,
            values=torch.stack(values),
        )


@dataclass
class SimulationResult:
    r"""Output of :func:`simulate_fedzero` (``R`` runs, ``n`` rounds).

    Attributes:
        rounds: ``num_records`` (long): the recorded rounds ``t`` (``record_every``,
            ``2 record_every``, ...; ``1..n`` by default).
        iterates: ``num_records x R x d``: ``x_t`` at the recorded rounds.
        averages: ``num_records x R x d``: ``(1/t) sum_{s <= t} x_s`` at those rounds.
        average: ``R x d``: the mean of ``x_1..x_n`` (Cor. 3.2's point).
        last: ``R x d``: ``x_{n+1}``.
        eta: ``R`` step sizes.
        h: ``R`` perturbation radii.
        values: ``n x R``: each round's mean observed value ``(y + y')/2``.
    """

    rounds: Tensor
    iterates: Tensor
    averages: Tensor
    average: Tensor
    last: Tensor
    eta: Tensor
    h: Tensor
    values: Tensor


def _per_run(value: Any, name: str, R: int, like: Tensor) -> Tensor:
    t = check_positive(value, name, torch.Size([R]), like)
    return t.expand(R)


def simulate_fedzero(
    f: Callable,
    domain: ConvexSet,
    x0: Tensor,
    num_runs: int,
    num_workers: int,
    num_rounds: int,
    eta: float | Tensor,
    h: float | Tensor,
    estimator: str | Callable = "l1",
    generator: torch.Generator | None = None,
    contexts: Callable | None = None,
    record_every: int | None = 1,
) -> SimulationResult:
    r"""``R`` independent FedZero runs ([FedZero]_, Alg. 1) as one tensor program.

    The state is ``R x d``; each round evaluates ``f`` once per side on ``R x m x d``
    points, averages over the ``m`` workers and projects each run. Only the rounds are
    a Python loop. Runs on ``x0``'s device and dtype. With ``R = 1`` and the same seed
    the draws are those of :meth:`FedZero.run` (same order and count).

    Args:
        f: The oracle on ``... x d`` points (arbitrary leading dims), returning ``...``
            values (``f(X, C)`` with ``contexts``).
        domain: The constraint set; batched parameters broadcast against ``R x d``.
        x0: ``d`` (shared) or ``R x d`` starting points in ``domain``.
        num_runs: ``R >= 1``.
        num_workers: ``m >= 1``.
        num_rounds: ``n >= 1``.
        eta: Step size(s) ``> 0``: a float or an ``R`` tensor (a grid in one program).
        h: Perturbation radius (radii) ``> 0``: a float or an ``R`` tensor.
        estimator: ``"l1"``, ``"l2"`` or a callable like
            :func:`~botorch_fed.zeroth_order.l1_gradient`.
        generator: Seeded generator (directions and contexts).
        contexts: Optional ``(shape, generator) -> Tensor`` with ``shape = (R, m)``.
        record_every: Record ``x_t`` and the running average every ``k`` rounds
            (``t = k, 2k, ...``); None records nothing (only the final average is kept,
            incrementally).

    Returns:
        A :class:`SimulationResult`.
    """
    R = _positive_int(num_runs, "num_runs")
    x0 = _check_setup(f, domain, x0, num_workers, num_rounds, contexts, generator)
    if x0.dim() == 1:
        x0 = x0.expand(R, x0.shape[-1])
    elif x0.dim() != 2 or x0.shape[0] != R:
        raise ValueError(
            f"`x0` must be ``d`` or ``R x d`` with R = num_runs = {R}, got shape {tuple(x0.shape)}."
        )
    if record_every is not None:
        _positive_int(record_every, "record_every")
    est = get_estimator(estimator)
    eta_t, h_t = _per_run(eta, "eta", R, x0), _per_run(h, "h", R, x0)
    x = x0.clone()
    total = torch.zeros_like(x)
    rounds, its, avgs, values = [], [], [], []
    for t in range(1, num_rounds + 1):
        total = total + x
        if record_every is not None and t % record_every == 0:
            rounds.append(t)
            its.append(x)
            avgs.append(total / t)
        x, _, v = _round(est, f, x, num_workers, eta_t, h_t, domain, generator, contexts)
        values.append(v)
    d = x.shape[-1]
    empty = x.new_zeros(0, R, d)
    return SimulationResult(
        rounds=torch.tensor(rounds, dtype=torch.long, device=x.device),
        iterates=torch.stack(its) if its else empty,
        averages=torch.stack(avgs) if avgs else empty,
        average=total / num_rounds,
        last=x,
        eta=eta_t,
        h=h_t,
        values=torch.stack(values),
    )
