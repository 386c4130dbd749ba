r"""Alg. 3 of [LDP-BO], (LDP-)MoMA-GP-UCB: epochs of repeated plays, median of means.

:class:`MoMAGPUCB` plays one point ``k`` times per epoch; at the end of an epoch it
builds a Nystrom embedding of the epoch points, ``k`` least-squares estimates (one per
play index) and picks one by median of means. Its work is done once per epoch.

References:

.. [LDP-BO] X. Zhou, J. Tan. Local differential privacy for Bayesian optimization
   (paper 002 in ``shared/papers``).
"""

from __future__ import annotations

import torch
from torch import Tensor

from botorch_fed.ldp import parameters as P
from botorch_fed.ldp.ucb_learner import UCBLearner
from botorch_fed.models import (
    FeatureSpaceGP,
    NystromEmbedding,
    median_of_means_estimate,
    ridge_estimate,
    sample_dictionary,
)


class MoMAGPUCB(UCBLearner):
    r"""Alg. 3, (LDP-)MoMA-GP-UCB: epochs of ``k`` plays of one point; at the end of epoch
    ``n`` a Nystrom embedding of the ``n`` epoch points, ``k`` least-squares estimates (one
    per play index ``j``) and the median-of-means pick ``k*``.

    Plays beyond the last full epoch (``T`` not a multiple of ``k``) keep playing the next
    epoch's point; they do not change the surrogate.

    Args:
        *args, **kwargs: As :class:`UCBLearner`.
        accuracy: The Nystrom accuracy ``epsilon`` of Thm. 4 (in (0, 1)).
        q: The dictionary rate (``None``: ``6 rho ln(4 T / delta) / accuracy^2``).
        k: Plays per epoch (``None``: ``ceil(24 ln(4 e T / delta))``).
    """

    name = "moma"

    def __init__(
        self,
        *args,
        accuracy: float = 0.5,
        q: float | None = None,
        k: int | None = None,
        **kwargs,
    ) -> None:
        P.rho(accuracy)
        if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 1):
            raise ValueError(f"`k` must be a positive integer, got {k!r}.")
        self.accuracy = float(accuracy)
        self.q_override = None if q is None else P._positive("q", q)
        self.k_override = k
        super().__init__(*args, **kwargs)
        if self.k > self.horizon:
            raise ValueError(
                f"MoMA-GP-UCB plays each point k={self.k} times per epoch, more than the "
                f"horizon T={self.horizon}: no epoch would complete. Give a smaller `k` "
                "(`plays_per_epoch`; the paper's ceil(24 ln(4 e T / delta)) needs T > k)."
            )
        self._epoch_point: Tensor | None = None
        self.chosen: list[int] = []  # k* of every epoch

    @property
    def q(self) -> float:
        if self.q_override is not None:
            return self.q_override
        return P.nystrom_rate(self.horizon, self.delta, self.accuracy)

    @property
    def k(self) -> int:
        if self.k_override is not None:
            return self.k_override
        return P.plays_per_epoch(self.horizon, self.delta)

    @property
    def epochs(self) -> int:
        r"""Completed epochs ``n``."""
        return self.t // self.k

    def beta_formula(self) -> float:
        rw = self.rewards
        return P.moma_beta(
            rw.B, self.accuracy, rw.noise_second_moment, self.model.embedding.dim, self.lam
        )

    def propose(self) -> Tensor:
        if self.t % self.k == 0 or self._epoch_point is None:  # a new epoch: a UCB step
            self._epoch_point = super().propose()
        return self._epoch_point.clone()

    def observe(self, x: Tensor, y: float | Tensor) -> None:
        x = torch.as_tensor(x, dtype=torch.float64).reshape(1, -1)
        if self.t % self.k == 0:  # an epoch starts: its first play is its point
            self._epoch_point = x.clone()
        elif self._epoch_point is not None and not torch.equal(x, self._epoch_point):
            raise ValueError(
                f"MoMA-GP-UCB plays one point per epoch: `x`={x.tolist()} is not the epoch's "
                f"point {self._epoch_point.tolist()}."
            )
        super().observe(x, y)

    def _variance(self, X: Tensor) -> Tensor:
        return torch.zeros(len(X), dtype=torch.float64)  # gamma is not used by MoMA

    def _update(self) -> None:
        if self.t % self.k == 0:
            self._model = self._estimate(self.epochs, self.model)

    def _epoch_data(self) -> tuple[Tensor, Tensor]:
        r"""The completed epochs' points (``n x d``) and rewards (``n x k``: column ``j``
        holds the ``j``-th play of every epoch)."""
        n, k = self.epochs, self.k
        return self.X[: n * k : k], self.y[: n * k].reshape(n, k)

    def _estimate(self, n: int, previous: FeatureSpaceGP) -> FeatureSpaceGP:
        points, Y = self._epoch_data()
        variances = previous.mean_and_variance(points)[1]  # sigma~_{n-1}(x_i), Alg. 3 line 7
        index = sample_dictionary(points, variances, self.q, generator=self.generator)
        embedding = NystromEmbedding(self.kernel, points[index])
        Phi = embedding(points)
        theta, chosen = median_of_means_estimate(Phi, Y, self.lam)
        self.chosen.append(int(chosen))
        return FeatureSpaceGP(embedding, theta, Phi.mT @ Phi, self.lam)

    def state_dict(self) -> dict:
        return {
            **super().state_dict(),
            "dictionary": self.model.embedding.dictionary.clone(),
            "epoch_point": None if self._epoch_point is None else self._epoch_point.clone(),
            "chosen": list(self.chosen),
        }

    def load_state_dict(self, state: dict) -> None:
        state = dict(state)
        self._dictionary = torch.as_tensor(state.pop("dictionary"), dtype=torch.float64)
        epoch_point = state.pop("epoch_point")
        self.chosen = [int(c) for c in state.pop("chosen")]
        self._epoch_point = (
            None if epoch_point is None else torch.as_tensor(epoch_point, dtype=torch.float64)
        )
        super().load_state_dict(state)

    def _rebuild(self) -> None:
        if self.epochs == 0:
            self._model = self._prior()
            return
        if len(self.chosen) != self.epochs:
            raise ValueError(
                f"Learner state: `chosen` has {len(self.chosen)} entries for {self.epochs} epochs."
            )
        points, Y = self._epoch_data()
        self._check_dictionary(points)
        embedding = NystromEmbedding(self.kernel, self._dictionary)
        Phi = embedding(points)
        theta = ridge_estimate(Phi, Y[:, self.chosen[-1]], self.lam)  # theta_{n, k*}
        self._model = FeatureSpaceGP(embedding, theta, Phi.mT @ Phi, self.lam)
