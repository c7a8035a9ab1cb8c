"""Benchmarks of the wave-field kernels: ``superpose`` and the fast ``sincos``.

``superpose`` is the field-superposition benchmark (points X ~ N(0, I) in 3-D, sources
S ~ N(0, 0.25 I), A = 1, k = 1, ω = 1, φ = 0, t = 0, softening ε = 0.1), i.e.

    ψ_n = Σ_j A_j e^{i(k_j r_nj − ω_j t + φ_j)} / (r_nj + ε),

timed through the public :func:`ivhl_jax.physics.fields.superpose` (float32 in, complex64 out). Peers,
timed in the same process: the same formula in NumPy (float64 and float32), PyTorch eager and
``torch.compile`` (float32; real cos/sin parts because inductor cannot generate complex code),
and the straightforward JAX formulation with XLA's own cos/sin (what ``fastmath`` replaced).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np

from ivhl_jax.bench.harness import BenchCase
from ivhl_jax.core import backend
from ivhl_jax.run.measure import cost_record

# (points N, sources M) per size.
SUPERPOSE_SIZES = {"small": (512, 10), "medium": (2048, 20), "large": (8192, 50), "extreme": (32768, 100)}
# elements per call for the sincos micro-benchmark.
SINCOS_SIZES = {"small": 1 << 16, "medium": 1 << 20, "large": 1 << 22, "extreme": 1 << 24}
SOFTENING = 0.1


# the arguments of fields.superpose, in its order
NAMES = ("points", "sources", "amplitudes", "wavenumbers", "frequencies", "phases", "t")


def _unit_sources(points: np.ndarray, sources: np.ndarray) -> dict[str, Any]:
    """The benchmark's inputs around given points and sources: A = k = omega = 1, phi = 0, t = 0 (float32)."""
    m = sources.shape[0]
    return {
        "points": points.astype(np.float32),
        "sources": sources.astype(np.float32),
        "amplitudes": np.ones(m, np.float32),
        "wavenumbers": np.ones(m, np.float32),
        "frequencies": np.ones(m, np.float32),
        "phases": np.zeros(m, np.float32),
        "t": np.float32(0.0),
    }


def _superpose_inputs(n: int, m: int, seed: int = 0) -> dict[str, Any]:
    """Points ~ N(0, I) and sources ~ N(0, 0.25 I) in 3-D."""
    rng = np.random.default_rng(seed)
    return _unit_sources(rng.normal(size=(n, 3)), 0.5 * rng.normal(size=(m, 3)))


def _superpose(points, sources, amplitudes, wavenumbers, frequencies, phases, t, *, chunk=None, policy=None):
    """The public ``fields.superpose`` with the benchmark's softening, arguments in :data:`NAMES` order (``chunk``
    and ``policy`` passed on)."""
    from ivhl_jax.physics import fields

    waves = dict(amplitudes=amplitudes, wavenumbers=wavenumbers, frequencies=frequencies, phases=phases, t=t)
    return fields.superpose(points, sources, **waves, softening=SOFTENING, chunk=chunk, policy=policy)


def _torch_args(inp: dict[str, Any], device: str = "cpu") -> list:
    """The PyTorch peer's arguments (points, sources, amplitudes, wavenumbers, phase offset) on ``device``."""
    import torch

    tp = [
        torch.from_numpy(np.ascontiguousarray(inp[x])).to(device)
        for x in ("points", "sources", "amplitudes", "wavenumbers")
    ]
    tp.append(torch.from_numpy(inp["phases"] - inp["frequencies"] * inp["t"]).to(device))
    return tp


Peer = Callable[[], Callable[[], Any]]  # builds a call (untimed), the call is timed


def _numpy_peer(inp: dict[str, Any], dtype) -> Peer:
    def build():
        p, s = inp["points"].astype(dtype), inp["sources"].astype(dtype)
        a, k = inp["amplitudes"].astype(dtype), inp["wavenumbers"].astype(dtype)
        th = (inp["phases"] - inp["frequencies"] * inp["t"]).astype(dtype)
        eps = dtype(SOFTENING)

        def call():
            d = p[:, None, :] - s[None, :, :]
            r = np.sqrt(np.einsum("nmd,nmd->nm", d, d))
            w = a / (r + eps)
            ph = k * r + th
            return (w * np.cos(ph)).sum(1), (w * np.sin(ph)).sum(1)

        return call

    return build


