r"""A party's agent: the long-lived process that holds one client of every Flower run.

Flower starts a fresh ``ClientApp`` process for every message, but a client's state
(its data, GP, keys, a secure sum in progress) lives for the whole run. Each party
therefore runs one agent next to its SuperNode::

    python -m botorch_fed.flower.party --socket /run/me/party.sock --partition-id 0 \
        --num-partitions 3 --key-dir /home/me/keys

and points its SuperNode's node config at the socket (``agent="/run/me/party.sock"``).
The ``ClientApp`` (:mod:`.client_app`) forwards each message to the agent over that
Unix socket (readable by its owner only; frames of :mod:`.records`, nothing pickled)
and returns the agent's answer. The agent builds the party's client when a run's first
message arrives, from the run's options (the run config) and what only the party
knows: its partition id and its key material (never sent by the server). The client
is the very object the in-process runner builds (:attr:`AlgorithmSpec.make_client`).

The run's options come from whoever submits the run, so the agent first checks them
against the party's own :class:`~.policy.PartyPolicy` (its command line:
``--allow-plaintext``, ``--allow-crypto-seed``, ``--allow-objective``,
``--share-results``, ``--allow-algorithm``, ``--allow-exact-centres``,
``--max-epsilon``; by default it accepts none of them).

Besides the protocol's messages the agent answers two of the harness:
``botorch_fed_hello`` (its partition id, so the server can map Flower's node ids to
client ids) and ``botorch_fed_report`` (the client's evaluation history and privacy
ledger, which the server's harness scores as the in-process runner reads them; only
with ``--share-results``; the run's client is dropped afterwards).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import socket
import stat
import sys
import tempfile
import threading
import time
import traceback
from collections import OrderedDict
from pathlib import Path

from botorch_fed.federation.roles import ProtocolViolation as ProtocolViolationError
from botorch_fed.flower.policy import (
    PartyPolicy,
    PolicyError,
    add_policy_arguments,
    policy_from_arguments,
)
from botorch_fed.flower.records import encode_frame, read_frame
from botorch_fed.secure.errors import SecureAggregationError


class PartyFailure(RuntimeError):
    r"""The party's own code failed on a message; the server is told only that."""


HELLO = "botorch_fed_hello"
REPORT = "botorch_fed_report"
MAX_RUNS = 16
IDLE_BEFORE_DROP = 600.0  # seconds a held run must have been idle before it may be dropped
SHARED_ERRORS = (PolicyError, ProtocolViolationError, SecureAggregationError)


