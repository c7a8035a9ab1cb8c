"""Training profiler: per-step timing of data, forward, backward and optimiser as separately compiled
pieces, compile time apart from steady state, memory, throughput, hotspots, and ``baseline.json``.

Method. Each piece is ``jax.jit``-compiled ahead of time (``lower().compile()``, timed as compile
time) and every timed call ends in ``block_until_ready``:

* ``data``: gather of the batch at the step (:class:`ivhl_jax.data.Batcher`),
* ``forward``: the loss (forward pass only),
* ``forward+backward``: ``value_and_grad`` of the loss; ``backward_time_ms`` is its time minus the
  forward time of the same step (a derived number, clipped at 0),
* ``optimizer``: ``optimizer.update`` + ``apply_updates``.

``batch_latency_ms`` is data + forward+backward + optimizer (the forward-only call is extra, for the
split). Throughput = total samples / total time (not a mean of per-batch rates). The production path,
``fused_scan``, times whole jitted ``lax.scan`` chunks of fused train steps (data gather included),
which is what ``ivhl train adaptive`` runs. Device memory comes from ``compiled.memory_analysis()``
(temp + argument + output bytes; on CPU this is the XLA buffer plan), host memory is the process RSS.

The JSON mirrors the seed's Phase-0 ``baseline.json`` (timestamp, phase, system_info,
profiling_runs[configuration, per_batch_metrics (12 fields), aggregated_metrics, final_state],
success_metrics, hotspots) and adds versions, device, compile times, the fused-scan throughput, and
hotspots sorted by measured time. :func:`compare` diffs two such files.
"""

from __future__ import annotations

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

from ivhl_jax.validation import check_scalar

METRIC_FIELDS = ("batch_latency_ms", "forward_time_ms", "backward_time_ms", "optimizer_step_ms",
                 "data_loading_time_ms", "samples_per_second", "batches_per_second", "peak_gpu_memory_mb",
                 "peak_host_memory_mb", "current_gpu_memory_mb", "current_host_memory_mb", "avg_gpu_utilization")


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
    total = sum(getattr(m, a, 0) or 0 for a in ("temp_size_in_bytes", "argument_size_in_bytes",
                                                  "output_size_in_bytes"))
    return total / 2**20


def _compile(fn: Callable, *args) -> tuple[Any, float]:
    t0 = time.perf_counter()
    c = jax.jit(fn).lower(*args).compile()
    return c, time.perf_counter() - t0


def _timed(f: Callable, *args) -> tuple[Any, float]:
    t0 = time.perf_counter()
    out = jax.block_until_ready(f(*args))
    return out, (time.perf_counter() - t0) * 1e3


