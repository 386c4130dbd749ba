r"""Short runs of every registered algorithm, as ``botorch-fed run`` options."""

from __future__ import annotations

import json

from botorch_fed.algorithms import get_algorithm
from botorch_fed.algorithms.fedzero import FedZeroSettings
from botorch_fed.algorithms.ldp_bo import LDPBOSettings

CO_KG = ("co-kg", "co-ei", "co-es", "barycenter-qkg")


def short_argv(
    name: str, aggregator: str = "plaintext", rounds: int = 1, clients: int = 3
) -> list[str]:
    r"""A cheap ``rounds``-round run of ``name`` with ``clients`` clients, seeds fixed."""
    spec = get_algorithm(name)
    argv = [name, "--clients", str(clients), "--num-rounds", str(rounds), "--seed", "2"]
    argv += ["--crypto-seed", "5"]
    if spec.settings_class is LDPBOSettings:
        argv += ["--problem", "ldp-synthetic"]
        return argv + (["--plays-per-epoch", "1"] if name.endswith("moma") else [])
    if spec.settings_class is FedZeroSettings:
        return argv + ["--problem", "branin", "--eta", "0.05", "--h", "0.05"]
    argv += ["--problem", "branin", "--num-init", "3", "--num-restarts", "2"]
    argv += ["--raw-samples", "16", "--maxiter", "15"]
    if spec.secure_aggregation:
        argv += ["--aggregator", aggregator]
    if name in CO_KG:
        argv += ["--points-per-dim", "4"]
        if name in ("co-kg", "barycenter-qkg"):
            argv += ["--num-fantasies", "4"]
    return argv


def comparable(result) -> dict:
    r"""A :class:`RunResult` as JSON, without what differs between transports: wall
    times, versions, byte counts and stage times (the rounds and their stages stay)."""
    out = result.to_dict()
    for key in ("time_s", "versions"):
        out.pop(key)
    ledger = out.pop("ledger")
    out["rounds"] = [[r["round"], sorted(r["stage_s"])] for r in ledger["rounds"]]
    return json.loads(json.dumps(out))
