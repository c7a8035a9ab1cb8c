"""ivhl_jax.run.device: the device report (and `ivhl info`), the persistent compilation cache, the host
memory and core settings."""

from __future__ import annotations

import os
import subprocess
import sys

import jax
import pytest

from ivhl_jax.core import backend

ON_CPU = pytest.mark.skipif(
    jax.default_backend() != "cpu", reason="the suite emulates 8 CPU devices; an accelerator has as many as it has"
)


@ON_CPU
def test_device_report_and_cli_info(capsys):
    from ivhl_jax import cli, device

    rep = device.device_report()
    assert rep["device_count"] == 8 and rep["versions"]["jax"] == jax.__version__
    assert "no-op" in device.configure(gpu_autotune_level=2)["gpu_autotune_level"]
    assert cli.main(["info"]) == 0
    out = capsys.readouterr().out
    assert "platform" in out
    # the per-backend defaults in force, each with where it comes from
    assert "fields_chunking" in out and "cdt_engine" in out
    assert [row["setting"] for row in rep["defaults"]] == [row["setting"] for row in backend.describe()]
    assert cli.main(["frobnicate"]) == 2


def test_compilation_cache_writes_entries(tmp_path):
    code = (
        "import jax, jax.numpy as jnp, os, sys\n"
        "from ivhl_jax.run.device import enable_compilation_cache\n"
        f"d = enable_compilation_cache({str(tmp_path)!r}, min_compile_time_s=0)\n"
        "jax.jit(lambda x: jnp.sin(x) @ x.T)(jnp.ones((64, 64))).block_until_ready()\n"
        "print(len(os.listdir(d)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert int(out.stdout.strip().splitlines()[-1]) >= 1


def test_compilation_cache_is_bounded_by_its_documented_default_or_the_given_size(tmp_path):
    """Enabling the cache trims its folder to the bound, least recently used entries first; the default bound is
    the documented 2 GiB."""
    cache = tmp_path / "cache"
    cache.mkdir()
    for i in range(10):  # ten 1 kB entries, entry 0 the least recently used
        (cache / f"entry{i}").write_bytes(b"x" * 1000)
        os.utime(cache / f"entry{i}", (1_000_000 + i, 1_000_000 + i))
    code = (
        "import sys, jax\n"
        "from ivhl_jax.run.device import COMPILATION_CACHE_MAX_BYTES, enable_compilation_cache\n"
        "enable_compilation_cache(sys.argv[1], max_size_bytes=4500)\n"
        "assert COMPILATION_CACHE_MAX_BYTES == 2 * 1024**3\n"
    )
    subprocess.run([sys.executable, "-c", code, str(cache)], capture_output=True, text=True, check=True)
    assert sorted(f.name for f in cache.iterdir()) == [".lockfile", *(f"entry{i}" for i in range(6, 10))]


def test_trimming_removes_jax_entries_whole_and_keeps_its_lock(tmp_path):
    """JAX's entries are ``<key>-cache`` with ``<key>-atime`` (last use in ns, which orders them): an entry goes
    whole, never leaving a ``-cache`` file without its ``-atime`` (JAX's eviction would fail on it)."""
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / ".lockfile").write_bytes(b"")
    for i, used in enumerate([30, 10, 20]):  # entry 1 the least recently used, then entry 2
        (cache / f"k{i}-cache").write_bytes(b"x" * 1000)
        (cache / f"k{i}-atime").write_bytes(used.to_bytes(8, "little"))
    code = (
        "import sys\nfrom ivhl_jax.run.device import enable_compilation_cache\n"
        "enable_compilation_cache(sys.argv[1], max_size_bytes=2100)\n"
    )
    subprocess.run([sys.executable, "-c", code, str(cache)], capture_output=True, text=True, check=True)
    assert sorted(f.name for f in cache.iterdir()) == [".lockfile", "k0-atime", "k0-cache", "k2-atime", "k2-cache"]


_BOUNDED = """
import sys
import jax, jax.numpy as jnp
from ivhl_jax.run.device import enable_compilation_cache
enable_compilation_cache(sys.argv[1], min_compile_time_s=0.0, max_size_bytes=int(sys.argv[2]))
for n in range(1, 13):  # twelve programs, each its own entry
    jax.jit(lambda x: jnp.sin(x) * n + jnp.cumsum(x))(jnp.arange(n, dtype=jnp.float32)).block_until_ready()
"""


