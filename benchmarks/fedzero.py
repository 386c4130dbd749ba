r"""FedZero benchmark: the rate of Cor. 3.2, l1 against l2 randomisation, throughput.

Paper 004 ([FedZero], Alg. 1, Cor. 3.2): with ``eta = (1/L) sqrt(m / (n d))`` and
``h = (1/L) sqrt((d + 1) / n)`` the averaged iterate of ``n`` rounds with ``m`` workers
is within ``D L sqrt(d / (n m))`` (up to logarithms) of the optimum. Parts:

- **a** (rate): the optimisation error ``f(x_bar_n) - f*`` of the averaged iterate on
  least-absolute-deviations regression with contexts (:class:`L1Regression`, ``d = 20``,
  ``N = 1000`` rows, planted 10-sparse ``x*``, ``f* = 0``; Theta = the box ``[-1, 1]^d``)
  for ``m in {1, 4, 16, 64}`` and horizons ``n in {100, 300, 1000, 3000, 10000}``; every
  ``(m, n)`` is ``R = 20`` independent runs batched by :func:`simulate_fedzero` with the
  corollary's ``eta`` and ``h`` *for that horizon* (``L = max_i ||a_i||``). Fitted
  log-log slopes in ``n`` (per ``m``) and in ``m`` (at ``n = 10^4``), with 95% bootstrap
  CIs (runs resampled within each cell), against the theory's ``-1/2`` and ``-1/2``.
- **b** (l1 vs l2): final errors of the l1-sphere (paper) and l2-sphere estimators with
  the same budget (``d = 50``, ``m = 4``, ``n = 4000``, ``R = 20``) and the same
  Cor. 3.2 steps, on problems whose geometry should favour l1 (sparse ``x*``; Theta an
  l1 ball or the simplex) and problems where it should not (dense ``x*`` in an l2 ball or
  a box), plus a linear objective on the simplex (no smoothing bias at all). A second
  regime uses ``h / 100`` (same ``eta``) to separate the smoothing bias from the variance.
- **c** (throughput): worker-queries per second of the batched :func:`l1_gradient`
  (``batch x d``, a fixed linear ``f``, float32 and float64, ``torch.set_num_threads(2)``)
  against a per-worker NumPy loop in the reference implementation's style, on a grid with
  ``batch * d <= 1e8``; the key cell ``m = 1000, d = 1000`` in ``C_REPS`` fresh processes,
  each alternating the batched call and the loop (paired ratios), also under a no-trim
  allocator and with one torch thread. Part **gpu** (where CUDA is available): the same
  estimator on the GPU against a device-to-device copy.
  Plus the protocol: ``botorch-fed run fedzero --problem l1-regression --dim 100
  --clients 16 --rounds 2000 --seed 0`` with the three message forms (wall time, bytes).

Every result is appended to ``fedzero_runs.jsonl`` as it finishes and skipped when asked
for again; ``--report`` rebuilds ``fedzero.md``, ``fedzero.json`` and the PNGs from the
stored records.

Usage::

    python benchmarks/fedzero.py --smoke --out /tmp/fz     # ~30 s
    python benchmarks/fedzero.py                           # ~10 min on 2 cores
    python benchmarks/fedzero.py --report
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import os
import platform
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import torch
from run_records import cpu_model, load_runs  # benchmarks/run_records.py (the script's folder)

RESULTS = Path(__file__).parent / "results"
STEM = "fedzero"
ROOT = Path(__file__).resolve().parent.parent

# part a
A_DIM, A_DATA, A_RUNS = 20, 1000, 20
A_WORKERS = (1, 4, 16, 64)
A_HORIZONS = (100, 300, 1000, 3000, 10_000)
A_PROBLEMS = ("l1norm", "lad")
A_TITLES = {
    "l1norm": "f(x) = ||x - x*||_1 (no contexts), x* ~ U[-0.5, 0.5]^d, from the corner x_1 = -1, "
    "L = sqrt(d) (its l2-Lipschitz constant), f* = 0",
    "lad": "L1Regression (LAD with contexts), N = 1000 rows a_i ~ N(0, I/d), planted 10-sparse "
    "x*, f* = 0, x_1 = 0, L = max_i ||a_i||",
}
# part b
B_DIM, B_DATA, B_RUNS, B_WORKERS, B_ROUNDS = 50, 1000, 20, 4, 4000
B_PROBLEMS = (
    "sparse LAD, l1 ball",
    "sparse LAD, simplex",
    "linear, simplex",
    "dense LAD, l2 ball",
    "dense LAD, box",
)
B_FAVOURS = {  # what the geometry argument predicts
    "sparse LAD, l1 ball": "l1",
    "sparse LAD, simplex": "l1",
    "linear, simplex": "l1",
    "dense LAD, l2 ball": "not l1",
    "dense LAD, box": "not l1",
}
B_REGIMES = {"theory": 1.0, "h/100": 0.01}
# part c
C_BATCHES = (100, 1000, 10_000, 100_000, 1_000_000)
C_DIMS = (10, 100, 1000, 10_000)
C_MAX_ELEMENTS = 100_000_000  # batch * d: ~10 temporaries of 0.4 / 0.8 GB (f32 / f64)
C_KEY = (1000, 1000)
C_REPS = 9  # fresh processes for the key cell (each: C_PAIRS alternating measurements)
C_PAIRS = 15
# glibc settings that keep freed 4-MB buffers in the heap (no trim, no mmap below 32 MiB):
# the key cell is also timed under them, to separate the estimator's cost from page faults
NO_TRIM_ENV = {"MALLOC_TRIM_THRESHOLD_": str(1 << 40), "MALLOC_MMAP_THRESHOLD_": str(1 << 25)}
# part gpu (only where torch.cuda.is_available())
G_BATCHES = (1000, 10_000, 100_000, 1_000_000)
G_DIMS = (100, 1000, 10_000)
P_ROUNDS, P_DIM, P_CLIENTS = 2000, 100, 16
MESSAGES = ("vector", "seed", "sign")


# --- helpers -----------------------------------------------------------------------------
def _bootstrap_ci(samples: np.ndarray, q=(2.5, 97.5)) -> tuple[float, float]:
    lo, hi = np.percentile(samples, q)
    return float(lo), float(hi)


def _fit_slope(x: np.ndarray, y: np.ndarray) -> float:
    return float(np.polyfit(np.log(x), np.log(y), 1)[0])


def _slope_with_ci(xs, groups, rng, B=2000):
    r"""Slope of log(mean error) on log(x) over the cells ``groups`` (one array of run
    errors per x), and a 95% bootstrap CI resampling runs within each cell."""
    xs = np.asarray(xs, dtype=float)
    means = np.array([np.mean(g) for g in groups])
    slope = _fit_slope(xs, means)
    boots = np.empty(B)
    for b in range(B):
        bm = [np.mean(rng.choice(g, size=len(g), replace=True)) for g in groups]
        boots[b] = _fit_slope(xs, np.array(bm))
    return slope, _bootstrap_ci(boots)


def _mean_ci(values, rng, B=2000) -> tuple[float, float, float]:
    v = np.asarray(values, dtype=float)
    boots = rng.choice(v, size=(B, len(v)), replace=True).mean(axis=1)
    lo, hi = _bootstrap_ci(boots)
    return float(v.mean()), lo, hi


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


# --- part a ------------------------------------------------------------------------------
def _lad_problem(dim: int, sparsity: int, function_seed: int):
    from botorch_fed.test_functions.l1_regression import L1Regression

    return L1Regression(dim=dim, num_data=A_DATA, sparsity=sparsity, function_seed=function_seed)


def _run_a(job: dict) -> dict:
    from botorch_fed.zeroth_order import Box, fedzero_defaults, simulate_fedzero

    t0 = time.perf_counter()
    load_before = _load()
    d, m, n, R = job["dim"], job["m"], job["n"], job["runs"]
    box = Box(-torch.ones(d, dtype=torch.float64), torch.ones(d, dtype=torch.float64))
    if job["problem"] == "lad":
        prob = _lad_problem(d, min(10, d), 0)
        L, f, ctx, pop, f_star = (
            prob.lipschitz,
            prob.evaluate_contexts,
            prob.sample_contexts,
            prob.evaluate_true,
            prob.optimal_value,
        )
        x0 = torch.zeros(d, dtype=torch.float64)
    else:  # f(x) = ||x - x*||_1, x* ~ U[-0.5, 0.5]^d, from the corner -1: L = sqrt(d)
        x_star = torch.rand(d, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
        x_star = x_star - 0.5

        def f(X):
            return (X - x_star).abs().sum(-1)

        L, ctx, pop, f_star = math.sqrt(d), None, f, 0.0
        x0 = -torch.ones(d, dtype=torch.float64)
    eta, h = fedzero_defaults(L, n, m, d)
    gen = torch.Generator().manual_seed(1000 * m + n)
    every = max(1, n // 50)
    sim = simulate_fedzero(
        f,
        box,
        x0,
        num_runs=R,
        num_workers=m,
        num_rounds=n,
        eta=eta,
        h=h,
        estimator="l1",
        generator=gen,
        contexts=ctx,
        record_every=every,
    )
    with torch.no_grad():
        err = (pop(sim.average) - f_star).tolist()
        curve = (pop(sim.averages) - f_star).mean(dim=-1).tolist()
    return {
        **job,
        "L": L,
        "eta": eta,
        "h": h,
        "diameter": box.diameter,
        "f0": float(pop(x0.unsqueeze(0))) - f_star,
        "errors": err,
        "curve_rounds": sim.rounds.tolist(),
        "curve_mean_error": curve,
        "time_s": time.perf_counter() - t0,
        "load_before": load_before,
        "load_after": _load(),
    }


# --- part b ------------------------------------------------------------------------------
class _LAD:
    r"""``f_c(x) = |a_c' x - b_c|`` on given data (``b = A x*``, ``f* = 0``)."""

    def __init__(self, A: torch.Tensor, x_star: torch.Tensor):
        self.A, self.x_star = A, x_star
        self.b = A @ x_star
        self.lipschitz = float(torch.linalg.vector_norm(A, dim=-1).max())

    def evaluate_contexts(self, X, index):
        rows = self.A[index]
        return ((X * rows).sum(-1) - self.b[index]).abs()

    def sample_contexts(self, shape, generator=None):
        return torch.randint(self.A.shape[0], tuple(shape), generator=generator)

    def population(self, X):
        return (X @ self.A.T - self.b).abs().mean(-1)


