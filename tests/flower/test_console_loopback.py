r"""End to end on a real loopback Flower federation (``botorch-fed flower up``: a SuperLink,
a SuperNode and a party agent on 127.0.0.1, the ServerApp and ClientApps as Flower starts
them) of one party in ask/tell mode -- the other Flower tests federate several; its
operator's console is started the way the documentation starts it (``botorch-fed party
console --party 0 --state-dir``, a separate process), and headless Chromium, driven by
Selenium, reads each pending point from the page and submits the measured value through
the form (the first time a bad entry before it, which the page refuses, recording
nothing). The campaign (``botorch-fed flower run ... --run-dir``) finishes with every
reported value recorded -- the same result as the in-process run of the same options --
and no process outlives the test.

Costs about a minute of wall time (Flower's seconds per message); it runs where Chromium
and its driver are installed."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

pytest.importorskip("flwr")
pytest.importorskip("flask", reason="needs the `console` extra")
webdriver = pytest.importorskip("selenium.webdriver", reason="needs selenium (dev extra)")
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

from botorch_fed.flower import launcher  # noqa: E402
from botorch_fed.flower.ports import free_ports  # noqa: E402
from botorch_fed.flower.run_options import prepare  # noqa: E402
from botorch_fed.problems.ask_tell import Party  # noqa: E402
from botorch_fed.protocol.runner import run_federated  # noqa: E402
from tests.flower.test_loopback import _assert_all_stopped  # noqa: E402
from tests.helpers.flower_runs import comparable, short_argv  # noqa: E402

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")
CLI = [sys.executable, "-m", "botorch_fed.cli"]
FLAGS = ["--allow-crypto-seed", "--share-results", "--allow-algorithm=all"]

pytestmark = [
    pytest.mark.flower,
    pytest.mark.browser,
    pytest.mark.skipif(
        CHROMIUM is None or DRIVER is None,
        reason="needs Chromium and its driver (Debian: apt install chromium chromium-driver)",
    ),
]


def _console_address(log: Path, console: subprocess.Popen, deadline: float) -> str:
    r"""The address with the token that ``party console`` prints when it starts."""
    while time.monotonic() < deadline:
        for line in log.read_text().splitlines():
            if line.startswith("party console of"):
                return line.split(": ", 1)[1].split(" ", 1)[0]
        if console.poll() is not None:
            raise AssertionError(f"the console exited: {log.read_text()[-2000:]}")
        time.sleep(0.2)
    raise AssertionError(f"the console printed no address: {log.read_text()[-2000:]}")


def _stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _browser():
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1200,1600"):
        options.add_argument(flag)
    return webdriver.Chrome(service=webdriver.ChromeService(DRIVER), options=options)


def test_an_operator_reports_through_the_console_on_a_loopback_flower_federation(
    tmp_path, quiet_single_thread
):
    state, run_dir, out = tmp_path / "fed", tmp_path / "run", tmp_path / "out.json"
    argv = short_argv("local", rounds=1, clients=1)
    argv[argv.index("--num-init") + 1] = "2"  # 2 initial points, then one a round
    run = prepare(argv)
    objective = run.setup.make_objectives()[0]
    fed = launcher.up(1, state, agent_flags=FLAGS, ask_tell=(0,), timeout=120)
    processes: list[subprocess.Popen] = []
    browser = None
    console_log, campaign_log = tmp_path / "console.log", tmp_path / "campaign.log"
    try:
        (port,) = free_ports(1)
        where = ["--party", "0", "--state-dir", str(state)]
        with console_log.open("w") as sink:  # a file: a pipe nobody reads would fill up
            console = subprocess.Popen(
                [*CLI, "party", "console", *where, "--port", str(port)],
                stdout=sink,
                stderr=subprocess.STDOUT,
                env={**os.environ, "COLUMNS": "500"},
            )
        processes.append(console)
        address = _console_address(console_log, console, time.monotonic() + 60)
        assert address.startswith(f"http://127.0.0.1:{port}/?token=")
        command = [*CLI, "flower", "run", *argv, "--state-dir", str(state)]
        command += ["--run-dir", str(run_dir), "--out", str(out), "--hold", "600"]
        with campaign_log.open("w") as sink:
            campaign = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT)
        processes.append(campaign)
        browser = _browser()
        browser.get(address)  # the printed address: sets the console's cookie
        url = address.split("?", 1)[0]
        reported: list[float] = []
        deadline = time.monotonic() + 400
        while campaign.poll() is None and time.monotonic() < deadline:
            browser.get(url)
            forms = browser.find_elements("css selector", "div.point")
            if not forms:
                time.sleep(0.5)
                continue
            point = forms[0]
            point_id = point.find_element("name", "id").get_attribute("value")
            if not reported:
                browser.save_screenshot(str(tmp_path / "console-waiting-for-you.png"))
                # a bad entry first: refused on the page, nothing recorded
                field = point.find_element("name", "value")
                field.send_keys("abc")
                field.submit()
                WebDriverWait(browser, 60).until(lambda b: b.find_elements("id", "error"))
                assert "is not a number" in browser.find_element("id", "error").text
                browser.save_screenshot(str(tmp_path / "console-refused.png"))
                folder = launcher.ask_folder(state, 0)
                assert [a["id"] for a in Party(folder).pending()] == [point_id]
                assert not (folder / f"{point_id}.report.json").exists()
                point = browser.find_elements("css selector", "div.point")[0]
            x = [float(c.text) for c in point.find_elements("css selector", "td.x")]
            value = float(
                objective.function.evaluate_true(torch.tensor([x], dtype=torch.float64)).item()
            )
            field = point.find_element("name", "value")
            field.clear()
            field.send_keys(repr(value))
            field.submit()
            WebDriverWait(browser, 60).until(lambda b: "reported=" in b.current_url)
            assert "Reported at point" in browser.page_source
            reported.append(value)
            if len(reported) == 1:
                browser.save_screenshot(str(tmp_path / "console-reported.png"))
        assert campaign.poll() is not None, (
            f"the campaign did not finish in time: {campaign_log.read_text()[-4000:]}"
        )
        assert campaign.returncode == 0, campaign_log.read_text()[-4000:]
        browser.get(url)
        # the run ended normally: nothing pending, every point reported
        assert browser.find_element("id", "state").text == "finished"
        assert "0 pending, 3 of 3 reported" in browser.page_source
        browser.save_screenshot(str(tmp_path / "console-finished.png"))
    finally:
        try:
            if browser is not None:
                browser.quit()
        finally:
            for process in processes:
                _stop(process)
            launcher.down(state)
    _assert_all_stopped(fed)
    result = json.loads(out.read_text())
    history = Party(launcher.ask_folder(state, 0)).history()
    assert len(reported) == len(history) == 2 + 1  # --num-init 2, one point a round
    assert [h["value"] for h in sorted(history, key=lambda h: h["sequence"])] == reported
    local = comparable(run_federated(run.algorithm, run.setup, run.settings))
    flower = {k: v for k, v in result.items() if k not in ("time_s", "versions", "ledger")}
    flower["rounds"] = [[r["round"], sorted(r["stage_s"])] for r in result["ledger"]["rounds"]]
    assert flower == local
    for shot in ("waiting-for-you", "refused", "reported", "finished"):
        assert (tmp_path / f"console-{shot}.png").stat().st_size > 10_000
