r"""Ask/tell black boxes: a run waits for the operator's reports and ends as the run of
the same function called directly; every bad report is refused and changes nothing."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import threading
import time

import pytest
import torch

from botorch_fed.algorithms import run_federated
from botorch_fed.problems.ask_folder import ask_check
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


def _asked_by_hand(folder, objective: AskTellObjective, x=(0.5, 1.0)) -> dict:
    r"""A pending point of ``objective``'s run written as it writes one, but with nobody
    waiting for it (so nothing writes it again when a test edits it)."""
    ask = {"id": "0123456789abcdef", "objective": objective.name, "run": objective.run}
    ask |= {"sequence": 1, "x": list(x), "bounds": [[-1.0, 1.0], [0.0, 2.0]], "minimize": True}
    ask |= {"context": {}, "asked": 1.0}
    ask["check"] = ask_check(ask)
    (folder / f"{ask['id']}.ask.json").write_text(json.dumps(ask))
    return ask


def test_bad_reports_are_refused_and_change_nothing(tmp_path):
    asked, ask = _one_pending(tmp_path)
    party = asked.party
    with pytest.raises(ValueError, match="not a point of .*`party suggest` lists"):
        party.report("0123456789abcdef", 1.0)
    with pytest.raises(ValueError, match="not a point id"):
        party.report("../../etc/passwd", 1.0)
    with pytest.raises(ValueError, match="`reason`"):
        party.report_failure(ask["id"], " ")
    with pytest.raises(ValueError, match="`reason` has 1001 characters"):
        party.report_failure(ask["id"], "x" * 1001)
    assert party.pending() == [ask]
    party.report(ask["id"], 2.0)
    with pytest.raises(ValueError, match="reported already \\({'value': 2.0}\\)"):
        party.report(ask["id"], 3.0)
    assert party.answer(ask["id"]) == {"value": 2.0}
    asked.close()
    with pytest.raises(ValueError, match="No run is active"):
        party.report_failure(ask["id"], "late")


@pytest.mark.parametrize(
    "field, bad",
    [("x", [0.1, 1.0]), ("bounds", [[5.0, 6.0], [7.0, 8.0]]), ("minimize", False),
     ("context", None), ("asked", "yesterday"), ("bounds", {}), ("id", "f" * 16), (None, None)],
)  # fmt: skip
def test_an_edited_point_is_refused_shown_as_damaged_and_changes_nothing(tmp_path, field, bad):
    from botorch_fed.cli import main

    with AskTellObjective(tmp_path, BOUNDS) as live:
        ask = _asked_by_hand(tmp_path, live)
        path = tmp_path / f"{ask['id']}.ask.json"
        path.write_text("{garbage" if field is None else json.dumps({**ask, field: bad}))
        with pytest.raises(ValueError, match="unreadable or was edited"):
            live.party.report(ask["id"], 1.0)
        assert live.party.pending() == [] and live.party.status()["damaged"] == [path.name]
        assert main(["party", "status", "--folder", str(tmp_path)]) == 1  # said, not hidden
        assert not list(tmp_path.glob("*.report.json"))


def test_a_waiting_run_writes_its_removed_or_edited_point_again(tmp_path):
    asked = AskTellObjective(tmp_path, BOUNDS, poll_s=0.01)
    seen: list = []

    def operator() -> None:
        while not asked.party.pending():
            time.sleep(0.01)
        (ask,) = asked.party.pending()
        path = tmp_path / f"{ask['id']}.ask.json"
        path.write_text(json.dumps({**ask, "x": [0.0, 0.0]}))  # edited
        while not asked.party.pending():  # written again
            time.sleep(0.01)
        path.unlink()  # removed
        while not asked.party.pending():
            time.sleep(0.01)
        seen.append(asked.party.pending())
        asked.party.report(ask["id"], 4.0)

    thread = threading.Thread(target=operator, daemon=True)
    thread.start()
    with pytest.warns(RuntimeWarning, match="removed or edited; it is written again"):
        observed, _ = asked.evaluate(torch.full((1, 2), 0.5, dtype=torch.float64))
    thread.join()
    assert observed.item() == 4.0 and seen[0][0]["x"] == [0.0, 1.0]
    assert len(list(tmp_path.glob("*.ask.json.damaged-*"))) == 1  # the edited file, kept


@pytest.mark.parametrize("text", ["{garbage", "[1]", '{"value": "abc"}', '{"value": 1e999}',
                                  '{"failed": ""}', '{"value": 1, "failed": "x"}'])  # fmt: skip
def test_a_damaged_report_is_a_failed_measurement_and_is_shown(tmp_path, text):
    from botorch_fed.cli import main

    asked = AskTellObjective(tmp_path, BOUNDS, poll_s=0.01)

    def operator() -> None:
        while not asked.party.pending():
            time.sleep(0.01)
        (ask,) = asked.party.pending()
        (tmp_path / f"{ask['id']}.report.json").write_text(text)

    threading.Thread(target=operator, daemon=True).start()
    with pytest.raises(RuntimeError, match="report is damaged"):
        asked.evaluate(torch.full((1, 2), 0.5, dtype=torch.float64))
    (entry,) = asked.party.history()
    assert entry["state"] == "damaged report"
    assert main(["party", "status", "--folder", str(tmp_path)]) == 1


def test_a_point_of_a_run_that_ended_is_abandoned_not_pending(tmp_path):
    old = AskTellObjective(tmp_path, BOUNDS)
    ask = _asked_by_hand(tmp_path, old)
    old.close()  # its process ended without the report
    with AskTellObjective(tmp_path, BOUNDS) as new:
        assert new.party.pending() == []
        status = new.party.status()
        assert status["state"] == "waiting for the federation" and status["abandoned"] == 1
        with pytest.raises(ValueError, match="asked by a run that no longer runs"):
            new.party.report(ask["id"], 1.0)
        new.run = old.run  # a campaign's restarted agent: the same run, asked again
        assert [a["id"] for a in new.party.pending()] == [ask["id"]]
        new.party.report(ask["id"], 1.0)
        assert new.party.answer(ask["id"]) == {"value": 1.0}


def test_the_operator_works_from_the_command_line(tmp_path, capsys):
    from botorch_fed.cli import main

    asked, ask = _one_pending(tmp_path)
    folder = str(tmp_path)
    where = ["--folder", folder, "--id", ask["id"]]
    assert main(["party", "suggest", "--folder", folder, "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == [ask]
    assert main(["party", "status", "--folder", folder, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["state"] == "waiting for you"
    for bad, said in (("nan", "must be finite"), ("1_000", "is not a number"), ("١٢", "number")):
        assert main(["party", "report", *where, "--value", bad]) == 2
        assert said in capsys.readouterr().err
    assert main(["party", "report", *where, "--failed", " "]) == 2
    assert "--failed needs a reason" in capsys.readouterr().err
    assert main(["party", "report", "--folder", folder, "--id", "nope", "--value", "1"]) == 2
    upper = ["--folder", folder, "--id", ask["id"].upper()]  # as an operator may type it
    assert main(["party", "report", *upper, "--value", "-1e3"]) == 0  # a negative value
    assert f"reported {{'value': -1000.0}} at point {ask['id']}" in capsys.readouterr().out
    assert asked.party.answer(ask["id"]) == {"value": -1000.0}
    assert main(["party", "report", *where, "--failed", "x"]) == 2
    assert "reported already" in capsys.readouterr().err
    assert main(["party", "suggest", "--folder", folder]) == 0
    assert "nothing pending (waiting for the federation)" in capsys.readouterr().out
    second, other = _one_pending(tmp_path / "b")
    failed = ["--id", other["id"], "--failed", "plate [/] broke \x1b[31m"]
    assert main(["party", "report", "--folder", str(tmp_path / "b"), *failed]) == 0
    capsys.readouterr()
    assert main(["party", "status", "--folder", str(tmp_path / "b")]) == 0
    out = capsys.readouterr().out
    assert "plate [/]" in out and "\x1b" not in out  # as written, terminal escapes defused
    assert main(["party", "status", "--folder", folder]) == 0
    out = capsys.readouterr().out
    assert "waiting for the federation: 0 pending, 1 of 1 reported" in out
    assert ask["id"] in out and "-1000.0" in out
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
        "abandoned": 0,
        "damaged": [],
        "context": {"run": "campaign 'demo'", "round": 3},
    }
    assert main(["party", "status", "--folder", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "waiting for you: 1 pending, 0 of 1 reported (run campaign 'demo', round 3)" in out
    assert main(["party", "suggest", "--folder", str(tmp_path)]) == 0
    assert "domain: x1 in [-1, 1], x2 in [0, 2]; larger is better" in capsys.readouterr().out
    asked.party.report(ask["id"], 1.0)
    waiting.join()
    asked.close()
    assert asked.party.status()["state"] == "no run active"
    asked.finish()  # closed: records nothing
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


def test_a_finished_run_reads_finished_and_a_newer_run_does_not(tmp_path):
    asked, ask = _one_pending(tmp_path)
    asked.party.report(ask["id"], 1.0)
    asked.finish()
    assert asked.party.status()["state"] == "finished"
    assert asked.party.finished_runs() == {(asked.name, asked.run)}
    assert not asked.party.active()
    # a newer run in the same folder that ends without finishing: no run active
    later, second = _one_pending(tmp_path)
    assert later.party.status()["state"] == "waiting for you"
    later.party.report(second["id"], 2.0)
    later.close()
    assert later.party.status()["state"] == "no run active"


def test_hostile_files_in_the_folder_do_not_break_status(tmp_path):
    asked, ask = _one_pending(tmp_path)
    (tmp_path / "finished-deep.json").write_text("[" * 200_000)  # too deep for json
    (tmp_path / "active-big.json").write_text(" " * (1 << 17) + "{}")  # over the size cap
    os.mkfifo(tmp_path / "finished-fifo.json")  # would block a plain read
    (tmp_path / "finished-dir.json").mkdir()
    status = asked.party.status()
    assert status["state"] == "waiting for you" and status["pending"] == 1
    asked.party.report(ask["id"], 1.0)
    asked.finish()
    assert asked.party.status()["state"] == "finished"


def test_a_run_that_asks_again_is_not_finished_and_run_ids_are_checked(tmp_path):
    with AskTellObjective(tmp_path, BOUNDS, poll_s=0.01) as asked:
        run = asked.run
    assert asked.party.finished_runs() == {(asked.name, run)}  # a `with` that ended normally
    again = AskTellObjective(tmp_path, BOUNDS, poll_s=0.01)
    again.run = run  # a resumed campaign asks under its run again
    assert again.party.finished_runs() == set()
    for bad in ("../outside", "ABCDEF0123456789", 7):
        with pytest.raises(ValueError, match="`run`=.* must be 16 lower-case hex digits"):
            again.run = bad
    with pytest.raises(RuntimeError), AskTellObjective(tmp_path, BOUNDS) as failed:
        raise RuntimeError("the run failed")
    assert (failed.name, failed.run) not in failed.party.finished_runs()