def _b_problem(name: str):
    r"""``(f, contexts, population f, f*, domain, x0, L, note)`` for a part-b problem."""
    from botorch_fed.zeroth_order import Box, L1Ball, L2Ball, Simplex

    d = B_DIM
    zeros = torch.zeros(d, dtype=torch.float64)
    if name in ("sparse LAD, l1 ball", "dense LAD, l2 ball", "dense LAD, box"):
        sparse = name.startswith("sparse")
        p = _lad_problem(d, 3 if sparse else d, 1 if sparse else 2)
        if name == "sparse LAD, l1 ball":
            r = 1.5  # x* has 3 entries in [-0.5, 0.5]: ||x*||_1 <= 1.5
            dom, note = L1Ball(zeros, r), f"L1Ball(0, {r}), 3-sparse x*"
        elif name == "dense LAD, l2 ball":
            r = 0.5 * math.sqrt(d)  # x* in [-0.5, 0.5]^d
            dom, note = L2Ball(zeros, r), f"L2Ball(0, {r:.3g}), dense x*"
        else:
            dom, note = Box(-torch.ones(d), torch.ones(d)), "Box [-1, 1]^d, dense x*"
        assert bool(dom.contains(p.solution.unsqueeze(0)).all())

        def pop(X):
            return p.evaluate_true(X)

        return p.evaluate_contexts, p.sample_contexts, pop, 0.0, dom, zeros, p.lipschitz, note
    g = torch.Generator().manual_seed(3)
    if name == "sparse LAD, simplex":
        A = torch.randn(B_DATA, d, generator=g, dtype=torch.float64) / math.sqrt(d)
        x_star = torch.zeros(d, dtype=torch.float64)
        x_star[torch.randperm(d, generator=g)[:3]] = torch.tensor([0.5, 0.3, 0.2]).double()
        p = _LAD(A, x_star)
        x0 = torch.full((d,), 1.0 / d, dtype=torch.float64)
        note = "Simplex(1), x* = (0.5, 0.3, 0.2) on 3 random coordinates"
        return (
            p.evaluate_contexts,
            p.sample_contexts,
            p.population,
            0.0,
            Simplex(1.0),
            x0,
            p.lipschitz,
            note,
        )
    # linear on the simplex: f(x) = c'x, f* = min_j c_j (a vertex)
    c = torch.randn(d, generator=g, dtype=torch.float64)
    x0 = torch.full((d,), 1.0 / d, dtype=torch.float64)

    def lin(X):
        return X @ c

    note = "f(x) = c'x, c ~ N(0, I), Simplex(1), optimum a vertex (no contexts)"
    return lin, None, lin, float(c.min()), Simplex(1.0), x0, float(c.norm()), note


def _run_b(job: dict) -> dict:
    from botorch_fed.zeroth_order import fedzero_defaults, simulate_fedzero

    t0 = time.perf_counter()
    load_before = _load()
    f, ctx, pop, f_star, dom, x0, L, note = _b_problem(job["problem"])
    n, m, R = job["n"], job["m"], job["runs"]
    eta, h = fedzero_defaults(L, n, m, B_DIM)
    h = h * B_REGIMES[job["regime"]]
    seed = 7919 * (B_PROBLEMS.index(job["problem"]) + 1) + (job["estimator"] == "l2")
    gen = torch.Generator().manual_seed(seed + 100 * list(B_REGIMES).index(job["regime"]))
    sim = simulate_fedzero(
        f,
        dom,
        x0,
        num_runs=R,
        num_workers=m,
        num_rounds=n,
        eta=eta,
        h=h,
        estimator=job["estimator"],
        generator=gen,
        contexts=ctx,
        record_every=None,
    )
    with torch.no_grad():
        err = (pop(sim.average) - f_star).tolist()
    return {
        **job,
        "L": L,
        "eta": eta,
        "h": h,
        "domain": note,
        "diameter": dom.diameter,
        "f0": float(pop(x0.unsqueeze(0))) - f_star,
        "errors": err,
        "time_s": time.perf_counter() - t0,
        "load_before": load_before,
        "load_after": _load(),
    }


