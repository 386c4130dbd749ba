r"""The agent's :class:`PartyAgent`: it holds one party's client of every run and
answers the messages the ``ClientApp`` forwards (:mod:`.party` runs it).

Besides the protocol's messages the agent answers two of the harness:
``botorch_fed_hello`` (its partition id, so the server can map Flower's node ids to
client ids) and ``botorch_fed_report`` (the client's evaluation history and privacy
ledger, which the server's harness scores as the in-process runner reads them; only
with ``--share-results``; the run's client is dropped afterwards).

**What an error tells the server.** Nothing that depends on the party's private data
leaves it except through the algorithm's declared outputs -- no error text. An error
is one of two kinds, and :meth:`PartyAgent.reply` (what goes on the wire) treats them
apart:

- a *public refusal* (:func:`~.party_errors.is_public_refusal`): decided before the
  run's client is used, from the run's options, the party's policy and the agent's own
  bookkeeping only -- a policy refusal, options that do not parse or do not fit this
  federation, a run that is over, a full agent, the LDP epsilon cap.
  :meth:`PartyAgent.answer` marks each one where it decides it
  (:func:`~.party_errors.refusal`); its full text goes to the server, whose submitter
  needs it ("--allow-plaintext allows it").
- everything else, above all what the client raised while it handled a message (a
  :class:`~botorch_fed.protocol.declarations.ProtocolViolation` or a
  :class:`~botorch_fed.secure.errors.HeadroomError` may quote private values; so may
  the black box). The server learns only the error's type and what it sent itself:
  the client id, the message type, the secure sum's request and the round
  (:func:`~.party_errors.wire_error`). The full text and traceback go to the agent's
  log (stderr).

An error nobody marked is private: a new error path errs on the side of saying less.

**What the agent remembers** (``--state-file``): the runs it began, so that none starts
again, and the LDP epsilon it spent over all runs, in two files written so that each
event costs the same however long the party has run
(:class:`~.agent_state.AgentState`).
"""

from __future__ import annotations

import os
import sys
import threading
import time
import traceback
from collections import OrderedDict
from pathlib import Path

from botorch_fed.flower.agent_runs import (
    MAX_JOURNAL,
    Answered,
    Busy,
    Held,
    Job,
    describe_run,
    epsilon_guard,
    finish_asking,
    hold_of,
    options_digest,
    position_of,
    releases,
    replay_round,
    report_of,
    saved_state,
)
from botorch_fed.flower.agent_state import AgentState
from botorch_fed.flower.campaign import CampaignJournal, StaleCampaign, check_name, message_digest
from botorch_fed.flower.party_build import build_client, from_objective_import, quiet
from botorch_fed.flower.party_errors import _private, refusal, wire_error
from botorch_fed.flower.policy import PartyPolicy, PolicyError
from botorch_fed.flower.records import decode_frame, encode_frame
from botorch_fed.protocol.declarations import ProtocolViolation as ProtocolViolationError
from botorch_fed.protocol.messages import TIME_PREFIX, Message

HELLO = "botorch_fed_hello"
REPORT = "botorch_fed_report"
MAX_RUNS = 16
IDLE_BEFORE_DROP = 600.0  # seconds a held run must have been idle before it may be dropped
MAX_REMEMBERED = 100_000
r"""How many runs an agent remembers having begun (each must never start again); past
it the agent takes no new run until its operator moves the runs journal aside
(:class:`AgentState`)."""
#: the clients' work, one message at a time per process (torch's state is the process's,
#: shared by every agent in it: one in a deployment, several in a test)
_COMPUTE = threading.Lock()
#: why a run the agent began before it restarted is over
RESTARTED = "it began before this party's agent restarted"
_BUILD_REFUSALS = (PolicyError, ValueError)  # a build's refusals: policy, options, keys


