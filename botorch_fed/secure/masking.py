r"""The ``masking`` backend: pairwise double masking with dropout recovery, secure
against an actively malicious server.

Bonawitz, Ivanov, Kreuter, Marcedone, McMahan, Patel, Ramage, Segal, Seth, "Practical
Secure Aggregation for Privacy-Preserving Machine Learning", CCS 2017, the protocol
of Fig. 4 *with* its active-security steps (authenticated keys and a consistency round
before any share is revealed). Each client ``u`` encodes its vector in fixed point mod
2^64 (resolution 2^-40, see :mod:`botorch_fed.secure.fixed_point`) and sends

.. code-block:: text

    y_u = x_u + PRG(b_u) + sum_{v in U2, u < v} PRG(s_uv) - sum_{v in U2, v < u} PRG(s_uv)

where ``s_uv`` is an X25519 agreement between ``u``'s and ``v``'s fresh mask keys of the
session (HKDF-SHA256 bound to the session, the round and the pair), ``b_u`` a fresh
self-mask seed, and PRG the ChaCha20 keystream. Pairwise masks cancel in the sum; the
self masks are removed with ``b_u`` reconstructed from Shamir shares (threshold ``t``,
default ``2M // 3 + 1``) held by the other clients, and the pairwise masks of clients
that dropped after sharing their keys are removed with their X25519 mask key
reconstructed the same way. A client never reveals both secrets of one peer. Shares
travel through the server encrypted with ChaCha20-Poly1305 under a key from a second
fresh X25519 agreement, so the server cannot read them.

Authentication (what replaces per-session signatures). Every client holds, in its
setup material (:meth:`MaskingBackend.setup`, distributed out of band):

- a long-term Ed25519 identity, the root of trust: the directory lists every client's
  Ed25519 public key, and those must reach the clients authentically (never through
  the server);
- a long-term *static* X25519 key whose public part is signed by the client's Ed25519
  identity; the directory carries every client's static public key and that signature.

When its role is created a client checks every signature in the directory once
(``KeyMismatchError`` naming the client whose static key is not vouched for by its
identity) and derives, for every peer ``v``, two long-term MAC keys from the
static-static agreement: ``K[u->v]`` and ``K[v->u]`` = HKDF-SHA256(X25519(static_u,
static_v), label "masking/pair-mac" with (sender, recipient) and both static public
keys). Per session a client authenticates what it tells peer ``v`` through the server
with an HMAC-SHA256 tag under ``K[u->v]`` -- one tag per (sender, recipient) pair,
routed by the server -- over a message that names its purpose (round), the session,
the sender and the recipient:

0. ``advertise_keys``: clients send two fresh X25519 public keys (share encryption,
   masks) and, for every other client ``v`` of the session, a tag under ``K[u->v]``
   over (session, u, v, keys, its transcript).
1. ``share_keys``: the server sends each client ``v`` the keys of the responders
   ``U1`` with the tags addressed to ``v``; ``v`` checks every tag against its own
   transcript (a server that substitutes a key, or told the two clients different
   values, is caught: ``KeyMismatchError``; every member of ``U1``, hence every
   contributor, is checked by every other before any masked input exists), then
   sends encrypted Shamir
   shares of (mask private key, ``b_u``) for every peer and a SHA-256 commitment to
   ``b_u``.
2. ``masked_input``: the server routes the shares to the responders ``U2``; clients
   send ``y_u``.
3. ``consistency_check``: the server announces the contributors ``U3``; every
   contributor ``u`` sends, for every other member ``v`` of its ``U3``, a tag under
   ``K[u->v]`` over (session, u, v, ``U3``, the digest of the key list ``U1`` it saw,
   its transcript). ``U1`` holds every client's fresh keys of this session, so a tag
   from another session, even one with the same id, never verifies.
4. ``unmasking``: the server forwards to each client of ``U4`` the tags addressed to
   it; a client reveals shares only if ``U4`` is a subset of its ``U3`` with at least
   ``max(t, min_clients)`` members (itself included) and the tag of every other member
   of ``U4`` verifies on *its own* ``U3``, ``U1`` digest and transcript (else
   ``TamperedMessageError``: the server showed clients different lists, told them
   different values, replayed or altered a tag). Survivors then send the ``b`` shares
   of ``U3`` and the mask-key shares of ``U2 \ U3``. The server reconstructs, checks
   every secret against its commitment / public key, removes the masks and decodes the
   sum.

Why tags authenticate as signatures did here. ``K[u->v]`` is computable only by ``u``
and ``v``: it needs one of their static private keys (the server, or any other client,
would have to solve CDH on X25519 to get it), and the static public keys it comes from
are the ones their Ed25519 identities signed, so a directory with a substituted static
key is refused before any session. For the recipient ``v`` -- who never made a tag
named ``u -> v`` (sender and recipient are in every tagged message, and the two
directions have different keys) -- a valid tag therefore proves that ``u`` made it, for
exactly that purpose, session, recipient and content, just as ``u``'s signature would.
What a tag lacks, transferability (``v`` cannot convince a third party), is never
used: every client verifies only what is addressed to it, and every check of the
protocol is a check by the recipient. A client colluding with the server knows its own
keys ``K[c->v]``, ``K[v->c]`` and so can endorse anything *as itself* (as with its own
signing key) or forge tags *to itself* (only deceiving itself), but not a tag from a
third client ``u`` to a fourth ``v``. (This is also why key-compromise impersonation
does not matter: forging tags to ``u`` needs ``u``'s static key, i.e. a corrupted
``u``, whose view is the adversary's anyway.)

Why the consistency round suffices. An honest client endorses (tags to everyone) only
the one ``U3`` it was shown; a client that reveals shares has valid tags from at least
``t`` distinct clients of its ``U3``, itself included, on its own ``U3``. So two
different survivor sets cannot both be endorsed by ``t`` clients when the honest
endorsers of each are disjoint: with ``c`` clients colluding with the server this
needs ``2 (t - c) > M - c``, i.e. ``t > (M + c) / 2``; the default ``2M // 3 + 1``
covers ``c < M / 3``. A peer's self-mask seed and mask key are therefore never both
revealed by ``t`` clients.
"""

