r"""What the server chooses for an FBO-FedGP client to compute on lies in a declared
domain, checked before private data is touched; no refusal depends on private data.

The attack these tests mount (an independent review, under ``ckks`` with the default
policy): the server puts the support on a client's public initial point, sends a tiny
lengthscale and noise and a far mean constant, and asks for raw floats (``wide=0``);
the largest entry of the client's summary is then about ``(y_k - m)^2 / Lambda_kk``,
and whether it fits the encoding -- a refusal -- tells the server a bit of ``y_k``.
"""

from __future__ import annotations

import itertools
import logging

import numpy as np
import pytest
import torch
from botorch.models.transforms.outcome import Standardize

from botorch_fed.algorithms import FBOFedGPSettings, build_federation
from botorch_fed.algorithms.fbo_fedgp.domain import MEAN_RANGE, clamp_to_domain, outcome_bound
from botorch_fed.models import PITCHyperparameters, SparseSummary, compute_local_summary
from botorch_fed.protocol import FederatedClient, FederationSetup, Message, ProtocolViolation
from botorch_fed.protocol.declarations import contributes
from botorch_fed.secure import get_backend
from botorch_fed.secure.crypto import MAC_SIZE
from tests.helpers.federation_runs import backend_params
from tests.helpers.secure_roles import make_roles

pytestmark = pytest.mark.usefixtures("quiet_single_thread")

M, NUM_INIT, NUM_ROUNDS = 3, 4, 3
ATTACK_THETA = np.array([1e-3, 1e-3, 1e-12, -10.0])  # lengthscales, noise, mean


def _federation(aggregator="plaintext", num_clients=M, **settings):
    setup = FederationSetup(
        problem="branin",
        dim=2,
        num_clients=num_clients,
        seed=0,
        crypto_seed=0,
        aggregator=aggregator,
    )
    base = dict(
        num_init=NUM_INIT, num_rounds=NUM_ROUNDS, support_size=4, raw_samples=16, maxiter=20
    )
    server, clients, _ = build_federation(
        "fbo-fedgp", setup, FBOFedGPSettings(**{**base, **settings})
    )
    server.initialize()
    return server, clients


def _round(server, t):
    server.ledger.round = t
    server.broadcast("round", {"t": t})


def _standardize(server):
    r"""The round's outcome moments summed, their results delivered (the server carries
    a sum's closing steps with its next message: ``flush`` sends them now)."""
    server.standardize_outcomes()
    server.flush()


def _support_on(server, point):
    server.support = point
    server.broadcast("support", {"support": point.numpy()})


def _length(server):
    return SparseSummary.packed_length(len(server.support))


def _fit_length(server):
    r"""A ``pitc_summary`` vector: the packed summary, then its Jacobian."""
    return _length(server) * (1 + server.hyper.size)


def _x0(client):
    r"""Where a fit starts: the client's current hyperparameters, clamped into the domain."""
    theta = PITCHyperparameters(*client.modules).get_theta()
    return clamp_to_domain(theta, client.theta_domain)


def _start(server, federation, **kwargs):
    r"""A fit's first evaluation (index 0, untagged, at the current hyperparameters)."""
    args = {"theta": _x0(federation[1]), "tag": b"", "index": 0}
    return server.secure_sum("pitc_summary", _fit_length(server), args, **kwargs)


def _feed(server):
    r"""The coordinator fed the last sum (carried with the feed): its next iterate."""
    return server.send({0: Message("hyper_feed")})[0].payload


def _as_first_session(clients):
    r"""Forget which clients the round's sums were over, as if the next session were the
    round's first: the checks below each stand alone (the one-set-of-clients rule, which
    would refuse a subset first, has its own test)."""
    for client in clients.values():
        client._cohort = None


def _iterate_args(reply):
    return {"theta": reply["theta"], "tag": reply["tag"], "index": reply["index"]}


def _endless(monkeypatch, coordinator):
    r"""A malicious coordinator (another party): one more iterate after every feed."""
    monkeypatch.setattr(
        type(coordinator),
        "on_hyper_feed",
        lambda self, message: self._hyper_reply(self._pending_theta + 1e-3),
    )


