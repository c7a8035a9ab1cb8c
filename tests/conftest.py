"""Test-wide setup: 8 emulated CPU devices (so sharding is always exercised) and a notebook runner."""

from __future__ import annotations

import os

# Must happen before jax initialises its backend; `make test` sets the same flag.
if "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("MPLBACKEND", "Agg")
# The suite runs on the backend table alone, whatever `ivhl tune` stored on this machine (tests of the tuning
# cache point IVHL_CACHE_DIR at a temporary folder and set IVHL_TUNING themselves).
os.environ.setdefault("IVHL_TUNING", "frozen")

import contextlib  # noqa: E402
import importlib.util  # noqa: E402
import pathlib  # noqa: E402
import sys  # noqa: E402

import pytest  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parents[1]


def pytest_configure(config):
    """Say on the terminal when numba starts compiling the CDT host engine's kernels: that happens once per machine
    (minutes on a 2-core host; numba's disk cache then loads them in about a second), inside whichever test first
    runs the host engine, which would otherwise sit silent that long."""
    if importlib.util.find_spec("numba") is None:
        return
    from numba.core import event

    class AnnounceHostKernels(event.Listener):
        said = False

        def on_start(self, ev):
            fn = getattr((ev.data or {}).get("dispatcher"), "py_func", None)
            if self.said or getattr(fn, "__module__", "") != "ivhl_jax.physics.cdt.host_kernels":
                return
            self.said = True
            capture = config.pluginmanager.getplugin("capturemanager")
            with capture.global_and_fixture_disabled() if capture else contextlib.nullcontext():
                sys.stderr.write(
                    "\n[tests] numba is compiling the CDT host engine's kernels: once per machine (minutes on a "
                    "2-core host; numba's disk cache keeps them for every later run) ...\n"
                )
                sys.stderr.flush()

        def on_end(self, ev):
            return None

    event.register("numba:compile", AnnounceHostKernels())


def execute_notebook(name: str, timeout: int = 600) -> None:
    """Execute notebooks/<name> top to bottom in a fresh kernel; raises on the first failing cell."""
    import nbformat
    from nbclient import NotebookClient

    path = REPO / "notebooks" / name
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": str(REPO)}})
    client.execute()


@pytest.fixture
def run_notebook():
    return execute_notebook
