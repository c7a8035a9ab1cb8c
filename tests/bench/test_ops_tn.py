"""bench/ops_tn.py: the MERA GPU check runs (CPU-sized) and reports every record and a summary."""

from __future__ import annotations

import math

import pytest


@pytest.mark.slow  # a few compilations of tiny sweeps; runs in the slow step
def test_mera_gpu_check_quick_runs_on_cpu():
    from ivhl_jax.bench import ops_tn

    doc = ops_tn.gpu_check(True)
    assert [(r["chi"], r["dtype"]) for r in doc["sweeps"]] == [(2, "float32"), (2, "float64")]
    for r in doc["sweeps"]:
        assert "error" not in r, r
        assert r["ms_per_sweep"] > 0 and r["isometry_error"] < (1e-5 if r["dtype"] == "float32" else 1e-12)
    stages = doc["ladder"]["stages"]
    assert [s["chi"] for s in stages] == [2, 3] and stages[-1]["layer_chis"] == [3, 3]
    assert all(math.isfinite(s["energy_error"]) and s["energy_error"] > 0 for s in stages)
    assert len(doc["summary"]) == 3 and doc["summary"][-1].startswith("ladder to chi=3")
    # the conformal data of the last stage: c always, C_σσε or the reason it could not be extracted
    conf = doc["ladder"]["conformal"]
    assert math.isfinite(conf["c"]) and ("C_σσε" in conf or "ope_error" in conf)
    assert " c " in doc["summary"][-1]


def test_sweep_shapes_of_the_gpu_check_fit_their_layers():
    """χ = 16 fits one layer above the d² = 16 bottom; 24 and 32 need the second layer (16, χ, χ)."""
    from ivhl_jax.bench import ops_tn

    assert ops_tn._sweep_shape(16).layer_shapes(4) == [(4, 4, 16), (16, 12, 16)]
    assert ops_tn._sweep_shape(24).layer_shapes(4) == [(4, 4, 16), (16, 16, 24), (24, 18, 24)]
    assert ops_tn._sweep_shape(32).layer_shapes(4) == [(4, 4, 16), (16, 16, 32), (32, 24, 32)]
