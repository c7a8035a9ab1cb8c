"""Training profiler: per-step timing of data, forward, backward and optimiser as separately compiled
pieces, compile time apart from steady state, memory, throughput, hotspots, and ``baseline.json``.

Method. Each piece is ``jax.jit``-compiled ahead of time (``lower().compile()``, timed as compile
time) and every timed call ends in ``block_until_ready``:

* ``data``: gather of the batch at the step (:class:`ivhl_jax.train.data.Batcher`),
* ``forward``: the loss (forward pass only),
* ``forward+backward``: ``value_and_grad`` of the loss; ``backward_time_ms`` is its time minus the
  forward time of the same step (a derived number, clipped at 0),
* ``optimizer``: ``optimizer.update`` + ``apply_updates``.

``batch_latency_ms`` is data + forward+backward + optimizer (the forward-only call is extra, for the
split). Throughput = total samples / total time (not a mean of per-batch rates). The production path,
``fused_scan``, times whole jitted ``lax.scan`` chunks of fused train steps (data gather included),
which is what ``ivhl train adaptive`` runs. Device memory comes from ``compiled.memory_analysis()``
(temp + argument + output bytes; on CPU this is the XLA buffer plan), host memory is the process RSS.

The JSON document has the keys ``timestamp``, ``phase`` (a label), ``system_info`` (host, versions, device),
``profiling_runs`` (per run: ``configuration``, ``per_batch_metrics`` (12 fields per batch),
``aggregated_metrics``, ``final_state``, compile times and the fused-scan throughput), ``success_metrics`` (run 0's
batch latency, throughputs and peak memory, rounded) and ``hotspots`` (sorted by measured time). :func:`compare`
diffs two such files.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import platform
import resource
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from ivhl_jax.core import backend
from ivhl_jax.core.validation import check_key, check_scalar

__all__ = [
    "METRIC_FIELDS",
    "host_rss_mb",
    "profile_training",
    "fused_train_chunk",
    "profile_fused",
    "system_info",
    "baseline_document",
    "compare",
]

METRIC_FIELDS = (
    "batch_latency_ms",
    "forward_time_ms",
    "backward_time_ms",
    "optimizer_step_ms",
    "data_loading_time_ms",
    "samples_per_second",
    "batches_per_second",
    "peak_gpu_memory_mb",
    "peak_host_memory_mb",
    "current_gpu_memory_mb",
    "current_host_memory_mb",
    "avg_gpu_utilization",
)


def host_rss_mb() -> tuple[float, float]:
    """(current, peak) resident set size of this process in MB."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # KiB on Linux
    cur = peak
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    cur = float(line.split()[1]) / 1024.0
    except OSError:
        pass
    return cur, peak


def _memory_mb(compiled: Any) -> float | None:
    try:
        m = compiled.memory_analysis()
    except Exception:  # noqa: BLE001 - some backends do not implement it
        return None
    if m is None:
        return None
    total = sum(getattr(m, a, 0) or 0 for a in ("temp_size_in_bytes", "argument_size_in_bytes", "output_size_in_bytes"))
    return total / 2**20


def _compile(fn: Callable, *args) -> tuple[Any, float]:
    t0 = time.perf_counter()
    c = jax.jit(fn).lower(*args).compile()
    return c, time.perf_counter() - t0


def _timed(f: Callable, *args) -> tuple[Any, float]:
    t0 = time.perf_counter()
    out = jax.block_until_ready(f(*args))
    return out, (time.perf_counter() - t0) * 1e3