def _torch_field(p, s, a, k, th):
    """The field's real and imaginary parts in PyTorch (real cos/sin: inductor cannot generate complex code):
    Σ_j a_j cos/sin(k_j r_ij + θ_j) / (r_ij + ε), the PyTorch peer of every comparison here (tensor methods
    only, so torch.compile traces it without a module lookup)."""
    d = p[:, None, :] - s[None, :, :]
    r = (d * d).sum(-1).sqrt()
    w = a / (r + SOFTENING)
    ph = k * r + th
    return (w * ph.cos()).sum(1), (w * ph.sin()).sum(1)


def _torch_peer(inp: dict[str, Any], compiled: bool) -> Peer:
    def build():
        import torch

        tp = _torch_args(inp)
        fn = torch.compile(_torch_field) if compiled else _torch_field

        def call():
            with torch.no_grad():
                return fn(*tp)

        return call

    return build


def _jax_plain_peer(inp: dict[str, Any], chunk: int = 2048) -> Peer:
    """The straightforward JAX formulation: chunk × M tiles with XLA's jnp.cos/jnp.sin."""

    def build():
        import jax
        import jax.numpy as jnp

        from ivhl_jax.numerics.fastmath import safe_norm

        def tile(pts, s, a, k, th):
            r = safe_norm(pts[:, None, :] - s[None, :, :])
            w = a / (r + SOFTENING)
            ph = k * r + th
            return jnp.sum(w * jnp.cos(ph), axis=1), jnp.sum(w * jnp.sin(ph), axis=1)

        def field(p, s, a, k, th):
            n = p.shape[0]
            if n <= chunk:
                return tile(p, s, a, k, th)
            blocks = jnp.pad(p, ((0, -n % chunk), (0, 0))).reshape(-1, chunk, 3)
            re, im = jax.lax.map(lambda b: tile(b, s, a, k, th), blocks)
            return re.reshape(-1)[:n], im.reshape(-1)[:n]

        args = [jnp.asarray(inp[x]) for x in ("points", "sources", "amplitudes", "wavenumbers")]
        args.append(jnp.asarray(inp["phases"] - inp["frequencies"] * inp["t"]))
        compiled = jax.jit(field).lower(*args).compile()
        return lambda: jax.block_until_ready(compiled(*args))

    return build


def superpose_case(size: str) -> BenchCase:
    import jax.numpy as jnp

    n, m = SUPERPOSE_SIZES[size]
    inp = _superpose_inputs(n, m)
    args = tuple(jnp.asarray(inp[x]) for x in NAMES)
    return BenchCase(
        op="superpose",
        size=size,
        fn=_superpose,
        args=args,
        params={
            "points": n,
            "sources": m,
            "dim": 3,
            "dtype": "float32 -> complex64",
            "softening": SOFTENING,
            "inputs": "points ~ N(0, I), sources ~ N(0, 0.25 I), A = k = omega = 1, phi = 0, t = 0, seed 0",
        },
        items_per_call=float(n * m),
        items_name="point-source pairs",
        peers={
            "numpy_float64": _numpy_peer(inp, np.float64),
            "numpy_float32": _numpy_peer(inp, np.float32),
            "torch_eager": _torch_peer(inp, compiled=False),
            "torch_compile": _torch_peer(inp, compiled=True),
            "jax_plain_xla_sincos": _jax_plain_peer(inp),
        },
        notes="jit = ivhl_jax.physics.fields.superpose -> fastmath.point_source_sum with the backend table's "
        "block size and kernel (CPU: own sincos, SoA, complex accumulator, small blocks on one thread; "
        "GPU/TPU: one fused reduction per block). peer_over_jit > 1 means ivhl_jax is faster. "
        "Peers use the real cos/sin form and the same float32 dtype.",
    )