class PartyAgent:
    r"""Holds this party's client of each run and answers its messages.

    Args:
        partition_id: This party's client id.
        num_partitions: How many clients the federation has.
        key_dir: Where this party's key material lies (``<key_dir>/<keyset>/``).
        threads: torch threads for this party's work.
        policy: What this party accepts from a run (:class:`PartyPolicy`; default:
            nothing beyond the protected defaults).
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
        self._runs: OrderedDict[int, _Held] = OrderedDict()  # least recently active first
        self._over: dict[int, str] = {}  # run -> why it is over (reported or dropped)
        self.epsilon_spent = 0.0  # LDP epsilon of every answer, over all runs
        self._clock = clock
        self._lock = threading.Lock()
        self._started: set[int] = set()  # runs held now (their ids are in the state file)
        self.state_file = None if state_file is None else Path(state_file)
        if self.state_file is not None:
            _check_state_path(self.state_file)
            if self.state_file.exists():
                self._over, self.epsilon_spent = _read_state(self.state_file)

    def answer(self, meta: dict, payload: dict) -> tuple[dict, dict]:
        r"""Answer one forwarded message: ``(meta, payload)`` in, out.

        A run's client is built at the run's first message and dropped at its report; a
        run is never started again, so a server cannot reset a client mid-run (to have
        its initial design evaluated again, or its users answer again with fresh noise).
        The agent holds at most :data:`MAX_RUNS` runs: a new one takes the place of the
        least recently active run if that one has been idle for more than
        :data:`IDLE_BEFORE_DROP` seconds, and is refused otherwise. With a
        ``state_file`` the runs that ended or were running and the epsilon spent
        outlive the process.

        Raises:
            PolicyError, ProtocolViolation, SecureAggregationError, ValueError: What the
                server may be told in full (the run's options, the protocol).
            PartyFailure: Anything else the party's own code raised (its black box,
                its models): the server learns only the message and the error's type;
                the details go to the agent's log.
        """
        import torch

        from botorch_fed.federation.messages import Message

        with self._lock:
            torch.set_num_threads(self.threads)
            run_id, type_ = int(meta["run"]), str(meta["type"])
            if type_ == HELLO:
                return {"ok": True}, {
                    "partition": self.partition_id,
                    "clients": self.num_partitions,
                }
            if run_id in self._over:
                raise ProtocolViolationError(
                    f"Run {run_id} is over for this party ({self._over[run_id]}); "
                    "a run does not start again."
                )
            held = self._runs.get(run_id)
            if held is not None:
                self._runs.move_to_end(run_id)
            elif type_ == REPORT:  # a run never held: nothing to make room for
                held = _Held(self._build(meta["config"]))
            else:
                client = self._build(meta["config"])  # a run refused drops no other run
                self._make_room()
                held = self._runs[run_id] = _Held(client)
                self._started.add(run_id)
                self._save()  # a restarted agent refuses it: a run does not start again
            held.last = self._clock()
            client = held.client
            if type_ == REPORT:
                self._runs.pop(run_id, None)
                self._end(run_id, "it reported")
                if not self.policy.share_results:
                    raise PolicyError(
                        "This party keeps its evaluations (its agent shares them with "
                        "--share-results)."
                    )
                return {"ok": True}, _report(client)
            spent = self._check_total_epsilon(client)
            try:
                reply = _quiet(lambda: client.handle(Message(type_, payload)))
            except SHARED_ERRORS:
                raise
            except Exception as exc:
                raise PartyFailure(
                    f"Client {self.partition_id} could not answer {type_!r} "
                    f"({type(exc).__name__}; the details stay in the party's log)."
                ) from exc
            finally:  # what this message released, answered or not
                held.last = self._clock()
                if spent is not None and spent() > 0:
                    self.epsilon_spent += spent()
                    self._save()
            return {"ok": True}, reply.payload

    def _make_room(self) -> None:
        r"""Drop the least recently active run if this agent holds :data:`MAX_RUNS` and
        that one has been idle long enough; refuse the new run otherwise."""
        if len(self._runs) < MAX_RUNS:
            return
        oldest, held = next(iter(self._runs.items()))
        idle = self._clock() - held.last
        if idle <= IDLE_BEFORE_DROP:
            raise PolicyError(
                f"This party holds {MAX_RUNS} runs, each active in the last "
                f"{IDLE_BEFORE_DROP:g} s; it takes no new run now."
            )
        del self._runs[oldest]
        self._end(oldest, f"dropped after {idle:.0f} s idle to make room for a new run")

    def _end(self, run_id: int, why: str) -> None:
        self._over[run_id] = why
        self._started.discard(run_id)
        self._save()

    def _save(self) -> None:
        r"""The runs that ended or run now and the epsilon spent, into the state file
        (atomically)."""
        if self.state_file is None:
            return
        data = {
            "over": {str(k): v for k, v in self._over.items()},
            "started": sorted(self._started),
            "epsilon_spent": self.epsilon_spent,
        }
        folder = self.state_file.parent
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{self.state_file.name}.")  # 0600
        try:
            with os.fdopen(fd, "w") as fh:
                json.dump(data, fh)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, self.state_file)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        dir_fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)

    def _check_total_epsilon(self, client):
        r"""Refuse a message whose LDP release would take this party's total epsilon
        over its policy's ``max_total_epsilon``; return a function giving the epsilon
        the client released since (``None`` for a client that releases nothing)."""
        mechanism = getattr(client, "mechanism", None)
        ledger = getattr(client, "privacy_ledger", None)
        if mechanism is None or ledger is None:
            return None
        cap = self.policy.max_total_epsilon
        if self.epsilon_spent + float(mechanism.epsilon) > cap * (1 + 1e-12):
            raise PolicyError(
                f"This party has spent epsilon = {self.epsilon_spent:g} over its runs; "
                f"another answer at {float(mechanism.epsilon):g} would exceed its "
                f"{cap:g} (--max-total-epsilon)."
            )
        before = ledger.spent(self.partition_id)[0]
        return lambda: ledger.spent(self.partition_id)[0] - before

    def _build(self, run_config: dict):
        r"""This party's client of a run (as the in-process runner builds it)."""
        import torch

        from botorch_fed.federation.registry import get_algorithm
        from botorch_fed.federation.runner import (
            build_context,
            make_client,
            secagg_backend,
            secagg_role_seed,
        )
        from botorch_fed.flower.keys import party_material
        from botorch_fed.flower.run_options import decode_argv, prepare

        run = prepare(decode_argv(run_config), check=self.policy.check_options)
        spec = get_algorithm(run.algorithm)
        self.policy.check(spec, run.setup, run.settings)
        ctx = build_context(spec, run.setup, run.settings)
        if len(ctx.client_ids) != self.num_partitions:
            raise ValueError(
                f"The run has {len(ctx.client_ids)} clients, this federation "
                f"{self.num_partitions} (--num-partitions)."
            )
        cid = self.partition_id
        if spec.secure_aggregation:
            setup = run.setup
            material = party_material(
                self.key_dir,
                str(run_config.get("keyset", "")),
                cid,
                allow_crypto_seed=self.policy.allow_crypto_seed,
            )
            backend = secagg_backend(setup, ctx.client_ids)
            ctx.secagg_clients = {
                cid: backend.client(cid, material, seed=secagg_role_seed(ctx.crypto_seed, cid))
            }
        with torch.random.fork_rng(devices=[]):  # as in process, leaving the agent's alone
            torch.manual_seed(run.setup.seed)
            return _quiet(lambda: make_client(spec, ctx, cid))


