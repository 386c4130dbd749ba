r"""FBO-FedGP's settings (:class:`FBOFedGPSettings`), presets and global-model modules
(paper 000, Alg. 1, Alg. 2, eq. 3 and App. C.7)."""

from __future__ import annotations

import numbers
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Annotated, Any

import numpy as np
import torch
from botorch.models.utils.gpytorch_modules import (
    get_covar_module_with_dim_scaled_prior,
    get_gaussian_likelihood_with_lognormal_prior,
)
from gpytorch.means import ConstantMean

from botorch_fed.protocol.bo_client import BOSettings
from botorch_fed.protocol.declarations import Choice, Int, Real, check_settings

if TYPE_CHECKING:
    from gpytorch.kernels import Kernel
    from gpytorch.likelihoods import GaussianLikelihood

    GlobalModules = tuple[Kernel, GaussianLikelihood, ConstantMean]  # global_modules()

SUPPORTS = ("clustered", "random")
MAX_SUPPORT_SIZE = 4096  # a client refuses a larger support set or k from the server
HYPERPARAMETERS = ("average", "federated")
MIXINGS = ("sample", "expected", "global")
GLOBAL_BATCHES = ("distinct", "independent", "batch")
GLOBAL_MODELS = ("pitc", "pic")
PRESETS = ("default", "paper")
# the settings left at None: Alg. 2 ("paper"), or as benchmarks/results/fbo_fedgp_pays*.md
PRESET_VALUES: dict[str, dict[str, Any]] = {
    "paper": {"mixing": "sample", "global_model": "pitc", "hyperparameters": "average",
              "hyper_every": 10, "support": "clustered", "center_noise": 0.0},
    "default": {"mixing": "global", "global_model": "pic", "hyperparameters": "federated",
                "hyper_every": 5, "support": "clustered", "center_noise": 0.1},
}  # fmt: skip


