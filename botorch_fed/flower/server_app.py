r"""The botorch-fed ``ServerApp``: any registered algorithm's server program on Flower.

``main`` reads the run's options from the run config (:mod:`.run_options`), builds the
server program exactly as the in-process runner does
(:attr:`~botorch_fed.protocol.registry.AlgorithmSpec.make_server`) on a
:class:`~.transport.FlowerTransport`, waits for the parties, maps Flower's node ids
to client ids (each party's agent names its partition id), runs the program and
scores the run with the in-process harness (:func:`~botorch_fed.protocol.results.score_run`)
from the clients' reports. It writes the same JSON as ``botorch-fed run --out`` to
``<folder>/results/<out>``, or ``<out>.error`` there with the reason when the run fails.

The folder is the operator's, not the submitter's: the environment variable
:data:`~.run_options.SERVER_DIR_ENV` of the SuperLink, which this process inherits
(``botorch-fed flower up`` sets it to its state folder). The run config, which whoever
submits the run writes, only names a results file (``out``) and a key set
(``server-key``, read from ``<folder>/keys/<server-key>/server.key``) inside it
(:mod:`.run_options`): it can neither write nor read a file elsewhere.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import time
from pathlib import Path

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from botorch_fed.flower.agent import HELLO, REPORT
from botorch_fed.flower.campaign import check_name
from botorch_fed.flower.run_options import (
    ON_DROPOUT,
    RESULTS_DIR,
    RESULTS_WRITTEN,
    RUN_CONFIG_DEFAULTS,
    decode_argv,
    decode_config,
    prepare,
    results_files,
    run_hold,
    server_dir,
    server_key_file,
)
from botorch_fed.flower.server_checkpoint import Campaign
from botorch_fed.flower.transport import ClientUnavailable, FlowerTransport
from botorch_fed.protocol.checkpoint import folder_lock
from botorch_fed.protocol.messages import Message

app = ServerApp()


class _Reported:
    r"""A client as its report describes it (what :func:`score_run` reads).

    Raises:
        ValueError: A report that is not one (naming what is wrong).
    """

    def __init__(self, report: dict) -> None:
        try:
            history = json.loads(report["history"])
            privacy = report["privacy"]
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"not a report ({type(exc).__name__}: {exc})") from None
        if not isinstance(history, list) or not all(_entry(h) for h in history):
            raise ValueError("its history is not a list of evaluations")
        self.history = history
        self.privacy_ledger = None
        if privacy:
            from botorch_fed.privacy.ledger import PrivacyLedger

            self.privacy_ledger = PrivacyLedger()
            try:
                self.privacy_ledger.load_state_dict(json.loads(privacy))
            except (TypeError, ValueError, KeyError) as exc:
                raise ValueError(f"its privacy ledger does not load ({exc})") from None


def _entry(h) -> bool:
    r"""Whether ``h`` is an evaluation as the clients' histories hold them."""
    number = (int, float)
    return (
        isinstance(h, dict)
        and isinstance(h.get("round"), int)
        and isinstance(h.get("step"), str)
        and (h.get("value") is None or isinstance(h.get("value"), number))
        and (h.get("x") is None or isinstance(h.get("x"), list))  # FedZero: not recorded
    )


def _config(run_config) -> dict:
    r"""The deployment's run-config values, checked (``ValueError`` naming the key);
    ``out`` is :func:`main`'s (:func:`~.run_options.results_files`)."""
    timeout = run_config.get("timeout", RUN_CONFIG_DEFAULTS["timeout"])
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout > 0:
        raise ValueError(f"The run config's `timeout` must be > 0 seconds, got {timeout!r}.")
    on_dropout = run_config.get("on-dropout", RUN_CONFIG_DEFAULTS["on-dropout"])
    if on_dropout not in ON_DROPOUT:
        raise ValueError(f"The run config's `on-dropout` must be one of {ON_DROPOUT}.")
    hold = run_hold(run_config)
    campaign = run_config.get("campaign", "")
    if campaign:
        check_name(campaign)
    resume = run_config.get("resume", False)
    if not isinstance(resume, bool) or (resume and not campaign):
        raise ValueError("The run config's `resume` must be a bool, and only with a `campaign`.")
    return {
        "timeout": float(timeout),
        "on_dropout": on_dropout,
        "hold": hold,
        "campaign": campaign,
        "resume": resume,
    }