def _counting(monkeypatch, cls, name):
    calls = []
    original = getattr(cls, name)

    def wrapped(self, *args, **kwargs):
        calls.append(self)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(cls, name, wrapped)
    return calls


# --- hyperparameters ----------------------------------------------------------------
@pytest.mark.parametrize(
    "theta",
    [
        ATTACK_THETA,
        np.array([0.02, 0.5, 1e-2, 0.0]),  # a lengthscale below BoTorch's 0.025
        np.array([0.5, 0.5, 1e-5, 0.0]),  # noise below 1e-4
        np.array([0.5, 0.5, 1e-2, MEAN_RANGE[0] - 1e-9]),  # the mean just outside
        np.array([0.5, 0.5, 1e-2, 1e6]),
        np.array([0.5, 0.5, np.nan, 0.0]),
        np.array([0.5, 0.5, 1e-2]),  # wrong length
    ],
    ids=["attack", "lengthscale", "noise", "mean edge", "mean far", "nan", "short"],
)
def test_a_theta_outside_the_domain_is_refused_before_any_private_computation(theta, monkeypatch):
    from botorch_fed.models import PITCFitClient

    server, clients = _federation(aggregator="ckks", hyperparameters="federated")
    _round(server, 1)
    summaries = _counting(monkeypatch, PITCFitClient, "summary")
    _standardize(server)
    with pytest.raises(ProtocolViolation, match="outside the declared domain|must be an array"):
        server.secure_sum("pitc_summary", _length(server), {"theta": theta})
    with pytest.raises(ProtocolViolation, match="outside the declared domain"):
        server.broadcast("apply_theta", {"theta": theta})
    assert summaries == []
    hyper = PITCHyperparameters(*clients[0].modules)
    assert hyper.get_theta().shape != theta.shape or not np.array_equal(hyper.get_theta(), theta)


def test_the_domain_holds_botorchs_bounds_and_a_finite_mean_range():
    _, clients = _federation()
    domain = clients[0].theta_domain
    np.testing.assert_allclose(domain[:, 0], [0.025, 0.025, 1e-4, MEAN_RANGE[0]], rtol=1e-6)
    assert np.isfinite(domain).all() and (domain[:, 0] < domain[:, 1]).all()
    values = np.array([1e-9, 1e9, np.nan, -1e9])
    np.testing.assert_array_equal(
        clamp_to_domain(values, domain), [domain[0, 0], domain[1, 1], domain[2].mean(), -10.0]
    )


# --- the encoding ---------------------------------------------------------------------
@pytest.mark.parametrize(("request_", "wide"), [("summary", 0), ("summary", 32), ("moments", 64)])
def test_the_server_cannot_choose_a_sums_encoding(request_, wide):
    server, _ = _federation(aggregator="ckks")
    _round(server, 1)
    if request_ == "summary":
        _standardize(server)
    with pytest.raises(ProtocolViolation, match=r"`wide`=.*this client sends"):
        server.secure_sum(request_, 4 if request_ == "summary" else 189, wide=wide)