def profile_training(loss_fn: Callable, params: Any, optimizer: optax.GradientTransformation,
                     get_batch: Callable[[jax.Array], Any], *, batch_size: int, num_batches: int = 20,
                     warmup: int = 3, key: jax.Array | None = None, fused_chunk: int = 0, fused_repeats: int = 3,
                     trace_dir: str | None = None, label: str = "") -> dict[str, Any]:
    """Profile ``num_batches`` training steps after ``warmup`` untimed ones.

    Args:
      loss_fn: ``loss_fn(params, batch, key) -> scalar``.
      get_batch: ``get_batch(step) -> batch`` (jit-compatible).
      fused_chunk: if > 0, also time jitted ``lax.scan`` chunks of this many fused steps.
      trace_dir: if given, write a ``jax.profiler`` trace of the timed batches there.
    Returns: one ``profiling_runs`` entry (see module docstring).
    """
    check_scalar(num_batches, "num_batches", integer=True, minimum=1)
    key = jax.random.key(0) if key is None else key
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
    compile_s = {"data": t_data, "forward": t_fwd, "forward_backward": t_grad, "optimizer": t_opt}
    mem = {k: _memory_mb(c) for k, c in (("data", data_c), ("forward", fwd_c), ("forward_backward", grad_c),
                                         ("optimizer", opt_c))}
    dev_mem = max((v for v in mem.values() if v is not None), default=0.0)

    per_batch = []
    if trace_dir:
        jax.profiler.start_trace(trace_dir)
    try:
        for i in range(warmup + num_batches):
            step = jnp.asarray(i, jnp.int32)
            k = jax.random.fold_in(key, i)
            batch, t_d = _timed(data_c, step)
            _, t_f = _timed(fwd_c, params, batch, k)
            (loss, g), t_fb = _timed(grad_c, params, batch, k)
            (params, opt_state), t_o = _timed(opt_c, params, opt_state, g)
            if i < warmup:
                continue
            lat = t_d + t_fb + t_o
            cur, peak = host_rss_mb()
            per_batch.append({
                "batch_latency_ms": lat, "forward_time_ms": t_f, "backward_time_ms": max(t_fb - t_f, 0.0),
                "optimizer_step_ms": t_o, "data_loading_time_ms": t_d,
                "samples_per_second": batch_size / (lat / 1e3), "batches_per_second": 1e3 / lat,
                "peak_gpu_memory_mb": dev_mem if jax.default_backend() != "cpu" else 0.0,
                "peak_host_memory_mb": peak, "current_gpu_memory_mb": 0.0, "current_host_memory_mb": cur,
                "avg_gpu_utilization": None, "forward_backward_time_ms": t_fb, "loss": float(loss),
            })
    finally:
        if trace_dir:
            jax.profiler.stop_trace()
    agg = {}
    for f in METRIC_FIELDS + ("forward_backward_time_ms",):
        vals = [m[f] for m in per_batch if m[f] is not None]
        if vals:
            agg[f"avg_{f}"], agg[f"min_{f}"], agg[f"max_{f}"] = float(np.mean(vals)), float(np.min(vals)), \
                float(np.max(vals))
    total_ms = sum(m["batch_latency_ms"] for m in per_batch)
    agg["throughput_samples_per_sec"] = len(per_batch) * batch_size / (total_ms / 1e3)
    agg["median_batch_latency_ms"] = float(np.median([m["batch_latency_ms"] for m in per_batch]))
    parts = {"forward_pass": agg["avg_forward_time_ms"], "backward_pass": agg["avg_backward_time_ms"],
             "optimizer_step": agg["avg_optimizer_step_ms"], "data_loading": agg["avg_data_loading_time_ms"]}
    hot = sorted(parts.items(), key=lambda kv: -kv[1])
    run = {
        "label": label,
        "configuration": {"num_batches": num_batches, "warmup_batches": warmup, "batch_size": batch_size,
                          "device": str(jax.devices()[0]), "model_parameters": int(sum(
                              x.size for x in jax.tree_util.tree_leaves(params)))},
        "compile_time_s": compile_s,
        "compiled_memory_mb": mem,
        "per_batch_metrics": per_batch,
        "aggregated_metrics": agg,
        "final_state": per_batch[-1],
        "hotspots": [{"rank": i + 1, "function": k, "time_ms": v,
                      "percent": 100.0 * v / max(sum(parts.values()), 1e-12)} for i, (k, v) in enumerate(hot)],
    }
    if fused_chunk:
        run["fused_scan"] = profile_fused(loss_fn, params, optimizer, get_batch, batch_size=batch_size,
                                          chunk=fused_chunk, repeats=fused_repeats, key=key)
    return run


def fused_train_chunk(loss_fn: Callable[..., jax.Array], params: Any, optimizer: optax.GradientTransformation,
                      get_batch: Callable[[jax.Array], Any], steps: int, key: jax.Array
                      ) -> tuple[Callable[[Any], tuple[Any, jax.Array]], Any]:
    """The production training path: ``steps`` fused train steps (data + fwd + bwd + update) in one
    ``lax.scan``. Returns ``(chunk_fn, initial_carry)``; ``chunk_fn(carry) -> (carry, losses)`` and the
    carry is ``(params, opt_state, step, key)``, so the step is the data cursor."""

    def chunk_fn(carry):
        def body(c, _):
            p, s, st, k = c
            k, sub = jax.random.split(k)
            loss, g = jax.value_and_grad(loss_fn)(p, get_batch(st), sub)
            u, s = optimizer.update(g, s, p)
            return (optax.apply_updates(p, u), s, st + 1, k), loss

        return jax.lax.scan(body, carry, None, length=steps)

    return chunk_fn, (params, optimizer.init(params), jnp.zeros((), jnp.int32), key)


