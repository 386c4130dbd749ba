r"""The party console (``botorch-fed party console``): its page and report endpoint with
Flask's test client -- every bad entry refused on the page and changing nothing -- and who
may reach it."""

from __future__ import annotations

import contextlib
import re
import threading

import pytest
import torch

pytest.importorskip("flask", reason="needs the `console` extra")

from botorch_fed.cli import main  # noqa: E402
from botorch_fed.console import create_app  # noqa: E402
from botorch_fed.problems.ask_folder import MAX_REASON  # noqa: E402
from botorch_fed.problems.ask_tell import AskTellObjective  # noqa: E402

BOUNDS = [[20.0, 0.1], [80.0, 2.0]]


@pytest.fixture
def asking(tmp_path):
    r"""An objective waiting on one pending point (a thread evaluates it), and that point."""
    objective = AskTellObjective(tmp_path, BOUNDS, minimize=False, poll_s=0.01,
                                 context={"run": "r-1", "round": 3})  # fmt: skip
    done = {}

    def wait() -> None:
        with contextlib.suppress(RuntimeError):  # a reported failure ends it too
            done["value"] = objective.evaluate(torch.tensor([[0.25, 0.5]], dtype=torch.float64))

    thread = threading.Thread(target=wait, daemon=True)
    thread.start()
    while not objective.party.pending():
        thread.join(0.01)
    (ask,) = objective.party.pending()
    yield objective, ask, thread, done
    objective.close()


def _secret(html: str) -> str:
    return re.search(r'name="secret" value="([^"]+)"', html).group(1)


TOKEN = "console-token-for-tests"


def _client(folder, **options):
    r"""A test client of the console that opened the address with the token once."""
    client = create_app(folder, token=TOKEN, **options).test_client()
    assert client.get(f"/?token={TOKEN}").status_code == 303
    return client


def test_the_page_shows_the_pending_point_in_the_objectives_domain(asking):
    objective, ask, *_ = asking
    page = _client(objective.party.folder).get("/").get_data(as_text=True)
    assert "waiting for you" in page and ask["id"] in page
    assert "larger is better" in page and "round 3" in page
    assert "35.0" in page and "1.05" in page  # x in the domain: 20 + 0.25 * 60, 0.1 + 0.5 * 1.9
    assert "[20.0, 80.0]" in page and 'http-equiv="refresh"' not in page  # typing is not lost


def test_a_reported_value_reaches_the_waiting_run_and_the_history(asking):
    objective, ask, thread, done = asking
    client = _client(objective.party.folder)
    secret = _secret(client.get("/").get_data(as_text=True))
    reply = client.post("/report", data={"secret": secret, "id": ask["id"], "value": " 0.83 "})
    assert reply.status_code == 303 and reply.headers["Location"].endswith(f"?reported={ask['id']}")
    thread.join(5)
    assert not thread.is_alive() and float(done["value"][0].reshape(-1)[0]) == 0.83
    page = client.get(reply.headers["Location"]).get_data(as_text=True)
    assert "Reported at point" in page and "0.83" in page and "<svg" in page
    assert objective.party.answer(ask["id"]) == {"value": 0.83}


def test_a_reported_failure_needs_a_reason_and_is_recorded(asking):
    objective, ask, thread, _ = asking
    client = _client(objective.party.folder)
    secret = _secret(client.get("/").get_data(as_text=True))
    form = {"secret": secret, "id": ask["id"], "kind": "failed"}
    refused = client.post("/report", data={**form, "reason": "   "})
    assert refused.status_code == 400 and "needs a reason" in refused.get_data(as_text=True)
    assert objective.party.answer(ask["id"]) is None
    too_long = client.post("/report", data={**form, "reason": "x" * (MAX_REASON + 1)})
    assert too_long.status_code == 400 and objective.party.answer(ask["id"]) is None
    assert client.post("/report", data={**form, "reason": "sample lost"}).status_code == 303
    thread.join(5)
    assert objective.party.answer(ask["id"]) == {"failed": "sample lost"}


@pytest.mark.parametrize(
    "value, message",
    [
        ("", "is not a number"),
        ("abc", "is not a number"),
        ("1,5", "is not a number"),
        ("nan", "must be finite"),
        ("-inf", "must be finite"),
        ("1e999", "must be finite"),
    ],
)
def test_a_bad_value_is_refused_on_the_page_and_changes_nothing(asking, value, message):
    objective, ask, *_ = asking
    client = _client(objective.party.folder)
    secret = _secret(client.get("/").get_data(as_text=True))
    reply = client.post("/report", data={"secret": secret, "id": ask["id"], "value": value})
    page = reply.get_data(as_text=True)
    assert reply.status_code == 400 and message in page and 'role="alert"' in page
    assert objective.party.pending() == [ask]  # nothing recorded
    assert f'value="{value}"' in page  # what was typed is still in the form


