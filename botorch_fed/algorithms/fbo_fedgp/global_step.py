r"""An FBO-FedGP client's global step (Alg. 2 lines 22-27): the global model (the
dPITC model of the summed summaries, or the client's PIC model), the search on it --
seeded by the client itself, from the federation secret where there is one -- and the
checks of what the server sends for it (the round the client drew, a rank below the
count, a summed summary that honest clients can produce; the ranges of rank and count
are declared by :class:`~botorch_fed.algorithms.fbo_fedgp.messages.GlobalStep`).
:class:`GlobalStepClient` is a mixin of
:class:`~botorch_fed.algorithms.fbo_fedgp.client.FBOFedGPClient`.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import numpy as np
import torch
from botorch.acquisition import qLogExpectedImprovement, qUpperConfidenceBound
from torch import Tensor

from botorch_fed.acquisition import MixedLocalGlobalUCB, maximize_step_acquisition
from botorch_fed.algorithms.fbo_fedgp.messages import GlobalStep
from botorch_fed.algorithms.fbo_fedgp.seeds import global_step_seed, secret_step_seed
from botorch_fed.models import FederatedPICGP, FederatedPITCGP, SparseSummary
from botorch_fed.protocol.declarations import handles

if TYPE_CHECKING:
    from botorch.acquisition import AcquisitionFunction

    from botorch_fed.acquisition import MixingSchedule
    from botorch_fed.algorithms.fbo_fedgp.settings import FBOFedGPSettings
    from botorch_fed.protocol.bo_client import BOClient

    _Base = BOClient  # the type checker sees the client this mixin is part of
else:
    _Base = object

_LOG = logging.getLogger("botorch_fed.algorithms.fbo_fedgp.client")  # the algorithm's log


class GlobalStepClient(_Base):
    r"""The global step's message and checks of an FBO-FedGP client (a mixin)."""

    # What this mixin uses of FBOFedGPClient (annotations only: set in its __init__)
    config: FBOFedGPSettings
    run_seed: int | None
    schedule: MixingSchedule
    support: Tensor | None
    _global_round: int | None

    if TYPE_CHECKING:  # FBOFedGPClient's methods

        def global_model(self) -> FederatedPITCGP: ...

        def _transformed_Y(self) -> Tensor: ...

    @handles(GlobalStep)
    def on_global_step(self, message: GlobalStep) -> dict:
        r"""This client's global step of the round it drew one in, as the ``rank``-th
        of ``count`` global clients (refused unless ``rank < count``: a server that
        picked ranks freely could steer a client to a point of its choosing)."""
        t, rank, count = message.t, message.rank, message.count
        if self._global_round is None or t != self._global_round:
            raise self.violation(
                f"a global step for round {t}, but this client drew "
                + (
                    "no global step"
                    if self._global_round is None
                    else f"round {self._global_round}"
                ),
                "global_step",
            )
        self._global_round = None  # one global step per draw
        if rank >= count:
            raise self.violation(
                f"a global step of rank {rank} among {count} clients: needs rank < count",
                "global_step",
            )
        if not self._global_summary_usable():
            # only a forged sum gets here; refusing would be a bit of the sum (under
            # ckks the server never sees it), so the client takes a local step instead
            _LOG.warning(
                "Client %s, round %s: the summed summary is no honest sum (I + A not "
                "positive definite with margin, or not finite); a local step instead",
                self.client_id,
                t,
            )
            self.evaluate(self.propose_local(t), t, "local")
            return {}
        model = self.global_model()
        if self.config.global_model == "pic" and len(self.X) > 0:
            with self.timed("global_model"):
                model = FederatedPICGP.from_pitc(model, self.X, self._transformed_Y())
        if self.config.mixing == "expected" and len(self.X) > 0:
            acqf: AcquisitionFunction | None = MixedLocalGlobalUCB(
                self.local_model(),
                model,
                beta=self.config.beta_at(t, self.dim),
                p_local=self.schedule.prob_local(t),
                mode="expected",
            )
            x = self.acquire(model, t, acqf=acqf)
        elif self.config.global_batch == "batch" and count > 1:
            x = self._batch_point(model, t, rank, count, self.search_seed(t))
        elif self.config.global_batch == "distinct" and self.config.acquisition != "ts":
            # every global client of round t holds the same model: same seeded search,
            # then one distinct optimum each (see BOClient.acquire). The acquisition must
            # be the same on every client too: EI's incumbent is taken from the shared
            # model (its best posterior mean on the support), not from local data.
            acqf = None
            if self.config.acquisition == "ei":
                assert self.support is not None  # global_model() requires it
                with torch.no_grad():
                    # botorch's Posterior declares no `mean`; the model's posterior is a
                    # GPyTorchPosterior
                    best_f = model.posterior(self.support).mean.max()  # type: ignore[attr-defined]
                acqf = self.make_acquisition(model, t, best_f=best_f)
            seed = self.search_seed(t)
            x = self.acquire(model, t, acqf=acqf, rank=rank, count=count, seed=seed)
        elif self.config.global_model == "pitc":
            # a search of this client's own on the shared model (Thompson sampling,
            # "independent", a batch of one): the server may hold that model too
            x = self.acquire(model, t, seed=self.search_seed(t, own=True))
        else:  # the client's PIC model, which holds its own data
            x = self.acquire(model, t)
        self.evaluate(x, t, "global")
        return {}

    def federation_secret(self) -> bytes | None:
        r"""The secret this client shares with the other clients and not with the
        server (:meth:`~botorch_fed.secure.client_role.ClientRole.federation_secret` of its
        secure-aggregation role; ``None`` under ``plaintext`` or without a role)."""
        if self.secagg is None:
            return None
        return self.secagg.federation_secret()

    def search_seed(self, t: int, *, own: bool = False) -> int:
        r"""The seed of round ``t``'s search on the shared dPITC model, derived by the
        client itself (the server sends none).

        With a federation secret (``ckks``, ``masking``): :func:`secret_step_seed` of
        the secret, the run seed and ``t`` -- the same on every client of the
        federation, so the shared search of ``global_batch`` "distinct" / "batch" is
        still one search, and unpredictable to the server, which therefore cannot
        replay it. Without one (``plaintext``): the public :func:`global_step_seed`
        (or, with ``own``, the client's public :meth:`step_seed`), which the server can
        recompute.

        Args:
            t: The round.
            own: A search of this client's only (its id enters the derivation).

        Raises:
            ProtocolViolation: The client has no run seed.
        """
        if self.run_seed is None:
            raise self.violation(
                "no run seed to derive the round's search seed from (pass `run_seed`)",
                "global_step",
            )
        secret = self.federation_secret()
        if secret is None:
            return self.step_seed(t) if own else global_step_seed(self.run_seed, t)
        return secret_step_seed(secret, self.run_seed, t, client_id=self.client_id if own else None)

    def _global_summary_usable(self) -> bool:
        r"""Whether the summed summary (``last_sum``) is one honest clients can produce:
        finite, of the support's packed length, and with ``I + A`` positive definite
        with margin (``A`` is a sum of positive semi-definite matrices: every
        eigenvalue of ``I + A`` is at least 1; the check asks ``A + I/2`` for a Cholesky
        factor). A server that offset a CKKS sum could otherwise make the model's
        factorisation fail -- or not -- depending on the sum."""
        if self.last_sum is None or self.support is None:
            return False
        m = len(self.support)
        if self.last_sum.shape != (SparseSummary.packed_length(m),):
            return False
        if not np.isfinite(self.last_sum).all():
            return False
        A = SparseSummary.from_numpy(self.last_sum, m).A
        eye = torch.eye(m, dtype=A.dtype)
        _, info = torch.linalg.cholesky_ex(A + 0.5 * eye)
        return int(info) == 0

    def _batch_point(
        self, model: FederatedPITCGP, t: int, rank: int, count: int, seed: int
    ) -> Tensor:
        r"""This client's point of the round's shared sequential-greedy ``q``-batch on
        the shared dPITC model (every global client computes the same batch from the
        same model and seed, and takes the point of its rank)."""
        s = self.config
        if s.acquisition == "ucb":
            acqf: AcquisitionFunction = qUpperConfidenceBound(model, beta=s.beta_at(t, self.dim))
        else:  # EI's incumbent from the shared model, as for "distinct"
            assert self.support is not None  # global_model() requires it
            with torch.no_grad():
                # botorch's Posterior declares no `mean`; the model's posterior is a
                # GPyTorchPosterior
                best_f = model.posterior(self.support).mean.max()  # type: ignore[attr-defined]
            acqf = qLogExpectedImprovement(model, best_f=best_f)
        with self.timed("acquisition"):
            X = maximize_step_acquisition(
                acqf,
                self.bounds,
                seed=seed,
                q=count,
                num_restarts=s.num_restarts,
                raw_samples=s.raw_samples,
                maxiter=s.maxiter,
                sequential=True,
            )
        x = X[rank].reshape(1, self.dim).clamp(0.0, 1.0)
        return self.avoid_failures(x)