from __future__ import annotations

from botorch_fed.secure import fixed_point
from botorch_fed.secure.base import BackendSetup, RoundSpec, SecureAggregationBackend
from botorch_fed.secure.client_role import ClientRole
from botorch_fed.secure.crypto import RandomSource, ed25519_keypair, ed25519_sign, x25519_keypair
from botorch_fed.secure.errors import ConfigurationError
from botorch_fed.secure.masking_client import _MaskingClient
from botorch_fed.secure.masking_derivations import _static_key_message
from botorch_fed.secure.masking_identity import _FEDERATION_KEY, _MATERIAL_TAG, _identity
from botorch_fed.secure.masking_server import _MaskingServer
from botorch_fed.secure.server_role import ServerRole
from botorch_fed.secure.validation import validate_client_ids
from botorch_fed.secure.wire import PayloadWriter

__all__ = ["MaskingBackend", "default_threshold"]


def default_threshold(n_clients: int) -> int:
    """Default Shamir threshold ``t = 2n // 3 + 1`` (more than two thirds: secure
    against a malicious server colluding with fewer than ``n / 3`` clients)."""
    return 2 * n_clients // 3 + 1


class MaskingBackend(SecureAggregationBackend):
    """Bonawitz-style double masking (X25519, HKDF-SHA256, ChaCha20, Shamir; Ed25519
    identities vouching for static X25519 keys, HMAC-SHA256 tags between clients),
    secure against a malicious server (see the module docstring).

    Every client needs its material from :meth:`setup`: its Ed25519 signing key, its
    static X25519 key, the federation's directory (every client's Ed25519 public key,
    static public key and the identity's signature on it) and the federation key (the
    source of :meth:`~botorch_fed.secure.client_role.ClientRole.federation_secret`).

    Args:
        threshold: Shamir threshold ``t``: the sum is recovered if at least ``t``
            clients survive every round. None (default) means ``2M // 3 + 1`` for a
            session of ``M`` clients (a malicious server colluding with fewer than
            ``M / 3`` clients learns nothing beyond the sum); an int must satisfy
            ``M // 2 < t <= M`` (above ``M / 2`` the server alone cannot learn more than
            the sum; colluding clients need ``t > (M + c) / 2``).
        fraction_bits: Fixed-point fractional bits (default 40, in ``[8, 52]``).
        min_clients: Minimum number of contributors (default 3).
        allow_two_clients: Must be True to allow ``min_clients=2``.
    """

    name = "masking"
    code = 3
    rounds = (
        RoundSpec("advertise_keys", "client_encode", "server_aggregate"),
        RoundSpec("share_keys", "client_encode", "server_aggregate"),
        RoundSpec("masked_input", "client_encode", "server_aggregate"),
        RoundSpec("consistency_check", "decrypt_unmask", "decrypt_unmask"),
        RoundSpec("unmasking", "decrypt_unmask", "decrypt_unmask"),
    )

    def __init__(
        self,
        *,
        threshold: int | None = None,
        fraction_bits: int = fixed_point.DEFAULT_FRACTION_BITS,
        min_clients: int = 3,
        allow_two_clients: bool = False,
    ) -> None:
        super().__init__(min_clients=min_clients, allow_two_clients=allow_two_clients)
        if threshold is not None and (
            isinstance(threshold, bool) or not isinstance(threshold, int) or threshold < 2
        ):
            raise ConfigurationError(
                f"option 'threshold' must be None (2M // 3 + 1) or an int >= 2 with "
                f"M // 2 < threshold <= M, got {threshold!r}"
            )
        if (
            isinstance(fraction_bits, bool)
            or not isinstance(fraction_bits, int)
            or not 8 <= fraction_bits <= 52
        ):
            raise ConfigurationError(
                f"option 'fraction_bits' must be an int in [8, 52], got {fraction_bits!r}"
            )
        self.threshold = threshold
        self.fraction_bits = fraction_bits

    @property
    def options(self) -> dict[str, object]:
        """The options this backend was created with."""
        return {
            **super().options,
            "threshold": self.threshold,
            "fraction_bits": self.fraction_bits,
        }

    def session_threshold(self, n_clients: int) -> int:
        """The threshold ``t`` used for a session of ``n_clients``.

        Raises:
            ConfigurationError: If the configured threshold is not in
                ``(n_clients // 2, n_clients]``.
        """
        if self.threshold is None:
            return default_threshold(n_clients)
        if not n_clients // 2 < self.threshold <= n_clients:
            raise ConfigurationError(
                f"option 'threshold'={self.threshold} must satisfy "
                f"{n_clients} // 2 < threshold <= {n_clients} for {n_clients} clients"
            )
        return self.threshold

    def server(self, material: bytes = b"", *, seed: int | None = None) -> ServerRole:
        """Create the server role (``material`` must be empty)."""
        if material:
            raise ConfigurationError("the masking backend takes no server material")
        return _MaskingServer(self, seed=seed)

    def setup(self, client_ids, *, seed: int | None = None) -> BackendSetup:
        """Give every client a long-term Ed25519 identity, a static X25519 key signed
        by it, the directory of the federation and the federation key.

        In a deployment each client draws its own Ed25519 identity and static X25519
        key, signs the static public key with the identity (the message of
        ``_static_key_message``) and the directory entries (Ed25519 public key, static
        public key, signature) are exchanged out of band (never through the server;
        the Ed25519 public keys must arrive authentically, the signature protects the
        static keys); here everything is drawn for all clients at once. The federation
        key is 32 random bytes that every client of the federation receives with its
        identity and the server never does (in a deployment one client draws it and
        sends it to the others over the same authenticated, confidential channel):
        the clients derive
        :meth:`~botorch_fed.secure.client_role.ClientRole.federation_secret` from it.

        Args:
            client_ids: The clients of the federation.
            seed: Seed for reproducible identities, static keys and federation key
                (tests only), or None.

        Returns:
            No server material; for each client a format tag, its Ed25519 private key,
            its static X25519 private key, the directory (ids; per client its Ed25519
            public key, static public key and signature), then the federation key.
        """
        ids = validate_client_ids(client_ids)
        identities = {cid: ed25519_keypair(RandomSource(seed, 3, cid)) for cid in ids}
        statics = {cid: x25519_keypair(RandomSource(seed, 5, cid)) for cid in ids}
        federation_key = RandomSource(seed, 4).bytes(_FEDERATION_KEY)
        directory = PayloadWriter().ids(ids)
        for cid in ids:
            signing, public = identities[cid]
            static_pk = statics[cid][1]
            signature = ed25519_sign(signing, _static_key_message(cid, static_pk))
            directory.raw(public).raw(static_pk).raw(signature)
        shared = directory.raw(federation_key).getvalue()
        return BackendSetup(
            b"",
            {
                cid: _MATERIAL_TAG
                + identities[cid][0]
                + statics[cid][0].private_bytes_raw()
                + shared
                for cid in ids
            },
        )

    def client(
        self, client_id: int, material: bytes = b"", *, seed: int | None = None
    ) -> ClientRole:
        """Create the role of client ``client_id``.

        The role checks the directory once here (every static key's signature) and
        derives its long-term MAC keys with every peer; sessions reuse them.

        Args:
            client_id: This client's id.
            material: ``setup(...).for_client(client_id)``: its signing key, static
                key, the directory and the federation key, received out of band.
            seed: Seed for this client's session keys (tests only), or None.

        Raises:
            ConfigurationError: Missing or malformed material (material of the earlier
                format without static keys, a federation key missing or all zero
                included), or a directory whose keys for ``client_id`` are not this
                client's or that lists one key for several clients.
            KeyMismatchError: A directory entry whose static key carries no valid
                signature of that client's identity (or is not a usable X25519 key);
                the error names that client.
        """
        return _MaskingClient(self, client_id, _identity(client_id, material), seed=seed)

    def max_abs_supported(self, n_clients: int) -> float:
        """``2^(63 - fraction_bits) / n_clients`` (the fixed-point headroom)."""
        return fixed_point.max_abs_supported(n_clients, self.fraction_bits)
