"""The condensate precision study at a few steps: the three runs of a term share their start, and the
bfloat16-stored state is far less accurate than float32 on every metric."""

from __future__ import annotations

import jax
import pytest

from bench.studies import condensate_precision as S


@pytest.mark.parametrize("term", ["mixture"])
def test_run_case_records_every_metric_and_bf16_storage_is_far_worse(term):
    with jax.enable_x64(True):
        build, dt, start, obs = S.cases()[term]
        rec = S.run_case(build, dt, start, obs, 200)
    assert rec["steps"] == 200 and len(rec["f32"]["norm_drift"]) == 2
    assert rec["f64"]["final"]["state_error"] == 0.0  # the reference against itself
    for metric in ("norm_drift", "energy_error", "state_error"):
        assert rec["bf16_storage"]["final"][metric] > 100 * rec["f32"]["final"][metric], metric
