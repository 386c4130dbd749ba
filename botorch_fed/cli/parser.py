r"""The argument parser of ``botorch-fed``: ``run <algorithm>`` (its parsers are in
:mod:`botorch_fed.runs.parser`), ``compare``, ``list``, ``demo``, ``flower``, ``party``.
"""

from __future__ import annotations

from botorch_fed import __version__
from botorch_fed.cli.compare import add_compare_parser
from botorch_fed.cli.demo import add_demo_parser
from botorch_fed.cli.flower import add_flower_parser
from botorch_fed.cli.party import add_party_parser
from botorch_fed.runs.parser import CommandParser, add_run_parser


def build_parser() -> CommandParser:
    r"""The argument parser of ``botorch-fed``.

    ``parser.run_parsers[algorithm]`` is ``(sub-parser, options)`` of ``run
    <algorithm>`` (``--config`` files are checked against the options and become the
    sub-parser's defaults).
    """
    parser = CommandParser(
        prog="botorch-fed",
        description="Federated and privacy-preserving Bayesian optimisation for BoTorch.",
    )
    parser.add_argument("--version", action="version", version=f"botorch-fed {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    parser.run_parsers = add_run_parser(sub)
    add_compare_parser(sub)
    sub.add_parser("list", help="list the registered algorithms")
    add_demo_parser(sub)
    add_flower_parser(sub)
    add_party_parser(sub)
    return parser