class _Held:
    r"""A run this agent holds: its client and when it last had a message."""

    def __init__(self, client) -> None:
        self.client = client
        self.last = 0.0


def _check_state_path(path: Path) -> None:
    r"""The state file's folder is this user's and closed to others' writes; the file,
    if there, is a regular file of this user that only this user can write (another
    local user must not be able to reset what the party has spent).

    Raises:
        ValueError: Naming ``--state-file`` and what is wrong.
    """
    folder = path.parent
    if not folder.is_dir():
        raise ValueError(f"--state-file {path}: the folder {folder} does not exist.")
    for what, item in (("the folder", folder), ("the file", path)):
        try:
            info = os.lstat(item)
        except FileNotFoundError:
            continue
        if what == "the file" and not stat.S_ISREG(info.st_mode):
            raise ValueError(f"--state-file {path}: not a regular file (a link?).")
        if info.st_uid != os.getuid():
            raise ValueError(f"--state-file {path}: {what} belongs to another user.")
        if info.st_mode & 0o022:
            raise ValueError(
                f"--state-file {path}: {what} is writable by other users "
                f"(mode {oct(stat.S_IMODE(info.st_mode))}): chmod go-w {item}"
            )


def _read_state(path: Path) -> tuple[dict[int, str], float]:
    r"""``(runs that ended or were running, epsilon spent)`` from an agent's state file.

    Raises:
        ValueError: Naming the file, when it is not what :meth:`PartyAgent._save` writes.
    """
    try:
        data = json.loads(path.read_text())
        over = {int(k): str(v) for k, v in data["over"].items()}
        started = [int(r) for r in data["started"]]
        spent = float(data["epsilon_spent"])
    except (OSError, ValueError, TypeError, KeyError, AttributeError) as exc:
        raise ValueError(f"--state-file {path}: not an agent state file ({exc}).") from None
    if not (math.isfinite(spent) and spent >= 0):
        raise ValueError(f"--state-file {path}: epsilon_spent {spent!r} is not >= 0.")
    for run in started:
        over.setdefault(run, "it was running when this party's agent restarted")
    return over, spent


