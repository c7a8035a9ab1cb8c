"""Timing and the machine's limits: samples, interleaved rounds, copy bandwidth and matmul peaks, rooflines.

The tuner (:mod:`ivhl_jax.run.tune`) and the benchmarks (``ivhl_jax.bench.harness``, which re-exports the timing
helpers) measure with these, so a tuning entry and a results file count time the same way:

* :func:`summarize` — median, IQR, min and raw samples; :func:`time_in_windows` — samples of back-to-back calls
  lasting a minimum window; :func:`interleaved_rounds` — every contestant once per round, in turn.
* :func:`measure_limits` — this machine's copy bandwidth and matmul throughput per dtype, measured on the spot.
* :func:`roofline` / :func:`roofline_of` / :func:`cost_record` — a compiled program's flops and bytes
  (``cost_analysis()``) as a fraction of those limits: ``fraction`` = max(bytes / bandwidth, flops / peak) / time.
  The bandwidth is a copy through main memory; a kernel whose working set fits the caches can exceed it, and
  ``cost_analysis`` counts every operand's bytes even where a fusion keeps them in registers or cache, so a
  fraction above 1 means "faster than streaming its bytes from memory" (the record says so in ``note``).
"""

from __future__ import annotations

import functools
import math
import os
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import numpy as np

from ivhl_jax.core import backend
from ivhl_jax.core.validation import check_scalar

__all__ = [
    "ABOVE_ONE",
    "summarize",
    "calls_per_sample",
    "time_in_windows",
    "interleaved_rounds",
    "measure_limits",
    "compiled_cost",
    "roofline",
    "roofline_of",
    "cost_record",
]

#: What a roofline fraction above 1 means (recorded in the roofline's ``note`` and printed under ``ivhl tune``'s
#: table).
ABOVE_ONE = (
    "above 100 %: the kernel ran faster than streaming XLA's byte count through main memory at the measured copy "
    "bandwidth; its working set fits the caches, and XLA counts every operand's bytes even where a fusion keeps "
    "them in cache or registers"
)


def summarize(samples: Sequence[float]) -> dict[str, Any]:
    """Median, IQR, min and the raw samples (seconds)."""
    arr = np.asarray(samples, dtype=float)
    q1, med, q3 = np.percentile(arr, [25, 50, 75])
    return {
        "median_s": float(med),
        "iqr_s": float(q3 - q1),
        "min_s": float(arr.min()),
        "n": int(arr.size),
        "samples_s": [float(x) for x in arr],
    }


def calls_per_sample(one_call_s: float, window_s: float) -> int:
    """How many back-to-back calls make one timed sample of at least ``window_s`` seconds (1 if no window).

    Under load, a sample much shorter than the scheduler's time slice (a few ms) measures whether the process
    happened to be descheduled during it, not its share of the cores; a window of ~0.3 s averages many slices.
    """
    return max(1, math.ceil(window_s / max(one_call_s, 1e-9))) if window_s > 0 else 1


def time_in_windows(call: Callable[[], Any], *, repeats: int, window_s: float) -> tuple[list[float], int]:
    """Seconds per call of ``repeats`` samples, each ``k`` back-to-back calls lasting at least ``window_s`` seconds.

    ``call()`` may return arrays still being computed (JAX's async dispatch): a sample waits only for the result
    of its last call. ``k`` comes from one extra timed call (:func:`calls_per_sample`). Returns (samples, k).
    """
    check_scalar(repeats, "repeats", integer=True, minimum=1)
    t = time.perf_counter()
    jax.block_until_ready(call())
    k = calls_per_sample(time.perf_counter() - t, window_s)
    samples = []
    for _ in range(repeats):
        t = time.perf_counter()
        for _ in range(k):
            out = call()
        jax.block_until_ready(out)
        samples.append((time.perf_counter() - t) / k)
    return samples, k