def discover(grid, clients: int, timeout: float, log=print) -> dict[int, int]:
    r"""``{client id: node id}``: waits until ``clients`` SuperNodes are connected and
    asks each party's agent for its partition id.

    Raises:
        ClientUnavailable: Too few nodes within ``timeout``, a partition id twice or
            out of range, or a party that does not answer.
    """
    deadline = time.monotonic() + timeout
    while True:
        node_ids = sorted(grid.get_node_ids())
        if len(node_ids) >= clients:
            break
        if time.monotonic() > deadline:
            raise ClientUnavailable(
                f"Only {len(node_ids)} of {clients} SuperNodes joined within {timeout:g} s."
            )
        time.sleep(0.5)
    probe = FlowerTransport(
        grid, dict(enumerate(node_ids)), timeout, describe=lambda i: f"Flower node {node_ids[i]}"
    )
    try:
        replies = probe.exchange(
            {i: Message(HELLO, {}) for i in range(len(node_ids))}, record=False
        )
    except ClientUnavailable as exc:
        raise ClientUnavailable(
            f"The discovery failed: {str(exc).split('. The run')[0]}."
        ) from None
    nodes: dict[int, int] = {}
    for i, reply in replies.items():
        try:
            cid, size = int(reply.payload["partition"]), int(reply.payload["clients"])
        except (KeyError, TypeError, ValueError):
            raise ClientUnavailable(
                f"Flower node {node_ids[i]} answered the discovery without a partition id: "
                "its ClientApp is not botorch-fed's."
            ) from None
        if size != clients or not 0 <= cid < clients:
            raise ClientUnavailable(
                f"Flower node {node_ids[i]} is partition {cid} of {size}; this run has "
                f"{clients} clients."
            )
        if cid in nodes:
            raise ClientUnavailable(
                f"Flower nodes {nodes[cid]} and {node_ids[i]} both claim partition {cid}."
            )
        nodes[cid] = node_ids[i]
    log(f"{clients} parties joined: " + ", ".join(f"{c}->{n}" for c, n in sorted(nodes.items())))
    return nodes


def best_per_round(histories: list[list[dict]], rounds: int, minimize: bool) -> list:
    r"""The best value after each round ``0 .. rounds`` from the clients' histories (what
    the in-process runner tracks while it runs)."""
    out, best = [], None
    entries = sorted((h for hist in histories for h in hist), key=lambda h: h["round"])
    i = 0
    for t in range(rounds + 1):
        while i < len(entries) and entries[i]["round"] <= t:
            v = entries[i]["value"]
            if v is not None and (best is None or (v < best if minimize else v > best)):
                best = v
            i += 1
        out.append(best)
    return out


def run_on_flower(grid, run_config, log=print, folder=None):
    r"""Run the federation the run config describes; returns the :class:`RunResult`.

    ``folder`` is the server's folder, where a run with secure sums reads the server's
    key material (``<folder>/keys/<server-key>/server.key``); ``None``: the operator's,
    :data:`~.run_options.SERVER_DIR_ENV` (read only by such a run).

    The server's side (building the run, the server program, the scoring) runs with
    the run's ``--threads`` torch threads, restored afterwards, as ``botorch-fed run``
    runs it: some algorithms' decisions differ in the last bits between thread counts
    (Co-KG's barycenter and acquisition). Each party's agent works with its own
    ``--threads`` (``flower up --threads``)."""
    from botorch_fed.protocol.runner import torch_threads

    cfg = _config(run_config)
    # the parties' objectives by name, domain and direction: no party's module imported
    run = prepare(decode_argv(run_config), config_text=decode_config(run_config), imports=None)
    with torch_threads(run.setup.threads):
        return _run(grid, run_config, cfg, run, log, folder)


