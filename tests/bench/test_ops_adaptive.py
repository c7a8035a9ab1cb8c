"""bench.ops_adaptive.gpu_check: the adaptive section of bench/gpu_checks.py runs (quick, on CPU) and summarises."""

from __future__ import annotations

import math

import pytest

from ivhl_jax.bench import ops_adaptive


@pytest.mark.slow  # ~10 s of CPU; longer wall time on a shared host
def test_gpu_check_quick_runs_and_summarises():
    out = ops_adaptive.gpu_check(quick=True)
    summary = out["summary"]
    assert summary["size"] == "small"
    assert math.isfinite(summary["samples_per_s"]) and summary["samples_per_s"] > 0
    assert summary["compile_s"] >= 0
    assert out["record"]["op"] == "adaptive_train"