def profile_fused(loss_fn: Callable, params: Any, optimizer: optax.GradientTransformation,
                  get_batch: Callable[[jax.Array], Any], *, batch_size: int, chunk: int = 200, repeats: int = 3,
                  key: jax.Array | None = None) -> dict[str, Any]:
    """Throughput of the production path: ``chunk`` fused train steps (data + fwd + bwd + Adam) per jitted
    ``lax.scan`` call. Returns compile time, per-chunk times and samples/s = total samples / total time."""
    key = jax.random.key(0) if key is None else key
    chunk_fn, carry = fused_train_chunk(loss_fn, params, optimizer, get_batch, chunk, key)
    c, t_c = _compile(chunk_fn, carry)
    carry, _ = jax.block_until_ready(c(carry))  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        carry, losses = jax.block_until_ready(c(carry))
        times.append(time.perf_counter() - t0)
    return {"chunk_steps": chunk, "repeats": repeats, "compile_time_s": t_c, "chunk_times_s": times,
            "step_ms_median": 1e3 * float(np.median(times)) / chunk,
            "samples_per_sec": repeats * chunk * batch_size / sum(times),
            "compiled_memory_mb": _memory_mb(c), "final_loss": float(losses[-1])}


def system_info() -> dict[str, Any]:
    import flax
    import optax as _optax

    total_gb = None
    try:
        total_gb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError):
        pass
    dev = jax.devices()[0]
    gpu = dev.platform == "gpu"
    return {"cpu_count": os.cpu_count(), "total_memory_gb": total_gb, "cuda_available": gpu,
            "cuda_device_name": dev.device_kind if gpu else None, "torch_version": None,
            "jax_version": jax.__version__, "flax_version": flax.__version__, "optax_version": _optax.__version__,
            "numpy_version": np.__version__, "python_version": platform.python_version(),
            "platform": platform.platform(), "backend": jax.default_backend(), "device": str(dev),
            "device_kind": dev.device_kind, "load_average": os.getloadavg() if hasattr(os, "getloadavg") else None}


def baseline_document(runs: list[dict[str, Any]], phase: str = "ivhl_jax profiler") -> dict[str, Any]:
    """Assemble the seed-schema document; ``success_metrics`` come from run 0 (rounded as the seed)."""
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
            "fused_scan_throughput_samples_per_sec": (round(r0["fused_scan"]["samples_per_sec"], 1)
                                                      if "fused_scan" in r0 else None),
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


# ------------------------------------------------------------------------------- the two reference workloads


def mlp_workload(batch_size: int = 32, sizes: tuple[int, ...] = (128, 256, 128, 10), seed: int = 0):
    """The seed's Phase-0 reference: MLP 128-256-128-10 (67,210 params), Adam 1e-3, CE, random data.

    Returns (loss_fn, params, optimizer, get_batch)."""
    keys = jax.random.split(jax.random.key(seed), len(sizes))
    params = []
    for k, (a, b) in zip(keys, zip(sizes[:-1], sizes[1:])):
        bound = 1.0 / np.sqrt(a)
        k1, k2 = jax.random.split(k)
        params.append({"w": jax.random.uniform(k1, (a, b), minval=-bound, maxval=bound),
                       "b": jax.random.uniform(k2, (b,), minval=-bound, maxval=bound)})

    def loss_fn(p, batch, key):
        x, y = batch
        for i, layer in enumerate(p):
            x = x @ layer["w"] + layer["b"]
            if i < len(p) - 1:
                x = jax.nn.relu(x)
        return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(x, y))

    def get_batch(step):
        k = jax.random.fold_in(jax.random.key(seed + 1), step)
        k1, k2 = jax.random.split(k)
        return (jax.random.normal(k1, (batch_size, sizes[0])), jax.random.randint(k2, (batch_size,), 0, sizes[-1]))

    return loss_fn, params, optax.adam(1e-3), get_batch