@pytest.mark.slow  # three dozen compilations in two processes: about 40 s on two loaded cores
def test_jax_keeps_the_cache_within_its_bound_as_it_writes(tmp_path):
    """With the bound set, JAX evicts the least recently used entries as it writes: twelve programs compiled
    into a cache bounded to about four entries leave at most the bound on disk (an unbounded cache holds all)."""
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    free = tmp_path / "free"
    subprocess.run([sys.executable, "-c", _BOUNDED, str(free), str(10**9)], env=env, check=True)
    sizes = [f.stat().st_size for f in free.glob("*-cache")]
    assert len(sizes) >= 12
    bound = 4 * max(sizes) + 200
    cache = tmp_path / "bounded"
    subprocess.run([sys.executable, "-c", _BOUNDED, str(cache), str(bound)], env=env, check=True)
    kept = [f.stat().st_size for f in cache.glob("*-cache")]
    assert 1 <= len(kept) < len(sizes) and sum(kept) <= bound


_FAULTS = """
import resource, sys
import jax, jax.numpy as jnp
from ivhl_jax.run.device import keep_host_memory
status = keep_host_memory() if sys.argv[1] == "keep" else "default"
# XLA's temporary buffers of a column cumsum of 4096 x 2048 floats: 64 MiB (16 k pages), 0.04 s a call
f = jax.jit(lambda x: jnp.cumsum(x, axis=0)[-1])
x = jnp.ones((4096, 2048), jnp.float32)
faults = []
for _ in range(24):  # with keep_host_memory the heap grows for the first calls (7-9 here) until blocks fit
    r0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    f(x).block_until_ready()
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - r0)
print(status, sorted(faults)[len(faults) // 2], min(faults[2:]))
print(keep_host_memory())
"""


@pytest.mark.skipif(sys.platform != "linux", reason="glibc malloc settings")
def test_keep_host_memory_stops_xla_cpu_faulting_its_temporary_buffer_in_each_call():
    """Without it every call maps XLA's temporary buffer afresh (≥ 32 MiB = 8 k pages faulted in per call); with
    it, once the heap has grown to fit (a few calls), the freed blocks are reused and nothing is faulted in. Too
    late once the backend runs: it says so and does nothing."""
    run = lambda mode: subprocess.run(
        [sys.executable, "-c", _FAULTS, mode], capture_output=True, text=True, check=True
    ).stdout.split("\n")
    default, keep = run("default"), run("keep")
    assert default[0].split()[0] == "default" and keep[0].split()[0] == "applied", (default, keep)
    pages = (32 << 20) // 4096
    assert float(default[0].split()[2]) > 0.5 * pages, default  # every call after the first two
    assert float(keep[0].split()[1]) < 0.05 * pages, keep  # the median call
    assert "already started" in keep[1] and "already started" in default[1]


_CORES = """
import os, sys
from ivhl_jax.run.device import limit_host_cores
before = set(os.listdir("/proc/self/task"))  # e.g. NumPy's BLAS pool, started at import: keeps its mask
status = limit_host_cores(1)
import jax, jax.numpy as jnp
assert float(jax.jit(lambda x: (x @ x).sum())(jnp.ones((64, 64)))) == 64.0 ** 3
threads = [len(os.sched_getaffinity(int(t))) for t in set(os.listdir("/proc/self/task")) - before]
print(status, len(os.sched_getaffinity(0)), max(threads), len(threads))
print(limit_host_cores(1))
"""


@pytest.mark.skipif(sys.platform != "linux", reason="os.sched_setaffinity")
def test_limit_host_cores_runs_xla_and_every_thread_it_starts_on_those_cores():
    """Before the backend starts: the calling thread and every thread XLA starts (its pools, sized from the mask)
    stay on one core and compute correctly. Afterwards (or on one core already) it says why not and changes nothing."""
    import os

    out = subprocess.run([sys.executable, "-c", _CORES], capture_output=True, text=True, check=True).stdout
    first, second = out.strip().split("\n")[-2:]
    if len(os.sched_getaffinity(0)) == 1:
        assert first.startswith("not applied: the process already runs on 1 core"), out
        return
    status, mask, widest, started = first.rsplit(" ", 3)
    assert status.startswith("applied: cores [") and mask == "1" and widest == "1" and int(started) >= 1, out
    assert second.startswith("not applied: the process already runs on 1 core"), out
    # in this process the backend has started: more cores than it has are refused with the reason
    from ivhl_jax.run.device import limit_host_cores

    jax.numpy.zeros(1).block_until_ready()
    msg = limit_host_cores(1)
    assert "already started" in msg and len(os.sched_getaffinity(0)) > 1, msg
