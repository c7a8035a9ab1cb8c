"""ivhl_jax.run.device: the device report (and `ivhl info`), the persistent compilation cache."""

from __future__ import annotations

import subprocess
import sys

import jax
import pytest

ON_CPU = pytest.mark.skipif(jax.default_backend() != "cpu",
                            reason="the suite emulates 8 CPU devices; an accelerator has as many as it has")


@ON_CPU
def test_device_report_and_cli_info(capsys):
    from ivhl_jax import cli, device

    rep = device.device_report()
    assert rep["device_count"] == 8 and rep["versions"]["jax"] == jax.__version__
    assert "no-op" in device.configure(gpu_autotune_level=2)["gpu_autotune_level"]
    assert cli.main(["info"]) == 0
    assert "platform" in capsys.readouterr().out
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
    run = lambda mode: subprocess.run([sys.executable, "-c", _FAULTS, mode], capture_output=True, text=True,
                                      check=True).stdout.split("\n")
    default, keep = run("default"), run("keep")
    assert default[0].split()[0] == "default" and keep[0].split()[0] == "applied", (default, keep)
    pages = (32 << 20) // 4096
    assert float(default[0].split()[2]) > 0.5 * pages, default  # every call after the first two
    assert float(keep[0].split()[1]) < 0.05 * pages, keep  # the median call
    assert "already started" in keep[1] and "already started" in default[1]