def profile_training(
    loss_fn: Callable,
    params: Any,
    optimizer: optax.GradientTransformation,
    get_batch: Callable[[jax.Array], Any],
    *,
    batch_size: int,
    num_batches: int = 20,
    warmup: int = 3,
    key: jax.Array,
    fused_chunk: int = 0,
    fused_repeats: int = 3,
    trace_dir: str | None = None,
    label: str = "",
) -> dict[str, Any]:
    """Profile ``num_batches`` training steps after ``warmup`` untimed ones.

    Args:
      loss_fn: ``loss_fn(params, batch, key) -> scalar``.
      get_batch: ``get_batch(step) -> batch`` (jit-compatible).
      key: the PRNG key the steps read (required; each timed step folds in its index).
      fused_chunk: if > 0, also time jitted ``lax.scan`` chunks of this many fused steps.
      trace_dir: if given, write a ``jax.profiler`` trace of the timed batches there.
    Returns: one ``profiling_runs`` entry (see module docstring).
    """
    check_scalar(batch_size, "batch_size", integer=True, minimum=1)
    check_scalar(num_batches, "num_batches", integer=True, minimum=1)
    check_scalar(warmup, "warmup", integer=True, nonnegative=True)
    check_scalar(fused_chunk, "fused_chunk", integer=True, nonnegative=True)
    check_scalar(fused_repeats, "fused_repeats", integer=True, minimum=1)
    key = check_key(key)
    parts = _compiled_parts(loss_fn, params, optimizer, get_batch, key)
    per_batch, params = _timed_batches(
        parts, params, key, warmup=warmup, num_batches=num_batches, batch_size=batch_size, trace_dir=trace_dir
    )
    agg, hotspots = _aggregate(per_batch, batch_size)
    run = {
        "label": label,
        "configuration": {
            "num_batches": num_batches,
            "warmup_batches": warmup,
            "batch_size": batch_size,
            "device": str(jax.devices()[0]),
            "model_parameters": int(sum(x.size for x in jax.tree_util.tree_leaves(params))),
        },
        "compile_time_s": parts.compile_s,
        "compiled_memory_mb": parts.memory_mb,
        "per_batch_metrics": per_batch,
        "aggregated_metrics": agg,
        "final_state": per_batch[-1],
        "hotspots": hotspots,
    }
    if fused_chunk:
        run["fused_scan"] = profile_fused(
            loss_fn,
            params,
            optimizer,
            get_batch,
            batch_size=batch_size,
            chunk=fused_chunk,
            repeats=fused_repeats,
            key=key,
        )
    return run


@dataclasses.dataclass
class _Parts:
    """The four compiled pieces of a training step, their compile times (s) and compiled memory (MB)."""

    data: Any
    forward: Any
    forward_backward: Any
    optimizer: Any
    opt_state: Any
    compile_s: dict[str, float]
    memory_mb: dict[str, float | None]


def _compiled_parts(
    loss_fn: Callable, params: Any, optimizer: optax.GradientTransformation, get_batch: Callable, key: jax.Array
) -> _Parts:
    """Data, forward, forward+backward and the optimizer update, each compiled on its own and timed."""
    opt_state = optimizer.init(params)
    step0 = jnp.zeros((), jnp.int32)

    def opt_step(p, s, g):
        u, s = optimizer.update(g, s, p)
        return optax.apply_updates(p, u), s

    data_c, t_data = _compile(get_batch, step0)
    batch = data_c(step0)
    fwd_c, t_fwd = _compile(loss_fn, params, batch, key)
    grad_c, t_grad = _compile(jax.value_and_grad(loss_fn), params, batch, key)
    _, g = grad_c(params, batch, key)
    opt_c, t_opt = _compile(opt_step, params, opt_state, g)
    compiled = {"data": data_c, "forward": fwd_c, "forward_backward": grad_c, "optimizer": opt_c}
    return _Parts(
        data_c,
        fwd_c,
        grad_c,
        opt_c,
        opt_state,
        compile_s={"data": t_data, "forward": t_fwd, "forward_backward": t_grad, "optimizer": t_opt},
        memory_mb={k: _memory_mb(c) for k, c in compiled.items()},
    )