def sincos_case(size: str) -> BenchCase:
    import jax.numpy as jnp

    from ivhl_jax.numerics.fastmath import sincos

    n = SINCOS_SIZES[size]
    x = np.random.default_rng(0).uniform(-100.0, 100.0, n).astype(np.float32)

    def xla_peer():
        import jax

        xj = jnp.asarray(x)
        compiled = jax.jit(lambda v: (jnp.sin(v), jnp.cos(v))).lower(xj).compile()
        return lambda: jax.block_until_ready(compiled(xj))

    def torch_peer(compiled: bool):
        def build():
            import torch

            xt = torch.from_numpy(x)
            f = lambda v: (torch.sin(v), torch.cos(v))
            fn = torch.compile(f) if compiled else f
            return lambda: fn(xt)

        return build

    return BenchCase(
        op="sincos",
        size=size,
        fn=sincos,
        args=(jnp.asarray(x),),
        params={"elements": n, "dtype": "float32", "range": "uniform(-100, 100)"},
        items_per_call=float(n),
        items_name="elements (sin and cos each)",
        peers={
            "jax_xla_sin_cos": xla_peer,
            "numpy_float32": lambda: lambda: (np.sin(x), np.cos(x)),
            "torch_eager": torch_peer(False),
            "torch_compile": torch_peer(True),
        },
        notes="jit = ivhl_jax.numerics.fastmath.sincos (Cody-Waite + minimax, shared reduction); "
        "jax_xla_sin_cos = jnp.sin and jnp.cos under one jit.",
    )


OPS = {"superpose": superpose_case, "sincos": sincos_case}


# --------------------------------------------------------------------------------------------------
# ours vs torch eager vs torch.compile at every size, interleaved rounds in one process
#
#   python -m ivhl_jax.bench.ops_fields --out bench/results/fields_vs_torch_compile.json
#
# (needs torch; run from the repository root in a venv with both packages). For each torch thread
# count in --threads (1 and 2 on the 2-vCPU host) the contestants run in rounds, one call each per
# round in a random order, so load changes on a shared host hit all of them alike; the ratio
# torch/ours is reported from medians and per round, with the IQR as the spread, and torch is
# credited with its best thread count. Correctness is checked in the same run: every contestant
# against a float64 NumPy sum (error relative to Σ|A|/(r + ε), float32 tolerance 1e-5).


