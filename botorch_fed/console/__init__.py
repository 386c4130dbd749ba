r"""The party console: a small local web application for the operator of an ask/tell
party (``botorch-fed party console``), on the folder the party's
:class:`~botorch_fed.problems.ask_tell.AskTellObjective` asks in -- the same state the
``party suggest|report|status`` commands read and write (:class:`~botorch_fed.problems.
ask_folder.Party`), so the console and the commands can be used together.

Server-rendered pages (Flask, the ``console`` extra); no build toolchain.
"""

from botorch_fed.console.app import create_app

__all__ = ["create_app"]
