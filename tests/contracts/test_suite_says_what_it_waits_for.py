"""The test suite never sits silent through a known long wait: when numba starts compiling the CDT host engine's
kernels (once per machine, minutes on a 2-core host, inside whichever test first runs the host engine), the
suite's ``tests/conftest.py`` says so on the terminal, once, past pytest's output capture."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow  # a pytest process of its own (about 10 s)
def test_the_host_kernel_compile_is_announced_once(tmp_path):
    pytest.importorskip("numba")
    # a compile of a function of the host kernels' module, as numba reports it (the listener reads the event's
    # dispatcher), emitted twice: the line comes once
    (tmp_path / "test_emit.py").write_text(
        textwrap.dedent(
            """
            import types
            from numba.core import event

            def test_emit():
                fn = types.FunctionType((lambda: 0).__code__, {"__name__": "ivhl_jax.physics.cdt.host_kernels"})
                fn.__module__ = "ivhl_jax.physics.cdt.host_kernels"
                for _ in range(2):
                    with event.trigger_event("numba:compile", data={"dispatcher": types.SimpleNamespace(py_func=fn)}):
                        pass
            """
        ),
        encoding="utf-8",
    )
    r = subprocess.run(  # the suite's conftest as a plugin, on a test file outside the suite
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.conftest", str(tmp_path)],
        cwd=ROOT,
        env={**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    said = (r.stdout + r.stderr).count("numba is compiling the CDT host engine's kernels")
    assert said == 1, r.stdout[-2000:] + r.stderr[-2000:]
