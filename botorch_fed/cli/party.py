r"""``botorch-fed party status|suggest|report``: the operator's commands of an ask/tell
party (:class:`~botorch_fed.problems.ask_tell.Party`), over the folder its
:class:`~botorch_fed.problems.ask_tell.AskTellObjective` asks in."""

from __future__ import annotations

import argparse
import json
import math

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from botorch_fed.cli.run import print_error


def add_party_parser(sub: argparse._SubParsersAction) -> None:
    r"""The ``party`` sub-command's parser."""
    p = sub.add_parser("party", help="an ask/tell party's pending points and reports")
    commands = p.add_subparsers(dest="party_command", required=True)
    for name, help_ in (
        ("status", "the party's run state, pending points and history"),
        ("suggest", "the pending point(s), each with its id"),
        ("report", "report the measurement at a pending point, or its failure"),
    ):
        c = commands.add_parser(name, help=help_)
        c.add_argument("--folder", required=True, help="the party's ask/tell folder")
        if name == "suggest":
            c.add_argument("--json", action="store_true", help="print JSON")
        if name == "report":
            c.add_argument("--id", required=True, help="the point's id (from suggest)")
            given = c.add_mutually_exclusive_group(required=True)
            given.add_argument("--value", type=float, help="the measured value")
            given.add_argument("--failed", metavar="REASON", help="the measurement failed")


def party_main(args: argparse.Namespace, console: Console) -> int:
    r"""Run ``botorch-fed party ...``; 0 on success, 2 on a refused report."""
    from botorch_fed.problems.ask_tell import Party

    party = Party(args.folder)
    if not party.folder.is_dir():
        print_error(console, f"--folder {args.folder}: no such folder.")
        return 2
    if args.party_command == "report":
        try:
            if args.failed is not None:
                party.report_failure(args.id, args.failed)
            else:
                if not math.isfinite(args.value):
                    raise ValueError(f"`--value`={args.value} must be finite.")
                party.report(args.id, args.value)
        except ValueError as exc:
            print_error(console, str(exc))
            return 2
        console.print(f"reported {escape(args.id)}", soft_wrap=True)
        return 0
    pending = party.pending()
    if args.party_command == "suggest" and args.json:
        console.print_json(json.dumps(pending))
        return 0
    table = Table("id", "objective", "#", "x", "report")
    rows = pending if args.party_command == "suggest" else party.history()
    for ask in rows:
        report = "pending" if "value" not in ask and "failed" not in ask else ask.get("value")
        if "failed" in ask:
            report = f"failed: {ask['failed']}"
        cells = (ask["id"], ask["objective"], ask["sequence"], ask["x"], report)
        table.add_row(*(escape(str(c)) for c in cells))
    if args.party_command == "status":
        active = party.active()
        console.print(f"run {'active' if active else 'not active'}; {len(pending)} pending")
    console.print(table)
    return 0