def test_unknown_stale_and_repeated_points_are_refused(asking):
    objective, ask, thread, _ = asking
    client = _client(objective.party.folder)
    secret = _secret(client.get("/").get_data(as_text=True))
    for point_id, message in (("0" * 16, "is not a point of"), ("../x", "is not a point id")):
        reply = client.post("/report", data={"secret": secret, "id": point_id, "value": "1"})
        assert reply.status_code == 400 and message in reply.get_data(as_text=True)
    told = client.post("/report", data={"secret": secret, "id": ask["id"], "value": "1"})
    assert told.status_code == 303
    thread.join(5)
    again = client.post("/report", data={"secret": secret, "id": ask["id"], "value": "2"})
    assert again.status_code == 400 and "reported already" in again.get_data(as_text=True)
    objective.close()  # the run ended: nothing waits any more
    stale = client.post("/report", data={"secret": secret, "id": ask["id"], "value": "3"})
    assert stale.status_code == 400 and "No run is active" in stale.get_data(as_text=True)
    assert objective.party.answer(ask["id"]) == {"value": 1.0}


def test_a_form_of_another_site_is_refused(asking):
    objective, ask, *_ = asking
    client = _client(objective.party.folder)
    for secret in ("", "forged"):
        reply = client.post("/report", data={"secret": secret, "id": ask["id"], "value": "1"})
        page = reply.get_data(as_text=True)
        assert reply.status_code == 400 and "The form is not this console" in page
    assert objective.party.pending() == [ask]


def test_every_request_needs_the_token_and_loopback_names_unless_remote(tmp_path):
    client = create_app(tmp_path, token=TOKEN).test_client()
    assert client.get("/").status_code == 401  # another local user or process
    assert client.get("/?token=wrong-wrong-wrong-wrong").status_code == 401
    assert client.post("/report", data={"id": "0" * 16, "value": "1"}).status_code == 401
    first = client.get(f"/?token={TOKEN}", headers={"Host": "127.0.0.1:8050"})
    assert first.status_code == 303 and "token" not in first.headers["Location"]
    cookie = first.headers["Set-Cookie"]
    assert "_8050=" in cookie and TOKEN not in cookie and "HttpOnly" in cookie
    assert client.get("/", headers={"Host": "127.0.0.1:8050"}).status_code == 200
    assert client.get("/", headers={"Host": "127.0.0.1:8051"}).status_code == 401  # its port's
    header = {"X-Console-Token": TOKEN}
    assert client.get("/", headers={**header, "Host": "[::1]:8050"}).status_code == 200
    # a page elsewhere whose DNS name was rebound to 127.0.0.1
    assert client.get("/", headers={**header, "Host": "evil.example:8050"}).status_code == 403
    remote = create_app(tmp_path, token=TOKEN, loopback_only=False).test_client()
    assert remote.get("/", headers={"Host": "lab-pc:8050"}).status_code == 401
    assert remote.get("/", headers={**header, "Host": "lab-pc:8050"}).status_code == 200
    with pytest.raises(ValueError, match="at least 16"):
        create_app(tmp_path, token="short")


def test_no_page_may_be_framed_and_the_address_chooses_no_text(asking):
    objective, ask, *_ = asking
    client = _client(objective.party.folder)
    reply = client.get("/?reported=00000000deadbeef. Report 0 for every point")
    assert reply.headers["X-Frame-Options"] == "DENY"
    assert "frame-ancestors 'none'" in reply.headers["Content-Security-Policy"]
    assert "Report 0 for every point" not in reply.get_data(as_text=True)
    secret = _secret(reply.get_data(as_text=True))
    huge = client.post("/report", data={"secret": secret, "id": ask["id"], "value": "1" * 70_000})
    assert huge.status_code == 413 and objective.party.pending() == [ask]
    long = client.post("/report", data={"secret": secret, "id": ask["id"], "value": "1" * 200})
    assert long.status_code == 400 and "characters" in long.get_data(as_text=True)


def test_a_write_the_storage_refuses_is_shown_and_records_nothing(asking, monkeypatch):
    import botorch_fed.problems.ask_folder as ask_folder

    objective, ask, *_ = asking
    client = _client(objective.party.folder)
    secret = _secret(client.get("/").get_data(as_text=True))

    def read_only(*args, **kwargs):
        raise OSError(30, "Read-only file system")

    monkeypatch.setattr(ask_folder, "write_once", read_only)
    reply = client.post("/report", data={"secret": secret, "id": ask["id"], "value": "2.5"})
    page = reply.get_data(as_text=True)
    assert reply.status_code == 503 and "could not be stored" in page and 'value="2.5"' in page
    assert objective.party.answer(ask["id"]) is None


def test_the_status_endpoint_gives_the_commands_state(asking):
    objective, ask, *_ = asking
    data = _client(objective.party.folder).get("/status.json").get_json()
    assert data["status"]["state"] == "waiting for you"
    assert [p["id"] for p in data["pending"]] == [ask["id"]]
    assert data["status"] == objective.party.status()


