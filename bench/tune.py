"""``ivhl tune``: measure this machine's best settings and store them in the tuning cache.

For every setting of the backend table and every kernel parameter that would otherwise be a guess, the
candidates are compiled, their outputs checked against the table default's output (a candidate whose output
differs is dropped and recorded as such), then timed in interleaved rounds (:func:`ivhl_jax.bench.harness.
interleaved_rounds`: one call of every candidate per round, so load changes on a shared host hit all alike).
The winner (smallest median) is stored with every candidate's median, IQR and samples in the per-machine cache
(:mod:`ivhl_jax.core.tuning`), which :func:`ivhl_jax.core.backend.defaults` reads before the table.

Areas (``--only``):

* ``xla`` — XLA compiler flags, each configuration in its own worker process (flags are read when a backend
  starts): ``--xla_cpu_prefer_vector_width=512`` on an AVX-512 CPU against XLA's default, on the field kernel and
  a GP run, the workers driven in turn round by round, outputs compared. A flag that pays is applied by
  ``import ivhl_jax`` in later processes (before the backend starts).
* ``fields`` — ``fields.superpose``: kernel (``loop``/``reduce``), block size (pair budget) and whether a
  block runs on one thread (the ``fields_serial_pairs`` threshold), per pair-count bucket.
* ``gp`` — the GP Strang step: merged potential half-steps vs one step at a time, and the host FFT (``ducc``,
  CPU, where installed) vs XLA's FFT; with several devices, one device vs every slab / pencil layout of the
  distributed FFT over all of them (:func:`tune_gp_layouts`; a measurement, keyed by device count and grid).
* ``cdt`` — the CDT engine (``host`` numba kernel, pure ``jax``; ``pallas`` only where it compiles: GPU). In
  ``--quick`` the host engine is left out (said in ``notes``) when numba's disk cache lacks its kernels.
* ``attention`` — the dense f32 kernel vs ``jax.nn.dot_product_attention``, the implementation for bf16
  inputs (``xla``, ``chunked``; ``cudnn`` and compiled ``pallas`` on a GPU), the chunked kernel's key block,
  and on a GPU the compiled Pallas kernel's tiles (block sizes are measurements: the caller's arguments).
* ``transformer`` — the layer loop (``unrolled`` vs ``scan``) of a small LM train step.
* ``mera`` — host cores a MERA sweep holds XLA to (CPU).

Every area also reports each kernel as a fraction of this machine's limits, measured on the spot
(:func:`measure_limits`: copy bandwidth and matmul throughput per dtype) against the bytes and flops of the
compiled program (``cost_analysis()``): ``roofline.fraction`` = max(bytes / bandwidth, flops / peak) / time.

``--quick`` uses one or two sizes per area (under 5 minutes on a 2-core CPU); ``IVHL_TUNE_TINY=1`` shrinks every
size to seconds (tests only).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

__all__ = [
    "AREAS",
    "QUICK_AREAS",
    "Candidate",
    "measure_limits",
    "compiled_cost",
    "cost_record",
    "roofline",
    "roofline_of",
    "choose",
    "tune",
    "tune_op",
    "main",
]

AREAS = ("xla", "fields", "gp", "cdt", "attention", "transformer", "mera")
QUICK_AREAS = ("xla", "fields", "gp", "cdt", "attention")
_VECTOR_FLAG = "--xla_cpu_prefer_vector_width=512"


def _tiny() -> bool:
    return os.environ.get("IVHL_TUNE_TINY", "") == "1"


def _log(msg: str) -> None:
    print(f"[tune] {msg}", flush=True)


_NOTES: dict[str, list[str]] = {}


def _note(area: str, msg: str) -> None:
    """Something an area left out or could not measure here, and why: on the console and in the result's
    ``notes``."""
    _NOTES.setdefault(area, []).append(msg)
    _log(f"{area}: {msg}")


# ------------------------------------------------------------------------------------------ limits
def measure_limits(quick: bool = True) -> dict[str, Any]:
    """This machine's limits, measured now: copy bandwidth (GB/s read + write, a jitted ``x * c`` over a
    buffer far larger than the caches) and matmul throughput (TFLOP/s) in f32 and bf16, each from the fastest of
    several samples of at least 0.2 s."""
    import jax
    import jax.numpy as jnp

    from ivhl_jax.bench.harness import summarize, time_in_windows
    from ivhl_jax.core import backend

    tiny = _tiny()
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
            lambda mm=mm, a=a, b=b: mm(a, b), repeats=3 if tiny else 5, window_s=0.0 if tiny else 0.2
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
    rec = {
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
    return rec


# ------------------------------------------------------------------------------------------ choosing
@dataclasses.dataclass
class Candidate:
    """One setting to time: ``settings`` (backend table fields, or for non-table knobs what the entry records)
    and ``build() -> (compiled, args)``; ``compiled(*args)`` runs it once. ``default`` marks the table's
    choice (the reference output the others must equal)."""

    name: str
    settings: dict[str, Any]
    build: Callable[[], tuple[Any, tuple]]
    default: bool = False


def _equal(out: Any, ref: Any, rtol: float) -> tuple[bool, float]:
    import jax

    a = [np.asarray(x) for x in jax.tree.leaves(out)]
    b = [np.asarray(x) for x in jax.tree.leaves(ref)]
    if len(a) != len(b) or any(x.shape != y.shape for x, y in zip(a, b)):
        return False, float("inf")
    worst = 0.0
    for x, y in zip(a, b):
        scale = float(np.max(np.abs(y))) if y.size else 0.0
        diff = float(np.max(np.abs(x.astype(np.complex128) - y.astype(np.complex128)))) if y.size else 0.0
        worst = max(worst, diff / max(scale, 1e-30))
    return worst <= rtol, worst


def choose(
    op: str,
    size: int | None,
    candidates: Sequence[Candidate],
    *,
    rounds: int,
    limits: Mapping[str, Any],
    rtol: float = 1e-4,
    check: Callable[[Any], str | None] | None = None,
    dtype: str = "f32",
    params: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Compile every candidate, check its output (against the default's with ``rtol``, or with ``check(out)``
    returning None if valid or why not), time the valid ones in ``rounds`` interleaved rounds, and return the
    cache entry: the winner (smallest median per-round time ratio to the default), its settings, every
    candidate's median/IQR/samples and per-round ratio to the winner, the spread and the roofline."""
    import jax

    from ivhl_jax.bench.harness import interleaved_rounds, summarize
    from ivhl_jax.core import tuning

    built: dict[str, tuple[Any, tuple]] = {}
    report: dict[str, dict[str, Any]] = {}
    ref = None
    for cand in sorted(candidates, key=lambda c: not c.default):
        try:
            t0 = time.perf_counter()
            compiled, args = cand.build()
            out = jax.block_until_ready(compiled(*args))
            rec: dict[str, Any] = {"settings": cand.settings, "compile_and_first_call_s": time.perf_counter() - t0}
        except Exception as e:  # noqa: BLE001 - a candidate that cannot run here is recorded, not fatal
            report[cand.name] = {"settings": cand.settings, "error": f"{type(e).__name__}: {str(e)[:200]}"}
            continue
        if check is not None:
            why = check(out)
            ok, err = why is None, None
            if why:
                rec["rejected"] = why
        elif ref is None:
            ref, ok, err = out, True, 0.0
        else:
            ok, err = _equal(out, ref, rtol)
            if not ok:
                rec["rejected"] = f"output differs from the default's by {err:.2e} (relative, > {rtol:g})"
        rec["max_rel_diff_vs_default"] = err
        report[cand.name] = rec
        if ok:
            built[cand.name] = (compiled, args)
    if not built:
        raise RuntimeError(f"no candidate of {op} ran correctly here: {json.dumps(report, default=str)[:400]}")
    calls = {name: (lambda c=c, a=a: jax.block_until_ready(c(*a))) for name, (c, a) in built.items()}
    for call in calls.values():
        call()
    wall, _ = interleaved_rounds(calls, rounds)
    for name, samples in wall.items():
        report[name].update(summarize(samples))
    # The winner: the smallest median of per-round ratios to the reference candidate (the table default). Within a
    # round every candidate meets the same load, so the ratio is steadier than either time on a shared host.
    anchor = np.asarray(wall[next(iter(wall))])
    ratio = {n: float(np.median(np.asarray(s) / anchor)) for n, s in wall.items()}
    best = min(wall, key=lambda n: (ratio[n], report[n]["median_s"]))
    for name, samples in wall.items():
        report[name]["over_best_per_round_median"] = float(np.median(np.asarray(samples) / np.asarray(wall[best])))
    default = next((c.name for c in candidates if c.default and c.name in wall), None)
    entry: dict[str, Any] = {
        "op": op,
        "bucket": tuning.bucket(size),
        "size": size,
        "params": dict(params or {}),
        "winner": best,
        "settings": next(c.settings for c in candidates if c.name == best),
        "median_s": report[best]["median_s"],
        "iqr_s": report[best]["iqr_s"],
        "spread": report[best]["iqr_s"] / report[best]["median_s"],
        "rounds": rounds,
        "candidates": report,
    }
    if default is not None:
        entry["default"] = default
        entry["table_default_over_best"] = report[default]["over_best_per_round_median"]
    entry["roofline"] = roofline(built[best][0], report[best]["median_s"], limits, dtype=dtype)
    _log(
        f"  {op} [{entry['bucket']}]: {best} {1e3 * entry['median_s']:.3f} ms (IQR {100 * entry['spread']:.0f} %)"
        + (f"; table default {default} x{entry['table_default_over_best']:.2f}" if default else "")
        + (
            f"; {100 * entry['roofline']['fraction']:.1f} % of the {entry['roofline']['bound']} roofline"
            if entry["roofline"]["fraction"] is not None
            else ""
        )
    )
    return entry


