r"""The party console's web application (:func:`create_app`).

One page (``GET /``): the party's state (waiting for you / waiting for the federation /
finished / no run active), its run and round, every pending point in the objective's own
domain with a form to report its value or its failure, the history of every point asked,
and a plot of the party's best value so far. ``POST /report`` records a report through
:class:`~botorch_fed.problems.ask_folder.Party` -- which refuses an unknown, stale or
already reported point, a value that is not a finite number, a failure without a reason --
and a refusal is shown on the page and changes nothing. ``GET /status.json`` gives the
same state to scripts.

Who may use it: every request needs the console's token (the command prints an address
that carries it, a new one each start; given once as ``?token=...``, then kept for 12 hours
in a same-site cookie of the console's port, or as the ``X-Console-Token`` header), as
Jupyter asks for its own -- another local user or process cannot report without it, unless
it can serve pages on a loopback port the operator's browser visits (cookies do not tell
ports apart: the same limit as Jupyter's). Bound to
127.0.0.1 (the default) the console also answers only requests addressed to a loopback name
(a page elsewhere reaching it through a rebound DNS name is refused). Every form carries a
secret of the running console, so another site cannot make the operator's browser post a
report, and no page may be framed by another (clickjacking).
"""

from __future__ import annotations

import hmac
import os
import secrets
from pathlib import Path
from typing import Any

from flask import Flask, Response, redirect, render_template_string, request
from werkzeug.wrappers import Response as BaseResponse

from botorch_fed.problems.ask_folder import MAX_REASON, Party, parse_value

LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]")
_COOKIE = "botorch_fed_console"


def create_app(
    folder: str | os.PathLike, *, token: str, loopback_only: bool = True, refresh_s: int = 5
) -> Flask:
    r"""The console of the ask/tell party whose folder is ``folder``.

    Args:
        folder: The party's ask/tell folder (need not exist yet: the page says so).
        token: The secret every request must carry (at least 16 characters).
        loopback_only: Answer only requests addressed to a loopback name (the console
            listens on 127.0.0.1).
        refresh_s: Seconds between the page's reloads while nothing waits for the
            operator (none while a point is pending: a reload would lose what is typed).

    Returns:
        The Flask application.
    """
    if not isinstance(token, str) or len(token) < 16:
        raise ValueError("`token` must be a string of at least 16 characters.")
    if isinstance(refresh_s, bool) or not isinstance(refresh_s, int) or refresh_s < 1:
        raise ValueError(f"`refresh_s`={refresh_s!r} must be a whole number of seconds >= 1.")
    party = Party(folder)
    form_secret = secrets.token_urlsafe(32)
    # what the cookie holds: derived from the token, never the token itself
    cookie_value = hmac.new(token.encode(), b"botorch-fed console cookie", "sha256").hexdigest()
    app = Flask(__name__)
    app.config["MAX_CONTENT_LENGTH"] = 64 * 1024  # a report is a few hundred bytes

    @app.before_request
    def _guard() -> BaseResponse | None:
        if loopback_only and _host_name(request.host or "") not in LOOPBACK_NAMES:
            return Response("This console answers on 127.0.0.1 only.", 403)
        cookie = _cookie_name(request.host or "")
        given = request.args.get("token") or request.headers.get("X-Console-Token")
        if given and hmac.compare_digest(given.encode(), token.encode()):
            if "token" in request.args:  # keep it in a cookie, out of the address bar
                response = redirect(request.path, code=303)
                response.set_cookie(
                    cookie, cookie_value, httponly=True, samesite="Strict", max_age=12 * 3600
                )
                return response
            return None
        kept = request.cookies.get(cookie, "")
        if kept and hmac.compare_digest(kept.encode(), cookie_value.encode()):
            return None
        return Response("A token is needed (open the address the console printed).", 401)

    @app.after_request
    def _headers(response: BaseResponse) -> BaseResponse:
        response.headers["X-Frame-Options"] = "DENY"
        response.headers["Content-Security-Policy"] = (
            "default-src 'self'; style-src 'unsafe-inline'; frame-ancestors 'none'; "
            "form-action 'self'"
        )
        response.headers["Referrer-Policy"] = "no-referrer"
        response.headers["X-Content-Type-Options"] = "nosniff"
        return response

    @app.get("/")
    def page() -> Response:
        reported = request.args.get("reported", "")
        try:  # only a point this party reported (the text is not the address's to choose)
            shown = reported if party.answer(reported) is not None else None
        except ValueError:
            shown = None
        return _page(party, form_secret, refresh_s, message=shown)

    @app.get("/status.json")
    def status() -> Any:
        if not party.folder.is_dir():
            return {"state": "no folder", "pending": [], "history": []}
        return {"status": party.status(), "pending": party.pending(), "history": party.history()}

    @app.post("/report")
    def report() -> BaseResponse:
        form = request.form
        sent = form.get("secret", "")
        if not hmac.compare_digest(sent.encode(), form_secret.encode()):
            return _page(party, form_secret, refresh_s, error="The form is not this console's "
                         "(reload the page and report again).", status=400)  # fmt: skip
        point_id = form.get("id", "").strip().lower()
        try:
            if form.get("kind") == "failed":
                reason = form.get("reason", "")
                if not reason.strip():
                    raise ValueError("A failure needs a reason (what went wrong).")
                party.report_failure(point_id, reason)
            else:
                party.report(point_id, parse_value(form.get("value", ""), "The value"))
        except ValueError as exc:
            return _page(party, form_secret, refresh_s, error=str(exc), status=400,
                         typed=(point_id, form.get("value", "")))  # fmt: skip
        except OSError as exc:  # the folder's storage refused the write: nothing recorded
            return _page(party, form_secret, refresh_s, status=503,
                         error=f"The report could not be stored ({exc.strerror or exc}); "
                         "nothing was recorded: try again.",
                         typed=(point_id, form.get("value", "")))  # fmt: skip
        return redirect(f"/?reported={point_id}", code=303)

    return app