@dataclass
class FBOFedGPSettings(BOSettings):
    r"""Settings of FBO-FedGP (sizes as the paper's Sec. 5.1). A setting left at ``None``
    is the ``preset``'s (:data:`PRESET_VALUES`). Adds to the BO client's settings
    (:class:`~botorch_fed.protocol.bo_client.BOSettings`: ``num_init``, ``num_rounds``,
    ``acquisition``, ``beta``, ...):

    Attributes:
        support_size: Support-set size ``|S|``.
        support: ``"clustered"`` (Alg. 1: federated k-means on the clients' centres)
            or ``"random"`` (App. D.3: uniform points drawn by the server, no client data
            involved); ``None``: the preset's.
        center_noise: With ``"clustered"``: std of the Gaussian noise a client adds to
            each coordinate of each centre it sends (unit cube; clamped into it), drawn
            from its private generator; an obfuscation, not differential privacy.
            ``None``: the preset's (default 0.1, paper 0) with ``"clustered"``, 0 with
            ``"random"``.
        support_every: Re-select the support every ``K`` rounds (0: never).
        support_growth: Points added to ``|S|`` at each re-selection (App. C.7).
        centers_per_client: k of each client's local k-means.
        min_cluster_size: Clients only send centres of clusters with at least this
            many points (a singleton's centre is a raw data point).
        schedule: ``c`` of ``p_t = 1 - t^-c`` (eq. 3), in ``(0, 1]``; used by ``mixing``
            ``"sample"`` and ``"expected"`` only.
        preset: ``"default"`` (the measured default) or ``"paper"`` (Alg. 2): decides
            the settings left at ``None``.
        mixing: ``"sample"`` (Alg. 2: a local step with probability ``p_t``),
            ``"expected"`` (p_t-weighted UCB) or ``"global"`` (every step on the global
            model); ``None``: the preset's.
        global_model: ``"pitc"`` (the dPITC model of the summed summaries, Alg. 2) or
            ``"pic"`` (the client's PIC model: the same summaries plus its own data
            exactly); ``None``: the preset's.
        hyperparameters: ``"average"`` (of the clients' local fits, one secure sum) or
            ``"federated"`` (PITC type-II ML, one secure sum of summaries and Jacobians
            per trust-region step; the iterates reach the server in clear); ``None``:
            the preset's.
        hyper_every: Refresh the global hyperparameters every ``K`` rounds; ``None``:
            the preset's.
        federated_maxiter: Trust-region steps of a ``"federated"`` refresh after its
            first evaluation (:class:`~botorch_fed.protocol.federated_fit.
            SummaryTrustRegion`; each evaluation is one secure sum).
        global_batch: Clients of one round's global step: ``"independent"`` (Alg. 2:
            each maximises its own acquisition; with ``"pitc"`` they usually evaluate the
            same point), ``"distinct"`` (distinct optima of one seeded search on the
            shared dPITC model) or ``"batch"`` (their points of a shared
            sequential-greedy ``q``-batch); ``None``: the preset's (``"distinct"`` and
            ``"batch"`` select dPITC when ``global_model`` is ``None``).
    """

    support_size: Annotated[int, Int(1, MAX_SUPPORT_SIZE)] = 16
    support: Annotated[str | None, Choice(SUPPORTS, optional=True)] = None
    center_noise: Annotated[float | None, Real(0, optional=True)] = None
    support_every: Annotated[int, Int(0)] = 5
    support_growth: Annotated[int, Int(0)] = 0
    centers_per_client: Annotated[int, Int(1)] = 4
    min_cluster_size: Annotated[int, Int(1)] = 2
    schedule: Annotated[float, Real(0, 1, open="low")] = 0.5
    preset: Annotated[str, Choice(PRESETS)] = "default"
    mixing: Annotated[str | None, Choice(MIXINGS, optional=True)] = None
    global_model: Annotated[str | None, Choice(GLOBAL_MODELS, optional=True)] = None
    hyperparameters: Annotated[str | None, Choice(HYPERPARAMETERS, optional=True)] = None
    hyper_every: Annotated[int | None, Int(1, optional=True)] = None
    federated_maxiter: Annotated[int, Int(1)] = 3
    global_batch: Annotated[str | None, Choice(GLOBAL_BATCHES, optional=True)] = None

    def resolved(self) -> FBOFedGPSettings:
        r"""A copy with the settings left at ``None`` decided by the preset (here, not at
        construction: ``replace(config, preset="paper")`` works)."""
        preset = PRESET_VALUES[self.preset]
        pick = {n: preset[n] if getattr(self, n) is None else getattr(self, n) for n in preset}
        model = self.global_model
        if model is None:  # a shared-model batch rule or KG's fantasies need dPITC
            shared = self.global_batch in ("distinct", "batch") or self.acquisition == "kg"
            model = "pitc" if shared else preset["global_model"]
        batch = self.global_batch
        if batch is None:
            expected = pick["mixing"] == "expected"
            batch = "distinct" if model == "pitc" and not expected else "independent"
        noise = self.center_noise
        if noise is None:  # the preset's noise belongs to its clustered support
            noise = preset["center_noise"] if pick["support"] == "clustered" else 0.0
        elif isinstance(noise, numbers.Real) and not isinstance(noise, bool | np.bool_):
            noise = float(noise)  # recorded settings hold plain floats
        pick.update(global_model=model, global_batch=batch, center_noise=noise)
        return replace(self, **pick)

    @classmethod
    def paper(cls, **overrides) -> FBOFedGPSettings:
        r"""The paper's algorithm (Alg. 2): ``preset="paper"``."""
        return cls(preset="paper", **overrides)

    def validate(self) -> None:
        r"""Raise ``ValueError`` naming the first invalid setting (of :meth:`resolved`)."""
        check_settings(self)
        s = self.resolved()
        noise = s.center_noise
        assert noise is not None  # resolved() sets it
        rules = (
            (noise > 0 and s.support != "clustered",
             f"`center_noise`={noise} noises cluster centres, but `support`={s.support!r} "
             "sends none (use `support`='clustered')."),
            (s.support == "clustered" and s.num_init < s.min_cluster_size,
             f"`num_init`={s.num_init} is below `min_cluster_size`={s.min_cluster_size}: a "
             "client's first support round would have no cluster large enough to share a "
             "centre of."),
            (s.mixing == "expected" and s.acquisition != "ucb",
             "`mixing`='expected' is defined for `acquisition`='ucb' only."),
            (s.mixing == "expected" and s.global_batch != "independent",
             "`mixing`='expected' takes every global step on the p_t-weighted UCB of one "
             f"client; `global_batch`={s.global_batch!r} would be ignored (use 'independent')."),
            (s.global_batch in ("distinct", "batch") and s.global_model == "pic",
             f"`global_batch`={s.global_batch!r} needs the shared dPITC model "
             "(`global_model`='pitc'): every client's PIC model is its own."),
            (s.global_batch == "batch" and s.acquisition not in ("ucb", "ei"),
             "`global_batch`='batch' is defined for `acquisition` 'ucb' or 'ei'."),
            (s.global_model == "pic" and s.acquisition == "kg",
             "`global_model`='pic' does not support `acquisition`='kg' (no fantasies)."),
        )  # fmt: skip
        for broken, message in rules:
            if broken:
                raise ValueError(message)


def global_modules(dim: int) -> GlobalModules:
    r"""Kernel, likelihood and mean of the global dPITC model: BoTorch's defaults."""
    covar = get_covar_module_with_dim_scaled_prior(dim).to(torch.float64)
    likelihood = get_gaussian_likelihood_with_lognormal_prior().to(torch.float64)
    return covar, likelihood, ConstantMean().to(torch.float64)