@contextlib.contextmanager
def _settings(**settings: Any) -> Iterator[None]:
    """Trace under ``settings`` (table fields only; other knobs are the candidate's own build arguments)."""
    from ivhl_jax.core import backend

    table = {k: v for k, v in settings.items() if k in {f.name for f in dataclasses.fields(backend.Tuning)}}
    with backend.override(**table):
        yield


@contextlib.contextmanager
def _mode(value: str) -> Iterator[None]:
    saved = os.environ.get("IVHL_TUNING")
    os.environ["IVHL_TUNING"] = value
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("IVHL_TUNING", None)
        else:
            os.environ["IVHL_TUNING"] = saved


def _aot(
    fn: Callable, *args: Any, settings: Mapping[str, Any] | None = None, cached: bool = False
) -> tuple[Any, tuple]:
    """Compile ``fn(*args)`` under the table row plus ``settings`` (``cached``: under this machine's tuning cache
    instead, i.e. what a call with no settings gets)."""
    import jax

    with _mode("cache" if cached else "frozen"), _settings(**(settings or {})):
        # a fresh function per candidate: jax.jit caches traces per function object, and the settings act at trace
        return jax.jit(lambda *a: fn(*a)).lower(*args).compile(), args


_VERIFY = {"on": False}


def _no_settings(fn: Callable, *args: Any) -> list[Candidate]:
    """With ``--verify``: one more candidate, the call with no settings under the tuning cache (what users get)."""
    if not _VERIFY["on"]:
        return []
    return [Candidate("no_settings_with_cache", {}, lambda: _aot(fn, *args, cached=True))]


# ------------------------------------------------------------------------------------------ fields
def _fields_sizes(quick: bool) -> list[tuple[int, int]]:
    from ivhl_jax.core import backend

    if _tiny():
        return [(512, 8)]
    if backend.platform() != "cpu":
        return [(65536, 256), (1048576, 512)] if quick else [(65536, 256), (262144, 256), (1048576, 512)]
    return [(8192, 50), (65536, 256)] if quick else [(8192, 50), (65536, 256), (262144, 256), (32768, 1024)]


def _fields_inputs(n: int, m: int):
    import jax.numpy as jnp

    rng = np.random.default_rng(0)
    pts = jnp.asarray(rng.uniform(-10, 10, (n, 3)), jnp.float32)
    src = jnp.asarray(rng.uniform(-10, 10, (m, 3)), jnp.float32)
    amp = jnp.asarray(rng.uniform(0.5, 1.5, m), jnp.float32)
    k = jnp.asarray(rng.uniform(0.5, 2.0, m), jnp.float32)
    ph = jnp.asarray(rng.uniform(0, 2 * np.pi, m), jnp.float32)
    return pts, src, amp, k, ph


