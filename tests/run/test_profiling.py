"""Training profiler: the baseline document, sorted hotspots, total/total throughput, compare."""

from __future__ import annotations

import json

import jax
import pytest

from ivhl_jax.bench.workloads import mlp_workload
from ivhl_jax.run import profiling
from ivhl_jax.run.io import write_json


@pytest.fixture(scope="module")
def run():
    loss_fn, params, opt, get_batch = mlp_workload(8, sizes=(16, 8, 4))
    return profiling.profile_training(
        loss_fn,
        params,
        opt,
        get_batch,
        batch_size=8,
        key=jax.random.key(0),
        num_batches=4,
        warmup=1,
        fused_chunk=5,
        fused_repeats=2,
        label="tiny mlp",
    )


def test_run_has_the_seed_fields_and_consistent_numbers(run):
    assert len(run["per_batch_metrics"]) == 4
    for m in run["per_batch_metrics"]:
        assert set(profiling.METRIC_FIELDS) <= set(m)
        parts = m["data_loading_time_ms"] + m["forward_backward_time_ms"] + m["optimizer_step_ms"]
        assert m["batch_latency_ms"] == pytest.approx(parts)
        assert m["samples_per_second"] == pytest.approx(8 / (m["batch_latency_ms"] / 1e3))
    agg = run["aggregated_metrics"]
    total_s = sum(m["batch_latency_ms"] for m in run["per_batch_metrics"]) / 1e3
    assert agg["throughput_samples_per_sec"] == pytest.approx(4 * 8 / total_s)  # total / total
    times = [h["time_ms"] for h in run["hotspots"]]
    assert times == sorted(times, reverse=True) and [h["rank"] for h in run["hotspots"]] == [1, 2, 3, 4]
    assert all(v > 0 for v in run["compile_time_s"].values())
    assert run["configuration"]["model_parameters"] == 16 * 8 + 8 + 8 * 4 + 4
    f = run["fused_scan"]
    assert f["samples_per_sec"] == pytest.approx(2 * 5 * 8 / sum(f["chunk_times_s"]))


def test_baseline_document_and_compare(run, tmp_path):
    doc = profiling.baseline_document([run])
    for k in ("timestamp", "phase", "system_info", "profiling_runs", "success_metrics", "hotspots"):
        assert k in doc
    assert doc["system_info"]["jax_version"]
    path = write_json(tmp_path / "baseline.json", doc)
    loaded = json.loads(open(path).read())
    faster = json.loads(json.dumps(loaded))
    faster["success_metrics"]["data_throughput_samples_per_sec"] *= 2
    c = profiling.compare(loaded, faster)
    assert c["success_metrics"]["data_throughput_samples_per_sec"]["ratio_b_over_a"] == pytest.approx(2.0)
    assert c["runs"][0]["metrics"]["avg_batch_latency_ms"]["ratio_b_over_a"] == pytest.approx(1.0)
