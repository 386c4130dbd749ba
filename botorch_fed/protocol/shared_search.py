r"""A search that several clients of one process run identically, computed once.

In a global round of FBO-FedGP's paper preset (``global_batch="distinct"``), every
client that drew a global step maximises the same acquisition on the same global
dPITC model with the same seed (each client derives it from the federation's secret,
:meth:`~botorch_fed.algorithms.fbo_fedgp.client.FBOFedGPClient.search_seed`), then takes
the optimum of its rank
(:meth:`~botorch_fed.protocol.bo_client.BOClient.acquire`). On Flower each client
runs that search in its own process, in parallel; in the in-process simulation the
clients run one after the other, so the same search ran ``count`` times. The
in-process runner (:mod:`~botorch_fed.protocol.runner`) gives the clients of a run one
:class:`SharedSearchMemo`, which memoises it: the result is keyed by a SHA-256 digest of
everything it depends on -- the acquisition's class, its and its model's complete
state (every parameter and buffer: for a :class:`~botorch_fed.models.FederatedPITCGP`
the support, the summed summary, the hyperparameters and the record of the state
the summary was computed with), its plain settings (``maximize``), the bounds, the
seed the search actually uses (the secret-derived one under ``ckks`` and ``masking``),
the search options and torch's thread count (which changes the search's last bits).
The model's hyperparameters are checked against its summary first, as the search
would (a kernel's ``nu`` changed since the summary is not state, but raises there). So
a hit returns what the search would have computed, and a client whose model differs in
a single bit computes its own.

The memo belongs to one run and lives only while the run does: it holds candidates
computed under the secret seed, client state shared by the clients of the run, which
live in one process. A deployment (each party in its own process) has none.

Only acquisitions whose state determines them completely are memoised: the analytic
``UpperConfidenceBound`` and ``LogExpectedImprovement`` on a ``FederatedPITCGP``
(an exact GP's training data, for instance, are not in its ``state_dict``).
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

_MEMOISED = (
    UpperConfidenceBound,
    LogExpectedImprovement,
    CachedUpperConfidenceBound,  # what make_step_acquisition builds
    CachedLogExpectedImprovement,
)
_SCALARS = (bool, int, float, str, type(None))


class SharedSearchMemo:
    r"""A small LRU memo of searches keyed by the digest of their complete inputs.

    Args:
        maxsize: Number of searches kept (a round needs one).
    """

    def __init__(self, maxsize: int = 4) -> None:
        if isinstance(maxsize, bool) or not isinstance(maxsize, int) or maxsize < 1:
            raise ValueError(f"`maxsize` must be an int >= 1, got {maxsize!r}.")
        self.maxsize = maxsize
        self._entries: OrderedDict[bytes, Tensor] = OrderedDict()
        self.hits = 0
        self.misses = 0

    @staticmethod
    def supports(acqf: AcquisitionFunction) -> bool:
        r"""Whether ``acqf``'s state determines it completely (see the module docstring)."""
        model = getattr(acqf, "model", None)
        return (
            type(acqf) in _MEMOISED
            and isinstance(model, FederatedPITCGP)
            and not isinstance(model, FederatedPICGP)  # each client's own block
            and getattr(acqf, "posterior_transform", None) is None
        )

    @staticmethod
    def key(acqf: AcquisitionFunction, bounds: Tensor, options: dict) -> bytes:
        r"""SHA-256 digest of the acquisition's class and state, ``bounds`` and
        ``options`` (the seed and the search settings)."""
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
        r"""``compute()``, or the result of an identical earlier search.

        Args:
            acqf: The acquisition the search maximises.
            bounds: ``2 x d`` bounds of the search.
            options: Everything else the search depends on (seed, restarts, ...).
            compute: Runs the search.

        Returns:
            A fresh copy of the search's result.
        """
        if not self.supports(acqf):
            return compute()
        # what the search itself would raise first (modules changed since the summary,
        # including settings that are not state, such as a kernel's ``nu``)
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

    def clear(self) -> None:
        r"""Forget every search."""
        self._entries.clear()