def _cookie_name(host: str) -> str:
    r"""The cookie of the console on ``host``'s port (cookies ignore ports: two consoles
    on one host must not overwrite each other's)."""
    port = host.rsplit(":", 1)[1] if ":" in host.rsplit("]", 1)[-1] else "80"
    return f"{_COOKIE}_{port}" if port.isdigit() else _COOKIE


def _host_name(host: str) -> str:
    r"""The name part of a ``Host`` header (``[::1]:8050`` -> ``[::1]``)."""
    if host.startswith("["):
        return host[: host.find("]") + 1]
    return host.rsplit(":", 1)[0]


def _best_so_far(history: list[dict]) -> list[float]:
    r"""The party's best reported value after each report, in the order asked."""
    best: list[float] = []
    for entry in sorted(history, key=lambda e: (e.get("asked", 0.0), e.get("sequence", 0))):
        if "value" not in entry:
            continue
        value = float(entry["value"])
        if best:
            value = min(value, best[-1]) if entry.get("minimize") else max(value, best[-1])
        best.append(value)
    return best


def _svg(best: list[float], width: int = 480, height: int = 180) -> str:
    r"""An SVG line of the best value so far (empty string with fewer than one point)."""
    if not best:
        return ""
    lo, hi = min(best), max(best)
    span = hi - lo or 1.0
    pad = 24
    xs = [pad + i * (width - 2 * pad) / max(len(best) - 1, 1) for i in range(len(best))]
    ys = [height - pad - (v - lo) / span * (height - 2 * pad) for v in best]
    points = " ".join(f"{x:.1f},{y:.1f}" for x, y in zip(xs, ys, strict=True))
    return (
        f'<svg width="{width}" height="{height}" role="img" aria-label="best value so far">'
        f'<rect x="0" y="0" width="{width}" height="{height}" fill="#fafafa"/>'
        f'<polyline fill="none" stroke="#2962ff" stroke-width="2" points="{points}"/>'
        f'<circle cx="{xs[-1]:.1f}" cy="{ys[-1]:.1f}" r="3" fill="#2962ff"/>'
        f'<text x="{pad}" y="14" font-size="11">best {best[-1]:.6g}</text>'
        f'<text x="{pad}" y="{height - 6}" font-size="11">{len(best)} '
        f"report{'s' * (len(best) != 1)}; range "
        f"{lo:.4g} .. {hi:.4g}</text></svg>"
    )


def _page(
    party: Party,
    form_secret: str,
    refresh_s: int,
    *,
    message: str | None = None,
    error: str | None = None,
    status: int = 200,
    typed: tuple[str, str] | None = None,
) -> Response:
    if not party.folder.is_dir():
        state = {"state": "no folder yet", "pending": 0, "reported": 0, "asked": 0,
                 "abandoned": 0, "damaged": [], "context": {}}  # fmt: skip
        pending: list[dict] = []
        history: list[dict] = []
    else:
        state, pending, history = party.status(), party.pending(), party.history()
        # points of older runs may lack the context (a page must not fail on them)
        pending = [{**a, "context": a.get("context") or {}} for a in pending]
        history = [{**a, "context": a.get("context") or {}} for a in history]
    refresh = None if pending else refresh_s
    html = render_template_string(
        _TEMPLATE,
        folder=str(Path(party.folder)),
        state=state,
        pending=pending,
        history=history,
        refresh=refresh,
        message=message,
        error=error,
        secret=form_secret,
        typed=typed,
        max_reason=MAX_REASON,
        plot=_svg(_best_so_far(history)),
    )
    return Response(html, status=status, mimetype="text/html")


