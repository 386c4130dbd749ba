r"""``botorch-fed party status|suggest|report``: the operator's commands of an ask/tell
party (:class:`~botorch_fed.problems.ask_tell.Party`), over the folder its
:class:`~botorch_fed.problems.ask_tell.AskTellObjective` asks in: ``--folder DIR``, or
``--party I`` of a federation ``botorch-fed flower up --ask-tell`` started (its state
folder's ``parties/party-<I>-ask``)."""

from __future__ import annotations

import argparse
import json
import math

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
        if name == "suggest":
            c.add_argument("--json", action="store_true", help="print JSON")
        if name == "report":
            c.add_argument("--id", required=True, help="the point's id (from suggest)")
            given = c.add_mutually_exclusive_group(required=True)
            given.add_argument("--value", type=float, help="the measured value")
            given.add_argument("--failed", metavar="REASON", help="the measurement failed")


def party_main(args: argparse.Namespace, console: Console) -> int:
    r"""Run ``botorch-fed party ...``; 0 on success, 2 on a refused report."""
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
    if not party.folder.is_dir():
        print_error(
            console,
            f"{flag}: no ask/tell folder at {party.folder} (is the party started with "
            "`--ask-tell`, and has its run asked a point yet?).",
        )
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
        print(json.dumps(pending, indent=1))  # plain: scripts parse it (no colour codes)
        return 0
    table = Table("objective", "#", "round", "x")
    table.add_column("id", no_wrap=True)  # what the operator reports to: never cut
    table.add_column("report", overflow="fold")  # as written, folded
    rows = pending if args.party_command == "suggest" else party.history()
    for ask in rows:
        report = "pending" if "value" not in ask and "failed" not in ask else ask.get("value")
        if "failed" in ask:
            report = f"failed: {ask['failed']}"
        round_ = ask.get("context", {}).get("round", "")
        cells = (ask["objective"], ask["sequence"], round_, ask["x"], ask["id"], report)
        table.add_row(*(escape(str(c)) for c in cells))
    if args.party_command == "status":
        status = party.status()
        context = status["context"]
        where = f" ({', '.join(f'{k} {v}' for k, v in context.items())})" if context else ""
        console.print(
            f"{status['state']}: {status['pending']} pending, {status['reported']} of "
            f"{status['asked']} reported{where}",
            soft_wrap=True,
            markup=False,
        )
    for ask in pending[:1] if args.party_command == "suggest" else ():
        if "bounds" in ask:  # the domain and direction the run asks in
            better = "smaller" if ask.get("minimize") else "larger"
            console.print(f"domain {ask['bounds']}; {better} is better", markup=False)
    console.print(table)
    return 0
