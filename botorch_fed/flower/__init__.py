r"""Flower deployment of botorch-fed federations (extra ``flower``: ``flwr==1.41.0``).

Every registered algorithm runs unchanged on Flower's Message API: the ``ServerApp``
(:mod:`.server_app`) drives the algorithm's server program through a
:class:`~.transport.FlowerTransport` on ``grid.push_messages`` / ``pull_messages``,
and one ``ClientApp`` (:mod:`.client_app`) hands every ``query.<type>`` message to
the party's agent (:mod:`.party`), the long-lived process that holds the party's
client (Flower starts a new ``ClientApp`` process per message). Payloads map one to
one onto ``ArrayRecord`` / ``ConfigRecord`` (:mod:`.records`). A party's data,
objective and keys are made on its side, from the run's options and its own node
config and key files (:mod:`.keys`); the server never sends them.

:mod:`.launcher` starts a SuperLink, SuperNodes and agents on 127.0.0.1 (``botorch-fed
flower up``); docs/deployment.md covers separate machines with TLS.

Importing this package does not import ``flwr``; its modules do.
"""
