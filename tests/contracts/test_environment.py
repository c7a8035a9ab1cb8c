"""The installed package and the test environment: namespaced subpackages, no bare top-level packages, 8
emulated devices."""

from __future__ import annotations

import importlib
import subprocess
import sys

import jax
import pytest

ON_CPU = pytest.mark.skipif(
    jax.default_backend() != "cpu", reason="the suite emulates 8 CPU devices; an accelerator has as many as it has"
)


@ON_CPU
def test_eight_devices_emulated():
    assert jax.device_count() == 8


@pytest.mark.parametrize("name", ["ivhl_jax.models", "ivhl_jax.sims", "ivhl_jax.bench", "ivhl_jax.bench.harness"])
def test_namespaced_subpackages_import(name):
    assert importlib.import_module(name) is not None


def test_no_bare_top_level_packages_installed():
    # From outside the repo, `models`/`sims`/`bench` must not be importable as bare names.
    code = "import importlib.util as u; print([n for n in ('models','sims','bench') if u.find_spec(n)])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/", check=True)
    assert out.stdout.strip() == "[]"