def _float64_reference(inp: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    p, s = inp["points"].astype(np.float64), inp["sources"].astype(np.float64)
    a, k = inp["amplitudes"].astype(np.float64), inp["wavenumbers"].astype(np.float64)
    th = inp["phases"].astype(np.float64) - inp["frequencies"].astype(np.float64) * float(inp["t"])
    r = np.sqrt(((p[:, None, :] - s[None, :, :]) ** 2).sum(-1))
    return (a * np.exp(1j * (k * r + th)) / (r + SOFTENING)).sum(1), (np.abs(a) / (r + SOFTENING)).sum(1)


def _run_jax(compiled, args):
    import jax

    return jax.block_until_ready(compiled(*args))


def _stats(samples: list[float]) -> dict[str, float]:
    arr = np.asarray(samples, float)
    q1, med, q3 = np.percentile(arr, [25, 50, 75])
    return {
        "median_ms": float(med) * 1e3,
        "q25_ms": float(q1) * 1e3,
        "q75_ms": float(q3) * 1e3,
        "min_ms": float(arr.min()) * 1e3,
        "n": int(arr.size),
    }


def _contestants(inp: dict[str, Any], variants: bool, torch_compiled) -> tuple[dict[str, Callable[[], Any]], dict]:
    """The calls raced at one size, warmed (compiled): ours (AOT-compiled jit of the public ``fields.superpose``),
    with ``variants`` ours on the XLA-split path and the two dispatch floors, torch eager and ``torch.compile``;
    and a record of the compile times and of the fusions XLA splits over threads."""
    import time

    import jax
    import jax.numpy as jnp

    args = tuple(jnp.asarray(inp[x]) for x in NAMES)
    t0 = time.perf_counter()
    ours = jax.jit(_superpose).lower(*args).compile()
    info: dict[str, Any] = {"compile_s_ours": time.perf_counter() - t0}
    calls: dict[str, Callable[[], Any]] = {"ours": functools.partial(_run_jax, ours, args)}
    compiled = {"ours": ours}
    if variants:
        with backend.override(fields_serial_pairs=0):  # read at trace time: every block splits its fusions
            compiled["ours_split_fusions"] = jax.jit(_superpose).lower(*args).compile()
        floor = jax.jit(lambda p, *rest: jax.lax.complex(p[:, 0], p[:, 1])).lower(*args).compile()
        # XLA's CPU client runs a program inline on the calling thread only if its HLO cost analysis
        # counts < 1000 flops; anything bigger is handed to a worker thread (async dispatch). This
        # trivial program counts 3 N >= 1536 flops, so it measures that hand-off's floor.
        floor_async = (
            jax.jit(lambda p, *rest: jax.lax.complex(p[:, 0] * p[:, 1] + p[:, 2], p[:, 1])).lower(*args).compile()
        )
        calls["ours_split_fusions"] = functools.partial(_run_jax, compiled["ours_split_fusions"], args)
        calls["dispatch_floor"] = functools.partial(_run_jax, floor, args)
        calls["dispatch_floor_async_path"] = functools.partial(_run_jax, floor_async, args)
    info["xla_fusions_split_over_threads"] = {
        k: (c.as_text() or "").count("outer_dimension_partitions") for k, c in compiled.items()
    }
    tp = _torch_args(inp)
    t0 = time.perf_counter()
    torch_compiled(*tp)
    info["first_call_s_torch_compile"] = time.perf_counter() - t0
    calls["torch_eager"] = functools.partial(_torch_field, *tp)
    calls["torch_compile"] = functools.partial(torch_compiled, *tp)
    return calls, info


def _errors_vs_float64(calls: dict[str, Callable[[], Any]], inp: dict[str, Any]) -> dict[str, float]:
    """Every contestant (not the dispatch floors) against the float64 NumPy sum, relative to Σ|A|/(r + ε); each
    within the float32 tolerance 1e-5."""
    ref, scale = _float64_reference(inp)
    check = {}
    for name, call in calls.items():
        if name.startswith("dispatch_floor"):
            continue
        out = call()
        z = (
            np.asarray(out, np.complex128)
            if not isinstance(out, tuple)
            else out[0].numpy().astype(np.float64) + 1j * out[1].numpy().astype(np.float64)
        )
        check[name] = float(np.max(np.abs(z - ref) / scale))
    assert all(v <= 1e-5 for v in check.values()), check
    return check


def _random_order_rounds(calls: dict[str, Callable[[], Any]], rounds: int, seed: int, pause_s: float) -> dict:
    """``rounds`` rounds of one call per contestant in a fresh random order (a fixed cyclic order always puts the
    same contestant right after torch: measured up to 7x slower medians for an identical program there); with
    ``pause_s`` an untimed sleep before each call (every call then pays a thread wake-up: JAX's async CPU
    dispatch hands the call to a worker thread). Per contestant its timings, and per peer its ratios to ours."""
    import os
    import time

    samples: dict[str, list[float]] = {k: [] for k in calls}
    order = list(calls)
    rng = np.random.default_rng(seed)
    load0 = os.getloadavg()
    for _ in range(rounds):
        for name in rng.permutation(order):
            if pause_s:
                time.sleep(pause_s)
            t0 = time.perf_counter()
            calls[name]()
            samples[name].append(time.perf_counter() - t0)
    load1 = os.getloadavg()
    ph: dict[str, Any] = {
        "loadavg_1min_start_end": [load0[0], load1[0]],
        "timings": {k: _stats(v) for k, v in samples.items()},
    }
    ours_s = np.asarray(samples["ours"])
    for peer in ("torch_eager", "torch_compile", "ours_split_fusions"):
        if peer in samples:
            per_round = np.asarray(samples[peer]) / ours_s
            ph["timings"][peer].update(
                {
                    "ratio_medians_peer_over_ours": float(np.median(samples[peer]) / np.median(ours_s)),
                    "ratio_per_round_median": float(np.median(per_round)),
                    "ratio_per_round_q25_q75": [
                        float(np.percentile(per_round, 25)),
                        float(np.percentile(per_round, 75)),
                    ],
                }
            )
    return ph


def _phase_line(size: str, nt: int, ph: dict, variants: bool) -> str:
    load0, load1 = ph["loadavg_1min_start_end"]
    t = ph["timings"]
    return (
        f"[fields] {size} torch threads {nt} (load {load0:.1f}->{load1:.1f}): ours "
        f"{t['ours']['median_ms']:.4f} ms, torch eager {t['torch_eager']['median_ms']:.4f}, torch.compile "
        f"{t['torch_compile']['median_ms']:.4f} (x{t['torch_compile']['ratio_medians_peer_over_ours']:.2f})"
        + (
            f", split {t['ours_split_fusions']['median_ms']:.4f}, floor {t['dispatch_floor']['median_ms']:.4f}"
            f", async floor {t['dispatch_floor_async_path']['median_ms']:.4f}"
            if variants
            else ""
        )
    )


def _torch_summary(by_threads: dict[str, dict]) -> dict[str, Any]:
    """The figures at torch's best thread count (credited to torch)."""
    best = min(by_threads, key=lambda k: by_threads[k]["timings"]["torch_compile"]["median_ms"])
    tb = by_threads[best]["timings"]
    return {
        "torch_compile_best_threads": int(best),
        "ours_median_ms": tb["ours"]["median_ms"],
        "torch_eager_median_ms": tb["torch_eager"]["median_ms"],
        "torch_compile_median_ms": tb["torch_compile"]["median_ms"],
        "torch_compile_over_ours_medians": tb["torch_compile"]["ratio_medians_peer_over_ours"],
        "torch_compile_over_ours_per_round_median": tb["torch_compile"]["ratio_per_round_median"],
        "torch_compile_over_ours_per_round_q25_q75": tb["torch_compile"]["ratio_per_round_q25_q75"],
    }


def compare_with_torch(
    sizes: tuple[str, ...] = ("small", "medium", "large", "extreme"),
    threads: tuple[int, ...] = (1, 2),
    rounds: dict[str, int] | None = None,
    variants: bool = True,
    pause_s: float = 0.0,
    log=print,
) -> dict:
    """Interleaved timing of ours (jitted ``fields.superpose``), torch eager and ``torch.compile``.

    ``variants`` adds our own sub-measurements per size: ``ours_split_fusions`` (the same kernel
    forced onto the XLA-split path, to show what the single-thread path buys), ``dispatch_floor`` (a
    jitted function with the same 7 arguments that only packs a complex output, < 1000 flops, so
    XLA runs it inline on the calling thread) and ``dispatch_floor_async_path`` (the same with
    ≥ 1000 flops: the floor of every real program under JAX's default async CPU dispatch).
    """
    import time

    import jax
    import torch

    rounds = rounds or {"small": 400, "medium": 300, "large": 80, "extreme": 40}
    torch.set_grad_enabled(False)
    torch_compiled = torch.compile(_torch_field)
    doc: dict = {
        "what": "psi_n = sum_j A_j exp(i(k_j r_nj - w_j t + phi_j)) / (r_nj + eps), float32, seed inputs "
        "(points ~ N(0, I) 3-D, sources ~ N(0, 0.25 I), A = k = w = 1, phi = 0, t = 0, eps = 0.1)",
        "timestamp_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "versions": {"jax": jax.__version__, "torch": torch.__version__, "numpy": np.__version__},
        "cpus_available": backend.host_cores(),
        "method": "per torch thread count: warm-up, then rounds of one call per contestant in a fresh random "
        "order each round, an untimed pause (pause_s) before each call; ours = AOT-compiled "
        "jax.jit of the public fields.superpose (dispatch included), block_until_ready; torch "
        "under no_grad; ratio = torch / ours (> 1: ours faster)",
        "pause_s": pause_s,
        "results": [],
    }
    for size in sizes:
        n, m = SUPERPOSE_SIZES[size]
        inp = _superpose_inputs(n, m)
        calls, info = _contestants(inp, variants, torch_compiled)
        rec: dict = {
            "size": size,
            "points": n,
            "sources": m,
            "pairs": n * m,
            "compile_s_ours": info["compile_s_ours"],
            "xla_fusions_split_over_threads": info["xla_fusions_split_over_threads"],
            "first_call_s_torch_compile": info["first_call_s_torch_compile"],
            "max_err_vs_float64_rel_to_sum_abs_terms": _errors_vs_float64(calls, inp),  # in the same run
            "by_torch_threads": {},
        }
        for nt in threads:
            torch.set_num_threads(nt)
            for call in calls.values():
                for _ in range(3):
                    call()
            ph = _random_order_rounds(calls, rounds[size], nt, pause_s)
            rec["by_torch_threads"][str(nt)] = ph
            log(_phase_line(size, nt, ph, variants))
        rec["summary"] = _torch_summary(rec["by_torch_threads"])
        doc["results"].append(rec)
    return doc


# --------------------------------------------------------------------------------------------------
# the accelerator check (bench/gpu_checks.py runs it; --quick is the CPU-sized form a test runs)

GPU_SIZES = ((32768, 100), (262144, 256), (1048576, 512))
QUICK_SIZES = ((2048, 20), (8192, 40))
# points whose float64 reference is computed (the error is the max over them)
_ERROR_POINTS = 4096


def _box_inputs(n: int, m: int, seed: int = 0) -> dict[str, Any]:
    """Uniform random points and sources in a 10-unit box, A = k = omega = 1, phi = 0, t = 0 (float32)."""
    rng = np.random.default_rng(seed)
    return _unit_sources(rng.uniform(0, 10, (n, 3)), rng.uniform(0, 10, (m, 3)))


def _median_ms(call, reps: int) -> float:
    import time

    call()  # warm (compile)
    samples = []
    for _ in range(reps):
        t0 = time.perf_counter()
        call()
        samples.append(time.perf_counter() - t0)
    return float(np.median(samples)) * 1e3


def _torch_compile_on(device_kind: str):
    """torch.compile of the real cos/sin formula on this device, or (None, why)."""
    try:
        import torch
    except ImportError:
        return None, "torch not importable"
    if device_kind == "gpu" and not torch.cuda.is_available():
        return None, "torch has no CUDA device"
    dev = "cuda" if device_kind == "gpu" else "cpu"

    return (torch, dev, torch.compile(_torch_field)), None


def _time_kernels(kernels, args, inp, e, ref, scale, default_ms, reps) -> dict:
    """Each other ``fields_method`` in ``kernels`` (e.g. ``"pallas"``) at the default block, float32 and bf16
    storage (``policy="pure_bf16"``): ms, error vs float64 (bf16: vs the float64 sum of the bf16-rounded inputs),
    ``cost`` (its roofline), and the ratio to the default. A kernel that fails here is recorded, the run goes on."""
    import jax
    import jax.numpy as jnp

    out: dict = {}
    for method in kernels:
        for policy in (None, "pure_bf16"):
            name = method if policy is None else f"{method}_bf16_storage"
            try:
                with backend.override(fields_method=method):
                    f = jax.jit(functools.partial(_superpose, policy=policy))
                    c = f.lower(*args).compile()
                call = functools.partial(lambda c: jax.block_until_ready(c(*args)), c)
                want, s_ = ref, scale
                if policy is not None:  # the float64 sum of the inputs as bf16 storage rounds them
                    rounded = {
                        k: np.asarray(jnp.asarray(v, jnp.bfloat16), np.float64) if np.ndim(v) else v
                        for k, v in inp.items()
                    }
                    want, s_ = _float64_reference({**rounded, "points": rounded["points"][:e]})
                z = np.asarray(call()[:e], np.complex128)
                ms = _median_ms(call, reps)
                out[name] = {
                    "ms": ms,
                    "err_vs_f64": float(np.max(np.abs(z - want) / s_)),
                    "over_default": ms / default_ms,
                    "cost": cost_record(c, 1e-3 * ms),
                }
            except Exception as err:  # noqa: BLE001 - e.g. a kernel that does not compile on this device
                out[name] = {"error": f"{type(err).__name__}: {str(err)[:300]}"}
    return out


def _chunk_sweep(n: int, m: int, args: tuple, quick: bool, reps: int) -> tuple[dict, dict, Callable[[], Any]]:
    """``fields.superpose`` at the default block size and a small sweep of others: the record (ms per chunk,
    each compile's roofline, the best chunk), the compiled programs by chunk, and the default call."""
    import jax

    from ivhl_jax.physics import fields

    compiled: dict = {}

    def run(chunk):
        f = jax.jit(functools.partial(_superpose, chunk=chunk))
        c = compiled[chunk] = f.lower(*args).compile()  # kept for its cost_analysis() (the roofline)
        return lambda: jax.block_until_ready(c(*args))

    default_chunk = min(fields.default_chunk(m, n=n), n)
    default_call = run(None)
    rec: dict = {"points": n, "sources": m, "default_chunk": default_chunk, "chunks_ms": {}, "costs": {}}
    rec["default_ms"] = _median_ms(default_call, reps)
    rec["costs"][str(default_chunk)] = cost_record(compiled[None], 1e-3 * rec["default_ms"])
    sweep = {n, max(1, n // 4)} if quick else {n, max(1, n // 4), min(n, 65536), min(n, 8192)}
    for chunk in sorted(sweep - {default_chunk}, reverse=True):
        rec["chunks_ms"][str(chunk)] = _median_ms(run(chunk), reps)
        rec["costs"][str(chunk)] = cost_record(compiled[chunk], 1e-3 * rec["chunks_ms"][str(chunk)])
    rec["chunks_ms"][str(default_chunk)] = rec["default_ms"]
    best = min(rec["chunks_ms"], key=rec["chunks_ms"].get)
    rec["best_chunk"], rec["best_ms"] = int(best), rec["chunks_ms"][best]
    rec["default_over_best"] = rec["default_ms"] / rec["best_ms"]
    return rec, compiled, default_call


def _torch_compile_race(tc, inp: dict[str, Any], e: int, ref, scale, rec: dict, reps: int) -> str:
    """``torch.compile`` of the same formula on the same device (``tc`` from :func:`_torch_compile_on`): its ms,
    error against float64 and ratio to our default, into ``rec``; the summary's words."""
    torch, dev, compiled = tc
    tp = _torch_args(inp, dev)

    def tcall():
        with torch.no_grad():
            out = compiled(*tp)
        if dev == "cuda":
            torch.cuda.synchronize()
        return out

    re_t, im_t = tcall()
    z = re_t[:e].cpu().numpy().astype(np.float64) + 1j * im_t[:e].cpu().numpy().astype(np.float64)
    rec["torch_compile_ms"] = _median_ms(tcall, reps)
    rec["torch_compile_err_vs_f64"] = float(np.max(np.abs(z - ref) / scale))
    rec["torch_compile_over_default"] = rec["torch_compile_ms"] / rec["default_ms"]
    return (
        f"; torch.compile {rec['torch_compile_ms']:.3f} ms (default is {rec['torch_compile_over_default']:.2f}x faster)"
    )


def gpu_check(quick: bool = False, kernels: tuple[str, ...] | None = None) -> dict:
    """``fields.superpose`` on this device at the default block size against a small sweep of block sizes
    and against ``torch.compile`` of the same formula on the same device (when torch is importable).

    Sizes (points × sources): 32768 × 100, 262144 × 256, 1048576 × 512 (``quick``: 2048 × 20 and 8192 × 40,
    seconds on a CPU). Inputs: :func:`_box_inputs`. Times are medians of jitted calls waited on
    (``block_until_ready``; ``torch.cuda.synchronize`` for torch). Errors: float32 against a float64 NumPy
    sum on the first 4096 points, relative to Σ_j |A_j| / (r + ε). Returns the records and a ``summary``
    (one line per size).
    """
    import jax
    import jax.numpy as jnp

    from ivhl_jax.physics import tunables

    sizes = QUICK_SIZES if quick else GPU_SIZES
    reps = 3 if quick else 10
    kind = backend.platform()
    if kernels is None:  # the Pallas kernel where ivhl tune races it (compiled); elsewhere it would be interpreted
        kernels = ("pallas",) if tunables.pallas_candidate(kind) else ()
    tc, torch_why = _torch_compile_on(kind)
    row = backend.defaults()
    doc: dict = {
        "platform": kind,
        "device": str(jax.devices()[0]),
        "fields_chunking": row.fields_chunking,
        "fields_memory_fraction": row.fields_memory_fraction,
        "torch_compile": "real cos/sin form on the same device" if tc else torch_why,
        "results": [],
    }
    summary = []
    for n, m in sizes:
        inp = _box_inputs(n, m)
        args = tuple(jnp.asarray(inp[x]) for x in NAMES)
        e = min(n, _ERROR_POINTS)
        ref, scale = _float64_reference({**inp, "points": inp["points"][:e]})
        rec, _, default_call = _chunk_sweep(n, m, args, quick, reps)
        err = float(np.max(np.abs(np.asarray(default_call()[:e], np.complex128) - ref) / scale))
        rec["f32_err_vs_f64"] = err
        rec["kernels"] = _time_kernels(kernels, args, inp, e, ref, scale, rec["default_ms"], reps)
        line = (
            f"{n} x {m}: default (chunk {rec['default_chunk']}) {rec['default_ms']:.3f} ms, best chunk "
            f"{rec['best_chunk']} {rec['best_ms']:.3f} ms ({rec['default_over_best']:.2f}x), err {err:.1e}"
        )
        if tc:
            line += _torch_compile_race(tc, inp, e, ref, scale, rec, reps)
        for name, kern in rec["kernels"].items():
            line += f"; {name} {kern.get('ms', float('nan')):.3f} ms {kern.get('error', '')}".rstrip()
        doc["results"].append(rec)
        summary.append(line)
    doc["summary"] = summary
    return doc


def main(argv: list[str] | None = None) -> None:
    import argparse
    import sys

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", action="append", choices=list(SUPERPOSE_SIZES), help="repeatable; default all")
    ap.add_argument("--threads", default="1,2", help="torch thread counts to try (comma-separated)")
    ap.add_argument("--rounds-scale", type=float, default=1.0, help="multiply the default rounds per size")
    ap.add_argument("--no-variants", action="store_true", help="skip the split-fusion and dispatch-floor variants")
    ap.add_argument(
        "--sync-dispatch",
        action="store_true",
        help="jax_cpu_enable_async_dispatch=False: run each call on the calling thread, as torch does",
    )
    ap.add_argument("--pause-s", type=float, default=0.0, help="untimed sleep before each call")
    ap.add_argument("--gpu-check", action="store_true", help="instead: run gpu_check() (with --quick: CPU-sized)")
    ap.add_argument("--quick", action="store_true", help="with --gpu-check: the small CPU-sized form")
    ap.add_argument("--out", help="write the JSON here")
    a = ap.parse_args(argv)
    from ivhl_jax.bench.harness import write_results

    command = " ".join(["python -m ivhl_jax.bench.ops_fields", *(argv if argv is not None else sys.argv[1:])])
    if a.gpu_check:
        doc = gpu_check(quick=a.quick)
        print("\n".join(doc["summary"]))
        if a.out:
            write_results(a.out, doc, command=command)
        return
    if a.sync_dispatch:
        import jax

        jax.config.update("jax_cpu_enable_async_dispatch", False)  # before the CPU client is created
    rounds = {
        k: max(5, int(v * a.rounds_scale)) for k, v in {"small": 400, "medium": 300, "large": 80, "extreme": 40}.items()
    }
    doc = compare_with_torch(
        tuple(a.size or SUPERPOSE_SIZES),
        tuple(int(x) for x in a.threads.split(",")),
        rounds,
        variants=not a.no_variants,
        pause_s=a.pause_s,
    )
    doc["jax_cpu_enable_async_dispatch"] = not a.sync_dispatch
    if a.out:
        write_results(a.out, doc, command=command)
    for rec in doc["results"]:
        s = rec["summary"]
        print(
            f"{rec['size']:8s} ours {s['ours_median_ms']:.4f} ms | torch eager {s['torch_eager_median_ms']:.4f} | "
            f"torch.compile ({s['torch_compile_best_threads']} thr) {s['torch_compile_median_ms']:.4f} | "
            f"compile/ours {s['torch_compile_over_ours_medians']:.2f} (per round "
            f"{s['torch_compile_over_ours_per_round_median']:.2f})"
        )


if __name__ == "__main__":
    main()
