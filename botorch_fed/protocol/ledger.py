r"""Communication and timing ledger: per round, each party's seconds per stage, each
client's bytes sent and received, and the exchanges (the server's sends: one message to
each addressed client and their replies, a round trip over the network)."""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager

SERVER = "server"


class Ledger:
    r"""Per-round, per-stage times and per-client bytes of a federated run."""

    def __init__(self) -> None:
        self.round = 0
        self._times: dict[tuple[int, str, str], float] = defaultdict(float)
        self._bytes: dict[tuple[int, int], list[int]] = defaultdict(lambda: [0, 0])
        self._messages = 0
        self._exchanges: dict[int, int] = defaultdict(int)

    def add_time(self, stage: str, seconds: float, party: str | int = SERVER) -> None:
        r"""Add ``seconds`` to ``stage`` of ``party`` in the current round."""
        if not seconds >= 0:
            raise ValueError(f"`seconds` must be non-negative, got {seconds}.")
        self._times[(self.round, stage, str(party))] += float(seconds)

    @contextmanager
    def timer(self, stage: str) -> Iterator[None]:
        r"""Time a block of the server's work as ``stage``."""
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.add_time(stage, time.perf_counter() - t0)

    def add_message(self, client: int, down: int, up: int) -> None:
        r"""Record one message pair: ``down`` bytes to ``client``, ``up`` bytes back."""
        entry = self._bytes[(self.round, int(client))]
        entry[0] += int(down)
        entry[1] += int(up)
        self._messages += 1

    def add_exchange(self) -> None:
        r"""Record one exchange (a send of the server's) in the current round."""
        self._exchanges[self.round] += 1

    def exchanges_per_round(self, rounds: int | None = None) -> list[int]:
        r"""Exchanges in each round ``0..rounds-1`` (default: through the last round that
        recorded anything)."""
        if rounds is None:
            rounds = 1 + max(self._exchanges, default=-1)
        return [self._exchanges.get(r, 0) for r in range(rounds)]

    def stage_totals(self) -> dict[str, float]:
        r"""Total seconds per stage, summed over rounds and parties."""
        return {stage: sum(by.values()) for stage, by in self.stage_totals_by_party().items()}

    def stage_totals_by_party(self) -> dict[str, dict[str, float]]:
        r"""Total seconds per stage and party (``"server"`` or a client id)."""
        out: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        for (_, stage, party), s in self._times.items():
            out[stage][party] += s
        return {stage: dict(parties) for stage, parties in out.items()}

    def _traffic(self, by: int) -> dict[int, list[int]]:
        out: dict[int, list[int]] = defaultdict(lambda: [0, 0])
        for key, (down, up) in self._bytes.items():
            out[key[by]] = [out[key[by]][0] + down, out[key[by]][1] + up]
        return out

    def bytes_per_client(self) -> dict[int, dict[str, int]]:
        r"""Total bytes ``{"down": ..., "up": ...}`` per client."""
        return {c: {"down": d, "up": u} for c, (d, u) in sorted(self._traffic(1).items())}

    def per_round(self) -> list[dict]:
        r"""One record per round: stage seconds and bytes up/down (all clients)."""
        stages: dict[int, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        for (r, stage, _), s in self._times.items():
            stages[r][stage] += s
        traffic = self._traffic(0)
        return [
            {
                "round": r,
                "stage_s": dict(stages.get(r, {})),
                "bytes_down": traffic.get(r, [0, 0])[0],
                "bytes_up": traffic.get(r, [0, 0])[1],
            }
            for r in sorted(stages.keys() | traffic.keys())
        ]

    def state_dict(self) -> dict:
        r"""Everything recorded so far (checkpoints)."""
        return {
            "round": self.round,
            "times": [[r, stage, party, s] for (r, stage, party), s in self._times.items()],
            "bytes": [[r, client, down, up] for (r, client), (down, up) in self._bytes.items()],
            "messages": self._messages,
            "exchanges": [[r, n] for r, n in sorted(self._exchanges.items())],
        }

    def load_state_dict(self, state: dict) -> None:
        r"""Restore :meth:`state_dict` (replaces what was recorded)."""
        expected = ["bytes", "exchanges", "messages", "round", "times"]
        if sorted(state) != expected:
            raise ValueError(f"Ledger state has keys {sorted(state)}; expected {expected}.")
        self.round = int(state["round"])
        self._times = defaultdict(float)
        for r, stage, party, s in state["times"]:
            self._times[(int(r), str(stage), str(party))] = float(s)
        self._bytes = defaultdict(lambda: [0, 0])
        for r, client, down, up in state["bytes"]:
            self._bytes[(int(r), int(client))] = [int(down), int(up)]
        self._messages = int(state["messages"])
        self._exchanges = defaultdict(int)
        for r, n in state["exchanges"]:
            self._exchanges[int(r)] = int(n)

    def to_dict(self) -> dict:
        r"""JSON-friendly summary (totals, per client, per round)."""
        per_client = self.bytes_per_client()
        return {
            "stage_s": self.stage_totals(),
            "stage_party_s": self.stage_totals_by_party(),
            "bytes_per_client": {str(k): v for k, v in per_client.items()},
            "total_bytes_down": sum(v["down"] for v in per_client.values()),
            "total_bytes_up": sum(v["up"] for v in per_client.values()),
            "messages": self._messages,
            "exchanges": sum(self._exchanges.values()),
            "rounds": self.per_round(),
        }
