r"""A party's journal of a campaign: a Flower run that survives restarts.

A *campaign* is a run whose run config names it (``campaign``). The ServerApp
checkpoints its program after every round; a resumed ServerApp (``botorch-fed flower
resume``) starts again from the last round it checkpointed and sends that round's
messages again, in the same order and with the same content (its randomness is part of
its checkpoint). Each party therefore keeps, per campaign, a :class:`CampaignJournal` in
its agent's state folder:

- for every message it answered: its sequence number and round, the message, the reply
  it sent (the exact frame) and, with the first message of each round, the client's
  state before it (between rounds);
- ``campaign.json``: the campaign's name, a digest of its options and the key of the
  party's secure-aggregation randomness (its own secret, from the OS).

A message the party answered before is answered from the journal, byte for byte, and
only if it is the same message (its digest): the party never sends a second, different
answer at one position (two answers to a secure sum or an LDP release could tell the
server what one answer hides). A restarted agent restores the client's state at the start
of the newest round in the journal (with its secure-aggregation role's: the sessions it
joined and its randomness, a ChaCha20 stream keyed by the party's own secret in
``campaign.json``) and
handles that round's journalled messages again, in order, inside the agent: each answer
must come out as the one journalled (timings aside; a CKKS ciphertext comes out anew, as
TenSEAL's encryption randomness cannot be seeded), and none of them leaves the agent (the
server gets the journalled ones). Where one differs, the agent still answers again what it
answered but computes nothing new for the campaign (:class:`StaleCampaign`).

Entries are written atomically (a temporary file, fsync, rename) before the reply
leaves the agent. An entry is removed once it is older than the newest entry holding a
state and its round is older than the one before the newest: a resumed server goes back
at most to the start of the round in progress (or, when its last checkpoint write was
cut off, of the round before).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
from pathlib import Path

import torch

from botorch_fed.protocol.checkpoint import write_atomically

__all__ = ["CampaignJournal", "StaleCampaign", "message_digest"]

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
_ENTRY = re.compile(r"m(\d{10})-r(\d{6})(-s)?\.pt")
MANIFEST = "campaign.json"
ENDED = "ended"


class StaleCampaign(RuntimeError):
    r"""The agent restarted in the middle of a secure sum: it replays what it answered
    but cannot compute new answers for the campaign."""


def message_digest(type_: str, frame: bytes) -> str:
    r"""SHA-256 (hex) of a message's type and its payload frame."""
    return hashlib.sha256(type_.encode() + b"\x00" + frame).hexdigest()


def check_name(value: object, key: str = "campaign") -> str:
    r"""``value`` if it is a plain campaign name (``ValueError`` naming ``key``)."""
    if not isinstance(value, str) or not NAME.fullmatch(value) or ".." in value:
        raise ValueError(
            f"The run config's `{key}` must be a plain name: 1-128 letters, digits, '_', "
            f"'.' or '-', got {value!r:.80}."
        )
    return value


def role_key_of(manifest: dict) -> bytes | None:
    r"""The 32-byte role key a campaign's manifest (a party's journal or the server's
    checkpoint) holds in hex as ``role_key``; ``None`` if it holds none that is one."""
    try:
        key = bytes.fromhex(manifest["role_key"])
    except (KeyError, TypeError, ValueError):
        return None
    return key if len(key) == 32 else None