def _timed_batches(
    parts: _Parts, params: Any, key: jax.Array, *, warmup: int, num_batches: int, batch_size: int, trace_dir: str | None
) -> tuple[list[dict[str, Any]], Any]:
    """``warmup`` untimed then ``num_batches`` timed training steps, piece by piece: one metrics entry per batch
    (and a ``jax.profiler`` trace in ``trace_dir`` if given), and the parameters they trained."""
    dev_mem = max((v for v in parts.memory_mb.values() if v is not None), default=0.0)
    opt_state = parts.opt_state
    per_batch: list[dict[str, Any]] = []
    if trace_dir:
        jax.profiler.start_trace(trace_dir)
    try:
        for i in range(warmup + num_batches):
            step = jnp.asarray(i, jnp.int32)
            k = jax.random.fold_in(key, i)
            batch, t_d = _timed(parts.data, step)
            _, t_f = _timed(parts.forward, params, batch, k)
            (loss, g), t_fb = _timed(parts.forward_backward, params, batch, k)
            (params, opt_state), t_o = _timed(parts.optimizer, params, opt_state, g)
            if i < warmup:
                continue
            lat = t_d + t_fb + t_o
            cur, peak = host_rss_mb()
            per_batch.append(
                {
                    "batch_latency_ms": lat,
                    "forward_time_ms": t_f,
                    "backward_time_ms": max(t_fb - t_f, 0.0),
                    "optimizer_step_ms": t_o,
                    "data_loading_time_ms": t_d,
                    "samples_per_second": batch_size / (lat / 1e3),
                    "batches_per_second": 1e3 / lat,
                    "peak_gpu_memory_mb": dev_mem if backend.platform() != "cpu" else 0.0,
                    "peak_host_memory_mb": peak,
                    "current_gpu_memory_mb": 0.0,
                    "current_host_memory_mb": cur,
                    "avg_gpu_utilization": None,
                    "forward_backward_time_ms": t_fb,
                    "loss": float(loss),
                }
            )
    finally:
        if trace_dir:
            jax.profiler.stop_trace()
    return per_batch, params


def _aggregate(per_batch: list[dict[str, Any]], batch_size: int) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """Mean, min and max of every metric over the batches, throughput and median latency; and the four parts of
    a step ranked by their mean time (the hotspots)."""
    agg = {}
    for f in METRIC_FIELDS + ("forward_backward_time_ms",):
        vals = [m[f] for m in per_batch if m[f] is not None]
        if vals:
            agg[f"avg_{f}"], agg[f"min_{f}"], agg[f"max_{f}"] = (
                float(np.mean(vals)),
                float(np.min(vals)),
                float(np.max(vals)),
            )
    total_ms = sum(m["batch_latency_ms"] for m in per_batch)
    agg["throughput_samples_per_sec"] = len(per_batch) * batch_size / (total_ms / 1e3)
    agg["median_batch_latency_ms"] = float(np.median([m["batch_latency_ms"] for m in per_batch]))
    parts = {
        "forward_pass": agg["avg_forward_time_ms"],
        "backward_pass": agg["avg_backward_time_ms"],
        "optimizer_step": agg["avg_optimizer_step_ms"],
        "data_loading": agg["avg_data_loading_time_ms"],
    }
    hot = sorted(parts.items(), key=lambda kv: -kv[1])
    hotspots = [
        {"rank": i + 1, "function": k, "time_ms": v, "percent": 100.0 * v / max(sum(parts.values()), 1e-12)}
        for i, (k, v) in enumerate(hot)
    ]
    return agg, hotspots


def fused_train_chunk(
    loss_fn: Callable[..., jax.Array],
    params: Any,
    optimizer: optax.GradientTransformation,
    get_batch: Callable[[jax.Array], Any],
    steps: int,
    key: jax.Array,
) -> tuple[Callable[[Any], tuple[Any, jax.Array]], Any]:
    """The production training path: ``steps`` fused train steps (data + fwd + bwd + update) in one
    ``lax.scan``. Returns ``(chunk_fn, initial_carry)``; ``chunk_fn(carry) -> (carry, losses)`` and the
    carry is ``(params, opt_state, step, key)``, so the step is the data cursor."""
    check_scalar(steps, "steps", integer=True, minimum=1)
    check_key(key)
    steps = int(steps)

    def chunk_fn(carry):
        def body(c, _):
            p, s, st, k = c
            k, sub = jax.random.split(k)
            loss, g = jax.value_and_grad(loss_fn)(p, get_batch(st), sub)
            u, s = optimizer.update(g, s, p)
            return (optax.apply_updates(p, u), s, st + 1, k), loss

        return jax.lax.scan(body, carry, None, length=steps)

    return chunk_fn, (params, optimizer.init(params), jnp.zeros((), jnp.int32), key)