def test_honest_vectors_at_every_corner_of_the_domain_fit_the_encoding_far_below_its_range():
    # The worst case the domain allows: every outcome at the bound Z (a forged moments
    # sum gave a standard deviation of 1e-8), the support on one of the client's own
    # points, lengthscales and noise at their least and largest, the mean at +-10: the
    # client's fit summary (what `vector_pitc_summary` sends) at each corner.
    from botorch_fed.models import PITCFitClient

    server, clients = _federation(hyperparameters="federated")
    victim = clients[1]
    _round(server, 1)
    _standardize(server)
    forged = Standardize(m=1)
    forged.eval()
    forged.means = torch.zeros(1, 1, dtype=torch.float64)
    forged.stdvs = torch.full((1, 1), 1e-8, dtype=torch.float64)
    forged._stdvs_sq = forged.stdvs**2
    victim.Y = torch.full_like(victim.Y, 1e6)
    victim.standardize = forged
    support = victim.X[:1].clone()
    fit = PITCFitClient(victim.X, victim._transformed_Y(), support, *victim.modules)
    domain = victim.theta_domain
    corners = [
        np.array([ls, ls, noise, mean])
        for ls, noise, mean in itertools.product(domain[0], domain[2], domain[3])
    ]
    peak = max(float(np.abs(fit.summary(theta)).max()) for theta in corners)
    assert peak < 2.0**64 * 1e-6
    # and the Jacobian that travels with it (the same sum)
    slopes = max(float(np.abs(fit.summary_and_jacobian(theta)[1]).max()) for theta in corners)
    assert np.isfinite(slopes) and slopes < 2.0**64 * 1e-6
    # what the bound on the outcomes prevents: unclamped, the same corner overflows
    z = forged(victim.Y)[0]
    assert float(z.abs().max()) > 1e13 > outcome_bound(M, NUM_INIT, NUM_ROUNDS)
    PITCHyperparameters(*victim.modules).set_theta(domain[:, 0])
    raw = compute_local_summary(victim.X, z, support, *victim.modules).to_numpy()
    assert float(np.abs(raw).max()) > 2.0**64


@pytest.mark.parametrize("name", backend_params("ckks"))
def test_whether_a_client_answers_does_not_depend_on_its_outcomes(name):
    # The server's strategy of the review within what the clients accept: the support on
    # the victim's point, in two worlds whose victim's first outcome differs by 10^6
    # standard deviations. Every client answers the coordinator's fit evaluation and the
    # summary sum in both (no refusal bit), and the sums stay on the clients.
    answered = []
    for outlier in (0.0, 1e6):
        server, clients = _federation(aggregator=name, hyperparameters="federated")
        victim = clients[1]
        victim.Y[0] = victim.Y[0] + outlier
        _round(server, 1)
        _standardize(server)
        _support_on(server, victim.X[:1].clone())
        fit = _start(server, clients)
        total = server.secure_sum("summary", _length(server))
        server.flush()  # the results (and, under ckks, the decryption) go to every client
        answered.append((fit, total, all(c.last_sum is not None for c in clients.values())))
    assert answered == [(None, None, True), (None, None, True)]


# --- the standardisation ----------------------------------------------------------------
def test_a_forged_standardisation_is_clamped_not_refused():
    server, clients = _federation()
    victim = clients[0]
    _round(server, 1)
    _standardize(server)
    victim.standardize.stdvs.fill_(1e-8)
    victim.standardize._stdvs_sq.fill_(1e-16)
    victim.standardize.means.fill_(float(victim.Y.mean()) + 1.0)
    Z = outcome_bound(M, NUM_INIT, NUM_ROUNDS)
    z = victim._transformed_Y()
    assert float(z.abs().max()) == pytest.approx(Z)
    total = server.secure_sum("summary", _length(server))  # plaintext: the server sums
    assert np.isfinite(total).all()


def test_honest_standardised_outcomes_never_reach_the_bound():
    # Samuelson's inequality, at its extreme: one outlier among N - 1 equal outcomes
    # lies (N - 1) / sqrt(N) sample standard deviations from the mean, below sqrt(N).
    for n in (2, 3, 21, 1000):
        y = torch.zeros(n, 1, dtype=torch.float64)
        y[0] = 1.0
        tf = Standardize(m=1)
        tf.train()
        z = tf(y)[0]
        assert float(z.abs().max()) == pytest.approx((n - 1) / n**0.5)
        assert float(z.abs().max()) < outcome_bound(1, n, 0)


