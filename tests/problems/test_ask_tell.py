r"""Ask/tell black boxes: a run waits for the operator's reports and ends as the run of
the same function called directly; every bad report is refused and changes nothing."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import threading

import pytest
import torch

from botorch_fed.algorithms import run_federated
from botorch_fed.problems.ask_tell import AskTellObjective, Party
from botorch_fed.problems.objectives import CallableObjective
from botorch_fed.protocol import BOSettings, FederationSetup

BOUNDS = [[-1.0, 0.0], [1.0, 2.0]]
SETTINGS = BOSettings(num_init=2, num_rounds=2, raw_samples=16, num_restarts=1, maxiter=10)


def lab(X: torch.Tensor) -> torch.Tensor:
    return ((X - 0.3) ** 2).sum(-1)


def _operator(party: Party, stop: threading.Event, fail_first: bool = False) -> None:
    r"""Reports ``lab`` at every pending point (the first as a failure, if asked)."""
    failed = not fail_first
    while not stop.is_set():
        for ask in party.pending():
            if not failed:
                party.report_failure(ask["id"], "the assay plate broke")
                failed = True
            else:
                party.report(ask["id"], float(lab(torch.tensor([ask["x"]], dtype=torch.float64))))
        stop.wait(0.01)


def _run(objectives):
    setup = FederationSetup(objectives=objectives, seed=1)
    return run_federated("local", setup, SETTINGS)


def test_an_ask_tell_party_ends_as_the_same_function_called_directly(tmp_path):
    asked = AskTellObjective(tmp_path, BOUNDS, poll_s=0.01)
    stop = threading.Event()
    operator = threading.Thread(target=_operator, args=(asked.party, stop), daemon=True)
    operator.start()
    try:
        told = _run([asked, CallableObjective(lab, BOUNDS), CallableObjective(lab, BOUNDS)])
    finally:
        stop.set()
        operator.join()
    called = _run([CallableObjective(lab, BOUNDS) for _ in range(3)])
    assert told.best_per_round == called.best_per_round
    values = [(e["client"], e["value"]) for e in told.evaluations]
    assert values == [(e["client"], e["value"]) for e in called.evaluations]
    history = asked.party.history()
    assert len(history) == SETTINGS.num_init + SETTINGS.num_rounds
    assert asked.party.pending() == [] and all("value" in h for h in history)


def test_a_reported_failure_is_a_failed_evaluation(tmp_path):
    asked = AskTellObjective(tmp_path, BOUNDS, poll_s=0.01)
    stop = threading.Event()
    thread = threading.Thread(target=_operator, args=(asked.party, stop, True), daemon=True)
    thread.start()
    try:
        result = _run([asked, CallableObjective(lab, BOUNDS), CallableObjective(lab, BOUNDS)])
    finally:
        stop.set()
        thread.join()
    (failure,) = result.failures
    assert failure["client"] == 0 and "the assay plate broke" in failure["error"]


def test_a_resumed_objective_finds_the_report_made_before_the_restart(tmp_path):
    first = AskTellObjective(tmp_path, BOUNDS, poll_s=0.01)
    X = torch.tensor([[0.25, 0.5]], dtype=torch.float64)
    stop = threading.Event()
    thread = threading.Thread(target=_operator, args=(first.party, stop), daemon=True)
    thread.start()
    try:
        value = first.evaluate(X)[0]
    finally:
        stop.set()
        thread.join()
    again = AskTellObjective(tmp_path, BOUNDS, poll_s=0.01)
    again.load_state_dict({"run": first.run, "sequence": 0})  # the checkpoint's state
    assert torch.equal(again.evaluate(X)[0], value)  # no new point asked, no wait
    assert len(again.party.history()) == 1
    other = torch.tensor([[0.75, 0.5]], dtype=torch.float64)
    again.load_state_dict({"run": first.run, "sequence": 0})
    with pytest.raises(RuntimeError, match="asks .* as point #1"):
        again.evaluate(other)  # a resumed run that asks another point is an error


def test_a_new_run_in_a_used_folder_asks_afresh(tmp_path):
    first, ask = _one_pending(tmp_path)
    first.party.report(ask["id"], 1.0)
    second, new = _one_pending(tmp_path)  # the same point, a new run
    assert new["x"] == ask["x"] and new["id"] != ask["id"]
    second.party.report(new["id"], 2.0)


def _one_pending(tmp_path) -> tuple[AskTellObjective, dict]:
    asked = AskTellObjective(tmp_path, BOUNDS, poll_s=0.01)

    def wait() -> None:
        with contextlib.suppress(RuntimeError):  # a reported failure ends it too
            asked.evaluate(torch.full((1, 2), 0.5, dtype=torch.float64))

    waiting = threading.Thread(target=wait, daemon=True)
    waiting.start()
    while not asked.party.pending():
        waiting.join(0.01)
    (ask,) = asked.party.pending()
    return asked, ask


@pytest.mark.parametrize(
    "value, match",
    [(float("nan"), "finite"), (float("inf"), "finite"), ("1.0", "number"), (True, "number")],
)
def test_a_bad_value_is_refused_and_changes_nothing(tmp_path, value, match):
    asked, ask = _one_pending(tmp_path)
    with pytest.raises(ValueError, match=match):
        asked.party.report(ask["id"], value)
    assert asked.party.pending() == [ask]
    asked.party.report(ask["id"], 1.5)  # ends the waiting thread


def test_bad_reports_are_refused_and_change_nothing(tmp_path):
    asked, ask = _one_pending(tmp_path)
    party = asked.party
    with pytest.raises(ValueError, match="not a point"):
        party.report("0123456789abcdef", 1.0)
    with pytest.raises(ValueError, match="not a point id"):
        party.report("../../etc/passwd", 1.0)
    with pytest.raises(ValueError, match="`reason`"):
        party.report_failure(ask["id"], " ")
    path = tmp_path / f"{ask['id']}.ask.json"
    original = path.read_text()
    path.write_text(json.dumps({**ask, "x": [0.1, 1.0]}))  # the operator edits the point
    with pytest.raises(ValueError, match="edited"):
        party.report(ask["id"], 1.0)
    for field, bad in (("context", None), ("asked", "yesterday"), ("minimize", 1), ("bounds", {})):
        path.write_text(json.dumps({**ask, field: bad}))  # what it shows, broken
        with pytest.raises(ValueError, match="edited"):
            party.report(ask["id"], 1.0)
        with pytest.warns(RuntimeWarning, match="edited"):
            assert party.pending() == [] and party.status()["asked"] == 0
    path.write_text(original)
    assert party.pending() == [ask]
    party.report(ask["id"], 2.0)
    with pytest.raises(ValueError, match="reported already"):
        party.report(ask["id"], 3.0)
    assert party.answer(ask["id"]) == {"value": 2.0}
    asked.close()
    with pytest.raises(ValueError, match="No run is active"):
        party.report_failure(ask["id"], "late")


def test_the_operator_works_from_the_command_line(tmp_path, capsys):
    from botorch_fed.cli import main

    asked, ask = _one_pending(tmp_path)
    folder = str(tmp_path)
    assert main(["party", "suggest", "--folder", folder, "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == [ask]
    assert main(["party", "report", "--folder", folder, "--id", ask["id"], "--value", "nan"]) == 2
    assert "`--value`=nan must be finite" in capsys.readouterr().err
    assert main(["party", "report", "--folder", folder, "--id", "nope", "--value", "1"]) == 2
    assert main(["party", "report", "--folder", folder, "--id", ask["id"], "--value", "-1.5"]) == 0
    assert asked.party.answer(ask["id"]) == {"value": -1.5}
    assert main(["party", "report", "--folder", folder, "--id", ask["id"], "--failed", "x"]) == 2
    assert "reported already" in capsys.readouterr().err
    second, other = _one_pending(tmp_path / "b")
    failed = ["--id", other["id"], "--failed", "plate [/] broke"]
    assert main(["party", "report", "--folder", str(tmp_path / "b"), *failed]) == 0
    assert main(["party", "status", "--folder", str(tmp_path / "b")]) == 0
    assert "plate [/]" in capsys.readouterr().out  # shown as written (folded to fit)
    assert main(["party", "status", "--folder", folder]) == 0
    out = capsys.readouterr().out
    assert "waiting for the federation: 0 pending, 1 of 1 reported" in out
    assert ask["id"] in out and "-1.5" in out
    assert main(["party", "status", "--folder", str(tmp_path / "missing")]) == 2


def test_the_operator_is_shown_the_domain_direction_run_and_round(tmp_path, capsys):
    from botorch_fed.cli import main

    context = {"run": "campaign 'demo'", "round": 0}
    asked = AskTellObjective(tmp_path, BOUNDS, minimize=False, poll_s=0.01, context=context)
    assert asked.party.status()["state"] == "waiting for the federation"
    context["round"] = 3  # its owner moves on: the next point shows it
    waiting = threading.Thread(
        target=lambda: asked.evaluate(torch.full((1, 2), 0.5, dtype=torch.float64)), daemon=True
    )
    waiting.start()
    while not asked.party.pending():
        waiting.join(0.01)
    (ask,) = asked.party.pending()
    assert ask["bounds"] == [[-1.0, 1.0], [0.0, 2.0]] and ask["minimize"] is False
    assert ask["context"] == {"run": "campaign 'demo'", "round": 3}
    status = asked.party.status()
    assert status == {
        "state": "waiting for you",
        "pending": 1,
        "asked": 1,
        "reported": 0,
        "context": {"run": "campaign 'demo'", "round": 3},
    }
    assert main(["party", "status", "--folder", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "waiting for you: 1 pending, 0 of 1 reported (run campaign 'demo', round 3)" in out
    assert main(["party", "suggest", "--folder", str(tmp_path)]) == 0
    assert "domain [[-1.0, 1.0], [0.0, 2.0]]; larger is better" in capsys.readouterr().out
    asked.party.report(ask["id"], 1.0)
    waiting.join()
    asked.close()
    assert asked.party.status()["state"] == "no run active"
    with pytest.raises(ValueError, match="`context`=.* must be a dict"):
        AskTellObjective(tmp_path / "b", BOUNDS, context=[("round", 1)])


def test_two_reports_at_once_store_one_value_and_refuse_the_other(tmp_path):
    asked, ask = _one_pending(tmp_path)
    outcomes: dict[float, str] = {}

    def tell(value: float) -> None:
        try:
            asked.party.report(ask["id"], value)
            outcomes[value] = "ok"
        except ValueError as exc:
            outcomes[value] = str(exc)

    threads = [threading.Thread(target=tell, args=(v,)) for v in (1.0, 2.0)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    (winner,) = [v for v, o in outcomes.items() if o == "ok"]
    (loser,) = [o for o in outcomes.values() if o != "ok"]
    assert "reported already" in loser
    assert asked.party.answer(ask["id"]) == {"value": winner}


def test_a_dead_runs_folder_is_not_active(tmp_path):
    asked = AskTellObjective(tmp_path, BOUNDS)
    assert asked.party.active()
    marker = next(tmp_path.glob("active-*.json"))
    marker.write_text(json.dumps({**json.loads(marker.read_text()), "pid": 2**22 + 12345}))
    assert not asked.party.active()  # its process is gone (a crashed run)
    with AskTellObjective(tmp_path / "b", BOUNDS) as live:
        assert live.party.active()
    assert not live.party.active()


def test_a_failing_notification_warns_and_the_point_is_still_measured(tmp_path):
    def notify(ask: dict) -> None:
        raise ConnectionError("mail server down")

    asked = AskTellObjective(tmp_path, BOUNDS, poll_s=0.01, on_ask=notify)
    stop = threading.Event()
    thread = threading.Thread(target=_operator, args=(asked.party, stop), daemon=True)
    thread.start()
    try:
        with pytest.warns(RuntimeWarning, match="mail server down"):
            observed, _ = asked.evaluate(torch.full((1, 2), 0.5, dtype=torch.float64))
    finally:
        stop.set()
        thread.join()
    assert observed.item() == pytest.approx(float(lab(torch.tensor([[0.0, 1.0]]))))


def test_a_checkpointed_ask_tell_run_resumes_to_the_uninterrupted_result(tmp_path):
    def campaign(rounds: int, folder, **options):
        asked = AskTellObjective(folder, BOUNDS, poll_s=0.01)
        stop = threading.Event()
        thread = threading.Thread(target=_operator, args=(asked.party, stop), daemon=True)
        thread.start()
        try:
            setup = FederationSetup(objectives=[asked, CallableObjective(lab, BOUNDS)], seed=1)
            settings = dataclasses.replace(SETTINGS, num_rounds=rounds)
            return run_federated("local", setup, settings, **options), asked
        finally:
            stop.set()
            thread.join()

    whole, _ = campaign(3, tmp_path / "whole")
    campaign(2, tmp_path / "lab", checkpoint=tmp_path / "ckpt")
    resumed, asked = campaign(3, tmp_path / "lab", resume=tmp_path / "ckpt")
    assert resumed.best_per_round == whole.best_per_round
    assert len(asked.party.history()) == SETTINGS.num_init + 3  # nothing asked twice


def test_the_operators_commands_load_neither_torch_nor_the_algorithms(tmp_path):
    import subprocess
    import sys

    asked, ask = _one_pending(tmp_path)
    script = (
        "import sys\n"
        "from botorch_fed.cli import main\n"
        f"code = main(['party', 'suggest', '--folder', {str(tmp_path)!r}, '--json'])\n"
        "heavy = sorted(m for m in ('torch', 'botorch', 'botorch_fed.algorithms') "
        "if m in sys.modules)\n"
        "print(code, heavy, file=sys.stderr)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.stderr.strip().splitlines()[-1] == "0 []", done.stderr
    assert json.loads(done.stdout) == [ask]
    # the same command line as the whole parser's: its errors and help
    from botorch_fed.cli import main

    assert main(["party"]) == 2
    assert main(["party", "report", "--folder", str(tmp_path), "--id", ask["id"]]) == 2
    assert main(["party", "suggest", "--help"]) == 0
    asked.party.report(ask["id"], 0.0)
