r"""End to end: the operator of an ask/tell party works from the party console in a real
browser (headless Chromium driven by Selenium), on a federation of the real ServerApp
program and party agents over the in-memory grid (tests/helpers/fake_grid.py): the browser
reads each pending point from the console, submits the measured value through the form,
and the federation moves on to the end -- the same result as the in-process run."""

from __future__ import annotations

import shutil
import threading
import time

import pytest
import torch

pytest.importorskip("flwr")
pytest.importorskip("flask", reason="needs the `console` extra")
webdriver = pytest.importorskip("selenium.webdriver", reason="needs selenium (dev extra)")
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402
from werkzeug.serving import make_server  # noqa: E402

from botorch_fed.console import create_app  # noqa: E402
from botorch_fed.flower.run_options import prepare  # noqa: E402
from botorch_fed.problems.ask_tell import Party  # noqa: E402
from botorch_fed.protocol.runner import run_federated  # noqa: E402
from tests.flower.test_campaigns import Federation  # noqa: E402
from tests.helpers.flower_runs import comparable, short_argv  # noqa: E402

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")


@pytest.mark.browser
@pytest.mark.skipif(
    CHROMIUM is None or DRIVER is None,
    reason="needs Chromium and its driver (Debian: apt install chromium chromium-driver)",
)
def test_an_operator_reports_through_the_console_and_the_federation_moves_on(tmp_path):
    argv = short_argv("local", rounds=2)
    federation = Federation(tmp_path, argv, ask_tell=(0,))
    run = prepare(argv)
    objective = run.setup.make_objectives()[0]
    folder = tmp_path / "ask-0"
    token = "end-to-end-console-token"
    app = create_app(folder, token=token, refresh_s=1)
    server = make_server("127.0.0.1", 0, app, threaded=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_port}/"
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1200,1600"):
        options.add_argument(flag)
    browser = webdriver.Chrome(service=webdriver.ChromeService(DRIVER), options=options)
    outcome: dict = {}

    def run_federation() -> None:
        outcome["result"] = federation.run(hold=0.2)

    browser.get(f"{url}?token={token}")  # the address the console prints: sets its cookie
    running = threading.Thread(target=run_federation, daemon=True)
    running.start()
    reported = []
    try:
        deadline = time.monotonic() + 300
        while running.is_alive() and time.monotonic() < deadline:
            browser.get(url)
            forms = browser.find_elements("css selector", "div.point")
            if not forms:
                time.sleep(0.3)
                continue
            point = forms[0]
            if not reported:
                browser.save_screenshot(str(tmp_path / "console-waiting-for-you.png"))
            x = [float(c.text) for c in point.find_elements("css selector", "td.x")]
            X = torch.tensor([x], dtype=torch.float64)
            value = float(objective.function.evaluate_true(X).item())
            field = point.find_element("name", "value")
            field.send_keys(repr(value))
            field.submit()
            # the browser navigates on its own time: wait for the report's page
            WebDriverWait(browser, 60).until(lambda b: "reported=" in b.current_url)
            assert "Reported at point" in browser.page_source
            reported.append(value)
            if len(reported) == 1:
                browser.save_screenshot(str(tmp_path / "console-reported.png"))
        running.join(10)
    finally:
        browser.quit()
        server.shutdown()
    assert not running.is_alive(), "the federation did not finish"
    local = run_federated(run.algorithm, run.setup, run.settings)
    assert comparable(outcome["result"]) == comparable(local)
    history = Party(folder).history()
    assert len(reported) == len(history) == 3 + 2  # --num-init 3, one point a round
    assert [h["value"] for h in sorted(history, key=lambda h: h["sequence"])] == reported
    for shot in ("console-waiting-for-you.png", "console-reported.png"):
        assert (tmp_path / shot).stat().st_size > 10_000