# --- the federated fit (F7) ---------------------------------------------------------------
@pytest.mark.parametrize("name", ["plaintext", "masking"])
def test_a_fits_first_evaluation_elsewhere_or_tagged_is_refused_before_any_private_computation(
    name, monkeypatch
):
    # index 0 is the one untagged evaluation: were it free, a server would choose any
    # theta (e.g. the review's attack within the domain) and, under plaintext, read the
    # summed summary there; every client checks it is its current hyperparameters
    from botorch_fed.models import PITCFitClient

    server, clients = _federation(aggregator=name, hyperparameters="federated", num_clients=4)
    _round(server, 1)
    _standardize(server)
    computed = _counting(monkeypatch, PITCFitClient, "summary_and_jacobian")
    x0 = _x0(clients[1])
    chosen = x0.copy()
    chosen[-1] += 0.5  # inside the domain, but the server's
    others = {"clients": (1, 2, 3)} if name == "masking" else {}  # the coordinator dropped
    for args, session in (
        ({"theta": chosen, "tag": b"", "index": 0}, {}),
        ({"theta": chosen, "tag": b"", "index": 0}, others),
        ({"theta": x0, "tag": bytes(MAC_SIZE), "index": 0}, {}),
        ({"theta": x0, "tag": bytes(MAC_SIZE), "index": 0}, others),
    ):
        first = 0 if not session else 1
        _as_first_session(clients)
        with pytest.raises(
            ProtocolViolation, match=f"Client {first}.*index 0.*current hyperparameters"
        ):
            server.secure_sum("pitc_summary", _fit_length(server), args, **session)
    assert computed == []
    assert all(c._minimizer is None for c in clients.values())
    _as_first_session(clients)
    _start(server, clients)  # the honest start is summed
    server.flush()
    assert len(computed) == 4 and all(c.last_sum is not None for c in clients.values())


def test_a_second_start_in_one_round_is_refused_before_any_private_computation(monkeypatch):
    # a second index-0 start would restart the fit (and the budget's count of its
    # iterates) at will; every client refuses it, the coordinator or not
    from botorch_fed.models import PITCFitClient

    server, clients = _federation(hyperparameters="federated", num_clients=4)
    _round(server, 1)
    _standardize(server)
    _start(server, clients)
    computed = _counting(monkeypatch, PITCFitClient, "summary_and_jacobian")
    _as_first_session(clients)
    with pytest.raises(ProtocolViolation, match="Client 1.*a second fit in one round"):
        _start(server, clients, clients=(1, 2, 3), share=False)
    _feed(server)
    for session in ({"clients": (1, 2, 3), "share": False}, {}):
        _as_first_session(clients)
        with pytest.raises(ProtocolViolation, match="a second fit in one round"):
            _start(server, clients, **session)
    assert computed == []


@pytest.mark.parametrize("feed", [False, True], ids=["start", "iterate"])
def test_without_a_federation_secret_the_coordinator_accepts_only_its_pending_iterate(feed):
    # plaintext: no tags, so the coordinator's check is all there is between the server
    # and a summed summary at a theta of its choosing
    server, clients = _federation(hyperparameters="federated")
    assert clients[0].federation_secret() is None
    _round(server, 1)
    _standardize(server)
    _start(server, clients)
    pending = _feed(server)["theta"] if feed else _x0(clients[0])
    other = pending.copy()
    other[-1] += 0.5  # inside the domain, but not the coordinator's
    for index in (1, 2, None):  # None: no index
        args = {"theta": other, "tag": b"", **({} if index is None else {"index": index})}
        with pytest.raises(ProtocolViolation, match="Client 0.*not the fit's pending iterate"):
            server.secure_sum("pitc_summary", _fit_length(server), args)
    if feed:  # the pending iterate itself is summed
        args = {"theta": pending, "tag": b"", "index": 1}
        assert server.secure_sum("pitc_summary", _fit_length(server), args) is not None


def test_the_coordinator_refuses_a_theta_that_is_not_its_pending_iterate():
    server, clients = _federation(hyperparameters="federated")
    _round(server, 1)
    _standardize(server)
    _start(server, clients)
    reply = _feed(server)
    other = reply["theta"].copy()
    other[-1] += 0.5  # inside the domain, but not the coordinator's
    with pytest.raises(ProtocolViolation, match="Client 0.*not the fit's pending iterate"):
        args = {**_iterate_args(reply), "theta": other}
        server.secure_sum("pitc_summary", _fit_length(server), args)


