r"""How the command line prints an error (light: the operator's commands use it)."""

from __future__ import annotations

import sys

from rich.console import Console
from rich.markup import escape


def print_error(console: Console, message: str, title: str = "error:") -> None:
    r"""``message`` in red after ``title``, verbatim (not read as markup), on standard
    error (as argparse's own errors) unless ``console`` writes to a file of its own."""
    if console.file is sys.stdout:
        console = Console(stderr=True)  # colour as standard error allows
    console.print(f"[bold red]{title}[/] {escape(message)}", soft_wrap=True)
