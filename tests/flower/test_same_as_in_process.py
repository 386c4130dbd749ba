r"""Every registered algorithm on the Flower app ends exactly as the in-process run.

The ServerApp's program (:func:`run_on_flower`), the ``ClientApp``, the party agents
(on Unix sockets), the records and the :class:`FlowerTransport` run over an in-memory
``Grid`` (tests/helpers/fake_grid.py): everything a deployment runs but Flower's
processes and network (tests/flower/test_loopback.py starts those). The JSON must equal
the in-process ``run_federated`` result but for wall times, byte counts (Flower's
records are larger) and versions. A run whose parties leave, do not answer, fail or
send a malformed report stops naming them, or goes on without them where it can."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import time

import numpy as np
import pytest
import torch

pytest.importorskip("flwr")

from botorch_fed.algorithms import available_algorithms  # noqa: E402
from botorch_fed.flower.run_options import prepare  # noqa: E402
from botorch_fed.flower.server_app import run_on_flower  # noqa: E402
from botorch_fed.flower.transport import ClientFailed, ClientUnavailable  # noqa: E402
from botorch_fed.protocol.runner import run_federated  # noqa: E402
from botorch_fed.secure import available_backends  # noqa: E402
from tests.helpers.fake_grid import FakeGrid, flower_run  # noqa: E402
from tests.helpers.flower_runs import comparable, short_argv  # noqa: E402

pytestmark = pytest.mark.usefixtures("quiet_single_thread")


def _cases():
    for name in available_algorithms():
        yield pytest.param(name, "plaintext", id=name)
    for name in ("fbo-fedgp", "barycenter-qkg"):
        for agg in ("masking", "ckks"):
            marks = [] if agg in available_backends() else [pytest.mark.skip(reason=agg)]
            yield pytest.param(name, agg, id=f"{name}-{agg}", marks=marks)


@pytest.mark.parametrize("algorithm, aggregator", list(_cases()))
def test_flower_app_run_equals_in_process_run(algorithm, aggregator, tmp_path):
    argv = short_argv(algorithm, aggregator)
    if algorithm == "fbo-fedgp" and aggregator != "plaintext":
        # the federated hyperparameter fit's sums are secure sums of the same kind as the
        # summaries' (its messages cross the wire in the plaintext case): one fit per round
        argv += ["--hyperparameters", "average"]
    flower, grid = flower_run(argv, tmp_path)
    run = prepare(argv)
    local = run_federated(run.algorithm, run.setup, run.settings)
    a, b = comparable(flower), comparable(local)
    assert a.keys() == b.keys()
    for key in a:
        assert a[key] == b[key], key
    assert flower.evaluations, "the run evaluated nothing"
    # every message the server sent went through Flower's records, typed query.<type>
    assert {m.metadata.message_type.split(".")[0] for m in grid.pushed} == {"query"}
    # and the ledger counted Flower's bytes (its records are larger than the payloads)
    sent = flower.ledger["total_bytes_down"]
    assert sent > local.ledger["total_bytes_down"] > 0


def test_a_party_that_leaves_stops_the_run_naming_it(tmp_path):
    # node 1007 (client 1) answers the discovery and the initialisation, then leaves
    with pytest.raises(ClientUnavailable, match=r"client 1 \(Flower node 1007\).*removed"):
        flower_run(short_argv("local"), tmp_path, drop={1007: 2})


def test_a_party_that_does_not_answer_in_time_stops_the_run_naming_it(tmp_path):
    t0 = time.monotonic()
    # whichever comes first, as on a deployment: the transport's deadline or the
    # SuperLink's error once the message's TTL (the same timeout) passed
    answer = r"(no answer within 0.5 s|Error: Message Unavailable)"
    with pytest.raises(ClientUnavailable, match=rf"client 2 \(Flower node 1014\).*{answer}"):
        flower_run(short_argv("local"), tmp_path, hang={1014}, timeout=0.5, hold=0.5)
    assert time.monotonic() - t0 < 20


def test_a_party_missing_at_discovery_is_named(tmp_path):
    with pytest.raises(ClientUnavailable, match=r"discovery failed: Flower node 1007.*removed"):
        flower_run(short_argv("local"), tmp_path, drop={1007: 0})


@pytest.mark.skipif("masking" not in available_backends(), reason="masking")
def test_masking_goes_on_without_a_party_that_left(tmp_path):
    # 4 parties, masking's threshold 3: node 1021 (client 3) leaves after the
    # initialisation; the sums go on over the other three
    argv = short_argv("fbo-fedgp", "masking", rounds=1, clients=4)
    result, grid = flower_run(argv, tmp_path, drop={1021: 2}, on_dropout="continue")
    assert result.best_value is not None and np.isfinite(result.best_value)
    assert {e["client"] for e in result.evaluations} == {0, 1, 2}
    rounds = {e["round"] for e in result.evaluations}
    assert rounds == {0, 1}


@pytest.mark.skipif("masking" not in available_backends(), reason="masking")
def test_a_party_whose_agent_died_drops_out_under_masking(tmp_path, monkeypatch):
    import tests.helpers.fake_grid as fake_grid

    class AgentDies(FakeGrid):
        def push_messages(self, messages):
            messages = list(messages)
            for msg in messages:  # client 3 (node 1021): its agent dies after init
                node = msg.metadata.dst_node_id
                if node == 1021 and self.answered.get(node, 0) >= 2:
                    self.sockets[node] = os.path.join(os.path.dirname(self.sockets[node]), "gone")
            return super().push_messages(messages)

    monkeypatch.setattr(fake_grid, "FakeGrid", AgentDies)
    argv = short_argv("fbo-fedgp", "masking", rounds=1, clients=4)
    result, _ = fake_grid.flower_run(argv, tmp_path, on_dropout="continue")
    assert {e["client"] for e in result.evaluations} == {0, 1, 2}


def test_plaintext_sum_cannot_go_on_without_a_party(tmp_path):
    argv = short_argv("fbo-fedgp", "plaintext", rounds=1)
    with pytest.raises(Exception, match=r"3 needed \(dropped: \[2\]\)"):
        flower_run(argv, tmp_path, drop={1014: 2}, on_dropout="continue")


def test_a_client_error_stops_the_run_with_its_reason(tmp_path):
    # a run whose clients cannot be built (the keyset names no files): the agent's
    # error reaches the server as Flower's error reply, naming client and message
    argv = short_argv("fbo-fedgp", "masking")
    with pytest.raises(ClientFailed, match=r"client 0 .*message 'init'.*key material") as err:
        flower_run(argv, tmp_path, keyset="masking-0000")
    # as a sentence: the agent's error kind and message, not Flower's wrapping of it
    assert re.search(r"message 'init' failed: \w+Error: ", str(err.value)), str(err.value)
    assert "<class" not in str(err.value) and "AgentError" not in str(err.value)
    # nor the party's key folder, nor why its files do not serve (which key sets it has)
    assert str(tmp_path) not in str(err.value) and "No such file" not in str(err.value)


def test_a_malformed_report_is_named(tmp_path, monkeypatch):
    import botorch_fed.flower.agent as agent_module
    import botorch_fed.flower.server_app as server_app
    import tests.helpers.fake_grid as fake_grid

    honest = agent_module.report_of

    def report(client):
        out = honest(client)
        if client.client_id == 1:
            out["history"] = json.dumps([{"x": [0.5, 0.5], "value": 1.0, "step": "init"}])
        return out

    monkeypatch.setattr(agent_module, "report_of", report)
    # the run is scored without that report, and the log names the client
    lines = []
    monkeypatch.setattr(fake_grid, "run_on_flower", _with_log(server_app.run_on_flower, lines))
    result, _ = flower_run(short_argv("random"), tmp_path)
    assert {e["client"] for e in result.evaluations} == {0, 2}
    assert any(line.startswith("client 1: its report is left out") for line in lines), lines


def _with_log(run, lines):
    def logged(grid, config, log=None, **kwargs):
        return run(grid, config, log=lines.append, **kwargs)

    return logged


@pytest.mark.parametrize(
    "config, match",
    [
        ({"timeout": 0.0}, "`timeout` must be > 0"),
        ({"on-dropout": "ignore"}, "`on-dropout` must be one of"),
        ({"argv": "fbo-fedgp"}, "`argv` must be a JSON list of str"),
        ({"argv": json.dumps(["local", "--resume", "x"])}, "--resume is not available"),
        ({"argv": json.dumps(["local", "--problem", "nope"])}, "nope"),
        ({"server-key": ""}, "`server-key` must name a key set"),
    ],
)
def test_bad_run_config_is_refused_naming_the_key(config, match, tmp_path):
    with pytest.raises(ValueError, match=match):
        flower_run(short_argv("fbo-fedgp", "masking"), tmp_path, **config)


def test_more_parties_than_clients_is_refused(tmp_path):
    grid = FakeGrid(4, str(tmp_path))
    grid.run_config = {"argv": json.dumps(short_argv("local")), "out": str(tmp_path / "o")}
    with pytest.raises(ClientUnavailable, match="partition 0 of 4; this run has 3 clients"):
        run_on_flower(grid, grid.run_config, log=lambda line: None)


@pytest.mark.parametrize("threads, expected", [([], 1), (["--threads", "2"], 2)])
def test_the_server_side_runs_with_the_runs_threads(threads, expected, tmp_path, monkeypatch):
    # Co-KG's decisions differ in the last bits between 1 and 2 threads: building the
    # server, every message it sends and the scoring must run as `botorch-fed run` runs
    # them (run.threads), whatever the ServerApp process was given, and the process's
    # setting must be left as it was (torch's setting is per thread with OpenMP: the
    # party agents' threads of the FakeGrid do not touch this one's)
    import botorch_fed.protocol.registry as registry
    import botorch_fed.protocol.results as results

    seen: dict[str, list[int]] = {"build": [], "send": [], "score": []}
    get_algorithm, score_run = registry.get_algorithm, results.score_run

    def spying(name):
        spec = get_algorithm(name)

        def make_server(ctx, transport):
            seen["build"].append(torch.get_num_threads())
            send = transport.send

            def sending(messages):
                seen["send"].append(torch.get_num_threads())
                return send(messages)

            transport.send = sending
            return spec.make_server(ctx, transport)

        return dataclasses.replace(spec, make_server=make_server)

    def scoring(*args, **kwargs):
        seen["score"].append(torch.get_num_threads())
        return score_run(*args, **kwargs)

    monkeypatch.setattr(registry, "get_algorithm", spying)
    monkeypatch.setattr(results, "score_run", scoring)
    before = 3 - expected  # the process's own setting differs from the run's
    session = torch.get_num_threads()
    torch.set_num_threads(before)
    try:
        flower_run(short_argv("local", rounds=2) + threads, tmp_path)
        assert torch.get_num_threads() == before
    finally:
        torch.set_num_threads(session)  # the tests after this one keep theirs
    assert seen["build"] == seen["score"] == [expected]
    assert len(seen["send"]) >= 3 and set(seen["send"]) == {expected}, seen["send"]
