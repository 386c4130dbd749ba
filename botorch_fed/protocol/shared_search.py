r"""A search that several clients of one process run identically, computed once.

FBO-FedGP's clients of a distinct global batch run one seeded search
(:meth:`~botorch_fed.protocol.bo_client.BOClient.acquire`); in process, the run's
:class:`SharedSearchMemo` runs it once, keyed by a digest of everything it depends on (a
client whose inputs differ in one bit computes its own). Only analytic UCB / log-EI on a
``FederatedPITCGP`` are memoised: their state determines them completely.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Callable

import torch
from botorch.acquisition.acquisition import AcquisitionFunction
from botorch.acquisition.analytic import LogExpectedImprovement, UpperConfidenceBound
from torch import Tensor

from botorch_fed.acquisition import CachedLogExpectedImprovement, CachedUpperConfidenceBound
from botorch_fed.models import FederatedPICGP, FederatedPITCGP
from botorch_fed.protocol.declarations import Int, check_value

_MEMOISED: tuple[type, ...] = (UpperConfidenceBound, LogExpectedImprovement)
_MEMOISED += (CachedUpperConfidenceBound, CachedLogExpectedImprovement)  # make_step_acquisition's
_SCALARS = (bool, int, float, str, type(None))


class SharedSearchMemo:
    r"""An LRU memo of ``maxsize`` searches keyed by the digest of their inputs."""

    def __init__(self, maxsize: int = 4) -> None:
        self.maxsize = check_value("maxsize", maxsize, Int(1))
        self._entries: OrderedDict[bytes, Tensor] = OrderedDict()
        self.hits = self.misses = 0

    @staticmethod
    def supports(acqf: AcquisitionFunction) -> bool:
        r"""Whether ``acqf``'s state determines it completely."""
        model = getattr(acqf, "model", None)
        return (
            type(acqf) in _MEMOISED
            and isinstance(model, FederatedPITCGP)
            and not isinstance(model, FederatedPICGP)  # each client's own block
            and getattr(acqf, "posterior_transform", None) is None
        )

    @staticmethod
    def key(acqf: AcquisitionFunction, bounds: Tensor, options: dict) -> bytes:
        r"""SHA-256 of the acquisition's class, settings and state, ``bounds`` and
        ``options``."""
        h = hashlib.sha256()
        h.update(f"{type(acqf).__module__}.{type(acqf).__qualname__}".encode())
        h.update(f"{type(acqf.model).__module__}.{type(acqf.model).__qualname__}".encode())
        h.update(repr(sorted(options.items())).encode())
        # the acquisition's plain settings (e.g. ``maximize``), which are not state
        settings = sorted(
            (k, v) for k, v in vars(acqf).items() if k != "training" and isinstance(v, _SCALARS)
        )
        h.update(repr(settings).encode())
        items = sorted(acqf.state_dict().items())
        for name, t in [*items, ("bounds", bounds)]:
            t = t.detach().cpu().contiguous()
            h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
            h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
        return h.digest()

    def __call__(
        self,
        acqf: AcquisitionFunction,
        bounds: Tensor,
        options: dict,
        compute: Callable[[], Tensor],
    ) -> Tensor:
        r"""``compute()``, or a copy of the result of an identical earlier search of
        ``acqf`` within ``bounds`` under ``options`` (seed, restarts, ...)."""
        if not self.supports(acqf):
            return compute()
        # what the search would raise first (e.g. a kernel's ``nu`` changed since the summary)
        model = acqf.model
        assert isinstance(model, FederatedPITCGP)  # what supports() admits
        model.check_hyperparameters()
        key = self.key(acqf, bounds, options)
        cached = self._entries.get(key)
        if cached is not None:
            self._entries.move_to_end(key)
            self.hits += 1
            return cached.clone()
        result = compute()
        self.misses += 1
        self._entries[key] = result.detach().clone()
        while len(self._entries) > self.maxsize:
            self._entries.popitem(last=False)
        return result
