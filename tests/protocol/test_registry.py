r"""The algorithm registry: look-ups, refusals, and its promise -- a new algorithm is its
own module plus one registration, and ``run_federated`` runs it (and refuses, before the
run, a client that keeps no ``history``).

The toy algorithms below live only in this file (a settings dataclass, a client and a
server built from the existing ``BOClient`` / ``PacingServer`` / ``secure_sum``
pieces); the fixture unregisters them afterwards.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Annotated

import numpy as np
import pytest
import torch

from botorch_fed.algorithms import (
    FBOFedGPSettings,
    available_algorithms,
    build_federation,
    get_algorithm,
    run_federated,
)
from botorch_fed.algorithms.independent import PacingServer
from botorch_fed.problems.objectives import CallableObjective
from botorch_fed.protocol import (
    AlgorithmSpec,
    BOClient,
    BOSettings,
    BuildContext,
    FederatedClient,
    FederationSetup,
    register_algorithm,
    unregister_algorithm,
)
from botorch_fed.protocol.bo_client import Init
from botorch_fed.protocol.declarations import Declared, contributes, declare, handles
from botorch_fed.protocol.round_budget import RoundNumber

pytestmark = pytest.mark.usefixtures("quiet_single_thread")

BUILT_IN = ("central", "fbo-fedgp", "fts", "local", "random")


# --- look-ups -----------------------------------------------------------------------


def test_built_in_algorithms_are_registered():
    names = available_algorithms()
    assert isinstance(names, tuple) and set(BUILT_IN) <= set(names)
    for name in BUILT_IN:
        spec = get_algorithm(name)
        assert spec.name == name
        assert isinstance(spec.summary, str) and spec.summary and "\n" not in spec.summary
        assert callable(spec.make_client) and callable(spec.make_server)
        assert hasattr(spec.settings_class(), "validate")
    assert get_algorithm("fbo-fedgp").settings_class is FBOFedGPSettings
    assert get_algorithm("fbo-fedgp").secure_aggregation is True
    for name in ("local", "central", "fts", "random"):
        assert get_algorithm(name).settings_class is BOSettings
        assert get_algorithm(name).secure_aggregation is False


@pytest.mark.parametrize("name", ["fbo_fedgp", "FBO-FedGP", "", None, ["local"]])
def test_unknown_algorithm_lists_the_known_ones(name):
    with pytest.raises(ValueError, match="Unknown algorithm") as info:
        get_algorithm(name)
    for known in BUILT_IN:
        assert known in str(info.value)
    with pytest.raises(ValueError, match="Unknown algorithm"):
        FederationSetup(problem="branin", num_clients=2).validate(name)


def test_run_federated_refuses_an_unknown_algorithm():
    with pytest.raises(ValueError, match="fbo-fedgp"):
        run_federated("bayesopt", FederationSetup(problem="branin", num_clients=2))


def test_settings_of_another_algorithm_are_refused():
    setup = FederationSetup(problem="branin", num_clients=3)
    with pytest.raises(ValueError, match="FBOFedGPSettings"):
        build_federation("fbo-fedgp", setup, BOSettings(num_init=2, num_rounds=1))
    # a subclass's settings too: their own fields would be silently ignored
    with pytest.raises(ValueError, match="local needs `settings` of type BOSettings"):
        build_federation("local", setup, FBOFedGPSettings(num_init=2, num_rounds=1))


# --- registration -------------------------------------------------------------------


@dataclass
class ToySettings(BOSettings):
    r"""Settings of the toy algorithm: BO settings plus a perturbation size."""

    step: float = 0.1

    def validate(self) -> None:
        super().validate()
        if not 0 < self.step <= 1:
            raise ValueError(f"`step` must be in (0, 1], got {self.step!r}.")


@declare("round")
class PerturbRound(Declared):
    r"""Round ``t``: one perturbation step."""

    t: Annotated[int, RoundNumber()]


class PerturbClient(BOClient):
    r"""Greedy perturbation: evaluate the best own point plus Gaussian noise."""

    @handles(PerturbRound)
    def on_round(self, message: PerturbRound) -> dict:
        t = self.accept_round(message.t, "round")
        if len(self.X) == 0:
            x = torch.rand(1, self.dim, generator=self.rng, dtype=torch.float64)
        else:
            best = self.X[self.Y.argmax()].unsqueeze(0)
            noise = torch.randn(1, self.dim, generator=self.rng, dtype=torch.float64)
            x = (best + self.settings.step * noise).clamp(0.0, 1.0)
        self.evaluate(x, t, "perturb")
        return {}

    @contributes("count")
    def vector_count(self) -> np.ndarray:
        return np.array([float(len(self.X))])


class CountingServer(PacingServer):
    r"""Paces the rounds and securely counts the federation's data after each."""

    def __init__(self, transport, settings, secagg) -> None:
        super().__init__(transport, settings)
        self.secagg = secagg
        self.counts: list[float] = []

    def run_round(self, t: int) -> None:
        super().run_round(t)
        self.counts.append(float(self.secure_sum("count", 1)[0]))