def _run(grid, run_config, cfg: dict, run, log, folder):
    r""":func:`run_on_flower` once the run is prepared and its threads set."""
    import torch

    from botorch_fed.flower.keys import read_material
    from botorch_fed.protocol.registry import get_algorithm
    from botorch_fed.protocol.results import score_run
    from botorch_fed.protocol.runner import build_context, secagg_backend, secagg_role_seed
    from botorch_fed.runs.prepare import library_warnings_ignored

    spec = get_algorithm(run.algorithm)
    ctx = build_context(spec, run.setup, run.settings)
    ids = ctx.client_ids
    material = None
    if spec.secure_aggregation:  # before any party is asked anything
        folder = server_dir() if folder is None else folder
        key = server_key_file(folder, run_config.get("server-key", ""))
        material = read_material(key, "The server")
    campaign = None
    if cfg["campaign"]:
        folder = server_dir() if folder is None else folder
        campaign = Campaign(folder, cfg["campaign"], run_config, cfg["resume"])
    with contextlib.ExitStack() as stack:
        if campaign is not None:
            stack.enter_context(folder_lock(campaign.folder))  # one ServerApp per campaign
            campaign.load()
        nodes = discover(grid, len(ids), cfg["timeout"], log)
        role_seed = secagg_role_seed(ctx.crypto_seed, None)
        if material is not None:
            ctx.secagg_server = secagg_backend(run.setup, ids).server(material, seed=role_seed)
            if campaign is not None and role_seed is None:  # sessions open as before on resume
                ctx.secagg_server.use_key(campaign.role_key)
        transport = FlowerTransport(
            grid,
            nodes,
            cfg["timeout"],
            cfg["on_dropout"],
            log=log,
            hold=cfg["hold"],
            wait_for_agents=campaign is not None,
        )
        t0 = time.perf_counter()
        with torch.random.fork_rng(), library_warnings_ignored():
            torch.manual_seed(run.setup.seed)
            server = spec.make_server(ctx, transport)
            total = server.settings.num_rounds
            start = None
            if campaign is not None and not campaign.resume:
                campaign.begin()
            if campaign is not None and campaign.state is not None:
                start = campaign.restore(server, transport, ctx.secagg_server)
                log(f"campaign {campaign.name}: resumed after round {start}")

            def after_round(t: int) -> None:
                if campaign is not None:
                    campaign.save(t, server, transport, ctx.secagg_server, time.perf_counter() - t0)
                log(f"round {t}/{total} done ({time.perf_counter() - t0:.1f} s)")

            server.run(on_round=after_round, start_round=start)
        time_s = time.perf_counter() - t0 + (0.0 if campaign is None else campaign.elapsed)
    live = [cid for cid in ids if cid not in transport.dropped]
    # a party whose policy keeps its evaluations refuses: the results leave it out
    reports = transport.exchange(
        {cid: Message(REPORT, {}) for cid in live}, record=False, tolerate=True
    )
    if campaign is not None:  # the parties reported: the campaign is over for them
        campaign.finish()
    clients = {}
    for cid in sorted(reports):
        try:
            clients[cid] = _Reported(reports[cid].payload)
        except ValueError as exc:  # scored without it, as a party that keeps its report
            log(f"client {cid}: its report is left out: {exc}")
    minimize = ctx.objectives[0].minimize
    best = best_per_round([c.history for c in clients.values()], total, minimize)
    return score_run(
        run.algorithm,
        run.setup,
        server,
        clients,
        ctx.objectives,
        best,
        time_s,
        private_randomness=ctx.private_randomness,
    )


@app.main()
def main(grid: Grid, context: Context) -> None:
    r"""Run the federation and write its JSON (or ``<out>.error``) in the operator's
    folder: ``<folder>/results/<out>`` (:func:`~.run_options.results_files`). A run
    config whose ``out`` is not a plain name there is refused before the run starts."""
    folder = server_dir()
    name = context.run_config.get("out", "")
    (folder / RESULTS_DIR).mkdir(mode=0o700, exist_ok=True)
    out, error = results_files(folder, name)  # after mkdir: results/ itself no link
    try:
        result = run_on_flower(grid, context.run_config, folder=folder)
    except Exception as exc:
        _write_private(error, f"{type(exc).__name__}: {exc}\n")
        raise
    _write_private(out, json.dumps(result.to_dict(), indent=2))
    print(f"{RESULTS_WRITTEN}{RESULTS_DIR}/{name}", flush=True)


def _write_private(path: Path, text: str) -> None:
    r"""``text`` into ``path`` (``0600``), atomically: a fresh temporary file beside it
    renamed over it (a rename replaces a link there, it never writes through one)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
