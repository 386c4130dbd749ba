r"""Federated Thompson sampling with shared random Fourier features (FTS-style baseline).

After Dai, Low and Jaillet, "Federated Bayesian Optimization via Thompson Sampling",
NeurIPS 2020. All clients share ``M`` random Fourier features of an RBF kernel
(drawn from a shared seed); each client keeps the Bayesian linear-regression
posterior of the feature weights ``omega`` given its own (standardised) data and,
every round, sends one posterior sample ``omega_i`` to the server. In round ``t`` a
client does, with probability ``p_t``, ordinary Thompson sampling on its own GP
(BoTorch's pathwise sampling, through :meth:`BOClient.acquire`); otherwise it
maximises the sampled function ``phi(x)' omega_j`` of another client ``j`` that the
server picked at random. The schedule is ``p_t = 1 - 1/t^2`` (the
paper's choice; ``p_1 = 0``).

What is shared: weight samples of the other clients' surrogate functions, never raw
data. Choices of this implementation: a fixed lengthscale shared by all clients (the
mode of BoTorch's dimension-scaled lengthscale prior) -- shared features need a
shared kernel --, unit signal variance on standardised outcomes, noise variance
``1e-2``, and the argmax of ``phi(x)' omega_j`` over a seeded Sobol candidate set.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from botorch.utils.sampling import draw_sobol_samples
from torch import Tensor

from botorch_fed.acquisition import MixingSchedule
from botorch_fed.federation.bo_client import BOClient, BOSettings, numeric_array
from botorch_fed.federation.checkpoint import CheckpointError, check_tensor, split_state
from botorch_fed.federation.messages import Message
from botorch_fed.federation.registry import AlgorithmSpec, register_algorithm
from botorch_fed.federation.roles import FederatedServer

FTS_NUM_FEATURES = 100
FTS_NOISE = 1e-2


def fts_schedule() -> MixingSchedule:
    r"""FTS's local-step probability ``p_t = 1 - 1/t^2``."""
    return MixingSchedule(prob_fn=lambda t: 1.0 - 1.0 / t**2)


def prior_mode_lengthscale(dim: int) -> float:
    r"""Mode of BoTorch's ``LogNormal(sqrt 2 + log(d)/2, sqrt 3)`` lengthscale prior."""
    return math.exp(math.sqrt(2) + 0.5 * math.log(dim) - 3.0)