def _make_client(ctx: BuildContext, cid: int) -> PerturbClient:
    secagg = ctx.secagg_clients.get(cid)
    return PerturbClient(**ctx.client_arguments(cid), secagg=secagg)


def _toy_spec(name: str, secure: bool = False) -> AlgorithmSpec:
    if secure:

        def make_server(ctx, transport):
            return CountingServer(transport, ctx.settings, ctx.secagg_server)

    else:

        def make_server(ctx, transport):
            return PacingServer(transport, ctx.settings)

    return AlgorithmSpec(
        name=name,
        summary="greedy perturbation of each client's best point (test toy)",
        settings_class=ToySettings,
        make_client=_make_client,
        make_server=make_server,
        secure_aggregation=secure,
        min_clients=2 if secure else 1,
    )


@pytest.fixture
def toys():
    r"""Register the toy algorithms for one test; unregister them afterwards."""
    specs = [_toy_spec("toy-perturb"), _toy_spec("toy-secure-count", secure=True)]
    before = available_algorithms()
    try:
        for spec in specs:
            assert register_algorithm(spec) is spec
        yield {spec.name: spec for spec in specs}
    finally:
        for spec in specs:
            if spec.name in available_algorithms():
                unregister_algorithm(spec.name)
        assert available_algorithms() == before


def test_registration_rules(toys):
    spec = toys["toy-perturb"]
    names = available_algorithms()
    # registration order: the toys come after the built-in algorithms
    assert names[-2:] == ("toy-perturb", "toy-secure-count")
    assert get_algorithm("toy-perturb") is spec
    # registering the very same spec again is harmless; another spec under the name is not
    assert register_algorithm(spec) is spec
    assert available_algorithms() == names
    with pytest.raises(ValueError, match="already registered"):
        register_algorithm(_toy_spec("toy-perturb"))
    with pytest.raises(ValueError, match="already registered"):
        register_algorithm(_toy_spec("local"))
    assert get_algorithm("toy-perturb") is spec and available_algorithms() == names
    for bad in ("", " toy", "toy ", "two words"):
        with pytest.raises(ValueError, match="lower-case letters"):
            register_algorithm(_toy_spec(bad))
    with pytest.raises(TypeError, match="AlgorithmSpec"):
        register_algorithm({"name": "toy-dict"})
    assert available_algorithms() == names


