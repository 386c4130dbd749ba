r"""Alg. 1 of [LDP-BO], (LDP-)ATA-GP-UCB: Nystrom features and TOFU truncation.

:class:`ATAGPUCB` samples a fresh Nystrom dictionary every round (probabilities
``min(q sigma~^2_{t-1}, 1)``, Alg. 4) and truncates every past payoff feature-adaptively
(TOFU); it re-truncates the whole history every round, as Alg. 1 prescribes (``O(t m^2)``
a round: the paper's reason for MoMA, :mod:`~botorch_fed.ldp.moma`).

References:

.. [LDP-BO] X. Zhou, J. Tan. Local differential privacy for Bayesian optimization
   (paper 002 in ``shared/papers``).
"""

from __future__ import annotations

import torch
from torch import Tensor

from botorch_fed.ldp import parameters as P
from botorch_fed.ldp.ucb_learner import UCBLearner
from botorch_fed.models import FeatureSpaceGP, NystromEmbedding, ata_estimate


class ATAGPUCB(UCBLearner):
    r"""Alg. 1, (LDP-)ATA-GP-UCB: Nystrom features resampled every round and TOFU's
    feature-adaptive truncation of every past payoff at ``b_t = sqrt(v / ln(4 m_t T / delta))``.

    Every past payoff is truncated at the *current* ``b_t`` (the threshold of Thm. 2 at
    round ``t``, as TOFU [Shao et al. 2018] truncates all payoffs at round ``t``); Alg. 1
    line 10 writes ``b_tau``, which with ``alpha = 1`` differs only through ``m_tau``.

    Args:
        *args, **kwargs: As :class:`UCBLearner`.
        accuracy: The Nystrom accuracy ``epsilon`` of Thm. 2 (in (0, 1)).
        q: The dictionary rate (``None``: ``6 rho ln(4 T / delta) / accuracy^2``).
        truncation_scale: A factor on ``b_t``.
    """

    name = "ata"

    def __init__(
        self,
        *args,
        accuracy: float = 0.5,
        q: float | None = None,
        truncation_scale: float = 1.0,
        **kwargs,
    ) -> None:
        P.rho(accuracy)
        self.accuracy = float(accuracy)
        self.q_override = None if q is None else P._positive("q", q)
        self.truncation_scale = P._positive("truncation_scale", truncation_scale)
        self.truncated = 0  # truncated terms in the last estimate
        super().__init__(*args, **kwargs)

    @property
    def q(self) -> float:
        if self.q_override is not None:
            return self.q_override
        return P.nystrom_rate(self.horizon, self.delta, self.accuracy)

    def beta_formula(self) -> float:
        rw, m = self.rewards, self.model.embedding.dim
        return P.ata_beta(
            rw.B, self.accuracy, rw.reward_second_moment, m, self.horizon, self.delta, self.lam
        )

    def _variance(self, X: Tensor) -> Tensor:
        return torch.zeros(len(X), dtype=torch.float64)  # gamma is not used by ATA

    def _update(self) -> None:
        # Alg. 4 on the plays x_1..x_t with sigma~_{t-1}(x_i) (Alg. 1 line 6): each play
        # enters with probability p = min(q sigma~^2, 1) and the dictionary is the set of
        # points drawn, so a point played n times enters with probability 1 - (1 - p)^n
        # -- drawn here once per distinct point (same distribution, O(distinct) draws)
        variances = self.model.mean_and_variance(self._points)[1].clamp_min(0.0)
        p = (self.q * variances).clamp_max(1.0)
        u = torch.rand(len(p), generator=self.generator, dtype=torch.float64)
        self._model = self._fit(self._points[u < 1 - (1 - p) ** self._counts])

    def _fit(self, dictionary: Tensor) -> FeatureSpaceGP:
        r"""Alg. 1 lines 7-13 on the dictionary ``dictionary``."""
        embedding = NystromEmbedding(self.kernel, dictionary)
        Phi_points = embedding(self._points)  # distinct points x m
        Phi = Phi_points[self._inverse]  # every play, t x m
        b = self.truncation_scale * P.ata_truncation(
            self.rewards.reward_second_moment, embedding.dim, self.horizon, self.delta
        )
        theta, self.truncated = ata_estimate(Phi, self.y, self.lam, torch.full_like(self.y, b))
        gram = Phi_points.mT @ (self._counts.unsqueeze(-1) * Phi_points)
        return FeatureSpaceGP(embedding, theta, gram, self.lam)

    def state_dict(self) -> dict:
        return {**super().state_dict(), "dictionary": self.model.embedding.dictionary.clone()}

    def load_state_dict(self, state: dict) -> None:
        state = dict(state)
        self._dictionary = torch.as_tensor(state.pop("dictionary"), dtype=torch.float64)
        super().load_state_dict(state)

    def _rebuild(self) -> None:
        self._check_dictionary(self._points)
        self._model = self._fit(self._dictionary) if self.t else self._prior()