@pytest.mark.parametrize("size", [4, 3], ids=["same size", "smaller"])
def test_a_support_between_a_fit_summary_and_its_feed_is_refused(size):
    # the sum was of summaries on the old support: a feed of it is refused by name
    # (new outcome moments cannot come in between: one moments sum per round)
    server, clients = _federation(hyperparameters="federated")
    _round(server, 1)
    _standardize(server)
    _start(server, clients)
    _support_on(server, server.support[:size].clone())  # carries the sum's result
    with pytest.raises(ProtocolViolation, match="a feed before the pending iterate's summary"):
        _feed(server)


def test_the_server_stops_a_coordinator_that_never_finishes(monkeypatch):
    server, clients = _federation(hyperparameters="federated", federated_maxiter=2)
    _round(server, 1)
    _standardize(server)
    _endless(monkeypatch, clients[0])
    with pytest.raises(ProtocolViolation, match="more than 3 evaluations in one fit"):
        server.refresh_hyperparameters(1)


def test_clients_refuse_fit_evaluations_beyond_the_budget(monkeypatch):
    # a malicious coordinator (another party) hands out iterates without end; the
    # server relays them without its own cap: every client stops at the budget
    server, clients = _federation(hyperparameters="federated", federated_maxiter=1)
    _round(server, 1)
    _standardize(server)
    _endless(monkeypatch, clients[0])
    _start(server, clients)
    reply = _feed(server)
    for _ in range(clients[1]._fit_budget() - 1):  # federated_maxiter iterates after x0
        server.secure_sum("pitc_summary", _fit_length(server), _iterate_args(reply))
        reply = _feed(server)
    assert reply["index"] == 2 and not reply["done"]
    with pytest.raises(ProtocolViolation, match="3 'pitc_summary' sums in round 1"):
        server.secure_sum("pitc_summary", _fit_length(server), _iterate_args(reply))


def test_a_fit_needs_the_coordinators_iterate_and_the_coordinator():
    # without a start the coordinator has no iterate and refuses; a session without the
    # coordinator is refused by every client
    server, clients = _federation(hyperparameters="federated", num_clients=4)
    _round(server, 1)
    _standardize(server)
    theta = clients[1].theta_domain.mean(axis=1)
    for index in (1, None):  # None: no index
        args = {"theta": theta, "tag": b"", **({} if index is None else {"index": index})}
        with pytest.raises(ProtocolViolation, match="Client 0.*handed out no iterate"):
            server.secure_sum("pitc_summary", _fit_length(server), args)
    _round(server, 2)
    with pytest.raises(ProtocolViolation, match="without the coordinator 0"):
        _start(server, clients, clients=(1, 2, 3), share=False)


def test_a_refresh_comes_only_when_due_and_applies_only_an_iterate():
    server, clients = _federation(hyperparameters="federated", hyper_every=5, num_clients=4)
    _round(server, 1)
    _standardize(server)
    server.refresh_hyperparameters(1)  # an honest fit
    server.flush()  # its `apply_theta`, carried
    theta = PITCHyperparameters(*clients[1].modules).get_theta()
    _round(server, 2)
    for session in ({"clients": (1, 2, 3), "share": False}, {}):
        with pytest.raises(ProtocolViolation, match="the last was in round 1"):
            _start(server, clients, **session)
    with pytest.raises(ProtocolViolation, match="no fit ran in this round"):
        server.broadcast("apply_theta", {"theta": theta})
    assert clients[0]._minimizer is None


def test_apply_theta_must_be_one_of_the_fits_iterates():
    server, clients = _federation(hyperparameters="federated")
    _round(server, 1)
    _standardize(server)
    _start(server, clients)
    reply = _feed(server)
    theta = reply["theta"]
    # the clients summarise at the iterate; the server then asks one to adopt another
    server.secure_sum("pitc_summary", _fit_length(server), _iterate_args(reply))
    server.flush()  # the sum's result, carried
    with pytest.raises(ProtocolViolation, match="none of the fit's iterates"):
        server.send({1: Message("apply_theta", {"theta": theta + 0.125})})
    server.send({1: Message("apply_theta", {"theta": theta})})
    np.testing.assert_array_equal(PITCHyperparameters(*clients[1].modules).get_theta(), theta)