# --- part c ------------------------------------------------------------------------------
def _time_calls(fn, min_total: float = 0.5, max_calls: int = 20) -> tuple[float, int]:
    r"""Median seconds per call of ``fn`` after one warm-up call."""
    fn()
    times = []
    start = time.perf_counter()
    while len(times) < max_calls and (time.perf_counter() - start < min_total or len(times) < 3):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
        if times[-1] > 2.0 and len(times) >= 1:
            break
    return float(np.median(times)), len(times)


def _torch_call(batch: int, d: int, dtype: torch.dtype):
    from botorch_fed.zeroth_order import l1_gradient

    g = torch.Generator().manual_seed(0)
    c = torch.randn(d, generator=g, dtype=dtype) / math.sqrt(d)
    x = torch.zeros(d, dtype=dtype).expand(batch, d)  # every worker at the broadcast x_t

    def f(X):
        return X @ c

    return lambda: l1_gradient(f, x, 0.1, generator=g)


def _numpy_loop(workers: int, d: int, dtype) -> callable:
    r"""The reference implementation's per-worker loop, written lean: a Laplace vector
    from NumPy (float64, as ``Generator.laplace`` draws; cast to ``dtype``), the step
    ``h / ||lap||_1`` folded into one multiply, ``f`` at two single points, the estimate
    written in place."""
    rng = np.random.default_rng(0)
    c = (np.random.default_rng(1).standard_normal(d) / math.sqrt(d)).astype(dtype)
    x = np.zeros(d, dtype=dtype)
    h = 0.1

    def f(v):
        return float(v @ c)

    def loop():
        out = np.empty((workers, d), dtype=dtype)
        for j in range(workers):
            lap = rng.laplace(size=d).astype(dtype, copy=False)
            hz = lap * (h / np.abs(lap).sum())
            scale = d / (2 * h) * (f(x + hz) - f(x - hz))
            np.multiply(np.sign(lap), scale, out=out[j])  # lap is never 0
        return out

    return loop


