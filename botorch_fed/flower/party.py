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
``--allow-plaintext``, ``--allow-masking``, ``--allow-crypto-seed``,
``--allow-objective``, ``--share-results``, ``--allow-algorithm``,
``--allow-exact-centres``, ``--max-epsilon``; by default it accepts none of them),
and the size of every size-like option, before it builds anything. This module is
the agent's command line and socket; the agent itself is :class:`~.agent.PartyAgent`.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import sys
import threading
from pathlib import Path

from botorch_fed.flower.agent import PartyAgent
from botorch_fed.flower.policy_flags import add_policy_arguments, policy_from_arguments
from botorch_fed.flower.records import encode_frame, read_frame


def serve(agent: PartyAgent, path: str | os.PathLike, ready=None) -> None:
    r"""Answer connections on the Unix socket ``path`` until the process is stopped.

    Each connection carries one frame in and one frame out: :meth:`PartyAgent.reply`'s
    answer, an error included (``{"ok": False, "error": ...}``, which the ``ClientApp``
    raises and Flower reports to the server).
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
        out_meta, out = agent.reply(meta, payload)  # errors: only what the server may know
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
        "--ask-tell",
        default=None,
        metavar="FOLDER",
        help="this party's operator reports its measurements: each point to evaluate is "
        "asked in FOLDER (`botorch-fed party suggest/report`) instead of calling the run's "
        "objective",
    )
    p.add_argument(
        "--state-file",
        default=None,
        help="where the agent keeps the LDP epsilon spent (and, in FILE.runs, the runs it "
        "began), across restarts (default: in memory only)",
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
            ask_tell=args.ask_tell,
        )
    except ValueError as exc:
        p.error(str(exc))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    import botorch_fed.algorithms  # noqa: F401 - the algorithms, before the first message

    serve(agent, args.socket)
    return 0


if __name__ == "__main__":  # pragma: no cover - a process of its own
    sys.exit(main())