def _quiet(fn):
    from botorch_fed.runs.prepare import library_warnings_ignored

    with library_warnings_ignored():
        return fn()


def _report(client) -> dict:
    r"""What the harness scores: the client's history and privacy ledger (JSON)."""
    ledger = getattr(client, "privacy_ledger", None)
    return {
        "history": json.dumps(client.history),
        "privacy": "" if ledger is None else json.dumps(ledger.state_dict()),
    }


def serve(agent: PartyAgent, path: str | os.PathLike, ready=None) -> None:
    r"""Answer connections on the Unix socket ``path`` until the process is stopped.

    Each connection carries one frame in and one frame out. An error becomes an answer
    ``{"ok": False, "error": ...}`` (the ``ClientApp`` raises it, and Flower reports it
    to the server).
    """
    path = Path(path)
    if path.exists():
        path.unlink()
    old = os.umask(0o177)  # the socket is its owner's only
    try:
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind(str(path))
    finally:
        os.umask(old)
    server.listen(16)
    if ready is not None:
        ready()
    try:
        while True:
            conn, _ = server.accept()
            threading.Thread(target=_serve_one, args=(agent, conn), daemon=True).start()
    finally:
        server.close()
        path.unlink(missing_ok=True)


def _serve_one(agent: PartyAgent, conn: socket.socket) -> None:
    with conn:
        try:
            meta, payload = read_frame(conn)
        except (OSError, ValueError):  # broken off, or not a frame
            return
        try:
            out_meta, out = agent.answer(meta, payload)
        except Exception as exc:  # noqa: BLE001 - reported to the server, logged here
            traceback.print_exc(file=sys.stderr)
            out_meta, out = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}, {}
        try:
            conn.sendall(encode_frame(out_meta, out))
        except OSError:
            pass


def agent_parser(parser_class: type[argparse.ArgumentParser] = argparse.ArgumentParser):
    r"""The agent's command line (``python -m botorch_fed.flower.party``), also read by
    ``flower run`` to tell which runs the parties refuse. Options must be spelt out:
    a policy flag is not matched by an abbreviation."""
    p = parser_class(
        prog="python -m botorch_fed.flower.party",
        description="The agent that holds one party's botorch-fed clients on Flower.",
        allow_abbrev=False,
    )
    p.add_argument("--socket", required=True, help="Unix socket path (node config `agent`)")
    p.add_argument("--partition-id", type=int, required=True, help="this party's client id")
    p.add_argument("--num-partitions", type=int, required=True, help="number of clients")
    p.add_argument("--key-dir", default=None, help="folder of this party's key material")
    p.add_argument("--threads", type=int, default=1, help="torch threads")
    p.add_argument(
        "--state-file",
        default=None,
        help="where the agent keeps the runs that ended and the LDP epsilon spent, across "
        "restarts (default: in memory only)",
    )
    add_policy_arguments(
        p.add_argument_group("policy: what this party accepts from a run (default: none)")
    )
    return p


def main(argv: list[str] | None = None) -> int:
    r"""``python -m botorch_fed.flower.party``: run one party's agent."""
    p = agent_parser()
    args = p.parse_args(argv)
    try:
        policy = policy_from_arguments(args)
    except ValueError as exc:
        p.error(str(exc))
    try:
        agent = PartyAgent(
            args.partition_id,
            args.num_partitions,
            args.key_dir,
            args.threads,
            policy,
            state_file=args.state_file,
        )
    except ValueError as exc:
        p.error(str(exc))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    import botorch_fed.federation  # noqa: F401 - the algorithms, before the first message

    serve(agent, args.socket)
    return 0


if __name__ == "__main__":  # pragma: no cover - a process of its own
    sys.exit(main())
