r"""The state of a dPITC model: the summed summary and what it was computed with.

A :class:`~botorch_fed.models.pitc.FederatedPITCGP` never sees a data point: it predicts
from the summed whitened summary (eq. 9-10 of [FBO-FedGP], App. A), which the clients
computed at the current hyperparameters. :class:`PITCSnapshot`, its base class, holds
that summary and the support set as float64 buffers, records next to them the state of
the shared modules (values, structure, jitter) the summary was computed with, raises
:class:`HyperparametersChangedError` when the modules no longer hold that state, and
caches the factorisations ``L = chol(K_SS)`` and ``chol(I + A~)`` for as long as they
stay valid (also through ``.to``, ``.float()`` and ``.double()``, which keep the summary
and the support in their dtype).

References:

.. [FBO-FedGP] Secure federated Bayesian optimisation with distributed sparse GPs,
   Sec. 2 and App. A (paper 000 in ``shared/papers``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Self

import torch
from botorch import settings as botorch_settings
from botorch.exceptions.errors import BotorchError
from botorch.models.model import Model
from botorch.models.transforms.input import InputTransform
from botorch.models.transforms.outcome import OutcomeTransform
from gpytorch import settings as gpytorch_settings
from gpytorch.kernels import Kernel
from gpytorch.likelihoods import Likelihood
from gpytorch.means import Mean, ZeroMean
from torch import Tensor

from botorch_fed.models.module_state import (
    _fingerprint,
    _state_tensors,
    _structure,
    _structure_key,
    _summary_modules,
)
from botorch_fed.models.pitc_inputs import _check_summary
from botorch_fed.models.sparse_summary import _SUMMARY_FIELDS, SparseSummary, summary_factor
from botorch_fed.models.support_set import DEFAULT_JITTER, support_factor


class HyperparametersChangedError(BotorchError):
    r"""The shared modules no longer hold the hyperparameters a summary was computed with.

    A dPITC summary is a function of the data *and* the hyperparameters; the model
    cannot recompute it (it never sees the data), so predicting would mix new
    hyperparameters with a summary of the old ones.
    """


class PITCSnapshot(Model):
    r"""Base class of :class:`~botorch_fed.models.pitc.FederatedPITCGP`: the summary,
    the record of the state it was computed with, the check against that record and the
    caches (see the module docstring; ``FederatedPITCGP`` documents the guarantees).
    """

    # buffers (registered in ``_setup``; declared for type checkers, which would otherwise
    # see ``nn.Module.__getattr__``'s ``Tensor | Module``)
    support: Tensor
    summary_b: Tensor
    summary_A: Tensor
    summary_quad: Tensor
    summary_logdet: Tensor
    summary_num_data: Tensor
    summary_jitter: Tensor
    summary_hyperparameters: Tensor
    summary_structure: Tensor

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

    def _apply(self, fn: Callable[[Tensor], Tensor], recurse: bool = True) -> Self:
        r"""``.to``, ``.float()``, ``.double()``, ...: the summary, the support it lives
        on and the state it was computed with keep their dtype (only their device
        follows); a dtype conversion of the modules re-records their (converted) values
        if they matched before."""
        names = [f"summary_{n}" for n in _SUMMARY_FIELDS]
        names += ["summary_hyperparameters", "summary_jitter", "support"]
        kept = {n: t for n in names if (t := self._buffers.get(n)) is not None}
        if len(kept) < len(names):  # during construction
            return super()._apply(fn, recurse)
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
        own = [t for n in names if (t := self._buffers[n]) is not None]  # all set above
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