class CampaignJournal:
    r"""One party's journal of one campaign, in ``folder`` (created ``0700``).

    Args:
        folder: The campaign's folder in the agent's state folder.
        name: The campaign's name.
        options: A digest of the campaign's options: a journal of other options is
            refused (:meth:`open`).
    """

    def __init__(self, folder: str | os.PathLike, name: str, options: str) -> None:
        self.folder = Path(folder)
        self.name = check_name(name)
        self.options = str(options)
        self.role_key: bytes | None = None  # :meth:`open` reads it

    def exists(self) -> bool:
        r"""Whether the campaign began on this party."""
        return (self.folder / MANIFEST).is_file()

    def begin(self, role_key: bytes) -> None:
        r"""Record that the campaign begins (its folder and manifest), with the key of
        the party's secure-aggregation randomness (the party's own secret, from the OS: a
        restarted agent keys its role alike, so the round it handles again draws what it
        drew)."""
        self.folder.parent.mkdir(mode=0o700, exist_ok=True)  # the names are the party's
        self.folder.mkdir(mode=0o700, exist_ok=True)
        manifest = {
            "format": 1,
            "campaign": self.name,
            "options": self.options,
            "role_key": role_key.hex(),
        }
        write_atomically(self.folder / MANIFEST, json.dumps(manifest).encode())

    def end(self, report: dict) -> None:
        r"""Record that the campaign is over on this party, with its final report (what
        a resumed server asking for the report again gets)."""
        write_atomically(self.folder / ENDED, json.dumps(report).encode())

    def ended(self) -> bool:
        r"""Whether the campaign is over on this party."""
        return (self.folder / ENDED).exists()

    def report(self) -> dict | None:
        r"""The final report :meth:`end` recorded (``None``: none, or unreadable)."""
        try:
            report = json.loads((self.folder / ENDED).read_text())
        except (OSError, ValueError):
            return None
        return report if isinstance(report, dict) else None

    def open(self) -> None:
        r"""Check that the journal is this campaign's, with the same options.

        Raises:
            ValueError: Another campaign's journal, or other options (a public refusal:
                it depends on the run config and the party's own bookkeeping only).
        """
        try:
            manifest = json.loads((self.folder / MANIFEST).read_text())
        except (OSError, ValueError):
            raise ValueError(
                f"Campaign {self.name!r}: this party's journal of it is unreadable."
            ) from None
        if not isinstance(manifest, dict) or manifest.get("campaign") != self.name:
            raise ValueError(f"Campaign {self.name!r}: this party's journal is another's.")
        if manifest.get("options") != self.options:
            raise ValueError(
                f"Campaign {self.name!r} began on this party with other options; a campaign "
                "resumes only with the options it began with."
            )
        key = role_key_of(manifest)
        if key is None:
            raise ValueError(f"Campaign {self.name!r}: this party's journal is unreadable.")
        self.role_key = key

    def _entries(self) -> dict[int, tuple[int, bool, Path]]:
        r"""``{seq: (round, holds a state, path)}`` of the journal's entries."""
        out = {}
        for path in self.folder.iterdir():
            if (m := _ENTRY.fullmatch(path.name)) is not None:
                out[int(m.group(1))] = (int(m.group(2)), bool(m.group(3)), path)
        return out

    def size(self) -> int:
        r"""How many answers the journal holds."""
        return len(self._entries())

    def read(self, seq: int) -> dict | None:
        r"""The entry of message ``seq`` (``None`` if not journalled).

        Raises:
            ValueError: The entry does not load or is not the one its name says.
        """
        found = self._entries().get(int(seq))
        if found is None:
            return None
        path = found[2]
        try:
            entry = torch.load(io.BytesIO(path.read_bytes()), weights_only=True)
        except Exception as exc:  # noqa: BLE001 - any unpickling failure
            raise ValueError(
                f"Campaign {self.name!r}: {path.name} does not load ({exc})."
            ) from None
        if not isinstance(entry, dict) or entry.get("seq") != seq:
            raise ValueError(f"Campaign {self.name!r}: the journal entry {path.name} is corrupt.")
        return entry

    def last(self) -> tuple[int | None, int | None]:
        r"""``(newest seq, newest seq whose entry holds the client's state before it)``
        (``None`` where there is none)."""
        entries = self._entries()
        with_state = [seq for seq, (_, has, _) in entries.items() if has]
        return max(entries, default=None), max(with_state, default=None)

    def record(
        self,
        seq: int,
        round_: int,
        digest: str,
        message: tuple[str, bytes],
        reply: bytes | None,
        error: str | None,
        state: dict | None,
    ) -> None:
        r"""Journal the answer to message ``seq`` before it leaves the agent: the message
        (its type and payload frame), the reply frame or the error text the server is
        told, and ``state``, the client's state before the message (the first message of
        each round: the client's state between rounds); then remove the entries neither
        a resumed server nor a restarted agent needs any more."""
        entry = {
            "seq": int(seq),
            "round": int(round_),
            "digest": digest,
            "type": message[0],
            "message": message[1],
            "reply": reply,
            "error": error,
            "state": state,
        }
        buf = io.BytesIO()
        torch.save(entry, buf)
        name = f"m{int(seq):010d}-r{int(round_):06d}{'-s' if state is not None else ''}.pt"
        write_atomically(self.folder / name, buf.getvalue())
        entries = self._entries()
        restart = max((q for q, (_, has, _) in entries.items() if has), default=0)
        for q, (r, _, path) in entries.items():
            if q < restart and r < int(round_) - 1:
                path.unlink(missing_ok=True)
