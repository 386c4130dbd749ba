r"""A Flower ``Grid`` in memory: the real ``ClientApp``, party agents (on Unix sockets,
in threads), records and transport, without Flower's processes and network. Every
message and every reply crosses Flower's wire encoding (:func:`wire`: each object of
the message deflated to bytes and inflated again, as between a ServerApp, the
SuperLink, a SuperNode and a ClientApp process), messages go through
``ClientApp.__call__`` as Flower's ``flwr-clientapp`` calls it, and a node that left or
does not answer gets the SuperLink's own error reply (``MESSAGE_UNAVAILABLE``, once a
message's TTL passed for a node that does not answer). Not simulated: message ids
(``m<n>`` instead of Flower's object ids), the ``Context`` crossing the wire, and
Flower's failures of its own (a ClientApp process that crashes, a push that fails).

:func:`flower_run` runs ``botorch-fed run`` options on the ServerApp's program over a
:class:`FakeGrid`."""

from __future__ import annotations

import itertools
import json
import os
import threading
import time

from flwr.app import Context, Error, Message, RecordDict
from flwr.server.superlink.linkstate.utils import MESSAGE_UNAVAILABLE_ERROR_REASON
from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects
from flwr.supercore.inflatable.inflatable_utils import inflate_object_from_contents
from flwr.supercore.task_identity import TaskIdentity

from botorch_fed.algorithms import get_algorithm
from botorch_fed.flower.client_app import app as client_app
from botorch_fed.flower.keys import write_keyset
from botorch_fed.flower.party import PartyAgent, serve
from botorch_fed.flower.policy import PartyPolicy
from botorch_fed.flower.run_options import prepare
from botorch_fed.flower.server_app import run_on_flower
from botorch_fed.protocol.runner import build_context

# every party of a test federation accepts the seeded, plaintext experiments and shares
# its results (tests/flower/test_policy.py checks the defaults refuse them)
EXPERIMENT = PartyPolicy(
    allow_plaintext=True,
    allow_masking=True,
    allow_crypto_seed=True,
    share_results=True,
    algorithms=("all",),
    allow_exact_centres=True,
)

RUN_ID = 7


def wire(msg: Message) -> Message:
    r"""``msg`` as the other end receives it: every nested object deflated to bytes
    and the message inflated from them (what Flower's push/pull of objects does)."""
    contents = {oid: obj.deflate() for oid, obj in get_all_nested_objects(msg).items()}
    out = inflate_object_from_contents(msg.object_id, contents)
    out.metadata.__dict__["_message_id"] = msg.metadata.message_id
    return out


class FakeGrid:
    r"""``clients`` parties (node ids ``1000 + 7 i``) whose agents serve in threads.

    ``drop``: ``{node id: n}``: the node answers its first ``n`` messages, then leaves
    (its messages get the SuperLink's "Message Unavailable" error reply at once).
    ``hang``: nodes that answer the discovery, then take messages and never answer
    (the SuperLink's "Message Unavailable" error once a message's TTL passed).
    ``policy``: every party's :class:`PartyPolicy`, or one per party (a sequence).
    """

    def __init__(self, clients: int, folder, key_dir=None, node_ids=None, policy=None) -> None:
        TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = RUN_ID, 0, 1
        self.run_config: dict = {}
        self.sockets = {}
        self.drop: dict[int, int] = {}
        self.hang: set[int] = set()
        self._expires: dict[str, tuple[float, Message]] = {}  # hung messages: TTL ends
        self.answered: dict[int, int] = {}
        self.pushed: list[Message] = []
        self._pending: dict[str, Message] = {}
        self._ids = itertools.count()
        node_ids = node_ids or [1000 + 7 * i for i in range(clients)]
        for i, node in enumerate(node_ids):
            path = os.path.join(folder, f"agent-{i}.sock")
            ready = threading.Event()
            own = policy[i] if isinstance(policy, list | tuple) else policy
            agent = PartyAgent(i, clients, key_dir, policy=own or EXPERIMENT)
            threading.Thread(target=serve, args=(agent, path, ready.set), daemon=True).start()
            ready.wait(10)
            self.sockets[node] = path

    def get_node_ids(self):
        return list(self.sockets)

    def push_messages(self, messages):
        ids = []
        for msg in messages:
            mid = f"m{next(self._ids)}"
            msg.metadata.__dict__["_message_id"] = mid
            self.pushed.append(msg)
            msg = wire(msg)
            node = msg.metadata.dst_node_id
            self.answered[node] = self.answered.get(node, 0) + 1
            if node in self.hang and self.answered[node] > 1:  # after the discovery
                self._expires[mid] = (time.monotonic() + msg.metadata.ttl, msg)
                ids.append(mid)
                continue
            if self.answered[node] > self.drop.get(node, float("inf")):
                reply = Message(Error(3, MESSAGE_UNAVAILABLE_ERROR_REASON), reply_to=msg)
            else:
                context = Context(
                    run_id=RUN_ID,
                    node_id=node,
                    node_config={"agent": self.sockets[node]},
                    state=RecordDict(),
                    run_config=dict(self.run_config),
                )
                try:
                    reply = client_app(msg, context)
                except Exception as exc:  # as flwr-clientapp does
                    reason = f"{type(exc)}:<'{exc}'>"
                    reply = Message(Error(2, reason), reply_to=msg)
            self._pending[mid] = wire(reply)
            ids.append(mid)
        return ids

    def pull_messages(self, message_ids):
        now = time.monotonic()
        for mid in list(message_ids):
            if mid in self._expires and self._expires[mid][0] <= now:
                error = Error(3, MESSAGE_UNAVAILABLE_ERROR_REASON)
                self._pending[mid] = Message(error, reply_to=self._expires.pop(mid)[1])
        return [self._pending.pop(m) for m in list(message_ids) if m in self._pending]


def flower_run(
    options,
    tmp_path,
    drop=None,
    on_dropout="fail",
    timeout=30.0,
    hang=(),
    config_text=None,
    policy=None,
    **config,
):
    r"""``options`` on the app over a :class:`FakeGrid`; returns ``(result, grid)``.
    ``config_text``: the run's ``--config`` text (the run config's ``config``);
    ``policy``: the parties' (:class:`FakeGrid`; default :data:`EXPERIMENT`).

    The grid class and the ServerApp's program are looked up in this module when called,
    so a test can replace either (``monkeypatch.setattr(fake_grid, "FakeGrid", ...)``)."""
    run = prepare(options, config_text=config_text, imports=None)  # as the submitter
    spec = get_algorithm(run.algorithm)
    ids = build_context(spec, run.setup, run.settings).client_ids
    keyset = ""
    if spec.secure_aggregation:
        keyset, _ = write_keyset(run.setup, ids, tmp_path / "keys")
    grid = FakeGrid(len(ids), str(tmp_path), key_dir=tmp_path / "keys", policy=policy)
    grid.drop = dict(drop or {})
    grid.hang = set(hang)
    grid.run_config = {
        "argv": json.dumps(options),
        "out": "out.json",
        "clients": len(ids),
        "timeout": timeout,
        "on-dropout": on_dropout,
        "server-key": keyset,
        "keyset": keyset,
        **({"config": config_text} if config_text is not None else {}),
        **config,
    }
    return run_on_flower(grid, grid.run_config, log=lambda line: None, folder=tmp_path), grid