def adaptive_workload(cfg: Any = None, batch_size: int = 32, n_examples: int = 8000, seed: int = 0):
    """The seed's adaptive profile: N=100, H=64, D=784, C=10, Adam 1e-3 with global-norm clip 1.0, CE,
    the seed's synthetic prototype data (preloaded, pre-shuffled, sliced per step by ``Batcher``). Each batch starts
    from an explicit initial node state. Returns (loss_fn, params, optimizer, get_batch, cfg)."""
    from ivhl_jax import adaptive
    from ivhl_jax.data import Batcher

    cfg = adaptive.AdaptiveConfig() if cfg is None else cfg
    rng = np.random.default_rng(seed)
    protos = rng.standard_normal((cfg.output_dim, cfg.input_dim)).astype(np.float32)
    y = rng.integers(0, cfg.output_dim, n_examples).astype(np.int32)
    x = protos[y] + 0.1 * rng.standard_normal((n_examples, cfg.input_dim)).astype(np.float32)
    # Shuffled once on the host; the device-side cursor then only slices (Batcher with shuffle=True
    # would re-draw an n-element permutation inside every step, which dominated the step time).
    order = rng.permutation(n_examples)
    arrays = (jnp.asarray(x[order]), jnp.asarray(y[order]))
    batcher = Batcher(n_examples, batch_size, seed=seed, shuffle=False)
    params = adaptive.init_params(jax.random.key(seed), cfg)

    def loss_fn(p, batch, key):
        xb, yb = batch
        _, out = adaptive.run_inner(p, adaptive.init_state(cfg, xb.shape[0]), xb, key, cfg)
        return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(out["logits"], yb))

    opt = optax.chain(optax.clip_by_global_norm(1.0), optax.adam(1e-3))
    return loss_fn, params, opt, lambda s: batcher.batch(arrays, s), cfg


def run_baseline(path: str, *, num_batches: int = 20, warmup: int = 3, fused_chunk: int = 200,
                 trace_dir: str | None = None, include_mlp: bool = True) -> str:
    """Profile the adaptive model (seed config, per-sample and seed-compat schedulers) and the MLP reference;
    write ``baseline.json``. Returns the path."""
    from ivhl_jax import adaptive
    from ivhl_jax.io import write_json

    runs = []
    for label, cfg in (("adaptive per_sample (N=100,H=64,D=784,B=32)", adaptive.AdaptiveConfig()),
                       ("adaptive seed_compat shared scheduler (N=100,H=64,D=784,B=32)",
                        adaptive.AdaptiveConfig.seed())):
        loss_fn, params, opt, get_batch, _ = adaptive_workload(cfg)
        runs.append(profile_training(loss_fn, params, opt, get_batch, batch_size=32, num_batches=num_batches,
                                     warmup=warmup, fused_chunk=fused_chunk, trace_dir=trace_dir, label=label))
        trace_dir = None
    if include_mlp:
        loss_fn, params, opt, get_batch = mlp_workload()
        runs.append(profile_training(loss_fn, params, opt, get_batch, batch_size=32, num_batches=num_batches,
                                     warmup=warmup, fused_chunk=fused_chunk, label="mlp 128-256-128-10 (B=32)"))
    doc = baseline_document(runs)
    doc["seed_reference"] = {"adaptive_step_ms": 246.13, "adaptive_samples_per_sec": 130.0,
                             "mlp_batch_latency_ms": 1.595, "mlp_samples_per_sec": 20240.0,
                             "source": "shared/reference/adaptive_seed_model.md section 8 (4-CPU runner, torch 2.8)"}
    return write_json(path, doc)


if __name__ == "__main__":
    import argparse

    p = argparse.ArgumentParser(description="Write baseline.json (adaptive model + MLP reference).")
    p.add_argument("--out", default="bench/results/baseline.json")
    p.add_argument("--batches", type=int, default=20)
    p.add_argument("--fused-chunk", type=int, default=200)
    p.add_argument("--trace-dir", default=None)
    p.add_argument("--compare", nargs=2, metavar=("A", "B"), help="compare two baseline.json files and exit")
    a = p.parse_args()
    if a.compare:
        import json

        docs = [json.load(open(f)) for f in a.compare]
        print(json.dumps(compare(*docs), indent=2))
    else:
        print(run_baseline(a.out, num_batches=a.batches, fused_chunk=a.fused_chunk, trace_dir=a.trace_dir))
