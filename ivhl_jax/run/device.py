"""What are we running on, and how is compilation configured.

* :func:`device_report`: platform, devices, memory, library versions and XLA flags (recorded in
  every benchmark JSON and shown by ``ivhl info``).
* :func:`enable_compilation_cache`: opt-in persistent cache of compiled executables across
  processes (saves the compile time of repeated CLI runs and notebook restarts).
* :func:`configure`: compile/numerics settings; it reports for each one whether it took effect on
  this backend (GPU-only XLA flags are no-ops on CPU, and we say so instead of pretending).
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
import platform
import sys
from typing import Any

import jax

from ivhl_jax.core import backend, host
from ivhl_jax.core.validation import check_scalar

__all__ = [
    "device_report",
    "format_report",
    "enable_compilation_cache",
    "keep_host_memory",
    "limit_host_cores",
    "configure",
]

_LIBS = ("jax", "jaxlib", "flax", "optax", "chex", "orbax-checkpoint", "numpy", "scipy", "torch")


def _versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {"python": sys.version.split()[0]}
    for lib in _LIBS:
        try:
            out[lib] = importlib.metadata.version(lib)
        except importlib.metadata.PackageNotFoundError:
            out[lib] = None
    return out


def _host_memory_bytes() -> dict[str, int | None]:
    info: dict[str, int | None] = {"total": None, "available": None}
    try:
        with open("/proc/meminfo") as f:
            fields = dict(line.split(":", 1) for line in f)
        info["total"] = int(fields["MemTotal"].split()[0]) * 1024
        info["available"] = int(fields["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        pass
    return info


def device_report() -> dict[str, Any]:
    """A JSON-ready description of the backend, devices, memory and versions."""
    devices = jax.devices()
    dev_info = []
    for d in devices:
        entry: dict[str, Any] = {
            "id": d.id,
            "kind": d.device_kind,
            "platform": d.platform,
            "process_index": d.process_index,
        }
        try:
            stats = d.memory_stats()
        except Exception:  # not every backend implements memory_stats
            stats = None
        if stats:
            entry["memory_bytes_limit"] = stats.get("bytes_limit")
            entry["memory_bytes_in_use"] = stats.get("bytes_in_use")
            entry["memory_peak_bytes_in_use"] = stats.get("peak_bytes_in_use")
        dev_info.append(entry)
    return {
        "platform": backend.platform(),
        "device_count": jax.device_count(),
        "local_device_count": jax.local_device_count(),
        "process_count": jax.process_count(),
        "devices": dev_info,
        "host": {
            "cpu": host.facts().cpu_model,
            "cpu_count": backend.machine_cores(),
            "memory_bytes": _host_memory_bytes(),
            "machine": platform.machine(),
            "system": platform.system(),
        },
        "versions": _versions(),
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
        "x64": bool(jax.config.read("jax_enable_x64")),
        "defaults": backend.describe(),
    }


def format_report(report: dict[str, Any] | None = None) -> str:
    """Human-readable multi-line version of :func:`device_report`."""
    r = report or device_report()
    lines = [
        f"platform      {r['platform']}  ({r['device_count']} devices, {r['process_count']} process(es))",
        f"device kind   {r['devices'][0]['kind'] if r['devices'] else '-'}",
        f"host          {r['host']['cpu']} x{r['host']['cpu_count']}",
    ]
    mem = r["host"]["memory_bytes"]
    if mem["total"]:
        gib = 2.0**30
        lines.append(f"host memory   {mem['total'] / gib:.1f} GiB total, {mem['available'] / gib:.1f} GiB available")
    lim = r["devices"][0].get("memory_bytes_limit") if r["devices"] else None
    if lim:
        lines.append(f"device memory {lim / 2**30:.1f} GiB")
    lines.append("versions      " + ", ".join(f"{k} {v}" for k, v in r["versions"].items() if v))
    if r["xla_flags"]:
        lines.append(f"XLA_FLAGS     {r['xla_flags']}")
    if r.get("defaults"):
        lines.append(
            f"defaults on {r['platform']} (ivhl_jax.core.backend: `ivhl tune` measures them; override() or "
            "configure() change them)"
        )
        width = max(len(row["setting"]) for row in r["defaults"])
        lines += [f"  {row['setting']:<{width}}  {row['value']:<14} {row['source']}" for row in r["defaults"]]
    return "\n".join(lines)


#: the default bound of the persistent compilation cache (``jax_compilation_cache_max_size``), in bytes: 2 GiB,
#: room for the compiled programs of every ``ivhl sim``/``ivhl train`` many times over (one is 1-50 MB)
COMPILATION_CACHE_MAX_BYTES = 2 * 1024**3


def enable_compilation_cache(
    directory: str | os.PathLike | None = None,
    *,
    min_compile_time_s: float = 0.5,
    max_size_bytes: int | None = None,
) -> str:
    """Turn on JAX's persistent compilation cache in ``directory`` (default ``~/.cache/ivhl_jax/xla``).

    Executables whose compilation took at least ``min_compile_time_s`` are written there and
    re-used by later processes with the same program, backend and flags. The cache holds at most
    ``max_size_bytes`` (default :data:`COMPILATION_CACHE_MAX_BYTES`, 2 GiB, or ``$IVHL_COMPILATION_CACHE_MAX_BYTES``):
    the folder is trimmed to it here, least recently used entries first, and JAX keeps it there as it writes
    (``jax_compilation_cache_max_size``: it evicts the least recently used entries, under a lock of the folder
    that the ``filelock`` package provides), so the folder never grows without bound. Returns the directory.
    """
    check_scalar(min_compile_time_s, "min_compile_time_s", nonnegative=True)
    if max_size_bytes is None:
        text = os.environ.get("IVHL_COMPILATION_CACHE_MAX_BYTES", "")
        try:
            max_size_bytes = int(text) if text else COMPILATION_CACHE_MAX_BYTES
        except ValueError:
            raise ValueError(
                f"IVHL_COMPILATION_CACHE_MAX_BYTES must be a whole number of bytes, got {text!r}"
            ) from None
    check_scalar(max_size_bytes, "max_size_bytes", integer=True, minimum=1)
    path = os.path.abspath(os.path.expanduser(os.fspath(directory or "~/.cache/ivhl_jax/xla")))
    os.makedirs(path, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", path)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", float(min_compile_time_s))
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    _trim_cache(path, int(max_size_bytes))
    jax.config.update("jax_compilation_cache_max_size", int(max_size_bytes))  # JAX evicts as it writes
    return path


def _trim_cache(path: str, max_bytes: int) -> None:
    """Delete the least recently used entries of the cache folder ``path`` until the rest holds at most
    ``max_bytes``, under JAX's own lock of the folder (``.lockfile``). An entry is JAX's pair ``<key>-cache``
    and ``<key>-atime`` (its last use, nanoseconds): the ``-cache`` file goes first, so JAX never finds one
    without its ``-atime``. Any other file counts as an entry of its own (by access, else modification time)."""
    import filelock

    with filelock.FileLock(os.path.join(path, ".lockfile")):
        entries = []
        for name in os.listdir(path):
            full = os.path.join(path, name)
            if name == ".lockfile" or name.endswith("-atime") or not os.path.isfile(full) or os.path.islink(full):
                continue
            st = os.stat(full)
            used, size, files = max(st.st_atime, st.st_mtime) * 1e9, st.st_size, [full]
            if name.endswith("-cache"):
                atime = full[: -len("-cache")] + "-atime"
                with contextlib.suppress(OSError, ValueError):
                    with open(atime, "rb") as f:
                        used = int.from_bytes(f.read(), "little")
                    size += os.path.getsize(atime)
                    files.append(atime)
            entries.append((used, size, files))
        total = sum(size for _, size, _ in entries)
        for _, size, files in sorted(entries):
            if total <= max_bytes:
                break
            for full in files:
                with contextlib.suppress(OSError):  # another process removed it
                    os.remove(full)
            total -= size


_M_TRIM_THRESHOLD, _M_MMAP_MAX, _M_ARENA_MAX = -1, -4, -8  # glibc <malloc.h>


def keep_host_memory() -> str:
    """Make glibc's malloc keep freed memory for reuse, so XLA:CPU stops faulting its buffers in on every call.

    XLA:CPU takes the temporary buffer of each execution (every intermediate of a jitted call, up to gigabytes
    for a transformer train step) from ``malloc`` and frees it when the call ends. glibc serves a block that
    large with a fresh ``mmap`` (from a worker thread's arena, always) and unmaps it on ``free``, so every call
    faults the whole buffer in again, page by page, in kernel time. This sets ``M_ARENA_MAX = 1`` (every thread
    allocates from the main heap), ``M_MMAP_MAX = 0`` (no mmap'd blocks) and ``M_TRIM_THRESHOLD = -1`` (the heap
    is never trimmed; mallopt's largest finite threshold, 2 GiB, is below a large step's buffer). The gain
    grows with the buffer: compare a step's time and its minor page faults (``/proc/self/stat``) with and
    without ``IVHL_KEEP_HOST_MEMORY=1``. Costs: freed memory is reused, never returned to the system, and the heap grows
    for the first few calls until the freed blocks fit the next ones; threads share one malloc arena (host code
    that allocates from many threads at once contends). Hence opt-in: the ``ivhl`` command line calls it
    when ``IVHL_KEEP_HOST_MEMORY=1``.

    Process-wide, and only effective before JAX starts its CPU backend (the first computation): threads that
    have allocated keep their own arenas: in a notebook call it before any JAX computation.
    Returns ``"applied"`` or why it was not (not glibc, backend already started).
    """
    import ctypes
    import ctypes.util

    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return f"not applied: needs glibc on Linux ({platform.system()}, {platform.libc_ver()[0] or 'no glibc'})"
    if backend.started():
        return (
            "not applied: JAX's backend has already started (its threads keep their own malloc arenas); "
            "call keep_host_memory() before the first JAX computation"
        )
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    ok = [libc.mallopt(opt, val) for opt, val in ((_M_ARENA_MAX, 1), (_M_MMAP_MAX, 0), (_M_TRIM_THRESHOLD, -1))]
    return "applied" if all(ok) else f"not applied: mallopt refused ({ok})"


def limit_host_cores(n: int) -> str:
    """Run this process on ``n`` of the CPU cores it may use (the first ``n`` of its affinity mask), so that
    XLA:CPU, which sizes its thread pools from that mask when JAX starts its backend, runs on ``n`` threads.

    Why: a program of many small operations (a MERA sweep up to χ ≈ 12) gains little from splitting each
    operation over threads, and loses badly when another process takes one of the cores: each split operation
    waits for its descheduled half.

    Only effective before JAX starts its CPU backend (the first computation): the calling thread and every thread
    started afterwards (XLA's) stay on those cores; threads started before (NumPy's BLAS pool) keep their mask.
    Linux only (``os.sched_setaffinity``). Returns ``"applied: cores [...]"`` or why it was not (backend started,
    not Linux, already on ``n`` cores or fewer).
    """
    check_scalar(n, "n", integer=True, minimum=1)
    if not hasattr(os, "sched_setaffinity"):
        return f"not applied: needs os.sched_setaffinity (Linux), not {platform.system()}"
    allowed = backend.host_core_ids()
    if len(allowed) <= int(n):
        return f"not applied: the process already runs on {len(allowed)} core(s) {allowed}"
    if backend.started():
        return (
            "not applied: JAX's backend has already started (XLA sized its thread pools when it did); "
            "call limit_host_cores() before the first JAX computation, or run under `taskset`"
        )
    cores = allowed[: int(n)]
    os.sched_setaffinity(0, cores)
    return f"applied: cores {cores}"


def configure(
    *,
    matmul_precision: str | None = None,
    enable_x64: bool | None = None,
    debug_nans: bool | None = None,
    gpu_autotune_level: int | None = None,
) -> dict[str, str]:
    """Apply compile/numerics settings; returns {setting: what happened}.

    Args:
      matmul_precision: ``"default"``, ``"high"`` or ``"highest"`` (``jax_default_matmul_precision``);
        affects TPU/GPU TF32/bf16 passes, a no-op for f32 matmuls on CPU.
      enable_x64: enable float64/int64 (``jax_enable_x64``).
      debug_nans: re-run any op producing NaN op-by-op and raise (``jax_debug_nans``); slow.
      gpu_autotune_level: XLA GPU autotuning level 0-4; must be set before the backend starts and
        only affects GPUs.
    """
    out: dict[str, str] = {}
    plat = backend.platform()
    if matmul_precision is not None:
        if matmul_precision not in ("default", "high", "highest"):
            raise ValueError(f"matmul_precision must be 'default', 'high' or 'highest', got {matmul_precision!r}")
        jax.config.update("jax_default_matmul_precision", matmul_precision)
        out["matmul_precision"] = (
            "applied" if plat != "cpu" else "applied (no effect on CPU: f32 matmuls are always full precision)"
        )
    if enable_x64 is not None:
        jax.config.update("jax_enable_x64", bool(enable_x64))
        out["enable_x64"] = "applied"
    if debug_nans is not None:
        jax.config.update("jax_debug_nans", bool(debug_nans))
        out["debug_nans"] = "applied"
    if gpu_autotune_level is not None:
        if not 0 <= int(gpu_autotune_level) <= 4:
            raise ValueError(f"gpu_autotune_level must be in 0..4, got {gpu_autotune_level}")
        if plat != "gpu":
            out["gpu_autotune_level"] = f"no-op: backend is {plat}, not gpu"
        else:
            out["gpu_autotune_level"] = (
                "not applied: XLA_FLAGS are read when the GPU backend starts; set "
                f"XLA_FLAGS=--xla_gpu_autotune_level={int(gpu_autotune_level)} "
                "before importing jax"
            )
    return out
