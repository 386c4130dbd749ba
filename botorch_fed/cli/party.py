r"""``botorch-fed party status|suggest|report``: the operator's commands of an ask/tell
party (:class:`~botorch_fed.problems.ask_tell.Party`), over the folder its
:class:`~botorch_fed.problems.ask_tell.AskTellObjective` asks in: ``--folder DIR``, or
``--party I`` of a federation ``botorch-fed flower up --ask-tell`` started (its state
folder's ``parties/party-<I>-ask``)."""

from __future__ import annotations

import argparse
import json

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from botorch_fed.cli.errors import print_error


def add_party_parser(sub: argparse._SubParsersAction) -> None:
    r"""The ``party`` sub-command's parser."""
    p = sub.add_parser("party", help="an ask/tell party's pending points and reports")
    commands = p.add_subparsers(dest="party_command", required=True)
    for name, help_ in (
        ("status", "the party's run state, pending points and history"),
        ("suggest", "the pending point(s), each with its id"),
        ("report", "report the measurement at a pending point, or its failure"),
        ("console", "a local web page to see the pending points and report them"),
    ):
        c = commands.add_parser(name, help=help_)
        where = c.add_mutually_exclusive_group(required=True)
        where.add_argument("--folder", help="the party's ask/tell folder")
        where.add_argument(
            "--party",
            type=int,
            metavar="I",
            help="party I of the federation `botorch-fed flower up --ask-tell` started",
        )
        c.add_argument(
            "--state-dir",
            default=None,
            metavar="DIR",
            help="that federation's state folder (default: `flower up`'s)",
        )
        if name in ("suggest", "status"):
            c.add_argument("--json", action="store_true", help="print JSON")
        if name == "console":
            c.add_argument("--host", default="127.0.0.1", help="the address to listen on")
            c.add_argument("--port", type=int, default=8050, help="the port (default 8050)")
            c.add_argument(
                "--allow-remote",
                action="store_true",
                help="listen on a --host other than 127.0.0.1: every visitor then needs the "
                "token the console prints (a new one each start)",
            )
        if name == "report":
            c.add_argument("--id", required=True, help="the point's id (from suggest)")
            given = c.add_mutually_exclusive_group(required=True)
            given.add_argument("--value", help="the measured value (negative: --value=-1.5)")
            given.add_argument("--failed", metavar="REASON", help="the measurement failed")


def party_main(args: argparse.Namespace, console: Console) -> int:
    r"""Run ``botorch-fed party ...``; 0 on success, 1 if a file of the folder is damaged,
    2 on a refused report or a missing folder."""
    from botorch_fed.problems.ask_folder import Party

    folder, flag = args.folder, f"--folder {args.folder}"
    if args.party is not None:
        from botorch_fed.cli.flower import default_state_dir
        from botorch_fed.flower.state_folder import ask_folder

        state = default_state_dir() if args.state_dir is None else args.state_dir
        folder, flag = ask_folder(state, args.party), f"--party {args.party}"
    elif args.state_dir is not None:
        print_error(console, "--state-dir goes with --party, not --folder.")
        return 2
    party = Party(folder)
    if args.party_command == "console":  # it waits for the folder, as the operator does
        return _console(party, args, console)
    if not party.folder.is_dir():
        print_error(
            console,
            f"{flag}: no ask/tell folder at {party.folder} (is the party started with "
            "`--ask-tell`, and has its run asked a point yet?).",
        )
        return 2
    if args.party_command == "report":
        return _report(party, args, console)
    status = party.status()
    if args.json:
        out = status if args.party_command == "status" else party.pending()
        print(json.dumps(out, indent=1))  # plain: scripts parse it (no colour codes)
        return 1 if status["damaged"] else 0
    for name in status["damaged"]:
        print_error(
            console,
            f"{party.folder / name} is damaged (unreadable or edited). A pending point's "
            "file is written again by the run that asked it within seconds; a damaged "
            "report counts as a failed measurement.",
            "warning:",
        )
    if args.party_command == "status":
        context = status["context"]
        where = f" ({', '.join(f'{k} {v}' for k, v in context.items())})" if context else ""
        abandoned = f", {status['abandoned']} abandoned" if status["abandoned"] else ""
        console.print(
            _printable(
                f"{status['state']}: {status['pending']} pending, {status['reported']} of "
                f"{status['asked']} reported{abandoned}{where}"
            ),
            soft_wrap=True,
            markup=False,
        )
    rows = party.pending() if args.party_command == "suggest" else party.history()
    if not rows:
        console.print(
            f"nothing pending ({status['state']})"
            if args.party_command == "suggest"
            else "no point asked yet",
            markup=False,
        )
        return 1 if status["damaged"] else 0
    for ask in rows[:1] if args.party_command == "suggest" else ():
        if "bounds" in ask:  # the domain and direction the run asks in
            better = "smaller" if ask.get("minimize") else "larger"
            names = ask.get("names") or [f"x{i + 1}" for i in range(len(ask["bounds"]))]
            inputs = ", ".join(
                f"{_printable(n)} in [{lo:g}, {hi:g}]"
                for n, (lo, hi) in zip(names, ask["bounds"], strict=True)
            )
            span = ask.get("range")
            within = "" if span is None else f"; values lie in [{span[0]:g}, {span[1]:g}]"
            console.print(
                f"domain: {inputs}; {better} is better{within}", markup=False, soft_wrap=True
            )
    table = Table("objective", "#", "round")
    table.add_column("x", overflow="fold")  # what to measure: folded, never cut
    table.add_column("id", no_wrap=True)  # what the operator reports to: never cut
    table.add_column("report", overflow="fold")  # as written, folded
    for ask in rows:
        report = ask.get("state", "pending")
        if "value" in ask:
            report = f"{ask['value']!r}"
        elif "failed" in ask:
            report = f"failed: {ask['failed']}"
        round_ = ask.get("context", {}).get("round", "")
        cells = (ask["objective"], ask["sequence"], round_, ask["x"], ask["id"], report)
        table.add_row(*(escape(_printable(str(c))) for c in cells))
    console.print(table)
    return 1 if status["damaged"] else 0


