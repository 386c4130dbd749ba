r"""``botorch-fed flower up | run | down | status``: a federation on Flower, on this machine.

- ``flower up --clients N`` starts a SuperLink, N SuperNodes and N party agents on
  127.0.0.1 (:mod:`botorch_fed.flower.launcher`), with their own ``FLWR_HOME``, logs
  and pids in a state folder (``--state-dir``, default a folder in the system's
  temporary directory) and the folder ``up`` is run from on their import path (a
  run's ``--objective`` module).
- ``flower run <algorithm> [options of botorch-fed run]`` submits a run to it
  (:mod:`botorch_fed.flower.submission`) and prints and writes (``--out``, ``--plot``)
  the same results as ``botorch-fed run``; it writes nothing (no key set, no folder)
  unless the state folder has a live federation of as many parties as the run has
  clients.
  Flower's own flags: ``--state-dir``, ``--timeout`` (seconds a party may take to
  answer one message) and ``--on-dropout fail|continue``.
- ``flower down`` stops exactly the processes ``up`` started; ``flower status`` lists
  them.
- ``flower keys --aggregator A --clients N --key-dir D`` writes a key set for parties on
  separate machines (docs/deployment.md).

Exit codes as ``botorch-fed run``: 0 done, 1 the run failed (the reason is printed),
2 invalid arguments.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import tempfile
import uuid
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from botorch_fed.cli.campaign_record import (
    CAMPAIGN_FILE,
    begin_campaign,
    cli_dir,
    read_record,
    write_record,
)
from botorch_fed.flower.policy_flags import add_policy_arguments, policy_flags
from botorch_fed.flower.run_options import (
    MAX_HOLD,
    ON_DROPOUT,
    RESULTS_WRITTEN,
    RUN_CONFIG_DEFAULTS,
)

FLOWER_HELP = """\
Run a federation on Flower (extra `flower`: pip install "botorch-fed[flower]").
  botorch-fed flower up --clients 3 --share-results --allow-masking
  botorch-fed flower run fbo-fedgp --problem branin --clients 3 --aggregator masking \\
      --hyperparameters average --num-rounds 1 --out r.json
  botorch-fed flower down
`flower run` takes the options of `botorch-fed run <algorithm>` (--config too; not
--checkpoint, --resume) and --state-dir, --timeout SECONDS, --on-dropout fail|continue,
--run-dir DIR (a campaign: `botorch-fed flower resume DIR` continues it), --hold SECONDS.
The parties refuse what their `up` flags do not allow (--aggregator plaintext or masking,
--crypto-seed, --objective, sizes above their caps, ...; `botorch-fed flower up --help`).
"""


def default_state_dir() -> str:
    r"""Where ``flower up`` keeps its state unless told: one folder per user in the
    system's temporary directory."""
    return os.path.join(tempfile.gettempdir(), f"botorch-fed-flower-{os.getuid()}")