def test_averaged_hyperparameters_are_clamped_into_the_domain():
    server, clients = _federation(hyperparameters="average")
    _round(server, 1)
    _standardize(server)
    client = clients[1]
    size = PITCHyperparameters(*client.modules).size
    client._admit_sum("hyper")
    client.sum_received("hyper", np.array([1e-9, 1e9, 1e-9, 1e9, 1.0]) * np.r_[[1.0] * size, 1])
    values = PITCHyperparameters(*client.modules).get_values()
    np.testing.assert_array_equal(values, client.theta_domain[[0, 1, 2, 3], [0, 1, 0, 1]])


# --- saturation, not refusal ----------------------------------------------------------------
class _Loud(FederatedClient):
    def __init__(self, cid, role, value):
        super().__init__(cid, role)
        self.value = value

    @contributes("a")
    def vector_a(self):
        return self.value


def test_a_vector_beyond_the_encodings_range_is_saturated_and_logged_not_refused(caplog):
    from botorch_fed.protocol.server import FederatedServer
    from botorch_fed.protocol.transport import InProcessTransport

    values = {0: np.array([1e30, -1.0]), 1: np.array([1.0, 2.0]), 2: np.array([-1e25, 0.5])}
    secagg, roles = make_roles(get_backend("plaintext"), list(values), seed=0)
    clients = {c: _Loud(c, roles[c], v) for c, v in values.items()}
    server = FederatedServer(InProcessTransport(clients), secagg)
    with caplog.at_level(logging.WARNING, logger="botorch_fed.protocol.client"):
        total = server.secure_sum("a", 2)
    assert total[0] == pytest.approx(1.0)  # both saturated: +limit + 1 - limit
    assert total[1] == pytest.approx(1.5)
    assert sum("saturated" in r.getMessage() for r in caplog.records) == 2


# --- forged sums under ckks: the server never sees them, so they are never refused -------
@pytest.mark.parametrize("name", [*backend_params("ckks"), "masking"])
def test_a_forged_moments_sum_is_refused_only_where_the_server_holds_the_sums(
    name, monkeypatch, caplog
):
    import botorch_fed.algorithms.fbo_fedgp.client as fbo

    refused = name == "masking"
    server, clients = _federation(aggregator=name)
    _round(server, 1)

    def forged(total, max_contributors=None):  # what an offset sum decodes to
        raise ValueError("`first_sum` has a limb sum beyond what 3 contributors produce")

    monkeypatch.setattr(fbo, "center_from_moments", forged)
    if refused:
        with pytest.raises(ProtocolViolation, match="limb sum beyond"):
            _standardize(server)
        return
    with caplog.at_level(logging.WARNING, logger="botorch_fed.algorithms.fbo_fedgp.client"):
        _standardize(server)
        server.secure_sum("summary", _length(server))
        server.flush()
    assert all(c.last_sum is not None for c in clients.values())
    assert all(c.standardize is not None for c in clients.values())
    assert sum("forged moments sum" in r.getMessage() for r in caplog.records) == M


@pytest.mark.parametrize("name", [*backend_params("ckks"), "masking"])
def test_a_forged_one_pass_moments_sum_is_refused_only_where_the_server_holds_the_sums(
    name, monkeypatch, caplog
):
    # after the first global round the moments are summed in one pass around the last
    # standardisation's mean (`moments_around`): a forged sum is treated as in two passes
    import botorch_fed.algorithms.fbo_fedgp.client as fbo

    refused = name == "masking"
    server, clients = _federation(aggregator=name)
    server.ledger.round = 1
    server.run_round(1)  # every client global (p_1 = 0): the clients hold a standardisation
    server.flush()
    _round(server, 2)

    def forged(total, center, max_contributors=None):  # what an offset sum decodes to
        raise ValueError("`total` has a limb sum beyond what 3 contributors produce")

    monkeypatch.setattr(fbo, "standardize_around", forged)
    monkeypatch.setattr(fbo, "center_from_moments", lambda *a, **k: pytest.fail("two passes"))
    if refused:
        with pytest.raises(ProtocolViolation, match="'moments_around'.*limb sum beyond"):
            _standardize(server)
        return
    with caplog.at_level(logging.WARNING, logger="botorch_fed.algorithms.fbo_fedgp.client"):
        _standardize(server)
        server.secure_sum("summary", _length(server))
        server.flush()
    assert all(c.last_sum is not None for c in clients.values())
    for c in clients.values():  # going on with the identity
        assert float(c.standardize.means) == 0.0 and float(c.standardize.stdvs) == 1.0
    logged = [r.getMessage() for r in caplog.records if "forged moments sum" in r.getMessage()]
    assert len(logged) == M and all("'moments_around'" in m for m in logged)


