"""Shared helpers for the secure-aggregation tests (manual protocol driving, inputs)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from botorch_fed.secure import SecureAggregationBackend

ReplyHook = Callable[[int, dict[int, bytes]], dict[int, bytes]]
MessageHook = Callable[[int, int, bytes], bytes]


def random_inputs(
    n_clients: int, length: int, seed: int = 0, scale: float = 1.0, first_id: int = 0
) -> dict[int, np.ndarray]:
    """Independent float64 vectors of magnitude ~``scale`` for clients first_id.."""
    rng = np.random.default_rng(seed)
    return {first_id + i: scale * rng.uniform(-1.0, 1.0, length) for i in range(n_clients)}


def plain_sum(inputs: dict[int, np.ndarray], ids=None) -> np.ndarray:
    """Reference sum computed with numpy in float64 (independent of the backends)."""
    ids = sorted(inputs) if ids is None else sorted(ids)
    return np.sum(np.stack([np.asarray(inputs[i], dtype=np.float64) for i in ids]), axis=0)


def make_roles(backend: SecureAggregationBackend, ids, seed=None):
    """Run the client-side setup and create the server and client roles."""
    setup = backend.setup(ids, seed=seed)
    server = backend.server(setup.server_material, seed=seed)
    clients = {cid: backend.client(cid, setup.for_client(cid), seed=seed) for cid in ids}
    return server, clients


def drive(
    server,
    clients,
    inputs,
    *,
    tamper_down: MessageHook | None = None,
    tamper_up: ReplyHook | None = None,
    received: list | None = None,
):
    """Run a session by hand, letting a test alter messages in either direction.

    Args:
        tamper_down: ``(round, cid, msg) -> msg`` applied to server-to-client bytes.
        tamper_up: ``(round, replies) -> replies`` applied before the server sees them.
        received: If a list, every byte string the server receives is appended.

    Returns:
        What the server's last step returned (the sum or None).
    """
    ids = sorted(inputs)
    length = len(next(iter(inputs.values())))
    messages = server.start(ids, length)
    rnd = 0
    while True:
        replies = {}
        for cid, msg in sorted(messages.items()):
            if tamper_down is not None:
                msg = tamper_down(rnd, cid, msg)
            replies[cid] = clients[cid].step(msg, inputs[cid])
        if tamper_up is not None:
            replies = tamper_up(rnd, replies)
        if received is not None:
            received.extend(replies.values())
        out = server.step(replies)
        if not isinstance(out, dict):
            return out
        messages = out
        rnd += 1


def recording(store: dict, method: Callable) -> Callable:
    """Wrap a server role's ``_route_*`` / ``_aggregate`` method so that its last input
    and output payloads land in ``store["in"]`` and ``store["out"]``."""

    def wrapped(payloads):
        out = method(payloads)
        store.update({"in": dict(payloads), "out": dict(out)})
        return out

    return wrapped


def flip(data: bytes, position: int) -> bytes:
    """Flip one bit of ``data[position]`` (negative positions count from the end)."""
    buf = bytearray(data)
    buf[position] ^= 0x01
    return bytes(buf)


# --- the masking backend's messages, for tests that play a malicious server ----------
TAG = 32  # bytes of a pairwise HMAC-SHA256 tag


def masking_keys(payload: bytes, recipient: int):
    """Parse a round-1 message to ``recipient``: ``(U1, {v: [c_pk, s_pk, tag]})``, the
    tag being the one from ``v`` to ``recipient`` (None for the recipient's own keys)."""
    from botorch_fed.secure.wire import PayloadReader

    reader = PayloadReader(payload)
    ids = reader.ids()
    keys = {
        v: [reader.raw(32), reader.raw(32), None if v == recipient else reader.raw(TAG)]
        for v in ids
    }
    reader.done()
    return ids, keys


def write_masking_keys(ids, keys) -> bytes:
    """Inverse of :func:`masking_keys`."""
    from botorch_fed.secure.wire import PayloadWriter

    writer = PayloadWriter().ids(tuple(ids))
    for v in ids:
        for part in keys[v]:
            if part is not None:
                writer.raw(part)
    return writer.getvalue()


def masking_reply_tags(payload: bytes, skip_keys: bool = False) -> dict[int, bytes]:
    """``{recipient: tag}`` of a client's round-0 (``skip_keys=True``: after the two
    public keys) or round-3 reply."""
    from botorch_fed.secure.wire import PayloadReader

    reader = PayloadReader(payload)
    if skip_keys:
        reader.raw(64)
    tags = {}
    for _ in range(reader.u32()):
        v = reader.u32()
        tags[v] = reader.raw(TAG)
    reader.done()
    return tags


def write_masking_endorsements(recipient: int, tags: dict[int, bytes]) -> bytes:
    """A round-4 message to ``recipient``: the endorser list ``U4`` (the senders of
    ``tags`` and ``recipient``) and each sender's tag to ``recipient``."""
    from botorch_fed.secure.wire import PayloadWriter

    u4 = tuple(sorted({*tags, recipient}))
    writer = PayloadWriter().ids(u4)
    for v in u4:
        if v != recipient:
            writer.raw(tags[v])
    return writer.getvalue()


def masking_material(material: bytes) -> dict:
    """Parse a client's masking setup material: ``{"tag", "signing", "static",
    "directory": {cid: [ed25519 pk, static pk, signature]}, "federation"}``."""
    from botorch_fed.secure.masking_identity import _MATERIAL_TAG
    from botorch_fed.secure.wire import PayloadReader

    reader = PayloadReader(material)
    out = {"tag": reader.raw(len(_MATERIAL_TAG)), "signing": reader.raw(32)}
    out["static"] = reader.raw(32)
    ids = reader.ids()
    out["directory"] = {c: [reader.raw(32), reader.raw(32), reader.raw(64)] for c in ids}
    out["federation"] = reader.raw(32)
    reader.done()
    return out


def write_masking_material(parts: dict) -> bytes:
    """Inverse of :func:`masking_material`."""
    from botorch_fed.secure.wire import PayloadWriter

    writer = PayloadWriter().raw(parts["tag"]).raw(parts["signing"]).raw(parts["static"])
    writer.ids(tuple(parts["directory"]))
    for entry in parts["directory"].values():
        for part in entry:
            writer.raw(part)
    return writer.raw(parts["federation"]).getvalue()


def run_roles(setup, material=None):
    r"""The secure-aggregation roles of an FBO-FedGP run of ``setup``, as the in-process
    runner builds them: fresh key material, or (a resume) ``material``; returns
    ``(server, clients, material)``."""
    from botorch_fed.protocol.registry import get_algorithm
    from botorch_fed.protocol.runner import _secagg_roles, build_context

    ctx = build_context(get_algorithm("fbo-fedgp"), setup, None)
    return _secagg_roles(ctx, material)
