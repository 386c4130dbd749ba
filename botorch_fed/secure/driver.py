r"""In-process driver: run a secure-aggregation session among local client roles.

:func:`aggregate` plays every party in one process (the caller is on the clients'
side: where a backend delivers the sum to the clients only, the driver returns a
client's copy). :func:`run_protocol` runs one session with roles created by the
caller, so benchmarks and long-running federations can reuse roles (and their
deserialised contexts) across sessions. Both record per-client bytes in each
direction and per-round, per-stage wall times in a ``stats`` dict.

Dropouts are simulated: a client listed in ``dropped`` stops answering after it has
sent its first reply (or after ``k`` replies with ``dropped={cid: k}``), so the
masking backend's recovery path is exercised with ``k = 2`` (after sharing keys)
or ``k = 3`` (after sending the masked input).
"""

from __future__ import annotations

import platform
import time
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from botorch_fed.secure.base import STAGES, SecureAggregationBackend
from botorch_fed.secure.client_role import ClientRole
from botorch_fed.secure.errors import (
    DropoutError,
    InputError,
    ProtocolError,
    TamperedMessageError,
)
from botorch_fed.secure.server_role import ServerRole
from botorch_fed.secure.validation import validate_client_ids

__all__ = ["aggregate", "run_protocol"]


def _drop_schedule(dropped: Iterable[int] | Mapping[int, int], ids: tuple[int, ...]) -> dict:
    if isinstance(dropped, Mapping):
        schedule = {int(c): int(k) for c, k in dropped.items()}
    else:
        schedule = dict.fromkeys((int(c) for c in dropped), 1)
    for cid, k in schedule.items():
        if cid not in ids:
            raise InputError(f"dropped client {cid} is not one of the inputs {list(ids)}")
        if k < 0:
            raise InputError(f"client {cid} cannot drop after {k} replies")
    return schedule


def _common_length(inputs: Mapping[int, np.ndarray]) -> int:
    lengths = [int(np.shape(x)[0]) if np.ndim(x) >= 1 else 1 for x in inputs.values()]
    values, counts = np.unique(lengths, return_counts=True)
    return int(values[np.argmax(counts)])  # the odd one out is named by its client


def run_protocol(
    server: ServerRole,
    clients: Mapping[int, ClientRole],
    inputs: Mapping[int, np.ndarray],
    *,
    length: int | None = None,
    dropped: Iterable[int] | Mapping[int, int] = (),
    stats: dict | None = None,
) -> np.ndarray:
    """Run one session between existing roles.

    Args:
        server: The server role.
        clients: ``{client id: role}``; every id in ``inputs`` must have a role.
        inputs: ``{client id: vector}`` each ``length``.
        length: Vector length (default: the most common length among ``inputs``).
        dropped: Clients that stop answering after their first reply, or
            ``{client id: number of replies sent before dropping}``.
        stats: If a dict, filled with bytes and timings (see :func:`aggregate`).

    Returns:
        The sum ``length`` over the contributors (``server.contributors``).
    """
    ids = validate_client_ids(inputs)
    missing = [cid for cid in ids if cid not in clients]
    if missing:
        raise InputError(f"no client role for clients {missing}")
    schedule = _drop_schedule(dropped, ids)
    length = _common_length(inputs) if length is None else length
    sent = dict.fromkeys(ids, 0)
    bytes_down = dict.fromkeys(ids, 0)
    bytes_up = dict.fromkeys(ids, 0)
    stage = dict.fromkeys(STAGES, 0.0)
    rounds: list[dict[str, Any]] = []
    specs = server.backend.rounds

    t0 = time.perf_counter()
    messages = server.start(ids, length)
    start_s = time.perf_counter() - t0
    stage[specs[0].server_stage] += start_s
    result: np.ndarray | None = None
    rnd = 0
    while True:
        spec = specs[min(rnd, len(specs) - 1)]
        replies: dict[int, bytes] = {}
        client_s: dict[int, float] = {}
        for cid in sorted(messages):
            if cid not in clients:
                raise ProtocolError("server addressed an unknown client", client_id=cid)
            msg = messages[cid]
            bytes_down[cid] += len(msg)
            if cid in schedule and sent[cid] >= schedule[cid]:
                continue  # dropped out: never answers
            t = time.perf_counter()
            reply = clients[cid].step(msg, inputs[cid])
            client_s[cid] = time.perf_counter() - t
            sent[cid] += 1
            bytes_up[cid] += len(reply)
            replies[cid] = reply
        t = time.perf_counter()
        out = server.step(replies)
        server_s = time.perf_counter() - t
        stage[spec.client_stage] += sum(client_s.values())
        stage[spec.server_stage] += server_s
        rounds.append(
            {
                "round": rnd,
                "name": spec.name,
                "client_stage": spec.client_stage,
                "server_stage": spec.server_stage,
                "client_s": client_s,
                "server_s": server_s + (start_s if rnd == 0 else 0.0),
                "bytes_down": {c: len(m) for c, m in messages.items()},
                "bytes_up": {c: len(r) for c, r in replies.items()},
            }
        )
        if isinstance(out, dict):
            messages = out
            rnd += 1
            continue
        if out is None:
            held = {
                cid: held_sum
                for cid in server.contributors
                if (held_sum := clients[cid].result) is not None
            }
            if not held:
                raise DropoutError("the sum is held by clients, but none of them finished")
            holders = list(held)
            result = held[holders[0]]
            for cid in holders[1:]:
                if not np.array_equal(held[cid], result):
                    raise TamperedMessageError(
                        "clients decrypted different sums", client_id=cid, round=rnd
                    )
            assert result is not None
            result = result.copy()
        else:
            result = out
        break
    if stats is not None:
        n_clients = len(ids)
        critical = sum(
            (max(r["client_s"].values()) if r["client_s"] else 0.0) + r["server_s"] for r in rounds
        )
        stats.update(
            {
                "backend": server.backend.name,
                "options": server.backend.options,
                "n_clients": n_clients,
                "length": length,
                "contributors": list(server.contributors),
                "dropped": server.dropped,
                "rounds": rounds,
                "bytes_down": bytes_down,
                "bytes_up": bytes_up,
                "mean_bytes_down": sum(bytes_down.values()) / n_clients,
                "mean_bytes_up": sum(bytes_up.values()) / n_clients,
                "stage_s": stage,
                "client_encode_s_per_client": stage["client_encode"] / n_clients,
                "total_s": sum(stage.values()),
                "critical_path_s": critical,
                "python": platform.python_version(),
            }
        )
    return result