_TEMPLATE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<title>Party console: {{ state.state }}</title>
{% if refresh %}<meta http-equiv="refresh" content="{{ refresh }}">{% endif %}
<style>
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 960px; color: #222; }
table { border-collapse: collapse; margin: .5em 0; }
td, th { border: 1px solid #ccc; padding: .25em .6em; text-align: left; }
.state { font-size: 1.3em; font-weight: 600; }
.error { background: #fdecea; border: 1px solid #e57373; padding: .6em; }
.ok { background: #e8f5e9; border: 1px solid #81c784; padding: .6em; }
.point { border: 1px solid #bbb; padding: .8em; margin: .8em 0; }
code { font-size: .95em; }
</style></head><body>
<h1>Party console</h1>
<p>Folder <code>{{ folder }}</code></p>
<p class="state" id="state">{{ state.state }}</p>
<p>{{ state.pending }} pending, {{ state.reported }} of {{ state.asked }} reported
{%- if state.abandoned %}, {{ state.abandoned }} abandoned{% endif %}
{%- for k, v in state.context.items() %}; {{ k }} {{ v }}{% endfor %}</p>
{% if error %}<p class="error" id="error" role="alert">{{ error }}</p>{% endif %}
{% if message %}<p class="ok" id="message">Reported at point <code>{{ message }}</code>.</p>
{% endif %}
{% for name in state.damaged %}<p class="error">{{ name }} is damaged (unreadable or
edited): a pending point's file is written again by its run; a damaged report counts as a
failed measurement.</p>{% endfor %}

<h2>Waiting for you</h2>
{% if not pending %}<p id="nothing">Nothing pending.</p>{% endif %}
{% for ask in pending %}
<div class="point" id="point-{{ ask.id }}">
<p><b>{{ ask.objective }}</b>, point {{ ask.sequence }}
{% if ask.context.round is defined %}(round {{ ask.context.round }}){% endif %};
{{ "smaller" if ask.minimize else "larger" }} is better
{%- if ask.range %}; measurements lie in [{{ ask.range[0] }}, {{ ask.range[1] }}]{% endif %}.
Id <code>{{ ask.id }}</code></p>
<table><tr><th>input</th><th>value</th><th>domain</th></tr>
{% for x in ask.x %}<tr><td>{{ (ask.names or [])[loop.index0] or "x" ~ loop.index }}</td>
<td class="x">{{ x }}</td>
<td>{% if ask.bounds %}{% set b = ask.bounds[loop.index0] %}[{{ b[0] }}, {{ b[1] }}]{% endif %}</td>
</tr>
{% endfor %}</table>
<form method="post" action="/report">
<input type="hidden" name="secret" value="{{ secret }}">
<input type="hidden" name="id" value="{{ ask.id }}">
<input type="hidden" name="kind" value="value">
<label>Measured value <input name="value" inputmode="decimal" autocomplete="off"
 value="{{ typed[1] if typed and typed[0] == ask.id else '' }}"></label>
<button type="submit">Report the value</button></form>
<form method="post" action="/report">
<input type="hidden" name="secret" value="{{ secret }}">
<input type="hidden" name="id" value="{{ ask.id }}">
<input type="hidden" name="kind" value="failed">
<label>Or: it failed, because <input name="reason" maxlength="{{ max_reason }}"
 autocomplete="off"></label>
<button type="submit">Report a failure</button></form>
</div>
{% endfor %}

<h2>Best value so far</h2>
{% if plot %}{{ plot | safe }}{% else %}<p>No value reported yet.</p>{% endif %}
<p>This party's own reports; the federation's best is not shared with parties.</p>

<h2>History</h2>
{% if not history %}<p>No point asked yet.</p>{% else %}
<table id="history"><tr><th>objective</th><th>#</th><th>round</th><th>x</th><th>report</th></tr>
{% for e in history %}<tr><td>{{ e.objective }}</td><td>{{ e.sequence }}</td>
<td>{{ e.context.round if e.context.round is defined else "" }}</td><td>{{ e.x }}</td>
<td>{% if e.value is defined %}{{ e.value }}{% elif e.failed is defined %}failed:
{{ e.failed }}{% else %}{{ e.state }}{% endif %}</td></tr>
{% endfor %}</table>{% endif %}
</body></html>
"""