def add_flower_parser(sub: argparse._SubParsersAction) -> None:
    r"""The ``flower`` sub-command and its ``up`` / ``run`` / ``down`` / ``status``."""
    p = sub.add_parser(
        "flower",
        help="run a federation on Flower (SuperLink + SuperNodes on this machine)",
        description=FLOWER_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    actions = p.add_subparsers(dest="flower_command", required=True, metavar="ACTION")
    up = actions.add_parser(  # a policy flag is spelt out, as the agent takes it
        "up", help="start a SuperLink, N SuperNodes and party agents", allow_abbrev=False
    )
    up.add_argument("--clients", type=int, required=True, metavar="N", help="number of parties")
    up.add_argument("--port", type=int, default=None, help="SuperLink port (default: a free one)")
    up.add_argument(
        "--timeout", type=float, default=60.0, help="seconds to wait for readiness (default 60)"
    )
    up.add_argument(
        "--threads",
        type=int,
        default=1,
        metavar="N",
        help="torch threads of every party's agent (default 1); a run's JSON equals "
        "`botorch-fed run`'s when its --threads is this N too",
    )
    up.add_argument(
        "--ask-tell",
        default=None,
        metavar="all|I,J,...",
        help="parties whose operator reports each measurement (`botorch-fed party suggest / "
        "report --party I`) instead of their objective answering at once: all, or indices",
    )
    add_policy_arguments(
        up.add_argument_group(
            "every party's policy: what its agent accepts from a run (default: none of it)"
        )
    )
    run = actions.add_parser(
        "run",
        help="submit a run (options of `botorch-fed run <algorithm>`)",
        add_help=False,
        prefix_chars="\x00",  # every token goes to `options`, parsed below
    )
    run.add_argument("options", nargs=argparse.REMAINDER)
    keys = actions.add_parser(
        "keys", help="generate a key set for secure sums: one file per party (a party runs it)"
    )
    keys.add_argument(
        "--aggregator",
        required=True,
        choices=("masking", "ckks", "plaintext"),
        help="the secure-aggregation backend of the runs that will use the key set",
    )
    keys.add_argument("--clients", type=int, required=True, metavar="N", help="number of parties")
    keys.add_argument("--key-dir", required=True, help="folder to write the key set into")
    resume = actions.add_parser(
        "resume", help="continue a campaign (`flower run --run-dir DIR`) after a restart"
    )
    resume.add_argument(
        "run_dir",
        metavar="DIR",
        help="the campaign's folder (`flower run --run-dir`; it names the federation's state "
        "folder and the run's options)",
    )
    actions.add_parser("down", help="stop the processes `up` started")
    actions.add_parser("status", help="list the processes `up` started")
    for action in (up, actions.choices["down"], actions.choices["status"]):
        action.add_argument(
            "--state-dir", default=default_state_dir(), help="the federation's state folder"
        )


def _flower_run_parser() -> argparse.ArgumentParser:
    r"""``flower run``'s own flags (the run's options are ``botorch-fed run``'s)."""
    p = argparse.ArgumentParser(
        prog="botorch-fed flower run",
        usage="botorch-fed flower run ALGORITHM [flower run's options] "
        "[options of `botorch-fed run ALGORITHM`]",
        description="Submit a run to the federation `botorch-fed flower up` started; it prints "
        "and writes (--out, --plot) what `botorch-fed run` does. The run's options are those "
        "of `botorch-fed run ALGORITHM` but --checkpoint and --resume "
        "(`botorch-fed flower run ALGORITHM --help` lists them).",
        epilog=FLOWER_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        add_help=False,
    )
    own = p.add_argument_group("flower run's options")
    own.add_argument(
        "--state-dir",
        default=default_state_dir(),
        metavar="DIR",
        help="the federation's state folder (default: %(default)s)",
    )
    own.add_argument(
        "--timeout",
        type=float,
        default=RUN_CONFIG_DEFAULTS["timeout"],
        metavar="SECONDS",
        help="how long a party may take to answer one message (default: %(default)g)",
    )
    own.add_argument(
        "--run-dir",
        default=None,
        metavar="DIR",
        help="make the run a campaign that survives restarts: the server checkpoints it "
        "after every round, each party journals its answers, and `botorch-fed flower resume "
        "DIR` continues it (DIR keeps the campaign's options)",
    )
    own.add_argument(
        "--hold",
        type=float,
        default=RUN_CONFIG_DEFAULTS["hold"],
        metavar="SECONDS",
        help="how long a party keeps a message whose answer waits (an ask/tell measurement) "
        "before it answers 'pending' and the server asks again; each ask costs a party "
        "about 2 CPU seconds, so a campaign waiting days takes 1800 (default: %(default)g)",
    )
    own.add_argument(
        "--on-dropout",
        choices=ON_DROPOUT,
        default=RUN_CONFIG_DEFAULTS["on-dropout"],
        help="a party that does not answer, or whose SuperNode left, stops the run (fail) "
        "or is left out of the rest of it where the algorithm and backend allow "
        "(continue) (default: %(default)s)",
    )
    return p


def _flower_options(tokens: list[str]) -> tuple[argparse.Namespace, list[str]]:
    r"""Split ``flower run``'s own flags from the run's options."""
    own, rest = _flower_run_parser().parse_known_args(tokens)
    if not own.timeout > 0:
        raise ValueError(f"--timeout must be > 0 seconds, got {own.timeout}.")
    if not 0 < own.hold <= MAX_HOLD:
        raise ValueError(f"--hold must be in (0, {MAX_HOLD:g}] seconds, got {own.hold}.")
    return own, rest


def _ask_tell(value: str | None, clients: int) -> tuple[int, ...]:
    r"""``--ask-tell``: ``all`` or comma-separated party indices."""
    if value is None:
        return ()
    if value.strip() == "all":
        return tuple(range(clients))
    try:
        return tuple(int(v) for v in value.split(","))
    except ValueError:
        raise ValueError(
            f"--ask-tell must be 'all' or comma-separated party indices, got {value!r}."
        ) from None


def _no_federation(state: str | os.PathLike[str], clients: int | str = "N") -> str:
    r"""What ``flower run`` says when ``state`` has no live federation."""
    return (
        f"No live federation in {state}: start one with `botorch-fed flower up --clients "
        f"{clients} --state-dir {cli_dir(state)}` (and the policy flags your run needs: "
        "`botorch-fed flower up --help`)."
    )


def _running(state: str | os.PathLike[str], live: list[str]) -> str:
    r"""What ``flower up`` says when ``state`` already has a running federation."""
    return (
        f"{state} already has a running federation ({', '.join(live)}): nothing to restart "
        "(a campaign whose run died continues with `botorch-fed flower resume DIR`). To start "
        f"afresh, stop it with `botorch-fed flower down --state-dir {cli_dir(state)}`, or "
        "start a second federation in another folder (`--state-dir DIR`)."
    )


def _without(argv: list[str], flags: tuple[str, ...]) -> list[str]:
    r"""``argv`` without ``flags`` and their values (``--out F`` and ``--out=F``)."""
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
            continue
        if arg in flags:
            skip = True
            continue
        if arg.split("=", 1)[0] in flags:
            continue
        out.append(arg)
    return out


def flower_main(args: argparse.Namespace, console: Console) -> int:
    r"""Run ``botorch-fed flower <action>``; returns the exit code."""
    from botorch_fed.cli.errors import print_error

    try:
        from botorch_fed.flower import launch_errors, launcher, submission
    except ImportError as exc:
        print_error(console, f"{exc}. Install the extra: pip install 'botorch-fed[flower]'.")
        return 2
    action = args.flower_command
    try:
        if action == "up":
            if args.clients < 1:
                raise ValueError(f"--clients must be >= 1, got {args.clients}.")
            if args.threads < 1:
                raise ValueError(f"--threads must be >= 1, got {args.threads}.")
            flags = [*policy_flags(args), "--threads", str(args.threads)]
            fed = launcher.up(
                args.clients,
                args.state_dir,
                port=args.port,
                timeout=args.timeout,
                agent_flags=flags,
                ask_tell=_ask_tell(args.ask_tell, args.clients),
            )
            if fed.get("restarted"):
                console.print(
                    f"restarted {', '.join(fed['restarted'])} (the others still ran); state in "
                    f"{escape(str(args.state_dir))}",
                    soft_wrap=True,
                )
                return 0
            console.print(
                f"Flower federation of {args.clients} parties up (SuperLink "
                f"{fed['address']}); state in {escape(str(args.state_dir))}",
                soft_wrap=True,
            )
            return 0
        if action == "resume":
            return _resume(args.run_dir, console)
        if action == "keys":
            return _keys(args, console)
        if action == "down":
            stopped = launcher.down(args.state_dir)
            console.print(f"stopped {len(stopped)} processes" if stopped else "nothing running")
            return 0
        if action == "status":
            processes = launcher.status(args.state_dir)["processes"]
            for name, proc in processes.items():
                state = "running" if proc["alive"] else "stopped"
                console.print(f"{name} (pid {proc['pid']}): {state}", markup=False)
            if not processes:
                console.print(f"no federation in {escape(str(args.state_dir))}", soft_wrap=True)
            return 0
        return _run(args.options, console)
    except SystemExit as exc:  # argparse's own errors (printed) and --help
        return exc.code if isinstance(exc.code, int) else 2
    except submission.RunInterrupted as exc:  # Ctrl-C (SIGTERM, SIGHUP) on `flower run`
        print_error(console, f"{exc}.", "interrupted:")
        return 128 + exc.signum  # as the shell reports a process the signal ended
    except launch_errors.FederationRunningError as exc:  # in the command line's words
        print_error(console, _running(exc.state, exc.live))
        return 1
    except launch_errors.FederationChangedError as exc:
        print_error(
            console,
            f"{exc.state} holds a federation of which {', '.join(exc.live)} still run, "
            f"started with other flags: {'; '.join(exc.changes)}. Run `botorch-fed flower up` "
            "with the flags it was started with to restart its dead processes, or `botorch-fed "
            f"flower down --state-dir {cli_dir(exc.state)}` first to start afresh.",
        )
        return 1
    except launch_errors.NoFederationError as exc:
        print_error(console, _no_federation(exc.state))
        return 1
    except launch_errors.FlowerLaunchError as exc:  # the launcher's words for `up(port=...)`
        print_error(console, str(exc).replace("leave port=None", "leave out --port"))
        return 1
    except ValueError as exc:
        print_error(console, str(exc))
        return 2


def _keys(args: argparse.Namespace, console: Console) -> int:
    r"""``flower keys``: a fresh key set (OS randomness) in ``--key-dir``."""
    from botorch_fed.flower.keys import write_keyset
    from botorch_fed.protocol.setup import FederationSetup

    if args.clients < 1:
        raise ValueError(f"--clients must be >= 1, got {args.clients}.")
    setup = FederationSetup(num_clients=args.clients, aggregator=args.aggregator)
    name, server = write_keyset(setup, list(range(args.clients)), args.key_dir)
    console.print(
        f"key set {name}: give {escape(str(server.parent))}/client-<i>.key to party i "
        f"and {escape(str(server))} (public) to the server",
        soft_wrap=True,
    )
    return 0


class _StrictParser(argparse.ArgumentParser):
    r"""Raises ``ValueError`` where argparse would print and exit."""

    def error(self, message: str):
        raise ValueError(message)


def _refused_by_a_party(
    processes: dict, argv: list[str], spec, run, config_text: str | None = None
) -> str | None:
    r"""Why a party agent of this federation would refuse the run (``None``: none
    would), read from the command line its agent was started with, with the agent's own
    parser: the parties check every run themselves; this says so before anything is
    submitted, and without the ServerApp's traceback. Agents that are not
    ``python -m botorch_fed.flower.party``, or whose command line this parser cannot
    read, are left to their own check."""
    from botorch_fed.flower.launcher import AGENT_MODULE
    from botorch_fed.flower.party import agent_parser
    from botorch_fed.flower.policy import PolicyError
    from botorch_fed.flower.policy_flags import policy_from_arguments
    from botorch_fed.flower.run_options import check_argv, prepare

    parser = agent_parser(_StrictParser)
    for name in sorted(n for n in processes if n.startswith("agent-")):
        command = list(processes[name].get("argv", []))
        module = [i for i in range(len(command) - 1) if command[i : i + 2] == ["-m", AGENT_MODULE]]
        if not module:
            continue
        try:
            agent = parser.parse_args(command[module[0] + 2 :])
            policy = policy_from_arguments(agent)
        except ValueError:
            continue
        try:  # the party's own table of the config; nothing imported here
            prepare(
                check_argv(argv),
                check=functools.partial(policy.check_options, client=agent.partition_id),
                outputs=True,
                config_text=config_text,
                imports=None,
            )
            policy.check(spec, run.setup, run.settings)
        except PolicyError as exc:
            return f"party {name.removeprefix('agent-')}: {exc}"
    return None


def _run(tokens: list[str], console: Console) -> int:
    r"""``flower run <algorithm> ...``."""
    from botorch_fed.cli.errors import print_error
    from botorch_fed.flower import launcher
    from botorch_fed.flower.keys import write_keyset
    from botorch_fed.flower.run_options import check_argv, prepare, split_config
    from botorch_fed.protocol.registry import get_algorithm
    from botorch_fed.protocol.runner import build_context

    own, argv = _flower_options(tokens)
    if not argv or argv[0].startswith("-"):  # no algorithm first
        parser = _flower_run_parser()
        if argv[:1] in (["-h"], ["--help"]):
            parser.print_help()
            return 0
        parser.error("the following arguments are required: ALGORITHM")  # exits 2
    if "-h" in argv or "--help" in argv:
        from botorch_fed.runs.parser import build_run_parser

        _flower_run_parser().print_help()
        print()
        build_run_parser().parse_args(["run", argv[0], "--help"])  # prints, exits 0
    # a --config file travels as its text in the run config; the options name no file
    argv, config_file, config_text = split_config(check_argv(argv))
    run = prepare(  # every option checked before anything runs; no party's module imported
        argv, outputs=True, config_text=config_text, config_file=config_file, imports=None
    )
    spec = get_algorithm(run.algorithm)
    clients = len(build_context(spec, run.setup, run.settings).client_ids)
    # a live federation before anything is written: no key set, no folder otherwise
    fed = launcher.status(own.state_dir)
    state = Path(fed["state_dir"])
    if not fed["processes"].get("superlink", {}).get("alive"):
        print_error(console, _no_federation(own.state_dir, clients))
        return 1
    if fed["clients"] not in (None, clients):
        raise ValueError(
            f"The run has {clients} clients; the federation in {own.state_dir} has "
            f"{fed['clients']} parties: pass `--clients {fed['clients']}` to the run, or "
            f"start one of {clients} parties (`botorch-fed flower down --state-dir "
            f"{cli_dir(own.state_dir)}`, then `botorch-fed flower up --clients {clients} "
            f"--state-dir {cli_dir(own.state_dir)}`)."
        )
    refused = _refused_by_a_party(fed["processes"], argv, spec, run, config_text)
    if refused is not None:
        print_error(
            console,
            f"{refused} To allow it, start the federation again with that flag: "
            f"`botorch-fed flower down --state-dir {cli_dir(own.state_dir)}`, then "
            "`botorch-fed flower up` with its flags and that one (`botorch-fed flower up "
            "--help`).",
            "the parties refuse this run:",
        )
        return 1
    keyset = ""
    if spec.secure_aggregation:  # the ServerApp reads <state>/keys/<keyset>/server.key
        keyset, _ = write_keyset(run.setup, list(range(clients)), state / "keys")
    config = {
        "argv": json.dumps(_without(argv, ("--out", "--plot"))),
        "config": config_text or "",
        "clients": clients,
        "timeout": float(own.timeout),
        "on-dropout": own.on_dropout,
        "server-key": keyset,
        "keyset": keyset,
        "hold": float(own.hold),
    }
    campaign = None
    if own.run_dir is not None:
        campaign = begin_campaign(Path(own.run_dir), state, config, argv)
    return _submit(state, config, run, console, campaign)


def _resume(run_dir: str, console: Console) -> int:
    r"""``flower resume DIR``: stop what is left of the campaign's earlier Flower runs,
    then submit it again with ``resume``: the ServerApp continues from its checkpoint."""
    from botorch_fed.cli.errors import print_error
    from botorch_fed.flower import launcher, submission
    from botorch_fed.flower.run_options import check_argv, prepare

    folder = Path(run_dir)
    data = read_record(folder)
    text = data["config"].get("config") or None  # the campaign's --config text
    run = prepare(check_argv(list(data["argv"])), outputs=True, config_text=text, imports=None)
    fed = launcher.status(data["state_dir"])
    if not fed["processes"].get("superlink", {}).get("alive"):
        print_error(
            console,
            f"No live federation in {data['state_dir']}: restart it with `botorch-fed flower up "
            f"--state-dir {cli_dir(data['state_dir'])}` (with the flags it was started with; "
            "it restarts the processes that died), then resume.",
        )
        return 1
    for run_id in data["flower_runs"]:  # a ServerApp that still runs would answer twice
        submission.stop_run(data["state_dir"], int(run_id))
    config = dict(data["config"], resume=True)
    return _submit(Path(fed["state_dir"]), config, run, console, folder / CAMPAIGN_FILE)


def _submit(state: Path, config: dict, run, console: Console, campaign: Path | None) -> int:
    r"""Submit ``config`` to the federation in ``state``, then print and write the result
    as ``botorch-fed run`` does; a campaign's record gets each Flower run id."""
    from botorch_fed.cli.errors import print_error
    from botorch_fed.cli.report import plot_run, print_run
    from botorch_fed.flower import submission
    from botorch_fed.flower.run_options import results_files
    from botorch_fed.protocol.results import RunResult
    from botorch_fed.runs.outputs import write_json

    # the ServerApp writes into its folder (the state folder `up` gave it) under the name
    # the run config gives; this command reads it there and writes --out itself
    name = f"{uuid.uuid4().hex}.json"
    results, error = results_files(state, name)
    config = dict(config, out=name)

    def stream(line: str) -> None:  # the ServerApp's log; where the results go is said below
        started = submission.STARTED.search(line)
        if started is not None and campaign is not None:
            data = json.loads(campaign.read_text())
            data["flower_runs"].append(int(started.group(1)))
            write_record(campaign, data)
        if not line.startswith(RESULTS_WRITTEN):
            console.print(line, markup=False)

    code = submission.submit(state, config, stream=stream)
    if error.exists():
        text = error.read_text().strip()
        error.unlink()
        results.unlink(missing_ok=True)
        if campaign is not None and "nothing to resume" not in text:
            resume = f"botorch-fed flower resume {cli_dir(campaign.parent)}"
            text += f" (continue the campaign with `{resume}`)"
        print_error(console, text, "the run failed:")
        return 1
    if not results.exists():
        text = f"`flwr run` exited with {code} and wrote no results."
        if campaign is not None:
            text += (
                " If a process died, restart it (`botorch-fed flower up` with its flags), then "
                f"continue the campaign: `botorch-fed flower resume {cli_dir(campaign.parent)}`."
            )
        print_error(console, text, "the run failed:")
        return 1
    data = json.loads(results.read_text())
    results.unlink()
    result = RunResult(**data)
    result.best_per_client = {int(k): v for k, v in data["best_per_client"].items()}
    result.best_point_per_client = {int(k): v for k, v in data["best_point_per_client"].items()}
    if run.out:
        write_json(data, run.out)
    print_run(result, console, run.label)
    if run.out:
        console.print(f"results written to {escape(run.out)}", soft_wrap=True)
    if run.plot:
        plot_run(data, run.plot, console)
    return 0
