r"""What a party's agent holds of each run it answers (:mod:`.agent`).

A run's :class:`Held` client, the message being computed at its position (:class:`Job`),
what a campaign's journal (:mod:`.campaign`) stores of the client between rounds
(:func:`saved_state`), how a restarted agent catches up with a round it had begun
(:func:`replay_round`), the epsilon a message may spend (:func:`epsilon_guard`) and what
the end of a run leaves (:func:`report_of`, :func:`finish_asking`).
"""

from __future__ import annotations

import functools
import hashlib
import json
import sys
import threading

from botorch_fed.flower.campaign import CampaignJournal
from botorch_fed.flower.party_build import quiet
from botorch_fed.flower.party_errors import refusal
from botorch_fed.flower.policy import PolicyError
from botorch_fed.flower.records import decode_frame, encode_frame
from botorch_fed.flower.run_options import run_hold
from botorch_fed.protocol.bundle import BUNDLE, MAX_PARTS
from botorch_fed.protocol.messages import TIME_PREFIX, Message
from botorch_fed.protocol.secure_sum import SECAGG


class Held:
    r"""A run this agent holds: its client, when it last had a message, the next
    position to compute, the message being computed and the last answer."""

    def __init__(self, client, journal: CampaignJournal | None = None) -> None:
        self.client = client
        self.journal = journal
        self.last = 0.0
        self.next_seq = 0
        self.stale = False  # a campaign restored behind its journal (StaleCampaign)
        self.job: Job | None = None
        self.answered: tuple[int, str, tuple] | None = None
        self.round: int | None = None  # the round of the last message begun
        self.context: dict = {}  # the run and round an ask/tell party's points show


class Job:
    r"""A message being computed: its position, round and digest; ``done`` is set once
    ``outcome`` holds ``("ok", payload)`` or ``("error", exception, wire text)``."""

    def __init__(self, seq: int, round_: int, digest: str) -> None:
        self.seq, self.round, self.digest = seq, round_, digest
        self.done = threading.Event()
        self.outcome: tuple = ()
        self.message: tuple[str, bytes] | None = None  # (type, payload frame): a campaign's
        self.state_before: dict | None = None  # the client's state, where a round begins


def saved_state(client) -> dict | None:
    r"""The client's state between rounds and its secure-aggregation role's (the sessions
    it joined, its randomness), or ``None`` in the middle of a secure sum."""
    from botorch_fed.protocol.declarations import ProtocolViolation

    try:
        state = client.state_dict()
    except ProtocolViolation:
        return None
    role = getattr(client, "secagg", None)
    return {"client": state, "role": "" if role is None else json.dumps(role.saved_state())}


def load_saved_state(client, saved: dict) -> None:
    r"""Restore :func:`saved_state` into a freshly built client of the same run."""
    client.load_state_dict(saved["client"])
    if saved["role"]:
        client.secagg.restore_state(json.loads(saved["role"]))


def releases(type_: str, payload: dict) -> int:
    r"""How many answers a message may release (a bundle: one per part), which the
    party's epsilon cap must allow before it runs (a malformed count: 1, and refused)."""
    parts = payload.get("parts") if type_ == BUNDLE else 1
    return parts if isinstance(parts, int) and 1 <= parts <= MAX_PARTS else 1


def timeless(payload: dict, fresh: frozenset[str] = frozenset()) -> bytes:
    r"""A reply payload as bytes, its stage timings left out (they differ every time), and
    the payloads of the bundled replies to the ``fresh`` message types (whose answers come
    out anew each time, e.g. CKKS ciphertexts) left out too."""
    kept = {k: payload[k] for k in sorted(payload) if not k.startswith(TIME_PREFIX)}
    if fresh and "parts" in kept:  # a reply to a bundle
        types = {k.partition("/")[2]: v for k, v in kept.items() if k.startswith("type/")}
        drop = {i for i, t in types.items() if t in fresh}
        kept = {
            k: v
            for k, v in kept.items()
            if k.startswith("type/") or k.partition("/")[0] not in drop
        }
    return encode_frame({}, kept)


class Busy(Exception):
    r"""A campaign to restore while another message is computed (answered "pending")."""


#: the most journalled answers a campaign keeps since its last round began
MAX_JOURNAL = 4096