def _run_c(job: dict) -> dict:
    torch.set_num_threads(job.get("threads", 2))
    load_before = _load()
    batch, d = job["batch"], job["d"]
    if job["impl"] == "torch":
        dtype = torch.float32 if job["dtype"] == "float32" else torch.float64
        sec, calls = _time_calls(_torch_call(batch, d, dtype))
        workers = batch
    else:
        dtype = np.float32 if job["dtype"] == "float32" else np.float64
        # the loop's cost is linear in the workers: time at most a few thousand of them
        workers = min(batch, max(20, 2_000_000 // d), 2000)
        sec, calls = _time_calls(_numpy_loop(workers, d, dtype), min_total=0.3, max_calls=5)
    torch.set_num_threads(2)
    return {
        **job,
        "workers_timed": workers,
        "sec_per_call": sec,
        "calls": calls,
        "queries_per_s": workers / sec,
        "load_before": load_before,
        "load_after": _load(),
    }


def _run_ckey(job: dict) -> dict:
    r"""The key cell in one fresh process: ``C_PAIRS`` alternations of (the mean of 5
    batched calls, the first included, one call of the NumPy loop over the same
    workers), so that slow drifts of the machine weigh on both sides of every ratio;
    minor page faults per batched call from ``getrusage``."""
    import resource

    torch.set_num_threads(job["threads"])
    load_before = _load()
    batch, d = job["batch"], job["d"]
    tdt = torch.float32 if job["dtype"] == "float32" else torch.float64
    ndt = np.float32 if job["dtype"] == "float32" else np.float64
    batched, loop = _torch_call(batch, d, tdt), _numpy_loop(batch, d, ndt)
    for _ in range(3):
        batched()
    loop()
    torch_s, numpy_s, faults = [], [], 0
    for _ in range(C_PAIRS):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        times = []
        for _ in range(5):
            t = time.perf_counter()
            batched()
            times.append(time.perf_counter() - t)
        faults += resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
        torch_s.append(float(np.mean(times)))
        t = time.perf_counter()
        loop()
        numpy_s.append(time.perf_counter() - t)
    torch.set_num_threads(2)
    ratios = [n / t for n, t in zip(numpy_s, torch_s, strict=True)]
    return {
        **job,
        "torch_s": torch_s,
        "numpy_s": numpy_s,
        "ratios": ratios,
        "speedup": float(np.median(ratios)),
        "faults_per_call": faults / (5 * C_PAIRS),
        "load_before": load_before,
        "load_after": _load(),
    }


def _run_gpu(job: dict) -> dict:
    r"""Throughput of the batched estimator on the GPU (CUDA events, median of calls after
    a warm-up) and, in the same process, a device-to-device copy of one ``batch x d``
    tensor; plus the CUDA kernels one call launches (torch profiler)."""
    from torch.profiler import ProfilerActivity, profile

    from botorch_fed.zeroth_order import l1_gradient

    dev = torch.device("cuda")
    dtype = torch.float32 if job["dtype"] == "float32" else torch.float64
    batch, d = job["batch"], job["d"]
    g = torch.Generator(device=dev).manual_seed(0)
    c = torch.randn(d, generator=g, device=dev, dtype=dtype) / math.sqrt(d)
    x = torch.zeros(d, device=dev, dtype=dtype).expand(batch, d)

    def call():
        return l1_gradient(lambda X: X @ c, x, 0.1, generator=g)

    def timed(fn, reps: int) -> float:
        fn()
        torch.cuda.synchronize()
        out = []
        for _ in range(reps):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            out.append(start.elapsed_time(end) / 1e3)
        return float(np.median(out))

    reps = 20 if batch * d >= 10**7 else 50
    sec = timed(call, reps)
    src = torch.rand(batch, d, device=dev, dtype=dtype)
    dst = torch.empty_like(src)
    copy_sec = timed(lambda: dst.copy_(src), reps)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        call()
        torch.cuda.synchronize()
    cuda = [e for e in prof.key_averages() if e.device_type.name == "CUDA"]
    copies = sum(e.count for e in cuda if e.key.startswith(("Memcpy", "Memset")))
    kernels = sum(e.count for e in cuda) - copies
    nbytes = batch * d * src.element_size()
    src = dst = None  # free them before the next cell
    torch.cuda.empty_cache()
    props = torch.cuda.get_device_properties(dev)
    return {
        **job,
        "sec_per_call": sec,
        "queries_per_s": batch / sec,
        "copy_sec": copy_sec,
        "copy_GBps": 2 * nbytes / copy_sec / 1e9,  # read + write
        # the least any two-point estimator moves: x + h z and x - h z written and read
        # once (by f), g written: 5 batch x d tensors
        "min_traffic_GBps": 5 * nbytes / sec / 1e9,
        "kernels_per_call": kernels,
        "copies_per_call": copies,  # Memcpy / Memset (host syncs of the input checks)
        "device": f"{props.name}, {props.multi_processor_count} SMs, "
        f"{props.total_memory / 2**30:.0f} GiB",
        "versions": f"torch {torch.__version__}, CUDA {torch.version.cuda}, python "
        f"{platform.python_version()}",
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
    }


def _run_protocol(job: dict) -> dict:
    exe = Path(sys.executable).parent / "botorch-fed"
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "r.json"
        cmd = [
            str(exe),
            "run",
            "fedzero",
            "--problem",
            "l1-regression",
            "--dim",
            str(job["dim"]),
            "--clients",
            str(job["clients"]),
            "--rounds",
            str(job["rounds"]),
            "--seed",
            "0",
            "--message",
            job["message"],
            "--out",
            str(out),
        ]
        load_before = _load()
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
        wall = time.perf_counter() - t0
        if proc.returncode != 0:
            tail = f"{proc.stdout[-1000:]}\n{proc.stderr[-2000:]}"
            raise RuntimeError(f"{' '.join(cmd)} failed:\n{tail}")
        res = json.loads(out.read_text())
    led = res["ledger"]
    M, n = job["clients"], job["rounds"]
    rec = res.get("recommendation") or {}
    iv = res.get("iterate_values_per_round") or []
    return {
        **job,
        "command": "botorch-fed " + " ".join(cmd[1:-2]),
        "wall_s": wall,
        "run_time_s": res["time_s"],
        "bytes_up_total": led["total_bytes_up"],
        "bytes_down_total": led["total_bytes_down"],
        "messages": led["messages"],
        "bytes_up_per_message": led["total_bytes_up"] / (M * n),
        "bytes_down_per_message": led["total_bytes_down"] / (M * n),
        "recommendation_value": rec.get("value"),
        "last_iterate_value": iv[-1] if iv else None,
        "optimal_value": res.get("optimal_value"),
        "load_before": load_before,
        "load_after": _load(),
    }


# --- jobs --------------------------------------------------------------------------------
def _jobs(args) -> list[dict]:
    jobs = []
    if "a" in args.parts:
        for prob in A_PROBLEMS:
            for m in args.a_workers:
                for n in args.a_horizons:
                    jobs.append(
                        dict(
                            key=f"a/{prob}/m{m}/n{n}",
                            part="a",
                            problem=prob,
                            m=m,
                            n=n,
                            runs=args.a_runs,
                            dim=A_DIM,
                        )
                    )
    if "b" in args.parts:
        for prob in B_PROBLEMS:
            for regime in B_REGIMES:
                for est in ("l1", "l2"):
                    jobs.append(
                        dict(
                            key=f"b/{prob}/{regime}/{est}",
                            part="b",
                            problem=prob,
                            regime=regime,
                            estimator=est,
                            n=args.b_rounds,
                            m=B_WORKERS,
                            runs=args.b_runs,
                        )
                    )
    if "c" in args.parts:
        for dtype in ("float32", "float64"):
            for d in args.c_dims:
                for batch in args.c_batches:
                    if batch * d > C_MAX_ELEMENTS:
                        continue
                    for impl in ("torch", "numpy-loop"):
                        jobs.append(
                            dict(
                                key=f"c/{dtype}/{impl}/B{batch}/d{d}",
                                part="c",
                                impl=impl,
                                dtype=dtype,
                                batch=batch,
                                d=d,
                                threads=2,
                            )
                        )
        key_b, key_d = args.c_key
        for rep in range(args.c_reps):
            for allocator in ("default", "no-trim"):
                for threads in (2, 1):
                    if allocator == "no-trim" and threads == 1:
                        continue
                    for dtype in ("float32", "float64"):
                        jobs.append(
                            dict(
                                key=f"ckey/{dtype}/{allocator}/t{threads}/rep{rep}",
                                part="ckey",
                                dtype=dtype,
                                batch=key_b,
                                d=key_d,
                                threads=threads,
                                allocator=allocator,
                                rep=rep,
                            )
                        )
    if "gpu" in args.parts:
        if not torch.cuda.is_available():
            print("part gpu: no CUDA device here, nothing to time", flush=True)
        else:
            for dtype in ("float32", "float64"):
                for d in args.g_dims:
                    for batch in args.g_batches:
                        if batch * d <= C_MAX_ELEMENTS:
                            jobs.append(
                                dict(
                                    key=f"gpu/{dtype}/B{batch}/d{d}",
                                    part="gpu",
                                    dtype=dtype,
                                    batch=batch,
                                    d=d,
                                )
                            )
    if "protocol" in args.parts:
        for msg in MESSAGES:
            jobs.append(
                dict(
                    key=f"protocol/{msg}/n{args.p_rounds}",
                    part="protocol",
                    message=msg,
                    rounds=args.p_rounds,
                    dim=P_DIM,
                    clients=P_CLIENTS,
                )
            )
    return jobs


RUNNERS = {
    "a": _run_a,
    "b": _run_b,
    "c": _run_c,
    "ckey": _run_ckey,
    "gpu": _run_gpu,
    "protocol": _run_protocol,
}


def _run_isolated(job: dict) -> dict:
    r"""Run a timing job in a fresh process: the allocator's state left by an earlier job
    (a heap grown by a 10^8-element batch, trimmed or not) moved a cell's time by 2x when
    the grid ran in one process. ``allocator="no-trim"`` starts that process with
    ``NO_TRIM_ENV`` (glibc reads it when the process starts)."""
    env = NO_TRIM_ENV if job.get("allocator") == "no-trim" else {}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        with multiprocessing.get_context("spawn").Pool(1) as pool:
            return pool.apply(RUNNERS[job["part"]], (job,))
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


# --- report ------------------------------------------------------------------------------
def _fmt_ci(m, lo, hi, p=3) -> str:
    return f"{m:.{p}g} [{lo:.{p}g}, {hi:.{p}g}]"


def _part_a(runs, lines, summary, rng):
    lines += [
        "## (a) Error of the averaged iterate against n and m (Cor. 3.2)",
        "",
        f"d = {A_DIM}, Theta = [-1, 1]^d (D = 2 sqrt(d)); l1 estimator; per (problem, m, n): "
        "R independent runs in one `simulate_fedzero` call with Cor. 3.2's "
        "eta = (1/L) sqrt(m/(n d)) and h = (1/L) sqrt((d+1)/n) *for that horizon n*. Error = "
        "f(x_bar_n) - f* (population f; x_bar_n = mean of x_1..x_n). Cells: mean over runs "
        "[95% bootstrap CI]; 'ratio' = mean error / (D L sqrt(d/(n m))), the corollary's bound "
        "without constants and logarithms. Slopes: least squares of log(mean error) on log n "
        "(or log m), 95% CI by bootstrap (runs resampled within each cell, 2000 times).",
        "",
    ]
    out = {}
    summary["a"] = {}
    for prob in A_PROBLEMS:
        recs = [r for r in runs.values() if r["part"] == "a" and r.get("problem") == prob]
        if recs:
            out[prob] = _part_a_one(prob, recs, lines, summary, rng)
    if not out:
        lines += ["Not run.", ""]
    return out


def _slope_table(lines, cell, outer, inner, var, fixed, rng) -> dict:
    r"""Fitted log-log slope of the mean error on ``var`` for each ``fixed`` value,
    appended to ``lines`` as a table; ``cell`` is keyed by ``(m, n)``."""
    lines += [
        f"Fitted slope of log(mean error) on log {var}, per {fixed} (theory: -1/2):",
        "",
        f"| {fixed} | slope in {var} [95% CI] | CI contains -1/2 | within 0.1 of -1/2 |",
        "|---|---|---|---|",
    ]
    slopes = {}
    for o in outer:
        keys = {i: (o, i) if fixed == "m" else (i, o) for i in inner}
        have = [i for i in inner if keys[i] in cell]
        if len(have) < 2:
            continue
        s, (lo, hi) = _slope_with_ci(have, [np.array(cell[keys[i]]["errors"]) for i in have], rng)
        slopes[o] = (s, lo, hi)
        lines.append(
            f"| {o} | {_fmt_ci(s, lo, hi)} | {'yes' if lo <= -0.5 <= hi else 'no'} | "
            f"{'yes' if abs(s + 0.5) <= 0.1 else 'no'} |"
        )
    lines.append("")
    return slopes


def _part_a_one(prob, recs, lines, summary, rng):
    ms = sorted({r["m"] for r in recs})
    ns = sorted({r["n"] for r in recs})
    cell = {(r["m"], r["n"]): r for r in recs}
    r0 = recs[0]
    d, L, D = r0["dim"], r0["L"], r0["diameter"]
    lines += [
        f"### {prob}: {A_TITLES[prob]}",
        "",
        f"L = {L:.3g}, D = {D:.3g}, f(x_1) - f* = {r0['f0']:.3g}, R = {r0['runs']} runs per cell.",
        "",
        "| m \\ n | " + " | ".join(str(n) for n in ns) + " |",
        "|---" * (len(ns) + 1) + "|",
    ]
    table = {}
    for m in ms:
        row = []
        for n in ns:
            if (m, n) not in cell:
                row.append("-")
                continue
            e = np.array(cell[(m, n)]["errors"])
            mean, lo, hi = _mean_ci(e, rng)
            ratio = mean / (D * L * math.sqrt(d / (n * m)))
            table[(m, n)] = (mean, lo, hi, ratio)
            row.append(f"{_fmt_ci(mean, lo, hi)} (ratio {ratio:.2g})")
        lines.append(f"| {m} | " + " | ".join(row) + " |")
    lines.append("")
    # slopes in n per m, and in m per n
    slopes_n = _slope_table(lines, cell, ms, ns, "n", "m", rng)
    slopes_m = _slope_table(lines, cell, ns, ms, "m", "n", rng)
    t_a = sum(r["time_s"] for r in recs)
    lines += [f"Compute: {t_a:.0f} s ({len(recs)} simulate calls).", ""]
    summary["a"][prob] = {
        "cells": {
            f"m{m}/n{n}": dict(zip(("mean", "lo", "hi", "ratio"), v, strict=True))
            for (m, n), v in table.items()
        },
        "slope_n": {
            str(m): dict(zip(("slope", "lo", "hi"), v, strict=True)) for m, v in slopes_n.items()
        },
        "slope_m": {
            str(n): dict(zip(("slope", "lo", "hi"), v, strict=True)) for n, v in slopes_m.items()
        },
        "time_s": t_a,
    }
    return cell, table, ms, ns


def _part_b(runs, lines, summary, rng):
    recs = [r for r in runs.values() if r["part"] == "b"]
    if not recs:
        lines += ["## (b) l1 against l2", "", "Not run.", ""]
        return None
    cell = {(r["problem"], r["regime"], r["estimator"]): r for r in recs}
    r0 = recs[0]
    lines += [
        "## (b) l1-sphere against l2-sphere randomisation (same budget, same steps)",
        "",
        f"d = {B_DIM}, m = {r0['m']} workers, n = {r0['n']} rounds, {r0['runs']} runs per cell; "
        "eta and h from Cor. 3.2 with each problem's L for both estimators ('theory'), and the "
        "same eta with h / 100 ('h/100': the smoothing bias nearly gone, only the estimators' "
        "variance differs). LAD problems: N = 1000 rows a_i ~ N(0, I/d), b = A x*, f* = 0, "
        "contexts = rows. Error = f(x_bar_n) - f*, mean [95% bootstrap CI]; 'l1/l2' = ratio "
        "of the mean errors [bootstrap CI]; winner = the lower mean when the ratio's CI "
        "excludes 1, else 'tie'.",
        "",
        "| problem (Theta, x*) | geometry favours | regime | l1 error | l2 error | l1/l2 "
        "| winner |",
        "|---|---|---|---|---|---|---|",
    ]
    out = {}
    for prob in B_PROBLEMS:
        for regime in B_REGIMES:
            if (prob, regime, "l1") not in cell or (prob, regime, "l2") not in cell:
                continue
            e1 = np.array(cell[(prob, regime, "l1")]["errors"])
            e2 = np.array(cell[(prob, regime, "l2")]["errors"])
            m1, m2 = _mean_ci(e1, rng), _mean_ci(e2, rng)
            B = 2000
            r1 = rng.choice(e1, size=(B, len(e1))).mean(1)
            r2 = rng.choice(e2, size=(B, len(e2))).mean(1)
            ratio = m1[0] / m2[0]
            rlo, rhi = _bootstrap_ci(r1 / r2)
            win = "tie" if rlo <= 1 <= rhi else ("l1" if ratio < 1 else "l2")
            note = cell[(prob, regime, "l1")]["domain"]
            lines.append(
                f"| {prob} ({note}) | {B_FAVOURS[prob]} | {regime} | {_fmt_ci(*m1)} | "
                f"{_fmt_ci(*m2)} | {_fmt_ci(ratio, rlo, rhi)} | **{win}** |"
            )
            out[f"{prob}/{regime}"] = {
                "l1": m1,
                "l2": m2,
                "ratio": (ratio, rlo, rhi),
                "winner": win,
                "favours": B_FAVOURS[prob],
                "h": cell[(prob, regime, "l1")]["h"],
                "eta": cell[(prob, regime, "l1")]["eta"],
                "f0": cell[(prob, regime, "l1")]["f0"],
            }
    lines.append("")
    lines += [
        "Starting errors f(x_1) - f* and steps: "
        + "; ".join(
            f"{p}: f0 {cell[(p, 'theory', 'l1')]['f0']:.3g}, "
            f"eta {cell[(p, 'theory', 'l1')]['eta']:.3g}, "
            f"h {cell[(p, 'theory', 'l1')]['h']:.3g}"
            for p in B_PROBLEMS
            if (p, "theory", "l1") in cell
        )
        + ".",
        "",
    ]
    summary["b"] = out
    return out


def _part_c(runs, lines, summary):
    recs = [r for r in runs.values() if r["part"] == "c"]
    keyrecs = [r for r in runs.values() if r["part"] == "ckey"]
    lines += ["## (c) Throughput of the batched estimator and the protocol", ""]
    if recs:
        lines += [
            "Worker-queries per second (one query = one worker's two-point estimate: a direction, "
            "two evaluations of f, the d-vector g) of `l1_gradient` on a `batch x d` tensor "
            "(all rows at the same x_t, f(X) = X @ c, a seeded generator, "
            "`torch.set_num_threads(2)`) and of the per-worker NumPy loop (`rng.laplace`, "
            "normalise, f at two single points, the estimate; timed on min(batch, 2000, "
            "max(20, 2e6/d)) workers: its cost is linear in the workers). Grid: batch in "
            "{1e2..1e6} x d in {10..1e4} with batch * d <= 1e8 (the estimator holds 3 "
            "`batch x d` buffers besides f's own: <= 1.2 GB in float32, <= 2.4 GB in float64). "
            "Median of repeated calls after a warm-up; every cell in a fresh process (the heap "
            "left by an earlier 1e8-element batch moved a cell's time by up to 2x).",
            "",
        ]
        for dtype in ("float32", "float64"):
            sub = [r for r in recs if r["dtype"] == dtype]
            if not sub:
                continue
            ds = sorted({r["d"] for r in sub})
            bs = sorted({r["batch"] for r in sub})
            cell = {(r["impl"], r["batch"], r["d"]): r for r in sub}
            lines += [
                f"{dtype}: queries/s torch batched / NumPy loop (speed-up)",
                "",
                "| batch \\ d | " + " | ".join(str(d) for d in ds) + " |",
                "|---" * (len(ds) + 1) + "|",
            ]
            for b in bs:
                row = []
                for d in ds:
                    t, nl = cell.get(("torch", b, d)), cell.get(("numpy-loop", b, d))
                    if t is None or nl is None:
                        row.append("-")
                        continue
                    row.append(
                        f"{t['queries_per_s']:.3g} / {nl['queries_per_s']:.3g} "
                        f"({t['queries_per_s'] / nl['queries_per_s']:.2g}x)"
                    )
                lines.append(f"| {b} | " + " | ".join(row) + " |")
            lines.append("")
        loads = [x for r in recs for x in (r["load_before"][0], r["load_after"][0])]
        lines += [
            f"1-minute load average during the grid: {min(loads):.2f} to {max(loads):.2f} "
            "(2 cores).",
            "",
        ]
    summary_c = {}
    if keyrecs:
        kb, kd = keyrecs[0]["batch"], keyrecs[0]["d"]
        lines += [
            f"**Key cell m = {kb}, d = {kd}.** Every repetition is a fresh process that "
            f"alternates {C_PAIRS} times between the batched estimator (mean of 5 calls, the "
            f"first included) and one call of the NumPy loop over the same {kb} workers; its "
            "speed-up is the median of its paired ratios, so slow drifts of the machine weigh "
            "on both sides. The loop is single-threaded: with 2 torch threads a process that "
            "takes a core slows only the batched side (a review measured 0.5x-3x under load "
            "1.5), so these runs need a quiet machine (load below). One torch thread is the "
            "comparison per core. Page faults: minor faults per batched call (`getrusage`). "
            "'no-trim' runs the process with `MALLOC_TRIM_THRESHOLD_=2^40 "
            "MALLOC_MMAP_THRESHOLD_=2^25` (glibc then keeps freed buffers in the heap "
            "instead of returning them to the kernel).",
            "",
            "| dtype | allocator | torch threads | processes | speed-up: median [min, max] "
            "| processes >= 10x | torch ms/call (median) | NumPy loop ms/call (median) "
            "| page faults / call (median) | >= 10x |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for dtype in ("float32", "float64"):
            for allocator, threads in (("default", 2), ("default", 1), ("no-trim", 2)):
                sub = [
                    r
                    for r in keyrecs
                    if r["dtype"] == dtype
                    and r.get("allocator", "default") == allocator
                    and r["threads"] == threads
                    and "ratios" in r
                ]
                if not sub:
                    continue
                sp = np.array([r["speedup"] for r in sub])
                med = float(np.median(sp))
                summary_c[f"{dtype}/{allocator}/t{threads}"] = {
                    "speedups": sp.tolist(),
                    "speedup": med,
                    "torch_s": [float(np.median(r["torch_s"])) for r in sub],
                    "numpy_s": [float(np.median(r["numpy_s"])) for r in sub],
                    "faults_per_call": [r["faults_per_call"] for r in sub],
                }
                v = summary_c[f"{dtype}/{allocator}/t{threads}"]
                lines.append(
                    f"| {dtype} | {allocator} | {threads} | {len(sub)} | {med:.1f}x "
                    f"[{sp.min():.1f}, {sp.max():.1f}] | {int((sp >= 10).sum())} of {len(sub)} "
                    f"| {np.median(v['torch_s']) * 1e3:.2f} | {np.median(v['numpy_s']) * 1e3:.1f} "
                    f"| {np.median(v['faults_per_call']):.0f} | {'yes' if med >= 10 else 'no'} |"
                )
        loads = [x for r in keyrecs for x in (r["load_before"][0], r["load_after"][0])]
        lines += [
            "",
            f"1-minute load average around the key measurements: {min(loads):.2f} "
            f"to {max(loads):.2f}.",
            "",
        ]
    prot = [r for r in runs.values() if r["part"] == "protocol"]
    if prot:
        p0 = prot[0]
        lines += [
            f"**Protocol**: `{p0['command'].replace(' --message ' + p0['message'], '')} "
            "--message {vector,seed,sign}` (CLI default `--threads 1`; `--out` to a "
            "temporary file). Bytes from the run's ledger; per message = per client per "
            "round.",
            "",
            "| message | wall s (CLI, incl. start-up) | run time_s | bytes up / message | "
            "bytes down / message | total up | f(x_bar) - f* | load before |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for msg in MESSAGES:
            r = next((x for x in prot if x["message"] == msg), None)
            if r is None:
                continue
            val = r["recommendation_value"]
            opt = r["optimal_value"] or 0.0
            lines.append(
                f"| {msg} | {r['wall_s']:.1f} | {r['run_time_s']:.1f} | "
                f"{r['bytes_up_per_message']:.0f} | {r['bytes_down_per_message']:.0f} | "
                f"{r['bytes_up_total']} | "
                f"{'-' if val is None else f'{val - opt:.4g}'} | {r['load_before'][0]} |"
            )
        lines.append("")
        summary_c["protocol"] = {
            r["message"]: {
                k: r[k]
                for k in (
                    "wall_s",
                    "run_time_s",
                    "bytes_up_per_message",
                    "bytes_down_per_message",
                    "recommendation_value",
                )
            }
            for r in prot
        }
    summary["c"] = summary_c


def _part_gpu(runs, lines, summary) -> None:
    recs = [r for r in runs.values() if r["part"] == "gpu"]
    if not recs:
        lines += [
            "## (c, GPU) Throughput on a GPU",
            "",
            "No GPU was available to the runs stored here: nothing was timed on a GPU.",
            "",
        ]
        return
    r0 = recs[0]
    lines += [
        "## (c, GPU) Throughput on a GPU",
        "",
        f"On {r0['device']} ({r0['versions']}; {r0['date']}; `python benchmarks/fedzero.py "
        "--parts gpu` on that machine). `l1_gradient` as in (c), with a CUDA generator (the "
        "directions come from `torch.rand`'s Philox stream on the device); CUDA events, "
        "median of 20-50 calls after a warm-up. 'copy' = `dst.copy_(src)` of one "
        "`batch x d` tensor in the same process (bytes read + written / time). 'min. "
        "traffic' = 5 `batch x d` tensors / time: the least any two-point estimator moves "
        "(x + h z and x - h z written and read once by f, g written), so its fraction of the "
        "copy's bandwidth says how close a call is to the memory bound; 'copies' = call "
        "time / copy time. Kernels: CUDA kernels one call launches, and in brackets its "
        "memory copies and memsets (torch profiler).",
        "",
        "| dtype | batch | d | queries/s | ms/call | copy GB/s | min. traffic GB/s | "
        "fraction of copy | copies | kernels |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    out = {}
    for r in sorted(recs, key=lambda r: (r["dtype"], r["d"], r["batch"])):
        frac = r["min_traffic_GBps"] / r["copy_GBps"]
        lines.append(
            f"| {r['dtype']} | {r['batch']} | {r['d']} | {r['queries_per_s']:.3g} | "
            f"{r['sec_per_call'] * 1e3:.3g} | {r['copy_GBps']:.0f} | "
            f"{r['min_traffic_GBps']:.0f} | {frac:.2f} | "
            f"{r['sec_per_call'] / r['copy_sec']:.1f} | {r['kernels_per_call']} "
            f"({r.get('copies_per_call', '?')}) |"
        )
        out[f"{r['dtype']}/B{r['batch']}/d{r['d']}"] = {
            "queries_per_s": r["queries_per_s"],
            "fraction_of_copy": frac,
            "copies": r["sec_per_call"] / r["copy_sec"],
        }
    lines.append("")
    summary["gpu"] = out


def _plots(runs, out: Path, a_data, b_data) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if a_data:
        fig, axs = plt.subplots(len(a_data), 2, figsize=(11, 4.2 * len(a_data)), squeeze=False)
        for row, (prob, (cell, table, ms, ns)) in zip(axs, a_data.items(), strict=True):
            ax = row[0]
            for m in ms:
                pts = [(n, *table[(m, n)][:3]) for n in ns if (m, n) in table]
                if not pts:
                    continue
                x, y, lo, hi = map(np.array, zip(*pts, strict=True))
                ax.errorbar(x, y, yerr=[y - lo, hi - y], marker="o", capsize=3, label=f"m = {m}")
                # running average of the longest horizon's runs (eta/h tuned for that horizon)
                nmax = max(n for n in ns if (m, n) in cell)
                c = cell[(m, nmax)]
                ax.plot(
                    c["curve_rounds"],
                    c["curve_mean_error"],
                    lw=0.6,
                    alpha=0.5,
                    color=ax.lines[-1].get_color(),
                )
            y0 = table[(ms[-1], ns[0])][0]
            ax.plot(ns, [y0 * (n / ns[0]) ** -0.5 for n in ns], "k--", lw=1, label="slope -1/2")
            ax.set(
                xscale="log",
                yscale="log",
                xlabel="horizon n (rounds)",
                ylabel="f(x_bar_n) - f*",
                title=f"(a) {prob}: error vs n (markers: "
                "horizon-tuned;\nthin: running average of the longest run)",
            )
            ax.legend(fontsize=7)
            ax = row[1]
            for n in ns:
                pts = [(m, *table[(m, n)][:3]) for m in ms if (m, n) in table]
                x, y, lo, hi = map(np.array, zip(*pts, strict=True))
                ax.errorbar(x, y, yerr=[y - lo, hi - y], marker="s", capsize=3, label=f"n = {n}")
            y0 = table[(ms[0], ns[-1])][0]
            ax.plot(ms, [y0 * (m / ms[0]) ** -0.5 for m in ms], "k--", lw=1, label="slope -1/2")
            ax.set(
                xscale="log",
                yscale="log",
                xlabel="workers m",
                ylabel="f(x_bar_n) - f*",
                title=f"(a) {prob}: error vs m",
            )
            ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(out / f"{STEM}_a.png", dpi=100)
        plt.close(fig)
    if b_data:
        fig, axes = plt.subplots(1, len(B_REGIMES), figsize=(12, 4.2), sharey=True)
        for ax, regime in zip(np.atleast_1d(axes), B_REGIMES, strict=False):
            probs = [p for p in B_PROBLEMS if f"{p}/{regime}" in b_data]
            x = np.arange(len(probs))
            for k, est in enumerate(("l1", "l2")):
                vals = [b_data[f"{p}/{regime}"][est] for p in probs]
                y = np.array([v[0] for v in vals])
                lo = np.array([v[1] for v in vals])
                hi = np.array([v[2] for v in vals])
                ax.bar(
                    x + (k - 0.5) * 0.38,
                    y,
                    0.38,
                    yerr=[y - lo, hi - y],
                    capsize=3,
                    label=f"{est} sphere",
                )
            ax.set_xticks(x, [p.replace(", ", "\n") for p in probs], fontsize=7)
            ax.set(yscale="log", title=f"(b) regime: {regime}", ylabel="f(x_bar_n) - f*")
            ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(out / f"{STEM}_b.png", dpi=100)
        plt.close(fig)
    recs = [r for r in runs.values() if r["part"] == "c"]
    if recs:
        fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
        for ax, dtype in zip(axes, ("float32", "float64"), strict=True):
            for d in sorted({r["d"] for r in recs}):
                for impl, style in (("torch", "-o"), ("numpy-loop", ":x")):
                    pts = sorted(
                        (r["batch"], r["queries_per_s"])
                        for r in recs
                        if r["dtype"] == dtype and r["d"] == d and r["impl"] == impl
                    )
                    if pts:
                        x, y = zip(*pts, strict=True)
                        ax.plot(x, y, style, label=f"{impl}, d = {d}")
            ax.set(
                xscale="log",
                yscale="log",
                xlabel="batch (worker-queries per call)",
                ylabel="worker-queries / s",
                title=f"(c) l1_gradient throughput, {dtype}",
            )
            ax.legend(fontsize=6, ncol=2)
        fig.tight_layout()
        fig.savefig(out / f"{STEM}_c.png", dpi=100)
        plt.close(fig)


def _verdicts(summary) -> list[str]:
    lines = ["## Claims", "", "| claim | result | holds? |", "|---|---|---|"]
    for prob, a in summary.get("a", {}).items():
        if a["slope_n"]:
            sl = a["slope_n"]
            ok = all(abs(v["slope"] + 0.5) <= 0.1 for v in sl.values())
            txt = ", ".join(
                f"m={m}: {v['slope']:.2f} [{v['lo']:.2f}, {v['hi']:.2f}]" for m, v in sl.items()
            )
            lines.append(
                f"| {prob}: error ~ n^(-1/2) at fixed m (Cor. 3.2) | slopes {txt} | "
                f"{'yes (all within 0.1 of -1/2)' if ok else 'not for every m'} |"
            )
        if a["slope_m"]:
            n_last = max(a["slope_m"], key=int)
            v = a["slope_m"][n_last]
            ok = abs(v["slope"] + 0.5) <= 0.1
            lines.append(
                f"| {prob}: error ~ m^(-1/2) at fixed n (Cor. 3.2) | slope at n = "
                f"{n_last}: {v['slope']:.2f} [{v['lo']:.2f}, {v['hi']:.2f}] | "
                f"{'yes (within 0.1 of -1/2)' if ok else 'no'} |"
            )
    b = summary.get("b")
    if b:
        th = {k.split("/")[0]: v["winner"] for k, v in b.items() if k.endswith("/theory")}
        sm = {k.split("/")[0]: v["winner"] for k, v in b.items() if k.endswith("/h/100")}
        lines.append(
            "| l1 randomisation helps where the geometry is l1 (sparse x*, l1 ball / "
            "simplex), not elsewhere | winners with Cor. 3.2 steps: "
            + "; ".join(f"{p}: {w}" for p, w in th.items())
            + " -- with h/100: "
            + "; ".join(f"{p}: {w}" for p, w in sm.items())
            + " | see (b) |"
        )
    c = summary.get("c", {})
    for dtype in ("float32", "float64"):
        for threads in (2, 1):
            v = c.get(f"{dtype}/default/t{threads}")
            if v:
                sp = v["speedups"]
                lines.append(
                    f"| batched CPU >= 10x the NumPy loop at m = 1000, d = 1000 ({dtype}, "
                    f"{threads} torch thread{'s' if threads > 1 else ''} against the "
                    f"single-threaded loop, default allocator) | {v['speedup']:.1f}x (median "
                    f"of {len(sp)} processes, {min(sp):.1f}x to {max(sp):.1f}x) | "
                    f"{'yes' if v['speedup'] >= 10 else 'no'} |"
                )
    g = summary.get("gpu", {})
    big = [v["fraction_of_copy"] for k, v in g.items() if k.endswith(("d1000", "d10000"))]
    if big:
        lines.append(
            "| GPU: the estimator's useful traffic (5 batch x d tensors per call) as a "
            "fraction of a device-to-device copy's bandwidth, d >= 1000 | "
            f"{min(big):.2f} to {max(big):.2f} | see (c, GPU) |"
        )
    lines.append("")
    return lines


def report(runs: dict[str, dict], out: Path, meta: dict) -> str:
    rng = np.random.default_rng(12345)
    summary: dict = {"meta": meta}
    lines = [
        "# FedZero benchmark ([FedZero] Alg. 1, Cor. 3.2, paper 004)",
        "",
        f"Generated {meta['date']} by `{meta['command']}` on {meta['machine']}.",
        f"Versions: {meta['versions']}.",
        "",
        f"Commands that produced the records: `{STEM}_commands.txt`. Every record: "
        f"`{STEM}_runs.jsonl`. Summary: `{STEM}.json`. Plots: `{STEM}_a.png`, `{STEM}_b.png`, "
        f"`{STEM}_c.png`. "
        + (
            "The GPU part ran on another machine (see its section)."
            if any(r["part"] == "gpu" for r in runs.values())
            else "CPU only: no GPU was available to this benchmark, so nothing was timed on a GPU."
        ),
        "",
    ]
    body: list[str] = []
    a_data = _part_a(runs, body, summary, rng)
    b_data = _part_b(runs, body, summary, rng)
    _part_c(runs, body, summary)
    _part_gpu(runs, body, summary)
    lines += _verdicts(summary) + body
    concl = out / f"{STEM}_conclusions.md"
    if concl.exists():
        lines += [concl.read_text().strip(), ""]
    text = "\n".join(lines) + "\n"
    (out / f"{STEM}.md").write_text(text)
    (out / f"{STEM}.json").write_text(json.dumps(summary, indent=1, default=float) + "\n")
    _plots(runs, out, a_data, b_data)
    return text


def _meta(command: str) -> dict:
    import botorch
    import scipy

    return {
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "command": command,
        "machine": f"{cpu_model()}, {os.cpu_count()} cores, {platform.platform()}",
        "versions": f"torch {torch.__version__}, numpy {np.__version__}, botorch "
        f"{botorch.__version__}, scipy {scipy.__version__}, python {platform.python_version()}",
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, all parts, ~30 s")
    parser.add_argument("--parts", nargs="+", default=["a", "b", "c", "gpu", "protocol"])
    parser.add_argument("--report", action="store_true", help="only rebuild the report")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    argv_used = sys.argv[1:] if argv is None else list(argv)
    command = "python benchmarks/fedzero.py " + " ".join(argv_used)
    args.a_workers, args.a_horizons, args.a_runs = A_WORKERS, A_HORIZONS, A_RUNS
    args.b_rounds, args.b_runs = B_ROUNDS, B_RUNS
    args.c_batches, args.c_dims, args.c_key = C_BATCHES, C_DIMS, C_KEY
    args.c_reps, args.g_batches, args.g_dims = C_REPS, G_BATCHES, G_DIMS
    args.p_rounds = P_ROUNDS
    if args.smoke:
        if args.out.resolve() == RESULTS.resolve():
            raise SystemExit("--smoke writes to --out DIR (not over the committed results)")
        args.a_workers, args.a_horizons, args.a_runs = (1, 4), (50, 200), 4
        args.b_rounds, args.b_runs = 100, 4
        args.c_batches, args.c_dims, args.c_key = (100, 1000), (10, 100), (100, 100)
        args.c_reps, args.g_batches, args.g_dims = 2, (1000, 10_000), (100,)
        args.p_rounds = 100  # Cor. 3.2's h must stay below the box's half side
    torch.set_num_threads(2)
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    store = out / f"{STEM}_runs.jsonl"
    runs = load_runs(store)
    if not args.report:
        jobs = [j for j in _jobs(args) if j["key"] not in runs]
        print(f"{len(jobs)} jobs to do ({len(runs)} stored); load {_load()}", flush=True)
        with (out / f"{STEM}_commands.txt").open("a") as fh:
            fh.write(
                f"{command.strip()}  # started {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, "
                f"load {_load()}\n"
            )
        t0 = time.perf_counter()
        with store.open("a") as fh:
            for job in jobs:
                t = time.perf_counter()
                timing = job["part"] in ("c", "ckey", "gpu")
                rec = _run_isolated(job) if timing else RUNNERS[job["part"]](job)
                fh.write(json.dumps(rec) + "\n")
                fh.flush()
                runs[rec["key"]] = rec
                print(f"{rec['key']}: {time.perf_counter() - t:.1f} s", flush=True)
        with (out / f"{STEM}_commands.txt").open("a") as fh:
            fh.write(f"# {time.perf_counter() - t0:.0f} s for {len(jobs)} jobs, load {_load()}\n")
    text = report(runs, out, _meta(command.strip()))
    if args.smoke:
        print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