def test_the_command_refuses_another_host_without_allow_remote(tmp_path, capsys):
    argv = ["party", "console", "--folder", str(tmp_path), "--host", "0.0.0.0"]
    assert main(argv) == 2
    assert "--allow-remote" in capsys.readouterr().err
    assert main(["party", "console", "--folder", str(tmp_path), "--port", "0"]) == 2


def test_named_inputs_and_a_declared_range_are_shown_and_the_range_is_enforced(tmp_path):
    objective = AskTellObjective(tmp_path, BOUNDS, poll_s=0.01, value_range=(0.0, 100.0),
                                 input_names=["temperature (C)", "time (h)"])  # fmt: skip
    thread = threading.Thread(
        target=lambda: objective.evaluate(torch.tensor([[0.5, 0.5]], dtype=torch.float64)),
        daemon=True,
    )
    thread.start()
    while not objective.party.pending():
        thread.join(0.01)
    (ask,) = objective.party.pending()
    client = _client(tmp_path)
    page = client.get("/").get_data(as_text=True)
    assert "temperature (C)" in page and "time (h)" in page
    assert "measurements lie in [0.0, 100.0]" in page
    secret = _secret(page)
    refused = client.post("/report", data={"secret": secret, "id": ask["id"], "value": "100.5"})
    assert refused.status_code == 400 and "outside the range [0, 100]" in refused.get_data(
        as_text=True
    )
    assert objective.party.pending() == [ask]
    told = client.post("/report", data={"secret": secret, "id": ask["id"], "value": "100"})
    assert told.status_code == 303
    thread.join(5)
    objective.close()


@pytest.mark.parametrize(
    "options, match",
    [
        ({"input_names": ["a"]}, "`input_names`"),
        ({"input_names": ["a", "a"]}, "`input_names`"),
        ({"input_names": ["a", ""]}, "`input_names`"),
        ({"value_range": (1.0, 1.0)}, "`value_range`"),
        ({"value_range": (0.0, float("inf"))}, "`value_range`"),
        ({"value_range": (0.0,)}, "`value_range`"),
    ],
)
def test_bad_names_and_ranges_are_refused(tmp_path, options, match):
    with pytest.raises(ValueError, match=match):
        AskTellObjective(tmp_path, BOUNDS, **options)


def test_points_without_context_or_with_foreign_keys_still_render(tmp_path):
    import json

    from botorch_fed.problems.ask_folder import ask_check

    objective = AskTellObjective(tmp_path, BOUNDS)  # a live run, nobody waiting
    ask = {"id": "0123456789abcdef", "objective": objective.name, "run": objective.run}
    ask |= {"sequence": 1, "x": [30.0, 1.0], "value": "zzz"}  # no context; a foreign key
    ask["check"] = ask_check(ask)
    (tmp_path / f"{ask['id']}.ask.json").write_text(json.dumps(ask))
    reply = _client(tmp_path).get("/")
    page = reply.get_data(as_text=True)
    assert reply.status_code == 200 and ask["id"] in page and "zzz" not in page
    objective.close()


@pytest.mark.parametrize(
    "extra",
    [
        {"range": [0, 10**400]},  # beyond float's range
        {"range": [1.0, 1.0]},
        {"bounds": [[20.0, 80.0]]},  # fewer domain pairs than inputs
        {"names": ["a", "a"]},
        {"names": [" ", "b"]},
    ],
)
def test_a_point_file_an_objective_would_not_write_is_damaged_not_a_crash(tmp_path, extra):
    import json

    from botorch_fed.problems.ask_folder import ask_check

    objective = AskTellObjective(tmp_path, BOUNDS)
    ask = {"id": "0123456789abcdef", "objective": objective.name, "run": objective.run}
    ask |= {"sequence": 1, "x": [30.0, 1.0], "bounds": BOUNDS_PAIRS, "minimize": True} | extra
    ask["check"] = ask_check(ask)
    (tmp_path / f"{ask['id']}.ask.json").write_text(json.dumps(ask))
    client = _client(tmp_path)
    page = client.get("/")
    assert page.status_code == 200 and "is damaged" in page.get_data(as_text=True)
    assert client.get("/status.json").get_json()["status"]["damaged"]
    objective.close()


BOUNDS_PAIRS = [[20.0, 80.0], [0.1, 2.0]]


def test_signed_names_of_non_numbers_are_refused_by_name():
    from botorch_fed.problems.ask_folder import parse_value

    for text in ("+-inf", "--nan", "+infinity"):
        with pytest.raises(ValueError, match="is not a number|must be finite"):
            parse_value(text)
    with pytest.raises(ValueError, match="`value_range`"):
        AskTellObjective("unused", BOUNDS, value_range=(0, 10**400))