class Answered(RuntimeError):
    r"""An error answer given before, given again: its text is what the server was told."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text


def position_of(meta: dict) -> tuple[int, int] | None:
    r"""``(seq, round)`` of a message (``None`` without a position), checked."""
    seq, round_ = meta.get("seq"), meta.get("round", 0)
    if seq is None:
        return None
    for name, value in (("seq", seq), ("round", round_)):
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 10**6:
            raise refusal(
                ValueError(f"The message's `{name}` must be in [0, 10^6), got {value!r:.40}.")
            )
    return seq, round_


def describe_run(key) -> str:
    return f"campaign {key[1]!r}" if isinstance(key, tuple) else str(key)


def options_digest(run_config) -> str:
    r"""A digest of what a run's clients are built from (its options and key set): a
    campaign resumes only with the same."""
    parts = {k: run_config.get(k) for k in ("argv", "keyset", "config", "clients")}
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


def replay_round(held: Held, journal: CampaignJournal, start: int, newest: int) -> None:
    r"""Continue campaign ``held`` from its journal: the client's state at the start of
    the round whose first message is ``start``, then the messages ``start..newest``
    handled again in order, each answer compared with the journalled one (none leaves
    the agent). Sets ``held.stale`` if one differs or an entry is missing. The caller
    holds the agent's compute lock."""
    entry = journal.read(start)
    assert entry is not None
    quiet(functools.partial(load_saved_state, held.client, entry["state"]))
    # CKKS encrypts with TenSEAL's own randomness, which nothing can seed: a
    # secure-sum step's ciphertext comes out anew (it never leaves the agent), all
    # the role keeps of it is drawn from its seeded generator
    fresh = getattr(getattr(held.client.secagg, "backend", None), "name", "") == "ckks"
    for seq in range(start, newest + 1):
        entry = journal.read(seq)
        if entry is None:
            held.stale = True
            return
        held.round = held.context["round"] = int(entry["round"])
        message = Message(entry["type"], decode_frame(entry["message"][8:])[1])
        skip = frozenset({SECAGG}) if fresh else frozenset()
        try:
            reply = quiet(functools.partial(held.client.handle, message))
            again: str | bytes = timeless(reply.payload, skip)
        except Exception as exc:  # noqa: BLE001 - compared with the journal
            again = f"error: {type(exc).__name__}"
        logged = entry["reply"]
        told: str | bytes = f"error: {str(entry['error']).split(':', 1)[0]}"
        if logged is not None:
            told = timeless(decode_frame(logged[8:])[1], skip)
        if fresh and entry["type"] == SECAGG and isinstance(again, bytes):
            again = told if isinstance(told, bytes) else again
        if again != told:
            print(
                f"campaign {journal.name}: message #{seq} answered differently when "
                "handled again; the campaign cannot go on for this party",
                file=sys.stderr,
            )
            held.stale = True
            return


def report_of(client) -> dict:
    r"""What the harness scores: the client's history and privacy ledger (JSON)."""
    ledger = getattr(client, "privacy_ledger", None)
    return {
        "history": json.dumps(client.history),
        "privacy": "" if ledger is None else json.dumps(ledger.state_dict()),
    }


def hold_of(run_config) -> float:
    r"""The run config's ``hold`` (seconds), checked (a public refusal otherwise)."""
    try:
        return run_hold(run_config if hasattr(run_config, "get") else {})
    except ValueError as exc:
        raise refusal(exc) from None


def finish_asking(client) -> None:
    r"""The ask/tell objective of a run that ended (the server asked for the final
    report) records it: its operator reads ``"finished"``
    (:meth:`~botorch_fed.problems.ask_tell.AskTellObjective.finish`)."""
    from botorch_fed.problems.ask_tell import AskTellObjective

    objective = getattr(client, "objective", None)
    if isinstance(objective, AskTellObjective):
        try:
            objective.finish()
        except OSError as exc:  # what the operator reads only: the report still leaves
            print(f"could not record the run as finished: {exc}", file=sys.stderr)


def epsilon_guard(client, spent: float, cap: float, party: int, answers: int = 1):
    r"""Refuse a message whose ``answers`` LDP releases could take a party that has spent
    ``spent`` epsilon over all its runs past ``cap`` (``--max-total-epsilon``); return a
    function giving the epsilon ``client`` released since (``None`` for a client that
    releases nothing). ``party``: the party's client id in the client's ledger."""
    mechanism = getattr(client, "mechanism", None)
    ledger = getattr(client, "privacy_ledger", None)
    if mechanism is None or ledger is None:
        return None
    if spent + answers * float(mechanism.epsilon) > cap * (1 + 1e-12):
        what = "Another answer" if answers == 1 else f"{answers} more answers"
        raise refusal(
            PolicyError(
                f"{what} at epsilon = {float(mechanism.epsilon):g} would take this "
                "party past the epsilon it spends over all its runs "
                "(--max-total-epsilon)."
            )
        )
    before = ledger.spent(party)[0]
    return lambda: ledger.spent(party)[0] - before