def profile_fused(
    loss_fn: Callable,
    params: Any,
    optimizer: optax.GradientTransformation,
    get_batch: Callable[[jax.Array], Any],
    *,
    batch_size: int,
    chunk: int = 200,
    repeats: int = 3,
    key: jax.Array,
) -> dict[str, Any]:
    """Throughput of the production path: ``chunk`` fused train steps (data + fwd + bwd + Adam) per jitted
    ``lax.scan`` call. Returns compile time, per-chunk times and samples/s = total samples / total time."""
    check_scalar(batch_size, "batch_size", integer=True, minimum=1)
    check_scalar(chunk, "chunk", integer=True, minimum=1)
    check_scalar(repeats, "repeats", integer=True, minimum=1)
    key = check_key(key)
    chunk_fn, carry = fused_train_chunk(loss_fn, params, optimizer, get_batch, chunk, key)
    c, t_c = _compile(chunk_fn, carry)
    carry, _ = jax.block_until_ready(c(carry))  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        carry, losses = jax.block_until_ready(c(carry))
        times.append(time.perf_counter() - t0)
    return {
        "chunk_steps": chunk,
        "repeats": repeats,
        "compile_time_s": t_c,
        "chunk_times_s": times,
        "step_ms_median": 1e3 * float(np.median(times)) / chunk,
        "samples_per_sec": repeats * chunk * batch_size / sum(times),
        "compiled_memory_mb": _memory_mb(c),
        "final_loss": float(losses[-1]),
    }


def system_info() -> dict[str, Any]:
    import flax
    import optax as _optax

    total_gb = None
    try:
        total_gb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError):
        pass
    dev = jax.devices()[0]
    gpu = backend.platform() == "gpu"
    return {
        "cpu_count": backend.machine_cores(),
        "total_memory_gb": total_gb,
        "cuda_available": gpu,
        "cuda_device_name": dev.device_kind if gpu else None,
        "torch_version": None,
        "jax_version": jax.__version__,
        "flax_version": flax.__version__,
        "optax_version": _optax.__version__,
        "numpy_version": np.__version__,
        "python_version": platform.python_version(),
        "platform": platform.platform(),
        "backend": backend.platform(),
        "device": str(dev),
        "device_kind": dev.device_kind,
        "load_average": os.getloadavg() if hasattr(os, "getloadavg") else None,
    }


def baseline_document(runs: list[dict[str, Any]], phase: str = "ivhl_jax profiler") -> dict[str, Any]:
    """Assemble the baseline document (module docstring); ``success_metrics`` come from run 0: latency in ms to
    2 decimals, throughputs in samples/s to 1, peak memory in GB to 3."""
    r0 = runs[0]
    agg = r0["aggregated_metrics"]
    return {
        "timestamp": datetime.datetime.now(datetime.UTC).isoformat(),
        "phase": phase,
        "system_info": system_info(),
        "profiling_runs": runs,
        "success_metrics": {
            "batch_latency_ms": round(agg["avg_batch_latency_ms"], 2),
            "data_throughput_samples_per_sec": round(agg["throughput_samples_per_sec"], 1),
            "fused_scan_throughput_samples_per_sec": (
                round(r0["fused_scan"]["samples_per_sec"], 1) if "fused_scan" in r0 else None
            ),
            "gpu_util_avg_percent": None,
            "peak_gpu_memory_gb": round(agg.get("max_peak_gpu_memory_mb", 0.0) / 1024, 3),
            "peak_host_memory_gb": round(agg["max_peak_host_memory_mb"] / 1024, 3),
        },
        "hotspots": r0["hotspots"],
    }


def compare(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """Ratios b / a of the success metrics and of each run's aggregated averages (matched by index)."""
    out: dict[str, Any] = {"success_metrics": {}, "runs": []}
    for k, va in a.get("success_metrics", {}).items():
        vb = b.get("success_metrics", {}).get(k)
        if isinstance(va, (int, float)) and isinstance(vb, (int, float)) and va:
            out["success_metrics"][k] = {"a": va, "b": vb, "ratio_b_over_a": vb / va}
    for ra, rb in zip(a.get("profiling_runs", []), b.get("profiling_runs", [])):
        d = {}
        for k, va in ra["aggregated_metrics"].items():
            vb = rb["aggregated_metrics"].get(k)
            if k.startswith(("avg_", "throughput")) and isinstance(vb, (int, float)) and va:
                d[k] = {"a": va, "b": vb, "ratio_b_over_a": vb / va}
        out["runs"].append({"a": ra.get("label"), "b": rb.get("label"), "metrics": d})
    return out