def interleaved_rounds(
    calls: dict[str, Callable[[], Any]], rounds: int, *, pause_s: float = 0.005, cpu: bool = False
) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Time every call once per round, in turn, for ``rounds`` rounds (each call must block until done).

    Interleaving makes load changes on a shared host hit all contestants alike, so per-round ratios stay
    meaningful; the short pause before each call (when there is more than one) lets the previous call's worker
    threads go idle. Returns ``(wall, cpu)``: seconds per call and name, ``time.perf_counter`` and, with
    ``cpu=True``, ``time.process_time`` (all threads of this process; else empty lists).
    """
    check_scalar(rounds, "rounds", integer=True, minimum=1)
    check_scalar(pause_s, "pause_s", minimum=0.0)
    wall: dict[str, list[float]] = {k: [] for k in calls}
    used: dict[str, list[float]] = {k: [] for k in calls}
    for _ in range(rounds):
        for name, call in calls.items():
            if len(calls) > 1:
                time.sleep(pause_s)
            t0, c0 = time.perf_counter(), time.process_time() if cpu else 0.0
            call()
            wall[name].append(time.perf_counter() - t0)
            if cpu:
                used[name].append(time.process_time() - c0)
    return wall, used


def measure_limits(quick: bool = True) -> dict[str, Any]:
    """This machine's limits, measured now: copy bandwidth (GB/s read + write, a jitted ``x * c`` over a
    buffer far larger than the caches) and matmul throughput (TFLOP/s) in f32 and bf16, each from the fastest of
    several samples of at least 0.2 s."""
    import jax
    import jax.numpy as jnp

    tiny = os.environ.get("IVHL_TUNE_TINY", "") == "1"
    on_cpu = backend.platform() == "cpu"
    nbytes = (1 << 22) if tiny else ((1 << 27) if on_cpu else (1 << 31))
    x = jnp.ones((nbytes // 4,), jnp.float32)
    copy = jax.jit(lambda x: x * 1.0000001)
    samples, _ = time_in_windows(lambda: copy(x), repeats=3 if tiny else 7, window_s=0.0 if tiny else 0.2)
    t = summarize(samples)
    # the limit is what the machine can do: the fastest sample (on a shared host the median measures the load)
    out: dict[str, Any] = {
        "copy_gbps": 2 * nbytes / t["min_s"] / 1e9,
        "copy": {"bytes": nbytes, "min_s": t["min_s"], "median_s": t["median_s"], "iqr_s": t["iqr_s"]},
    }
    n = 256 if tiny else ((1024 if quick else 2048) if on_cpu else 8192)
    ka, kb = jax.random.split(jax.random.key(0))
    for name, dt in (("f32", jnp.float32), ("bf16", jnp.bfloat16)):
        a, b = jax.random.normal(ka, (n, n), dt), jax.random.normal(kb, (n, n), dt)
        mm = jax.jit(jnp.matmul)
        samples, _ = time_in_windows(
            functools.partial(mm, a, b), repeats=3 if tiny else 5, window_s=0.0 if tiny else 0.2
        )
        t = summarize(samples)
        out[f"matmul_{name}_tflops"] = 2 * n**3 / t["min_s"] / 1e12
        out[f"matmul_{name}"] = {"n": n, "min_s": t["min_s"], "median_s": t["median_s"], "iqr_s": t["iqr_s"]}
    return out


def compiled_cost(compiled: Any) -> tuple[float, float]:
    """``(flops, bytes accessed)`` of a compiled program from XLA's ``cost_analysis()`` ((0, 0) where the backend
    gives none; work done in a host callback is not counted)."""
    try:
        cost = compiled.cost_analysis()
        cost = cost[0] if isinstance(cost, (list, tuple)) else cost
        return float(cost.get("flops", 0.0) or 0.0), float(cost.get("bytes accessed", 0.0) or 0.0)
    except Exception:  # noqa: BLE001 - cost analysis is backend-dependent: no roofline then
        return 0.0, 0.0


def roofline(compiled: Any, seconds: float, limits: Mapping[str, Any], *, dtype: str = "f32") -> dict[str, Any]:
    """The compiled program as a fraction of this machine's limits: XLA's own flop and byte counts
    (``cost_analysis()``), the time they need at the measured peak and bandwidth, and
    ``fraction`` = the larger of the two over ``seconds`` (1: at the roofline)."""
    flops, nbytes = compiled_cost(compiled)
    return roofline_of(flops, nbytes, seconds, limits, dtype=dtype)


def cost_record(compiled: Any, seconds: float, *, dtype: str = "f32") -> dict[str, Any]:
    """What a timed kernel records so its roofline can be computed later against limits measured elsewhere
    (``bench/gpu_checks.py``): ``{"flops", "bytes", "seconds", "dtype"}`` (see :func:`roofline_of`)."""
    flops, nbytes = compiled_cost(compiled)
    return {"flops": flops, "bytes": nbytes, "seconds": float(seconds), "dtype": dtype}


def roofline_of(
    flops: float, nbytes: float, seconds: float, limits: Mapping[str, Any], *, dtype: str = "f32"
) -> dict[str, Any]:
    """:func:`roofline` from the flop and byte counts: the time they need at the measured matmul peak of
    ``dtype`` and the copy bandwidth, over ``seconds``."""
    peak = float(limits.get(f"matmul_{dtype}_tflops") or limits.get("matmul_f32_tflops") or 0.0) * 1e12
    bw = float(limits.get("copy_gbps") or 0.0) * 1e9
    t_c = flops / peak if peak else 0.0
    t_m = nbytes / bw if bw else 0.0
    rec: dict[str, Any] = {
        "flops": flops,
        "bytes": nbytes,
        "seconds": seconds,
        "gflops_per_s": flops / seconds / 1e9 if seconds else None,
        "gbytes_per_s": nbytes / seconds / 1e9 if seconds else None,
        "fraction_of_bandwidth": t_m / seconds if seconds else None,
        "fraction_of_matmul_peak": t_c / seconds if seconds else None,
    }
    rec["bound"] = "memory" if t_m >= t_c else "compute"
    rec["fraction"] = max(t_c, t_m) / seconds if seconds else None
    if rec["fraction"] is not None and rec["fraction"] > 1.0:
        rec["note"] = ABOVE_ONE
    return rec