class PartyAgent:
    r"""Holds this party's client of each run and answers its messages.

    Args:
        partition_id: This party's client id.
        num_partitions: How many clients the federation has.
        key_dir: Where this party's key material lies (``<key_dir>/<keyset>/``).
        threads: torch threads for this party's work.
        policy: What this party accepts from a run (:class:`PartyPolicy`; default:
            nothing beyond the protected defaults).
        state_file: Where the agent keeps the epsilon it spent (the runs it began go to
            ``<state_file>.runs``; :class:`AgentState`). ``None``: in memory only.
        clock: Seconds, for how long a run has been idle.
        ask_tell: This party's measurements are reported by its operator: every run's
            objective is replaced by an
            :class:`~botorch_fed.problems.ask_tell.AskTellObjective` asking in this
            folder, on the run's domain (``botorch-fed party suggest/report``).
    """

    def __init__(
        self,
        partition_id: int,
        num_partitions: int,
        key_dir: str | os.PathLike | None = None,
        threads: int = 1,
        policy: PartyPolicy | None = None,
        state_file: str | os.PathLike | None = None,
        clock=time.monotonic,
        ask_tell: str | os.PathLike | None = None,
    ) -> None:
        if not 0 <= int(partition_id) < int(num_partitions):
            raise ValueError(
                f"--partition-id must be in [0, {num_partitions}), got {partition_id}."
            )
        self.partition_id = int(partition_id)
        self.num_partitions = int(num_partitions)
        self.key_dir = None if key_dir is None else Path(key_dir)
        if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
            raise ValueError(f"--threads must be an int >= 1, got {threads!r}.")
        self.threads = threads
        self.policy = PartyPolicy() if policy is None else policy
        self.ask_tell = None if ask_tell is None else Path(ask_tell)
        # Flower run id, or ("campaign", name) -> its client; least recently active first
        self._runs: OrderedDict[int | tuple[str, str], Held] = OrderedDict()
        self._over: dict[int | tuple[str, str], str] = {}  # run -> why it is over
        self.epsilon_spent = 0.0  # LDP epsilon of every answer, over all runs
        self._clock = clock
        self._lock = threading.Lock()  # the agent's bookkeeping
        self._compute = _COMPUTE  # the clients' work: one message at a time
        self.state = None if state_file is None else AgentState(state_file)
        self.state_file = None if self.state is None else self.state.path
        if self.state is not None:
            began, self.epsilon_spent = self.state.load()
            self._over = dict.fromkeys(began, RESTARTED)

    def reply(self, meta: dict, payload: dict) -> tuple[dict, dict]:
        r""":meth:`answer` as it goes on the wire: never raises. An error becomes
        ``({"ok": False, "error": text}, {})`` with the text :func:`wire_error` allows;
        its full text and traceback go to the agent's log (stderr)."""
        try:
            return self.answer(meta, payload)
        except Answered as exc:  # told before, in these words
            return {"ok": False, "error": exc.text}, {}
        except Exception as exc:  # noqa: BLE001 - the server is told what it may know
            traceback.print_exc(file=sys.stderr)
            return {"ok": False, "error": wire_error(exc, self.partition_id, meta, payload)}, {}

    def answer(self, meta: dict, payload: dict) -> tuple[dict, dict]:
        r"""Answer one forwarded message: ``(meta, payload)`` in, out.

        A run's client is built at the run's first message and dropped at its report; a
        run is never started again, so a server cannot reset a client mid-run (to have
        its initial design evaluated again, or its users answer again with fresh noise).
        The agent holds at most :data:`MAX_RUNS` runs: a new one takes the place of the
        least recently active run if that one has been idle for more than
        :data:`IDLE_BEFORE_DROP` seconds, and is refused otherwise. With a
        ``state_file`` the runs it began and the epsilon spent outlive the process.

        **Positions and waiting.** The server's transport numbers each protocol message
        to this party (``meta["seq"]``, from 0, with the round in ``meta["round"]``).
        Each position is computed once: the message at the next position starts the
        client's work (in a worker thread, one message of all runs at a time); the
        answer goes back as soon as it is ready, or after the run config's ``hold``
        seconds as ``{"ok": True, "pending": True}`` (an ask/tell evaluation waits for
        the party's operator), and the server asks again with the same message. A
        message at a position already answered gets the same answer again (from the
        campaign's journal, :mod:`.campaign`, or the last answer in memory) if it is
        the same message, and is refused otherwise; a message that skips a position is
        refused. A message without a position is answered when ready, however long
        that takes (the harness's tests). A *campaign* (run config ``campaign``, which
        needs a ``state_file``) is held by its name rather than Flower's run id, so a
        resumed ServerApp's new Flower run continues it, and its answers are journalled
        before they leave, so a restarted agent continues it too.

        This is the party's own call: what it raises carries its full text. What the
        server is told is :meth:`reply`'s (module docstring): the refusals decided
        before the client is used are marked public (:func:`refusal`); an error of the
        client, whatever its type, is not.

        Raises:
            PolicyError, ProtocolViolation, ValueError: Public refusals (marked): the
                run's options or the party's policy refuse it, the run is over, the
                agent is full, the epsilon cap is reached, a position out of order.
            Exception: Anything the run's client (its protocol checks, its black box,
                its models) or the agent's own files raised: unmarked.
        """
        run_id, type_ = int(meta["run"]), str(meta["type"])
        if type_ == HELLO:
            return {"ok": True}, {
                "partition": self.partition_id,
                "clients": self.num_partitions,
            }
        with self._lock:
            if type_ == REPORT:
                return self._final_report(run_id, meta["config"])
            key = self._key(run_id, meta["config"])
            position = position_of(meta)
            hold = None if position is None else hold_of(meta["config"])
            if position is None and isinstance(key, tuple):
                raise refusal(
                    ProtocolViolationError(
                        f"Client {self.partition_id}: a campaign's message must carry its "
                        "position (its group id '<round>:<seq>')."
                    )
                )
            try:
                held = self._held(key, meta["config"])
            except Busy:  # restoring waits for the message being computed
                return {"ok": True, "pending": True}, {}
            frame = encode_frame({}, payload)
            digest = message_digest(type_, frame)
            if position is not None and position[0] < held.next_seq:
                return self._replay(held, position[0], digest)
            job = held.job
            if job is not None:
                if position is None or job.seq != position[0] or job.digest != digest:
                    raise refusal(
                        ProtocolViolationError(
                            f"Client {self.partition_id}: message #{job.seq} of this run is "
                            "still being answered; the server must ask for it again, not "
                            "send another."
                        )
                    )
            elif position is not None and position[0] != held.next_seq:
                raise refusal(
                    ProtocolViolationError(
                        f"Client {self.partition_id}: the next message of this run is "
                        f"#{held.next_seq}, the server sent #{position[0]}."
                    )
                )
            else:
                if position is not None and held.round is not None and position[1] < held.round:
                    raise refusal(
                        ProtocolViolationError(
                            f"Client {self.partition_id}: message #{position[0]} is of round "
                            f"{position[1]}, after a message of round {held.round}."
                        )
                    )
                if held.journal is not None and held.journal.size() >= MAX_JOURNAL:
                    raise refusal(
                        PolicyError(
                            f"Client {self.partition_id}: {describe_run(key)} holds {MAX_JOURNAL} "
                            "journalled answers since its last round began, this party's limit."
                        )
                    )
                if held.stale:
                    raise refusal(
                        StaleCampaign(
                            f"Client {self.partition_id}: this party's agent restarted in the "
                            f"middle of a round of {describe_run(key)}; it answers again "
                            "what it answered but cannot go on with the campaign."
                        )
                    )
                spent = epsilon_guard(
                    held.client,
                    self.epsilon_spent,
                    self.policy.max_total_epsilon,
                    self.partition_id,
                    releases(type_, payload),
                )
                seq, round_ = position if position is not None else (held.next_seq, 0)
                job = held.job = Job(seq, round_, digest)
                if held.journal is not None:
                    job.message = (type_, frame)
                    if held.round is None or round_ > held.round:  # between rounds
                        job.state_before = saved_state(held.client)
                held.round = held.context["round"] = round_
                threading.Thread(
                    target=self._work,
                    args=(held, job, type_, payload, spent, meta),
                    daemon=True,
                ).start()
        if not job.done.wait(hold):
            return {"ok": True, "pending": True}, {}
        return self._outcome(job.outcome)

    def _key(self, run_id: int, run_config) -> int | tuple[str, str]:
        r"""What the agent holds a run by: Flower's run id, or ``("campaign", name)``."""
        name = run_config.get("campaign", "") if hasattr(run_config, "get") else ""
        if not name:
            return run_id
        try:
            check_name(name)
        except ValueError as exc:
            raise refusal(exc) from None
        if self.state is None:
            raise refusal(
                PolicyError(
                    "This party's agent keeps no state (--state-file): it takes no campaign."
                )
            )
        return ("campaign", name)

    def _work(self, held: Held, job: Job, type_: str, payload: dict, spent, meta) -> None:
        r"""Compute one message in the worker thread, journal its answer, then tell the
        threads that wait for it."""
        outcome: tuple = ("error", None, f"client {self.partition_id}: the agent failed")
        try:
            with self._compute:  # one message of all runs at a time (torch's global state)
                outcome = self._compute_and_journal(held, job, type_, payload, spent, meta)
        finally:  # whatever happened, the waiting threads are told and the position moves
            with self._lock:
                held.answered = (job.seq, job.digest, outcome)
                held.next_seq = job.seq + 1
                held.job = None
                held.last = self._clock()
            job.outcome = outcome
            job.done.set()

    def _compute_and_journal(self, held, job, type_: str, payload: dict, spent, meta) -> tuple:
        r""":meth:`_work`'s computation: the client's answer, the epsilon it spent and the
        journal entry, each made durable before the answer may leave."""
        import torch

        torch.set_num_threads(self.threads)
        try:
            reply = quiet(lambda: held.client.handle(Message(type_, payload)))
            out = reply.payload
            if not self.policy.share_results:
                # how long each stage of the party's work took depends on its data (and
                # shows which branch it took): stage timings go with its results only
                out = {k: v for k, v in out.items() if not k.startswith(TIME_PREFIX)}
            outcome: tuple = ("ok", out)
        except BaseException as exc:  # noqa: BLE001 - kept for the waiting threads
            _private(exc)  # the client's: its text stays with the party
            traceback.print_exception(exc, file=sys.stderr)
            outcome = ("error", exc, wire_error(exc, self.partition_id, meta, payload))
        with self._lock:
            try:
                released = 0.0 if spent is None else spent()
                if released > 0:
                    self.epsilon_spent += released
                    if self.state is not None:  # durable before the answer leaves
                        self.state.spent(self.epsilon_spent)
                if held.journal is not None:
                    self._journal(held, job, outcome)
            except BaseException as exc:  # noqa: BLE001 - the answer must not leave
                traceback.print_exception(exc, file=sys.stderr)
                outcome = ("error", exc, wire_error(exc, self.partition_id, meta, payload))
                held.stale = held.journal is not None  # its journal lags the client
        return outcome

    def _journal(self, held: Held, job: Job, outcome: tuple) -> None:
        r"""Write the answer (with the message, and the client's state before it where
        it began a round) to the campaign's journal."""
        frame = encode_frame({}, outcome[1]) if outcome[0] == "ok" else None
        error = outcome[2] if outcome[0] == "error" else None
        assert held.journal is not None and job.message is not None
        held.journal.record(
            job.seq, job.round, job.digest, job.message, frame, error, job.state_before
        )

    def _replay(self, held: Held, seq: int, digest: str) -> tuple[dict, dict]:
        r"""The answer already given to message ``seq``, if this is the same message."""
        entry: dict | None = None
        if held.answered is not None and held.answered[0] == seq:
            entry = {"digest": held.answered[1], "outcome": held.answered[2]}
        elif held.journal is not None:
            logged = held.journal.read(seq)
            if logged is not None:
                outcome: tuple = ("error", None, logged["error"])
                if logged["reply"] is not None:
                    outcome = ("ok", decode_frame(logged["reply"][8:])[1])
                entry = {"digest": logged["digest"], "outcome": outcome}
        if entry is None:
            raise refusal(
                ProtocolViolationError(
                    f"Client {self.partition_id}: message #{seq} of this run was answered "
                    "long ago; it is not answered again."
                )
            )
        if entry["digest"] != digest:
            raise refusal(
                ProtocolViolationError(
                    f"Client {self.partition_id}: message #{seq} differs from the one this "
                    "party answered at that position; a message is answered once."
                )
            )
        return self._outcome(entry["outcome"], replayed=True)

    @staticmethod
    def _outcome(outcome: tuple, replayed: bool = False) -> tuple[dict, dict]:
        if outcome[0] == "ok":
            return {"ok": True}, dict(outcome[1])
        if replayed or outcome[1] is None:
            raise Answered(outcome[2])
        raise outcome[1]

    def _refuse_if_over(self, key) -> None:
        r"""Refuse (publicly) a message of a run that is over for this party."""
        if key in self._over:
            raise refusal(
                ProtocolViolationError(
                    f"Run {describe_run(key)} is over for this party ({self._over[key]}); "
                    "a run does not start again."
                )
            )

    def _held(self, key, run_config) -> Held:
        r"""The client of run ``key`` (a Flower run id, or a campaign), built at its first
        message (the run is then recorded as begun before its client answers anything);
        a campaign this agent began and no longer holds (it restarted, or dropped it to
        make room) is restored from its journal. Every error raised here is a public
        refusal but what the build raises beyond its refusals."""
        self._refuse_if_over(key)
        held = self._runs.get(key)
        if held is not None:
            if held.journal is not None and held.journal.options != options_digest(run_config):
                raise refusal(
                    ValueError(
                        f"Campaign {key[1]!r} began on this party with other options; a "
                        "campaign goes on only with the options it began with."
                    )
                )
            self._runs.move_to_end(key)
            held.last = self._clock()
            return held
        if len(self._over) + len(self._runs) >= MAX_REMEMBERED:
            raise refusal(
                PolicyError(
                    f"This party's agent remembers {MAX_REMEMBERED} runs it began, its "
                    "limit (a run must never start again); it takes no new run until its "
                    "operator moves its runs journal aside."
                )
            )
        journal = None
        if isinstance(key, tuple):
            journal = self._journal_of(key[1], run_config)
            if journal.ended():
                raise refusal(
                    ProtocolViolationError(
                        f"Campaign {key[1]!r} is over for this party (it reported); a run "
                        "does not start again."
                    )
                )
            if journal.exists():
                try:
                    journal.open()
                except ValueError as exc:
                    raise refusal(exc) from None
        role_key = None
        if journal is not None:  # the party's own key: a restart draws what it drew
            role_key = journal.role_key if journal.exists() else os.urandom(32)
        context = {"run": describe_run(key)}  # what an ask/tell operator is shown
        client = self._build_refusing(run_config, role_key, context)  # drops no other run
        held = Held(client, journal)
        held.context = context
        if journal is not None and journal.exists():
            self._restore(held)  # may answer "busy" (Busy): nothing dropped yet
        self._make_room()
        if journal is None:
            if self.state is not None:
                self.state.began(key)  # a restarted agent refuses it: no run starts again
        elif not journal.exists():
            assert role_key is not None
            journal.begin(role_key)
        self._runs[key] = held
        held.last = self._clock()
        return held

    def _journal_of(self, name: str, run_config) -> CampaignJournal:
        r"""The journal of campaign ``name`` in this agent's state folder."""
        assert self.state is not None  # _key refuses a campaign without one
        folder = self.state.path.with_name(f"{self.state.path.name}.campaigns") / name
        return CampaignJournal(folder, name, options_digest(run_config))

    def _restore(self, held: Held) -> None:
        r"""Continue a campaign from its journal (:mod:`.campaign`): the client's state
        at the start of the newest round journalled, then that round's messages handled
        again in order, each answer checked against the journalled one (none leaves the
        agent). Stale if one differs, or the journal holds no state to start from."""
        journal = held.journal
        assert journal is not None
        newest, start = journal.last()
        if newest is None:
            return  # nothing answered yet: the fresh client
        held.next_seq = newest + 1
        if start is None:
            held.stale = True
            return
        if not self._compute.acquire(blocking=False):
            raise Busy  # another message is being computed: the server asks again
        try:
            import torch

            torch.set_num_threads(self.threads)
            replay_round(held, journal, start, newest)
        finally:
            self._compute.release()

    def _build_refusing(self, run_config, role_key: bytes | None = None, context=None):
        r""":meth:`_build`, its refusals (policy, options, key material) marked public;
        anything else it raises stays unmarked."""
        try:
            return self._build(run_config, role_key, context)
        except _BUILD_REFUSALS as exc:
            if from_objective_import(exc):
                # the party's own module: its error, its folder, its names stay here
                print(f"the run's objective does not load: {exc}", file=sys.stderr)
                raise refusal(
                    ValueError(
                        f"Client {self.partition_id}: this party cannot load the run's "
                        "objective (its agent's log says why)."
                    )
                ) from None
            refusal(exc)
            raise

    def _final_report(self, run_id: int, run_config) -> tuple[dict, dict]:
        r"""The final report of run ``run_id`` (or of the campaign its config names): the
        run is over for this party from now on.

        A run this agent never held is not recorded (nothing of it was released): its
        report is a fresh client's, and it may still begin later."""
        key = self._key(run_id, run_config)
        if isinstance(key, tuple):  # a campaign's report, asked again: the same one
            journal = self._journal_of(key[1], run_config)
            report = journal.report() if journal.ended() else None
            if report is not None and self.policy.share_results:
                try:
                    journal.open()
                except ValueError as exc:
                    raise refusal(exc) from None
                return {"ok": True}, report
        self._refuse_if_over(key)
        held = self._runs.get(key)
        if held is None and isinstance(key, tuple):  # a campaign this agent restarted in
            journal = self._journal_of(key[1], run_config)
            if journal.exists() and not journal.ended():
                held = self._held(key, run_config)
        if held is not None and held.job is not None:
            raise refusal(
                ProtocolViolationError(
                    f"Run {describe_run(key)}: message #{held.job.seq} is still being answered."
                )
            )
        self._runs.pop(key, None)
        if held is not None:
            self._over[key] = "it reported"
            finish_asking(held.client)
        if not self.policy.share_results:
            if held is not None and held.journal is not None:
                held.journal.end({})
            raise refusal(
                PolicyError(
                    "This party keeps its evaluations (its agent shares them with --share-results)."
                )
            )
        client = self._build_refusing(run_config) if held is None else held.client
        try:
            report = report_of(client)
        except BaseException as exc:
            _private(exc)
            raise
        if held is not None and held.journal is not None:
            held.journal.end(report)  # before it leaves: asked again, the same report
        return {"ok": True}, report

    def _make_room(self) -> None:
        r"""Drop the least recently active run if this agent holds :data:`MAX_RUNS` and
        that one has been idle long enough; refuse the new run otherwise."""
        if len(self._runs) < MAX_RUNS:
            return
        oldest, held = next(iter(self._runs.items()))
        idle = self._clock() - held.last
        if idle <= IDLE_BEFORE_DROP or held.job is not None:
            raise refusal(
                PolicyError(
                    f"This party holds {MAX_RUNS} runs, each active in the last "
                    f"{IDLE_BEFORE_DROP:g} s; it takes no new run now."
                )
            )
        del self._runs[oldest]
        if not isinstance(oldest, tuple):  # a campaign resumes from its journal
            self._over[oldest] = f"dropped after {idle:.0f} s idle to make room for a new run"

    def _build(self, run_config: dict, role_key: bytes | None = None, context=None):
        r"""This party's client of a run (:func:`~.party_build.build_client`)."""
        return build_client(self, run_config, role_key, context)
