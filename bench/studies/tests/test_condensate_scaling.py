"""bench.studies.condensate_scaling: one configuration measured end to end on emulated devices; the GPU estimate."""

from __future__ import annotations

import jax
import pytest


def test_case_records_bytes_and_memory_of_a_sharded_step():
    if jax.device_count() < 8:
        pytest.skip("needs 8 devices (XLA_FLAGS=--xla_force_host_platform_device_count=8)")
    from bench.studies import condensate_scaling as ops_scaling

    rec, call = ops_scaling._case((16, 16, 16), 8, "slab", 2)
    shard = 16**3 * 8 // 8
    assert rec["shard_bytes"] == shard and rec["all_gather_bytes_per_step"] == 0
    assert rec["all_to_all_bytes_per_step"] == 2 * shard
    assert rec["bytes_sent_per_device_per_step"] == pytest.approx(2 * shard * 7 / 8)
    assert 0 < rec["memory_per_device"]["temp_over_shard"] <= 3
    call()
    ref, _ = ops_scaling._case((16, 16, 16), 8, "gspmd", 2)  # XLA's partitioner gathers the field
    assert ref["all_gather_bytes_per_step"] > 0 and ref["all_to_all_bytes_per_step"] == 0


def test_gpu_estimate_arithmetic():
    from bench.studies import condensate_scaling as ops_scaling

    est = ops_scaling._gpu_estimate(1024, 8, "slab")
    sent = 2 * 1024**3 * 8 / 8 * 7 / 8
    assert est["bytes_sent_per_gpu_GB"] == pytest.approx(sent / 1e9)
    assert est["step_ms_est_nvlink"] == pytest.approx(est["compute_ms_est"] + sent / ops_scaling.NVLINK_BPS * 1e3)
    assert ops_scaling._gpu_estimate(512, 1, "slab")["step_ms_est_infiniband"] == pytest.approx(7.3)
