r"""The errors of the loopback Flower federation's launcher (:mod:`.launcher`) and of
:func:`~.submission.submit`: a federation that could not be started, reached or
stopped, a state folder with no live federation, one with a running federation, and a
request to change a federation some of whose processes still run.
"""

from __future__ import annotations

from pathlib import Path

__all__ = [
    "FederationChangedError",
    "FederationRunningError",
    "FlowerLaunchError",
    "NoFederationError",
]


class FlowerLaunchError(RuntimeError):
    r"""A Flower federation could not be started, reached or stopped."""


class NoFederationError(FlowerLaunchError):
    r"""A state folder has no live federation (no SuperLink running): :func:`~.submission.submit`.

    Attributes:
        state: The state folder (resolved).
    """

    def __init__(self, state: Path) -> None:
        self.state = state
        super().__init__(
            f"no live federation in {state}: start one with up(clients, {str(state)!r})"
        )


class FederationRunningError(FlowerLaunchError):
    r"""A state folder already has a running federation: :func:`~.launcher.up`.

    Attributes:
        state: The state folder (resolved).
        live: Names of its processes that still run.
    """

    def __init__(self, state: Path, live: list[str]) -> None:
        self.state = state
        self.live = list(live)
        super().__init__(
            f"{state} already has a running federation ({', '.join(live)}); run "
            f"down({str(state)!r}) first, or give up() another state folder for a second one"
        )


class FederationChangedError(FlowerLaunchError):
    r""":func:`~.launcher.up` was asked to restart the dead processes of a federation
    whose other processes still run, with other arguments than it was started with
    (``clients``, ``port``, a party's policy flags, ``ask_tell``, the interpreter).

    Attributes:
        state: The state folder (resolved).
        live: Names of its processes that still run.
        changes: One sentence per difference between the request and the record.
    """

    def __init__(self, state: Path, live: list[str], changes: list[str]) -> None:
        self.state = state
        self.live = list(live)
        self.changes = list(changes)
        super().__init__(
            f"{state} holds a federation of which {', '.join(live)} still run, started "
            f"with other arguments: {'; '.join(changes)}. up() restarts its dead processes "
            "only as they were started: call it with the arguments the federation was "
            f"started with, or down({str(state)!r}) first and start afresh"
        )
