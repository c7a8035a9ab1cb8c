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