def test_a_registered_algorithm_runs_through_run_federated(toys, tmp_path):
    def loss(Z):
        return (Z - 0.25).pow(2).sum(-1)

    objectives = [CallableObjective(loss, [[-1.0, -1.0], [1.0, 1.0]]) for _ in range(2)]
    setup = FederationSetup(objectives=objectives, seed=4)
    settings = ToySettings(num_init=3, num_rounds=3, step=0.05)
    result = run_federated("toy-perturb", setup, settings)
    assert result.algorithm == "toy-perturb"
    assert result.steps == {"init": 6, "perturb": 6}
    assert len(result.best_per_round) == 4 and result.failures == []
    assert result.best_per_round == sorted(result.best_per_round, reverse=True)
    assert result.config["settings"]["step"] == 0.05
    json.dumps(result.to_dict(), allow_nan=False)
    # deterministic for a seed
    again = run_federated("toy-perturb", setup, settings)
    assert again.best_per_round == result.best_per_round
    assert again.best_point == result.best_point
    # checkpoint and resume come with the pieces it is built from
    run_federated(
        "toy-perturb", setup, ToySettings(num_init=3, num_rounds=1, step=0.05), checkpoint=tmp_path
    )
    resumed = run_federated("toy-perturb", setup, settings, resume=tmp_path)
    assert resumed.best_per_round == result.best_per_round
    assert resumed.best_point == result.best_point
    # the run validated the toy's settings and refused another algorithm's
    with pytest.raises(ValueError, match="`step`"):
        run_federated("toy-perturb", setup, ToySettings(num_init=2, num_rounds=1, step=2.0))
    with pytest.raises(ValueError, match="ToySettings"):
        run_federated("toy-perturb", setup, BOSettings(num_init=2, num_rounds=1))
    # a built-in problem works the same way
    builtin = run_federated(
        "toy-perturb",
        FederationSetup(problem="branin", num_clients=2, seed=0),
        ToySettings(num_init=2, num_rounds=2),
    )
    assert builtin.regret_per_round is not None and builtin.steps["perturb"] == 4


def test_a_registered_secure_algorithm_gets_the_aggregator(toys):
    objective = CallableObjective(lambda Z: Z.sum(-1), [[0.0, 0.0], [1.0, 1.0]])
    settings = ToySettings(num_init=2, num_rounds=2)
    setup = FederationSetup(
        objectives=objective, num_clients=3, aggregator="masking", crypto_seed=0
    )
    server, clients, _ = build_federation("toy-secure-count", setup, settings)
    assert server.secagg is not None and all(c.secagg is not None for c in clients.values())
    server.run()
    assert server.counts == [9.0, 12.0]  # 3 clients x (2 initial + 1 per round)
    # the setup's checks for secure algorithms apply to it (spec.secure_aggregation)
    with pytest.raises(ValueError, match="`aggregator`"):
        FederationSetup(objectives=objective, num_clients=3, aggregator="rot13").validate(
            "toy-secure-count"
        )
    with pytest.raises(ValueError, match="`num_clients`"):
        FederationSetup(objectives=objective, num_clients=1).validate("toy-secure-count")
    # the non-secure toy has no such role
    server, clients, _ = build_federation(
        "toy-perturb", FederationSetup(objectives=objective, num_clients=1), settings
    )
    assert server.secagg is None and clients[0].secagg is None


class _NoHistoryClient(FederatedClient):
    r"""A user's client that forgot the ``history`` the harness scores."""

    calls: list = []

    def __init__(self, cid, objective):
        super().__init__(cid)
        self.objective = objective

    @handles(Init)
    def on_init(self, message):
        _NoHistoryClient.calls.append("init")
        self.objective.evaluate(torch.rand(1, self.objective.dim, dtype=torch.float64))
        return {}

    @handles(PerturbRound)
    def on_round(self, message):
        _NoHistoryClient.calls.append("round")
        return {}


def test_a_client_without_history_is_refused_before_the_run():
    spec = AlgorithmSpec(
        name="toy-no-history",
        summary="a client without history (test toy)",
        settings_class=BOSettings,
        make_client=lambda ctx, cid: _NoHistoryClient(cid, ctx.objectives[cid]),
        make_server=lambda ctx, transport: PacingServer(transport, ctx.settings),
    )
    register_algorithm(spec)
    _NoHistoryClient.calls = []
    try:
        objective = CallableObjective(lambda Z: Z.sum(-1), [[0.0, 0.0], [1.0, 1.0]])
        setup = FederationSetup(objectives=objective, num_clients=2)
        with pytest.raises((TypeError, ValueError), match="history"):
            run_federated("toy-no-history", setup, BOSettings(num_rounds=2))
        assert _NoHistoryClient.calls == []
    finally:
        unregister_algorithm("toy-no-history")


def test_toys_are_gone_after_the_fixture():
    assert "toy-perturb" not in available_algorithms()
    assert set(available_algorithms()) >= set(BUILT_IN)


def test_unregister_unknown_name_is_refused():
    with pytest.raises(ValueError, match="No algorithm named 'nope'"):
        unregister_algorithm("nope")
