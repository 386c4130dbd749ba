r"""The federated PITC sparse GP (dPITC) as a BoTorch model.

The server (or any client) holding the *sum* of the clients' whitened summaries
(:class:`~botorch_fed.models.pitc_summary.SparseSummary`) predicts with eq. 9-10 of
[FBO-FedGP] (App. A). With ``L = chol(K_SS)``, ``B = I + sum_i A~_i`` and
``b~ = sum_i b~_i`` (so ``Sigma = K_SS + sum_i A_i = L B L'``):

    W    = L^-1 K_SU
    mean = mu_U + W' B^-1 b~
    cov  = K_UU - W'W + W' B^-1 W

which is the PITC predictive distribution with one independent block per client,
and the exact GP posterior when the support contains every training input.

Conditioning on new observations adds them as one more block (a rank-``n'`` update
of ``A`` and an update of ``b``), so ``fantasize`` and one-shot
``qKnowledgeGradient`` work; the update depends on the fantasy ``Y`` only through
``b~``, so the ``num_fantasies`` fantasy models share one Cholesky factor of ``B``.

Numerics: all linear algebra runs in float64 whatever the dtype of the inputs; a
float32 model takes and returns float32 tensors. With an ill-conditioned support
(``cond(K_SS) ~ 1e9`` is common at long lengthscales) float32 cannot factorise
``K_SS`` without a jitter large enough to change the Nystrom term, which is where a
float32 dPITC would lose most of its accuracy.

References:

.. [FBO-FedGP] Secure federated Bayesian optimisation with distributed sparse GPs,
   Sec. 2 and App. A (paper 000 in ``shared/papers``).
.. [Quinonero2005] J. Quinonero-Candela and C. E. Rasmussen. A unifying view of
   sparse approximate Gaussian process regression. JMLR 2005.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from copy import deepcopy
from typing import Any

import numpy as np
import torch
from botorch import settings as botorch_settings
from botorch.acquisition.objective import PosteriorTransform
from botorch.exceptions.errors import (
    BotorchError,
    BotorchTensorDimensionError,
    InputDataError,
    UnsupportedError,
)
from botorch.models.model import FantasizeMixin, Model
from botorch.models.transforms.input import InputTransform
from botorch.models.transforms.outcome import ChainedOutcomeTransform, OutcomeTransform
from botorch.posteriors.gpytorch import GPyTorchPosterior
from botorch.posteriors.posterior import Posterior
from gpytorch import settings as gpytorch_settings
from gpytorch.distributions import MultivariateNormal
from gpytorch.kernels import Kernel
from gpytorch.likelihoods import GaussianLikelihood, Likelihood
from gpytorch.means import Mean, ZeroMean
from gpytorch.mlls import MarginalLogLikelihood
from gpytorch.models import GP
from gpytorch.priors import Prior
from linear_operator.operators import DenseLinearOperator
from torch import Tensor

from botorch_fed.models.pitc_summary import (
    DEFAULT_JITTER,
    SparseSummary,
    UnsupportedLikelihoodError,
    check_input_transform,
    compute_local_summary,
    evaluate64,
    local_summary,
    noise64,
    prior_variance64,
    summary_factor,
    support_factor,
    validate_support,
)

_SUMMARY_FIELDS = ("b", "A", "quad", "logdet", "num_data")


class HyperparametersChangedError(BotorchError):
    r"""The shared modules no longer hold the hyperparameters a summary was computed with.

    A dPITC summary is a function of the data *and* the hyperparameters; the model
    cannot recompute it (it never sees the data), so predicting would mix new
    hyperparameters with a summary of the old ones.
    """


def sum_arrays(arrays: Sequence[np.ndarray]) -> np.ndarray:
    r"""Plaintext aggregation: the elementwise sum of the clients' float64 arrays.

    This is the default ``aggregate`` callable; secure backends
    (``botorch_fed.secure``) provide drop-in replacements with the same signature.

    Args:
        arrays: One array per client, all of the same shape.

    Returns:
        Their float64 sum.
    """
    if len(arrays) == 0:
        raise ValueError("`arrays` is empty: no client contributed to the aggregate.")
    return np.sum(np.stack([np.asarray(a, dtype=np.float64) for a in arrays]), axis=0)


def check_outcome_transform(outcome_transform: OutcomeTransform | None) -> None:
    r"""Check that an outcome transform is trained and for a single output.

    Args:
        outcome_transform: The transform, or ``None``.

    Raises:
        TypeError: If it is not a BoTorch ``OutcomeTransform``.
        UnsupportedError: If it transforms more than one output.
        ValueError: If it (or a part of a chained transform) is untrained.
    """
    if outcome_transform is None:
        return
    if not isinstance(outcome_transform, OutcomeTransform):
        raise TypeError(
            "`outcome_transform` must be a BoTorch OutcomeTransform, got "
            f"{type(outcome_transform).__name__}."
        )
    parts = (
        list(outcome_transform.values())
        if isinstance(outcome_transform, ChainedOutcomeTransform)
        else [outcome_transform]
    )
    for part in parts:
        name = type(part).__name__
        m = getattr(part, "_m", None)
        if m is not None and m != 1:
            raise UnsupportedError(
                f"`outcome_transform` ({name}) transforms m={m} outputs, but "
                "FederatedPITCGP models a single output."
            )
        trained = getattr(part, "_is_trained", None)
        if trained is not None and not bool(trained):
            raise ValueError(
                f"`outcome_transform` ({name}) is untrained: the model never sees the "
                "outcomes, so it cannot learn its statistics. Build it from the "
                "federation's outcome moments (standardize_from_moments), or pass raw "
                "outcomes and the untrained transform to FederatedPITCGP.from_client_data, "
                "which trains it on the pooled outcomes."
            )


def _summary_modules(
    slots: Sequence[tuple[str, torch.nn.Module | None]],
) -> list[tuple[str, torch.nn.Module | None]]:
    r"""The modules whose state a summary depends on, with their paths, in a fixed order.

    Priors are left out (they do not enter the posterior), and so are input transforms
    that do not transform training inputs (``transform_on_train=False``, e.g.
    ``InputPerturbation``): they act on test inputs only.
    """
    out: list[tuple[str, torch.nn.Module | None]] = []
    stack = list(reversed(slots))
    while stack:
        path, module = stack.pop()
        if isinstance(module, Prior):
            continue
        if isinstance(module, InputTransform) and not getattr(module, "transform_on_train", True):
            continue
        out.append((path, module))
        if module is not None:
            children = [(f"{path}.{n}", m) for n, m in module._modules.items() if m is not None]
            stack.extend(reversed(children))
    return out


def _state_tensors(modules: list[tuple[str, torch.nn.Module | None]]) -> list[Tensor]:
    r"""Parameters and buffers of ``modules`` (see :func:`_summary_modules`)."""
    out: list[Tensor] = []
    seen: set[int] = set()
    for _, module in modules:
        if module is None:
            continue
        for t in (*module._parameters.values(), *module._buffers.values()):
            if t is not None and id(t) not in seen:
                seen.add(id(t))
                out.append(t)
    return out


def _fingerprint(tensors: Sequence[Tensor]) -> tuple:
    r"""Identity, storage, version, dtype and device of each tensor: changes whenever a
    tensor is replaced, moved, converted or modified in place (not on ``.data`` writes)."""
    return tuple((id(t), t.data_ptr(), t._version, t.dtype, t.device) for t in tensors)


_SCALARS = (bool, int, float, str, type(None))


def _structure(modules: list[tuple[str, torch.nn.Module | None]]) -> tuple:
    r"""The modules' structure: paths, types and non-tensor settings (e.g. a Matern
    kernel's ``nu``, a transform's flags), as a tuple to compare with ``==``."""
    parts = []
    for path, module in modules:
        if module is None:
            parts.append((path, None))
            continue
        settings = sorted(
            (k, v if not isinstance(v, tuple) else tuple(v))
            for k, v in vars(module).items()
            if k != "training"
            and (
                isinstance(v, _SCALARS)
                or (isinstance(v, tuple) and all(isinstance(e, _SCALARS) for e in v))
            )
        )
        parts.append((path, type(module).__module__, type(module).__qualname__, tuple(settings)))
    return tuple(parts)


def _structure_key(modules: list[tuple[str, torch.nn.Module | None]]) -> int:
    r"""A stable 63-bit hash of :func:`_structure` (what a model stores in a buffer;
    hashed with each module's settings as a list, the form saved models hold, so they
    still load)."""
    parts = [(*p[:3], list(p[3])) if len(p) == 4 else p for p in _structure(modules)]
    digest = hashlib.sha256(repr(parts).encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True) >> 1


class FederatedPITCGP(Model, FantasizeMixin, GP):
    r"""Distributed PITC sparse GP built from aggregated client summaries.

    The model never sees a data point: it is fully determined by the support set,
    the shared hyperparameter modules and the summed whitened summary. It is a
    snapshot for the state the summary was computed with, which it records (buffers
    ``summary_hyperparameters``, ``summary_structure``, ``summary_jitter``): if the
    modules change afterwards -- a value (``fit_federated_pitc`` on the same modules,
    ``load_state_dict`` of the modules alone, an optimiser step, a gpytorch setter), a
    module replaced or a setting such as a Matern kernel's ``nu`` -- the next
    ``posterior`` raises :class:`HyperparametersChangedError` instead of mixing them
    with an old summary. Give it a summary computed at the new values with
    :meth:`update_summary` (``PITCMarginalLogLikelihood`` does so after
    ``fit_gpytorch_mll``). ``load_state_dict`` from another ``FederatedPITCGP`` loads
    its summary and that record together and predicts as that model. ``.to()``,
    ``.float()`` and ``.double()`` move the summary and the support but keep their
    dtype.

    What a PITC model learns from new observations: they enter only through the
    support set -- an observation updates the posterior through its projection
    ``K_Sx``, so a point far from every support point (in lengthscales) barely moves
    the posterior anywhere, even at the point itself. Conditioning and fantasies
    (``fantasize``, ``qKnowledgeGradient``, ``qNegIntegratedPosteriorVariance``,
    pending points) inherit this: they value a candidate by how much it teaches the
    model *on the support*. Grow the support (or re-select it near the data, as
    FBO-FedGP does every few rounds) when the search moves away from it.

    Checks that read tensor values (non-finite test inputs, changed hyperparameter
    values) run on every call when the model lives on the CPU, where they cost no
    synchronisation. On an accelerator ``posterior`` performs no host
    synchronisation: hyperparameters are re-checked whenever a module tensor was
    replaced or modified in place (optimiser steps, ``copy_``, ``load_state_dict``,
    ``.to``), but a write through ``.data`` (what gpytorch's property setters such as
    ``kernel.lengthscale = ...`` do) is not seen there; call :meth:`check_hyperparameters`
    after such a write.

    Gradients: caches are detached, as gpytorch's ``detach_test_caches`` does, so
    gradients with respect to test inputs can be taken any number of times. Under
    ``botorch.settings.propagate_grads(True)`` (which ``qKnowledgeGradient`` sets)
    the posterior is recomputed from the summary on every call and gradients flow to
    the data a model was conditioned on (fantasy inputs).

    Example:
        >>> summaries = [
        ...     compute_local_summary(X_i, Y_i, S, covar_module, likelihood)
        ...     for X_i, Y_i in client_data  # each on its own client
        ... ]
        >>> model = FederatedPITCGP(S, SparseSummary.sum(summaries), covar_module,
        ...                         likelihood)
        >>> UCB = UpperConfidenceBound(model, beta=2.0)
    """

    num_outputs = 1
    _num_outputs = 1

    def __init__(
        self,
        support: Tensor,
        summary: SparseSummary,
        covar_module: Kernel,
        likelihood: Likelihood,
        mean_module: Mean | None = None,
        outcome_transform: OutcomeTransform | None = None,
        input_transform: InputTransform | None = None,
        jitter: float | None = None,
    ) -> None:
        r"""
        Args:
            support: ``m x d`` shared support set ``S`` (original input space).
            summary: The sum over clients of their whitened summaries on ``S`` (any
                batch shape; the model's batch shape is the summary's), computed with
                the current values of the modules below.
            covar_module: The shared kernel the summaries were computed with.
            likelihood: The shared ``GaussianLikelihood``.
            mean_module: The shared prior mean; ``None`` is a zero mean.
            outcome_transform: A *trained*, single-output outcome transform that the
                clients applied to their outcomes (e.g. ``Standardize`` built from
                federated moments, see :func:`standardize_from_moments`); posteriors
                are untransformed.
            input_transform: The input transform every party applied (to the support
                and to its data), with fixed coefficients, e.g.
                ``Normalize(d, bounds=bounds)``. Applied to test inputs as
                ``SingleTaskGP`` does.
            jitter: Relative jitter of ``K_SS`` (must match the clients').
        """
        super().__init__()
        validate_support(support)
        if not isinstance(summary, SparseSummary):
            raise TypeError(f"`summary` must be a SparseSummary, got {type(summary).__name__}.")
        _check_summary(summary, support.shape[0])
        if not isinstance(likelihood, GaussianLikelihood):
            raise UnsupportedLikelihoodError(likelihood)
        check_outcome_transform(outcome_transform)
        check_input_transform(input_transform)
        if jitter is not None and not float(jitter) >= 0:
            raise ValueError(f"`jitter` must be non-negative, got {jitter}.")
        self._setup(
            support,
            summary,
            covar_module,
            likelihood,
            mean_module,
            outcome_transform,
            input_transform,
            jitter,
        )
        self.to(device=support.device)
        self.eval()
        summary_factor(self.summary)  # I + A must be positive definite: fail here, not later

    def _setup(
        self,
        support: Tensor,
        summary: SparseSummary,
        covar_module: Kernel,
        likelihood: Likelihood,
        mean_module: Mean | None,
        outcome_transform: OutcomeTransform | None,
        input_transform: InputTransform | None,
        jitter: float | Tensor | None,
        snapshot: Tensor | None = None,
        structure: Tensor | None = None,
    ) -> None:
        self.covar_module = covar_module
        self.likelihood = likelihood
        self.mean_module = ZeroMean() if mean_module is None else mean_module
        if outcome_transform is not None:
            self.outcome_transform = outcome_transform
        if input_transform is not None:
            self.input_transform = input_transform
        device = support.device
        self.register_buffer("support", support)
        for name in _SUMMARY_FIELDS:
            value = getattr(summary, name).to(device=device, dtype=torch.float64)
            self.register_buffer(f"summary_{name}", value)
        # The state the summary was computed with (all persistent: load_state_dict
        # brings a summary together with what it depends on).
        jitter = DEFAULT_JITTER if jitter is None else jitter
        self.register_buffer(
            "summary_jitter", torch.as_tensor(jitter, dtype=torch.float64, device=device)
        )
        if snapshot is None:
            snapshot = self._hyperparameter_values(device)
        self.register_buffer("summary_hyperparameters", snapshot)
        if structure is None:
            structure = torch.tensor(
                _structure_key(self._summary_modules()), dtype=torch.int64, device=device
            )
        self.register_buffer("summary_structure", structure)
        self._cache: dict[str, Any] = {}

    # --- state and caches ----------------------------------------------------------
    @property
    def summary(self) -> SparseSummary:
        r"""The aggregated whitened summary the model predicts from."""
        return SparseSummary(*(getattr(self, f"summary_{n}") for n in _SUMMARY_FIELDS))

    @property
    def batch_shape(self) -> torch.Size:
        r"""The model batch shape (that of the summary)."""
        return self.summary.batch_shape

    @property
    def _jitter(self) -> float:
        r"""The relative jitter of ``K_SS`` the summary was computed with."""
        entry = self._cache.get("jitter")
        return float(self.summary_jitter) if entry is None else entry

    def _summary_modules(self) -> list[tuple[str, torch.nn.Module | None]]:
        return _summary_modules(
            [
                ("covar_module", self.covar_module),
                ("likelihood", self.likelihood),
                ("mean_module", self.mean_module),
                ("input_transform", getattr(self, "input_transform", None)),
                ("outcome_transform", getattr(self, "outcome_transform", None)),
            ]
        )

    def _hyperparameter_values(
        self, device: torch.device, tensors: list[Tensor] | None = None
    ) -> Tensor:
        tensors = _state_tensors(self._summary_modules()) if tensors is None else tensors
        if not tensors:
            return torch.zeros(0, dtype=torch.float64, device=device)
        return torch.cat(
            [t.detach().reshape(-1).to(dtype=torch.float64, device=device) for t in tensors]
        )

    def check_hyperparameters(self) -> None:
        r"""Raise if the modules' hyperparameters differ from the summary's.

        Raises:
            HyperparametersChangedError: If any parameter, buffer or setting (module
                type, ``nu``, transform flags, ...) of the kernel, likelihood, mean or
                transforms changed since the summary was set.
        """
        modules = self._summary_modules()
        self._check_structure(_structure_key(modules), int(self.summary_structure))
        self._check_values(_state_tensors(modules))

    @staticmethod
    def _check_structure(current: int, reference: int) -> None:
        if current != reference:
            raise HyperparametersChangedError(
                "The structure of this FederatedPITCGP's modules (a module replaced or "
                "added, a kernel's nu, a transform's flags) is not the one its summary was "
                "computed with. Build a new model from summaries computed with the current "
                "modules."
            )

    def _check_values(self, tensors: list[Tensor]) -> None:
        snapshot = self.summary_hyperparameters
        values = self._hyperparameter_values(snapshot.device, tensors)
        if values.shape != snapshot.shape or not torch.equal(values, snapshot):
            raise HyperparametersChangedError(
                "The hyperparameters of this FederatedPITCGP's modules (kernel, "
                "likelihood, mean or transforms) are not those its summary was computed "
                "with -- e.g. after fit_federated_pitc, an optimiser step or "
                "load_state_dict on the shared modules. Predicting would mix them with a "
                "summary of the old values. Recompute the clients' summaries with the "
                "current hyperparameters and call `model.update_summary(summary)` (or "
                "build a new model); fit with PITCMarginalLogLikelihood, which does this "
                "after fit_gpytorch_mll."
            )

    def _ensure_current(self) -> None:
        r"""Check the modules against the summary's state and clear the caches if any
        state tensor was replaced or modified (see the class docstring).

        Reads tensor values only on the CPU, or when tensor metadata changed (then the
        structure key and jitter buffers are read too).
        """
        modules = self._summary_modules()
        tensors = _state_tensors(modules)
        own = self._own_tensors()
        fingerprint = tuple((id(t), t.data_ptr(), t._version) for t in (*tensors, *own))
        changed = fingerprint != self._cache.get("fingerprint")
        reference = int(self.summary_structure) if changed else self._cache["structure"]
        self._check_structure(_structure_key(modules), reference)
        if changed or self._reads_are_free():
            self._check_values(tensors)
        if changed:
            self._cache = {
                "fingerprint": fingerprint,
                # holding the tensors keeps their ids and storage from being reused
                "tensors": (*tensors, *own),
                "structure": reference,
                "jitter": float(self.summary_jitter),
            }

    def _own_tensors(self) -> list[Tensor]:
        r"""The model's own state: the summary, the support and the snapshot buffers."""
        own = [getattr(self, f"summary_{n}") for n in _SUMMARY_FIELDS]
        return [*own, self.support, self.summary_hyperparameters, self.summary_structure,
                self.summary_jitter]  # fmt: skip

    def state_fingerprint(self) -> tuple[tuple, list[Tensor]]:
        r"""Identity, storage, version, dtype and device of every tensor the predictions
        depend on, and the identity of every module holding them: it changes whenever
        one is replaced, moved, converted or modified in place through the version
        counter (not on ``.data`` writes: compare the tensors' values for those),
        and the modules' structure (settings that are not tensors, e.g. a Matern
        kernel's ``nu``).

        Returns:
            The fingerprint (compare with ``==``) and the tensors it covers.
        """
        modules = self._summary_modules()
        tensors = [*_state_tensors(modules), *self._own_tensors()]
        structure = _structure(modules)
        return (tuple(id(m) for _, m in modules), structure, _fingerprint(tensors)), tensors

    def _reads_are_free(self) -> bool:
        r"""Whether reading tensor values costs no host synchronisation (CPU)."""
        return self.support.device.type == "cpu"

    def _support_factor(self) -> tuple[Tensor, Tensor]:
        r"""The (transformed) float64 support and ``L = chol(K_SS)``: cached and
        detached, as gpytorch's ``detach_test_caches`` (recomputed with gradients to
        the hyperparameters when that setting is off)."""
        self._ensure_current()
        live = gpytorch_settings.detach_test_caches.off()
        entry = None if live else self._cache.get("support")
        if entry is None:
            with torch.set_grad_enabled(torch.is_grad_enabled() and live):
                entry = support_factor(
                    self.support,
                    self.covar_module,
                    self._jitter,
                    getattr(self, "input_transform", None),
                )
            if not live:
                self._cache["support"] = entry
        return entry

    def _summary_factor(self) -> tuple[Tensor, Tensor]:
        r"""``chol(I + A~)`` and ``v``: cached and detached unless gradients must flow
        to the data the model was conditioned on (``propagate_grads``, as BoTorch)."""
        if botorch_settings.propagate_grads.on() or gpytorch_settings.detach_test_caches.off():
            # the summary was checked when the model was built: no flag read needed
            return summary_factor(self.summary, check=self._reads_are_free())
        entry = self._cache.get("summary")
        if entry is None:
            with torch.no_grad():
                entry = summary_factor(self.summary)
            self._cache["summary"] = entry
        return entry

    def update_summary(self, summary: SparseSummary) -> None:
        r"""Replace the summary by one computed with the modules' current state.

        Args:
            summary: The new summed summary (same support set and jitter), computed by
                the clients with the current hyperparameters.
        """
        if not isinstance(summary, SparseSummary):
            raise TypeError(f"`summary` must be a SparseSummary, got {type(summary).__name__}.")
        _check_summary(summary, self.support.shape[0])
        summary_factor(summary)
        device = self.support.device
        for name in _SUMMARY_FIELDS:
            value = getattr(summary, name).detach().to(device, torch.float64)
            setattr(self, f"summary_{name}", value)
        self.summary_hyperparameters = self._hyperparameter_values(device)
        self.summary_structure = torch.tensor(
            _structure_key(self._summary_modules()), dtype=torch.int64, device=device
        )
        self._cache = {}

    def _apply(self, fn: Callable[[Tensor], Tensor], recurse: bool = True) -> FederatedPITCGP:
        r"""``.to``, ``.float()``, ``.double()``, ...: the summary, the support it lives
        on and the state it was computed with keep their dtype (only their device
        follows); a dtype conversion of the modules re-records their (converted) values
        if they matched before."""
        names = [f"summary_{n}" for n in _SUMMARY_FIELDS]
        names += ["summary_hyperparameters", "summary_jitter", "support"]
        if any(self._buffers.get(n) is None for n in names):  # during construction
            return super()._apply(fn, recurse)
        kept = {n: self._buffers[n] for n in names}
        tensors = _state_tensors(self._summary_modules())
        before = _fingerprint((*tensors, *kept.values()))
        # the values before the conversion, to tell whether they matched the summary
        values = self._hyperparameter_values(kept["summary_hyperparameters"].device, tensors)
        for n in names:
            self._buffers[n] = None  # nn.Module._apply skips None buffers
        try:
            super()._apply(fn, recurse)
        finally:
            device = fn(torch.zeros((), dtype=torch.float64, device=kept[names[0]].device)).device
            for n, t in kept.items():
                self._buffers[n] = t.to(device=device)
        modules = self._summary_modules()
        own = [self._buffers[n] for n in names]
        if _fingerprint((*_state_tensors(modules), *own)) == before:
            # nothing moved or converted (e.g. the ``.to(X)`` every BoTorch analytic
            # acquisition runs on each call): the caches stay valid
            return self
        snapshot = kept["summary_hyperparameters"]
        current = (
            values.shape == snapshot.shape
            and bool(torch.equal(values, snapshot))
            and _structure_key(modules) == int(self.summary_structure)
        )
        if current:
            self.summary_hyperparameters = self._hyperparameter_values(device)
        self._cache = {}
        return self

    # BoTorch transforms stored training inputs on eval(); this model has none (the
    # support and the clients' inputs are transformed where they are used).
    def _set_transformed_inputs(self) -> None:
        return None

    def _revert_to_original_inputs(self) -> None:
        return None

    # --- construction from data in one process ------------------------------------
    @classmethod
    def from_client_data(
        cls,
        client_data: Sequence[tuple[Tensor, Tensor]],
        support: Tensor,
        covar_module: Kernel,
        likelihood: Likelihood,
        mean_module: Mean | None = None,
        outcome_transform: OutcomeTransform | None = None,
        input_transform: InputTransform | None = None,
        aggregate: Callable[[Sequence[np.ndarray]], np.ndarray] | None = None,
        jitter: float | None = None,
    ) -> FederatedPITCGP:
        r"""Simulate the federation in one process: summarise, aggregate, build.

        Outcomes and inputs are given in their original spaces, as to
        ``SingleTaskGP``. An untrained outcome transform (e.g. ``Standardize(m=1)``)
        is trained on the pooled outcomes, and a learnable input transform (e.g.
        ``Normalize(d)``) learns its coefficients from the pooled inputs (a copy, with
        learning then switched off), exactly as ``SingleTaskGP`` would on the pooled
        data; in a real federation nobody holds the pooled data -- use
        :func:`standardize_from_moments` and transforms with fixed coefficients.

        Without ``aggregate`` the summaries are added as tensors. With ``aggregate``
        (e.g. a secure backend, ``botorch_fed.secure.make_aggregator``), each client's
        summary is packed into a float64 vector as it would be sent, the vectors are
        combined by ``aggregate`` and the model is built from the unpacked sum.

        Args:
            client_data: One ``(train_X, train_Y)`` pair per client (``n_i x d``,
                ``n_i x 1``), untransformed.
            support: ``m x d`` shared support set.
            covar_module: The shared kernel.
            likelihood: The shared ``GaussianLikelihood``.
            mean_module: The shared prior mean (``None``: zero).
            outcome_transform: Outcome transform (trained or not, see above).
            input_transform: Input transform (fixed or learnable, see above).
            aggregate: ``list of arrays -> their sum``; default: add the tensors.
            jitter: Relative jitter of ``K_SS``.

        Returns:
            The federated model.
        """
        client_data = _check_client_data(client_data)
        validate_support(support)
        if input_transform is not None and _learns(input_transform):
            # learn (a copy of) the transform on the pooled inputs, then freeze it
            input_transform = deepcopy(input_transform)
            input_transform.train()
            input_transform(torch.cat([X for X, _ in client_data], dim=-2).to(torch.float64))
            for module in input_transform.modules():
                if getattr(module, "learn_coefficients", False):
                    module.learn_coefficients = False
            input_transform.eval()
        if outcome_transform is not None:
            if _untrained(outcome_transform):
                outcome_transform.train()
                outcome_transform(torch.cat([Y for _, Y in client_data], dim=-2))
            outcome_transform.eval()
        check_outcome_transform(outcome_transform)
        check_input_transform(input_transform)
        with torch.no_grad():
            _, L = support_factor(support, covar_module, jitter, input_transform)
            summaries = []
            for i, (X, Y) in enumerate(transform_outcomes(client_data, outcome_transform)):
                try:
                    summary = compute_local_summary(
                        X,
                        Y,
                        support,
                        covar_module,
                        likelihood,
                        mean_module,
                        support_chol=L,
                        input_transform=input_transform,
                    )
                except (InputDataError, BotorchTensorDimensionError, UnsupportedError) as e:
                    raise type(e)(f"client_data[{i}]: {e}") from e
                summaries.append(summary)
        if aggregate is None:
            total = SparseSummary.sum(summaries)
        else:
            packed = aggregate([s.to_numpy() for s in summaries])
            total = SparseSummary.from_numpy(packed, support.shape[0], device=support.device)
        return cls(
            support,
            total,
            covar_module,
            likelihood,
            mean_module,
            outcome_transform,
            input_transform,
            jitter,
        )

    # --- prediction ---------------------------------------------------------------
    def _check_X(self, X: Tensor, d: int, name: str = "X") -> None:
        if not isinstance(X, Tensor):
            raise TypeError(f"`{name}` must be a Tensor, got {type(X).__name__}.")
        if X.ndim < 2 or X.shape[-1] != d:
            raise BotorchTensorDimensionError(
                f"`{name}` must be `batch_shape x q x d` with d={d}, got shape {tuple(X.shape)}."
            )
        if not X.is_floating_point():
            raise InputDataError(f"`{name}` must be floating point, got {X.dtype}.")
        try:
            torch.broadcast_shapes(X.shape[:-2], self.batch_shape)
        except RuntimeError as e:
            raise BotorchTensorDimensionError(
                f"The batch shape {tuple(X.shape[:-2])} of `{name}` does not broadcast "
                f"with the model's batch shape {tuple(self.batch_shape)}."
            ) from e
        if X.device.type == "cpu" and not torch.isfinite(X).all():
            raise InputDataError(f"`{name}` contains NaN or infinite values.")

    def _factors(self) -> tuple[Tensor, ...]:
        r"""The factors of :meth:`_predict_from`, checked against the modules' state:
        ``(S, L_S, L_B, v)`` (see :meth:`_support_factor`, :meth:`_summary_factor`)."""
        return (*self._support_factor(), *self._summary_factor())

    def _predict(self, X: Tensor) -> tuple[Tensor, Tensor]:
        r"""Latent float64 mean (``batch x q``) and covariance (``batch x q x q``) at
        transformed inputs ``X``."""
        return self._predict_from(self._factors(), X)

    def _predict_from(
        self, factors: tuple[Tensor, ...], X: Tensor, diag: bool = False
    ) -> tuple[Tensor, Tensor]:
        r""":meth:`_predict` from given :meth:`_factors` (no state check); with
        ``diag``, the variances (``batch x q``) instead of the covariance."""
        S, L_S, L_B, v = factors
        X64 = X.to(torch.float64)
        K_SU = evaluate64(self.covar_module, S.expand(*X64.shape[:-2], *S.shape), X64)
        W = torch.linalg.solve_triangular(L_S, K_SU, upper=False)
        C = torch.linalg.solve_triangular(L_B, W, upper=False)
        mean = evaluate64(self.mean_module, X64) + (C * v.unsqueeze(-1)).sum(dim=-2)
        if diag:
            prior = prior_variance64(self.covar_module, X64)
            return mean, prior - W.pow(2).sum(dim=-2) + C.pow(2).sum(dim=-2)
        cov = evaluate64(self.covar_module, X64, X64) - W.mT @ W + C.mT @ C
        return mean, 0.5 * (cov + cov.mT)

    @staticmethod
    def _mvn(mean: Tensor, cov: Tensor, dtype: torch.dtype) -> MultivariateNormal:
        batch_shape = torch.broadcast_shapes(mean.shape[:-1], cov.shape[:-2])
        mean = mean.expand(*batch_shape, mean.shape[-1]).to(dtype)
        cov = cov.expand(*batch_shape, *cov.shape[-2:]).to(dtype)  # fantasies share one
        # A lazy covariance, as ExactGP returns: no eager Cholesky of a q x q matrix
        # that may be singular (repeated test points); samplers add jitter when needed.
        return MultivariateNormal(mean, DenseLinearOperator(cov))

    def forward(self, X: Tensor) -> MultivariateNormal:
        r"""The latent posterior at inputs in the model's (transformed) input space.

        As for BoTorch's exact GPs in eval mode, ``model(X)`` takes ``X`` already
        input-transformed and returns the latent distribution in the
        outcome-transformed space (no noise, no untransform); GIBBON
        (``qLowerBoundMaxValueEntropy``) uses it for ``q > 1``.

        Args:
            X: ``batch_shape x q x d`` transformed inputs.

        Returns:
            A ``MultivariateNormal`` with a full ``q x q`` covariance.
        """
        S, _ = self._support_factor()
        self._check_X(X, S.shape[-1])
        mean, cov = self._predict(X)
        return self._mvn(mean, cov, X.dtype)

    def posterior(
        self,
        X: Tensor,
        output_indices: list[int] | None = None,
        observation_noise: bool | Tensor = False,
        posterior_transform: PosteriorTransform | None = None,
    ) -> Posterior:
        r"""The dPITC predictive distribution (eq. 9-10 of [FBO-FedGP]).

        Args:
            X: ``batch_shape x q x d`` test inputs in the original input space
                (``batch_shape`` broadcasts with the model's batch shape).
            output_indices: ``None`` or ``[0]`` (single output).
            observation_noise: If True, add the likelihood's noise; if a tensor
                (outcome-transformed space), add it: a 0-dim tensor, or one of shape
                ``batch_shape x q x 1`` (broadcastable).
            posterior_transform: An optional posterior transform.

        Returns:
            A ``GPyTorchPosterior`` with the full ``q x q`` covariance, in the dtype of
            ``X`` (or the transformed posterior).
        """
        self.eval()
        _check_output_indices(output_indices)
        self._check_X(X, self.support.shape[-1])
        # transformed in float64 (BoTorch's transforms cast their buffers to X's dtype)
        mean, cov = self._predict(self.transform_inputs(X.to(torch.float64)))
        if observation_noise is True:
            noise = noise64(self.likelihood)
            cov = cov + torch.diag_embed(noise * torch.ones_like(mean))
        elif isinstance(observation_noise, Tensor):
            cov = cov + torch.diag_embed(_noise_diagonal(observation_noise, mean))
        elif observation_noise is not False:
            raise ValueError(
                f"`observation_noise` must be a bool or a Tensor, got {observation_noise!r}."
            )
        posterior = GPyTorchPosterior(distribution=self._mvn(mean, cov, X.dtype))
        if hasattr(self, "outcome_transform"):
            posterior = self.outcome_transform.untransform_posterior(posterior, X=X)
        if posterior_transform is not None:
            return posterior_transform(posterior=posterior, X=X)
        return posterior

    def subset_output(self, idcs: list[int]) -> FederatedPITCGP:
        r"""The model itself for ``idcs == [0]`` (its only output).

        Args:
            idcs: The output indices.

        Returns:
            ``self``.
        """
        _check_output_indices(idcs)
        return self

    def condition_on_observations(
        self, X: Tensor, Y: Tensor, noise: Tensor | None = None
    ) -> FederatedPITCGP:
        r"""Add ``(X, Y)`` as one more PITC block (a rank update of the summary).

        Args:
            X: ``batch_shape x n' x d`` new inputs (original input space).
            Y: ``batch_shape' x n' x 1`` new outcomes (original outcome space);
                ``batch_shape'`` broadcasts with ``batch_shape``, e.g.
                ``num_fantasies x batch_shape`` when fantasizing.
            noise: Optional ``batch_shape x n' x 1`` observation noise variances
                (outcome-transformed space); default: the likelihood's noise.

        Returns:
            A new ``FederatedPITCGP`` (sharing this model's modules and support
            factorisation) with batch shape ``broadcast(model batch, batch_shape')``;
            differentiable in ``X``, ``Y`` under ``propagate_grads``.
        """
        self.eval()
        self._check_X(X, self.support.shape[-1])
        self._check_observations(X, Y, noise)
        S, L_S = self._support_factor()
        X64 = X.to(torch.float64)
        if hasattr(self, "outcome_transform"):
            Y, _ = self.outcome_transform(Y.to(torch.float64), X=X64)
        if X.shape[-2] == 0:  # BoTorch's fantasize with no points: the same model
            batch = torch.broadcast_shapes(self.batch_shape, X.shape[:-2], Y.shape[:-2])
            m = S.shape[0]
            zeros = [
                torch.zeros(*batch, *tail, dtype=torch.float64, device=S.device)
                for tail in ((m,), (m, m), (), (), ())
            ]
            return self._derived(self.summary + SparseSummary(*zeros))
        block = local_summary(
            self.transform_inputs(X64),
            Y,
            S,
            L_S,
            self.covar_module,
            self.likelihood,
            self.mean_module,
            train_Yvar=noise,
        )
        return self._derived(self.summary + block)

    def _check_observations(self, X: Tensor, Y: Tensor, noise: Tensor | None) -> None:
        n = X.shape[-2]
        if not isinstance(Y, Tensor) or Y.ndim < 2 or Y.shape[-2] != n:
            shape = tuple(Y.shape) if isinstance(Y, Tensor) else type(Y).__name__
            raise BotorchTensorDimensionError(
                f"`Y` must be `batch_shape x n x 1` with n={n} as `X`, got {shape}."
            )
        if Y.shape[-1] != 1:
            raise UnsupportedError(
                f"`Y` has {Y.shape[-1]} outputs: FederatedPITCGP models a single output."
            )
        tensors = {"Y": Y}
        if noise is not None:
            if not isinstance(noise, Tensor):
                raise TypeError(f"`noise` must be a Tensor or None, got {type(noise).__name__}.")
            if noise.ndim < 2 or noise.shape[-1] != 1 or noise.shape[-2] not in (n, 1):
                raise BotorchTensorDimensionError(
                    f"`noise` must be `batch_shape x n x 1` with n={n}, got shape "
                    f"{tuple(noise.shape)}."
                )
            tensors["noise"] = noise
        for name, t in tensors.items():
            try:
                torch.broadcast_shapes(t.shape[:-2], X.shape[:-2], self.batch_shape)
            except RuntimeError as e:
                raise BotorchTensorDimensionError(
                    f"The batch shape {tuple(t.shape[:-2])} of `{name}` does not broadcast "
                    f"with those of `X` {tuple(X.shape[:-2])} and of the model "
                    f"{tuple(self.batch_shape)}."
                ) from e
            if self._reads_are_free() and not torch.isfinite(t).all():
                raise InputDataError(f"`{name}` contains NaN or infinite values.")
        if noise is not None and self._reads_are_free() and (noise <= 0).any():
            raise InputDataError("`noise` (observation noise variances) must be positive.")

    def _derived(self, summary: SparseSummary) -> FederatedPITCGP:
        r"""A model with the same modules, support and snapshot, and a new summary
        (no re-validation, the support factorisation is shared)."""
        new = object.__new__(type(self))
        super(FederatedPITCGP, new).__init__()
        # copies: a later in-place change of this model's state (load_state_dict) must
        # not move the derived model's record of what its summary was computed with
        new._setup(
            self.support.clone(),
            summary,
            self.covar_module,
            self.likelihood,
            self.mean_module,
            getattr(self, "outcome_transform", None),
            getattr(self, "input_transform", None),
            self.summary_jitter.clone(),
            snapshot=self.summary_hyperparameters.clone(),
            structure=self.summary_structure.clone(),
        )
        new.train(self.training)
        if "support" in self._cache:
            new._ensure_current()
            new._cache["support"] = self._cache["support"]
        return new

    # --- fitting --------------------------------------------------------------------
    def custom_fit(self, mll: MarginalLogLikelihood, **kwargs: Any) -> MarginalLogLikelihood:
        r"""What ``botorch.fit.fit_gpytorch_mll`` calls for this model.

        The model holds no training data, so it is fitted through a
        :class:`~botorch_fed.models.pitc_mll.PITCMarginalLogLikelihood`, which holds
        the clients' data in one process (simulations, tests, tutorials) and optimises
        the same objective as :func:`fit_federated_pitc`. In a federation use
        ``fit_federated_pitc``.

        Args:
            mll: A ``PITCMarginalLogLikelihood`` of this model.
            **kwargs: Passed to BoTorch's generic fitting routine.

        Returns:
            The fitted ``mll`` (its model then holds a summary at the fitted values).
        """
        from botorch.fit import _fit_fallback

        from botorch_fed.models.pitc_mll import PITCMarginalLogLikelihood

        if not isinstance(mll, PITCMarginalLogLikelihood):
            raise UnsupportedError(
                f"fit_gpytorch_mll got a {type(mll).__name__} for a FederatedPITCGP, which "
                "holds no training data. With all clients' data in one process fit "
                "PITCMarginalLogLikelihood(model.likelihood, model, client_data); in a "
                "federation use botorch_fed.models.fit_federated_pitc and rebuild the model "
                "from fresh summaries."
            )
        if mll.model is not self:
            raise ValueError("`mll.model` is not this model.")
        return _fit_fallback(mll, **kwargs)


def _learns(input_transform: InputTransform) -> bool:
    return any(getattr(m, "learn_coefficients", False) for m in input_transform.modules())


def _untrained(outcome_transform: OutcomeTransform) -> bool:
    parts = (
        list(outcome_transform.values())
        if isinstance(outcome_transform, ChainedOutcomeTransform)
        else [outcome_transform]
    )
    return any(
        getattr(p, "_is_trained", None) is not None and not bool(p._is_trained) for p in parts
    )


def transform_outcomes(
    client_data: Sequence[tuple[Tensor, Tensor]], outcome_transform: OutcomeTransform | None
) -> list[tuple[Tensor, Tensor]]:
    r"""Apply a trained outcome transform (in eval mode) to every client's outcomes.

    Args:
        client_data: ``(train_X, train_Y)`` pairs.
        outcome_transform: The shared transform or ``None``.

    Returns:
        The pairs with transformed outcomes.
    """
    if outcome_transform is None:
        return list(client_data)
    was_training = outcome_transform.training
    outcome_transform.eval()  # never re-learn statistics from one client's outcomes
    try:
        return [(X, outcome_transform(Y, X=X)[0]) for X, Y in client_data]
    finally:
        outcome_transform.train(was_training)


def _check_client_data(client_data: Sequence[tuple[Tensor, Tensor]]) -> list:
    if isinstance(client_data, (Tensor, str, bytes)) or not isinstance(client_data, Sequence):
        raise TypeError(
            "`client_data` must be a sequence of (train_X, train_Y) pairs, got "
            f"{type(client_data).__name__}."
        )
    if len(client_data) == 0:
        raise ValueError("`client_data` is empty: a federation needs clients.")
    pairs = []
    for i, pair in enumerate(client_data):
        if not (isinstance(pair, (tuple, list)) and len(pair) == 2):
            raise TypeError(f"`client_data[{i}]` must be a (train_X, train_Y) pair.")
        X, Y = pair
        if not isinstance(X, Tensor) or not isinstance(Y, Tensor) or X.ndim != 2 or Y.ndim != 2:
            raise BotorchTensorDimensionError(
                f"`client_data[{i}]` must hold an `n x d` train_X and an `n x 1` train_Y."
            )
        if Y.shape[-1] != 1:
            raise UnsupportedError(
                f"`client_data[{i}]` has {Y.shape[-1]} outputs: FederatedPITCGP models a "
                "single output (one model per outcome, e.g. in a ModelListGP)."
            )
        if pairs and X.dtype != pairs[0][0].dtype:
            raise InputDataError(
                f"`client_data[{i}]` has dtype {X.dtype} but client 0 has {pairs[0][0].dtype}."
            )
        pairs.append((X, Y))
    return pairs


def _check_summary(summary: SparseSummary, num_support: int) -> None:
    if summary.num_support != num_support:
        raise BotorchTensorDimensionError(
            f"`summary` lives on {summary.num_support} support points but `support` "
            f"has {num_support}."
        )
    for name in _SUMMARY_FIELDS:
        value = getattr(summary, name)
        if not value.is_floating_point():
            raise InputDataError(f"`summary.{name}` must be floating point, got {value.dtype}.")
        if not torch.isfinite(value).all():
            raise InputDataError(f"`summary.{name}` contains NaN or infinite values.")


def _check_output_indices(output_indices: list[int] | None) -> None:
    if output_indices is not None and list(output_indices) != [0]:
        raise UnsupportedError(
            f"`output_indices`={list(output_indices)}: FederatedPITCGP models a single "
            "output (index 0). Model several outcomes with one model each (ModelListGP)."
        )


def _noise_diagonal(observation_noise: Tensor, mean: Tensor) -> Tensor:
    r"""The ``batch x q`` noise variances of a 0-dim or ``batch x q x 1`` tensor."""
    noise = observation_noise.to(device=mean.device, dtype=torch.float64)
    if noise.ndim > 0:
        if noise.shape[-1] != 1:
            raise BotorchTensorDimensionError(
                "`observation_noise` must be a 0-dim tensor or `batch_shape x q x 1`, got "
                f"shape {tuple(observation_noise.shape)}."
            )
        noise = noise.squeeze(-1)
    try:
        return noise.expand(torch.broadcast_shapes(noise.shape, mean.shape))
    except RuntimeError as e:
        raise BotorchTensorDimensionError(
            f"`observation_noise` of shape {tuple(observation_noise.shape)} does not "
            f"broadcast with the posterior's `batch_shape x q` = {tuple(mean.shape)}."
        ) from e
