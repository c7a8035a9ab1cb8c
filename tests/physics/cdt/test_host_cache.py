"""The host engine's numba kernels are compiled once and loaded from numba's disk cache by later processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from ivhl_jax.physics.cdt import host as cdt_host

_CHILD = r"""
import json, time
import numpy as np
from ivhl_jax.physics.cdt import host_kernels as hk
from ivhl_jax.physics.cdt.host import _offsets
from ivhl_jax.physics.cdt.state import buffer_layout, initial_state

s = initial_state(3, 4, 48)
bufs = np.asarray(s.buf)[None].copy()
one = lambda x, dt: np.full(1, x, dt)
t0 = time.perf_counter()
hk.run_stream(bufs, np.zeros((1, 2), np.uint32), 100, one(-1, np.int32), 0, one(1.0, np.float32),
              one(0.0, np.float32), one(0.0, np.float32), _offsets(buffer_layout(48, 3)), 48, True)
seconds = time.perf_counter() - t0
stats = hk.run_stream.stats
print(json.dumps({"seconds": seconds, "hits": sum(stats.cache_hits.values()),
                  "misses": sum(stats.cache_misses.values())}))
"""


def _child(cache_dir: str) -> dict:
    env = dict(os.environ, NUMBA_CACHE_DIR=cache_dir, JAX_PLATFORMS="cpu")
    out = subprocess.run([sys.executable, "-c", _CHILD], env=env, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.slow  # the first process compiles the parallel kernel (tens of seconds on a small host)
@pytest.mark.skipif(not cdt_host.available(), reason="needs numba")
def test_second_process_loads_the_kernel_from_the_disk_cache(tmp_path):
    first = _child(str(tmp_path))
    second = _child(str(tmp_path))
    print(f"first call: {first['seconds']:.2f} s (compile), second process: {second['seconds']:.3f} s (load)")
    assert first["misses"] >= 1 and first["hits"] == 0, first  # an empty cache: compiled and saved
    assert second["hits"] >= 1 and second["misses"] == 0, second  # loaded, not compiled again
    # generous: loading is typically ~100x faster than compiling
    assert second["seconds"] < 0.2 * first["seconds"], (first, second)
