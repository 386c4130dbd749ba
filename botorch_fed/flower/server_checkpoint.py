r"""The ServerApp's side of a campaign: its program checkpointed after every round.

A campaign (run config ``campaign``) keeps, in the server's folder,
``campaigns/<campaign>/``, the in-process checkpoint format
(:func:`~botorch_fed.protocol.checkpoint.save_checkpoint`; one party, ``server``): the
server program's state (its ledger, round budget, what its algorithm keeps between
rounds), torch's global random state, the transport's message counts and the state of
the server's secure-aggregation randomness. A resumed ServerApp (run config
``resume``) loads it and runs the rounds after it: given the parties' journalled answers
(:mod:`.campaign`) it sends the same messages again, so the parties answer them from
their journals and the finished run equals the uninterrupted one.

The manifest also names the campaign, a digest of its options (a resume with other
options is refused) and the key of the server's secure-aggregation randomness when the
run gives no ``--crypto-seed`` (a ChaCha20 stream keyed from the OS when the campaign
begins; the server's own secret, kept on the server's machine).
"""

from __future__ import annotations

import json
import secrets
from pathlib import Path

import torch

from botorch_fed.flower.campaign import check_name, role_key_of
from botorch_fed.flower.run_options import _inside
from botorch_fed.protocol.checkpoint import (
    MANIFEST,
    CheckpointError,
    check_tensor,
    expect_keys,
    load_checkpoint,
    prepare_folder,
    save_checkpoint,
)

CAMPAIGNS_DIR = "campaigns"
FINISHED = "finished"

__all__ = ["CAMPAIGNS_DIR", "Campaign"]


class Campaign:
    r"""A campaign's checkpoint folder on the server's machine.

    Args:
        folder: The server's folder (``BOTORCH_FED_SERVER_DIR``).
        name: The campaign's name (the run config's ``campaign``).
        run_config: The run config (its options are digested).
        resume: Continue from the checkpoint (which must exist) rather than begin (no
            checkpoint may exist).

    Raises:
        ValueError: A name that is not plain, or a path out of the server's folder.
    """

    def __init__(self, folder, name: str, run_config, resume: bool) -> None:
        from botorch_fed.flower.agent_runs import options_digest

        self.name = check_name(name)
        where = _inside(Path(folder), (CAMPAIGNS_DIR, self.name), "campaign")
        (Path(folder) / CAMPAIGNS_DIR).mkdir(mode=0o700, exist_ok=True)
        self.folder = where
        self.folder.mkdir(mode=0o700, exist_ok=True)
        self.options = options_digest(run_config)
        self.resume = bool(resume)
        self.state: dict | None = None
        self.elapsed = 0.0
        self.role_key = secrets.token_bytes(32)

    def load(self) -> None:
        r"""Read the checkpoint of a resumed campaign (or check a new one has none).

        Raises:
            CheckpointError: A new campaign whose folder holds a checkpoint, a resumed
                one without one, or one of other options (naming the campaign).
        """
        exists = (self.folder / MANIFEST).exists()
        if not self.resume:
            if exists:
                raise CheckpointError(
                    f"Campaign {self.name!r} exists on the server: resume it "
                    "(`botorch-fed flower resume`) or give another name."
                )
            prepare_folder(self.folder)
            return
        if not exists:
            raise CheckpointError(
                f"Campaign {self.name!r} has no checkpoint on the server: nothing to resume."
            )
        if (self.folder / FINISHED).exists():
            raise CheckpointError(f"Campaign {self.name!r} finished: nothing to resume.")
        manifest, states = load_checkpoint(self.folder)
        if manifest.get("campaign") != self.name or manifest.get("options") != self.options:
            raise CheckpointError(
                f"Campaign {self.name!r} was checkpointed with other options; a campaign "
                "resumes only with the options it began with."
            )
        elapsed = manifest.get("time_s")
        key = role_key_of(manifest)
        if key is None:
            raise CheckpointError(f"Campaign {self.name!r}: `role_key` is not a 32-byte key.")
        if isinstance(elapsed, bool) or not isinstance(elapsed, int | float) or elapsed < 0:
            raise CheckpointError(f"Campaign {self.name!r}: `time_s` {elapsed!r} is not >= 0.")
        self.role_key, self.elapsed = key, float(elapsed)
        if manifest.get("begun") is True:  # no round ended: the run starts again
            return
        self.state = states["server"]
        expect_keys("server", self.state, ("round", "state", "torch_rng", "transport", "role"))

    def restore(self, server, transport, role) -> int:
        r"""Load the checkpoint into a freshly built ``server``, its ``transport`` and its
        secure-aggregation ``role`` (``None``: none); returns the round it ended."""
        assert self.state is not None
        state = self.state
        server.load_state_dict(state["state"])
        try:
            transport.load_state_dict(state["transport"])
            if role is not None and state["role"]:
                role.restore_random_state(json.loads(state["role"]))
        except (ValueError, TypeError) as exc:
            raise CheckpointError(f"Campaign {self.name!r}: {exc}") from None
        size = torch.get_rng_state().numel()
        rng = check_tensor("server", "torch_rng", state["torch_rng"], (size,), torch.uint8)
        torch.set_rng_state(rng)
        return int(state["round"])

    def begin(self) -> None:
        r"""Checkpoint a campaign that begins (its key and options, no state yet): a
        server that dies before its first round ends starts the campaign again on resume,
        and the parties answer what they answered from their journals."""
        info = {"campaign": self.name, "options": self.options, "begun": True}
        info |= {"role_key": self.role_key.hex(), "time_s": 0.0}
        save_checkpoint(self.folder, 0, {"server": {"round": 0}}, info)

    def finish(self) -> None:
        r"""Record that the campaign finished (its parties reported)."""
        (self.folder / FINISHED).touch()

    def save(self, t: int, server, transport, role, elapsed: float) -> None:
        r"""Checkpoint the server after round ``t`` (``elapsed``: this process's seconds)."""
        random_state = None if role is None else role.random_state()
        state = {
            "round": int(t),
            "state": server.state_dict(),
            "torch_rng": torch.get_rng_state(),
            "transport": transport.state_dict(),
            "role": "" if random_state is None else json.dumps(random_state),
        }
        info = {
            "campaign": self.name,
            "options": self.options,
            "role_key": self.role_key.hex(),
            "time_s": self.elapsed + float(elapsed),
        }
        save_checkpoint(self.folder, t, {"server": state}, info)