def _superpose(p, s, a, k, ph):
    from ivhl_jax.physics import fields

    return fields.superpose(p, s, amplitudes=a, wavenumbers=k, phases=ph, softening=0.1)


def fields_candidates(n: int, m: int) -> list[Candidate]:
    """``fields.superpose`` at n points x m sources: the table default, then every distinct (kernel, block,
    one-thread) combination of pair budgets 2**16 … 2**26."""
    from ivhl_jax.core import backend

    args = _fields_inputs(n, m)
    row = backend.TABLE.get(backend.platform(), backend.TABLE["portable"])
    # the table's own values, stated: a measured choice stays what was measured if the table changes later
    table = {
        k: getattr(row, k) for k in ("fields_chunking", "fields_pair_budget", "fields_method", "fields_serial_pairs")
    }
    cands = [Candidate("table", table, lambda: _aot(_superpose, *args), default=True)]
    seen = set()
    on_cpu = backend.platform() == "cpu"
    for budget in (1 << 18, 1 << 20, 1 << 22, 1 << 24, 1 << 26):
        chunk = max(1, min(n, budget // m))
        for method, serial in (("loop", True), ("loop", False), ("reduce", False)):
            key = (method, chunk, serial)
            # blocks below 1024 points cost a loop step per block for nothing; on a CPU the reduce kernel is one
            # candidate (all points at once), on an accelerator the loop kernel's one-thread variant means nothing
            # (on an accelerator a loop over many small blocks serialises the device: blocks of >= n/8 points only)
            if (
                key in seen
                or (chunk < min(n, 1024))
                or (method == "reduce" and on_cpu and chunk < n)
                or (serial and not on_cpu)
                or (not on_cpu and chunk < n // 8)
            ):
                continue
            seen.add(key)
            pairs = chunk * m
            settings = {
                "fields_chunking": "pair_budget",
                "fields_pair_budget": max(budget, m),
                "fields_method": method,
                "fields_serial_pairs": int(2 ** np.ceil(np.log2(pairs))) if serial else 0,
            }
            if method == "reduce":
                settings["fields_serial_pairs"] = row.fields_serial_pairs
            name = f"{method}{'_1thread' if serial else ''}_chunk{chunk}"
            cands.append(Candidate(name, settings, lambda s=settings: _aot(_superpose, *args, settings=s)))
    return cands + _no_settings(_superpose, *args)


def tune_fields(
    quick: bool, limits: Mapping[str, Any], sizes: Sequence[tuple[int, int]] | None = None
) -> dict[str, dict[str, Any]]:
    out = {}
    for n, m in sizes or _fields_sizes(quick):
        _log(f"fields.superpose {n} x {m} ...")
        rounds = 5 if _tiny() else (15 if n * m < 1 << 22 else 9)
        entry = choose(
            "fields.superpose",
            n * m,
            fields_candidates(n, m),
            rounds=rounds,
            limits=limits,
            rtol=2e-5,
            params={"points": n, "sources": m, "dtype": "float32"},
        )
        out[f"fields.superpose|{entry['bucket']}"] = entry
    return out


# ------------------------------------------------------------------------------------------ gp
def _gp_sizes(quick: bool) -> list[tuple[int, ...]]:
    from ivhl_jax.core import backend

    if _tiny():
        return [(8, 8, 8)]
    if backend.platform() != "cpu":
        return [(256, 256, 256)]
    return [(64, 64, 64)] if quick else [(64, 64, 64), (128, 128, 128)]


def tune_gp(quick: bool, limits: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The GP Strang step (harmonic trap, g = 100, dt = 1e-3, complex64): K steps merged into one run (the
    default of a trajectory observed every K steps) vs K single steps, and XLA's FFT vs the host FFT."""
    from ivhl_jax.core import backend
    from ivhl_jax.numerics.rollout import trajectory
    from ivhl_jax.physics import condensate as C

    def observe_nothing(state, params):
        return None

    out = {}
    for shape in _gp_sizes(quick):
        steps = 4 if _tiny() else 10
        _log(f"gp step {'x'.join(map(str, shape))} ({steps} steps per call) ...")
        grid = C.Grid.uniform(shape, [0.1 * n for n in shape])

        def build(fft: str, merged: bool, grid=grid, steps=steps, cached=False):
            every = steps if merged else 1
            system = C.GPSystem(grid, C.harmonic(grid), 100.0, fft=fft)
            stepper = C.strang(system, 1e-3)
            psi = stepper.init(C.gaussian(grid))
            return _aot(
                lambda p: trajectory(stepper, p, steps, save_every=every, observe=observe_nothing)[0],
                psi,
                cached=cached,
            )

        cands = [
            Candidate("xla_merged", {"gp_fft": "xla", "gp_merged": True}, lambda: build("xla", True), True),
            Candidate("xla_step_by_step", {"gp_fft": "xla", "gp_merged": False}, lambda: build("xla", False)),
        ]
        if backend.defaults().host_fft:
            try:
                import ducc0  # noqa: F401

                cands.append(
                    Candidate("ducc_merged", {"gp_fft": "ducc", "gp_merged": True}, lambda: build("ducc", True))
                )
            except ImportError:
                _log("  (ducc0 not installed: the host FFT is not a candidate here)")
        if _VERIFY["on"]:
            cands.append(Candidate("no_settings_with_cache", {}, lambda: build("xla", True, cached=True)))
        size = int(np.prod(shape))
        entry = choose(
            "condensate.strang",
            size,
            cands,
            rounds=5 if _tiny() else 9,
            limits=limits,
            rtol=1e-4,
            params={"shape": list(shape), "steps_per_call": steps, "dtype": "complex64"},
        )
        entry["ideal_bytes_per_step"] = 3 * 2 * 8 * size
        entry["fraction_of_bandwidth_ideal"] = steps * 3 * 2 * 8 * size / entry["median_s"] / 1e9 / limits["copy_gbps"]
        out[f"condensate.strang|{entry['bucket']}"] = entry
    out.update(tune_gp_layouts(quick, limits))
    return out


def gp_layout_meshes(devices: int) -> list[str]:
    """The mesh settings (:func:`ivhl_jax.numerics.distributed_fft.parse_mesh`) over all ``devices``: the slab
    ``"n"`` and every pencil ``"a x b"`` with a, b > 1 (none for one device)."""
    if devices < 2:
        return []
    return [str(devices)] + [f"{a}x{devices // a}" for a in range(2, devices) if devices % a == 0]


def tune_gp_layouts(quick: bool, limits: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """With more than one device: the GP Strang step on a 3-D grid with ψ on one device against every
    distributed-FFT layout over all devices (slab, pencils; :func:`gp_layout_meshes`), each output checked
    against the one-device run. The winner is stored as ``condensate.layout|<n>dev,<grid>``: a measurement (the
    mesh is the caller's choice, ``GPSystem(layout=...)`` / ``--mesh``; no default reads it)."""
    import jax

    from ivhl_jax.numerics import distributed_fft
    from ivhl_jax.numerics.rollout import trajectory
    from ivhl_jax.physics import condensate as C

    ndev = jax.device_count()
    meshes = gp_layout_meshes(ndev)
    if not meshes:
        _note("gp", "one device visible: no slab/pencil layout to time (the layouts need a mesh of >= 2 devices)")
        return {}

    def observe_nothing(state, params):
        return None

    out = {}
    for shape in _gp_sizes(quick):
        steps = 4 if _tiny() else 10
        grid = C.Grid.uniform(shape, [0.1 * n for n in shape])
        _log(f"gp layouts {'x'.join(map(str, shape))} on {ndev} devices: one device, {', '.join(meshes)} ...")

        def build(mesh: str | None, grid=grid, steps=steps):
            layout = None if mesh is None else distributed_fft.parse_mesh(mesh, grid.ndim)
            system = C.GPSystem(grid, C.harmonic(grid), 100.0, layout=layout)
            stepper = C.strang(system, 1e-3)
            psi = stepper.init(C.gaussian(grid))
            return _aot(lambda p: trajectory(stepper, p, steps, save_every=steps, observe=observe_nothing)[0], psi)

        cands = [Candidate("one_device", {"gp_layout": "none", "mesh": "1"}, lambda: build(None), default=True)]
        cands += [
            Candidate(
                f"{'slab' if 'x' not in m else 'pencil'}_{m}",
                {"gp_layout": "slab" if "x" not in m else "pencil", "mesh": m},
                lambda m=m: build(m),
            )
            for m in meshes
        ]
        entry = choose(
            "condensate.layout",
            int(np.prod(shape)),
            cands,
            rounds=5 if _tiny() else 9,
            limits=limits,
            rtol=1e-4,
            params={"shape": list(shape), "devices": ndev, "steps_per_call": steps, "dtype": "complex64"},
        )
        entry["bucket"] = f"{ndev}dev,{'x'.join(map(str, shape))}"
        entry["note"] = (
            "a measurement: the layout is the caller's choice (GPSystem(layout=...), --mesh); no default "
            "reads this entry"
        )
        out[f"condensate.layout|{entry['bucket']}"] = entry
    return out


# ------------------------------------------------------------------------------------------ cdt
def host_kernels_cached() -> bool:
    """Whether numba's disk cache holds a compiled, current version of the CDT host engine's kernel (its index
    file exists and matches the source file); False when it cannot be read or numba is missing. Reads files
    only: nothing is compiled."""
    try:
        from ivhl_jax.physics.cdt import host_kernels
    except Exception:  # noqa: BLE001 - numba missing or broken: nothing cached
        return False
    return _numba_cached(host_kernels.run_stream)


def _numba_cached(dispatcher: Any) -> bool:
    """Whether numba's disk cache has an entry for a ``cache=True`` dispatcher that matches its current source
    (numba's own index check: file stamp and numba version), without compiling anything."""
    try:
        return bool(dispatcher._cache._cache_file._load_index())
    except Exception:  # noqa: BLE001 - numba internals differ between versions: treat as not cached
        return False


def tune_cdt(quick: bool, limits: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The CDT engine on one chain (T = 16, N2 = 512 volume-fixed, 10 N2 attempts per call). The
    engines draw different random numbers, so each is checked by the Euler relation of a torus triangulation
    (N2 = 2 N0) and the volume window instead of equal outputs."""
    import jax

    from ivhl_jax.physics import cdt
    from ivhl_jax.physics.cdt import host as cdt_host

    volume = 128 if _tiny() else 512
    attempts = 2 * volume if _tiny() else 10 * volume
    chains = 1

    def build(engine: str):
        stepper = cdt.metropolis(cdt.LN2, eps=0.02, target=volume, attempts_per_sweep=attempts, engine=engine)
        keys = jax.random.split(jax.random.key(0), chains)
        state = jax.vmap(lambda k: stepper.init(k, 16, volume // 32, volume))(keys)
        return _aot(lambda c: jax.vmap(stepper.step)(c), state)

    def check(out) -> str | None:
        st = jax.tree.map(lambda x: np.asarray(x)[0], out.geometry)  # the one chain
        n0 = int(st.n0)
        if bool(st.overflow):
            return "the vertex buffer overflowed"
        if int(np.sum(st.lengths)) != n0:
            return f"slice lengths sum to {int(np.sum(st.lengths))}, not N0 = {n0}"
        live = np.asarray(st.vperm)[:n0]
        right = np.asarray(st.vright)[live]
        vtime = np.asarray(st.vtime)
        if not np.isin(right, live).all() or not np.array_equal(vtime[right], vtime[live]):
            return "a live vertex's right neighbour is dead or on another slice"
        if abs(2 * n0 - volume) > 0.5 * volume or int(np.sum(st.accepts)) == 0:
            return f"N2 = {2 * n0} far from the target {volume}, or no move accepted"
        return None

    from ivhl_jax.core import backend

    table = backend.TABLE.get(backend.platform(), backend.TABLE["portable"]).cdt_engine
    engines = ["jax"]
    if cdt_host.available():
        if quick and not host_kernels_cached():
            _note(
                "cdt",
                "the host engine's numba kernels are not in numba's disk cache here (compiling them takes "
                "minutes): not a candidate in --quick; run the full `ivhl tune --only cdt` to include it",
            )
            if table == "host":
                _note(
                    "cdt",
                    "the table's engine (host) is not a candidate: nothing to compare against, the cdt area "
                    "is skipped in --quick (the table stays)",
                )
                return {}
        else:
            engines.insert(0, "host")
    else:
        _log("  (numba not installed: the host engine is not a candidate here)")
    if backend.platform() == "gpu" and "pallas" in cdt.ENGINES:
        engines.append("pallas")
    _log(
        f"cdt engines {', '.join(engines)} (1 chain, N2 = {volume}; the host engine's first use on a machine "
        "compiles its numba kernels, cached on disk) ..."
    )
    cands = [Candidate(e, {"cdt_engine": e}, lambda e=e: build(e), default=(e == table)) for e in engines]
    if _VERIFY["on"]:
        with _mode("cache"):
            chosen = backend.defaults().cdt_engine
        cands.append(Candidate(f"no_settings_with_cache({chosen})", {}, lambda: build(chosen)))
    entry = choose(
        "cdt.engine",
        None,
        cands,
        rounds=5 if _tiny() else 9,
        limits=limits,
        check=check,
        params={"chains": chains, "target_N2": volume, "attempts_per_call": attempts},
    )
    return {"cdt.engine|all": entry}


# ------------------------------------------------------------------------------------------ attention
def tune_attention(quick: bool, limits: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Causal self-attention forward + backward at B = 4, T = 256, 4 heads of 64 (tiny: T = 32): the dense f32
    kernel vs ``jax.nn.dot_product_attention``; then the bf16 implementation."""
    import jax
    import jax.numpy as jnp

    from ivhl_jax.core import backend
    from ivhl_jax.nn import attention as A

    B, T, N, H = (1, 32, 2, 16) if _tiny() else (4, 256, 4, 64)
    on_gpu = backend.platform() == "gpu"
    row = backend.TABLE.get(backend.platform(), backend.TABLE["portable"])

    def build(dtype, impl, settings, **blocks):
        ks = jax.random.split(jax.random.key(0), 3)
        q, k, v = (jax.random.normal(kk, (B, T, N, H), dtype) for kk in ks)

        def loss(q, k, v):
            o = A.attention(q, k, v, causal=True, implementation=impl, **blocks)
            return jnp.sum(o.astype(jnp.float32) ** 2)

        return _aot(jax.value_and_grad(loss, argnums=(0, 1, 2)), q, k, v, settings=settings)

    def choose_attention(key: str, candidates: list[Candidate], dtype: str) -> dict[str, Any]:
        """One attention choice: the same rounds, shapes and parameters for every key; bf16 outputs compared
        to 3e-2, f32 to 1e-4."""
        half_precision = dtype == "bfloat16"
        return choose(
            key,
            None,
            candidates,
            rounds=5 if _tiny() else 9,
            limits=limits,
            rtol=3e-2 if half_precision else 1e-4,
            dtype="bf16" if half_precision else "f32",
            params={"B": B, "T": T, "N": N, "H": H, "dtype": dtype, "causal": True},
        )

    out = {}
    _log(f"attention f32 {B}x{T}x{N}x{H} causal fwd+bwd ...")
    dense = [
        Candidate(
            f"dense_{d}",
            {"attention_dense": d},
            lambda d=d: build(jnp.float32, "xla", {"attention_dense": d}),
            default=(d == row.attention_dense),
        )
        for d in (True, False)
    ]
    entry = choose_attention("attention.dense", dense, "float32")
    out["attention.dense|all"] = entry
    _log(f"attention bf16 {B}x{T}x{N}x{H} causal fwd+bwd ...")
    impls = ["xla", "chunked"] + (["cudnn", "pallas"] if on_gpu else [])
    half = [
        Candidate(i, {"attention_half": i}, lambda i=i: build(jnp.bfloat16, i, {}), default=(i == row.attention_half))
        for i in impls
    ]
    entry = choose_attention("attention.half", half, "bfloat16")
    out["attention.half|all"] = entry
    # the chunked kernel's key block (attention(block_k=...), default 128): candidates up to T, distinct after the
    # min(block_k, T) the kernel applies
    blocks = sorted({min(b, T) for b in (16, 32, 64, 128, 256, 512)})
    _log(f"attention chunked bf16 {B}x{T}x{N}x{H}: key blocks {blocks} ...")
    chunk = [
        Candidate("block_k_default", {"block_k": min(128, T)}, lambda: build(jnp.bfloat16, "chunked", {}), default=True)
    ]
    chunk += [
        Candidate(f"block_k{b}", {"block_k": b}, lambda b=b: build(jnp.bfloat16, "chunked", {}, block_k=b))
        for b in blocks
        if b != min(128, T)
    ]
    entry = choose_attention("attention.chunk_block", chunk, "bfloat16")
    entry["note"] = (
        "a measurement: attention(block_k=...) is the caller's argument (default 128); no default reads this entry"
    )
    out["attention.chunk_block|all"] = entry
    if not on_gpu:
        _note(
            "attention",
            "Pallas attention block sizes: not timed on this platform (the Pallas GPU kernel compiles "
            "only on a GPU; elsewhere it runs in the interpreter, which times nothing real)",
        )
        return out
    tiles = sorted(
        {
            (min(A.pallas_tile(bq), A.pallas_tile(T)), min(A.pallas_tile(bk), A.pallas_tile(T)))
            for bq, bk in ((32, 32), (64, 64), (64, 128), (128, 64), (128, 128))
        }
    )
    _log(f"attention pallas bf16 {B}x{T}x{N}x{H}: (block_q, block_k) {tiles} ...")
    pallas = [
        Candidate(
            f"pallas_q{bq}_k{bk}",
            {"block_q": bq, "block_k": bk},
            lambda bq=bq, bk=bk: build(jnp.bfloat16, "pallas", {}, block_q=bq, block_k=bk, interpret=False),
            default=(bq, bk) == (min(128, A.pallas_tile(T)), min(128, A.pallas_tile(T))),
        )
        for bq, bk in tiles
    ]
    entry = choose_attention("attention.pallas_blocks", pallas, "bfloat16")
    entry["note"] = (
        "a measurement: attention(implementation='pallas', block_q=..., block_k=...) are the caller's "
        "arguments (default 128); no default reads this entry"
    )
    out["attention.pallas_blocks|all"] = entry
    return out


# ------------------------------------------------------------------------------------------ transformer
def tune_transformer(quick: bool, limits: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """One AdamW train step of a small causal LM (2 layers, d = 128; tiny: d = 32): unrolled vs scanned
    layers. The loss and updated parameters must agree."""
    import jax
    import jax.numpy as jnp

    from ivhl_jax.core import backend

    try:
        from ivhl_jax.models import transformer as TM
    except ImportError as e:
        raise RuntimeError(f"the transformer area needs ivhl_jax.models ({e})") from e
    row = backend.TABLE.get(backend.platform(), backend.TABLE["portable"])
    d, layers, T, B = (32, 2, 16, 2) if _tiny() else (128, 2, 128, 4)

    def build(loop: str):
        cfg = TM.preset("tiny", d_model=d, n_layers=layers, d_ff=4 * d, max_len=T + 1, layer_loop=loop)
        params = TM.init_params(cfg, jax.random.key(0))
        tokens = jnp.asarray(np.random.default_rng(0).integers(0, cfg.vocab_size, (B, T + 1)), jnp.int32)
        loss_fn = TM.lm_loss_fn(cfg)

        def step(p, t):
            return jax.value_and_grad(lambda p: loss_fn(p, t, None, None)[0])(p)

        return _aot(step, params, tokens)

    _log(f"transformer layer loop (d={d}, {layers} layers, B={B}, T={T}) ...")
    cands = [
        Candidate(
            loop,
            {"transformer_layer_loop": loop},
            lambda loop=loop: build(loop),
            default=(loop == row.transformer_layer_loop),
        )
        for loop in ("unrolled", "scan")
    ]

    def value_only(out):
        loss = float(out[0])  # the parameter trees of the two loops differ in layout; the loss at init is ~ln V
        return None if np.isfinite(loss) and abs(loss - np.log(256)) < 1.0 else f"loss {loss} at init is not ~ln 256"

    entry = choose(
        "transformer.layer_loop",
        None,
        cands,
        rounds=5 if _tiny() else 7,
        limits=limits,
        check=value_only,
        params={"d_model": d, "layers": layers, "batch": B, "T": T},
    )
    return {"transformer.layer_loop|all": entry}


# ------------------------------------------------------------------------------------------ mera
def tune_mera(quick: bool, limits: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """MERA host threads: not tunable in one process (XLA's CPU thread pool is fixed at backend start)."""
    raise RuntimeError(
        "the mera area needs a process per thread count (XLA:CPU fixes its thread pool at backend "
        "start); bench/results/mera_busy_host.json holds the measurement behind the table"
    )


# ------------------------------------------------------------------------------------------ xla flags
_FLAG_WORKER = r"""
import json, sys, time
import numpy as np
import jax
from ivhl_jax.bench import tune as T
calls = {}
for (n, m) in T._fields_sizes(True)[-1:]:
    args = T._fields_inputs(n, m)
    f = jax.jit(T._superpose).lower(*args).compile()
    calls[f"fields_{n}x{m}"] = (f, args)
from ivhl_jax.physics import condensate as C
from ivhl_jax.numerics.rollout import trajectory
shape = T._gp_sizes(True)[0]
grid = C.Grid.uniform(shape, [0.1 * s for s in shape])
st = C.strang(C.GPSystem(grid, C.harmonic(grid), 100.0), 1e-3)
psi = st.init(C.gaussian(grid))
g = jax.jit(lambda p: trajectory(st, p, 4, save_every=4, observe=lambda s, q: None)[0]).lower(psi).compile()
calls["gp"] = (g, (psi,))
np.savez(sys.argv[1], **{k: np.asarray(f(*a)) for k, (f, a) in calls.items()})
print(json.dumps({"ready": list(calls)}), flush=True)
for line in sys.stdin:
    if line.strip() != "round":
        break
    times = {}
    for k, (f, a) in calls.items():
        t0 = time.perf_counter(); jax.block_until_ready(f(*a)); times[k] = time.perf_counter() - t0
    print(json.dumps(times), flush=True)
"""


def tune_xla(quick: bool, limits: Mapping[str, Any] | None = None) -> dict[str, dict[str, Any]]:
    """XLA:CPU flags: one worker process per configuration (flags are read at backend start), the two driven in
    turn round by round (one call of each kernel per round: the field kernel and a GP run), outputs compared to
    the default configuration's. A flag is kept when the kernels' per-round time ratios (flag / default, median per
    kernel) have a geometric mean below 0.95 and none is above 1.05 (it pays and slows nothing down)."""
    from ivhl_jax.core import tuning

    fp = tuning.host_fingerprint()
    if "avx512f" not in fp["isa"]:
        _log("xla: no AVX-512 on this CPU; XLA's default vector width is the only candidate")
        return {
            "xla.flags|all": {
                "op": "xla.flags",
                "bucket": "all",
                "settings": {"xla_flags": ""},
                "winner": "xla_default",
                "why": "no AVX-512 flags in /proc/cpuinfo",
            }
        }
    base = " ".join(f for f in os.environ.get("XLA_FLAGS", "").split() if not f.startswith("--xla_cpu_prefer_vector"))
    configs = {"xla_default": base, "vector_width_512": (base + " " + _VECTOR_FLAG).strip()}
    rounds = 3 if _tiny() else 15
    arrays: dict[str, Any] = {}
    wall: dict[str, dict[str, list[float]]] = {name: {} for name in configs}
    with tempfile.TemporaryDirectory() as tmp:
        procs = {}
        try:
            for name, flags in configs.items():
                _log(f"xla: starting a worker with XLA_FLAGS={flags!r} ...")
                env = {**os.environ, "XLA_FLAGS": flags, "IVHL_TUNING": "frozen"}
                procs[name] = subprocess.Popen(
                    [sys.executable, "-c", _FLAG_WORKER, os.path.join(tmp, name + ".npz")],
                    env=env,
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                )
            for name, proc in procs.items():
                line = proc.stdout.readline() if proc.stdout else ""
                if not line:
                    raise RuntimeError(f"xla worker {name} failed: {proc.communicate(timeout=60)[1].strip()[-400:]}")
                with np.load(os.path.join(tmp, name + ".npz")) as z:
                    arrays[name] = {k: z[k] for k in z.files}
            _log(f"xla: {rounds} interleaved rounds ...")
            for _ in range(rounds + 1):  # the first round warms up
                for name, proc in procs.items():
                    time.sleep(0.005)
                    assert proc.stdin is not None and proc.stdout is not None
                    proc.stdin.write("round\n")
                    proc.stdin.flush()
                    for k, v in json.loads(proc.stdout.readline()).items():
                        wall[name].setdefault(k, []).append(v)
        finally:
            for proc in procs.values():
                with contextlib.suppress(Exception):
                    proc.communicate(input="quit\n", timeout=60)
    rejected = {}
    for name in configs:
        for k, ref in arrays["xla_default"].items():
            ok, err = _equal(arrays[name][k], ref, 1e-4)
            if not ok:
                rejected[name] = f"{k} differs from XLA's default by {err:.2e}"
    from ivhl_jax.bench.harness import summarize

    kernels = list(wall["xla_default"])
    ratios = {
        k: float(np.median(np.asarray(wall["vector_width_512"][k][1:]) / np.asarray(wall["xla_default"][k][1:])))
        for k in kernels
    }
    geo = float(np.exp(np.mean(np.log(list(ratios.values())))))
    pays = "vector_width_512" not in rejected and geo < 0.95 and all(r < 1.05 for r in ratios.values())
    winner = "vector_width_512" if pays else "xla_default"
    _log(
        f"  xla flags: {_VECTOR_FLAG} per-round time ratio { ({k: round(v, 3) for k, v in ratios.items()}) } -> "
        f"{winner}"
    )
    return {
        "xla.flags|all": {
            "op": "xla.flags",
            "bucket": "all",
            "winner": winner,
            "rounds": rounds,
            "settings": {"xla_flags": _VECTOR_FLAG if pays else ""},
            "candidates": {
                name: {
                    "xla_flags": flags,
                    **{k: summarize(v[1:]) for k, v in wall[name].items()},
                    **({"rejected": rejected[name]} if name in rejected else {}),
                }
                for name, flags in configs.items()
            },
            "ratio_flag_over_default_per_round_median": ratios,
            "geometric_mean_ratio": geo,
            "rule": "kept when the per-round time ratios (flag / default; median per kernel) have a geometric mean "
            "below 0.95 and none is above 1.05",
        }
    }


# ------------------------------------------------------------------------------------------ driver
_AREA_FUNCS: dict[str, Callable[[bool, Mapping[str, Any]], dict[str, dict[str, Any]]]] = {
    "fields": tune_fields,
    "gp": tune_gp,
    "cdt": tune_cdt,
    "attention": tune_attention,
    "transformer": tune_transformer,
    "mera": tune_mera,
}


def check_areas(only: Sequence[str] | None, quick: bool) -> list[str]:
    """The areas to run, in order; an unknown name is a one-line ValueError naming it and the choices."""
    if not only:
        return list(QUICK_AREAS if quick else AREAS)
    names = [a.strip() for item in only for a in str(item).split(",") if a.strip()]
    unknown = [a for a in names if a not in AREAS]
    if unknown:
        raise ValueError(f"unknown tuning area(s) {unknown}; choose from {', '.join(AREAS)}")
    return [a for a in AREAS if a in names]


def tune(
    only: Sequence[str] | None = None,
    *,
    quick: bool = True,
    save: bool = True,
    log: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Tune the ``only`` areas (default: the quick set, or all without ``quick``) on this machine in this
    process; returns ``{"limits", "entries", "errors", "cache"}`` and, with ``save``, merges the entries into the
    tuning cache (``cache`` is its path). The ``xla`` area runs its candidates in subprocesses; its result
    applies to processes started after it."""
    import jax

    from ivhl_jax.core import backend, tuning

    areas = check_areas(only, quick)
    platform = backend.platform()
    t0 = time.perf_counter()
    _log(f"measuring this machine's limits ({platform}: {jax.devices()[0].device_kind}) ...")
    limits = measure_limits(quick)
    _log(
        f"  copy {limits['copy_gbps']:.1f} GB/s, matmul f32 {limits['matmul_f32_tflops']:.3f} TFLOP/s, "
        f"bf16 {limits['matmul_bf16_tflops']:.3f} TFLOP/s"
    )
    entries: dict[str, dict[str, Any]] = {}
    errors: dict[str, str] = {}
    _NOTES.clear()
    for area in areas:
        a0 = time.perf_counter()
        try:
            if area == "xla":
                if platform != "cpu":
                    _log("xla: compiler-flag candidates exist for XLA:CPU only; skipped on this platform")
                    continue
                found = tune_xla(quick, limits)
            else:
                found = _AREA_FUNCS[area](quick, limits)
        except Exception as e:  # noqa: BLE001 - one area failing must not lose the others
            errors[area] = f"{type(e).__name__}: {str(e)[:300]}"
            _log(f"{area}: not tuned ({errors[area]})")
            continue
        for entry in found.values():
            entry["command"] = " ".join(["ivhl tune"] + sys.argv[2:]) if sys.argv[1:2] == ["tune"] else "ivhl_jax.tune"
            entry["area_wall_s"] = time.perf_counter() - a0
        entries.update(found)
        if save:  # after every area: an interrupted run keeps what it measured
            path = tuning.record(platform, found, limits=limits)
            _log(
                f"{area} done in {time.perf_counter() - a0:.0f} s (total {time.perf_counter() - t0:.0f} s); stored "
                f"in {path}"
            )
        else:
            _log(f"{area} done in {time.perf_counter() - a0:.0f} s (total {time.perf_counter() - t0:.0f} s)")
    result: dict[str, Any] = {
        "platform": platform,
        "fingerprint": tuning.fingerprint(platform),
        "limits": limits,
        "entries": entries,
        "errors": errors,
        "notes": {a: list(n) for a, n in _NOTES.items()},
        "wall_s": time.perf_counter() - t0,
    }
    if save and entries:
        result["cache"] = tuning.cache_path(platform)
    return result


def tune_op(op: str, size: int, platform: str) -> None:
    """``IVHL_TUNING=auto``: tune one op at one size and store it (only ``fields.superpose`` is size-bucketed)."""
    from ivhl_jax.core import tuning

    if op != "fields.superpose":
        return
    limits = (tuning.load(platform) or {}).get("limits") or measure_limits(True)
    # a square-ish problem with the same pair count: points x 64 sources
    m = 64 if size >= 64 * 64 else max(1, int(np.sqrt(size)))
    entries = tune_fields(True, limits, sizes=[(max(1, size // m), m)])
    tuning.record(platform, entries, limits=limits)


def main(argv: Sequence[str] | None = None) -> int:
    """``ivhl tune [--quick] [--only AREA[,AREA]] [--export FILE]``."""
    import argparse

    p = argparse.ArgumentParser(
        prog="ivhl tune",
        description="Measure this machine's best settings and store them in "
        "the tuning cache (read by ivhl_jax.core.backend.defaults before the table).",
    )
    p.add_argument("--quick", action="store_true", help="one or two sizes per area (under 5 min on a 2-core CPU)")
    p.add_argument("--only", action="append", help=f"areas, comma-separated or repeated; from {', '.join(AREAS)}")
    p.add_argument("--export", help="also write the full result (limits, every candidate) to this JSON file")
    p.add_argument("--no-save", action="store_true", help="measure and print, store nothing")
    p.add_argument(
        "--verify",
        action="store_true",
        help="after tuning: time the call with no settings (the tuning "
        "cache in force) against every candidate again, storing nothing (implies --no-save)",
    )
    a = p.parse_args(argv)
    if a.verify:
        a.no_save = True
        _VERIFY["on"] = True
    try:
        areas = check_areas(a.only, a.quick)
    except ValueError as e:
        print(f"ivhl tune: {e}", file=sys.stderr)
        return 2
    from ivhl_jax.core import tuning

    if not a.no_save:
        folder = tuning.cache_dir()
        try:
            os.makedirs(folder, exist_ok=True)
            writable = os.access(folder, os.W_OK)
        except OSError:
            writable = False
        if not writable:
            print(
                f"ivhl tune: the tuning cache folder {folder} is not writable; set IVHL_CACHE_DIR to a writable "
                "folder (the backend table stays in force)",
                file=sys.stderr,
            )
            return 2
    rest = [x for x in areas if x != "xla"]
    result: dict[str, Any] = {"entries": {}, "errors": {}}
    if "xla" in areas:
        # Flags act at backend start: measure them first (in subprocesses), then tune the rest in a fresh process
        # that starts with the winning flags applied (import ivhl_jax applies them from the cache).
        first = tune(["xla"], quick=a.quick, save=not a.no_save)
        result = first
        if rest and not a.no_save and first["entries"]:
            cmd = [sys.executable, "-m", "ivhl_jax.cli", "tune", "--only", ",".join(rest)]
            cmd += ["--quick"] if a.quick else []
            tmp = tempfile.NamedTemporaryFile(suffix=".json", delete=False)
            tmp.close()
            cmd += ["--export", tmp.name]
            _log("continuing in a fresh process with the measured XLA flags")
            proc = subprocess.run(cmd, env=dict(os.environ))
            try:
                with open(tmp.name, encoding="utf-8") as f:
                    child = json.load(f)
                result["entries"].update(child.get("entries", {}))
                result["errors"].update(child.get("errors", {}))
                result.setdefault("notes", {}).update(child.get("notes", {}))
                result["limits_child"] = child.get("limits")
                result["xla_flags_child"] = child.get("xla_flags")
            except (OSError, ValueError):
                result["errors"]["child"] = f"the tuning process exited with {proc.returncode}"
            finally:
                os.remove(tmp.name)
        elif rest:
            child = tune(rest, quick=a.quick, save=not a.no_save)
            result["entries"].update(child["entries"])
            result["errors"].update(child["errors"])
            result.setdefault("notes", {}).update(child.get("notes", {}))
    else:
        result = tune(areas, quick=a.quick, save=not a.no_save)
    result["xla_flags"] = os.environ.get("XLA_FLAGS", "")
    _summary(result)
    if a.export:
        from ivhl_jax.bench.harness import write_results

        command = "ivhl tune " + " ".join(sys.argv[2:] if argv is None else argv)
        doc = {"fingerprint_of_this_machine": tuning.host_fingerprint(), "loadavg": os.getloadavg(), **result}
        os.makedirs(os.path.dirname(os.path.abspath(a.export)), exist_ok=True)
        write_results(a.export, json.loads(json.dumps(doc, default=str)), command=command)
        print(f"wrote {a.export}")
    return 1 if result["errors"] else 0


def _summary(result: Mapping[str, Any]) -> None:
    print(f"\n{'op [bucket]':<34} {'winner':<28} {'ms':>9} {'IQR':>5} {'table/best':>10} {'roofline':>9}")
    for key, e in sorted(result["entries"].items()):
        ms = f"{1e3 * e['median_s']:.3f}" if "median_s" in e else "-"
        iqr = f"{100 * e['spread']:.0f}%" if "spread" in e else "-"
        ratio = f"{e['table_default_over_best']:.2f}" if "table_default_over_best" in e else "-"
        roof = e.get("roofline", {}).get("fraction")
        print(
            f"{key:<34} {str(e.get('winner')):<28} {ms:>9} {iqr:>5} {ratio:>10} "
            f"{(f'{100 * roof:.1f}%' if roof is not None else '-'):>9}"
        )
    for area, err in result["errors"].items():
        print(f"{area}: not tuned: {err}")
    for area, notes in result.get("notes", {}).items():
        for note in notes:
            print(f"{area}: note: {note}")


if __name__ == "__main__":
    sys.exit(main())