def aggregate(
    backend: SecureAggregationBackend,
    inputs: Mapping[int, np.ndarray],
    dropped: Iterable[int] | Mapping[int, int] = (),
    seed: int | None = None,
    stats: dict | None = None,
) -> np.ndarray:
    """Securely sum the clients' vectors, running every party in this process.

    Args:
        backend: A backend from :func:`~botorch_fed.secure.get_backend`.
        inputs: ``{client id: float64 vector}``, all ``length``.
        dropped: Clients that drop out after their first reply, or
            ``{client id: replies sent before dropping}`` (e.g. ``2`` for a masking
            client that leaves after sharing its keys).
        seed: Seed making key material, session ids and noise reproducible (tests and
            benchmarks only: a known seed means known keys); None uses OS randomness.
        stats: If a dict, it is filled with: ``bytes_down`` / ``bytes_up``
            (``{cid: bytes}`` over the session, server to client / client to server),
            ``rounds`` (per-round names, per-client and server seconds and bytes),
            ``stage_s`` (seconds summed over parties: ``client_encode`` (encode,
            encrypt or mask, key agreement), ``server_aggregate``, ``decrypt_unmask``),
            ``total_s`` (sequential sum of all stages), ``critical_path_s`` (clients
            in parallel), ``setup_s`` / ``setup_bytes`` (key generation and role
            creation, not part of a round), ``contributors`` and ``dropped``.

    Returns:
        The sum ``length`` over the contributing clients (``stats["contributors"]``).
    """
    if not isinstance(inputs, Mapping) or not inputs:
        raise InputError("inputs must be a non-empty dict {client id: vector}")
    ids = validate_client_ids(inputs)
    t0 = time.perf_counter()
    setup = backend.setup(ids, seed=seed)
    server = backend.server(setup.server_material, seed=seed)
    clients = {cid: backend.client(cid, setup.for_client(cid), seed=seed) for cid in ids}
    setup_s = time.perf_counter() - t0
    result = run_protocol(server, clients, inputs, dropped=dropped, stats=stats)
    if stats is not None:
        stats["setup_s"] = setup_s
        stats["setup_bytes"] = {
            "server": len(setup.server_material),
            "client": {cid: len(setup.for_client(cid)) for cid in ids},
        }
    return result