class RandomFourierFeatures:
    r"""``phi(x) = sqrt(2/M) cos(W x + b)`` for an RBF kernel (unit variance).

    Args:
        dim: Input dimension.
        num_features: ``M``.
        lengthscale: The RBF lengthscale.
        seed: Shared seed (every client draws the same features).
    """

    def __init__(self, dim: int, num_features: int, lengthscale: float, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        self.W = torch.randn(num_features, dim, generator=g, dtype=torch.float64) / lengthscale
        self.b = 2 * math.pi * torch.rand(num_features, generator=g, dtype=torch.float64)
        self.scale = math.sqrt(2.0 / num_features)

    def __call__(self, X: Tensor) -> Tensor:
        r"""``n x M`` features of ``n x d`` inputs."""
        return self.scale * torch.cos(X @ self.W.T + self.b)


class FTSClient(BOClient):
    r"""An FTS client (see the module docstring)."""

    def __init__(self, *args, features: RandomFourierFeatures, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.features = features
        self.schedule = fts_schedule()

    def _omega_sample(self) -> np.ndarray:
        r"""One draw from the posterior of the feature weights given own data."""
        with self.timed("local_fit"):
            y = self.Y.squeeze(-1)
            if len(y):  # (no data while every evaluation failed: the prior)
                y = (y - y.mean()) / (y.std() if len(y) > 1 and y.std() > 0 else 1.0)
            Phi = self.features(self.X)
            M = Phi.shape[-1]
            precision = Phi.T @ Phi / FTS_NOISE + torch.eye(M, dtype=torch.float64)
            L = torch.linalg.cholesky(precision)
            mean = torch.cholesky_solve((Phi.T @ y / FTS_NOISE).unsqueeze(-1), L).squeeze(-1)
            z = torch.randn(M, generator=self.rng, dtype=torch.float64)
            sample = mean + torch.linalg.solve_triangular(L.T, z.unsqueeze(-1), upper=True).squeeze(
                -1
            )
        return sample.numpy()

    def on_init(self, payload: dict) -> dict:
        super().on_init(payload)
        return {"omega": self._omega_sample()}

    def _omega_field(self, payload: dict) -> Tensor | None:
        r"""The other client's weight sample of a round: ``None`` (none sent) or one
        finite number per shared feature, else a ``ProtocolViolation``."""
        if "omega" not in payload:
            return None
        value = payload["omega"]
        omega, M = numeric_array(value), len(self.features.b)
        if omega is None or omega.shape != (M,) or not np.isfinite(omega).all():
            raise self.violation(
                f"`omega` must be {M} finite numbers (a weight sample of the shared "
                f"features), got {value!r:.60}",
                "round",
            )
        return torch.as_tensor(omega)

    def on_round(self, payload: dict) -> dict:
        r"""Round ``{"t", "omega"}``: one step (``t`` and ``omega`` checked first), then
        a fresh weight sample."""
        omega = self._omega_field(payload)
        t = self.accept_round(payload.get("t"), "round")
        local = bool(self.schedule.sample(t, seed=self.rng)) or omega is None
        if local:
            x = self.propose_local(t, kind="ts")
        else:
            with self.timed("acquisition"):
                Xc = draw_sobol_samples(
                    self.bounds, self.settings.ts_candidates, 1, seed=self.step_seed(t)
                ).squeeze(-2)
                x = self.avoid_failures(Xc[(self.features(Xc) @ omega).argmax()].unsqueeze(0))
        self.evaluate(x, t, "local" if local else "federated")
        return {"omega": self._omega_sample()}


class FTSServer(FederatedServer):
    r"""Relays each client a random other client's weight sample every round."""

    def __init__(self, transport, settings: BOSettings, seed: int) -> None:
        super().__init__(transport)
        self.settings = settings
        self.rng = np.random.default_rng(seed)
        self.omegas: dict[int, np.ndarray] = {}  # each client's last weight sample

    def state_dict(self) -> dict:
        r"""Adds the server's generator and the clients' last weight samples."""
        return {
            **super().state_dict(),
            "rng": self.rng.bit_generator.state,
            "omegas": {int(c): torch.from_numpy(np.array(o)) for c, o in self.omegas.items()},
        }

    def load_state_dict(self, state: dict) -> None:
        own, rest = split_state("Server", state, ("rng", "omegas"))
        super().load_state_dict(rest)
        if not isinstance(own["omegas"], dict):
            raise CheckpointError("Server: `omegas` must be a dict of tensors.")
        omegas = {
            int(c): check_tensor("Server", f"omegas[{c}]", o, (FTS_NUM_FEATURES,)).numpy().copy()
            for c, o in own["omegas"].items()
        }
        try:
            self.rng.bit_generator.state = own["rng"]
        except (TypeError, ValueError, KeyError) as exc:
            raise CheckpointError(f"Server: `rng` is not a generator state ({exc}).") from exc
        self.omegas = omegas

    def initialize(self) -> None:
        r"""Initial designs; every client's first weight sample."""
        replies = self.broadcast("init")
        self.omegas = {cid: r.payload["omega"] for cid, r in replies.items()}

    def run_round(self, t: int) -> None:
        r"""Round ``t``: each client gets the last weight sample of a random other client."""
        ids = self.client_ids
        messages = {}
        for cid in ids:
            others = [c for c in ids if c != cid]
            payload = {"t": t}
            if others:
                payload["omega"] = self.omegas[others[self.rng.integers(len(others))]]
            messages[cid] = Message("round", payload)
        replies = self.send(messages)
        self.omegas.update({cid: r.payload["omega"] for cid, r in replies.items()})


def _make_fts_client(ctx, cid: int) -> FTSClient:
    # every client draws the same features from the run's seed (no exchange needed)
    features = RandomFourierFeatures(
        ctx.dim, FTS_NUM_FEATURES, prior_mode_lengthscale(ctx.dim), seed=ctx.setup.seed + 31
    )
    return FTSClient(**ctx.client_arguments(cid), features=features)


register_algorithm(
    AlgorithmSpec(
        name="fts",
        summary=(
            "federated Thompson sampling with shared random Fourier features "
            "(FTS-style baseline, Dai et al. 2020)"
        ),
        settings_class=BOSettings,
        make_client=_make_fts_client,
        make_server=lambda ctx, transport: FTSServer(transport, ctx.settings, seed=ctx.setup.seed),
    )
)
