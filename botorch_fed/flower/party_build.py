r"""How a party's agent builds its client of a run (:mod:`.agent`), checking the run's
options against the party's policy before anything of the run is imported or built."""

from __future__ import annotations

import hashlib
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from botorch_fed.flower.agent import PartyAgent

#: seconds between two looks for the operator's report while an ask/tell party waits
ASK_POLL = 2.0


def from_objective_import(exc: BaseException | None) -> bool:
    r"""Whether ``exc`` is, or was raised from, a failure to load the user's objective
    module (:class:`~botorch_fed.runs.black_box.ObjectiveImportError`)."""
    from botorch_fed.runs.black_box import ObjectiveImportError

    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, ObjectiveImportError):
            return True
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return False


def quiet(fn):
    r"""``fn()`` with the libraries' known warnings ignored (as the in-process runner)."""
    from botorch_fed.runs.prepare import library_warnings_ignored

    with library_warnings_ignored():
        return fn()


def build_client(
    agent: PartyAgent,
    run_config: dict,
    role_key: bytes | None = None,
    context: dict | None = None,
):
    r"""Party ``agent``'s client of a run (as the in-process runner builds it).

    The run's parsed options are checked first, before anything of the run is
    imported or built (every client's objective): its ``--clients`` against this
    federation's size, then the party's policy (:meth:`~.policy.PartyPolicy.check_options`:
    algorithm, backend, seeds, epsilon, centre noise, size caps, objective and its
    domain). A refused run costs the agent, which holds its lock meanwhile,
    milliseconds. The built run is checked again (:meth:`~.policy.PartyPolicy.check`, the
    client count). An ask/tell party's points carry ``context`` (the run and its round,
    which the agent keeps up to date) for its operator."""
    import torch

    from botorch_fed.flower.keys import party_material
    from botorch_fed.flower.run_options import decode_argv, decode_config, prepare
    from botorch_fed.protocol.registry import get_algorithm
    from botorch_fed.protocol.runner import (
        build_context,
        make_client,
        secagg_backend,
        secagg_role_seed,
    )
    from botorch_fed.protocol.setup import DEFAULT_NUM_CLIENTS

    def check(args) -> None:  # the parsed options, before anything is built
        clients = DEFAULT_NUM_CLIENTS if args.clients is None else args.clients
        if clients != agent.num_partitions:
            raise ValueError(
                f"The run has {clients} clients (--clients), this federation "
                f"{agent.num_partitions} (--num-partitions)."
            )
        agent.policy.check_options(args)

    run = prepare(
        decode_argv(run_config),
        check=check,
        config_text=decode_config(run_config),
        imports=agent.partition_id,  # its own objective; the others' are not imported
    )
    spec = get_algorithm(run.algorithm)
    agent.policy.check(spec, run.setup, run.settings)  # again, on the built run
    ctx = build_context(spec, run.setup, run.settings)
    if len(ctx.client_ids) != agent.num_partitions:
        raise ValueError(
            f"The run has {len(ctx.client_ids)} clients, this federation "
            f"{agent.num_partitions} (--num-partitions)."
        )
    cid = agent.partition_id
    if agent.ask_tell is not None:  # the operator measures, on the run's domain
        from botorch_fed.problems.ask_tell import AskTellObjective

        objective = ctx.objectives[cid]
        asked = AskTellObjective(
            agent.ask_tell,
            objective.bounds,
            minimize=objective.minimize,
            name=f"party-{cid}",
            poll_s=ASK_POLL,
            context=context,
        )
        if role_key is not None:  # a campaign: a restarted agent asks the same ids
            asked.run = hashlib.sha256(role_key + b"ask/tell").hexdigest()[:16]
        ctx.objectives[cid] = asked
    if spec.secure_aggregation:
        setup = run.setup
        keyset = str(run_config.get("keyset", ""))
        backend = secagg_backend(setup, ctx.client_ids)
        try:
            material = party_material(
                agent.key_dir, keyset, cid, allow_crypto_seed=agent.policy.allow_crypto_seed
            )
            seed = secagg_role_seed(ctx.crypto_seed, cid)
            role = backend.client(cid, material, seed=seed)
            if seed is None and role_key is not None:  # a campaign's: its own secret
                role.use_key(role_key)
        except ValueError as exc:
            # the server is told only that the key set is not this party's: not the
            # key folder's path, nor which key sets lie there or of which backend
            print(f"key material of {keyset!r}: {exc}", file=sys.stderr)
            raise ValueError(
                f"Client {cid}: this party holds no usable {setup.aggregator} key "
                f"material of the key set {keyset!r:.80} (its agent's log says why)."
            ) from None
        ctx.secagg_clients = {cid: role}
    with torch.random.fork_rng(devices=[]):  # as in process, leaving the agent's alone
        torch.manual_seed(run.setup.seed)
        try:
            return quiet(lambda: make_client(spec, ctx, cid))
        except Exception as exc:  # the party's own objective and code: not public
            raise RuntimeError(
                f"Client {cid} could not be built (its agent's log says why)."
            ) from exc