@pytest.mark.parametrize("name", backend_params("ckks"))
def test_an_offset_limb_sum_under_ckks_is_clamped_not_refused(name, monkeypatch, caplog):
    server, clients = _federation(aggregator=name)
    _round(server, 1)
    _standardize(server)
    victim = clients[0]
    step = victim.secagg.step

    def offset_step(*args, **kwargs):  # the server added 10^6 to one limb of the sum
        out = step(*args, **kwargs)
        if victim.secagg.result is not None and not getattr(victim, "_offset", False):
            victim.secagg.result = victim.secagg.result.copy()
            victim.secagg.result[3] += 1e6
            victim._offset = True
        return out

    monkeypatch.setattr(victim.secagg, "step", offset_step)
    with caplog.at_level(logging.WARNING, logger="botorch_fed.protocol.client"):
        server.secure_sum("summary", _length(server))
        server.flush()  # the decryption step (where the offset sum is opened), carried
    assert victim.last_sum is not None
    assert any("clamped" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("name", backend_params("ckks"))
def test_a_summary_sum_no_honest_clients_produce_gives_a_local_step_not_a_refusal(name, caplog):
    # under ckks the server may offset the summed summary: with I + A indefinite the
    # global model has no Cholesky factor, and a client that failed on it would tell
    # the server a bit of a sum it never sees
    server, clients = _federation(aggregator=name)
    _round(server, 1)
    _standardize(server)
    server.secure_sum("summary", _length(server))
    server.flush()
    victim = clients[0]
    m = len(server.support)
    summary = SparseSummary.from_numpy(victim.last_sum, m)
    summary.A[0, 0] -= 1e3  # what an offset of -1000 on that slot decodes to
    victim.last_sum = summary.to_numpy()
    before = len(victim.history)
    with caplog.at_level(logging.WARNING, logger="botorch_fed.algorithms.fbo_fedgp.client"):
        server.send({0: Message("global_step", {"t": 1, "rank": 0, "count": 1})})
    assert len(victim.history) == before + 1 and victim.history[-1]["step"] == "local"
    assert any("no honest sum" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("name", [*backend_params("ckks"), "masking"])
def test_a_fit_evaluation_needs_the_coordinators_tag_on_its_iterate(name):
    # under masking a server could drop the refusing coordinator from the session and
    # still sum the others' summaries at a theta of its choosing; every client checks
    # the coordinator's tag (keyed by the federation secret the server lacks) instead
    server, clients = _federation(aggregator=name, hyperparameters="federated", num_clients=4)
    _round(server, 1)
    _standardize(server)
    _start(server, clients)
    reply = _feed(server)
    assert reply["index"] == 1 and len(reply["tag"]) == MAC_SIZE
    chosen = reply["theta"].copy()
    chosen[-1] += 0.5  # inside the domain, but the server's
    for theta, tag, index in (
        (chosen, reply["tag"], reply["index"]),
        (chosen, reply["tag"], 2),
        (chosen, b"", 1),
        (reply["theta"], b"", 1),  # the coordinator's iterate, untagged
        (reply["theta"], reply["tag"], 2),  # its tag, on another index
    ):
        _as_first_session(clients)
        with pytest.raises(ProtocolViolation, match="Client 1.*tag does not verify"):
            server.secure_sum(
                "pitc_summary",
                _fit_length(server),
                {"theta": theta, "tag": tag, "index": index},
                clients=(1, 2, 3),
            )
    # the coordinator's own iterate with its tag is summed by everyone -- once
    honest = _iterate_args(reply)
    _as_first_session(clients)
    server.secure_sum("pitc_summary", _fit_length(server), honest)
    server.flush()
    assert all(c.last_sum is not None for c in clients.values())
    # summed again over other clients (to difference one client's summary out): refused
    _as_first_session(clients)
    with pytest.raises(ProtocolViolation, match="Client 1.*evaluated once, in order"):
        server.secure_sum("pitc_summary", _fit_length(server), honest, clients=(1, 2, 3))


def test_the_coordinator_feeds_only_the_sum_of_its_iterate():
    # a server that opens another session between a fit's sum and the feed would have
    # the coordinator take that sum for its summary (and send back the next iterate);
    # a second feed of one sum would have it step twice on one evaluation
    server, clients = _federation(hyperparameters="federated")
    _round(server, 1)
    _standardize(server)
    _start(server, clients)
    server.secure_sum("summary", _length(server))
    with pytest.raises(ProtocolViolation, match="a feed before the pending iterate"):
        _feed(server)
    server, clients = _federation(hyperparameters="federated")
    _round(server, 1)
    _standardize(server)
    _start(server, clients)
    _feed(server)
    with pytest.raises(ProtocolViolation, match="a feed before the pending iterate"):
        _feed(server)


def test_the_support_and_k_are_the_settings_not_the_servers():
    # a party's policy caps a run's cost on its settings (--support-size, ...): a server
    # that then sent a support of 4096 points would run a fit 4096^3 per evaluation
    server, clients = _federation(support_size=4, support_growth=2, support_every=1)
    limit = 4 + 2 * (NUM_ROUNDS - 1)
    assert clients[1].max_support_size() == limit
    grid = torch.rand(limit + 1, 2, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    with pytest.raises(ProtocolViolation, match=f"1..{limit} finite points"):
        _support_on(server, grid)
    _support_on(server, grid[:limit])  # the largest the settings make
    for k in (3, 5, 4096, True, 4.0):
        with pytest.raises(ProtocolViolation, match="`k`="):
            server.broadcast("centers", {"k": k})
    server.broadcast("centers", {"k": 4})  # centers_per_client


# --- one set of clients per round ------------------------------------------------------
@pytest.mark.parametrize("name", backend_params("plaintext", "masking"))
def test_a_round_sums_over_one_set_of_clients(name):
    # the summary at the applied iterate over fewer clients than the fit's sum there
    # would difference the left-out client's whole summary out of the two totals
    server, clients = _federation(
        name, num_clients=4, hyperparameters="federated", federated_maxiter=1
    )
    _round(server, 1)
    _standardize(server)
    total = _start(server, clients)  # over every client
    server.flush()
    reply = _feed(server)
    x0 = _x0(clients[1])
    if not reply["done"]:  # finish the fit at the start point
        server.carry(dict.fromkeys(clients, Message("apply_theta", {"theta": x0})))
    else:
        server.carry(dict.fromkeys(clients, Message("apply_theta", {"theta": reply["theta"]})))
    server.flush()
    computed = {cid: 0 for cid in clients}
    for cid, client in clients.items():
        inner = client.vector_summary

        def counting(inner=inner, cid=cid):
            computed[cid] += 1
            return inner()

        client.vector_summary = counting
    subset = [c for c in clients if c != max(clients)]
    with pytest.raises(ProtocolViolation, match="one set of clients per round"):
        server.secure_sum("summary", _length(server), clients=subset)
    assert computed == {cid: 0 for cid in clients}  # refused before any summary
    assert total is None or np.isfinite(total).all()


def test_the_outcome_moments_are_summed_in_one_pass_or_two_not_both():
    server, clients = _federation("plaintext")
    _round(server, 1)
    _standardize(server)  # two passes
    server._standardized = True  # as after a global round
    _round(server, 2)
    _standardize(server)  # one pass
    with pytest.raises(ProtocolViolation, match="in one pass and in two"):
        server.secure_sum("moments", 189, wide=0)