def _console(party, args: argparse.Namespace, console: Console) -> int:
    r"""``party console``: serve the party's web console until Ctrl-C; 2 if refused."""
    import secrets

    from botorch_fed.console.app import LOOPBACK_NAMES

    loopback = args.host in (*LOOPBACK_NAMES, "::1")
    if not loopback and not args.allow_remote:
        print_error(
            console,
            f"--host {args.host}: the console listens on 127.0.0.1 unless --allow-remote "
            "is given (visitors then need the token it prints).",
        )
        return 2
    if not 0 < args.port < 65536:
        print_error(console, f"--port {args.port} must be 1..65535.")
        return 2
    try:
        from werkzeug.serving import run_simple

        from botorch_fed.console import create_app
    except ImportError:
        print_error(console, 'the console needs Flask: pip install "botorch-fed[console]".')
        return 2
    token = secrets.token_urlsafe(24)  # a new one each start, never on the command line
    app = create_app(party.folder, token=token, loopback_only=loopback)
    host = f"[{args.host}]" if ":" in args.host else args.host
    where = f"http://{host}:{args.port}/?token={token}"
    console.print(
        f"party console of {party.folder}: {where} (Ctrl-C stops it)",
        markup=False,
        soft_wrap=True,  # the address whole, to copy
    )
    run_simple(args.host, args.port, app, threaded=True, request_handler=_quiet_handler())
    return 0


def _quiet_handler():
    r"""Werkzeug's request handler logging each request without its query (which may
    carry the console's token)."""
    from werkzeug.serving import WSGIRequestHandler

    class QuietHandler(WSGIRequestHandler):
        def log_request(self, code="-", size="-") -> None:
            path = getattr(self, "path", "") or ""  # unset on a malformed request line
            command = getattr(self, "command", "") or ""
            self.log("info", '"%s %s" %s', command, path.split("?", 1)[0], code)

    return QuietHandler


def _report(party, args: argparse.Namespace, console: Console) -> int:
    r"""``party report``: the value (or failure) recorded, echoed; 2 if refused."""
    point_id = args.id.lower()  # as `suggest` shows it
    try:
        if args.failed is not None:
            if not args.failed.strip():
                raise ValueError("--failed needs a reason (what went wrong).")
            party.report_failure(point_id, args.failed)
        else:
            value = _number(args.value)
            party.report(point_id, value)
    except ValueError as exc:
        print_error(console, _printable(str(exc)))
        return 2
    told = party.answer(point_id)
    console.print(_printable(f"reported {told} at point {point_id}"), markup=False, soft_wrap=True)
    return 0


def _number(text: str) -> float:
    r"""``--value`` as a finite float; ValueError naming it otherwise."""
    from botorch_fed.problems.ask_folder import parse_value

    return parse_value(text, "--value")


def _printable(text: str) -> str:
    r"""``text`` with control characters (terminal escapes) shown as ``?``."""
    return "".join(c if c.isprintable() or c in "\n" else "?" for c in text)
