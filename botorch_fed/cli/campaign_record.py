r"""A campaign's record in ``flower run --run-dir DIR`` (``DIR/campaign.json``): its name,
run config, command line, federation and Flower run ids, what ``flower resume`` submits
again (:mod:`.flower`)."""

from __future__ import annotations

import json
import os
import shlex
import uuid
from pathlib import Path

CAMPAIGN_FILE = "campaign.json"


def cli_dir(state: str | os.PathLike[str]) -> str:
    r"""A folder as a user types it on the command line (quoted where the shell needs it)."""
    return shlex.quote(str(state))


def begin_campaign(folder: Path, state: Path, config: dict, argv: list[str]) -> Path:
    r"""Record a new campaign in ``folder`` (``--run-dir``, created): its name and run config, what
    ``flower resume`` submits again."""
    record = folder / CAMPAIGN_FILE
    if record.exists():
        raise ValueError(
            f"--run-dir {folder} holds a campaign already: continue it with `botorch-fed "
            f"flower resume {cli_dir(folder)}`, or give an empty folder."
        )
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    config["campaign"] = f"c-{uuid.uuid4().hex[:16]}"
    data = {
        "format": 1,
        "state_dir": str(state),
        "argv": argv,
        "config": config,
        "flower_runs": [],
    }
    write_record(record, data)
    return record


def write_record(path: Path, data: dict) -> None:
    from botorch_fed.protocol.checkpoint import write_atomically

    write_atomically(path, (json.dumps(data, indent=1) + "\n").encode())


def read_record(folder: Path) -> dict:
    r"""The campaign recorded in ``folder`` (``ValueError`` naming it otherwise)."""
    record = folder / CAMPAIGN_FILE
    try:
        data = json.loads(record.read_text())
        ok = (
            data.get("format") == 1
            and isinstance(data.get("argv"), list)
            and isinstance(data.get("config"), dict)
            and isinstance(data["config"].get("campaign"), str)
            and isinstance(data.get("state_dir"), str)
            and isinstance(data.get("flower_runs"), list)
        )
    except (OSError, ValueError, AttributeError):
        ok = False
    if not ok:
        raise ValueError(
            f"{folder} is not a campaign's folder ({CAMPAIGN_FILE} is missing or unreadable): "
            "give the folder `botorch-fed flower run --run-dir` wrote."
        )
    return data
