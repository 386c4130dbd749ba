r"""Benchmark of the secure-aggregation backends (``botorch_fed.secure``).

For every backend, number of clients ``M`` and support-set size ``|S|`` it sums
random vectors of magnitude ~1 and length ``|S| + |S|(|S|+1)/2 + 3`` (a packed dPITC
summary of the FBO-FedGP paper, paper 000) and records, as the median over
repeats: per-stage time (client encode/encrypt/mask, server aggregate,
decrypt/unmask), total time per aggregation round (sequential, every party in one
process) and its critical path (clients in parallel), bytes up/down per client and
the max error against the numpy float64 sum. Key generation and role creation are
reported separately (``setup_s``): they happen once per federation, not per round.

Results: ``benchmarks/results/secure_aggregation.{json,md,png}`` (``--smoke``:
``secure_aggregation_smoke.*``). The script is organised so that further sections
(e.g. the posterior error after aggregation) can reuse :func:`run_backend_grid` and
pass their own markdown to :func:`write_results` via ``extra_sections``.

Usage::

    python benchmarks/secure_aggregation.py            # full grid + the baseline (minutes)
    python benchmarks/secure_aggregation.py --smoke    # a few seconds (no baseline)
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path

import numpy as np

from botorch_fed.secure import get_backend, run_protocol

RESULTS_DIR = Path(__file__).resolve().parent / "results"
DEFAULT_BACKENDS = ("plaintext", "ckks", "masking")
DEFAULT_CLIENTS = (3, 10, 30, 100)
DEFAULT_SUPPORT = (8, 16, 32, 64)
TARGETS_MS = {"ckks": 50.0, "masking": 30.0}  # issue 14, at M = 10, |S| = 32
# the last revision with the semi-honest protocols (masking without signatures and the
# consistency round; CKKS without the nonce round), for --baseline
SEMI_HONEST = "fd09c1e"
TARGET_POINT = (10, 32)


def packed_length(support_size: int) -> int:
    """Length of a packed GP summary: ``|S| + |S|(|S|+1)/2 + 3``."""
    return support_size + support_size * (support_size + 1) // 2 + 3


def _median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


def benchmark_point(
    name: str,
    server,
    clients: dict,
    length: int,
    repeats: int,
    rng: np.random.Generator,
    max_seconds: float,
) -> dict:
    """Time ``repeats`` aggregation rounds of one configuration (after one warm-up).

    Args:
        name: Backend name.
        server: Server role (reused across rounds, like a running federation).
        clients: ``{cid: client role}``.
        length: Vector length.
        repeats: Timed rounds (fewer if one round exceeds ``max_seconds``).
        rng: Source of the random inputs.
        max_seconds: Stop repeating once a round took longer than this.

    Returns:
        A record with median timings (ms), mean bytes per client and max error.
    """
    ids = sorted(clients)
    runs = []
    for r in range(repeats + 1):
        inputs = {cid: rng.uniform(-1.0, 1.0, length) for cid in ids}
        stats: dict = {}
        t0 = time.perf_counter()
        total = run_protocol(server, clients, inputs, stats=stats)
        wall = time.perf_counter() - t0
        expected = np.sum(np.stack([inputs[c] for c in ids]), axis=0)
        stats["max_abs_error"] = float(np.max(np.abs(total - expected)))
        stats["wall_s"] = wall
        if r > 0 or repeats == 0:  # the first round warms caches up
            runs.append(stats)
        if r > 0 and wall > max_seconds:
            break
    stage = {k: [s["stage_s"][k] * 1e3 for s in runs] for k in runs[0]["stage_s"]}
    return {
        "backend": name,
        "n_clients": len(ids),
        "length": length,
        "repeats": len(runs),
        "client_encode_ms_per_client": _median(
            [s["client_encode_s_per_client"] * 1e3 for s in runs]
        ),
        "client_encode_ms": _median(stage["client_encode"]),
        "server_aggregate_ms": _median(stage["server_aggregate"]),
        "decrypt_unmask_ms": _median(stage["decrypt_unmask"]),
        "total_ms": _median([s["total_s"] * 1e3 for s in runs]),
        "total_ms_min": min(s["total_s"] * 1e3 for s in runs),
        "critical_path_ms": _median([s["critical_path_s"] * 1e3 for s in runs]),
        "bytes_up_per_client": _median([s["mean_bytes_up"] for s in runs]),
        "bytes_down_per_client": _median([s["mean_bytes_down"] for s in runs]),
        "max_abs_error": max(s["max_abs_error"] for s in runs),
        "rounds": len(runs[0]["rounds"]),
    }


def run_backend_grid(
    backends: Sequence[str] = DEFAULT_BACKENDS,
    n_clients: Sequence[int] = DEFAULT_CLIENTS,
    support_sizes: Sequence[int] = DEFAULT_SUPPORT,
    *,
    repeats: int = 5,
    seed: int = 0,
    max_seconds: float = 10.0,
    backend_options: dict[str, dict] | None = None,
    verbose: bool = True,
) -> list[dict]:
    """Benchmark every (backend, M, |S|) combination.

    Args:
        backends: Backend names for :func:`~botorch_fed.secure.get_backend`.
        n_clients: Numbers of clients ``M``.
        support_sizes: Support-set sizes ``|S|``.
        repeats: Timed rounds per configuration (median reported).
        seed: Seed of the inputs (key material is fresh OS randomness).
        max_seconds: Fewer repeats for configurations slower than this per round.
        backend_options: Per-backend options, e.g. ``{"ckks": {"encryption": "asymmetric"}}``.
        verbose: Print one line per configuration.

    Returns:
        One record per configuration (see :func:`benchmark_point`), plus
        ``support_size``, ``setup_s``, ``setup_bytes_server`` and
        ``setup_bytes_per_client``.
    """
    records = []
    rng = np.random.default_rng(seed)
    for name in backends:
        backend = get_backend(name, **(backend_options or {}).get(name, {}))
        for m in n_clients:
            ids = list(range(m))
            t0 = time.perf_counter()
            setup = backend.setup(ids)
            server = backend.server(setup.server_material)
            clients = {cid: backend.client(cid, setup.for_client(cid)) for cid in ids}
            setup_s = time.perf_counter() - t0
            for s in support_sizes:
                rec = benchmark_point(
                    name, server, clients, packed_length(s), repeats, rng, max_seconds
                )
                rec.update(
                    support_size=s,
                    options=backend.options,
                    setup_s=setup_s,
                    setup_bytes_server=len(setup.server_material),
                    setup_bytes_per_client=_median(
                        [len(v) for v in setup.client_material.values()]
                    ),
                )
                records.append(rec)
                if verbose:
                    print(
                        f"{name:9s} M={m:3d} |S|={s:3d} L={rec['length']:5d}  "
                        f"total {rec['total_ms']:8.2f} ms  "
                        f"critical {rec['critical_path_ms']:7.2f} ms"
                        f"  up {rec['bytes_up_per_client'] / 1e3:8.1f} kB  "
                        f"err {rec['max_abs_error']:.1e}",
                        flush=True,
                    )
            del server, clients
    return records


def environment() -> dict:
    """Machine and library versions for the result header."""
    versions = {"python": platform.python_version()}
    for pkg in ("numpy", "tenseal", "cryptography", "matplotlib"):
        try:
            versions[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            versions[pkg] = "not installed"
    return {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "versions": versions,
        "date_utc": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
    }


def _fmt_bytes(n: float) -> str:
    return f"{n / 1e3:.1f} kB" if n < 1e6 else f"{n / 1e6:.2f} MB"


def markdown_table(records: list[dict]) -> str:
    """The main result table (one row per configuration)."""
    head = (
        "| backend | M | \\|S\\| | length | client encode / client (ms) | server aggregate (ms) "
        "| decrypt / unmask (ms) | total per round (ms) | best total (ms) | critical path (ms) "
        "| up / client | down / client | max error | repeats |\n"
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n"
    )
    rows = [
        f"| {r['backend']} | {r['n_clients']} | {r['support_size']} | {r['length']} "
        f"| {r['client_encode_ms_per_client']:.2f} | {r['server_aggregate_ms']:.2f} "
        f"| {r['decrypt_unmask_ms']:.2f} | {r['total_ms']:.2f} | {r['total_ms_min']:.2f} "
        f"| {r['critical_path_ms']:.2f} "
        f"| {_fmt_bytes(r['bytes_up_per_client'])} | {_fmt_bytes(r['bytes_down_per_client'])} "
        f"| {r['max_abs_error']:.1e} | {r['repeats']} |"
        for r in records
    ]
    return head + "\n".join(rows) + "\n"


def target_summary(records: list[dict]) -> str:
    """The DESIGN.md targets at M = 10, |S| = 32 against the measurements."""
    m, s = TARGET_POINT
    lines = []
    for r in records:
        if (r["n_clients"], r["support_size"]) == (m, s):
            target = TARGETS_MS.get(r["backend"])
            verdict = (
                ""
                if target is None
                else f" Target < {target:.0f} ms: {'met' if r['total_ms'] < target else 'MISSED'}."
            )
            lines.append(
                f"- **{r['backend']}**: total {r['total_ms']:.1f} ms per round (median of "
                f"{r['repeats']}; best {r['total_ms_min']:.1f} ms); client encode "
                f"{r['client_encode_ms_per_client']:.2f} ms per client, server aggregate "
                f"{r['server_aggregate_ms']:.2f} ms, decrypt/unmask "
                f"{r['decrypt_unmask_ms']:.2f} ms; critical path "
                f"{r['critical_path_ms']:.1f} ms; {_fmt_bytes(r['bytes_up_per_client'])} up / "
                f"{_fmt_bytes(r['bytes_down_per_client'])} down per client; max error "
                f"{r['max_abs_error']:.1e}; key setup and role creation, once per "
                f"federation, not in the total: {r['setup_s'] * 1e3:.0f} ms.{verdict}"
            )
    return "\n".join(lines) + "\n" if lines else "(M = 10, |S| = 32 not in this run)\n"


def plot(records: list[dict], path: Path) -> None:
    """Total time vs M (|S| = 32 or the largest run), time and bytes vs |S| (M = 10)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    backends = sorted({r["backend"] for r in records})
    sizes = sorted({r["support_size"] for r in records})
    ms = sorted({r["n_clients"] for r in records})
    s_ref = 32 if 32 in sizes else sizes[-1]
    m_ref = 10 if 10 in ms else ms[-1]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for name in backends:
        rs = sorted(
            (r for r in records if r["backend"] == name and r["support_size"] == s_ref),
            key=lambda r: r["n_clients"],
        )
        axes[0].plot([r["n_clients"] for r in rs], [r["total_ms"] for r in rs], "o-", label=name)
        rs = sorted(
            (r for r in records if r["backend"] == name and r["n_clients"] == m_ref),
            key=lambda r: r["support_size"],
        )
        axes[1].plot([r["length"] for r in rs], [r["total_ms"] for r in rs], "o-", label=name)
        axes[2].plot(
            [r["length"] for r in rs], [r["bytes_up_per_client"] for r in rs], "o-", label=name
        )
    for backend, target in TARGETS_MS.items():
        if backend in backends and s_ref == TARGET_POINT[1]:
            axes[0].scatter([TARGET_POINT[0]], [target], marker="_", s=500, color="gray")
            axes[0].annotate(
                f"{backend} target",
                (TARGET_POINT[0], target),
                fontsize=8,
                color="gray",
                xytext=(6, 2),
                textcoords="offset points",
            )
    axes[0].set(
        xscale="log",
        yscale="log",
        xlabel="clients M",
        ylabel="ms per aggregation round (sequential)",
        title=f"|S| = {s_ref}",
    )
    axes[1].set(
        xscale="log",
        yscale="log",
        xlabel="vector length",
        ylabel="ms per aggregation round",
        title=f"M = {m_ref}",
    )
    axes[2].set(
        xscale="log",
        yscale="log",
        xlabel="vector length",
        ylabel="bytes up per client",
        title=f"M = {m_ref}",
    )
    for ax in axes:
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    fig.suptitle("botorch_fed.secure: cost of one secure aggregation (grey: DESIGN.md targets)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_results(
    records: list[dict],
    *,
    stem: str = "secure_aggregation",
    out_dir: Path = RESULTS_DIR,
    command: str | None = None,
    notes: Sequence[str] = (),
    extra_sections: dict[str, str] | None = None,
    make_plot: bool = True,
) -> dict[str, Path]:
    """Write ``<stem>.json``, ``<stem>.md`` (and ``<stem>.png``).

    Args:
        records: From :func:`run_backend_grid`.
        stem: File name stem.
        out_dir: Output directory.
        command: The exact command line (default: this process's argv).
        notes: Extra bullet points for the markdown header (caps, caveats).
        extra_sections: ``{title: markdown}`` appended after the main table (e.g. a
            later "posterior error after aggregation" section); also stored in JSON.
        make_plot: Whether to write the PNG.

    Returns:
        The written paths.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    env = environment()
    command = command or "python " + " ".join([Path(sys.argv[0]).as_posix(), *sys.argv[1:]])
    paths = {"json": out_dir / f"{stem}.json", "md": out_dir / f"{stem}.md"}
    payload = {
        "command": command,
        "environment": env,
        "notes": list(notes),
        "records": records,
        "sections": extra_sections or {},
    }
    paths["json"].write_text(json.dumps(payload, indent=1, default=str) + "\n")
    versions = ", ".join(f"{k} {v}" for k, v in env["versions"].items())
    md = [
        "# Secure aggregation benchmark\n",
        f"- Command: `{command}`",
        f"- Machine: {env['platform']}, {env['processor']}, {env['cpu_count']} CPUs",
        f"- Libraries: {versions}",
        f"- Date: {env['date_utc']}",
        "- Inputs: uniform(-1, 1), length |S| + |S|(|S|+1)/2 + 3; median over `repeats` "
        "rounds after one warm-up; every party runs in this one process.",
        "- Stages: *client encode* = one client's work (encode/encrypt, or key agreement + "
        "Shamir sharing + masking), *server aggregate* = server work until the aggregate "
        "exists (routing, adding), *decrypt / unmask* = decryption on the clients (ckks) or "
        "share upload + unmasking on the server (masking), summed over parties. *Total per "
        "round* = sum of all parties' work (upper bound on latency, no network); *critical "
        "path* = clients in parallel.",
        "- Bytes: every frame of the round (headers, MACs included) per client; key setup "
        "(once per federation) is excluded and listed in the JSON (`setup_bytes_*`).",
        *[f"- {n}" for n in notes],
        "",
        "## Targets (DESIGN.md: M = 10, |S| = 32)\n",
        target_summary(records),
        "## All configurations\n",
        markdown_table(records),
    ]
    for title, body in (extra_sections or {}).items():
        md += [f"\n## {title}\n", body]
    paths["md"].write_text("\n".join(md))
    if make_plot:
        paths["png"] = out_dir / f"{stem}.png"
        plot(records, paths["png"])
    return paths


def _point_in_subprocess(root: Path, repeats: int, seed: int) -> list[dict]:
    """The target point of ckks and masking, timed by this script in a fresh process
    that imports ``botorch_fed`` from ``root`` (this checkout or a baseline worktree)."""
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "point.json"
        cmd = [
            sys.executable,
            str(Path(__file__).resolve()),
            "--point-only",
            str(out),
            "--backends",
            "ckks",
            "masking",
            "--clients",
            str(TARGET_POINT[0]),
            "--support-sizes",
            str(TARGET_POINT[1]),
            "--repeats",
            str(repeats),
            "--seed",
            str(seed),
        ]
        env = {**os.environ, "PYTHONPATH": str(root)}
        subprocess.run(cmd, check=True, env=env, cwd=root, capture_output=True)
        return json.loads(out.read_text())


def baseline_section(rev: str, repeats: int, pairs: int, seed: int) -> tuple[str, dict]:
    """The malicious-secure protocols against the semi-honest ones of ``rev``: the
    target point timed alternately in fresh processes of this code and of a git
    worktree of ``rev``, ``pairs`` times."""
    import subprocess
    import tempfile

    here = Path(__file__).resolve().parent.parent
    runs: dict[str, list[dict]] = {"this code": [], rev: []}
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp) / "baseline"
        subprocess.run(
            ["git", "-C", str(here), "worktree", "add", "--detach", str(tree), rev],
            check=True,
            capture_output=True,
        )
        try:
            for _ in range(pairs):
                runs["this code"] += _point_in_subprocess(here, repeats, seed)
                runs[rev] += _point_in_subprocess(tree, repeats, seed)
        finally:
            subprocess.run(
                ["git", "-C", str(here), "worktree", "remove", "--force", str(tree)],
                check=False,
                capture_output=True,
            )
    lines = [
        f"Target point M = {TARGET_POINT[0]}, |S| = {TARGET_POINT[1]}; {pairs} alternating "
        f"pairs of fresh processes (this code, then `{rev}`, the last revision with the "
        "semi-honest protocols: masking without signatures and consistency round, CKKS "
        f"without the nonce round), each the median of {repeats} rounds; the cells are "
        "medians over the pairs.",
        "",
        "| backend | code | rounds | total per round (ms) | critical path (ms) | "
        "up / client | down / client |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    summary = {}
    for name in ("ckks", "masking"):
        for code, recs in runs.items():
            sub = [r for r in recs if r["backend"] == name]
            row = {
                k: _median([r[k] for r in sub])
                for k in (
                    "total_ms",
                    "critical_path_ms",
                    "bytes_up_per_client",
                    "bytes_down_per_client",
                )
            }
            row["rounds"] = sub[0]["rounds"]
            summary[f"{name}/{code}"] = row
            lines.append(
                f"| {name} | {code} | {row['rounds']} | {row['total_ms']:.2f} | "
                f"{row['critical_path_ms']:.2f} | {_fmt_bytes(row['bytes_up_per_client'])} | "
                f"{_fmt_bytes(row['bytes_down_per_client'])} |"
            )
        new, old = summary[f"{name}/this code"], summary[f"{name}/{rev}"]
        lines.append(
            f"| {name} | ratio | | {new['total_ms'] / old['total_ms']:.2f}x | "
            f"{new['critical_path_ms'] / old['critical_path_ms']:.2f}x | "
            f"{new['bytes_up_per_client'] / old['bytes_up_per_client']:.2f}x | "
            f"{new['bytes_down_per_client'] / old['bytes_down_per_client']:.2f}x |"
        )
    return "\n".join(lines) + "\n", summary


def _loadavg() -> str:
    try:
        return " / ".join(f"{v:.2f}" for v in os.getloadavg())
    except OSError:  # pragma: no cover - not available on every platform
        return "n/a"


def _busy_processes(window: float = 1.0, threshold: float = 0.2) -> str:
    """Other processes that used more than ``threshold`` of a CPU over ``window``
    seconds (Linux ``/proc``; "n/a" elsewhere), to record competing load."""

    def cpu_ticks() -> dict[int, tuple[int, str]]:
        out = {}
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) == os.getpid():
                continue
            try:
                stat = (entry / "stat").read_text()
                cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
            except OSError:
                continue
            fields = stat[stat.rindex(")") + 2 :].split()
            out[int(entry.name)] = (int(fields[11]) + int(fields[12]), cmd[:80])
        return out

    try:
        before = cpu_ticks()
        time.sleep(window)
        after = cpu_ticks()
    except OSError:  # pragma: no cover - no /proc
        return "n/a"
    hz = os.sysconf("SC_CLK_TCK")
    busy = [
        f"`{cmd or pid}` ({100 * (ticks - before[pid][0]) / hz / window:.0f}% of a CPU)"
        for pid, (ticks, cmd) in after.items()
        if pid in before and (ticks - before[pid][0]) / hz / window > threshold
    ]
    return "; ".join(busy) if busy else "none"


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="tiny grid, a few seconds")
    parser.add_argument("--backends", nargs="+", default=list(DEFAULT_BACKENDS))
    parser.add_argument("--clients", nargs="+", type=int, default=list(DEFAULT_CLIENTS))
    parser.add_argument("--support-sizes", nargs="+", type=int, default=list(DEFAULT_SUPPORT))
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--max-seconds",
        type=float,
        default=10.0,
        help="fewer repeats for configurations slower than this per round",
    )
    parser.add_argument("--out-dir", type=Path, default=RESULTS_DIR)
    parser.add_argument("--no-plot", action="store_true")
    parser.add_argument(
        "--baseline",
        default=SEMI_HONEST,
        help="revision with the semi-honest protocols to compare with ('' to skip)",
    )
    parser.add_argument("--baseline-pairs", type=int, default=5)
    parser.add_argument("--point-only", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    notes = [f"load average at start (1/5/15 min): {_loadavg()}"]
    if not args.point_only:
        notes.append(f"other processes above 20% of a CPU at start: {_busy_processes()}")
    if args.smoke:
        args.clients, args.support_sizes, args.repeats = [3, 10], [8, 32], 1
        notes.append("--smoke: tiny subset (M in {3, 10}, |S| in {8, 32}, 1 repeat)")
    records = run_backend_grid(
        args.backends,
        args.clients,
        args.support_sizes,
        repeats=args.repeats,
        seed=args.seed,
        max_seconds=args.max_seconds,
        verbose=not args.point_only,
    )
    if args.point_only:  # a fresh process timing one point for --baseline
        args.point_only.write_text(json.dumps(records, default=str))
        return 0
    capped = sorted(
        {(r["backend"], r["n_clients"]) for r in records if r["repeats"] < args.repeats}
    )
    if capped:
        notes.append(
            "fewer repeats (a round took > "
            f"{args.max_seconds:g} s) for: " + ", ".join(f"{b} M={m}" for b, m in capped)
        )
    # the dPITC posterior after aggregation (imports torch; the backends above do not)
    from secure_posterior_error import markdown_section, posterior_error_records

    posterior = posterior_error_records(10, args.support_sizes, seed=args.seed)
    sections = {}
    if args.baseline and not args.smoke:
        notes.append(f"other processes above 20% of a CPU before the baseline: {_busy_processes()}")
        body, _ = baseline_section(args.baseline, args.repeats, args.baseline_pairs, args.seed)
        sections["Malicious-secure protocols against the semi-honest ones"] = body
    notes.append(f"load average at end (1/5/15 min): {_loadavg()}")
    notes.append(f"other processes above 20% of a CPU at end: {_busy_processes()}")
    command = "python benchmarks/secure_aggregation.py " + " ".join(
        sys.argv[1:] if argv is None else argv
    )
    paths = write_results(
        records,
        stem="secure_aggregation_smoke" if args.smoke else "secure_aggregation",
        out_dir=args.out_dir,
        notes=notes,
        make_plot=not args.no_plot,
        extra_sections={
            **sections,
            "dPITC posterior after secure aggregation (M = 10)": markdown_section(
                posterior, command.strip()
            ),
        },
    )
    print("\n" + target_summary(records))
    print("wrote " + ", ".join(str(p) for p in paths.values()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
