r"""The documentation site builds with no warning (``make docs``'s Sphinx command, here
without executing the tutorials: ``tests/test_tutorials.py`` executes them), and its pages
render in a real browser (headless Chromium, where one is installed)."""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import sys
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
#: pages a reader lands on: the index, an algorithm, an API page, a tutorial
PAGES = {
    "index.html": "botorch-fed",
    "algorithms/fbo_fedgp.html": "FBO-FedGP",
    "generated/api/FederatedPITCGP.html": "FederatedPITCGP",
    "generated/tutorials/fbo_fedgp.html": "FBO-FedGP",
}


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    pytest.importorskip("sphinx", reason="needs the `docs` extra")
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "BOTORCH_FED_DOCS_EXECUTE": "off"}
    command = [sys.executable, "-m", "sphinx", "-E", "-W", "--keep-going", "-q", "-b", "html",
               str(ROOT / "docs"), str(out)]  # fmt: skip
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-4000:]
    return out


def test_the_site_builds_without_warnings_with_the_pages_a_reader_needs(site):
    for page, title in PAGES.items():
        html = (site / page).read_text()
        assert title in re.search(r"<title>(.*?)</title>", html, re.S).group(1), page
    api = (site / "generated/api/FederatedPITCGP.html").read_text()
    assert "botorch_fed.FederatedPITCGP" in api and "posterior" in api  # autodoc ran
    # BoTorch's types link into BoTorch's reference (intersphinx, docs/botorch.inv)
    assert "https://botorch.readthedocs.io/en/stable/models.html#botorch.models" in api
    assert (site / "searchindex.js").stat().st_size > 10_000
    for page in PAGES:  # every local script and stylesheet a page loads exists
        html = (site / page).read_text()
        for ref in re.findall(r'(?:src|href)="([^"#?]+\.(?:js|css))', html):
            if not re.match(r"[a-z]+://", ref):
                assert (site / page).parent.joinpath(ref).resolve().exists(), (page, ref)


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def _chromium(url: str, *args: str) -> tuple[str, list[str]]:
    r"""Headless Chromium on ``url``: the DOM after the page's scripts ran, and the
    console messages it logged."""
    assert CHROMIUM is not None
    command = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--enable-logging=stderr",
               "--v=0", "--virtual-time-budget=5000", *args, url]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    console = [line for line in done.stderr.splitlines() if ":CONSOLE" in line]
    return done.stdout, console


class _QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def served(site):
    r"""The site served over HTTP on 127.0.0.1, as a web server serves it (the search page
    fetches pages, which a browser refuses for ``file://``)."""
    handler = functools.partial(_QuietHandler, directory=str(site))
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.browser
@pytest.mark.skipif(
    CHROMIUM is None, reason="needs a Chromium browser (Debian: apt install chromium)"
)
def test_the_pages_render_in_headless_chromium_and_search_finds_the_api(served, tmp_path):
    for page, title in PAGES.items():
        dom, console = _chromium(f"{served}/{page}", "--dump-dom")
        found = re.search(r"<title>(.*?)</title>", dom, re.S)
        assert found and title in found.group(1), page
        assert not console, (page, console)  # no console message, no uncaught error
        shot = tmp_path / f"{page.replace('/', '_')}.png"
        _chromium(f"{served}/{page}", "--window-size=1280,900", f"--screenshot={shot}")
        assert shot.stat().st_size > 10_000  # a rendered page, not a blank one
    # the search page loads the search index and finds the API page
    dom, console = _chromium(f"{served}/search.html?q=FederatedPITCGP", "--dump-dom")
    assert 'href="generated/api/FederatedPITCGP.html' in dom
    assert not console, console
